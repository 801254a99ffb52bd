package ring

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// cursorModel checks one cursor's events as they arrive: per stream, data
// and gaps must continue exactly where the last event stopped, data must be
// the bytes written at those offsets, and each data event must start at or
// after the end of the one before it in the output (its seq plus length).
type cursorModel struct {
	c        *Cursor
	expected Offsets
	ended    [NumStreams]bool
	seqEnd   int64 // where the last data event ends in the output
	gaps     int64
}

func (m *cursorModel) read(t *rapid.T, limit int) {
	for range limit {
		e, err := m.c.Next(canceled)
		if err != nil {
			return
		}
		s := e.Stream
		if m.ended[s] {
			t.Fatalf("%v event after its end: %+v", s, e)
		}
		switch e.Kind {
		case Data:
			if e.Offset != m.expected[s] {
				t.Fatalf("%v data at %d, expected %d", s, e.Offset, m.expected[s])
			}
			if len(e.Data) == 0 {
				t.Fatalf("empty data event")
			}
			if !bytes.Equal(e.Data, patterned(s, e.Offset, len(e.Data))) {
				t.Fatalf("%v data at %d has the wrong bytes", s, e.Offset)
			}
			if int64(e.Seq) < m.seqEnd {
				t.Fatalf("seq %d overlaps the data before, which ends at %d", e.Seq, m.seqEnd)
			}
			m.seqEnd = int64(e.Seq) + int64(len(e.Data))
			m.expected[s] += int64(len(e.Data))
		case Gap:
			if e.Offset != m.expected[s] || e.To <= e.Offset {
				t.Fatalf("%v gap [%d,%d), expected it to start at %d", s, e.Offset, e.To, m.expected[s])
			}
			m.gaps += e.Lost()
			m.expected[s] = e.To
		case End:
			if e.Offset != m.expected[s] {
				t.Fatalf("%v ends at %d but the cursor accounted for %d", s, e.Offset, m.expected[s])
			}
			m.ended[s] = true
		}
	}
}

// For any sequence of writes, capacities, cursor starts and read paces, what
// a cursor receives plus the gaps it is told about account for every byte
// exactly once, in order per stream; a cursor that keeps up loses nothing.
func TestPropertyEveryByteAccounted(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.IntRange(1, 5000).Draw(t, "capacity")
		streams := []Stream{Stdout, Stderr}
		if rapid.Bool().Draw(t, "pty") {
			streams = []Stream{PTY}
		}
		r := New(Config{Capacity: capacity, Streams: streams})
		eager, _ := r.Cursor(Offsets{})
		models := []*cursorModel{{c: eager}}
		var written Offsets
		for range rapid.IntRange(0, 60).Draw(t, "ops") {
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0, 1: // a write no larger than the ring, which the eager cursor must keep up with
				s := rapid.SampledFrom(streams).Draw(t, "stream")
				n := rapid.IntRange(1, capacity).Draw(t, "n")
				write(r, s, patterned(s, written[s], n))
				written[s] += int64(n)
				models[0].read(t, 1<<30)
			case 2: // a new cursor at offsets it may legitimately hold
				var from Offsets
				for _, s := range streams {
					from[s] = rapid.Int64Range(0, written[s]).Draw(t, "from")
				}
				c, err := r.Cursor(from)
				if err != nil {
					t.Fatal(err)
				}
				models = append(models, &cursorModel{c: c, expected: from})
			case 3: // some cursor reads a little
				m := models[rapid.IntRange(0, len(models)-1).Draw(t, "cursor")]
				m.read(t, rapid.IntRange(1, 5).Draw(t, "events"))
			}
		}
		for _, s := range streams {
			r.CloseStream(s)
		}
		for i, m := range models {
			m.read(t, 1<<30)
			for _, s := range streams {
				if !m.ended[s] || m.expected[s] != written[s] {
					t.Fatalf("cursor %d: %v ended=%v at %d, written %d", i, s, m.ended[s], m.expected[s], written[s])
				}
			}
			m.c.Close()
		}
		if models[0].gaps != 0 {
			t.Fatalf("a cursor that kept up was told of %d lost bytes", models[0].gaps)
		}
		if got := r.Retained(); got > capacity {
			t.Fatalf("ring retains %d bytes, capacity %d", got, capacity)
		}
	})
}

// For any capacity and writes, on one or two streams, a holding cursor
// gets every byte once, in order, with no gap and rising seq, while the
// ring never retains more than its capacity; a cursor that does not hold,
// read only at the end, accounts for every byte as received or lost.
func TestPropertyHolderLosesNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.IntRange(1, 5000).Draw(t, "capacity")
		streams := []Stream{Stdout, Stderr}
		if rapid.Bool().Draw(t, "pty") {
			streams = []Stream{PTY}
		}
		type op struct {
			s Stream
			n int
		}
		var ops []op
		var written Offsets
		for range rapid.IntRange(0, 40).Draw(t, "writes") {
			s := rapid.SampledFrom(streams).Draw(t, "stream")
			n := rapid.IntRange(1, 3*capacity).Draw(t, "n")
			ops = append(ops, op{s, n})
			written[s] += int64(n)
		}
		// A holder that acks does so once it has taken ackEvery bytes more:
		// the hold stays where it last acked, and the pumps wait on that.
		// Up to a quarter of the ring, a reader that has taken all there is
		// has acked enough for the pumps to go on.
		acked := rapid.Bool().Draw(t, "acked")
		ackEvery := int64(rapid.IntRange(1, max(1, capacity/4)).Draw(t, "ackEvery"))
		var lastAck int64
		r := New(Config{Capacity: capacity, Streams: streams})
		holder, _ := r.Cursor(Offsets{})
		holder.Hold(time.Hour, acked)
		late, _ := r.Cursor(Offsets{})
		m := &cursorModel{c: holder}
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			var off Offsets
			for _, o := range ops {
				write(r, o.s, patterned(o.s, off[o.s], o.n))
				off[o.s] += int64(o.n)
			}
			for _, s := range streams {
				r.CloseStream(s)
			}
		}()
		// A holder and its pumps that wait on each other fail the check,
		// rather than hang the run.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for {
			e, err := holder.Next(ctx)
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the holder waited a minute at %v of %v, the pumps held: %v", holder.Position(), written, r.Held())
			}
			if err != nil {
				break
			}
			if n := r.Retained(); n > capacity {
				t.Fatalf("the ring retains %d bytes, capacity %d", n, capacity)
			}
			pos := holder.Position()
			if taken := pos[Stdout] + pos[Stderr] + pos[PTY]; acked && taken-lastAck >= ackEvery {
				holder.Ack(pos)
				lastAck = taken
			}
			switch e.Kind {
			case Gap:
				t.Fatalf("a holder was told of a gap: %+v", e)
			case Data:
				if e.Offset != m.expected[e.Stream] || !bytes.Equal(e.Data, patterned(e.Stream, e.Offset, len(e.Data))) {
					t.Fatalf("%v data at %d, expected %d", e.Stream, e.Offset, m.expected[e.Stream])
				}
				if int64(e.Seq) < m.seqEnd {
					t.Fatalf("seq %d overlaps the data before, which ends at %d", e.Seq, m.seqEnd)
				}
				m.seqEnd = int64(e.Seq) + int64(len(e.Data))
				m.expected[e.Stream] += int64(len(e.Data))
			}
		}
		<-wrote
		holder.Close()
		if m.expected != written {
			t.Fatalf("the holder got %v of %v", m.expected, written)
		}
		lm := &cursorModel{c: late}
		lm.read(t, 1<<30)
		late.Close()
		for _, s := range streams {
			if !lm.ended[s] || lm.expected[s] != written[s] {
				t.Fatalf("the late cursor: %v ended=%v at %d of %d", s, lm.ended[s], lm.expected[s], written[s])
			}
		}
	})
}
