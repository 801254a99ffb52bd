package capture_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
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
	var b [capture.NumLogStreams][]byte
	for _, e := range l.Entries {
		if e.Gap == 0 && e.Stream != capture.LogMeta {
			b[e.Stream] = append(b[e.Stream], e.Payload()...)
		}
	}
	out := map[capture.LogStream]string{}
	for s := range b {
		if len(b[s]) > 0 {
			out[capture.LogStream(s)] = string(b[s])
		}
	}
	return l, out
}

func TestShortLivedProcessWithCaptureAndNoReader(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
	d := captureDir(t)
	w, err := capture.Begin(d, uuid.Must(uuid.NewV7()).String(), capture.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := process.Start("p", process.Spec{Argv: []string{"/no/such/program"}, Capture: w}); !errors.Is(err, process.ErrNoCommand) {
		t.Fatalf("start: %v", err)
	}
	<-w.Done()
	l, out := read(t, d)
	if len(out) != 0 || len(l.Runs) != 1 || l.Runs[0].State != capture.Lossless {
		t.Fatalf("runs %+v, output %q", l.Runs, out)
	}
}

// TestOrdinaryWorkloadsAreLossless: what a build prints — a shell loop of
// short lines, a listing of a tree, a program flushing every line — is
// captured whole, with the other core kept busy meanwhile: bursts that
// reach the writer between its wake-ups wait in the queue, they are not
// dropped.
func TestOrdinaryWorkloadsAreLossless(t *testing.T) {
	t.Parallel()
	hog := exec.Command("sh", "-c", "while :; do :; done")
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hog.Process.Kill(); hog.Wait() })
	loop := func(n int) string {
		return fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "line $i of a build that prints one short line at a time"; i=$((i+1)); done`, n)
	}
	tests := []struct {
		name string
		argv []string
		want func(got []byte) error // checks the bytes captured
	}{
		{"shell loop of 20,000 lines", []string{"sh", "-c", loop(20000)}, linesOfLoop(20000)},
		{"shell loop of 200,000 lines", []string{"sh", "-c", loop(200000)}, linesOfLoop(200000)},
		{"find /usr -ls", []string{"find", "/usr", "-ls"}, nil},
		{"python printing 200,000 lines with flush", []string{"python3", "-c",
			"for i in range(200000): print(f'line {i} of a build that prints one short line at a time', flush=True)"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := captureDir(t)
			p, _ := run(t, d, capture.Options{MaxSize: 64 << 20}, process.Spec{Argv: tc.argv})
			st := done(t, p)
			if st.Exit == nil || st.Exit.Code != 0 {
				t.Fatalf("exit %v", st.Exit)
			}
			if st.Capture == nil || !st.Capture.Ended || st.Capture.Dropped != [capture.NumLogStreams]int64{} {
				t.Fatalf("capture %+v of %d stdout bytes: want ended with nothing dropped", st.Capture, st.Totals[0])
			}
			l, out := read(t, d)
			if len(l.Runs) != 1 || l.Runs[0].State != capture.Lossless {
				t.Fatalf("runs %+v", l.Runs)
			}
			got := []byte(out[capture.LogStdout])
			if int64(len(got)) != st.Totals[0] || st.Totals[0] == 0 {
				t.Fatalf("captured %d stdout bytes of %d", len(got), st.Totals[0])
			}
			if tc.want != nil {
				if err := tc.want(got); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// linesOfLoop checks the output of the shell loop of n lines.
func linesOfLoop(n int) func([]byte) error {
	return func(got []byte) error {
		var want bytes.Buffer
		for i := range n {
			fmt.Fprintf(&want, "line %d of a build that prints one short line at a time\n", i)
		}
		if !bytes.Equal(got, want.Bytes()) {
			return fmt.Errorf("captured %d bytes differ from the %d the loop printed", len(got), want.Len())
		}
		return nil
	}
}
