package capture_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/process"
)

// These tests run real processes with capture: the engine's pumps feed the
// writer through its sink, and the process's drain ends the run.

func captureDir(t *testing.T) *capture.Dir {
	t.Helper()
	d, err := capture.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func run(t *testing.T, d *capture.Dir, opt capture.Options, spec process.Spec) (*process.Process, *capture.Writer) {
	t.Helper()
	w, err := capture.Begin(d, uuid.Must(uuid.NewV7()).String(), opt)
	if err != nil {
		t.Fatal(err)
	}
	spec.Capture = w
	p, err := process.Start("p", spec)
	if err != nil {
		t.Fatal(err)
	}
	return p, w
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func done(t *testing.T, p *process.Process) process.Status {
	t.Helper()
	select {
	case <-p.Done():
	case <-ctxT(t).Done():
		t.Fatal("process did not finish")
	}
	return p.Status()
}

func read(t *testing.T, d *capture.Dir) (capture.Log, map[capture.LogStream]string) {
	t.Helper()
	l, err := capture.ReadLog(ctxT(t), d, capture.All)
	if err != nil {
		t.Fatal(err)
	}
	out := map[capture.LogStream]string{}
	for _, e := range l.Entries {
		if e.Gap == 0 && e.Stream != capture.LogMeta {
			out[e.Stream] += string(e.Payload())
		}
	}
	return l, out
}

func TestShortLivedProcessWithCaptureAndNoReader(t *testing.T) {
	d := captureDir(t)
	p, w := run(t, d, capture.Options{}, process.Spec{Argv: []string{"sh", "-c", "echo out; echo err >&2; printf tail; exit 23"}})
	st := done(t, p)
	if st.Exit == nil || st.Exit.Code != 23 {
		t.Fatalf("exit %v, want 23", st.Exit)
	}
	if st.Capture == nil || !st.Capture.Ended || st.Capture.Err != nil {
		t.Fatalf("capture %+v, want ended cleanly", st.Capture)
	}
	l, out := read(t, d)
	if out[capture.LogStdout] != "out\ntail" || out[capture.LogStderr] != "err\n" {
		t.Errorf("captured %q", out)
	}
	if len(l.Runs) != 1 || l.Runs[0].State != capture.Lossless || l.Runs[0].ID != w.Run() {
		t.Fatalf("runs %+v", l.Runs)
	}
}

// TestBackgroundChildStillEndsTheCapture: sh -c 'child & exit' leaves a
// child holding the pipes; the drain kills it, so the run reaches its end.
func TestBackgroundChildStillEndsTheCapture(t *testing.T) {
	d := captureDir(t)
	p, _ := run(t, d, capture.Options{}, process.Spec{Argv: []string{"sh", "-c", "sleep 1000 & echo started"}})
	done(t, p)
	l, out := read(t, d)
	if out[capture.LogStdout] != "started\n" {
		t.Errorf("captured %q", out)
	}
	if len(l.Runs) != 1 || l.Runs[0].State != capture.Lossless {
		t.Fatalf("runs %+v", l.Runs)
	}
}

// TestStuckWriterNeverBlocksTheWorkload: the writer cannot write at all; the
// process still writes 64 MiB and exits, and the end record reports exactly
// what was written and not persisted.
func TestStuckWriterNeverBlocksTheWorkload(t *testing.T) {
	d := captureDir(t)
	stuck := make(chan struct{})
	var opt capture.Options
	first := true
	capture.SetBeforeWrite(&opt, func() {
		if first { // the begin record
			first = false
			return
		}
		<-stuck
	})
	const size = 64 << 20
	p, _ := run(t, d, opt, process.Spec{Argv: []string{"sh", "-c", "head -c 67108864 /dev/zero; echo done >&2"}})
	if _, err := p.Wait(ctxT(t)); err != nil { // the workload finished with the writer stuck
		t.Fatal(err)
	}
	close(stuck)
	st := done(t, p)
	if st.Capture == nil || !st.Capture.Ended {
		t.Fatalf("capture %+v", st.Capture)
	}
	l, out := read(t, d)
	written := int64(size + len("done\n"))
	persisted := int64(len(out[capture.LogStdout]) + len(out[capture.LogStderr]))
	dropped := st.Capture.Dropped[0] + st.Capture.Dropped[1]
	if dropped == 0 || written-persisted != dropped {
		t.Errorf("written %d - persisted %d = %d, end says %d", written, persisted, written-persisted, dropped)
	}
	if st.Totals[0] != size {
		t.Errorf("the engine saw %d stdout bytes, want %d", st.Totals[0], size)
	}
	if len(l.Runs) != 1 || l.Runs[0].State != capture.Lossy {
		t.Fatalf("runs %+v", l.Runs)
	}
}

func TestStartFailureEndsTheRunEmpty(t *testing.T) {
	d := captureDir(t)
	w, err := capture.Begin(d, uuid.Must(uuid.NewV7()).String(), capture.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := process.Start("p", process.Spec{Argv: []string{"/no/such/program"}, Capture: w}); !errors.Is(err, process.ErrStart) {
		t.Fatalf("start: %v", err)
	}
	<-w.Done()
	l, out := read(t, d)
	if len(out) != 0 || len(l.Runs) != 1 || l.Runs[0].State != capture.Lossless {
		t.Fatalf("runs %+v, output %q", l.Runs, out)
	}
}
