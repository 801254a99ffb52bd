package capture

import (
	"fmt"
	"sync/atomic"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// ItemKind tells what an Item carries.
type ItemKind uint8

const (
	// Data carries one committed chunk of a stream.
	Data ItemKind = iota + 1
	// Drop says Dropped bytes of Stream were lost right before the stream's
	// next Data item.
	Drop
)

func (k ItemKind) String() string {
	switch k {
	case Data:
		return "data"
	case Drop:
		return "drop"
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
	// holds a reference of its own, taken for the item: the consumer must
	// call Chunk.Release for every Data item it receives, once it is done
	// with Chunk.Data, or the ring never reuses that memory.
	Chunk ring.Chunk
	// Dropped is a Drop item's count of lost bytes.
	Dropped int64
}

// Sink hands the chunks a process's pumps commit to one log-writer
// goroutine through a bounded channel, without ever making a pump wait:
// when the channel is full the chunk is counted as lost instead, and the
// writer is told how many bytes it missed before the stream's next data.
//
// Ownership and order:
//   - Each stream has exactly one pump, and only that pump calls Push with
//     the stream's chunks. The pumps of different streams call Push
//     concurrently.
//   - The consumer (the log writer) receives from Items until it is closed.
//   - Close is called once every pump has returned (joined), by whoever owns
//     the pumps. Push after Close panics.
//   - The consumer reads the final loss per stream from Dropped after Items
//     is closed. The final totals never travel through the channel: the
//     channel can be full exactly when they would be sent.
type Sink struct {
	items chan Item
	// closing is closed by Close, before items: a consumer that is not
	// receiving (a writer waiting out a failed disk) learns of the end
	// from it.
	closing chan struct{}

	// pending[s] counts the bytes of s lost since the last Drop item of s
	// was enqueued. Only s's pump reads or writes it, so it needs no lock;
	// a second goroutine pushing s would be a data race the race detector
	// reports.
	pending [ring.NumStreams]int64

	// total[s] counts every byte of s lost in the whole run. It only grows,
	// and only s's pump adds to it; it is atomic so that anyone may read it
	// at any time, and the writer reads the final value after Close.
	total [ring.NumStreams]atomic.Int64

	// closed is set by Close. It turns a Push after Close into a clear
	// panic rather than a send on a closed channel.
	closed atomic.Bool
}

// NewSink makes a sink whose channel holds capacity items. Capacity must be
// at least 1. With capacity 1, a stream that has lost data can only ever
// enqueue its Drop item, because that item fills the slot its next chunk
// needs; use at least 2 for the writer to resume receiving data after a loss.
func NewSink(capacity int) *Sink {
	if capacity < 1 {
		panic(fmt.Sprintf("capture: sink capacity %d, want at least 1", capacity))
	}
	return &Sink{items: make(chan Item, capacity), closing: make(chan struct{})}
}

// Items is the channel the log writer receives from. It is closed by Close,
// after the last item.
func (s *Sink) Items() <-chan Item { return s.items }

// Push offers a committed chunk to the writer, or counts it as lost; it
// never waits. Only the pump of c.Stream may call it, and never after Close.
//
// Push takes its own reference to c for the item it enqueues; the caller's
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
	// Describe earlier losses first. If that does not fit, this chunk cannot
	// be sent either: it would reach the writer after a loss it was never
	// told about.
	if p := s.pending[st]; p > 0 {
		select {
		case s.items <- Item{Kind: Drop, Stream: st, Dropped: p}:
			s.pending[st] = 0
		default:
			s.recordDrop(st, n)
			return
		}
	}
	it := Item{Kind: Data, Stream: st, Chunk: c.Retain()}
	select {
	case s.items <- it:
	default:
		// The caller's reference keeps the block alive, so this cannot
		// recycle memory still in use.
		it.Chunk.Release()
		s.recordDrop(st, n)
	}
}

// recordDrop counts n bytes of st as lost. Only st's pump calls it.
func (s *Sink) recordDrop(st ring.Stream, n int64) {
	s.pending[st] += n
	s.total[st].Add(n)
}

// Close ends the channel: the writer receives what is still queued, then
// sees Items closed. Call it once every pump has returned; it is the only
// place the channel is closed. Closing again does nothing.
func (s *Sink) Close() {
	if s.closed.Swap(true) {
		return
	}
	close(s.closing)
	close(s.items)
}

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
