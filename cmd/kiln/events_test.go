package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
)

// TestEventLine: kiln events says where a cluster's event happened, and
// tells a node's events that never reached the cluster from those no
// longer kept.
func TestEventLine(t *testing.T) {
	at := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	sb := strings.Repeat("3f2a", 16)
	for _, tc := range []struct {
		e    api.Event
		want string
	}{
		{api.Event{Seq: 7, Time: at, Type: api.EventCreated, Sandbox: sb, Name: "web", Node: "b"}, "  7  sandbox.created  " + api.ShortID(sb) + " (web) on b"},
		{api.Event{Seq: 8, Time: at, Type: api.EventCreated, Sandbox: sb}, "  8  sandbox.created  " + api.ShortID(sb)},
		{api.Event{Seq: 9, Time: at, Type: api.EventGap, Lost: 3, Node: "c"}, "  9  gap: 3 events of node c never reached the cluster"},
		{api.Event{Seq: 12, Time: at, Type: api.EventGap, Lost: 3}, "  12  gap: 3 events before this one are no longer kept"},
	} {
		got := eventLine(tc.e)
		if _, rest, _ := strings.Cut(got, "  "); "  "+rest != tc.want {
			t.Errorf("%+v: %q, want the time then %q", tc.e, got, tc.want)
		}
	}
}
