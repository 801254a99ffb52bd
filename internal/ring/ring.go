// Package ring keeps a process's recent output in a bytes-bounded buffer shared by its
// streams and serves it to any number of cursors, each told exactly which bytes it missed.
package ring

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// DefaultCapacity is the ring size of a process unless configured otherwise.
const DefaultCapacity = 1 << 20

// maxBlock is the largest slab pumps read into. A read never spans two
// blocks, so this is also the largest chunk.
const maxBlock = 256 << 10

// minBlock is a stream's first block: enough for a quiet process.
const minBlock = 4 << 10

// ErrOutOfRange is returned for a cursor asked to start beyond what a stream
// has produced.
var ErrOutOfRange = errors.New("ring: offset beyond the stream's end")

// block is a slab of memory that one stream's pump reads into, front to
// back; each committed read becomes a chunk that is a sub-slice of it. The
// pump writes only past used, and readers only look below it, so the bytes a
// chunk names never change while anyone holds a reference.
//
// refs counts the references: one per retained chunk, one while the block is
// a stream's active block, and one per chunk held outside the ring (by a
// cursor's pending events or by a capture sink). At zero the block returns to
// the ring's free list and may be written again.
type block struct {
	buf  []byte
	used int // written only by the owning pump, under Ring.mu
	refs atomic.Int32
	ring *Ring
}

// release drops a reference from outside the ring's lock.
func (b *block) release() {
	if b.refs.Add(-1) == 0 {
		b.ring.mu.Lock()
		b.ring.recycleLocked(b)
		b.ring.mu.Unlock()
	}
}

// releaseLocked drops a reference while holding the ring's lock.
func (r *Ring) releaseLocked(b *block) {
	if b.refs.Add(-1) == 0 {
		r.recycleLocked(b)
	}
}

// Chunk is one committed read: Data holds bytes [Offset, Offset+len(Data)) of
// Stream. A Chunk obtained from Commit or Retain holds a reference that keeps
// Data intact until Release.
type Chunk struct {
	Stream Stream
	Offset int64
	Seq    uint64
	Data   []byte
	blk    *block
	at     int // where Data starts in blk
}

// Retain takes another reference to the chunk's memory, for a consumer (a
// capture sink) that keeps it past the call that handed it over.
func (c Chunk) Retain() Chunk {
	c.blk.refs.Add(1)
	return c
}

// Extend returns c grown by next when next continues c in the same block
// (the same stream, the next offset, the adjacent bytes), taking over
// next's reference: the caller then holds one reference, to the result.
// Otherwise it returns c unchanged and false.
func (c Chunk) Extend(next Chunk) (Chunk, bool) {
	grown, ok := c.Grow(next)
	if ok {
		next.Release()
	}
	return grown, ok
}

// Grow is Extend without the references: the result covers next's bytes
// too, and each reference the caller holds stays where it was. The result's
// reference, if c had one, is c's: it keeps the whole block alive, so a
// holder of c that drops next's reference may go on using the result.
func (c Chunk) Grow(next Chunk) (Chunk, bool) {
	n := len(c.Data)
	if c.blk == nil || next.blk != c.blk || next.Stream != c.Stream || next.Offset != c.Offset+int64(n) || next.at != c.at+n {
		return c, false
	}
	end := next.at + len(next.Data)
	c.Data = c.blk.buf[c.at:end:end]
	return c, true
}

// Release gives the reference back. Data must not be used afterwards.
func (c Chunk) Release() {
	if c.blk != nil {
		c.blk.release()
	}
}

// Config sizes a ring and names its streams.
type Config struct {
	// Capacity bounds the bytes retained across all streams; the oldest
	// chunks are evicted beyond it. Zero means DefaultCapacity.
	Capacity int
	// Streams are the streams the process has (stdout and stderr, or PTY).
	Streams []Stream
}

// Ring is the bounded, offset-addressed output of one process. Each stream
// has exactly one writer (its pump), which calls Buffer, then Commit, and
// finally CloseStream; any number of cursors read concurrently. Nothing in
// here ever waits for a reader: a reader that falls behind loses the
// evicted bytes and is told how many.
type Ring struct {
	capacity  int
	blockSize int
	minTail   int
	streams   []Stream

	// mu guards every field below. Pumps take it to write; cursors only
	// read, so they share it, and a waiting pump goes before new readers.
	// A stream's active block and its used count are written only by that
	// stream's pump, which may therefore read them without mu.
	mu       sync.RWMutex
	chunks   []chunk // retained chunks in seq order, from head
	head     int
	firstSeq uint64 // seq of chunks[head], or nextSeq when none is retained
	nextSeq  uint64
	retained int
	written  Offsets // bytes committed per stream: the next chunk's offset
	evicted  Offsets // per stream, every byte below this is gone
	closed   [NumStreams]bool
	closeSeq [NumStreams]uint64 // nextSeq when the stream closed
	active   [NumStreams]*block
	grown    [NumStreams]int // size of the stream's next block
	free     []*block
	wake     chan struct{} // closed and replaced when something happens
	waiters  atomic.Int32  // cursors waiting on wake; changed under a read lock
	unwoken  int           // bytes committed since the last wake
	dropped  bool          // Discard was called: nothing is retained any more
}

type chunk struct {
	stream Stream
	offset int64
	seq    uint64
	data   []byte
	blk    *block
}

// New makes an empty ring.
func New(cfg Config) *Ring {
	c := cfg.Capacity
	if c <= 0 {
		c = DefaultCapacity
	}
	bs := min(maxBlock, max(c/4, 4<<10))
	return &Ring{
		capacity:  c,
		blockSize: bs,
		minTail:   min(bs/4, c),
		streams:   append([]Stream(nil), cfg.Streams...),
		wake:      make(chan struct{}),
	}
}

// Capacity is the most bytes the ring retains.
func (r *Ring) Capacity() int { return r.capacity }

// Streams are the streams the ring was made for.
func (r *Ring) Streams() []Stream { return r.streams }

// Buffer returns memory for stream s's pump to read into; the next Commit
// for s publishes a prefix of it. Only s's pump may call it.
func (r *Ring) Buffer(s Stream) []byte {
	b := r.active[s]
	if b != nil && len(b.buf)-b.used >= min(r.minTail, len(b.buf)/4) {
		return b.buf[b.used:min(len(b.buf), b.used+r.capacity)]
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b != nil {
		r.releaseLocked(b) // the active reference; chunks keep it alive
	}
	b = r.newBlock(s)
	r.active[s] = b
	return b.buf[b.used:min(len(b.buf), b.used+r.capacity)]
}

// newBlock returns a block for s holding one (active) reference. A
// stream's first blocks are small and double up to blockSize, so a process
// that prints little holds little. Caller holds mu.
func (r *Ring) newBlock(s Stream) *block {
	size := r.grown[s]
	if size == 0 {
		size = min(minBlock, r.blockSize)
	}
	r.grown[s] = min(2*size, r.blockSize)
	if n := len(r.free); n > 0 && size == r.blockSize {
		b := r.free[n-1]
		r.free = r.free[:n-1]
		b.refs.Store(1)
		return b
	}
	b := &block{buf: make([]byte, size), ring: r}
	b.refs.Store(1)
	return b
}

// recycle keeps a few unreferenced blocks for reuse: touching fresh pages
// costs far more than reusing warm ones.
func (r *Ring) recycleLocked(b *block) {
	b.used = 0
	if len(b.buf) == r.blockSize && !r.dropped && len(r.free)*r.blockSize < r.capacity/2+r.blockSize {
		r.free = append(r.free, b)
	}
}

// Commit publishes the first n bytes of the last Buffer for s as a chunk and
// evicts the oldest chunks beyond capacity. The returned chunk holds a
// reference the caller must Release. Committing zero bytes publishes nothing.
//
// more says the pump expects to commit again at once (its read filled the
// buffer and the pipe may hold more): waiting cursors are then woken only
// once a quarter of the ring has gathered, or by Flush, which the pump
// calls before it blocks. Waking every cursor for every chunk would spend,
// with many cursors, the CPU the workload needs; waking at these points
// adds no delay, since nothing newer exists until the pump reads again.
func (r *Ring) Commit(s Stream, n int, more bool) Chunk {
	if n == 0 {
		return Chunk{Stream: s}
	}
	r.mu.Lock()
	b := r.active[s]
	if b == nil || n < 0 || b.used+n > len(b.buf) || r.closed[s] {
		r.mu.Unlock()
		panic(fmt.Sprintf("ring: commit of %d bytes to %v without a matching Buffer", n, s))
	}
	c := chunk{stream: s, offset: r.written[s], seq: r.nextSeq, data: b.buf[b.used : b.used+n : b.used+n], blk: b}
	b.used += n
	b.refs.Add(2) // one for the ring's copy, one for the caller
	r.written[s] += int64(n)
	r.nextSeq++
	if r.dropped {
		r.evicted[s] = r.written[s]
		r.firstSeq = r.nextSeq
		b.refs.Add(-1) // the active reference still holds it above zero
	} else {
		r.chunks = append(r.chunks, c)
		r.retained += n
		r.evictLocked()
	}
	r.unwoken += n
	if !more || r.unwoken >= r.capacity/4 {
		r.wakeLocked()
	}
	r.mu.Unlock()
	return Chunk{Stream: s, Offset: c.offset, Seq: c.seq, Data: c.data, blk: b, at: b.used - n}
}

func (r *Ring) evictLocked() {
	for r.retained > r.capacity {
		if excess := r.retained - r.capacity; excess < len(r.chunks[r.head].data) {
			// Trim the oldest chunk rather than drop it whole, so the ring
			// keeps exactly its capacity.
			c := &r.chunks[r.head]
			c.data = c.data[excess:]
			c.offset += int64(excess)
			r.retained -= excess
			r.evicted[c.stream] = c.offset
			break
		}
		c := r.chunks[r.head]
		r.chunks[r.head] = chunk{}
		r.head++
		r.retained -= len(c.data)
		r.evicted[c.stream] = c.offset + int64(len(c.data))
		r.firstSeq = c.seq + 1
		r.releaseLocked(c.blk)
	}
	// Compact once the dead prefix dominates, so the slice stays bounded.
	if r.head > 64 && r.head > len(r.chunks)/2 {
		n := copy(r.chunks, r.chunks[r.head:])
		clear(r.chunks[n:])
		r.chunks = r.chunks[:n]
		r.head = 0
	}
	if r.head == len(r.chunks) {
		r.firstSeq = r.nextSeq
	}
}

// Flush wakes the cursors waiting for bytes committed with more set.
func (r *Ring) Flush() {
	r.mu.Lock()
	if r.unwoken > 0 {
		r.wakeLocked()
	}
	r.mu.Unlock()
}

func (r *Ring) wakeLocked() {
	r.unwoken = 0
	if r.waiters.Load() > 0 {
		close(r.wake)
		r.wake = make(chan struct{})
	}
}

// CloseStream marks the end of s: no more commits follow, and every cursor
// is told s's total once it has read past this point. Only s's pump may call
// it, once.
func (r *Ring) CloseStream(s Stream) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed[s] {
		return
	}
	r.closed[s] = true
	r.closeSeq[s] = r.nextSeq
	if b := r.active[s]; b != nil {
		r.active[s] = nil
		r.releaseLocked(b)
	}
	r.wakeLocked()
}

// Discard releases every retained byte, keeping only the per-stream totals,
// as a ring does when its process becomes a tombstone. Cursors opened
// afterwards are told the whole stream as a gap.
func (r *Ring) Discard() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropped = true
	r.retained = 0
	for _, c := range r.chunks[r.head:] {
		r.releaseLocked(c.blk)
	}
	r.chunks, r.head = nil, 0
	r.firstSeq = r.nextSeq
	r.evicted = r.written
	r.free = nil
	r.wakeLocked()
}

// Totals returns how many bytes each stream has produced so far, and which
// streams have ended.
func (r *Ring) Totals() (Offsets, [NumStreams]bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.written, r.closed
}

// First returns, per stream, the offset of the oldest byte still retained
// (the total when nothing of the stream is).
func (r *Ring) First() Offsets {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.evicted
}

// Retained is the number of bytes the ring holds now.
func (r *Ring) Retained() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.retained
}
