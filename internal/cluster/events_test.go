package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/natstest"
	"github.com/sandkiln/sandkiln/internal/seqlog"
)

// kilndLog is a kilnd's own log of events, as kilnd numbers them.
type kilndLog struct {
	epoch string
	log   *seqlog.Log[api.Event]
}

func newKilndLog(epoch string, n int) *kilndLog {
	return &kilndLog{epoch: epoch, log: seqlog.New[api.Event](n)}
}

// emit adds an event of sandbox sb.
func (l *kilndLog) emit(typ, sb string) {
	l.log.Append(func(seq int64) api.Event {
		return api.Event{Seq: seq, Epoch: l.epoch, Time: time.Now().UTC(), Type: typ, Sandbox: sb}
	})
}

// connect is a connection as a node makes it: retrying while NATS is
// down.
func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// publisher starts node's publisher of l's events.
func publisher(t *testing.T, url, node string, l *kilndLog, maxBytes int64) *cluster.Events {
	t.Helper()
	x, err := cluster.NewEvents(cluster.EventsConfig{Conn: connect(t, url), Node: node, Local: l.log, LocalEpoch: l.epoch, MaxBytes: maxBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	return x
}

// published waits until x has stored n events.
func published(t *testing.T, x *cluster.Events, n int64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d events published", n), func() (bool, string) {
		st := x.Stats()
		return st.Published == n, fmt.Sprintf("%+v", st)
	})
}

// readAllEvents reads, not following, the events x's reader gives after
// seq.
func readAllEvents(t *testing.T, x *cluster.Events, after uint64) []api.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := x.OpenReader(ctx, after, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var evs []api.Event
	for {
		e, _, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return evs
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}
}

// brief is what a test compares of an event.
type brief struct {
	Seq                 int64
	Node, Type, Sandbox string
	Lost                int64
}

func briefs(evs []api.Event) []brief {
	var out []brief
	for _, e := range evs {
		out = append(out, brief{e.Seq, e.Node, e.Type, e.Sandbox, e.Lost})
	}
	return out
}

// TestEventsWhileDown: the events a node emits while NATS is down are
// published once it is back, in order, each once; those its kilnd's log
// let go meanwhile are one gap naming the node, counting them exactly. A
// publisher started again on the same log goes on where the stream ends;
// a kilnd started again (another epoch) publishes its log from the first.
func TestEventsWhileDown(t *testing.T) {
	nats := natstest.Cluster(t, 1)
	url := nats.URLs()[0]
	nats.Stop(0)
	l := newKilndLog("k1", 4)
	for i := range 10 {
		l.emit(api.EventCreated, fmt.Sprint("sb", i+1))
	}
	a := publisher(t, url, "a", l, 0)
	if a.Epoch() != "" || a.Ready() {
		t.Fatalf("NATS down, and the stream reached: epoch %q", a.Epoch())
	}
	nats.Restart(0)
	published(t, a, 5) // the gap, then the 4 held
	if !cluster.IsClusterEpoch(a.Epoch()) {
		t.Fatalf("epoch %q", a.Epoch())
	}
	want := []brief{{1, "a", api.EventGap, "", 6}}
	for i := 7; i <= 10; i++ {
		want = append(want, brief{int64(i - 5), "a", api.EventCreated, fmt.Sprint("sb", i), 0})
	}
	evs := readAllEvents(t, a, 0)
	if d := cmp.Diff(want, briefs(evs)); d != "" {
		t.Fatalf("after NATS came back (-want +got):\n%s", d)
	}
	for _, e := range evs {
		if e.Epoch != a.Epoch() {
			t.Errorf("event %d of epoch %q, want the stream's %q", e.Seq, e.Epoch, a.Epoch())
		}
	}
	if st := a.Stats(); st.Lost != 6 {
		t.Errorf("lost %d, want 6", st.Lost)
	}

	// The publisher started again: nothing again, then what comes.
	a.Close()
	l.emit(api.EventDeleted, "sb10")
	a = publisher(t, url, "a", l, 0)
	published(t, a, 1)
	if d := cmp.Diff(append(want, brief{6, "a", api.EventDeleted, "sb10", 0}), briefs(readAllEvents(t, a, 0))); d != "" {
		t.Fatalf("a publisher started again (-want +got):\n%s", d)
	}

	// A kilnd started again numbers from 1 under another epoch: all of
	// it is published, after the stream's end; another node's beside.
	a.Close()
	l2 := newKilndLog("k2", 4)
	l2.emit(api.EventCreated, "sb11")
	a = publisher(t, url, "a", l2, 0)
	lb := newKilndLog("kb", 4)
	lb.emit(api.EventCreated, "sb12")
	b := publisher(t, url, "b.example", lb, 0)
	published(t, a, 1)
	published(t, b, 1)
	if a.Epoch() != b.Epoch() {
		t.Errorf("two nodes, two epochs: %q and %q", a.Epoch(), b.Epoch())
	}
	got := briefs(readAllEvents(t, b, 6))
	if len(got) == 2 && got[0].Node == "b.example" {
		// The two nodes' in either order, numbered in that order.
		got[0], got[1] = got[1], got[0]
		got[0].Seq, got[1].Seq = got[1].Seq, got[0].Seq
	}
	if d := cmp.Diff([]brief{{7, "a", api.EventCreated, "sb11", 0}, {8, "b.example", api.EventCreated, "sb12", 0}}, got); d != "" {
		t.Errorf("after 6 (-want +got):\n%s", d)
	}
}

// TestEventsReader: a reader is given the events after its cursor, each
// once, then (following) each as it is stored; one further behind than
// the stream holds is told by a gap counting exactly what it lost.
func TestEventsReader(t *testing.T) {
	nats := natstest.Cluster(t, 1)
	url := nats.URLs()[0]
	l := newKilndLog("k1", 1024)
	// A stream that holds a few events alone.
	x := publisher(t, url, "a", l, 2048)
	for i := range 40 {
		l.emit(api.EventCreated, fmt.Sprint("sb", i+1))
	}
	published(t, x, 40)
	evs := readAllEvents(t, x, 0)
	if len(evs) < 2 || evs[0].Type != api.EventGap || evs[0].Node != "" {
		t.Fatalf("from 0 of a stream that let some go: %+v", briefs(evs))
	}
	gap, rest := evs[0], evs[1:]
	if gap.Lost != gap.Seq || rest[0].Seq != gap.Seq+1 || rest[len(rest)-1].Seq != 40 {
		t.Fatalf("gap %+v, then %+v", briefs(evs[:1]), briefs(rest))
	}
	for i, e := range rest {
		if want := fmt.Sprint("sb", gap.Seq+1+int64(i)); e.Sandbox != want || e.Seq != gap.Seq+1+int64(i) {
			t.Fatalf("event %d: %+v, want %s", i, briefs([]api.Event{e}), want)
		}
	}
	if evs := readAllEvents(t, x, 38); len(evs) != 2 || evs[0].Seq != 39 || evs[1].Seq != 40 {
		t.Errorf("after 38: %+v", briefs(evs))
	}
	if evs := readAllEvents(t, x, 40); len(evs) != 0 {
		t.Errorf("after the last: %+v", briefs(evs))
	}

	// Following: caught up, then woken by the next event.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := x.OpenReader(ctx, 39, true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	e, caughtUp, err := r.Next(ctx)
	if err != nil || e.Seq != 40 || !caughtUp {
		t.Fatalf("following after 39: %+v caught up %v, %v", briefs([]api.Event{e}), caughtUp, err)
	}
	l.emit(api.EventDeleted, "sb40")
	e, caughtUp, err = r.Next(ctx)
	if err != nil || e.Seq != 41 || e.Type != api.EventDeleted || e.Node != "a" || !caughtUp {
		t.Fatalf("following, the next: %+v caught up %v, %v", briefs([]api.Event{e}), caughtUp, err)
	}
}

// TestEventsOnAStreamMadeElsewhere: on a stream made by hand, without
// an epoch or atomic batches, the events are published one at a time,
// each once, under an epoch its creation names.
func TestEventsOnAStreamMadeElsewhere(t *testing.T) {
	url := natstest.Cluster(t, 1).URLs()[0]
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cluster.EventsStream, Subjects: []string{"kiln.events.*"}}); err != nil {
		t.Fatal(err)
	}
	l := newKilndLog("k1", 64)
	for i := range 20 {
		l.emit(api.EventCreated, fmt.Sprint("sb", i+1))
	}
	x := publisher(t, url, "a", l, 0)
	published(t, x, 20)
	var want []brief
	for i := range 20 {
		want = append(want, brief{int64(i + 1), "a", api.EventCreated, fmt.Sprint("sb", i+1), 0})
	}
	if d := cmp.Diff(want, briefs(readAllEvents(t, x, 0))); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if !cluster.IsClusterEpoch(x.Epoch()) {
		t.Errorf("epoch %q", x.Epoch())
	}
}

// BenchmarkEventsPublish: how fast a node's events reach the cluster's
// stream, one publish in flight, on one NATS server (R1) and on three
// (R3): b.N events emitted at once, timed until the last is stored.
func BenchmarkEventsPublish(b *testing.B) {
	for _, servers := range []int{1, 3} {
		b.Run(fmt.Sprintf("R%d", servers), func(b *testing.B) {
			nc, err := nats.Connect(strings.Join(natstest.Cluster(b, servers).URLs(), ","))
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			l := newKilndLog("k1", max(b.N, 1))
			x, err := cluster.NewEvents(cluster.EventsConfig{Conn: nc, Node: "a", Replicas: servers, Local: l.log, LocalEpoch: l.epoch})
			if err != nil {
				b.Fatal(err)
			}
			defer x.Close()
			// The stream set up first.
			l.emit(api.EventCreated, "sb0")
			for x.Stats().Published < 1 {
				time.Sleep(time.Millisecond)
			}
			b.ResetTimer()
			for range b.N {
				l.emit(api.EventCreated, "sb")
			}
			for x.Stats().Published < int64(b.N)+1 {
				time.Sleep(100 * time.Microsecond)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
