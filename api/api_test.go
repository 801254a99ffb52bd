package api

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	f := Frame{Stream: StreamStderr, Offset: 1<<40 + 3, Seq: 77, Data: []byte("payload\x00\xff")}
	b := AppendFrame(nil, f)
	if len(b) != FrameHeader+len(f.Data) || b[0] != StreamStderr {
		t.Fatalf("frame % x", b)
	}
	g, err := ParseFrame(b)
	if err != nil || g.Stream != f.Stream || g.Offset != f.Offset || g.Seq != f.Seq || !bytes.Equal(g.Data, f.Data) {
		t.Fatalf("parsed %+v, %v", g, err)
	}
	for _, bad := range [][]byte{nil, b[:FrameHeader-1], append([]byte{9}, b[1:]...)} {
		if _, err := ParseFrame(bad); err == nil {
			t.Errorf("% x parsed", bad)
		}
	}
}

func FuzzParseFrame(f *testing.F) {
	f.Add(AppendFrame(nil, Frame{Stream: StreamStdout, Offset: 5, Seq: 1, Data: []byte("x")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ParseFrame(b)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendFrame(nil, fr), b) {
			t.Fatalf("round trip changed % x", b)
		}
	})
}

func TestSignalExit(t *testing.T) {
	for name, code := range map[string]int{"KILL": 137, "SIGTERM": 143, "INT": 130, "SYS": 159} {
		e := SignalExit(name)
		if e.ExitCode == nil || *e.ExitCode != code || e.Signal == "" || e.Signal[:3] == "SIG" {
			t.Errorf("%s: %+v, want code %d", name, e, code)
		}
	}
	if e := SignalExit("RTMIN+3"); e.ExitCode != nil {
		t.Errorf("a signal without a known number got code %d", *e.ExitCode)
	}
	if e := (Exit{Signal: "KILL"}).WithCode(); e.ExitCode == nil || *e.ExitCode != 137 {
		t.Errorf("an old record's KILL: %+v", e)
	}
}

func TestExitString(t *testing.T) {
	zero, seven := 0, 7
	for e, want := range map[*Exit]string{
		{ExitCode: &zero}:  "process exited with code 0",
		{ExitCode: &seven}: "process exited with code 7",
		{Signal: "KILL"}:   "process killed by signal KILL",
		{}:                 "process exit unknown",
		// A signal's exit has a code too; the line names the signal.
		func() *Exit { e := SignalExit("SIGTERM"); return &e }(): "process killed by signal TERM",
	} {
		if got := e.String(); got != want {
			t.Errorf("%+v: %q, want %q", *e, got, want)
		}
	}
}

// FuzzExecRequestCheck decodes arbitrary JSON as an exec request and checks
// it: never a panic, and what passes keeps the bounds.
func FuzzExecRequestCheck(f *testing.F) {
	f.Add([]byte(`{"command":"sh","args":["-c","echo hi"],"env":{"A":"b"},"stdin":"pipe","tty":{"cols":80,"rows":24}}`), false)
	f.Add([]byte(`{"command":"true","max_output_bytes":10,"timeout_ms":5}`), true)
	f.Fuzz(func(t *testing.T, body []byte, finite bool) {
		var r ExecRequest
		if json.Unmarshal(body, &r) != nil {
			return
		}
		if r.Check(finite) != nil {
			return
		}
		if r.Command == "" || 1+len(r.Args) > MaxArgs || len(r.Env) > MaxEnv {
			t.Fatalf("accepted %+v", r)
		}
		for _, a := range append([]string{r.Command}, r.Args...) {
			if bytes.IndexByte([]byte(a), 0) >= 0 {
				t.Fatalf("accepted a NUL in %q", a)
			}
		}
		for k := range r.Env {
			if k == "" || bytes.ContainsAny([]byte(k), "=\x00") {
				t.Fatalf("accepted environment name %q", k)
			}
		}
		if finite && r.Stdin == StdinPipe {
			t.Fatal("accepted stdin on a finite exec")
		}
	})
}

// TestCheckBounds: the numbers of an exec request out of their ranges are
// refused, each error naming the field, the range and the value.
func TestCheckBounds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		r      ExecRequest
		finite bool
		field  string
	}{
		{"timeout_ms that would overflow a duration", ExecRequest{Command: "true", TimeoutMS: 9223372036855}, true, "timeout_ms 9223372036855"},
		{"timeout_ms negative", ExecRequest{Command: "true", TimeoutMS: -1}, true, "timeout_ms -1"},
		{"timeout_ms past 7 days", ExecRequest{Command: "true", TimeoutMS: MaxTimeoutMS + 1}, true, "timeout_ms"},
		{"max_output_bytes past 1 MiB", ExecRequest{Command: "true", MaxOutputBytes: DefaultMaxOutput + 1}, true, "max_output_bytes 1048577"},
		{"drain_ms negative", ExecRequest{Command: "true", DrainMS: -1}, false, "drain_ms -1"},
		{"drain_ms past its bound", ExecRequest{Command: "true", DrainMS: MaxDrainMS + 1}, false, "drain_ms 60001"},
	} {
		err := tc.r.Check(tc.finite)
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.field)) || !bytes.Contains([]byte(err.Error()), []byte("want")) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	for _, ok := range []ExecRequest{{Command: "true", TimeoutMS: MaxTimeoutMS}, {Command: "true", DrainMS: MaxDrainMS}} {
		if err := ok.Check(ok.TimeoutMS != 0); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
}
