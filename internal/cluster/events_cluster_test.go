package cluster_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/natstest"
)

// eventsVia reads GET /events through n with query q: the status, and the
// events (or the error's body). Following, it stops after stop events,
// its connection cut.
func eventsVia(t *testing.T, n *node, tok string, q url.Values, stop int) (int, []api.Event, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", n.url()+"/events?"+q.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var evs []api.Event
	lines := bufio.NewScanner(resp.Body)
	var body strings.Builder
	for (stop == 0 || len(evs) < stop) && lines.Scan() {
		body.Write(lines.Bytes())
		var e api.Event
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(lines.Bytes(), &e); err != nil {
				t.Fatalf("an event through %s: %v: %s", n.name, err, lines.Bytes())
			}
			evs = append(evs, e)
		}
	}
	return resp.StatusCode, evs, body.String()
}

// cursor is where a reader of events stands.
func cursor(epoch string, after int64, follow bool) url.Values {
	q := url.Values{"after": {strconv.FormatInt(after, 10)}, "follow": {strconv.FormatBool(follow)}}
	if epoch != "" {
		q.Set("epoch", epoch)
	}
	return q
}

// happening is what a reader compares of an event.
type happening struct {
	Seq                 int64
	Node, Type, Sandbox string
}

func happenings(evs []api.Event) []happening {
	var out []happening
	for _, e := range evs {
		out = append(out, happening{e.Seq, e.Node, e.Type, e.Sandbox})
	}
	return out
}

// TestClusterEvents: three kilnds on a three-server NATS cluster. The
// events of sandboxes made on a, b and c are read through any node in
// one order, each naming its node, numbered alike; a reader cut
// mid-stream resumes through another node with its cursor, nothing
// missed or given twice. A node whose cluster is down gives its own
// events, and refuses a cursor of the cluster's; what it emitted
// meanwhile reaches the cluster once it is back, each once.
func TestClusterEvents(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	nats := natstest.Cluster(t, 3)
	urls := nats.URLs()
	a := startNode(t, "a", "", []string{urls[0], urls[1], urls[2]}, nil)
	b := startNode(t, "b", "", []string{urls[1], urls[2], urls[0]}, nil)
	c := startNode(t, "c", "", []string{urls[2], urls[0], urls[1]}, nil)
	nodes := []*node{a, b, c}
	for _, n := range nodes {
		ready(t, n)
	}
	tok := a.token(t)
	all := map[string]string{"a": api.NodeReady, "b": api.NodeReady, "c": api.NodeReady}
	for _, n := range nodes {
		nodesSeen(t, n, tok, all)
	}
	_, js := natsClient(t, urls)
	replicated(t, js, cluster.EventsStream)

	// A sandbox made and deleted on each node, all through a.
	ctx := context.Background()
	viaA, err := client.New(client.Options{Addr: a.url(), Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	defer viaA.Close()
	placed := map[string]string{} // sandbox id: its node
	for _, n := range nodes {
		sb, err := viaA.CreateSandbox(ctx, client.SandboxOptions{Node: n.name})
		if err != nil {
			t.Fatal(err)
		}
		placed[sb.ID] = n.name
		if err := sb.Delete(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	// Read through each node, once every node's deletion is there.
	var whole []api.Event
	for _, n := range nodes {
		eventually(t, "the events through "+n.name, func() (bool, string) {
			code, evs, body := eventsVia(t, n, tok, cursor("", 0, false), 0)
			deleted := 0
			for _, e := range evs {
				if e.Type == api.EventDeleted && placed[e.Sandbox] != "" {
					deleted++
				}
			}
			if code != 200 || deleted != 3 {
				return false, fmt.Sprint(code, " ", happenings(evs), body)
			}
			if whole == nil {
				whole = evs
			} else if d := cmp.Diff(happenings(whole), happenings(evs)[:min(len(evs), len(whole))]); d != "" {
				t.Fatalf("through %s, not what a gave (-a +%s):\n%s", n.name, n.name, d)
			}
			return true, ""
		})
	}
	epoch := whole[0].Epoch
	if !cluster.IsClusterEpoch(epoch) {
		t.Fatalf("epoch %q: not the cluster's", epoch)
	}
	// Numbered from 1, none missing; each sandbox's events named with its
	// node, made before deleted.
	state := map[string]string{}
	for i, e := range whole {
		if e.Seq != int64(i+1) || e.Epoch != epoch || e.Type == api.EventGap {
			t.Fatalf("event %d: %+v", i, e)
		}
		if node := placed[e.Sandbox]; node != "" {
			if e.Node != node {
				t.Errorf("sandbox %s of node %s: an event naming node %q", e.Sandbox, node, e.Node)
			}
			switch e.Type {
			case api.EventCreated:
				state[e.Sandbox] = "made"
			case api.EventDeleted:
				if state[e.Sandbox] != "made" {
					t.Errorf("sandbox %s deleted before it was made", e.Sandbox)
				}
				state[e.Sandbox] = "gone"
			}
		}
	}
	// The SDK's iterator, through c, gives the same.
	viaC, err := client.New(client.Options{Addr: c.url(), Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	defer viaC.Close()
	var fromSDK []api.Event
	for e, err := range viaC.Events(ctx, client.EventOptions{NoFollow: true}) {
		if err != nil {
			t.Fatal(err)
		}
		fromSDK = append(fromSDK, e)
	}
	if d := cmp.Diff(happenings(whole), happenings(fromSDK)[:min(len(fromSDK), len(whole))]); d != "" {
		t.Errorf("Client.Events through c (-a +sdk):\n%s", d)
	}
	// One node's events, chosen through another: b's, read through c,
	// are those of the whole that name b, in its order.
	var ofB []api.Event
	for _, e := range whole {
		if e.Node == "b" {
			ofB = append(ofB, e)
		}
	}
	var fromB []api.Event
	for e, err := range viaC.Events(ctx, client.EventOptions{Node: "b", NoFollow: true}) {
		if err != nil {
			t.Fatal(err)
		}
		fromB = append(fromB, e)
	}
	if len(ofB) == 0 || len(fromB) < len(ofB) {
		t.Fatalf("node b's events through c: %v, want %v", happenings(fromB), happenings(ofB))
	}
	if d := cmp.Diff(happenings(ofB), happenings(fromB)[:len(ofB)]); d != "" {
		t.Errorf("node b's events through c (-whole's +read):\n%s", d)
	}
	for _, e := range fromB {
		if e.Node != "b" {
			t.Errorf("an event of node %q read for node b: %+v", e.Node, e)
		}
	}

	// Cut mid-stream on b, following; resumed on c with its cursor.
	cut := len(whole) / 2
	code, first, body := eventsVia(t, b, tok, cursor("", 0, true), cut)
	if code != 200 || len(first) != cut {
		t.Fatalf("following through b: %d %d events %s", code, len(first), body)
	}
	last := first[len(first)-1]
	code, rest, body := eventsVia(t, c, tok, cursor(last.Epoch, last.Seq, false), 0)
	if code != 200 {
		t.Fatalf("resumed through c: %d %s", code, body)
	}
	if d := cmp.Diff(happenings(whole), happenings(append(first, rest...))[:min(len(whole), len(first)+len(rest))]); d != "" {
		t.Fatalf("cut on b, resumed on c (-whole +read):\n%s", d)
	}
	// A sandbox's own, through another node than its.
	var someB string
	for id, n := range placed {
		if n == "b" {
			someB = id
		}
	}
	q := cursor("", 0, false)
	q.Set("sandbox", someB)
	if code, evs, body := eventsVia(t, c, tok, q, 0); code != 200 || len(evs) < 2 || evs[0].Type != api.EventCreated || evs[len(evs)-1].Type != api.EventDeleted {
		t.Errorf("b's sandbox's events through c: %d %v %s", code, happenings(evs), body)
	}

	// Two NATS servers of three stop: JetStream has no quorum, and every
	// node's cluster is down.
	nats.Stop(1)
	nats.Stop(2)
	eventually(t, "a's cluster down", func() (bool, string) {
		code, body := a.do(t, tok, "GET", "/readyz", "")
		return code == http.StatusServiceUnavailable, string(body)
	})
	code, _, body = eventsVia(t, a, tok, cursor(epoch, last.Seq, false), 0)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "cluster") {
		t.Errorf("a cluster cursor on a, its cluster down: %d %s, want 503 saying why", code, body)
	}
	// Made on a meanwhile: a alone numbers its events now.
	code, made := a.do(t, tok, "POST", "/sandboxes", `{}`)
	var down api.Sandbox
	if json.Unmarshal(made, &down); code != http.StatusCreated || down.Node != "a" {
		t.Fatalf("create on a, its cluster down: %d %s", code, made)
	}
	if code, body := a.do(t, tok, "DELETE", "/sandboxes/"+down.ID, ""); code != http.StatusNoContent {
		t.Fatalf("delete on a, its cluster down: %d %s", code, body)
	}
	q = cursor("", 0, false)
	q.Set("sandbox", down.ID)
	code, own, body := eventsVia(t, a, tok, q, 0)
	if code != 200 || len(own) < 2 || own[0].Node != "a" || cluster.IsClusterEpoch(own[0].Epoch) {
		t.Fatalf("a's own events while its cluster is down: %d %v %s", code, happenings(own), body)
	}

	// Back: what a emitted meanwhile reaches the cluster, each once, after
	// what was there; or, had a's log let it go, a gap counts it.
	nats.Restart(1)
	nats.Restart(2)
	var after []api.Event
	eventually(t, "a's events of its cluster's absence, through b", func() (bool, string) {
		code, evs, body := eventsVia(t, b, tok, cursor(epoch, whole[len(whole)-1].Seq, false), 0)
		after = evs
		for _, e := range evs {
			if e.Sandbox == down.ID && e.Type == api.EventDeleted || e.Type == api.EventGap && e.Node == "a" {
				return code == 200, ""
			}
		}
		return false, fmt.Sprint(code, " ", happenings(evs), body)
	})
	var ofDown []happening
	var lost int64
	for i, e := range after {
		if e.Seq != whole[len(whole)-1].Seq+int64(i)+1 || e.Epoch != epoch {
			t.Fatalf("after the cluster's return, event %d: %+v", i, e)
		}
		switch {
		case e.Type == api.EventGap && e.Node == "a":
			lost += e.Lost
		case e.Sandbox == down.ID:
			ofDown = append(ofDown, happening{0, e.Node, e.Type, e.Sandbox})
		}
	}
	var want []happening
	for _, e := range own {
		want = append(want, happening{0, e.Node, e.Type, e.Sandbox})
	}
	if lost != 0 || cmp.Diff(want, ofDown) != "" {
		t.Errorf("a's events of its cluster's absence: lost %d; (-a's own +the cluster's):\n%s", lost, cmp.Diff(want, ofDown))
	}
	// a's scrape says its events reached the cluster, none lost.
	code, m := a.do(t, tok, "GET", "/metrics", "")
	if code != 200 || !strings.Contains(string(m), "kilnd_events_lost_total 0\n") || !strings.Contains(string(m), "kilnd_events_published_total ") ||
		strings.Contains(string(m), "kilnd_events_published_total 0\n") {
		t.Errorf("a's metrics of its events: %d\n%s", code, m)
	}
}
