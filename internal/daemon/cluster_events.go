// The events across the cluster: in a cluster, GET /events on any node
// reads the cluster's stream of every node's events (cluster.Events);
// while the cluster cannot be reached, the node's own, as a kilnd alone.

package daemon

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// startClusterEvents has n publish d's events to the cluster's stream,
// on a NATS connection of its own, and every event name n.
func (d *Daemon) startClusterEvents(n *cluster.Node) error {
	name := n.Name()
	d.events.node.Store(&name)
	conn, err := n.Connect("events")
	if err != nil {
		return fmt.Errorf("cluster: the events' connection: %w", err)
	}
	x, err := cluster.NewEvents(cluster.EventsConfig{Conn: conn, Node: name, Replicas: n.Replicas(),
		Local: d.events.log, LocalEpoch: d.events.epoch, Log: d.log})
	if err != nil {
		conn.Close()
		return err
	}
	d.events.cluster, d.events.conn = x, conn
	return nil
}

// stopClusterEvents stops publishing; what was not published yet is
// lost with the kilnd's log (a kilnd started again has another).
func (d *Daemon) stopClusterEvents() {
	if x := d.events.cluster; x != nil {
		x.Close()
		d.events.conn.Close()
	}
}

// openClusterEvents opens the reader of the cluster's events q asks for,
// or returns nil for this node's own: outside a cluster, or while the
// cluster is not reached (then a cursor of the cluster's is refused: its
// numbers are not this node's). A cursor of another epoch (this kilnd's
// own, read while the cluster was down, or a stream made anew) reads
// from the oldest event the stream holds, as a kilnd started again gives
// all it holds.
func (d *Daemon) openClusterEvents(ctx context.Context, q eventFilter) (*cluster.EventReader, error) {
	x := d.events.cluster
	if x == nil {
		return nil, nil
	}
	epoch := x.Epoch()
	if !x.Ready() || d.cluster.Status().State != "connected" {
		if cluster.IsClusterEpoch(q.epoch) {
			return nil, fmt.Errorf("%w: epoch %s: the events after %d are the cluster's, and this node cannot reach the cluster now: ask another node, or again later (without after and epoch, this node gives its own events, under epoch %s)",
				errdefs.ErrUnavailable, api.Clip(q.epoch), q.after, d.events.epoch)
		}
		return nil, nil
	}
	after := q.after
	if q.epoch != "" && q.epoch != epoch {
		after = 0
	}
	rd, err := x.OpenReader(ctx, uint64(after), q.follow)
	if err != nil && !cluster.IsClusterEpoch(q.epoch) {
		return nil, nil // lost meanwhile: this node's own
	}
	return rd, err
}

// eventsFlushEvery bounds how many events an NDJSON reader catching up
// is sent between flushes.
const eventsFlushEvery = 256

// sendClusterEvents sends the events of rd that q keeps, each with send,
// flushing whenever the reader has caught up (and every
// eventsFlushEvery), until ctx ends, kilnd closes, send, flush or the
// stream fails, or (not following) those the stream held are sent. A
// reader whose connection ends resumes from the last seq it was given.
func (d *Daemon) sendClusterEvents(ctx context.Context, q eventFilter, rd *cluster.EventReader, send func(api.Event) error, flush func() error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-d.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	if flush() != nil { // the answer's head, at once
		return
	}
	unflushed := 0
	for {
		e, caughtUp, err := rd.Next(ctx)
		if err != nil {
			flush()
			return
		}
		if q.matches(e) {
			if send(e) != nil {
				return
			}
			unflushed++
		}
		if caughtUp && unflushed > 0 || unflushed >= eventsFlushEvery {
			if flush() != nil {
				return
			}
			unflushed = 0
		}
	}
}

// eventCounter is a counter of the events' publisher's, for GET /metrics.
type eventCounter struct {
	desc *prometheus.Desc
	get  func(cluster.EventStats) int64
}

// eventCounters are what a node's publisher of events did: a lost count
// that grows says its events do not reach the cluster.
func eventCounters() []eventCounter {
	return []eventCounter{
		{prometheus.NewDesc("kilnd_events_published_total", "Events of this kilnd's stored in the cluster's stream of events.", nil, nil), func(s cluster.EventStats) int64 { return s.Published }},
		{prometheus.NewDesc("kilnd_events_lost_total", "Events of this kilnd's that never reached the cluster (counted in gaps naming the node): its log let them go while NATS could not be reached.", nil, nil), func(s cluster.EventStats) int64 { return s.Lost }},
		{prometheus.NewDesc("kilnd_events_retries_total", "Publishes of events tried again (NATS unreachable, an election, a timeout).", nil, nil), func(s cluster.EventStats) int64 { return s.Retries }},
	}
}
