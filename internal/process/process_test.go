package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// testTimeout bounds waits that should end promptly; reaching it is a hang
// and a failure, never a timing assertion.
const testTimeout = 60 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// transcript is everything one attachment received.
type transcript struct {
	data   [ring.NumStreams][]byte
	lost   [ring.NumStreams]int64
	totals [ring.NumStreams]int64
	ended  [ring.NumStreams]bool
	exit   *Exit
	events int
}

// read consumes an attachment to its end and checks that offsets continue
// exactly from event to event, that seq rises across every Data event and
// no event's bytes overlap the one before in the process's output, and
// that the attachment's position is where its events say.
func read(t *testing.T, a *Attachment, from ring.Offsets) transcript {
	t.Helper()
	ctx := ctxT(t)
	var tr transcript
	next, last, end := from, int64(-1), uint64(0)
	for {
		e, err := a.Next(ctx)
		if errors.Is(err, io.EOF) {
			return tr
		}
		if err != nil {
			t.Fatalf("attachment: %v", err)
		}
		tr.events++
		s := e.Stream
		switch e.Kind {
		case ring.Data:
			if e.Offset != next[s] {
				t.Fatalf("%v data at %d, expected %d", s, e.Offset, next[s])
			}
			if int64(e.Seq) <= last || e.Seq < end {
				t.Fatalf("%v data at %d with seq %d, after seq %d ending at %d", s, e.Offset, e.Seq, last, end)
			}
			last, end = int64(e.Seq), e.Seq+uint64(len(e.Data))
			tr.data[s] = append(tr.data[s], e.Data...)
			next[s] += int64(len(e.Data))
		case ring.Gap:
			if e.Offset != next[s] || e.To <= e.Offset {
				t.Fatalf("%v gap [%d,%d), expected it from %d", s, e.Offset, e.To, next[s])
			}
			tr.lost[s] += e.Lost()
			next[s] = e.To
		case ring.End:
			if e.Offset != next[s] {
				t.Fatalf("%v ends at %d, accounted %d", s, e.Offset, next[s])
			}
			tr.totals[s], tr.ended[s] = e.Offset, true
		case ring.Exit:
			x := e.Exit
			tr.exit = &x
		}
		if e.Kind != ring.Exit && a.Position() != next {
			t.Fatalf("position %v, the events say %v", a.Position(), next)
		}
	}
}

func startT(t *testing.T, spec Spec) *Process {
	t.Helper()
	return startDrainT(t, spec, 200*time.Millisecond)
}

// startDrainT starts spec with drain as its drain time.
func startDrainT(t *testing.T, spec Spec, drain time.Duration) *Process {
	t.Helper()
	p, err := start("test", spec, drain, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill(context.Background())
	})
	return p
}

func waitDone(t *testing.T, p *Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-ctxT(t).Done():
		t.Fatal("process did not drain")
	}
}

// waitPumped waits until n bytes of stream s have reached the ring.
func waitPumped(t *testing.T, p *Process, s ring.Stream, n int64) {
	t.Helper()
	w, err := p.Attach(ring.Offsets{}, AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for w.Position()[s] < n {
		if _, err := w.Next(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
}

func sh(script string) Spec { return Spec{Argv: []string{script}, Shell: true} }

// Seed validation row: more than a pipe buffer with nobody attached, then
// exit 23 — no deadlock, every byte counted, the exit reported.
func TestMoreThanPipeBufferWithNoReaderThenExit23(t *testing.T) {
	t.Parallel()
	const n = 8 << 20
	p := startT(t, Spec{Argv: []string{"sh", "-c", "head -c " + strconv.Itoa(n) + " /dev/zero; exit 23"}, RingBytes: 64 << 10})
	ex, err := p.Wait(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if ex != (Exit{Code: 23}) {
		t.Fatalf("exit %v, want code 23", ex)
	}
	waitDone(t, p)
	st := p.Status()
	if st.State != Exited || st.Totals[ring.Stdout] != n || !st.Ended[ring.Stdout] || !st.Ended[ring.Stderr] {
		t.Fatalf("status %+v", st)
	}
	a, err := p.Attach(ring.Offsets{}, AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	tr := read(t, a, ring.Offsets{})
	if got := tr.lost[ring.Stdout] + int64(len(tr.data[ring.Stdout])); got != n {
		t.Fatalf("stdout accounts for %d bytes, want %d", got, n)
	}
	if len(tr.data[ring.Stdout]) != 64<<10 {
		t.Errorf("ring kept %d bytes, want its capacity", len(tr.data[ring.Stdout]))
	}
	if tr.exit == nil || tr.exit.Code != 23 {
		t.Fatalf("attachment exit %v", tr.exit)
	}
}

// Seed validation row: attach after the ring wraps — exact loss on the
// stream that wrapped, the other stream untouched.
func TestAttachAfterRingWraps(t *testing.T) {
	t.Parallel()
	const n = 1 << 20
	p := startT(t, Spec{Argv: []string{"sh", "-c", "head -c " + strconv.Itoa(n) + " /dev/zero; read x; echo done >&2"}, RingBytes: 64 << 10, Stdin: StdinPipe})
	// Pipes are read concurrently, so only once stdout has been pumped
	// whole may stderr be written for the ring to hold it after stdout.
	waitPumped(t, p, ring.Stdout, n)
	p.Write(0, []byte("\n"))
	waitDone(t, p)
	a, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer a.Close()
	tr := read(t, a, ring.Offsets{})
	if string(tr.data[ring.Stderr]) != "done\n" || tr.lost[ring.Stderr] != 0 {
		t.Errorf("stderr %q lost %d, want it whole", tr.data[ring.Stderr], tr.lost[ring.Stderr])
	}
	if want := int64(n - (64<<10 - 5)); tr.lost[ring.Stdout] != want {
		t.Errorf("stdout lost %d, want %d", tr.lost[ring.Stdout], want)
	}
	if tr.totals[ring.Stdout] != n {
		t.Errorf("stdout total %d", tr.totals[ring.Stdout])
	}
}

// Seed validation row: one stream fully evicted before attach — its
// total still reports the exact loss.
func TestStreamFullyEvictedBeforeAttach(t *testing.T) {
	t.Parallel()
	p := startT(t, Spec{Argv: []string{"sh", "-c", "echo early >&2; read x; head -c 1048576 /dev/zero"}, RingBytes: 64 << 10, Stdin: StdinPipe})
	waitPumped(t, p, ring.Stderr, 6)
	p.Write(0, []byte("\n"))
	waitDone(t, p)
	a, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer a.Close()
	tr := read(t, a, ring.Offsets{})
	if len(tr.data[ring.Stderr]) != 0 || tr.lost[ring.Stderr] != 6 || tr.totals[ring.Stderr] != 6 {
		t.Fatalf("stderr data %q lost %d total %d, want 6 lost of 6", tr.data[ring.Stderr], tr.lost[ring.Stderr], tr.totals[ring.Stderr])
	}
}

// Seed validation row: sh -c 'child & exit' — the child holding the pipes
// is killed with the group once the drain time is out, the pumps reach
// EOF, the drain finishes, and the exit says the output was cut.
func TestBackgroundChildDoesNotHoldThePumps(t *testing.T) {
	t.Parallel()
	spec := sh("sleep 1000 & exit 0")
	spec.Drain = 100 * time.Millisecond
	p := startT(t, spec)
	waitDone(t, p)
	if ex, _ := p.Wait(ctxT(t)); ex.Code != 0 || !ex.OutputCut {
		t.Fatalf("exit %+v, want code 0 and the output cut", ex)
	}
	a, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer a.Close()
	if tr := read(t, a, ring.Offsets{}); tr.exit == nil || !tr.exit.OutputCut {
		t.Fatalf("the attachment's exit %+v does not say the output was cut", tr.exit)
	}
}

// What a process's children write after the process exits is output too:
// the streams end when their last writer closes them, within the drain
// time, and then nothing was cut.
func TestOutputAfterExitIsRead(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// A drain time a loaded machine's scheduling does not run out.
	p := startDrainT(t, sh("(read x < "+fifo+"; echo late; echo late >&2) & echo early; exit 0"), 30*time.Second)
	a, err := p.Attach(ring.Offsets{}, AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if ex, err := p.Wait(ctxT(t)); err != nil || ex.Code != 0 {
		t.Fatalf("exit %v, %v", ex, err)
	}
	// Only now, the process gone, does its child write.
	if err := os.WriteFile(fifo, []byte("go\n"), 0); err != nil {
		t.Fatal(err)
	}
	tr := read(t, a, ring.Offsets{})
	if string(tr.data[ring.Stdout]) != "early\nlate\n" || string(tr.data[ring.Stderr]) != "late\n" {
		t.Errorf("stdout %q, stderr %q", tr.data[ring.Stdout], tr.data[ring.Stderr])
	}
	if tr.exit == nil || tr.exit.Code != 0 || tr.exit.OutputCut {
		t.Errorf("exit %+v, want code 0 and the output whole", tr.exit)
	}
}

// A child that left the process group (setsid) cannot be killed with it;
// the bounded drain still ends the streams.
func TestEscapedChildCannotHoldTheDrain(t *testing.T) {
	t.Parallel()
	spec := sh(escape("sleep 1000") + "echo $pid; exit 0")
	spec.Drain = 100 * time.Millisecond
	p := startT(t, spec)
	waitDone(t, p)
	a, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer a.Close()
	tr := read(t, a, ring.Offsets{})
	pid, err := strconv.Atoi(strings.TrimSpace(string(tr.data[ring.Stdout])))
	if err != nil {
		t.Fatalf("child pid %q: %v", tr.data[ring.Stdout], err)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	if !tr.ended[ring.Stdout] || !tr.ended[ring.Stderr] || tr.exit == nil {
		t.Fatalf("streams or exit missing: %+v", tr)
	}
}

// escape is shell that starts cmd in a session of its own, as $pid, and
// waits until it has left: a shell that exited first would take the child
// down with its group before it got away.
func escape(cmd string) string {
	return "setsid " + cmd + " & pid=$!; until [ \"$(cut -d' ' -f6 /proc/$pid/stat)\" = $pid ]; do :; done; "
}

// A child that left the session cannot hold a terminal's stream past the
// drain, whether it is idle or floods the terminal. The session leader's
// exit signals the terminal's foreground group but does not hang a
// pseudo-terminal up, so the master reads its end only once every slave
// descriptor is closed, and the escaped child keeps its own: as with pipes,
// the drain's bound is what ends the stream.
func TestEscapedChildCannotHoldTheTerminal(t *testing.T) {
	t.Parallel()
	for _, child := range []string{"sleep 1000", "yes"} {
		t.Run(child, func(t *testing.T) {
			// The pid goes to a file: a flood would push it out of the ring.
			pidFile := filepath.Join(t.TempDir(), "pid")
			p := startT(t, Spec{
				Argv:     []string{escape(child) + "echo $pid >" + pidFile + "; exit 0"},
				Shell:    true,
				Terminal: &WindowSize{Cols: 80, Rows: 24},
				Drain:    100 * time.Millisecond,
			})
			t.Cleanup(func() {
				b, err := os.ReadFile(pidFile)
				if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			waitDone(t, p)
			a, _ := p.Attach(ring.Offsets{}, AttachOptions{})
			defer a.Close()
			tr := read(t, a, ring.Offsets{})
			if !tr.ended[ring.PTY] || tr.exit == nil {
				t.Fatalf("stream or exit missing: ended %v, exit %v", tr.ended, tr.exit)
			}
		})
	}
}

func TestStartFailuresAreErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	noexec := dir + "/script"
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Executable, and not a program the kernel can load: ENOEXEC.
	garbage := dir + "/garbage"
	if err := os.WriteFile(garbage, []byte{0x7f, 'E', 'L', 'F', 0, 0, 0, 0}, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		spec Spec
		want error
	}{
		{"no such program", Spec{Argv: []string{"/no/such/program"}}, ErrNoCommand},
		{"a file for a directory in the path", Spec{Argv: []string{noexec + "/x"}}, ErrNoCommand},
		{"not in PATH", Spec{Argv: []string{"no-such-program-here"}}, ErrNoCommand},
		{"not executable", Spec{Argv: []string{noexec}}, ErrNotExecutable},
		{"not executable, found in PATH", Spec{Argv: []string{"script"}, Env: []string{"PATH=" + dir}}, ErrNotExecutable},
		{"a directory", Spec{Argv: []string{dir}}, ErrNotExecutable},
		{"not a program", Spec{Argv: []string{garbage}}, ErrNotExecutable},
		{"no working directory", Spec{Argv: []string{"true"}, Dir: dir + "/missing"}, ErrNoDir},
		{"no working directory's parent", Spec{Argv: []string{"true"}, Dir: dir + "/missing/below"}, ErrNoDir},
		{"working directory is a file", Spec{Argv: []string{"true"}, Dir: noexec}, ErrStart},
		{"empty argv", Spec{}, ErrInvalid},
		{"NUL in argument", Spec{Argv: []string{"echo", "a\x00b"}}, ErrInvalid},
		{"bad environment", Spec{Argv: []string{"true"}, Env: []string{"NOEQUALS"}}, ErrInvalid},
		{"shell with two strings", Spec{Argv: []string{"a", "b"}, Shell: true}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Start("x", tc.spec)
			if err == nil {
				p.Kill(context.Background())
				t.Fatal("started")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}
}

// TestStartAtTheProcessLimit: a fork the kernel refuses for the process
// limit (EAGAIN) is tried again for a moment, as a shell does, and a limit
// that stays is told by its name, never in the kernel's words.
func TestStartAtTheProcessLimit(t *testing.T) {
	t.Parallel()
	refusing := func(times int) (func(*exec.Cmd) (*os.Process, error), *int) {
		tries := new(int)
		return func(cmd *exec.Cmd) (*os.Process, error) {
			if *tries++; *tries <= times {
				return nil, &os.PathError{Op: "fork/exec", Path: cmd.Path, Err: syscall.EAGAIN}
			}
			err := cmd.Start()
			return cmd.Process, err
		}, tries
	}
	launch, tries := refusing(2)
	p, err := Start("x", Spec{Argv: []string{"echo", "room at last"}, Launch: launch})
	if err != nil {
		t.Fatalf("refused twice, then: %v", err)
	}
	if ex, _ := p.Wait(ctxT(t)); ex != (Exit{}) || *tries != 3 {
		t.Fatalf("exit %v after %d tries", ex, *tries)
	}
	launch, tries = refusing(1 << 30)
	_, err = Start("x", Spec{Argv: []string{"echo"}, Launch: launch})
	if !errors.Is(err, ErrProcessLimit) || !strings.Contains(err.Error(), "limits.pids") || strings.Contains(err.Error(), "temporarily") {
		t.Fatalf("always refused: %v", err)
	}
	if *tries < 3 || *tries > 10 {
		t.Fatalf("tried %d times", *tries)
	}
}

func TestExitCodeAndSignal(t *testing.T) {
	t.Parallel()
	p := startT(t, sh("exit 3"))
	if ex, _ := p.Wait(ctxT(t)); ex != (Exit{Code: 3}) {
		t.Fatalf("exit %v", ex)
	}

	p = startT(t, Spec{Argv: []string{"sleep", "1000"}})
	if st := p.Status(); st.State != Running || st.Exit != nil {
		t.Fatalf("status before exit %+v", st)
	}
	if err := p.Signal(syscall.SIGTERM, false); err != nil {
		t.Fatal(err)
	}
	ex, _ := p.Wait(ctxT(t))
	if ex != (Exit{Code: -1, Signal: syscall.SIGTERM}) {
		t.Fatalf("exit %v, want SIGTERM", ex)
	}
	waitDone(t, p)
	if err := p.Signal(syscall.SIGTERM, false); !errors.Is(err, ErrFinished) {
		t.Fatalf("signal after exit: %v", err)
	}
}

func TestTerminateKillsTheGroup(t *testing.T) {
	t.Parallel()
	p := startT(t, sh("sleep 1000 & sleep 1000; echo never"))
	if err := p.Terminate(); err != nil {
		t.Fatal(err)
	}
	ex, _ := p.Wait(ctxT(t))
	if ex.Signal != syscall.SIGKILL {
		t.Fatalf("exit %v", ex)
	}
	waitDone(t, p)
}

func TestStdinPipe(t *testing.T) {
	t.Parallel()
	p := startT(t, Spec{Argv: []string{"cat"}, Stdin: StdinPipe})
	if n, err := p.Write(0, []byte("hello ")); err != nil || n != 6 {
		t.Fatalf("write: %d %v", n, err)
	}
	// A retry of bytes already accepted is acknowledged, not written twice.
	if n, err := p.Write(0, []byte("hello ")); err != nil || n != 6 {
		t.Fatalf("retry: %d %v", n, err)
	}
	if _, err := p.Write(100, []byte("x")); err == nil {
		t.Fatal("a write leaving a hole was accepted")
	}
	if n, err := p.Write(3, []byte("lo world")); err != nil || n != 11 {
		t.Fatalf("overlapping write: %d %v", n, err)
	}
	if err := p.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	if err := p.CloseStdin(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := p.Write(11, []byte("late")); err == nil {
		t.Fatal("write after close accepted")
	}
	if ex, _ := p.Wait(ctxT(t)); ex.Code != 0 {
		t.Fatalf("cat exit %v", ex)
	}
	waitDone(t, p)
	a, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer a.Close()
	if tr := read(t, a, ring.Offsets{}); string(tr.data[ring.Stdout]) != "hello world" {
		t.Fatalf("cat echoed %q", tr.data[ring.Stdout])
	}
}

func TestStdinClosedByDefault(t *testing.T) {
	t.Parallel()
	p := startT(t, Spec{Argv: []string{"cat"}})
	if ex, _ := p.Wait(ctxT(t)); ex.Code != 0 {
		t.Fatalf("cat exit %v", ex)
	}
	if _, err := p.Write(0, []byte("x")); !errors.Is(err, ErrNoStdin) && !errors.Is(err, ErrFinished) {
		t.Fatalf("write without a pipe: %v", err)
	}
}

func TestTerminal(t *testing.T) {
	t.Parallel()
	p := startT(t, Spec{
		Argv:     []string{"stty size; read line; stty size; echo got:$line"},
		Shell:    true,
		Terminal: &WindowSize{Cols: 80, Rows: 24},
	})
	a, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer a.Close()
	ctx := ctxT(t)
	var out []byte
	// Wait for the first size, then resize and answer the read.
	for !bytes.Contains(out, []byte("24 80")) {
		e, err := a.Next(ctx)
		if err != nil {
			t.Fatalf("before input: %v (output %q)", err, out)
		}
		out = append(out, e.Data...)
	}
	if err := p.Resize(WindowSize{Cols: 120, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Write(0, []byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.CloseStdin(); !errors.Is(err, ErrTerminalEOF) {
		t.Fatalf("close stdin on a terminal: %v", err)
	}
	for {
		e, err := a.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.Kind == ring.Exit && e.Exit.Code != 0 {
			t.Fatalf("exit %v", e.Exit)
		}
		out = append(out, e.Data...)
	}
	for _, want := range []string{"40 120", "got:hi"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("terminal output %q lacks %q", out, want)
		}
	}
}

// A process may close its output and go on running: the streams end, the
// exit is not invented, and it arrives once observed.
func TestOutputClosedButStillRunning(t *testing.T) {
	t.Parallel()
	p := startT(t, Spec{Argv: []string{"sh", "-c", "exec >&- 2>&-; read x"}, Stdin: StdinPipe})
	a, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer a.Close()
	ctx := ctxT(t)
	for ends := 0; ends < 2; {
		e, err := a.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if e.Kind == ring.End {
			ends++
		}
	}
	if st := p.Status(); st.State != Running || !st.Ended[ring.Stdout] {
		t.Fatalf("status %+v, want running with ended streams", st)
	}
	exitc := make(chan Event, 1)
	go func() {
		e, _ := a.Next(ctx)
		exitc <- e
	}()
	if _, err := p.Write(0, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if e := <-exitc; e.Kind != ring.Exit || e.Exit.Code != 0 {
		t.Fatalf("after ends: %+v", e)
	}
}

// A stalled reader next to a fast one: the workload finishes while the
// stalled one holds an event, the fast one accounts for every byte, and the
// stalled one, when it resumes, is told exactly what it missed.
func TestStalledReaderBesideFastOne(t *testing.T) {
	t.Parallel()
	const n = 32 << 20
	p := startT(t, Spec{Argv: []string{"sh", "-c", "head -c " + strconv.Itoa(n) + " /dev/zero"}, RingBytes: 256 << 10})
	stalled, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer stalled.Close()
	var first Event
	for first.Kind != ring.Data { // the workload may already have outrun the ring
		var err error
		if first, err = stalled.Next(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	held := first.Data
	fast, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer fast.Close()
	tr := read(t, fast, ring.Offsets{})
	if tr.totals[ring.Stdout] != n || tr.exit == nil {
		t.Fatalf("fast reader: total %d exit %v", tr.totals[ring.Stdout], tr.exit)
	}
	waitDone(t, p) // the workload and the drain did not wait for the stalled reader
	if !bytes.Equal(held, make([]byte, len(held))) {
		t.Fatal("the stalled reader's held bytes changed")
	}
	from := stalled.Position()
	if from[ring.Stdout] != first.Offset+int64(len(first.Data)) {
		t.Fatalf("position %v after the event at %d", from, first.Offset)
	}
	rest := read(t, stalled, from)
	if got := from[ring.Stdout] + rest.lost[ring.Stdout] + int64(len(rest.data[ring.Stdout])); got != n {
		t.Fatalf("stalled reader accounts for %d, want %d", got, n)
	}
	if rest.lost[ring.Stdout] == 0 {
		t.Fatal("stalled reader was told of no loss")
	}
}

func ExampleProcess_Attach() {
	p, err := Start("example", Spec{Argv: []string{"echo", "hello"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	a, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer a.Close()
	for {
		e, err := a.Next(context.Background())
		if err != nil {
			break
		}
		switch e.Kind {
		case ring.Data:
			fmt.Printf("%v@%d %q\n", e.Stream, e.Offset, e.Data)
		case ring.Exit:
			fmt.Println(e.Exit)
		}
	}
	<-p.Done()
	// Output:
	// stdout@0 "hello\n"
	// exit code 0
}
