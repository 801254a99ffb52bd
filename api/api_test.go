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

func TestExitString(t *testing.T) {
	zero, seven := 0, 7
	for e, want := range map[*Exit]string{
		{ExitCode: &zero}:  "process exited with code 0",
		{ExitCode: &seven}: "process exited with code 7",
		{Signal: "KILL"}:   "process killed by signal KILL",
		{}:                 "process exit unknown",
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
