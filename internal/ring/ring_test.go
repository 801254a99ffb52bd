package ring

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// write commits p to stream s the way a pump does: read into Buffer, Commit.
func write(r *Ring, s Stream, p []byte) {
	for len(p) > 0 {
		n := copy(r.Buffer(s), p)
		r.Commit(s, n, false).Release()
		p = p[n:]
	}
}

// pattern is the byte a stream carries at an offset, so content can be
// checked after any amount of eviction.
func pattern(s Stream, off int64) byte { return byte(off*7+int64(s)*101) ^ byte(off>>8) }

func patterned(s Stream, from int64, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = pattern(s, from+int64(i))
	}
	return p
}

var canceled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// drain reads a cursor until EOF or until nothing more is available now,
// returning what it saw with Data copied.
func drain(t *testing.T, c *Cursor) []Event {
	t.Helper()
	var out []Event
	for {
		e, err := c.Next(canceled)
		if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		e.Data = bytes.Clone(e.Data)
		out = append(out, e)
	}
}

func TestReplayThenLive(t *testing.T) {
	r := New(Config{Capacity: 1024, Streams: []Stream{Stdout, Stderr}})
	write(r, Stdout, []byte("out1 "))
	write(r, Stderr, []byte("err1 "))
	c, err := r.Cursor(Offsets{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := drain(t, c)
	want := []Event{
		{Kind: Data, Stream: Stdout, Offset: 0, Seq: 0, Data: []byte("out1 ")},
		// seq counts the bytes of every stream before the event's first.
		{Kind: Data, Stream: Stderr, Offset: 0, Seq: 5, Data: []byte("err1 ")},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("replay (-want +got):\n%s", d)
	}

	// Live: a blocked Next is woken by a commit.
	done := make(chan Event)
	go func() {
		e, err := c.Next(context.Background())
		if err != nil {
			t.Error(err)
		}
		e.Data = bytes.Clone(e.Data)
		done <- e
	}()
	write(r, Stdout, []byte("out2"))
	e := <-done
	if d := cmp.Diff(Event{Kind: Data, Stream: Stdout, Offset: 5, Seq: 10, Data: []byte("out2")}, e); d != "" {
		t.Fatalf("live (-want +got):\n%s", d)
	}
	r.CloseStream(Stdout)
	r.CloseStream(Stderr)
	got = drain(t, c)
	want = []Event{{Kind: End, Stream: Stdout, Offset: 9}, {Kind: End, Stream: Stderr, Offset: 5}}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("ends (-want +got):\n%s", d)
	}
	if _, err := c.Next(context.Background()); !errors.Is(err, io.EOF) {
		t.Fatalf("after ends: %v, want EOF", err)
	}
}

// The seed's "attach after the ring wraps": the stream that wrapped reports
// its exact loss, the other stream is untouched.
func TestAttachAfterWrap(t *testing.T) {
	r := New(Config{Capacity: 100, Streams: []Stream{Stdout, Stderr}})
	write(r, Stdout, patterned(Stdout, 0, 300))
	write(r, Stderr, patterned(Stderr, 0, 10))
	r.CloseStream(Stdout)
	r.CloseStream(Stderr)
	c, _ := r.Cursor(Offsets{})
	defer c.Close()
	got := drain(t, c)
	// 90 bytes of stdout fit beside stderr's 10; the first 210 are gone.
	if d := cmp.Diff(Event{Kind: Gap, Stream: Stdout, Offset: 0, To: 210}, got[0]); d != "" {
		t.Fatalf("first event %+v, want the stdout gap [0,210)", got[0])
	}
	stdout, stderr := collect(got, Stdout), collect(got, Stderr)
	if !bytes.Equal(stdout, patterned(Stdout, 210, 90)) {
		t.Errorf("stdout after the gap is wrong")
	}
	if !bytes.Equal(stderr, patterned(Stderr, 0, 10)) {
		t.Errorf("stderr was touched: %q", stderr)
	}
	if n := countKind(got, Gap, Stderr); n != 0 {
		t.Errorf("stderr reported %d gaps", n)
	}
}

// The seed's "one stream fully evicted before attach": its total still
// reports the exact loss.
func TestStreamFullyEvicted(t *testing.T) {
	r := New(Config{Capacity: 64, Streams: []Stream{Stdout, Stderr}})
	write(r, Stdout, patterned(Stdout, 0, 50))
	r.CloseStream(Stdout)
	write(r, Stderr, patterned(Stderr, 0, 200))
	r.CloseStream(Stderr)
	c, _ := r.Cursor(Offsets{})
	defer c.Close()
	got := drain(t, c)
	want := []Event{
		{Kind: Gap, Stream: Stdout, Offset: 0, To: 50},
		{Kind: Gap, Stream: Stderr, Offset: 0, To: 136},
		{Kind: End, Stream: Stdout, Offset: 50},
	}
	if d := cmp.Diff(want, got[:3]); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	if d := cmp.Diff(Event{Kind: End, Stream: Stderr, Offset: 200}, got[len(got)-1]); d != "" {
		t.Fatalf("last event (-want +got):\n%s", d)
	}
}

func TestResumeFromOffsets(t *testing.T) {
	r := New(Config{Capacity: 1024, Streams: []Stream{Stdout, Stderr}})
	write(r, Stdout, []byte("hello "))
	write(r, Stderr, []byte("oops"))
	write(r, Stdout, []byte("world"))
	c, err := r.Cursor(Offsets{Stdout: 3, Stderr: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := drain(t, c)
	want := []Event{
		// A cursor that starts inside a chunk starts its seq there too.
		{Kind: Data, Stream: Stdout, Offset: 3, Seq: 3, Data: []byte("lo ")},
		{Kind: Data, Stream: Stdout, Offset: 6, Seq: 10, Data: []byte("world")},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	if p := c.Position(); p != (Offsets{Stdout: 11, Stderr: 4}) {
		t.Errorf("position %v", p)
	}
	if _, err := r.Cursor(Offsets{Stdout: 12}); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("offset past the end: %v, want ErrOutOfRange", err)
	}
}

func TestDiscardKeepsTotals(t *testing.T) {
	r := New(Config{Capacity: 1024, Streams: []Stream{Stdout, Stderr}})
	write(r, Stdout, []byte("abc"))
	r.CloseStream(Stdout)
	r.CloseStream(Stderr)
	r.Discard()
	if n := r.Retained(); n != 0 {
		t.Fatalf("retained %d after discard", n)
	}
	c, _ := r.Cursor(Offsets{Stdout: 1})
	defer c.Close()
	got := drain(t, c)
	want := []Event{
		{Kind: Gap, Stream: Stdout, Offset: 1, To: 3},
		{Kind: End, Stream: Stdout, Offset: 3},
		{Kind: End, Stream: Stderr, Offset: 0},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
}

func TestNextHonoursContext(t *testing.T) {
	r := New(Config{Capacity: 1024, Streams: []Stream{Stdout}})
	c, _ := r.Cursor(Offsets{})
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := c.Next(ctx)
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Next after cancel: %v", err)
	}
}

// A reader holding an event keeps its bytes intact even after the ring has
// evicted them and the pump has reused memory.
func TestHeldEventSurvivesEviction(t *testing.T) {
	r := New(Config{Capacity: 4096, Streams: []Stream{Stdout}})
	write(r, Stdout, patterned(Stdout, 0, 4096))
	c, _ := r.Cursor(Offsets{})
	defer c.Close()
	e, err := c.Next(canceled)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(e.Data)
	write(r, Stdout, patterned(Stdout, 4096, 1<<20))
	if !bytes.Equal(e.Data, want) {
		t.Fatal("held event's bytes changed under eviction")
	}
}

func collect(es []Event, s Stream) []byte {
	var b []byte
	for _, e := range es {
		if e.Kind == Data && e.Stream == s {
			b = append(b, e.Data...)
		}
	}
	return b
}

func countKind(es []Event, k Kind, s Stream) int {
	n := 0
	for _, e := range es {
		if e.Kind == k && e.Stream == s {
			n++
		}
	}
	return n
}

// Bytes committed with more set wake a waiting cursor only once a quarter of
// the ring has gathered, or at Flush — never later.
func TestCommitMoreWakesAtFlushOrQuarter(t *testing.T) {
	r := New(Config{Capacity: 4096, Streams: []Stream{Stdout}})
	c, _ := r.Cursor(Offsets{})
	defer c.Close()
	got := make(chan Event)
	next := func() {
		e, err := c.Next(context.Background())
		if err != nil {
			t.Error(err)
		}
		e.Data = bytes.Clone(e.Data)
		got <- e
	}
	commit := func(p []byte) {
		n := copy(r.Buffer(Stdout), p)
		r.Commit(Stdout, n, true).Release()
	}
	waiting := func() {
		for r.waiters.Load() == 0 {
			runtime.Gosched()
		}
	}

	go next()
	waiting()
	r.mu.RLock()
	wake := r.wake
	r.mu.RUnlock()
	commit([]byte("a"))
	select {
	case <-wake:
		t.Fatal("a commit with more set woke the waiting cursor")
	default:
	}
	r.Flush()
	if e := <-got; string(e.Data) != "a" {
		t.Fatalf("after flush: %+v", e)
	}

	go next()
	waiting()
	commit(make([]byte, 1024)) // a quarter of the ring
	if e := <-got; len(e.Data) != 1024 {
		t.Fatalf("after a quarter: %d bytes", len(e.Data))
	}
}

func TestChunkExtend(t *testing.T) {
	r := New(Config{Capacity: 1 << 20, Streams: []Stream{Stdout, Stderr}})
	commit := func(s Stream, p string) Chunk {
		n := copy(r.Buffer(s), p)
		return r.Commit(s, n, false)
	}
	a := commit(Stdout, "hello ")
	b := commit(Stdout, "world")
	ab, ok := a.Extend(b)
	if !ok || string(ab.Data) != "hello world" || ab.Offset != 0 {
		t.Fatalf("extend: %q at %d, %v", ab.Data, ab.Offset, ok)
	}
	e := commit(Stderr, "other stream")
	if got, ok := ab.Extend(e); ok || string(got.Data) != "hello world" {
		t.Fatalf("extended across streams: %q", got.Data)
	}
	e.Release()
	// Fill the rest of the block: the next chunk starts a new block.
	rest := commit(Stdout, string(make([]byte, len(r.Buffer(Stdout)))))
	ab, ok = ab.Extend(rest)
	if !ok {
		t.Fatal("the block's last bytes did not extend")
	}
	next := commit(Stdout, "new block")
	if _, ok := ab.Extend(next); ok {
		t.Fatal("extended into another block")
	}
	next.Release()
	if _, ok := (Chunk{}).Extend(commit(Stdout, "x")); ok {
		t.Fatal("the zero chunk extended")
	}
	ab.Release()
	tot, _ := r.Totals()
	if tot[Stdout] != int64(len("hello world"))+int64(len(rest.Data))+int64(len("new block"))+1 {
		t.Errorf("totals %v", tot)
	}
}
