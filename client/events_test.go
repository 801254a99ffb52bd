package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// TestEvents: the iterator gives each sandbox's creation and deletion in
// order; stopped and taken up again from the last event read, it gives
// the rest, none twice; NoFollow ends with those held.
func TestEvents(t *testing.T) {
	c, sb := kilnd(t) // a kilnd, and a sandbox made in it
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var last api.Event
	for e, err := range c.Events(ctx, client.EventOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		if e.Seq != 1 || e.Type != api.EventCreated || e.Sandbox != sb.ID {
			t.Fatalf("the first event: %+v", e)
		}
		last = e
		break
	}
	other, err := c.CreateSandbox(ctx, api.CreateSandbox{Labels: map[string]string{"for": "events"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Delete(ctx, false); err != nil {
		t.Fatal(err)
	}
	var got []api.Event
	for e, err := range c.Events(ctx, client.EventOptions{After: last.Seq, NoFollow: true}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	if len(got) != 2 || got[0].Seq != 2 || got[0].Type != api.EventCreated || got[1].Seq != 3 || got[1].Type != api.EventDeleted ||
		got[0].Sandbox != other.ID || got[1].Sandbox != other.ID || got[1].Reason != "deleted" {
		t.Errorf("after %d: %+v", last.Seq, got)
	}
	for _, err := range c.Events(ctx, client.EventOptions{Type: "nothing"}) {
		if !client.IsInvalid(err) {
			t.Errorf("a type kilnd has not: %v", err)
		}
	}
}
