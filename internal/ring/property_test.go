package ring

import (
	"bytes"
	"testing"

	"pgregory.net/rapid"
)

// cursorModel checks one cursor's events as they arrive: per stream, data
// and gaps must continue exactly where the last event stopped, data must be
// the bytes written at those offsets, and seq must rise.
type cursorModel struct {
	c        *Cursor
	expected Offsets
	ended    [NumStreams]bool
	lastSeq  int64
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
			if int64(e.Seq) <= m.lastSeq {
				t.Fatalf("seq %d after %d", e.Seq, m.lastSeq)
			}
			m.lastSeq = int64(e.Seq)
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
		models := []*cursorModel{{c: eager, lastSeq: -1}}
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
				models = append(models, &cursorModel{c: c, expected: from, lastSeq: -1})
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
