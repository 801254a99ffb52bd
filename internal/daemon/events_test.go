package daemon

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

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

// roundTrip answers every request with body, as an agent would.
type roundTrip string

func (b roundTrip) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(string(b))), Header: http.Header{}}, nil
}

// TestProcessEventsBoundedAndCounted: an agent that tells of processes
// faster than processEventRate has a burst of them kept and the rest
// counted in a gap of its sandbox's: every event it sent is kept or
// counted, none twice; a line that is no event counts for nothing.
func TestProcessEventsBoundedAndCounted(t *testing.T) {
	const sent = 3 * processEventBurst
	var agent strings.Builder
	for i := range sent {
		b, _ := json.Marshal(api.Event{Seq: int64(i + 1), Type: api.EventProcessStarted, Process: &api.Process{ID: strconv.Itoa(i)}})
		agent.Write(append(b, '\n'))
		if i == 10 {
			agent.WriteString("not an event\n")
			agent.Write(append(b, '\n')) // told again: not kept again
		}
	}
	d := &Daemon{events: newEvents()}
	r := processRelay{d: d, t: roundTrip(agent.String()), sandbox: "sb", tokens: processEventBurst, filled: time.Now()}
	last, again := r.relay(t.Context(), "0")
	r.tellDropped()
	if last != sent || !again {
		t.Fatalf("relay read to %d (%t), want %d", last, again, sent)
	}
	evs, _ := d.events.after(0)
	var kept, lost int64
	seen := map[string]bool{}
	for _, e := range evs {
		switch e.Type {
		case api.EventProcessStarted:
			if seen[e.Process.ID] || e.Sandbox != "sb" {
				t.Fatalf("event %+v twice, or of another sandbox", e)
			}
			seen[e.Process.ID] = true
			kept++
		case api.EventGap:
			if e.Sandbox != "sb" || e.Reason == "" {
				t.Errorf("gap %+v", e)
			}
			lost += e.Lost
		}
	}
	if kept < processEventBurst || lost == 0 || kept+lost != sent {
		t.Errorf("kept %d and counted %d lost of %d sent", kept, lost, sent)
	}
}
