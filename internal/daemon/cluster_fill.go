// Output a live node's ring no longer holds, taken from the cluster's
// copy: a watcher that asks for offsets older than what the process's
// agent retains is given them from JetStream, then the rest from the
// agent, as one sequence.

package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/outexport"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// fillRounds bounds how often a filled read goes back to JetStream for
// bytes the ring evicted while it read there: a process that outruns
// both is told of a gap after that.
const fillRounds = 3

// filled is a live process's output, as kiln.v1 messages, for a watcher
// that asked for offsets older than its agent retains: a hello with the
// spans of both, the cluster's copy up to where the agent's span begins,
// then the agent's stream from where the copy got. Neither repeats what
// the other gave, and what neither holds is a gap of its exact count.
// Read is called from one goroutine at a time; Close once, at the end.
type filled struct {
	js      *outexport.Reader // while the copy is read; nil after
	agent   *websocket.Conn   // once the agent's stream took over
	dial    func(ctx context.Context, from map[string]int64) (*websocket.Conn, error)
	reopen  func(ctx context.Context, from map[string]int64) (*outexport.Reader, error)
	onAgent func(*websocket.Conn) // told when the agent's stream takes over, before it is read
	hello   []byte                // the first message, until read
	// pos is where each stream stands; upTo, where the agent's span
	// begins: the copy is read until every stream is there.
	pos, upTo map[string]int64
	rounds    int
	// run is the copy's run (outexport.Reader.Run), when there is a
	// copy; exited says the process had exited when the agent was asked.
	run    string
	exited bool
}

// stored is when the cluster stored the message the last Read's came of
// (outexport.Reader.Stored); zero for the agent's.
func (f *filled) stored() time.Time {
	if f.js != nil {
		return f.js.Stored()
	}
	return time.Time{}
}

// openFilled opens process ref's output, of sandbox id running on this
// node, from offsets from (each of its streams not there from 0), with
// the cluster's copy before what its agent holds. It returns nil, and no
// error, when there is nothing to fill: kilnd not in a cluster, an agent
// that retains all asked for, a copy that holds none of it, or either
// of them that cannot say. query is what the agent is asked with besides
// the offsets; credit, when set, says how much output the agent may be
// given leave to send when it takes over (api.CreditFrame or more).
// always makes it the agent's stream alone, rather than nil, when there is
// nothing to fill.
func (d *Daemon) openFilled(ctx context.Context, e *entry, ref string, from map[string]int64, query url.Values,
	credit func(context.Context) (int64, error), always bool) (*filled, error) {
	if d.exporter == nil || d.cluster == nil || d.cluster.JetStream() == nil {
		return nil, nil
	}
	d.mu.Lock()
	sb, p, id := e.sb, e.proxy, e.rec.ID
	d.mu.Unlock()
	if p == nil {
		return nil, nil
	}
	var ret handoff.Retained
	if err := askAgent(ctx, p.Transport, handoff.RetainedPath+url.PathEscape(ref), &ret); err != nil || ret.Process == "" {
		return nil, nil // an agent of before, or none to ask: it says what it lacks itself
	}
	f := &filled{pos: map[string]int64{}, upTo: map[string]int64{}, exited: ret.Exited}
	behind := false
	for s, span := range ret.Streams {
		f.pos[s], f.upTo[s] = from[s], span.First
		behind = behind || from[s] < span.First
	}
	if !behind && !always {
		return nil, nil
	}
	f.reopen = func(ctx context.Context, from map[string]int64) (*outexport.Reader, error) {
		js := d.cluster.JetStream()
		if js == nil {
			return nil, errors.New("cluster: not reached")
		}
		return outexport.NewReader(ctx, js, cluster.Token(d.cluster.Name()), id, ret.Process, outexport.ReadOptions{From: from})
	}
	var jh api.Hello
	if behind {
		js, err := f.reopen(ctx, f.pos)
		if err == nil {
			var typ websocket.MessageType
			var b []byte
			typ, b, err = js.Read(ctx)
			if err == nil && (typ != websocket.MessageText || json.Unmarshal(b, &jh) != nil || jh.Type != api.TypeHello) {
				err = errors.New("daemon: the cluster's copy did not begin with its hello")
			}
			if err != nil {
				js.CloseNow()
			}
		}
		switch {
		case err == nil:
			f.js = js
			f.run, _ = js.Run()
		case !always:
			return nil, nil
		}
	}
	h := api.Hello{Type: api.TypeHello, Streams: map[string]api.HelloSpan{}}
	for s, span := range ret.Streams {
		if c, ok := jh.Streams[s]; ok && c.First < span.First {
			span.First = c.First
		}
		h.Streams[s] = span
	}
	f.hello, _ = json.Marshal(h)
	agentOpts := &websocket.DialOptions{HTTPClient: &http.Client{Transport: sandbox.Transport(sb.Dial)}, Subprotocols: []string{api.ProtocolV1}}
	f.dial = func(ctx context.Context, from map[string]int64) (*websocket.Conn, error) {
		q := url.Values{}
		for k, v := range query {
			q[k] = v
		}
		for s, off := range from {
			q.Set(s, strconv.FormatInt(off, 10))
		}
		if credit != nil {
			n, err := credit(ctx)
			if err != nil {
				return nil, err
			}
			q.Set("credit", strconv.FormatInt(n, 10))
		}
		c, _, err := websocket.Dial(ctx, "ws://agent/exec-stream/"+url.PathEscape(ret.Process)+"/logs?"+q.Encode(), agentOpts)
		if err != nil {
			return nil, unreachable(id, err)
		}
		c.SetReadLimit(api.FrameHeader + 1<<20)
		return c, nil
	}
	return f, nil
}

// Read returns the next message: the hello, the copy's frames and gaps
// (its ends and exit left to the agent, which has them too), then the
// agent's messages after its hello.
func (f *filled) Read(ctx context.Context) (websocket.MessageType, []byte, error) {
	if h := f.hello; h != nil {
		f.hello = nil
		return websocket.MessageText, h, nil
	}
	for {
		switch {
		case f.agent != nil:
			return f.agent.Read(ctx)
		case f.js != nil && !f.reached():
			typ, b, err := f.js.Read(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return 0, nil, ctx.Err()
				}
				// The copy's end, or JetStream failing: what the agent
				// lacks from here, it says.
				f.closeJS()
				continue
			}
			if typ, b, ok := f.fromCopy(typ, b); ok {
				return typ, b, nil
			}
		case f.js != nil:
			f.closeJS()
		default:
			if err := f.takeOver(ctx); err != nil {
				return 0, nil, err
			}
		}
	}
}

// reached reports whether every stream got to where the agent's span
// begins.
func (f *filled) reached() bool {
	for s, to := range f.upTo {
		if f.pos[s] < to {
			return false
		}
	}
	return true
}

// fromCopy passes on a message of the copy's: a frame, or a gap up to
// where the agent's span begins (past it, the agent has the bytes).
func (f *filled) fromCopy(typ websocket.MessageType, b []byte) (websocket.MessageType, []byte, bool) {
	if typ == websocket.MessageBinary {
		fr, err := api.ParseFrame(b)
		if err != nil {
			return 0, nil, false
		}
		s := api.StreamNames[fr.Stream]
		if _, ok := f.upTo[s]; !ok {
			return 0, nil, false
		}
		f.pos[s] = int64(fr.Offset) + int64(len(fr.Data))
		return typ, b, true
	}
	var g api.Gap
	if json.Unmarshal(b, &g) != nil || g.Type != api.TypeGap {
		return 0, nil, false // the hello, ends and exit: the agent's
	}
	to, ok := f.upTo[g.Stream]
	if !ok || g.From != f.pos[g.Stream] || g.From >= to {
		return 0, nil, false
	}
	g.To = min(g.To, to)
	g.LostBytes = g.To - g.From
	f.pos[g.Stream] = g.To
	out, _ := json.Marshal(g)
	return websocket.MessageText, out, true
}

func (f *filled) closeJS() {
	f.js.CloseNow()
	f.js = nil
}

// takeOver opens the agent's stream from where the copy got. Should the
// ring have moved past that meanwhile (its hello says where it begins
// now), the copy is read again up to there first, fillRounds times at
// most.
func (f *filled) takeOver(ctx context.Context) error {
	c, err := f.dial(ctx, f.pos)
	if err != nil {
		return err
	}
	typ, b, err := c.Read(ctx)
	var h api.Hello
	if err != nil || typ != websocket.MessageText || json.Unmarshal(b, &h) != nil || h.Type != api.TypeHello {
		c.CloseNow()
		if err == nil {
			err = errors.New("daemon: the agent's stream did not begin with its hello")
		}
		return err
	}
	behind := false
	for s, span := range h.Streams {
		if _, ok := f.upTo[s]; ok && f.pos[s] < span.First {
			f.upTo[s], behind = span.First, true
		}
	}
	if behind && f.rounds < fillRounds {
		f.rounds++
		if js, err := f.reopen(ctx, f.pos); err == nil {
			c.CloseNow()
			f.js = js
			return nil
		}
	}
	f.agent = c
	if f.onAgent != nil {
		f.onAgent(c)
	}
	return nil
}

// Close ends what is open.
func (f *filled) Close() {
	if f.js != nil {
		f.closeJS()
	}
	if f.agent != nil {
		f.agent.CloseNow()
	}
}

// attachFilled serves a kiln.v1 watcher of a process of e's sandbox who
// asks for offsets older than its agent retains, in a cluster: from the
// cluster's copy, then from the agent (filled). It reports false, having
// answered nothing, when the request is not one it serves (then it is
// relayed to the agent as ever): outside a cluster, a watcher that
// writes input or holds the output (flow=block), or one whose offsets
// the agent retains.
func (d *Daemon) attachFilled(w http.ResponseWriter, r *http.Request, e *entry) bool {
	if d.exporter == nil {
		return false
	}
	path, _ := agentPath(r.URL)
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if len(parts) != 3 || parts[0] != "exec-stream" || parts[2] != "logs" || !offersV1(r) {
		return false
	}
	q := r.URL.Query()
	if stdin, _ := strconv.ParseBool(q.Get("stdin")); stdin || q.Get("flow") == api.FlowBlock {
		return false
	}
	from := map[string]int64{}
	for _, s := range []string{"stdout", "stderr", "terminal"} {
		if v := q.Get(s); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return false // the agent refuses it
			}
			from[s] = n
		}
		q.Del(s)
	}
	granted := int64(-1) // no credit asked: unbounded
	if v := q.Get("credit"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < api.CreditFrame || n > api.MaxCredit {
			return false
		}
		granted = n
	}
	q.Del("credit")
	cr := &watcherCredit{avail: granted, wake: make(chan struct{})}
	var credit func(context.Context) (int64, error)
	if granted >= 0 {
		credit = cr.lease
	}
	ctx := r.Context()
	f, err := d.openFilled(ctx, e, parts[1], from, q, credit, false)
	if err != nil || f == nil {
		return false
	}
	defer f.Close()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{api.ProtocolV1}, InsecureSkipVerify: true})
	if err != nil {
		return true
	}
	defer c.CloseNow()
	d.metrics.wsOpened.WithLabelValues(wsOutput).Inc()
	open := d.metrics.wsOpen.WithLabelValues(wsOutput)
	open.Inc()
	defer open.Dec()
	c.SetReadLimit(api.MaxWSClient)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The watcher's messages: its credit is counted here while the copy
	// is read; once the agent's stream takes over, they go to the agent,
	// with the credit granted meanwhile.
	f.onAgent = func(agent *websocket.Conn) { cr.handOver(ctx, agent) }
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		defer cancel()
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if to := cr.take(typ, b); to != nil && to.Write(ctx, typ, b) != nil {
				return
			}
		}
	})
	for {
		typ, b, err := f.Read(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) || websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				c.Close(websocket.StatusNormalClosure, "")
			} else if st := websocket.CloseStatus(err); st != -1 {
				c.Close(st, "")
			}
			return true
		}
		if typ == websocket.MessageBinary && !cr.agentHas() {
			if !cr.spend(ctx, c, b) {
				return true
			}
			continue
		}
		if writeMessage(ctx, c, typ, b) != nil {
			return true
		}
	}
}

// offersV1 reports whether r's WebSocket handshake offers kiln.v1.
func offersV1(r *http.Request) bool {
	for _, p := range offeredProtocols(r) {
		if p == api.ProtocolV1 {
			return true
		}
	}
	return false
}

// writeMessage writes one message to a watcher, within relayWriteTimeout.
func writeMessage(ctx context.Context, c *websocket.Conn, typ websocket.MessageType, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, relayWriteTimeout)
	defer cancel()
	return c.Write(ctx, typ, b)
}

// watcherCredit is a filled watcher's credit (credit=N): what it granted
// and was not yet sent, spent here on the copy's frames; once the agent
// takes over, the agent counts it, given what is left (lease, handOver).
type watcherCredit struct {
	// mu guards the fields below; wake is closed and replaced when a
	// grant comes.
	mu     sync.Mutex
	avail  int64 // -1: the watcher grants none, all is sent
	leased int64 // what the agent was told it may send, at its dial
	agent  *websocket.Conn
	wake   chan struct{}
}

// take takes a watcher's message: a grant while the copy is read, or,
// once the agent took over, the agent to pass it to. Other messages
// before then hold nothing to act on (the watcher neither writes input
// nor holds output) and are dropped.
func (c *watcherCredit) take(typ websocket.MessageType, b []byte) *websocket.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.agent != nil {
		return c.agent
	}
	var m api.ClientMessage
	if c.avail >= 0 && typ == websocket.MessageText && json.Unmarshal(b, &m) == nil && m.Type == api.TypeCredit && m.Bytes > 0 {
		c.avail = min(c.avail+m.Bytes, api.MaxCredit)
		close(c.wake)
		c.wake = make(chan struct{})
	}
	return nil
}

func (c *watcherCredit) agentHas() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.agent != nil
}

// wait waits until a frame may be sent, and returns what may be.
func (c *watcherCredit) wait(ctx context.Context) (int64, error) {
	for {
		c.mu.Lock()
		avail, wake := c.avail, c.wake
		c.mu.Unlock()
		if avail < 0 || avail >= api.CreditFrame {
			return avail, nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// lease is what the agent may send when it takes over: all that is
// granted now, once that is a frame's worth.
func (c *watcherCredit) lease(ctx context.Context) (int64, error) {
	n, err := c.wait(ctx)
	c.mu.Lock()
	c.leased = n
	c.mu.Unlock()
	return n, err
}

// handOver makes the agent the one the watcher's messages go to, and
// grants it what was granted after its lease.
func (c *watcherCredit) handOver(ctx context.Context, agent *websocket.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.agent = agent
	if c.avail > c.leased && c.leased > 0 {
		b, _ := json.Marshal(api.ClientMessage{Type: api.TypeCredit, Bytes: c.avail - c.leased})
		c.agent.Write(ctx, websocket.MessageText, b)
	}
}

// spend sends a frame of the copy's to the watcher, in pieces as its
// credit allows: each piece costs its length or api.CreditFrame, and
// keeps its offset and seq.
func (c *watcherCredit) spend(ctx context.Context, to *websocket.Conn, b []byte) bool {
	fr, err := api.ParseFrame(b)
	if err != nil {
		return false
	}
	for rest := fr; ; {
		avail, err := c.wait(ctx)
		if err != nil {
			return false
		}
		n := len(rest.Data)
		if avail >= 0 {
			n = int(min(int64(n), avail))
			c.mu.Lock()
			c.avail -= max(int64(n), api.CreditFrame)
			c.mu.Unlock()
		}
		piece := rest
		piece.Data = rest.Data[:n]
		if writeMessage(ctx, to, websocket.MessageBinary, api.AppendFrame(make([]byte, 0, api.FrameHeader+n), piece)) != nil {
			return false
		}
		rest.Data, rest.Offset, rest.Seq = rest.Data[n:], rest.Offset+uint64(n), rest.Seq+uint64(n)
		if len(rest.Data) == 0 {
			return true
		}
	}
}
