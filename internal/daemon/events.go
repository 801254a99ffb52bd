package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/seqlog"
)

// eventsKept is how many events kilnd holds for readers that come back: a
// reader further behind is told how many it lost.
const eventsKept = 16384

// events is kilnd's log of what happened to its sandboxes, numbered from
// 1, the last eventsKept of them held, under the epoch of this kilnd.
type events struct {
	epoch string
	log   *seqlog.Log[api.Event]
	// node is kilnd's node in a cluster, which every event names once it
	// has joined.
	node atomic.Pointer[string]
	// cluster publishes the events to the cluster's stream, on conn, and
	// reads that stream for GET /events (cluster_events.go); nil outside
	// a cluster. Set as kilnd joins, before it serves.
	cluster *cluster.Events
	conn    *nats.Conn
}

func newEvents() *events {
	b := make([]byte, 8)
	rand.Read(b)
	return &events{epoch: hex.EncodeToString(b), log: seqlog.New[api.Event](eventsKept)}
}

// emit adds an event, numbering it, and wakes every reader.
func (l *events) emit(e api.Event) {
	l.log.Append(func(seq int64) api.Event {
		e.Seq, e.Time, e.Epoch = seq, time.Now().UTC(), l.epoch
		if n := l.node.Load(); n != nil {
			e.Node = *n
		}
		return e
	})
}

// after returns the events held after seq, a gap first if some after it
// are no longer held, and a channel closed at the next event.
func (l *events) after(seq int64) ([]api.Event, <-chan struct{}) {
	evs, lost, _, wake := l.log.After(seq)
	if lost > 0 {
		gap := api.Event{Type: api.EventGap, Seq: seq + lost, Lost: lost, Epoch: l.epoch, Time: time.Now().UTC()}
		evs = append([]api.Event{gap}, evs...)
	}
	return evs, wake
}

// sandboxEvent is the event of type typ of e's sandbox.
func sandboxEvent(typ string, rec record) api.Event {
	e := api.Event{Type: typ, Sandbox: rec.ID, Name: rec.Name}
	if typ == api.EventStopped || typ == api.EventDeleted {
		e.Reason, e.Exit = rec.Reason, rec.Exit
	}
	return e
}

// eventsHandler answers GET /events: NDJSON, one event a line, those held
// after ?after= (0, the default: from the oldest held), then each as it
// happens until the reader goes (or, with ?follow=false, the end of those
// held). ?sandbox= keeps one sandbox's (by id), ?type= one type's,
// ?node= one cluster node's;
// ?epoch=, the epoch of the event after= numbers, tells a kilnd started
// since (another epoch) to give all it holds. In a cluster, the events
// are the cluster's stream's, every node's (openClusterEvents).
func (d *Daemon) eventsHandler(w http.ResponseWriter, r *http.Request) {
	q, err := eventQuery(r.URL.Query())
	if err == nil {
		q.cluster, err = d.openClusterEvents(r.Context(), q)
	}
	if err != nil {
		reply.Error(w, err)
		return
	}
	if q.cluster != nil {
		defer q.cluster.Close()
	}
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		d.eventsSocket(w, r, q)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	d.sendEvents(r.Context(), q, func(e api.Event) error { return enc.Encode(e) }, rc.Flush)
}

// sendEvents sends the events q asks for, each with send, and flush after
// each batch, until ctx ends, kilnd closes, send or flush fails, or (not
// following) those held are sent.
func (d *Daemon) sendEvents(ctx context.Context, q eventFilter, send func(api.Event) error, flush func() error) {
	if q.cluster != nil {
		d.sendClusterEvents(ctx, q, q.cluster, send, flush)
		return
	}
	seq := q.after
	if q.epoch != "" && q.epoch != d.events.epoch {
		seq = 0
	}
	for {
		evs, wake := d.events.after(seq)
		for _, e := range evs {
			seq = e.Seq
			if !q.matches(e) {
				continue
			}
			if err := send(e); err != nil {
				return
			}
		}
		if err := flush(); err != nil || !q.follow {
			return
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return
		case <-d.closing:
			return
		}
	}
}

// eventsPing is how often a WebSocket of events is pinged: a reader gone
// without a word is noticed within it, while no event comes.
const eventsPing = 30 * time.Second

// eventsSocket serves GET /events as a WebSocket (kiln.events): the same
// events, one a text message; with follow=false the connection closes
// with 1000 once those held are sent. The client sends nothing.
func (d *Daemon) eventsSocket(w http.ResponseWriter, r *http.Request, q eventFilter) {
	protocols := []string{api.ProtocolEvents}
	// A browser that offered only its token is answered with it, as
	// kilnd's other WebSockets do.
	for _, p := range offeredProtocols(r) {
		if isTokenProtocol(p) {
			protocols = append(protocols, p)
		}
	}
	// The origin was checked before any handler (originAllowed).
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: protocols, InsecureSkipVerify: true})
	if err != nil {
		return // Accept has answered
	}
	defer c.CloseNow()
	ctx, cancel := context.WithCancel(c.CloseRead(r.Context()))
	defer cancel()
	go func() {
		t := time.NewTicker(eventsPing)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				pctx, pcancel := context.WithTimeout(ctx, eventsPing)
				err := c.Ping(pctx)
				pcancel()
				if err != nil {
					cancel()
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	send := func(e api.Event) error {
		b, _ := json.Marshal(e)
		wctx, wcancel := context.WithTimeout(ctx, eventsPing)
		defer wcancel()
		return c.Write(wctx, websocket.MessageText, b)
	}
	d.sendEvents(ctx, q, send, func() error { return nil })
	if !q.follow && ctx.Err() == nil {
		c.Close(websocket.StatusNormalClosure, "the events held were sent")
	}
}

// eventFilter is what GET /events asks for.
type eventFilter struct {
	after int64
	// epoch is the kilnd that numbered after: another's numbers are not
	// this one's, whose events are all given.
	epoch         string
	sandbox, kind string
	// node keeps a cluster node's events; outside a cluster, whose
	// events have no node, it keeps none (as GET /sandboxes?node=).
	node   string
	follow bool
	// cluster, when set, reads the cluster's events (in place of this
	// kilnd's own).
	cluster *cluster.EventReader
}

func (f eventFilter) matches(e api.Event) bool {
	if e.Type == api.EventGap {
		return true // a reader is told what it lost, whatever it chose
	}
	return (f.sandbox == "" || e.Sandbox == f.sandbox) && (f.kind == "" || e.Type == f.kind) && (f.node == "" || e.Node == f.node)
}

func eventQuery(q url.Values) (eventFilter, error) {
	f := eventFilter{follow: true}
	for k, vs := range q {
		v := vs[0]
		var err error
		switch k {
		case "after":
			f.after, err = strconv.ParseInt(v, 10, 64)
			if err != nil || f.after < 0 {
				err = fmt.Errorf("after %q: want the seq of the last event read, 0 or more", api.Clip(v))
			}
		case "sandbox":
			f.sandbox = v
		case "epoch":
			f.epoch = v
		case "node":
			f.node = v
		case "type":
			if !slices.Contains(api.EventTypes, v) {
				err = fmt.Errorf("type %q: want one of %s", api.Clip(v), strings.Join(api.EventTypes, ", "))
			}
			f.kind = v
		case "follow":
			f.follow, err = strconv.ParseBool(v)
			if err != nil {
				err = fmt.Errorf("follow %q: want true or false", api.Clip(v))
			}
		default:
			err = fmt.Errorf("no events parameter %q: want after, epoch, sandbox, type, node or follow", api.Clip(k))
		}
		if err != nil {
			return eventFilter{}, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
		}
	}
	return f, nil
}
