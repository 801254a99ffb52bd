// Package ring keeps a process's recent output in a bytes-bounded buffer shared by its
// streams and serves it to any number of cursors, each told exactly which bytes it missed.
package ring

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandkiln/sandkiln/internal/errdefs"
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
var ErrOutOfRange = errdefs.New(errdefs.ErrOutOfRange, "ring: offset beyond the stream's end")

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
// Stream, and Seq is its first byte's place in the process's output: how
// many bytes all its streams had committed before it. A Chunk obtained from
// Commit or Retain holds a reference that keeps Data intact until Release.
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
// finally CloseStream; any number of cursors read concurrently. Unless a
// holding cursor asks it to (see Cursor.Hold), nothing in here ever waits
// for a reader: a reader that falls behind loses the evicted bytes and is
// told how many.
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
	chunks   []chunk // retained chunks in index order, from head
	head     int
	firstIdx uint64 // index of chunks[head], or nextIdx when none is retained
	nextIdx  uint64 // chunks are numbered densely in commit order
	retained int
	total    uint64  // bytes committed on all streams: the next chunk's seq
	written  Offsets // bytes committed per stream: the next chunk's offset
	evicted  Offsets // per stream, every byte below this is gone
	closed   [NumStreams]bool
	closeIdx [NumStreams]uint64 // nextIdx when the stream closed
	active   [NumStreams]*block
	grown    [NumStreams]int // size of the stream's next block
	free     []*block
	wake     chan struct{} // closed and replaced when something happens
	waiters  atomic.Int32  // cursors waiting on wake; changed under a read lock
	unwoken  int           // bytes committed since the last wake
	dropped  bool          // Discard was called: nothing is retained any more

	// The holds: while any is in place, no byte at or past its offset in
	// its stream is evicted, and a pump whose next read would need the
	// room waits (see Buffer). holding counts them, so that a ring without
	// holds never takes the lock for that; roomWaiters counts the pumps
	// measuring room or waiting for it, which room wakes, closed and
	// replaced, when a hold moves or goes, and waiting those that wait.
	// A pump counts itself before it measures, and a holder that moves
	// on stores where it is before it reads the count: so either the pump
	// measures the move, or the holder sees the count and wakes it (taking
	// mu, so after the pump took the room channel it waits on). Every chunk before index keptFrom is known to be evictable
	// under the holds as they are (they only move on, but for a hold
	// added, which resets it): finding the held bytes costs a scan only of
	// what was taken since.
	holds       []*hold
	holdsTaken  uint64 // holding cursors so far: the next one's hold.n
	holding     atomic.Int32
	unheld      bool // Unhold was called: no hold is taken any more
	room        chan struct{}
	roomWaiters atomic.Int32
	waiting     atomic.Int32
	keptFrom    uint64
}

type chunk struct {
	stream Stream
	offset int64
	idx    uint64
	seq    uint64
	data   []byte
	blk    *block
}

// hold keeps the ring from evicting what a reader has not had yet: per
// stream, every byte from its offset on. A cursor's hold moves with what
// its reader has had; one its cursor left on closing (or the one a ring is
// made with, before any cursor) stays where it is until its deadline.
type hold struct {
	cur   *Cursor
	at    Offsets
	until time.Time
	// n orders the holding cursors by when they took their holds: a
	// cursor's hold left behind for its reader to come back to is of no
	// use once a later holding cursor is there (its reader came back
	// before it was seen to go).
	n uint64
}

// from is where the hold keeps each stream from.
func (h *hold) from() Offsets {
	if h.cur != nil {
		return h.cur.kept()
	}
	return h.at
}

// heldFromLocked is, per stream, the lowest offset a hold keeps; beyond
// every offset without holds. Caller holds mu.
func (r *Ring) heldFromLocked() Offsets {
	o := Offsets{math.MaxInt64, math.MaxInt64, math.MaxInt64}
	for _, h := range r.holds {
		f := h.from()
		for s := range o {
			o[s] = min(o[s], f[s])
		}
	}
	return o
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
		room:      make(chan struct{}),
	}
}

// Capacity is the most bytes the ring retains.
func (r *Ring) Capacity() int { return r.capacity }

// Streams are the streams the ring was made for.
func (r *Ring) Streams() []Stream { return r.streams }

// Buffer returns memory for stream s's pump to read into; the next Commit
// for s publishes a prefix of it. Only s's pump may call it.
//
// While a hold is in place, the buffer is no larger than the room the ring
// has without evicting held bytes, and when that room is less than a
// quarter of the ring, Buffer waits for a holder to take more (or for the
// holds to go): the pump then does not read, and the kernel pipe holds the
// process back. The room is the ring's as Buffer finds it: another
// stream's pump may be reading into room it was given meanwhile (and a
// pump may have been given its buffer before the hold was put in place),
// so with holds the ring retains its capacity and, at most, one read of
// each other stream beyond it, never evicting a held byte to keep to it.
func (r *Ring) Buffer(s Stream) []byte {
	b := r.active[s]
	if r.holding.Load() == 0 && b != nil && len(b.buf)-b.used >= min(r.minTail, len(b.buf)/4) {
		return b.buf[b.used:min(len(b.buf), b.used+r.capacity)]
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.awaitRoomLocked()
	if b == nil || len(b.buf)-b.used < min(r.minTail, len(b.buf)/4) {
		if b != nil {
			r.releaseLocked(b) // the active reference; chunks keep it alive
		}
		b = r.newBlock(s)
		r.active[s] = b
	}
	return b.buf[b.used:min(len(b.buf), b.used+room)]
}

// awaitRoomLocked returns how many bytes may be committed without evicting
// held ones, waiting first while that is less than a quarter of the ring.
// Before it waits it wakes the cursors for what was committed unannounced,
// so that no holder waits for bytes that are there. A holder whose hold
// does not move for twice its grace period while the pump waits on it is
// taken for gone: its hold goes (see dropStalledLocked). Caller holds mu,
// which is released while it waits.
func (r *Ring) awaitRoomLocked() int {
	r.roomWaiters.Add(1)
	defer r.roomWaiters.Add(-1)
	for {
		room, until := r.roomLocked()
		if room >= max(1, r.capacity/4) {
			return room
		}
		if r.unwoken > 0 {
			r.wakeLocked()
		}
		stalled, snapshot := r.stallDeadlineLocked()
		if until.IsZero() || !stalled.IsZero() && stalled.Before(until) {
			until = stalled
		}
		wait := r.room
		r.waiting.Add(1)
		r.mu.Unlock()
		var expired <-chan time.Time
		var t *time.Timer
		if !until.IsZero() {
			t = time.NewTimer(time.Until(until))
			expired = t.C
		}
		timedOut := false
		select {
		case <-wait:
		case <-expired:
			timedOut = true
		}
		if t != nil {
			t.Stop()
		}
		r.waiting.Add(-1)
		r.mu.Lock()
		if timedOut && !stalled.IsZero() && !time.Now().Before(stalled) {
			r.dropStalledLocked(snapshot)
		}
	}
}

// stallDeadlineLocked is when a wait for room that nothing ends makes the
// cursors' holds stalled: the soonest of twice their graces from now; and
// where each stands now. Zero without cursors' holds.
//
// Twice: a reader that pauses (a pager, a terminal scrolled back) stops
// taking what its connection carries, and the server's write timeout
// (as long as the grace, by default) closes that connection first; the
// hold then stays for the grace for the reader to come back to, as for
// any reader that went. This catches the holders no timeout ends: one that
// takes bytes and never acks them, one that stops calling Next. Caller
// holds mu.
func (r *Ring) stallDeadlineLocked() (time.Time, map[*hold]Offsets) {
	var deadline time.Time
	var at map[*hold]Offsets
	for _, h := range r.holds {
		if h.cur == nil {
			continue
		}
		if at == nil {
			at = map[*hold]Offsets{}
		}
		at[h] = h.from()
		if d := time.Now().Add(2 * h.cur.grace); deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	}
	return deadline, at
}

// dropStalledLocked drops, of the cursors' holds that have not moved from
// where snapshot saw them, those that keep the pumps from room: the one
// keeping the most first, until there is room or none is left. A reader
// that moves its hold on neither by taking nor by acking cannot hang the
// workload: it is told of what it then misses, as a reader that
// does not hold is. The cursor keeps its entry (its goroutine reads it
// without mu); out of the holds, its moves and its Close change nothing.
// Caller holds mu.
func (r *Ring) dropStalledLocked(snapshot map[*hold]Offsets) {
	for {
		if room, _ := r.roomLocked(); room >= max(1, r.capacity/4) {
			return
		}
		var worst *hold
		most := -1
		for _, h := range r.holds {
			if at, ok := snapshot[h]; ok && h.cur != nil && h.from() == at {
				if n := r.heldByLocked(h); n > most {
					worst, most = h, n
				}
			}
		}
		if worst == nil {
			return
		}
		r.holds = slices.DeleteFunc(r.holds, func(h *hold) bool { return h == worst })
		r.holding.Store(int32(len(r.holds)))
	}
}

// heldByLocked is how many retained bytes h alone keeps. Caller holds mu.
func (r *Ring) heldByLocked(h *hold) int {
	from := h.from()
	for i := r.firstIdx; i < r.nextIdx; i++ {
		c := r.chunks[r.head+int(i-r.firstIdx)]
		if c.offset+int64(len(c.data)) > from[c.stream] {
			return int(r.total-c.seq) - int(max(0, from[c.stream]-c.offset))
		}
	}
	return 0
}

// roomLocked is how many bytes may be committed without evicting a byte a
// hold keeps, and the earliest deadline of a hold left by a cursor, zero
// if none. Holds past their deadline go. Caller holds mu.
func (r *Ring) roomLocked() (int, time.Time) {
	if len(r.holds) == 0 {
		return r.capacity, time.Time{}
	}
	now := time.Now()
	var until time.Time
	live := r.holds[:0]
	for _, h := range r.holds {
		if h.cur == nil && !now.Before(h.until) {
			continue
		}
		live = append(live, h)
		if h.cur == nil && (until.IsZero() || h.until.Before(until)) {
			until = h.until
		}
	}
	clear(r.holds[len(live):])
	r.holds = live
	r.holding.Store(int32(len(live)))
	if len(live) == 0 {
		return r.capacity, time.Time{}
	}
	// Eviction goes in index order: the bytes held are those from the
	// first chunk that is not wholly evictable on, less the part of it
	// that is; seq, which counts every stream's bytes, measures them.
	from := r.heldFromLocked()
	i := max(r.keptFrom, r.firstIdx)
	for ; i < r.nextIdx; i++ {
		c := r.chunks[r.head+int(i-r.firstIdx)]
		if c.offset+int64(len(c.data)) > from[c.stream] {
			break
		}
	}
	r.keptFrom = i
	held := 0
	if i < r.nextIdx {
		c := r.chunks[r.head+int(i-r.firstIdx)]
		held = int(r.total-c.seq) - int(max(0, from[c.stream]-c.offset))
	}
	return max(0, r.capacity-held), until
}

// addHoldLocked puts h among the holds. It may keep what the others did
// not: the evictable prefix is found anew. Caller holds mu.
func (r *Ring) addHoldLocked(h *hold) {
	r.holds = append(r.holds, h)
	r.holding.Store(int32(len(r.holds)))
	r.keptFrom = 0
}

// Hold makes the ring keep everything committed from now on for up to
// grace, until a holding cursor takes over (see Cursor.Hold): output a
// reader is about to ask to hold is not lost before it arrives.
func (r *Ring) Hold(grace time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unheld || r.dropped {
		return
	}
	r.addHoldLocked(&hold{at: r.written, until: time.Now().Add(grace)})
}

// Release drops the holds no cursor holds: the one a ring is made with,
// for its first reader (Hold), and those holding cursors left for their
// readers to come back to. A holding cursor keeps its hold, and a cursor
// may take a hold later.
func (r *Ring) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	kept := r.holds[:0]
	for _, h := range r.holds {
		if h.cur != nil {
			kept = append(kept, h)
		}
	}
	clear(r.holds[len(kept):])
	r.holds = kept
	r.holding.Store(int32(len(kept)))
	r.wakePumpsLocked()
}

// Unhold drops every hold, now and for good: the ring drops its oldest
// bytes again, and a pump waiting for room goes on. A process being shut
// down does this, so that its drain cannot wait on a reader.
func (r *Ring) Unhold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unheld = true
	clear(r.holds)
	r.holds = r.holds[:0]
	r.holding.Store(0)
	r.wakePumpsLocked()
}

// wakePumpsLocked wakes the pumps waiting for room. Caller holds mu,
// under which a pump that waits counts itself: none counted, none waits.
func (r *Ring) wakePumpsLocked() {
	if r.waiting.Load() == 0 {
		return
	}
	close(r.room)
	r.room = make(chan struct{})
}

// Held reports whether a pump waits for a holder to take what the ring
// holds: the process is being held back.
func (r *Ring) Held() bool { return r.waiting.Load() > 0 }

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
	c := chunk{stream: s, offset: r.written[s], idx: r.nextIdx, seq: r.total, data: b.buf[b.used : b.used+n : b.used+n], blk: b}
	b.used += n
	b.refs.Add(2) // one for the ring's copy, one for the caller
	r.written[s] += int64(n)
	r.total += uint64(n)
	r.nextIdx++
	if r.dropped {
		r.evicted[s] = r.written[s]
		r.firstIdx = r.nextIdx
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
	held := r.heldFromLocked()
	for r.retained > r.capacity && r.head < len(r.chunks) {
		c := &r.chunks[r.head]
		// What of the oldest chunk is not held may go.
		free := int(min(int64(len(c.data)), max(0, held[c.stream]-c.offset)))
		if excess := r.retained - r.capacity; excess < len(c.data) || free < len(c.data) {
			// Trim the oldest chunk rather than drop it whole, so the ring
			// keeps exactly its capacity, or what is held of it. Its seq
			// moves with its start.
			n := min(excess, free)
			c.data = c.data[n:]
			c.offset += int64(n)
			c.seq += uint64(n)
			r.retained -= n
			r.evicted[c.stream] = c.offset
			break
		}
		gone := *c
		*c = chunk{}
		r.head++
		r.retained -= len(gone.data)
		r.evicted[gone.stream] = gone.offset + int64(len(gone.data))
		r.firstIdx = gone.idx + 1
		r.releaseLocked(gone.blk)
	}
	// Compact once the dead prefix dominates, so the slice stays bounded.
	if r.head > 64 && r.head > len(r.chunks)/2 {
		n := copy(r.chunks, r.chunks[r.head:])
		clear(r.chunks[n:])
		r.chunks = r.chunks[:n]
		r.head = 0
	}
	if r.head == len(r.chunks) {
		r.firstIdx = r.nextIdx
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
	r.closeIdx[s] = r.nextIdx
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
	r.firstIdx = r.nextIdx
	r.evicted = r.written
	clear(r.holds)
	r.holds = r.holds[:0]
	r.holding.Store(0)
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
