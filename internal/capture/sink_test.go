package capture

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// patternByte is the byte at offset off of stream st in every test: a
// position-dependent value, so a chunk with the wrong offset, or memory the
// ring reused under a held reference, shows up as wrong content.
func patternByte(st ring.Stream, off int64) byte {
	x := uint64(off)*0x9E3779B97F4A7C15 + uint64(st+1)*0x632BE59BD9B4E019
	return byte(x >> 56)
}

func pattern(st ring.Stream, off int64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = patternByte(st, off+int64(i))
	}
	return b
}

// producer plays the pumps: it commits pattern bytes into a real ring and
// pushes each chunk into the sink, releasing its own reference afterwards
// as a pump does. produced[st] is written only by st's pump.
type producer struct {
	r        *ring.Ring
	s        *Sink
	produced ring.Offsets
}

func newProducer(s *Sink, ringCapacity int, streams ...ring.Stream) *producer {
	return &producer{r: ring.New(ring.Config{Capacity: ringCapacity, Streams: streams}), s: s}
}

// push commits up to n bytes of st (fewer if the ring's buffer is shorter)
// and pushes the chunk. It returns how many bytes it committed.
func (p *producer) push(st ring.Stream, n int) int {
	buf := p.r.Buffer(st)
	n = min(n, len(buf))
	for i := range n {
		buf[i] = patternByte(st, p.produced[st]+int64(i))
	}
	c := p.r.Commit(st, n, false)
	p.s.Push(c)
	c.Release()
	p.produced[st] += int64(n)
	return n
}

// replay reads items the way the log writer does and checks, per stream,
// that they describe the output without holes and with the right bytes. It
// releases every Data item's chunk.
type replay struct {
	pos      ring.Offsets // where the stream's next Data item must start
	received ring.Offsets // bytes delivered in Data items
	dropSum  ring.Offsets // bytes described by Drop items
	drops    [ring.NumStreams]int
	errs     []string
}

func (l *replay) apply(it Item) {
	st := it.Stream
	switch it.Kind {
	case Data:
		c := it.Chunk
		if c.Offset != l.pos[st] {
			l.errs = append(l.errs, fmt.Sprintf("%v data at offset %d, want %d: a loss was not described", st, c.Offset, l.pos[st]))
		}
		if !bytes.Equal(c.Data, pattern(st, c.Offset, len(c.Data))) {
			l.errs = append(l.errs, fmt.Sprintf("%v data at offset %d: wrong content", st, c.Offset))
		}
		l.pos[st] = c.Offset + int64(len(c.Data))
		l.received[st] += int64(len(c.Data))
		c.Release()
	case Drop:
		if it.Dropped <= 0 {
			l.errs = append(l.errs, fmt.Sprintf("%v drop of %d bytes", st, it.Dropped))
		}
		l.pos[st] += it.Dropped
		l.dropSum[st] += it.Dropped
		l.drops[st]++
	default:
		l.errs = append(l.errs, fmt.Sprintf("item of kind %v", it.Kind))
	}
}

// accounts are the identities that hold per stream once the sink is closed
// and drained; each field must equal its counterpart in wantAccounts.
type accounts struct {
	DataPlusLost     ring.Offsets // bytes received + Dropped(): the bytes produced
	DropsPlusPending ring.Offsets // Drop items summed + Pending: Dropped()
	PosPlusPending   ring.Offsets // where the writer stands + Pending: the bytes produced
}

func accountingDiff(s *Sink, produced ring.Offsets, l *replay) string {
	dropped := s.Dropped()
	var got accounts
	for st := range ring.NumStreams {
		pending := s.Pending(ring.Stream(st))
		got.DataPlusLost[st] = l.received[st] + dropped[st]
		got.DropsPlusPending[st] = l.dropSum[st] + pending
		got.PosPlusPending[st] = l.pos[st] + pending
	}
	want := accounts{DataPlusLost: produced, DropsPlusPending: dropped, PosPlusPending: produced}
	return cmp.Diff(want, got)
}

// consumer is a stand-in log writer that takes items only when the test
// grants them, so the test decides when the channel overflows. The test
// starts it and stops it with finish, which waits for it.
type consumer struct {
	s     *Sink
	grant chan int      // take this many items, then signal took; closed: drain to the end
	took  chan struct{} // one signal per grant
	done  chan struct{} // closed once Items is closed and drained
	log   replay        // the goroutine's until done is closed
	// lastDropped checks, while pumps run, that Dropped never decreases.
	lastDropped ring.Offsets
}

func startConsumer(s *Sink) *consumer {
	c := &consumer{s: s, grant: make(chan int), took: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c
}

func (c *consumer) run() {
	defer close(c.done)
	for k := range c.grant {
		for range k {
			c.receive(<-c.s.Items())
		}
		c.took <- struct{}{}
	}
	for it := range c.s.Items() {
		c.receive(it)
	}
}

func (c *consumer) receive(it Item) {
	c.log.apply(it)
	d := c.s.Dropped()
	for st := range d {
		if d[st] < c.lastDropped[st] {
			c.log.errs = append(c.log.errs, fmt.Sprintf("%v Dropped went from %d to %d", ring.Stream(st), c.lastDropped[st], d[st]))
		}
	}
	c.lastDropped = d
}

// take lets the consumer receive k items and waits until it has. The caller
// must know that k items are queued.
func (c *consumer) take(k int) {
	c.grant <- k
	<-c.took
}

// finish lets the consumer drain everything, closes the sink (every pump
// has returned by now) and waits for the consumer to exit.
func (c *consumer) finish() {
	close(c.grant)
	c.s.Close()
	<-c.done
}

// summary is an Item without its reference, for comparing.
type summary struct {
	Kind    ItemKind
	Stream  ring.Stream
	Offset  int64
	Len     int
	Dropped int64
}

// observed is the sink's visible state after one step.
type observed struct {
	Took    summary // the item taken; zero when the step pushed or nothing was queued
	Queued  int
	Pending ring.Offsets
	Dropped ring.Offsets
}

// step either pushes push bytes of stream or, when take is set, receives
// one item if any is queued.
type step struct {
	stream ring.Stream
	push   int
	take   bool
	want   observed
}

func runSteps(t *testing.T, capacity int, steps []step) {
	t.Helper()
	s := NewSink(capacity)
	p := newProducer(s, 64<<10, ring.Stdout, ring.Stderr)
	var l replay
	for i, st := range steps {
		var got observed
		if st.take {
			select {
			case it := <-s.Items():
				got.Took = summary{Kind: it.Kind, Stream: it.Stream, Dropped: it.Dropped}
				if it.Kind == Data {
					got.Took.Offset, got.Took.Len = it.Chunk.Offset, len(it.Chunk.Data)
				}
				l.apply(it)
			default:
			}
		} else if n := p.push(st.stream, st.push); n != st.push {
			t.Fatalf("step %d: ring took %d bytes, want %d", i, n, st.push)
		}
		got.Queued = len(s.Items())
		got.Pending = ring.Offsets{s.Pending(ring.Stdout), s.Pending(ring.Stderr)}
		got.Dropped = s.Dropped()
		if diff := cmp.Diff(st.want, got); diff != "" {
			t.Fatalf("step %d (-want +got):\n%s", i, diff)
		}
	}
	s.Close()
	for it := range s.Items() {
		l.apply(it)
	}
	if len(l.errs) > 0 {
		t.Errorf("log inconsistent:\n%s", strings.Join(l.errs, "\n"))
	}
	if diff := accountingDiff(s, p.produced, &l); diff != "" {
		t.Errorf("accounting (-want +got):\n%s", diff)
	}
}

func data(st ring.Stream, off int64, n int) summary {
	return summary{Kind: Data, Stream: st, Offset: off, Len: n}
}

func drop(st ring.Stream, n int64) summary { return summary{Kind: Drop, Stream: st, Dropped: n} }

func stdout(n int64) ring.Offsets { return ring.Offsets{ring.Stdout: n} }

// TestCapacityOneDropRefillsTheSlot: with one slot, a successful Drop takes
// the slot the following Data needs, so that data is lost too and counted
// again, in pending and in total.
func TestCapacityOneDropRefillsTheSlot(t *testing.T) {
	out := ring.Stdout
	runSteps(t, 1, []step{
		{stream: out, push: 3, want: observed{Queued: 1}},
		{stream: out, push: 2, want: observed{Queued: 1, Pending: stdout(2), Dropped: stdout(2)}},
		{take: true, want: observed{Took: data(out, 0, 3), Pending: stdout(2), Dropped: stdout(2)}},
		// The Drop of 2 fills the slot; the 4 bytes are lost behind it.
		{stream: out, push: 4, want: observed{Queued: 1, Pending: stdout(4), Dropped: stdout(6)}},
		{take: true, want: observed{Took: drop(out, 2), Pending: stdout(4), Dropped: stdout(6)}},
		{stream: out, push: 1, want: observed{Queued: 1, Pending: stdout(1), Dropped: stdout(7)}},
		{take: true, want: observed{Took: drop(out, 4), Pending: stdout(1), Dropped: stdout(7)}},
		{take: true, want: observed{Pending: stdout(1), Dropped: stdout(7)}},
	})
}

func TestPushSteps(t *testing.T) {
	out, errs := ring.Stdout, ring.Stderr
	tests := []struct {
		name     string
		capacity int
		steps    []step
	}{
		{
			name:     "data follows its Drop once two slots are free",
			capacity: 2,
			steps: []step{
				{stream: out, push: 1, want: observed{Queued: 1}},
				{stream: out, push: 2, want: observed{Queued: 2}},
				{stream: out, push: 3, want: observed{Queued: 2, Pending: stdout(3), Dropped: stdout(3)}},
				{take: true, want: observed{Took: data(out, 0, 1), Queued: 1, Pending: stdout(3), Dropped: stdout(3)}},
				// One slot: the Drop fits, the data does not.
				{stream: out, push: 4, want: observed{Queued: 2, Pending: stdout(4), Dropped: stdout(7)}},
				{take: true, want: observed{Took: data(out, 1, 2), Queued: 1, Pending: stdout(4), Dropped: stdout(7)}},
				{take: true, want: observed{Took: drop(out, 3), Pending: stdout(4), Dropped: stdout(7)}},
				{stream: out, push: 5, want: observed{Queued: 2, Dropped: stdout(7)}},
				{take: true, want: observed{Took: drop(out, 4), Queued: 1, Dropped: stdout(7)}},
				{take: true, want: observed{Took: data(out, 10, 5), Dropped: stdout(7)}},
			},
		},
		{
			name:     "streams are counted apart",
			capacity: 2,
			steps: []step{
				{stream: out, push: 1, want: observed{Queued: 1}},
				{stream: errs, push: 2, want: observed{Queued: 2}},
				{stream: errs, push: 3, want: observed{Queued: 2, Pending: ring.Offsets{ring.Stderr: 3}, Dropped: ring.Offsets{ring.Stderr: 3}}},
				{stream: out, push: 4, want: observed{Queued: 2, Pending: ring.Offsets{4, 3}, Dropped: ring.Offsets{4, 3}}},
				{take: true, want: observed{Took: data(out, 0, 1), Queued: 1, Pending: ring.Offsets{4, 3}, Dropped: ring.Offsets{4, 3}}},
				// stderr's Drop takes the free slot; stdout's pending is untouched.
				{stream: errs, push: 5, want: observed{Queued: 2, Pending: ring.Offsets{4, 5}, Dropped: ring.Offsets{4, 8}}},
				{take: true, want: observed{Took: data(errs, 0, 2), Queued: 1, Pending: ring.Offsets{4, 5}, Dropped: ring.Offsets{4, 8}}},
				{take: true, want: observed{Took: drop(errs, 3), Pending: ring.Offsets{4, 5}, Dropped: ring.Offsets{4, 8}}},
				{stream: out, push: 6, want: observed{Queued: 2, Pending: ring.Offsets{0, 5}, Dropped: ring.Offsets{4, 8}}},
				{take: true, want: observed{Took: drop(out, 4), Queued: 1, Pending: ring.Offsets{0, 5}, Dropped: ring.Offsets{4, 8}}},
				{take: true, want: observed{Took: data(out, 5, 6), Pending: ring.Offsets{0, 5}, Dropped: ring.Offsets{4, 8}}},
			},
		},
		{
			name:     "an empty chunk is neither sent nor counted",
			capacity: 1,
			steps: []step{
				{stream: out, push: 1, want: observed{Queued: 1}},
				{stream: out, push: 0, want: observed{Queued: 1}},
				{take: true, want: observed{Took: data(out, 0, 1)}},
				{stream: out, push: 0, want: observed{}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runSteps(t, tc.capacity, tc.steps) })
	}
}

func TestMisuseIsReported(t *testing.T) {
	tests := []struct {
		name string
		f    func()
		want string // start of the panic message; empty: must not panic
	}{
		{"capacity zero", func() { NewSink(0) }, "capture: sink capacity 0"},
		{"push after close", func() {
			s := NewSink(1)
			p := newProducer(s, 4<<10, ring.Stdout)
			s.Close()
			p.push(ring.Stdout, 1)
		}, "capture: Push of 1 bytes of stdout after Close"},
		{"close twice", func() {
			s := NewSink(1)
			s.Close()
			s.Close()
		}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := func() (msg string) {
				defer func() {
					if r := recover(); r != nil {
						msg = fmt.Sprint(r)
					}
				}()
				tc.f()
				return ""
			}()
			if !strings.HasPrefix(got, tc.want) || (tc.want == "") != (got == "") {
				t.Errorf("panic %q, want one starting with %q", got, tc.want)
			}
		})
	}
}

// TestFailedSendReleasesItsReference checks the reference a Data item takes
// is given back when the item cannot be sent. A leaked reference is not
// visible through the ring's API, but it keeps its block from ever being
// reused, so the ring has to allocate fresh blocks: pushing then costs
// allocations where it otherwise costs none.
func TestFailedSendReleasesItsReference(t *testing.T) {
	s := NewSink(1)
	p := newProducer(s, 16<<10, ring.Stdout)
	p.push(ring.Stdout, 1000)
	p.push(ring.Stdout, 1000) // lost: from now on every Drop refills the slot
	// Each round enqueues a Drop, retains the chunk, fails to send it, and
	// must release it again; the writer takes the Drop.
	round := func() {
		for range 100 {
			p.push(ring.Stdout, 1000)
			if it := <-s.Items(); it.Kind == Data {
				it.Chunk.Release()
			}
		}
	}
	round() // let the ring settle on its free blocks
	if allocs := testing.AllocsPerRun(10, round); allocs != 0 {
		t.Errorf("%v allocations per 100 pushes, want 0: blocks are not coming back", allocs)
	}
	if got, want := s.Dropped()[ring.Stdout], p.produced[ring.Stdout]-1000; got != want {
		t.Errorf("Dropped %d, want %d: every push after the first is lost", got, want)
	}
	s.Close()
}

// TestOverflowCountsTheWholeRunsLoss stalls the writer while a pump overflows
// the channel many times, and checks that Dropped is the loss of the whole
// run, not only the last undescribed part, and that what did arrive is the
// right bytes at the right offsets. The ring is small, so its blocks are
// reused constantly: a chunk whose memory the sink failed to hold would
// show up as wrong content.
func TestOverflowCountsTheWholeRunsLoss(t *testing.T) {
	s := NewSink(8)
	p := newProducer(s, 16<<10, ring.Stdout)
	c := startConsumer(s)
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 60 {
		for range 1 + rng.IntN(30) {
			p.push(ring.Stdout, 1+rng.IntN(1000))
		}
		// Vary how far the writer catches up: not at all, partly, fully.
		switch q := len(s.Items()); round % 3 {
		case 1:
			c.take(q / 2)
		case 2:
			c.take(q)
		}
	}
	c.finish()

	if len(c.log.errs) > 0 {
		t.Errorf("log inconsistent:\n%s", strings.Join(c.log.errs, "\n"))
	}
	if diff := accountingDiff(s, p.produced, &c.log); diff != "" {
		t.Errorf("accounting (-want +got):\n%s", diff)
	}
	// The scenario must actually lose data repeatedly, and deliver some.
	if d := c.log.drops[ring.Stdout]; d < 2 {
		t.Errorf("%d Drop items, want several", d)
	}
	if c.log.received[ring.Stdout] == 0 {
		t.Error("no data received")
	}
}

// TestConcurrentPumps runs stdout's and stderr's pumps at once against one
// sink and a writer that starts late, then drains as fast as it can. Run
// with -race: it also checks the per-stream state is not shared unsafely.
func TestConcurrentPumps(t *testing.T) {
	streams := []ring.Stream{ring.Stdout, ring.Stderr}
	s := NewSink(16)
	p := newProducer(s, 64<<10, streams...)
	c := startConsumer(s)
	warm := make(chan struct{}, len(streams))
	var pumps sync.WaitGroup
	for _, st := range streams {
		pumps.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(st), 7))
			for i := range 3000 {
				if i == 200 {
					warm <- struct{}{}
				}
				p.push(st, 1+rng.IntN(1000))
			}
			p.r.CloseStream(st)
		})
	}
	// 400 chunks have met 16 slots: each stream has lost at least 184.
	for range streams {
		<-warm
	}
	close(c.grant) // from here on the writer drains as fast as it can
	pumps.Wait()
	s.Close()
	<-c.done

	if len(c.log.errs) > 0 {
		t.Errorf("log inconsistent:\n%s", strings.Join(c.log.errs, "\n"))
	}
	if diff := accountingDiff(s, p.produced, &c.log); diff != "" {
		t.Errorf("accounting (-want +got):\n%s", diff)
	}
	for _, st := range streams {
		if s.Dropped()[st] == 0 || c.log.received[st] == 0 {
			t.Errorf("%v: dropped %d, received %d; want both above zero", st, s.Dropped()[st], c.log.received[st])
		}
	}
}

// TestPushProperty drives one sink with random capacities, chunk sizes and
// writer stalls, checking after every push exactly what the rules say
// happens, and the accounting identities at the end.
func TestPushProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.IntRange(1, 6).Draw(t, "capacity")
		s := NewSink(capacity)
		ringCap := rapid.SampledFrom([]int{4 << 10, 16 << 10, 64 << 10}).Draw(t, "ring")
		p := newProducer(s, ringCap, ring.Stdout, ring.Stderr)
		var l replay
		for range rapid.IntRange(1, 300).Draw(t, "steps") {
			op := rapid.IntRange(0, 2).Draw(t, "op")
			if op == 2 {
				for range rapid.IntRange(0, len(s.Items())).Draw(t, "take") {
					l.apply(<-s.Items())
				}
				continue
			}
			st := ring.Stream(op)
			queued, pending, dropped := len(s.Items()), s.Pending(st), s.Dropped()
			n := int64(p.push(st, rapid.IntRange(1, 2000).Draw(t, "size")))

			type after struct {
				Queued  int
				Pending int64
				Dropped ring.Offsets
			}
			want := after{Queued: queued + 1, Dropped: dropped}
			switch {
			case queued == capacity: // nothing fits: lost, on top of earlier losses
				want = after{Queued: queued, Pending: pending + n, Dropped: dropped}
				want.Dropped[st] += n
			case pending > 0 && queued+1 == capacity: // the Drop fits, the data not
				want = after{Queued: capacity, Pending: n, Dropped: dropped}
				want.Dropped[st] += n
			case pending > 0: // Drop and data both fit
				want.Queued = queued + 2
			}
			got := after{Queued: len(s.Items()), Pending: s.Pending(st), Dropped: s.Dropped()}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("push of %d bytes of %v, capacity %d (-want +got):\n%s", n, st, capacity, diff)
			}
		}
		s.Close()
		for it := range s.Items() {
			l.apply(it)
		}
		if len(l.errs) > 0 {
			t.Fatalf("log inconsistent:\n%s", strings.Join(l.errs, "\n"))
		}
		if diff := accountingDiff(s, p.produced, &l); diff != "" {
			t.Fatalf("accounting (-want +got):\n%s", diff)
		}
	})
}
