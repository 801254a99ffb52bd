package daemon

import (
	"testing"

	"github.com/sandkiln/sandkiln/api"
)

// TestEventsKeptAndLost: a reader gets every event after the one it
// names, once; one further behind than kilnd keeps is told exactly how
// many it lost, then gets the rest.
func TestEventsKeptAndLost(t *testing.T) {
	l := newEvents()
	for range eventsKept + 10 {
		l.emit(api.Event{Type: api.EventCreated})
	}
	evs, _ := l.after(eventsKept + 5)
	if len(evs) != 5 || evs[0].Seq != eventsKept+6 || evs[4].Seq != eventsKept+10 {
		t.Fatalf("after %d: %d events from %d", eventsKept+5, len(evs), evs[0].Seq)
	}
	evs, _ = l.after(0)
	if len(evs) != eventsKept+1 || evs[0].Type != api.EventGap || evs[0].Lost != 10 || evs[0].Seq != 10 || evs[1].Seq != 11 {
		t.Fatalf("from the start: %d events, the first %+v", len(evs), evs[0])
	}
	for i := 2; i < len(evs); i++ {
		if evs[i].Seq != evs[i-1].Seq+1 {
			t.Fatalf("event %d is %d after %d", i, evs[i].Seq, evs[i-1].Seq)
		}
	}
	evs, wake := l.after(eventsKept + 10)
	if len(evs) != 0 {
		t.Fatalf("after the last: %d events", len(evs))
	}
	select {
	case <-wake:
		t.Fatal("woken before an event")
	default:
	}
	l.emit(api.Event{Type: api.EventDeleted})
	select {
	case <-wake:
	default:
		t.Fatal("not woken by an event")
	}
}
