package seqlog

import (
	"slices"
	"testing"
)

// TestHeldLostAndEnded: a reader gets every event after the one it names,
// once, in order, across the ring's wrap; one further behind than the log
// holds is told exactly how many it lost; the end wakes readers and ends
// the waiting.
func TestHeldLostAndEnded(t *testing.T) {
	l := New[int64](4)
	for range 10 {
		l.Append(func(seq int64) int64 { return seq })
	}
	evs, lost, last, _ := l.After(0)
	if !slices.Equal(evs, []int64{7, 8, 9, 10}) || lost != 6 || last != 10 {
		t.Errorf("after 0: %v, lost %d, last %d", evs, lost, last)
	}
	evs, lost, _, _ = l.After(8)
	if !slices.Equal(evs, []int64{9, 10}) || lost != 0 {
		t.Errorf("after 8: %v, lost %d", evs, lost)
	}
	if evs, lost, _, _ := l.After(1<<63 - 1); len(evs) != 0 || lost != 0 {
		t.Errorf("after a number to come: %v, lost %d", evs, lost)
	}
	if l.Last() != 10 {
		t.Errorf("last %d", l.Last())
	}
	evs, _, _, wake := l.After(10)
	if len(evs) != 0 {
		t.Errorf("after the last: %v", evs)
	}
	select {
	case <-wake:
		t.Fatal("woken before an event")
	default:
	}
	l.Append(func(seq int64) int64 { return seq })
	select {
	case <-wake:
	default:
		t.Fatal("not woken by an event")
	}
	if evs, _, _, _ := l.After(10); !slices.Equal(evs, []int64{11}) {
		t.Errorf("after 10: %v", evs)
	}
	_, _, _, wake = l.After(11)
	l.End()
	select {
	case <-wake:
	default:
		t.Fatal("not woken by the end")
	}
	if evs, _, _, wake := l.After(9); !slices.Equal(evs, []int64{10, 11}) || wake != nil {
		t.Errorf("after the end: %v, wake %v", evs, wake)
	}
}
