package stdin

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// streamByte is byte off of the input every test sends, so that bytes out
// of order, twice, or missing show up in what the child reads.
func streamByte(off int64) byte { return byte((uint64(off)*0x9E3779B97F4A7C15)>>56) ^ byte(off) }

func stream(off int64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = streamByte(off + int64(i))
	}
	return b
}

// waitFor blocks until cond, evaluated with q.mu held, holds, and returns
// the state at that moment. It wakes on each change of the queue's state,
// so it waits for events rather than polling.
func waitFor(q *Queue, cond func() bool) State {
	q.mu.Lock()
	defer q.mu.Unlock()
	for !cond() {
		if q.changed == nil {
			q.changed = make(chan struct{})
		}
		ch := q.changed
		q.mu.Unlock()
		<-ch
		q.mu.Lock()
	}
	return q.stateLocked()
}

// read is the child's side of a pipe: a goroutine that reads to EOF. The
// test owns it; it ends once the write end is closed (by the queue's
// writer), and wait returns what it read.
type read struct {
	wait func() []byte
}

func startReader(r *os.File) read {
	ch := make(chan []byte, 1)
	go func() {
		b, err := io.ReadAll(r)
		if err != nil {
			b = append(b, "<read error: "+err.Error()+">"...)
		}
		ch <- b
	}()
	return read{wait: sync.OnceValue(func() []byte { return <-ch })}
}

// newQueue makes a pipe and a queue writing into it; the cleanup stops the
// queue (closing the write end) before anything waits for a reader.
func newQueue(t *testing.T) (*Queue, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	q := New(w)
	t.Cleanup(q.Stop)
	return q, r
}

// fillPipe fills the pipe's buffer before the queue starts, so the writer
// blocks on its first byte until someone reads. It writes through the raw
// descriptor without blocking (os.Pipe's ends are non-blocking) and returns
// the bytes it wrote.
func fillPipe(t *testing.T, w *os.File) []byte {
	t.Helper()
	rc, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("prefill."), 512)
	var filled []byte
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		for {
			n, err := syscall.Write(int(fd), chunk)
			if n > 0 {
				filled = append(filled, chunk[:n]...)
			}
			switch err {
			case nil, syscall.EINTR:
			case syscall.EAGAIN:
				return true
			default:
				werr = err
				return true
			}
		}
	})
	if err != nil || werr != nil || len(filled) == 0 {
		t.Fatalf("filling the pipe: %v, %v, %d bytes", err, werr, len(filled))
	}
	return filled
}

// newStalledQueue is newQueue with the pipe already full and nobody
// reading: the writer cannot deliver a byte until the test starts a reader.
func newStalledQueue(t *testing.T) (q *Queue, r *os.File, prefill []byte) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	prefill = fillPipe(t, w)
	q = New(w)
	t.Cleanup(q.Stop)
	return q, r, prefill
}

var equateErrors = cmpopts.EquateErrors()

func TestLimits(t *testing.T) {
	sizes := func(n, size int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = size
		}
		return s
	}
	tests := []struct {
		name    string
		fill    []int // sizes of the writes accepted while the writer is stalled
		refused int   // size of the write then refused
		want    error
		fits    int // size of a write that still fits afterwards; 0: none
	}{
		{name: "one write over 64 KiB", fill: []int{10}, refused: MaxWrite + 1, want: ErrTooLarge, fits: MaxWrite},
		{name: "256 KiB queued", fill: sizes(4, MaxWrite), refused: 1, want: ErrFull},
		{name: "a write passing 256 KiB is not split", fill: append(sizes(3, MaxWrite), MaxWrite-1), refused: 2, want: ErrFull, fits: 1},
		{name: "256 writes queued", fill: sizes(MaxPending, 1), refused: 1, want: ErrFull},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q, r, prefill := newStalledQueue(t)
			var sent []byte
			write := func(n int) (int64, error) {
				off := int64(len(sent))
				acc, err := q.Write(off, stream(off, n))
				if err == nil {
					sent = append(sent, stream(off, n)...)
				}
				return acc, err
			}
			for i, n := range tc.fill {
				if _, err := write(n); err != nil {
					t.Fatalf("write %d of %d bytes: %v", i, n, err)
				}
			}
			before := q.State()
			want := State{Accepted: int64(len(sent)), Pending: len(tc.fill), Queued: len(sent)}
			if diff := cmp.Diff(want, before, equateErrors); diff != "" {
				t.Fatalf("stalled state (-want +got):\n%s", diff)
			}

			acc, err := write(tc.refused)
			if !errors.Is(err, tc.want) || acc != before.Accepted {
				t.Errorf("refused write: accepted %d, %v; want %d, %v", acc, err, before.Accepted, tc.want)
			}
			if diff := cmp.Diff(before, q.State(), equateErrors); diff != "" {
				t.Errorf("a refused write changed the queue (-before +after):\n%s", diff)
			}
			if tc.fits > 0 {
				if _, err := write(tc.fits); err != nil {
					t.Errorf("write of %d bytes that fits: %v", tc.fits, err)
				}
			}

			// Once the child reads, the queue empties and takes writes again.
			got := startReader(r)
			waitFor(q, func() bool { return len(q.queue) == 0 })
			if _, err := write(min(tc.refused, MaxWrite)); err != nil {
				t.Errorf("write after the queue drained: %v", err)
			}
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.wait(), append(prefill, sent...)) {
				t.Errorf("child read %d bytes, want the %d prefilled then the %d accepted", len(got.wait()), len(prefill), len(sent))
			}
		})
	}
}

func TestWriteOffsets(t *testing.T) {
	type call struct {
		Offset int64
		Data   string
	}
	type result struct {
		Accepted int64
		Err      error
	}
	tests := []struct {
		name  string
		calls []call
		want  []result
		read  string // what the child reads in all
	}{
		{
			name:  "in order",
			calls: []call{{0, "hello"}, {5, " "}, {6, "world"}},
			want:  []result{{5, nil}, {6, nil}, {11, nil}},
			read:  "hello world",
		},
		{
			name:  "retry of accepted bytes is acknowledged, not written again",
			calls: []call{{0, "hello"}, {0, "hello"}, {2, "llo"}, {0, "he"}, {5, "!"}},
			want:  []result{{5, nil}, {5, nil}, {5, nil}, {5, nil}, {6, nil}},
			read:  "hello!",
		},
		{
			name:  "overlap queues only the new suffix",
			calls: []call{{0, "hello"}, {3, "lo wo"}, {0, "hello world"}},
			want:  []result{{5, nil}, {8, nil}, {11, nil}},
			read:  "hello world",
		},
		{
			name:  "a hole is refused and queues nothing",
			calls: []call{{0, "ab"}, {3, "d"}, {2, "cd"}},
			want:  []result{{2, nil}, {2, ErrHole}, {4, nil}},
			read:  "abcd",
		},
		{
			name:  "negative offset",
			calls: []call{{-1, "a"}, {0, "a"}},
			want:  []result{{0, ErrOffset}, {1, nil}},
			read:  "a",
		},
		{
			name:  "empty writes only check",
			calls: []call{{0, ""}, {0, "ab"}, {2, ""}, {1, ""}, {3, ""}},
			want:  []result{{0, nil}, {2, nil}, {2, nil}, {2, nil}, {2, ErrHole}},
			read:  "ab",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q, r := newQueue(t)
			got := startReader(r)
			var results []result
			for _, c := range tc.calls {
				acc, err := q.Write(c.Offset, []byte(c.Data))
				results = append(results, result{acc, err})
			}
			if diff := cmp.Diff(tc.want, results, equateErrors); diff != "" {
				t.Errorf("results (-want +got):\n%s", diff)
			}
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.read, string(got.wait())); diff != "" {
				t.Errorf("child read (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAfterClose(t *testing.T) {
	tests := []struct {
		name   string
		offset int64
		data   string
		want   error
	}{
		{"new bytes", 5, "!", ErrClosed},
		{"a retry of accepted bytes", 1, "ell", nil},
		{"overlapping new bytes", 3, "lo!", ErrClosed},
		{"empty", 5, "", ErrClosed},
		{"a hole", 7, "x", ErrClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q, r := newQueue(t)
			got := startReader(r)
			if _, err := q.Write(0, []byte("hello")); err != nil {
				t.Fatal(err)
			}
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			acc, err := q.Write(tc.offset, []byte(tc.data))
			if !errors.Is(err, tc.want) || acc != 5 {
				t.Errorf("write after close: %d, %v; want 5, %v", acc, err, tc.want)
			}
			if diff := cmp.Diff("hello", string(got.wait())); diff != "" {
				t.Errorf("child read (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEOFOnce: the end of input comes after every accepted byte, and a
// second Close neither fails nor sends it again.
func TestEOFOnce(t *testing.T) {
	q, r := newQueue(t)
	got := startReader(r)
	if _, err := q.Write(0, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := q.Close(); err != nil {
			t.Fatalf("close %d: %v", i, err)
		}
	}
	// io.ReadAll returns only at EOF, and without error only at a clean one.
	if diff := cmp.Diff("hello", string(got.wait())); diff != "" {
		t.Errorf("child read (-want +got):\n%s", diff)
	}
	st := waitFor(q, func() bool { return q.eofSent })
	want := State{Accepted: 5, Delivered: 5, Closed: true, EOFSent: true}
	if diff := cmp.Diff(want, st, equateErrors); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	if err := q.Close(); err != nil {
		t.Errorf("close after EOF: %v", err)
	}
	q.Stop()
	if err := q.Close(); !errors.Is(err, ErrStopped) {
		t.Errorf("close after stop: %v, want %v", err, ErrStopped)
	}
}

// TestBrokenPipe: once the child closes its stdin, the queue breaks, drops
// what it holds, and says why from then on.
func TestBrokenPipe(t *testing.T) {
	q, r, _ := newStalledQueue(t)
	for i := range 3 {
		if _, err := q.Write(int64(i*100), stream(int64(i*100), 100)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(q, func() bool { return q.writing })
	r.Close()
	st := waitFor(q, func() bool { return q.broken != nil })
	want := State{Accepted: 300, Broken: ErrBroken}
	if diff := cmp.Diff(want, st, equateErrors); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	if !errors.Is(st.Broken, syscall.EPIPE) {
		t.Errorf("broken by %v, want EPIPE", st.Broken)
	}
	for name, err := range map[string]error{
		"write":       second(q.Write(300, []byte("x"))),
		"empty write": second(q.Write(300, nil)),
		"close":       q.Close(),
	} {
		if !errors.Is(err, ErrBroken) || !errors.Is(err, syscall.EPIPE) {
			t.Errorf("%s after EPIPE: %v, want %v wrapping EPIPE", name, err, ErrBroken)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// TestStopUnblocksStuckWriter: Stop interrupts a write the child never
// reads, closes the pipe and waits for the writer (goleak checks it is
// gone).
func TestStopUnblocksStuckWriter(t *testing.T) {
	q, r, prefill := newStalledQueue(t)
	if _, err := q.Write(0, stream(0, 1024)); err != nil {
		t.Fatal(err)
	}
	waitFor(q, func() bool { return q.writing })
	q.Stop()
	want := State{Accepted: 1024, Stopped: true}
	if diff := cmp.Diff(want, q.State(), equateErrors); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	if _, err := q.Write(1024, []byte("x")); !errors.Is(err, ErrStopped) {
		t.Errorf("write after stop: %v, want %v", err, ErrStopped)
	}
	if err := q.Close(); !errors.Is(err, ErrStopped) {
		t.Errorf("close after stop: %v, want %v", err, ErrStopped)
	}
	q.Stop() // again: returns at once
	// The write end is closed: the child reads what was in the pipe, then EOF.
	if b, err := io.ReadAll(r); err != nil || !bytes.Equal(b, prefill) {
		t.Errorf("child read %d bytes, %v; want the %d prefilled, then EOF", len(b), err, len(prefill))
	}
}

// TestStopIdleWriter: Stop also ends a writer that is waiting for work.
func TestStopIdleWriter(t *testing.T) {
	q, r := newQueue(t)
	if _, err := q.Write(0, []byte("a")); err != nil {
		t.Fatal(err)
	}
	waitFor(q, func() bool { return q.delivered == 1 })
	q.Stop()
	b, err := io.ReadAll(r)
	if err != nil || string(b) != "a" {
		t.Errorf("child read %q, %v; want %q, then EOF", b, err, "a")
	}
	want := State{Accepted: 1, Delivered: 1, Stopped: true} // closed, but no end of input asked for
	if diff := cmp.Diff(want, q.State(), equateErrors); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
}
