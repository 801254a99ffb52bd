package capture

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

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

func (l *replay) apply(s *Sink, it Item) {
	defer s.Done(it)
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
// grants it, so the test decides when the budget overflows. The test
// starts it and stops it with finish, which waits for it.
type consumer struct {
	s     *Sink
	grant chan struct{} // take what is queued, then signal took; closed: drain to the end
	took  chan struct{} // one signal per grant
	done  chan struct{} // closed once the sink reported its end
	log   replay        // the goroutine's until done is closed
	// lastDropped checks, while pumps run, that Dropped never decreases.
	lastDropped ring.Offsets
}

func startConsumer(s *Sink) *consumer {
	c := &consumer{s: s, grant: make(chan struct{}), took: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c
}

func (c *consumer) run() {
	defer close(c.done)
	var batch []Item
	for range c.grant {
		if items, _ := c.s.Queued(); items > 0 {
			batch, _, _ = c.s.Take(batch[:0])
			c.receive(batch)
		}
		c.took <- struct{}{}
	}
	for more := true; more; {
		batch, more, _ = c.s.Take(batch[:0])
		c.receive(batch)
	}
}

func (c *consumer) receive(batch []Item) {
	for _, it := range batch {
		c.log.apply(c.s, it)
	}
	d := c.s.Dropped()
	for st := range d {
		if d[st] < c.lastDropped[st] {
			c.log.errs = append(c.log.errs, fmt.Sprintf("%v Dropped went from %d to %d", ring.Stream(st), c.lastDropped[st], d[st]))
		}
	}
	c.lastDropped = d
}

// take lets the consumer take what is queued and waits until it has.
func (c *consumer) take() {
	c.grant <- struct{}{}
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
	Took    []summary // the items taken; none when the step pushed
	Items   int       // queued
	Used    int64     // of the budget
	Pending ring.Offsets
	Dropped ring.Offsets
}

// step either pushes push bytes of stream or, when take is set, takes
// everything queued, if anything is.
type step struct {
	stream ring.Stream
	push   int
	take   bool
	want   observed
}

func runSteps(t *testing.T, budget int64, steps []step) {
	t.Helper()
	s := NewSink(budget)
	p := newProducer(s, 64<<10, ring.Stdout, ring.Stderr)
	var l replay
	for i, st := range steps {
		var got observed
		if st.take {
			if n, _ := s.Queued(); n > 0 {
				batch, _, _ := s.Take(nil)
				for _, it := range batch {
					sum := summary{Kind: it.Kind, Stream: it.Stream, Dropped: it.Dropped}
					if it.Kind == Data {
						sum.Offset, sum.Len = it.Chunk.Offset, len(it.Chunk.Data)
					}
					got.Took = append(got.Took, sum)
					l.apply(s, it)
				}
			}
		} else if n := p.push(st.stream, st.push); n != st.push {
			t.Fatalf("step %d: ring took %d bytes, want %d", i, n, st.push)
		}
		got.Items, got.Used = s.Queued()
		got.Pending = ring.Offsets{s.Pending(ring.Stdout), s.Pending(ring.Stderr)}
		got.Dropped = s.Dropped()
		if diff := cmp.Diff(st.want, got); diff != "" {
			t.Fatalf("step %d (-want +got):\n%s", i, diff)
		}
	}
	s.Close()
	for more := true; more; {
		var batch []Item
		batch, more, _ = s.Take(nil)
		for _, it := range batch {
			l.apply(s, it)
		}
	}
	if len(l.errs) > 0 {
		t.Errorf("log inconsistent:\n%s", strings.Join(l.errs, "\n"))
	}
	if diff := accountingDiff(s, p.produced, &l); diff != "" {
		t.Errorf("accounting (-want +got):\n%s", diff)
	}
	if _, used := s.Queued(); used != 0 {
		t.Errorf("%d bytes of budget still taken after every item was done", used)
	}
}

func data(st ring.Stream, off int64, n int) summary {
	return summary{Kind: Data, Stream: st, Offset: off, Len: n}
}

func drop(st ring.Stream, n int64) summary { return summary{Kind: Drop, Stream: st, Dropped: n} }

func stdout(n int64) ring.Offsets { return ring.Offsets{ring.Stdout: n} }

// TestCapacityOneDropRefillsTheSlot is the seed's capacity-one case in
// bytes: a budget with room for one item. A successful Drop takes the room
// the following Data needs, so that data is lost too and counted again,
// in pending and in total.
func TestCapacityOneDropRefillsTheSlot(t *testing.T) {
	t.Parallel()
	out := ring.Stdout
	runSteps(t, itemCost+3, []step{
		{stream: out, push: 3, want: observed{Items: 1, Used: itemCost + 3}},
		{stream: out, push: 2, want: observed{Items: 1, Used: itemCost + 3, Pending: stdout(2), Dropped: stdout(2)}},
		{take: true, want: observed{Took: []summary{data(out, 0, 3)}, Pending: stdout(2), Dropped: stdout(2)}},
		// The Drop of 2 takes the room; the 4 bytes are lost behind it.
		{stream: out, push: 4, want: observed{Items: 1, Used: itemCost, Pending: stdout(4), Dropped: stdout(6)}},
		{take: true, want: observed{Took: []summary{drop(out, 2)}, Pending: stdout(4), Dropped: stdout(6)}},
		{stream: out, push: 1, want: observed{Items: 1, Used: itemCost, Pending: stdout(1), Dropped: stdout(7)}},
		{take: true, want: observed{Took: []summary{drop(out, 4)}, Pending: stdout(1), Dropped: stdout(7)}},
		{take: true, want: observed{Pending: stdout(1), Dropped: stdout(7)}},
	})
}

func TestPushSteps(t *testing.T) {
	t.Parallel()
	out, errs := ring.Stdout, ring.Stderr
	tests := []struct {
		name   string
		budget int64
		steps  []step
	}{
		{
			name:   "a chunk that continues the last item joins it",
			budget: 1 << 10,
			steps: []step{
				{stream: out, push: 10, want: observed{Items: 1, Used: itemCost + 10}},
				{stream: out, push: 20, want: observed{Items: 1, Used: itemCost + 30}},
				{stream: out, push: 30, want: observed{Items: 1, Used: itemCost + 60}},
				{take: true, want: observed{Took: []summary{data(out, 0, 60)}}},
				// Taken items are never joined: the writer owns them.
				{stream: out, push: 5, want: observed{Items: 1, Used: itemCost + 5}},
			},
		},
		{
			name:   "the other stream's chunk starts an item of its own",
			budget: 1 << 10,
			steps: []step{
				{stream: out, push: 1, want: observed{Items: 1, Used: itemCost + 1}},
				{stream: errs, push: 2, want: observed{Items: 2, Used: 2*itemCost + 3}},
				{stream: out, push: 3, want: observed{Items: 3, Used: 3*itemCost + 6}},
				{stream: out, push: 4, want: observed{Items: 3, Used: 3*itemCost + 10}},
				{take: true, want: observed{Took: []summary{data(out, 0, 1), data(errs, 0, 2), data(out, 1, 7)}}},
			},
		},
		{
			name:   "bytes count against the budget, joined or not",
			budget: itemCost + 100,
			steps: []step{
				{stream: out, push: 60, want: observed{Items: 1, Used: itemCost + 60}},
				{stream: out, push: 40, want: observed{Items: 1, Used: itemCost + 100}},
				{stream: out, push: 1, want: observed{Items: 1, Used: itemCost + 100, Pending: stdout(1), Dropped: stdout(1)}},
				{take: true, want: observed{Took: []summary{data(out, 0, 100)}, Pending: stdout(1), Dropped: stdout(1)}},
				{stream: out, push: 99, want: observed{Items: 1, Used: itemCost, Pending: stdout(99), Dropped: stdout(100)}},
				{take: true, want: observed{Took: []summary{drop(out, 1)}, Pending: stdout(99), Dropped: stdout(100)}},
				// A Drop and a new item: room for both now.
				{stream: out, push: 0, want: observed{Pending: stdout(99), Dropped: stdout(100)}},
			},
		},
		{
			name:   "data follows its Drop once there is room for both",
			budget: 2*itemCost + 10,
			steps: []step{
				{stream: out, push: 10, want: observed{Items: 1, Used: itemCost + 10}},
				{stream: errs, push: 10, want: observed{Items: 1, Used: itemCost + 10, Pending: ring.Offsets{ring.Stderr: 10}, Dropped: ring.Offsets{ring.Stderr: 10}}},
				{take: true, want: observed{Took: []summary{data(out, 0, 10)}, Pending: ring.Offsets{ring.Stderr: 10}, Dropped: ring.Offsets{ring.Stderr: 10}}},
				// stdout's loss is not stderr's: stdout queues as before.
				{stream: out, push: 5, want: observed{Items: 1, Used: itemCost + 5, Pending: ring.Offsets{ring.Stderr: 10}, Dropped: ring.Offsets{ring.Stderr: 10}}},
				{take: true, want: observed{Took: []summary{data(out, 10, 5)}, Pending: ring.Offsets{ring.Stderr: 10}, Dropped: ring.Offsets{ring.Stderr: 10}}},
				{stream: errs, push: 10, want: observed{Items: 2, Used: 2*itemCost + 10, Dropped: ring.Offsets{ring.Stderr: 10}}},
				{take: true, want: observed{Took: []summary{drop(errs, 10), data(errs, 10, 10)}, Dropped: ring.Offsets{ring.Stderr: 10}}},
			},
		},
		{
			name:   "an empty chunk is neither queued nor counted",
			budget: MinQueueBytes,
			steps: []step{
				{stream: out, push: 1, want: observed{Items: 1, Used: itemCost + 1}},
				{stream: out, push: 0, want: observed{Items: 1, Used: itemCost + 1}},
				{take: true, want: observed{Took: []summary{data(out, 0, 1)}}},
				{stream: out, push: 0, want: observed{}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { runSteps(t, tc.budget, tc.steps) })
	}
}

func TestMisuseIsReported(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		f    func()
		want string // start of the panic message; empty: must not panic
	}{
		{"budget too small", func() { NewSink(MinQueueBytes - 1) }, "capture: sink budget"},
		{"push after close", func() {
			s := NewSink(MinQueueBytes)
			p := newProducer(s, 4<<10, ring.Stdout)
			s.Close()
			p.push(ring.Stdout, 1)
		}, "capture: Push of 1 bytes of stdout after Close"},
		{"close twice", func() {
			s := NewSink(MinQueueBytes)
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

// TestFailedPushReleasesItsReference checks that a chunk the sink could
// not queue holds no reference of the sink's. A leaked reference is not
// visible through the ring's API, but it keeps its block from ever being
// reused, so the ring has to allocate fresh blocks: pushing then costs
// allocations where it otherwise costs none.
func TestFailedPushReleasesItsReference(t *testing.T) {
	// Not in parallel: it measures the test process's allocations.
	s := NewSink(itemCost + 1000)
	p := newProducer(s, 16<<10, ring.Stdout)
	p.push(ring.Stdout, 1000)
	p.push(ring.Stdout, 1000) // lost: from now on every Drop takes the room
	// Each round queues a Drop and fails to queue the chunk behind it; the
	// writer takes the Drop.
	var batch []Item
	round := func() {
		for range 100 {
			p.push(ring.Stdout, 1000)
			batch, _, _ = s.Take(batch[:0])
			for _, it := range batch {
				s.Done(it)
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
// the budget many times, and checks that Dropped is the loss of the whole
// run, not only the last undescribed part, and that what did arrive is the
// right bytes at the right offsets. The ring is small, so its blocks are
// reused constantly: a chunk whose memory the sink failed to hold would
// show up as wrong content.
func TestOverflowCountsTheWholeRunsLoss(t *testing.T) {
	t.Parallel()
	s := NewSink(8 << 10)
	p := newProducer(s, 16<<10, ring.Stdout, ring.Stderr)
	c := startConsumer(s)
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 60 {
		for range 1 + rng.IntN(30) {
			p.push(ring.Stream(rng.IntN(2)), 1+rng.IntN(1000))
		}
		// Vary how often the writer catches up.
		if round%3 != 0 {
			c.take()
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
	if d := c.log.drops[ring.Stdout] + c.log.drops[ring.Stderr]; d < 2 {
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
	t.Parallel()
	streams := []ring.Stream{ring.Stdout, ring.Stderr}
	s := NewSink(64 << 10)
	p := newProducer(s, 64<<10, streams...)
	c := startConsumer(s)
	warm := make(chan struct{}, len(streams))
	drain, first, rest := make(chan struct{}), make(chan struct{}, len(streams)), make(chan struct{})
	var pumps sync.WaitGroup
	for _, st := range streams {
		pumps.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(st), 7))
			for i := range 3000 {
				switch i {
				case 200:
					warm <- struct{}{}
					<-drain
				case 201:
					// Each stream's first chunk after the drain is in
					// before either goes on: neither can take all the
					// room the drain made.
					first <- struct{}{}
					<-rest
				}
				p.push(st, 1+rng.IntN(1000))
			}
			p.r.CloseStream(st)
		})
	}
	// 200 chunks a stream, 100 KiB or so each, have met 64 KiB of budget
	// with nothing written: each stream has lost some.
	for range streams {
		<-warm
	}
	close(c.grant) // from here on the writer drains as fast as it can
	deadline := time.Now().Add(time.Minute)
	for _, used := s.Queued(); used > 0; _, used = s.Queued() {
		if time.Now().After(deadline) {
			t.Fatalf("the writer has not drained the queue: %d bytes in it", used)
		}
		runtime.Gosched()
	}
	close(drain)
	for range streams {
		<-first
	}
	close(rest)
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

// TestShortLinesAreOneItem: a shell loop's output, a line per write and
// the writer asleep meanwhile, costs the queue one item per ring block,
// not one per line, so 20,000 lines fit where 16 chunks used to.
func TestShortLinesAreOneItem(t *testing.T) {
	t.Parallel()
	s := NewSink(DefaultQueueBytes)
	p := newProducer(s, 1<<20, ring.Stdout)
	for range 20000 {
		p.push(ring.Stdout, 59)
	}
	items, used := s.Queued()
	if s.Dropped() != (ring.Offsets{}) {
		t.Fatalf("dropped %v of 20,000 short lines", s.Dropped())
	}
	// 1.18 MB in ring blocks that start at 4 KiB and double up to 256 KiB:
	// a dozen blocks, an item each.
	if items > 16 || used != int64(items)*itemCost+20000*59 {
		t.Errorf("%d items using %d bytes for 20,000 lines of 59 bytes", items, used)
	}
	s.Close()
	var l replay
	for more := true; more; {
		var batch []Item
		batch, more, _ = s.Take(nil)
		for _, it := range batch {
			l.apply(s, it)
		}
	}
	if len(l.errs) > 0 || l.received[ring.Stdout] != 20000*59 {
		t.Errorf("received %d bytes: %v", l.received[ring.Stdout], l.errs)
	}
}

// TestTakeWaitsForPushOrClose: Take parks until a pump hands something
// over, and Close wakes it with the end.
func TestTakeWaitsForPushOrClose(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := NewSink(MinQueueBytes)
		p := newProducer(s, 4<<10, ring.Stdout)
		got := make(chan []Item)
		more := make(chan bool)
		go func() {
			for {
				b, m, _ := s.Take(nil)
				for _, it := range b {
					s.Done(it)
				}
				got <- b
				more <- m
				if !m {
					return
				}
			}
		}()
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("Take returned with nothing queued")
		default:
		}
		p.push(ring.Stdout, 1)
		if b := <-got; len(b) != 1 || !<-more {
			t.Fatalf("Take after a push: %d items", len(b))
		}
		synctest.Wait()
		s.Close()
		if b := <-got; len(b) != 0 || <-more {
			t.Fatalf("Take after Close: %d items, want none and the end", len(b))
		}
	})
}

// TestPushProperty drives one sink with random budgets, chunk sizes and
// writer stalls, checking after every push that exactly one of the rules'
// outcomes happened, and the accounting identities at the end.
func TestPushProperty(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		budget := rapid.Int64Range(MinQueueBytes, 8*itemCost+8000).Draw(t, "budget")
		s := NewSink(budget)
		ringCap := rapid.SampledFrom([]int{4 << 10, 16 << 10, 64 << 10}).Draw(t, "ring")
		p := newProducer(s, ringCap, ring.Stdout, ring.Stderr)
		var l replay
		var batch []Item
		for range rapid.IntRange(1, 300).Draw(t, "steps") {
			op := rapid.IntRange(0, 2).Draw(t, "op")
			if op == 2 {
				if n, _ := s.Queued(); n > 0 {
					batch, _, _ = s.Take(batch[:0])
					for _, it := range batch {
						l.apply(s, it)
					}
				}
				continue
			}
			st := ring.Stream(op)
			items0, used0 := s.Queued()
			pending0, dropped0 := s.Pending(st), s.Dropped()
			n := int64(p.push(st, rapid.IntRange(1, 2000).Draw(t, "size")))
			items, used := s.Queued()
			lost := dropped0
			lost[st] += n

			type after struct {
				Items   int
				Used    int64
				Pending int64
				Dropped ring.Offsets
			}
			got := after{items, used, s.Pending(st), s.Dropped()}
			var outcomes []after
			if pending0 > 0 {
				if used0+itemCost > budget { // not even the Drop fits
					outcomes = append(outcomes, after{items0, used0, pending0 + n, lost})
				} else if used0+2*itemCost+n > budget { // the Drop fits, the data not
					outcomes = append(outcomes, after{items0 + 1, used0 + itemCost, n, lost})
				} else {
					outcomes = append(outcomes, after{items0 + 2, used0 + 2*itemCost + n, 0, dropped0})
				}
			} else {
				// Joined to the last item, queued as a new one, or lost for
				// want of room to do what it needed.
				if used0+n <= budget {
					outcomes = append(outcomes, after{items0, used0 + n, 0, dropped0})
				}
				if used0+itemCost+n <= budget {
					outcomes = append(outcomes, after{items0 + 1, used0 + itemCost + n, 0, dropped0})
				}
				if used0+itemCost+n > budget {
					outcomes = append(outcomes, after{items0, used0, n, lost})
				}
			}
			if !slices.Contains(outcomes, got) {
				t.Fatalf("push of %d bytes of %v, budget %d, from %d items using %d: got %+v, want one of %+v",
					n, st, budget, items0, used0, got, outcomes)
			}
			if used > budget {
				t.Fatalf("%d bytes used of a budget of %d", used, budget)
			}
		}
		s.Close()
		for more := true; more; {
			batch, more, _ = s.Take(batch[:0])
			for _, it := range batch {
				l.apply(s, it)
			}
		}
		if len(l.errs) > 0 {
			t.Fatalf("log inconsistent:\n%s", strings.Join(l.errs, "\n"))
		}
		if diff := accountingDiff(s, p.produced, &l); diff != "" {
			t.Fatalf("accounting (-want +got):\n%s", diff)
		}
	})
}
