package ring

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"
)

// batchSize bounds how many events a cursor takes per visit to the ring, so
// one lock acquisition serves many events without starving the pumps.
const batchSize = 64

// Cursor reads a ring from chosen per-stream offsets: the retained bytes
// first, then new bytes as they are committed, as one sequence ordered by
// seq. Bytes evicted before the cursor reached them are reported as Gap
// events with exact counts; each stream finishes with an End event carrying
// its total. A Cursor belongs to one goroutine.
type Cursor struct {
	r        *Ring
	pos      uint64  // next seq to look at
	expected Offsets // next byte wanted per stream
	ended    [NumStreams]bool
	wanted   [NumStreams]bool
	left     int // streams not yet ended

	batch  []Event  // taken from the ring; batch[next:] not yet returned
	blocks []*block // the reference behind each Data event in batch
	next   int
	held   *block // reference behind the event last returned

	// A holding cursor's: delivered is, per stream, where what it has
	// returned ends; acked, where its reader says it has got to (see Ack),
	// once acking is set. The ring keeps every byte from the lower of the
	// two on. holder is its entry among the ring's holds. They are atomic:
	// a reader's acks come from another goroutine, and the pumps read them.
	delivered [NumStreams]atomic.Int64
	acked     [NumStreams]atomic.Int64
	acking    atomic.Bool
	holder    *hold
	grace     time.Duration
}

// kept is where a holding cursor's hold keeps each stream from.
func (c *Cursor) kept() Offsets {
	var o Offsets
	acking := c.acking.Load()
	for s := range o {
		o[s] = c.delivered[s].Load()
		if acking {
			o[s] = min(o[s], c.acked[s].Load())
		}
	}
	return o
}

// Cursor opens a cursor at the given offsets (the zero value is "from the
// beginning"). An offset beyond what its stream has produced is refused with
// ErrOutOfRange: a client cannot have seen those bytes.
func (r *Ring) Cursor(from Offsets) (*Cursor, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c := &Cursor{r: r, expected: from, batch: make([]Event, 0, batchSize), blocks: make([]*block, 0, batchSize)}
	for s, off := range from {
		if off < 0 || off > r.written[s] {
			return nil, fmt.Errorf("%w: %v offset %d, produced %d", ErrOutOfRange, Stream(s), off, r.written[s])
		}
	}
	for _, s := range r.streams {
		if !c.wanted[s] {
			c.wanted[s] = true
			c.left++
		}
	}
	return c, nil
}

// Pending is how many events the cursor has taken from the ring and not yet
// returned: Next returns that many without waiting.
func (c *Cursor) Pending() int { return len(c.batch) - c.next }

// Position returns the offsets the cursor has delivered up to: the offsets
// a client that has consumed every event so far would resume from.
func (c *Cursor) Position() Offsets {
	var p Offsets
	copy(p[:], c.expected[:])
	// Events taken but not yet returned are not delivered.
	for _, e := range c.batch[c.next:] {
		switch e.Kind {
		case Data, Gap:
			p[e.Stream] = min(p[e.Stream], e.Offset)
		}
	}
	return p
}

// Peek returns the event Next returns next when Next would not wait for
// it, without taking it: its Data stays valid until Next has returned it
// and is called again.
func (c *Cursor) Peek() (Event, bool) {
	if c.next == len(c.batch) {
		return Event{}, false
	}
	return c.batch[c.next], true
}

// Next returns the next event, waiting for one while the streams are open.
// It returns io.EOF once every stream has ended, and ctx's error if ctx ends
// first. The Data of the previous event is invalid once Next is called.
func (c *Cursor) Next(ctx context.Context) (Event, error) {
	c.drop()
	for c.next == len(c.batch) {
		if c.left == 0 {
			return Event{}, io.EOF
		}
		if err := c.fill(ctx); err != nil {
			return Event{}, err
		}
	}
	e := c.batch[c.next]
	c.held = c.blocks[c.next]
	c.batch[c.next], c.blocks[c.next] = Event{}, nil
	c.next++
	if c.holder != nil {
		switch e.Kind {
		case Data:
			c.deliver(e.Stream, e.Offset+int64(len(e.Data)))
		case Gap:
			c.deliver(e.Stream, e.To)
		}
	}
	return e, nil
}

// deliver moves where a holding cursor has delivered s to on, to end,
// waking the pumps that wait for room.
func (c *Cursor) deliver(s Stream, end int64) {
	c.delivered[s].Store(end)
	if !c.acking.Load() {
		c.wakePumps()
	}
}

// Ack tells a holding cursor where its reader has got to, per stream
// (beyond what was delivered counts as what was). From the first ack on,
// the hold keeps what was delivered past the acked offsets too: a reader
// whose connection breaks with bytes in flight, and which comes back from
// the offsets it had, finds them still there. Safe to call from another
// goroutine than Next's.
func (c *Cursor) Ack(at Offsets) {
	if c.holder == nil {
		return
	}
	for s := range at {
		v := min(at[s], c.delivered[s].Load())
		for old := c.acked[s].Load(); v > old && !c.acked[s].CompareAndSwap(old, v); old = c.acked[s].Load() {
		}
	}
	if !c.acking.Swap(true) {
		// The hold moves back, from what was delivered to what is acked:
		// the ring's account of what is held is taken anew.
		c.r.mu.Lock()
		c.r.keptFrom = 0
		c.r.mu.Unlock()
	}
	c.wakePumps()
}

func (c *Cursor) wakePumps() {
	if c.r.roomWaiters.Load() > 0 {
		c.r.mu.Lock()
		c.r.wakePumpsLocked()
		c.r.mu.Unlock()
	}
}

// Hold makes c a holding cursor: the ring keeps what c has not returned
// yet, and when that fills it, the pumps wait for c (see Ring.Buffer)
// instead of evicting. Holds the ring had without a cursor (Ring.Hold, or
// left by a holding cursor that closed) are taken over by c. When c is
// closed before every stream ended, the ring keeps what c had not returned
// for grace longer, for a reader that comes back to it; then it drops its
// oldest bytes again. With acked, c's reader will Ack what it has got:
// the hold keeps what was delivered and not acked from the start. Hold
// reports false when the ring takes no holds (it was unheld, or
// discarded).
func (c *Cursor) Hold(grace time.Duration, acked bool) bool {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unheld || r.dropped {
		return false
	}
	if c.holder != nil {
		return true
	}
	kept := r.holds[:0]
	for _, h := range r.holds {
		if h.cur != nil {
			kept = append(kept, h)
		}
	}
	clear(r.holds[len(kept):])
	r.holds = kept
	// What lies below where c starts, its reader has had.
	for s, o := range c.expected {
		c.delivered[s].Store(o)
		c.acked[s].Store(o)
	}
	c.acking.Store(acked)
	r.holdsTaken++
	c.holder, c.grace = &hold{cur: c, n: r.holdsTaken}, grace
	r.addHoldLocked(c.holder)
	r.wakePumpsLocked()
	return true
}

// Abandon closes c as Close does, and a holding cursor's hold goes with
// it: its reader is not coming back.
func (c *Cursor) Abandon() {
	// Under the ring's lock: the pump reads a hold's grace there.
	c.r.mu.Lock()
	if c.holder != nil {
		c.grace = 0
	}
	c.r.mu.Unlock()
	c.Close()
}

// unhold ends c's hold: for good if every stream ended or it has no
// grace, else for grace more, at the index c stands at.
func (c *Cursor) unhold() {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	h := c.holder
	c.holder = nil
	h.at, h.until, h.cur = c.kept(), time.Now().Add(c.grace), nil
	// A later holding cursor is there already: most likely this one's
	// reader, come back before this connection was seen to break. It
	// holds the output; a hold left here would only keep the process
	// waiting, for a grace period, for bytes its reader has had.
	later := slices.ContainsFunc(r.holds, func(x *hold) bool { return x.cur != nil && x.n > h.n })
	if c.left == 0 || c.grace == 0 || later {
		for i, x := range r.holds {
			if x == h {
				r.holds = append(r.holds[:i], r.holds[i+1:]...)
				r.holding.Store(int32(len(r.holds)))
				break
			}
		}
	}
	r.wakePumpsLocked()
}

// drop releases the reference behind the event returned last.
func (c *Cursor) drop() {
	if c.held != nil {
		c.held.release()
		c.held = nil
	}
}

// Close releases everything the cursor holds. The cursor cannot be used
// afterwards.
func (c *Cursor) Close() {
	if c.holder != nil {
		c.unhold()
	}
	c.drop()
	for i := c.next; i < len(c.batch); i++ {
		if c.blocks[i] != nil {
			c.blocks[i].release()
		}
	}
	c.batch, c.blocks, c.next = c.batch[:0], c.blocks[:0], 0
	c.left = 0
}

// fill takes the next batch of events from the ring, waiting until there is
// at least one or every stream has ended.
func (c *Cursor) fill(ctx context.Context) error {
	r := c.r
	c.batch, c.blocks, c.next = c.batch[:0], c.blocks[:0], 0
	r.mu.RLock()
	for {
		c.collectLocked()
		if len(c.batch) > 0 || c.left == 0 {
			r.mu.RUnlock()
			return nil
		}
		wake := r.wake
		r.waiters.Add(1)
		r.mu.RUnlock()
		var err error
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-wake:
		}
		r.waiters.Add(-1)
		if err != nil {
			return err
		}
		r.mu.RLock()
	}
}

// collectLocked appends to the batch what the ring has for the cursor now.
// Caller holds r.mu for reading.
func (c *Cursor) collectLocked() {
	r := c.r
	if c.pos < r.firstIdx {
		c.pos = r.firstIdx // what lay between was evicted; the gaps say how much
	}
	for s := range Stream(NumStreams) {
		if c.wanted[s] && !c.ended[s] && c.expected[s] < r.evicted[s] {
			c.gap(s, r.evicted[s])
		}
	}
	for len(c.batch) < batchSize {
		c.endsLocked()
		i := r.head + int(c.pos-r.firstIdx)
		if i >= len(r.chunks) {
			break
		}
		ch := r.chunks[i]
		c.pos++
		end := ch.offset + int64(len(ch.data))
		if !c.wanted[ch.stream] || end <= c.expected[ch.stream] {
			continue // already delivered before this cursor's start
		}
		if ch.offset > c.expected[ch.stream] {
			c.gap(ch.stream, ch.offset)
		}
		skip := c.expected[ch.stream] - ch.offset
		ch.blk.refs.Add(1)
		c.batch = append(c.batch, Event{Kind: Data, Stream: ch.stream, Offset: ch.offset + skip, Seq: ch.seq + uint64(skip), Data: ch.data[skip:]})
		c.blocks = append(c.blocks, ch.blk)
		c.expected[ch.stream] = end
	}
	c.endsLocked()
}

// endsLocked reports the end of every stream the cursor has read past the
// close of. A stream's tail that was evicted is reported as a gap first, so
// even a stream with nothing left in the ring accounts for every byte.
func (c *Cursor) endsLocked() {
	r := c.r
	for s := range Stream(NumStreams) {
		if !c.wanted[s] || c.ended[s] || !r.closed[s] || c.pos < r.closeIdx[s] {
			continue
		}
		if c.expected[s] < r.written[s] {
			c.gap(s, r.written[s])
		}
		c.batch = append(c.batch, Event{Kind: End, Stream: s, Offset: r.written[s]})
		c.blocks = append(c.blocks, nil)
		c.ended[s] = true
		c.left--
	}
}

func (c *Cursor) gap(s Stream, to int64) {
	c.batch = append(c.batch, Event{Kind: Gap, Stream: s, Offset: c.expected[s], To: to})
	c.blocks = append(c.blocks, nil)
	c.expected[s] = to
}
