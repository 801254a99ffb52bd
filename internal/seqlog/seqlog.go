// Package seqlog is a numbered log of the last events, for readers that
// come back: kilnd's events and each agent's process events. Events are
// numbered from 1; the last n are held in a ring, and a reader that asks
// for older ones is told how many it lost.
package seqlog

import "sync"

// Log holds the last events of type E.
type Log[E any] struct {
	mu    sync.Mutex
	ring  []E   // the held events: event seq at ring[(seq-1) % cap]
	next  int64 // the number of the next event
	wake  chan struct{}
	ended bool
}

// New makes a log that holds the last n events.
func New[E any](n int) *Log[E] {
	return &Log[E]{ring: make([]E, 0, n), next: 1, wake: make(chan struct{})}
}

// Append adds the event made makes of the next number, in place of the
// oldest if the log is full, and wakes every reader.
func (l *Log[E]) Append(made func(seq int64) E) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := made(l.next)
	if len(l.ring) < cap(l.ring) {
		l.ring = append(l.ring, e)
	} else {
		l.ring[(l.next-1)%int64(cap(l.ring))] = e
	}
	l.next++
	close(l.wake)
	l.wake = make(chan struct{})
}

// After returns the events held after seq, oldest first; lost, how many
// after seq are no longer held (they would come first); last, the number
// of the last event; and a channel closed at the next event, nil once the
// log has ended.
func (l *Log[E]) After(seq int64) (evs []E, lost, last int64, wake <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.next - int64(len(l.ring)) // the number of the oldest held
	if seq < first-1 {
		lost, seq = first-1-seq, first-1
	}
	for s := seq + 1; seq < l.next-1 && s < l.next; s++ {
		evs = append(evs, l.ring[(s-1)%int64(cap(l.ring))])
	}
	if !l.ended {
		wake = l.wake
	}
	return evs, lost, l.next - 1, wake
}

// Last is the number of the last event, 0 before the first.
func (l *Log[E]) Last() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next - 1
}

// End says no event comes after those held: readers are woken, and
// After's channel is nil from now on.
func (l *Log[E]) End() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.ended = true
		close(l.wake)
	}
}
