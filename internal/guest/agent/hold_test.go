package agent

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
)

// heldAt holds the agent's captured runs until process id's stdout is
// held where its output stands after want bytes (its pump hands them
// over once it has read them all), and returns the processes listed.
func (a *agent) heldAt(id string, want int64) []api.Process {
	a.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var procs []api.Process
		if code := a.call("POST", "/capture/hold", nil, &procs); code != 200 {
			a.t.Fatalf("hold: %d", code)
		}
		for _, p := range procs {
			if p.ID == id && p.Streams["stdout"].TotalBytes == want {
				return procs
			}
		}
		a.call("POST", "/capture/release", nil, nil)
		if time.Now().After(deadline) {
			a.t.Fatalf("process %s never held at %d: %+v", id, want, procs)
		}
		time.Sleep(time.Millisecond)
	}
}

// capturedLog reads process id's captured log once the process is done.
func (a *agent) capturedLog(id string) capture.Log {
	a.t.Helper()
	p, err := a.table.Process(id)
	if err != nil {
		a.t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-ctxT(a.t).Done():
		a.t.Fatal("the process did not finish")
	}
	d, err := capture.OpenDir(a.logs + "/" + id)
	if err != nil {
		a.t.Fatal(err)
	}
	defer d.Close()
	l, err := capture.ReadLog(ctxT(a.t), d, capture.All)
	if err != nil {
		a.t.Fatal(err)
	}
	return l
}

// TestCaptureHeldThenContinued: POST /capture/hold lists a captured
// process at where its writer is held; what it writes next, after POST
// /capture/continue (a sandbox restored from a memory snapshot), is in a
// new run whose begin names the old run and those offsets, and the log
// reads as one stream of bytes across both. An uncaptured process is
// listed at its totals.
func TestCaptureHeldThenContinued(t *testing.T) {
	a := newAgent(t)
	id := a.start(api.ExecRequest{Command: "cat", Stdin: api.StdinPipe, Capture: true})
	plain := a.start(api.ExecRequest{Command: "echo", Args: []string{"not captured"}})
	a.wait(plain)
	a.call("POST", "/exec-stream/"+id+"/stdin", "one\n", nil)
	procs := a.heldAt(id, 4)
	for _, p := range procs {
		if p.ID == plain && p.Streams["stdout"].TotalBytes != 13 {
			t.Errorf("the uncaptured process is listed at %+v", p.Streams)
		}
	}
	a.call("POST", "/exec-stream/"+id+"/stdin", "two\n", nil)
	if code := a.call("POST", "/capture/continue", nil, nil); code != 204 {
		t.Fatalf("continue: %d", code)
	}
	if code := a.call("POST", "/capture/continue", nil, nil); code != 204 {
		t.Errorf("continue with nothing held: %d", code)
	}
	a.call("POST", "/exec-stream/"+id+"/stdin/close", nil, nil)
	a.wait(id)
	l := a.capturedLog(id)
	var recs []string
	for _, e := range l.Entries {
		if e.Stream == capture.LogStdout {
			recs = append(recs, fmt.Sprintf("%d %s", e.Offset, e.Payload()))
		}
	}
	if diff := cmp.Diff([]string{"0 one\n", "4 two\n"}, recs); diff != "" {
		t.Errorf("stdout records (-want +got):\n%s", diff)
	}
	if len(l.Runs) != 2 {
		t.Fatalf("runs %+v, want the old one and the one that continues it", l.Runs)
	}
	old, cont := l.Runs[0], l.Runs[1]
	if old.State != capture.Lossless || old.ContinuedBy != cont.ID || cont.State != capture.Lossless || cont.Parent != old.ID {
		t.Errorf("runs %+v", l.Runs)
	}
}

// TestCaptureHeldThenReleased: POST /capture/release lets the held runs go
// on as they were: one run, whatever was written meanwhile.
func TestCaptureHeldThenReleased(t *testing.T) {
	a := newAgent(t)
	id := a.start(api.ExecRequest{Command: "cat", Stdin: api.StdinPipe, Capture: true})
	a.call("POST", "/exec-stream/"+id+"/stdin", "one\n", nil)
	a.heldAt(id, 4)
	a.call("POST", "/exec-stream/"+id+"/stdin", "two\n", nil)
	if code := a.call("POST", "/capture/release", nil, nil); code != 204 {
		t.Fatalf("release: %d", code)
	}
	a.call("POST", "/exec-stream/"+id+"/stdin/close", nil, nil)
	a.wait(id)
	l := a.capturedLog(id)
	var out []byte
	for _, e := range l.Entries {
		if e.Stream == capture.LogStdout {
			out = append(out, e.Payload()...)
		}
	}
	if string(out) != "one\ntwo\n" || len(l.Runs) != 1 || l.Runs[0].State != capture.Lossless {
		t.Errorf("stdout %q, runs %+v", out, l.Runs)
	}
}
