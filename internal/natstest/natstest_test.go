package natstest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/internal/natstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// connect is a client of urls with a JetStream context, closed with t.
func connect(t *testing.T, urls ...string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// publishN publishes n messages to subject, each acknowledged.
func publishN(ctx context.Context, t *testing.T, js jetstream.JetStream, subject string, n int) {
	t.Helper()
	for i := range n {
		// A cluster that has just lost a server may refuse for the time
		// of an election, and a request sent to the server as it stopped
		// is never answered: each try has a time of its own, and an
		// acknowledged message is what counts.
		for {
			tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := js.Publish(tctx, subject, []byte{byte(i)})
			cancel()
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("publish %d: %v", i, err)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

// A single server keeps what it acknowledged across a restart, on the same
// URL.
func TestServerRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c := natstest.Cluster(t, 1)
	if c.Server(0).JetStreamIsClustered() {
		t.Fatal("a cluster of one is clustered")
	}
	js := connect(t, c.URLs()...)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	publishN(ctx, t, js, "t.a", 5)
	url := c.URLs()[0]
	c.Stop(0)
	if c.Server(0) != nil {
		t.Fatal("a stopped server is still there")
	}
	c.Restart(0)
	if got := c.URLs()[0]; got != url {
		t.Fatalf("restarted on %s, was %s", got, url)
	}
	publishN(ctx, t, js, "t.a", 5)
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 10 {
		t.Fatalf("%d messages after the restart, want 10", info.State.Msgs)
	}
}

// Server is one server with JetStream, reachable at its ClientURL.
func TestServer(t *testing.T) {
	s := natstest.Server(t)
	js := connect(t, s.ClientURL())
	if _, err := js.AccountInfo(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A cluster of three keeps an R3 stream's acknowledged messages when one
// server (its stream's leader) stops, goes on taking messages, and takes
// the server back.
func TestClusterStopOne(t *testing.T) {
	if testing.Short() {
		t.Skip("an election takes seconds")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := natstest.Cluster(t, 3)
	if len(c.URLs()) != 3 {
		t.Fatalf("URLs %v", c.URLs())
	}
	js := connect(t, c.URLs()...)
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	publishN(ctx, t, js, "t.a", 10)
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i := range 3 {
		if c.Server(i).Name() == info.Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("stream leader %q is none of the servers", info.Cluster.Leader)
	}
	c.Stop(leader)
	publishN(ctx, t, js, "t.a", 10)
	c.Restart(leader)
	info, err = s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 20 {
		t.Fatalf("%d messages, want 20", info.State.Msgs)
	}
}
