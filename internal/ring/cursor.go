package ring

import (
	"context"
	"fmt"
	"io"
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
	return e, nil
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
	if c.pos < r.firstSeq {
		c.pos = r.firstSeq // what lay between was evicted; the gaps say how much
	}
	for s := range Stream(NumStreams) {
		if c.wanted[s] && !c.ended[s] && c.expected[s] < r.evicted[s] {
			c.gap(s, r.evicted[s])
		}
	}
	for len(c.batch) < batchSize {
		c.endsLocked()
		i := r.head + int(c.pos-r.firstSeq)
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
		c.batch = append(c.batch, Event{Kind: Data, Stream: ch.stream, Offset: ch.offset + skip, Seq: ch.seq, Data: ch.data[skip:]})
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
		if !c.wanted[s] || c.ended[s] || !r.closed[s] || c.pos < r.closeSeq[s] {
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
