// Package natstest runs NATS servers with JetStream inside a test process, on loopback: one server, or a cluster of them joined by routes, each of which a test can stop and start again.
package natstest

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ready bounds how long a server may take to accept clients, and a
// cluster to elect its JetStream meta leader (formation takes 1–2 s on two
// cores; an election after a server's loss, 4–9 s).
const ready = 30 * time.Second

// Server starts one NATS server with JetStream on 127.0.0.1, on a port of
// its own, its store in a directory of t's, and shuts it down when t ends.
// Its ClientURL is what clients connect to.
func Server(t testing.TB) *server.Server {
	t.Helper()
	return Cluster(t, 1).Server(0)
}

// C is a set of NATS servers started together: with more than one, a
// cluster with JetStream clustered across them (streams of up to that
// many replicas). URLs, Server and Stop may be called from any goroutine;
// Restart, which fails the test if the server does not come back, from
// the test's.
type C struct {
	t testing.TB
	// mu guards servers and opts; opts[i] is what server i was started
	// with, its ports fixed once first bound so that it comes back where
	// its clients and peers look for it.
	mu      sync.Mutex
	servers []*server.Server // nil while stopped
	opts    []*server.Options
}

// Cluster starts n servers on 127.0.0.1 (n == 1: one server, not
// clustered) and returns once all accept clients and, for a cluster, a
// JetStream meta leader is elected and every server is current with it.
// They are shut down when t ends.
func Cluster(t testing.TB, n int) *C {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: a cluster of %d servers", n)
	}
	c := &C{t: t, servers: make([]*server.Server, n), opts: make([]*server.Options, n)}
	// The route ports are chosen before any server starts, so that each
	// is configured with every other's: JetStream sizes its meta group
	// from the routes it is given.
	var routePorts []int
	if n > 1 {
		for range n {
			routePorts = append(routePorts, freePort(t))
		}
	}
	for i := range n {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
		}
		if n > 1 {
			o.Cluster = server.ClusterOpts{Name: "natstest", Host: "127.0.0.1", Port: routePorts[i]}
			var others []string
			for j, p := range routePorts {
				if j != i {
					others = append(others, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
				}
			}
			o.Routes = server.RoutesFromStr(strings.Join(others, ","))
		}
		c.opts[i] = o
	}
	// After the store directories: cleanups run last first, so the
	// servers stop before their directories are removed.
	t.Cleanup(c.shutdown)
	for i := range n {
		c.start(i)
	}
	c.waitMeta()
	return c
}

// freePort is a loopback port no one listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// start starts server i with its options and waits until it accepts
// clients; its client port is then kept for its restarts.
func (c *C) start(i int) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	o := *c.opts[i]
	s, err := server.NewServer(&o)
	if err != nil {
		c.t.Fatalf("natstest: server %d: %v", i, err)
	}
	s.Start()
	if !s.ReadyForConnections(ready) {
		s.Shutdown()
		c.t.Fatalf("natstest: server %d did not accept clients within %v", i, ready)
	}
	c.opts[i].Port = s.Addr().(*net.TCPAddr).Port
	c.servers[i] = s
}

// waitMeta waits until the running servers have a JetStream meta leader
// and each is current with it.
func (c *C) waitMeta() {
	c.t.Helper()
	deadline := time.Now().Add(ready)
	for {
		c.mu.Lock()
		leader, current := len(c.servers) == 1, true
		for _, s := range c.servers {
			if s == nil {
				continue
			}
			leader = leader || s.JetStreamIsLeader()
			current = current && s.JetStreamEnabled() && s.JetStreamIsCurrent()
		}
		c.mu.Unlock()
		if leader && current {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("natstest: no JetStream meta leader within %v", ready)
		}
		// Raft has no event to wait on from outside the server.
		time.Sleep(10 * time.Millisecond)
	}
}

// URLs are the servers' client URLs, stopped ones too (a client keeps
// them to reconnect to); joined with commas they are what nats.Connect
// takes.
func (c *C) URLs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	urls := make([]string, len(c.opts))
	for i, o := range c.opts {
		urls[i] = fmt.Sprintf("nats://%s:%d", o.Host, o.Port)
	}
	return urls
}

// Server is server i, nil while it is stopped.
func (c *C) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i]
}

// Stop shuts server i down and waits until it has stopped; its store is
// kept for Restart.
func (c *C) Stop(i int) {
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart starts server i again, stopping it first if it runs, on the
// same ports and store, and returns once it accepts clients and the
// cluster again has a meta leader that every running server is current
// with.
func (c *C) Restart(i int) {
	c.t.Helper()
	c.Stop(i)
	c.start(i)
	c.waitMeta()
}

// shutdown stops every server.
func (c *C) shutdown() {
	for i := range c.servers {
		c.Stop(i)
	}
}
