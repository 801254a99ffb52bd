package capture

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// ItemKind tells what an Item carries.
type ItemKind uint8

const (
	// Data carries committed bytes of a stream.
	Data ItemKind = iota + 1
	// Drop says Dropped bytes of Stream were lost right before the stream's
	// next Data item.
	Drop
	// Cut marks where every stream stood when the writer was held
	// (Writer.Hold): it says what was lost before it and not yet said
	// (Lost), and the whole run's loss then (Dropped, per stream).
	Cut
)

func (k ItemKind) String() string {
	switch k {
	case Data:
		return "data"
	case Drop:
		return "drop"
	case Cut:
		return "cut"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Item is one entry on its way to the log writer.
//
// Per stream, the items describe the output without holes: a Data item
// starts where the stream's previous Data item ended plus every Dropped in
// between. The writer never sees data after a loss it was not told about.
type Item struct {
	Kind   ItemKind
	Stream ring.Stream
	// Chunk is a Data item's bytes; its Offset says where they belong. It
	// holds a reference of its own, taken for the item, which Done gives
	// back: the ring never reuses that memory before.
	Chunk ring.Chunk
	// Dropped is a Drop item's count of lost bytes.
	Dropped int64
	// At is when a Data item's first bytes were handed over, in Unix
	// nanoseconds: the time its records carry.
	At int64
	// A Cut item's: per stream, where the stream stood, the bytes lost
	// before that which no Drop item has said, and every byte lost in the
	// run so far.
	Offsets, Lost, RunDropped ring.Offsets

	cost int64 // what the item takes of the budget, given back by Done
	hold *hold // a Cut item's: how the run goes on from it
}

// itemCost is what every queued item costs the budget beside its bytes: an
// Item and its slot in the queue, so that a budget bounds the memory the
// queue holds however small its chunks are.
const itemCost = 128

// MinQueueBytes is the smallest budget a sink takes: one item of a byte.
// With so little, a stream that has lost data can only ever queue its Drop
// item, since the Drop takes the room its next chunk needs (the seed's
// capacity-one case); a writer that is to resume receiving data after a
// loss needs room for two items and the chunk.
const MinQueueBytes = itemCost + 1

// Sink hands the chunks a process's pumps commit to one log-writer
// goroutine without ever making a pump wait. It queues up to a budget of
// bytes; a chunk that does not fit is counted as lost instead, and the
// writer is told how many bytes it missed before the stream's next data. A
// chunk that continues the last queued one (the same stream, the next
// bytes of the same ring block) joins it, so output written a line at a
// time costs the queue one item, not one per line. The budget is a
// ceiling, not an allocation: an idle sink holds nothing.
//
// Ownership and order:
//   - Each stream has exactly one pump, and only that pump calls Push with
//     the stream's chunks. The pumps of different streams call Push
//     concurrently.
//   - The consumer (the log writer) calls Take, which waits for items and
//     returns all that are queued, and Done for each item once it is
//     through with it, until Take reports the end.
//   - Close is called once every pump has returned (joined), by whoever owns
//     the pumps. Push after Close panics.
//   - The consumer reads the final loss per stream from Dropped after Take
//     reported the end. The final totals never travel through the queue:
//     it can be full exactly when they would be sent.
type Sink struct {
	budget int64

	// used is what the queued items, and those taken but not yet Done,
	// cost. Pumps add to it under mu; the consumer takes away without.
	used atomic.Int64

	// mu guards the fields below it. A pump holds it only to append to
	// the queue; Take holds it only to swap the queue out.
	mu      sync.Mutex
	queue   []Item
	waiting bool // the consumer is parked in Take, waiting for wake
	ended   bool // Close was called
	// pushes counts the calls to Push; taken is what it was at the last
	// Take, and written what it was at the Take before the consumer's last
	// Written: every push up to written is in the log or counted lost.
	pushes, taken, written uint64
	// flushWanted counts the calls to Caught, which want a copy of the
	// unfinished lines the consumer holds too; flushTaken is what it was
	// at the last Take, flushed at the Take before the last Written.
	flushWanted, flushTaken, flushed uint64
	// progress is closed and replaced on every Written.
	progress chan struct{}

	// pending[s] counts the bytes of s lost since the last Drop item of s
	// was enqueued. Only s's pump writes it, and Mark, under mu.
	pending [ring.NumStreams]int64
	// next[s] is where the next chunk of s starts: every byte of s pushed
	// so far, queued or lost. Written under mu.
	next ring.Offsets

	// total[s] counts every byte of s lost in the whole run. It only grows,
	// and only s's pump adds to it; it is atomic so that anyone may read it
	// at any time, and the writer reads the final value after the end.
	total [ring.NumStreams]atomic.Int64

	// wake carries one token to a consumer parked in Take.
	wake chan struct{}
	// closing is closed by Close: a consumer that is not taking (a writer
	// waiting out a failed disk) learns of the end from it.
	closing chan struct{}
	// closed turns a Push after Close into a clear panic.
	closed atomic.Bool
}

// NewSink makes a sink that queues up to budget bytes (each item costing
// itemCost on top of its bytes); budget must be at least MinQueueBytes.
func NewSink(budget int64) *Sink {
	if budget < MinQueueBytes {
		panic(fmt.Sprintf("capture: sink budget %d bytes, want at least %d", budget, MinQueueBytes))
	}
	return &Sink{budget: budget, wake: make(chan struct{}, 1), closing: make(chan struct{})}
}

// Push offers a committed chunk to the writer, or counts it as lost; it
// never waits for the writer. Only the pump of c.Stream may call it, and
// never after Close.
//
// Push takes its own reference to c for what it queues; the caller's
// reference stays the caller's, to Release after Push returns. An empty
// chunk (a zero-byte Commit) is ignored.
func (s *Sink) Push(c ring.Chunk) {
	if s.closed.Load() {
		panic(fmt.Sprintf("capture: Push of %d bytes of %v after Close; close the sink only after every pump has returned", len(c.Data), c.Stream))
	}
	if len(c.Data) == 0 {
		return
	}
	st := c.Stream
	n := int64(len(c.Data))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pushes++
	s.next[st] += n
	// Describe earlier losses first. If that does not fit, this chunk cannot
	// be queued either: it would reach the writer after a loss it was never
	// told about.
	if p := s.pending[st]; p > 0 {
		if !s.fits(itemCost) {
			s.recordDrop(st, n)
			return
		}
		s.enqueue(Item{Kind: Drop, Stream: st, Dropped: p, cost: itemCost})
		s.pending[st] = 0
	}
	if k := len(s.queue); k > 0 && s.queue[k-1].Kind == Data {
		if grown, ok := s.queue[k-1].Chunk.Grow(c); ok {
			if !s.fits(n) {
				s.recordDrop(st, n)
				return
			}
			// The queued item's reference already holds the block.
			s.queue[k-1].Chunk = grown
			s.queue[k-1].cost += n
			s.used.Add(n)
			return
		}
	}
	if !s.fits(n + itemCost) {
		s.recordDrop(st, n)
		return
	}
	s.enqueue(Item{Kind: Data, Stream: st, Chunk: c.Retain(), At: time.Now().UnixNano(), cost: n + itemCost})
}

// mark queues a Cut item for h at where every stream stands now, and
// returns that: the chunks pushed before it reach the writer before it,
// and the loss they left unsaid goes with it. It takes nothing of the
// budget (there is one at a time), so it is never lost. It reports false,
// queuing nothing, once the sink is closed: every chunk is pushed.
func (s *Sink) mark(h *hold) (ring.Offsets, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return s.next, false
	}
	it := Item{Kind: Cut, Offsets: s.next, Lost: s.pending, hold: h}
	for i := range s.total {
		it.RunDropped[i] = s.total[i].Load()
	}
	s.pending = [ring.NumStreams]int64{}
	s.enqueue(it)
	return s.next, true
}

// fits reports whether cost more bytes fit the budget. Caller holds mu.
func (s *Sink) fits(cost int64) bool { return s.used.Load()+cost <= s.budget }

// enqueue appends it and wakes a parked consumer. Caller holds mu.
func (s *Sink) enqueue(it Item) {
	s.queue = append(s.queue, it)
	s.used.Add(it.cost)
	s.signal()
}

// signal hands the parked consumer its token. Caller holds mu.
func (s *Sink) signal() {
	if s.waiting {
		s.waiting = false
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// recordDrop counts n bytes of st as lost. Only st's pump calls it.
func (s *Sink) recordDrop(st ring.Stream, n int64) {
	s.pending[st] += n
	s.total[st].Add(n)
}

// Take waits until items are queued, the sink is closed, or a reader waits
// in Caught, and appends every queued item to dst, oldest first. more is
// false once the sink is closed and these are the last items: nothing
// follows. flush says a reader waits for a copy of what the consumer holds
// of unfinished lines too. The consumer calls Done for each
// item it got, and Written once they are written.
func (s *Sink) Take(dst []Item) (items []Item, more, flush bool) {
	s.mu.Lock()
	for len(s.queue) == 0 && !s.ended && s.flushWanted == s.flushTaken {
		s.waiting = true
		s.mu.Unlock()
		<-s.wake
		s.mu.Lock()
	}
	s.waiting = false
	s.taken = s.pushes
	flush = s.flushWanted != s.flushTaken
	s.flushTaken = s.flushWanted
	dst = append(dst, s.queue...)
	clear(s.queue)
	if cap(s.queue) > 1024 {
		s.queue = nil // a burst's slice is not kept for a quiet process
	} else {
		s.queue = s.queue[:0]
	}
	more = !s.ended
	s.mu.Unlock()
	return dst, more, flush
}

// Written is called by the consumer once what it took last is in the log,
// or counted lost (and, when Take said to flush, what it holds of
// unfinished lines is copied for the readers).
func (s *Sink) Written() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written, s.flushed = s.taken, s.flushTaken
	if s.progress != nil {
		close(s.progress)
		s.progress = nil
	}
}

// Caught waits until every chunk pushed before the call is in the log (or
// counted lost), unfinished lines copied, or until done is closed (the
// consumer ended) or ctx ends.
func (s *Sink) Caught(ctx context.Context, done <-chan struct{}) error {
	s.mu.Lock()
	target := s.pushes
	s.flushWanted++
	want := s.flushWanted
	s.signal()
	for s.written < target || s.flushed < want {
		if s.progress == nil {
			s.progress = make(chan struct{})
		}
		progress := s.progress
		s.mu.Unlock()
		select {
		case <-progress:
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	return nil
}

// Done gives back what a taken item holds: its place in the budget and its
// chunk's reference. Its Chunk.Data must not be used afterwards.
func (s *Sink) Done(it Item) {
	if it.Kind == Data {
		it.Chunk.Release()
	}
	s.used.Add(-it.cost)
}

// Queued reports how many items and bytes of budget are taken now: queued,
// or taken and not yet Done.
func (s *Sink) Queued() (items int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue), s.used.Load()
}

// Budget is how many bytes the sink queues at most.
func (s *Sink) Budget() int64 { return s.budget }

// Close ends the sink: the consumer takes what is still queued, with the
// end reported. Call it once every pump has returned. Closing again does
// nothing.
func (s *Sink) Close() {
	if s.closed.Swap(true) {
		return
	}
	close(s.closing)
	s.mu.Lock()
	s.ended = true
	s.signal()
	s.mu.Unlock()
}

// Closing is closed once Close has been called.
func (s *Sink) Closing() <-chan struct{} { return s.closing }

// Dropped returns, per stream, every byte lost so far in the run, whether or
// not a Drop item has described it yet. Safe to call at any time; after the
// pumps have returned it is final.
func (s *Sink) Dropped() ring.Offsets {
	var d ring.Offsets
	for i := range s.total {
		d[i] = s.total[i].Load()
	}
	return d
}

// Pending returns the bytes of st lost and not yet described by a Drop item.
// Only st's pump may call it, or anyone once the pumps have returned.
func (s *Sink) Pending(st ring.Stream) int64 { return s.pending[st] }
