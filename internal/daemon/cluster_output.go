// Output that outlives its node: in a cluster, each process's output is
// exported to JetStream as it is produced (outexport), and a node whose
// owner is gone serves it from there.

package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/outexport"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// purgeWithin bounds how long a deleted sandbox's output is tried to be
// purged from JetStream while it is unreachable.
const purgeWithin = 10 * time.Minute

// startExport makes the exporter of d's node, on a NATS connection of its
// own: bulk output must not delay the node's heartbeats.
func (d *Daemon) startExport(n *cluster.Node) error {
	conn, err := n.Connect("export")
	if err != nil {
		return fmt.Errorf("cluster: the export's connection: %w", err)
	}
	x, err := outexport.New(outexport.Config{Node: cluster.Token(n.Name()), Conn: conn, Source: outexport.SourceFunc(d.openOutput),
		Log: d.log, Replicas: n.Replicas()})
	if err != nil {
		conn.Close()
		return err
	}
	d.exporter, d.exportConn = x, conn
	return nil
}

// stopExport ends the export (Close).
func (d *Daemon) stopExport() {
	if d.exporter != nil {
		d.exporter.Close()
		d.exportConn.Close()
	}
}

// followAll has the exporter follow every process of d's running
// sandboxes: at the start, for those adopted.
func (d *Daemon) followAll(ctx context.Context) {
	for _, info := range d.List() {
		if info.State != StateRunning {
			continue
		}
		e, err := d.get(info.ID)
		if err != nil {
			continue
		}
		d.mu.Lock()
		p := e.proxy
		d.mu.Unlock()
		if p == nil {
			continue
		}
		var procs []api.Process
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = askAgent(actx, p.Transport, "/exec-stream", &procs)
		cancel()
		if err != nil {
			d.log.Warn("cluster: the processes to export not listed", "sandbox", info.ID, "err", err)
			continue
		}
		for _, proc := range procs {
			d.exporter.Follow(info.ID, proc)
		}
	}
}

// openOutput is the exporter's source: the process's output as its
// sandbox's agent serves it, from the offsets asked, in the mode that
// never holds the process. A sandbox or process gone for good is
// ErrNotFound; one paused or briefly out of reach, another error, which
// the exporter tries again.
func (d *Daemon) openOutput(ctx context.Context, id, pid string, from outexport.Offsets) (outexport.Conn, error) {
	e, err := d.get(id)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	sb, running, paused, state := e.sb, e.proxy != nil, e.agentPaused(), e.rec.State
	d.mu.Unlock()
	switch {
	case state != StateRunning:
		return nil, fmt.Errorf("%w: sandbox %s is %s", errdefs.ErrNotFound, id, state)
	case !running || paused:
		return nil, fmt.Errorf("%w: sandbox %s cannot be read now", errdefs.ErrUnavailable, id)
	}
	q := url.Values{}
	for s, off := range from {
		q.Set(s, strconv.FormatInt(off, 10))
	}
	c, resp, err := websocket.Dial(ctx, "ws://agent/exec-stream/"+url.PathEscape(pid)+"/logs?"+q.Encode(),
		&websocket.DialOptions{HTTPClient: &http.Client{Transport: sandbox.Transport(sb.Dial)}, Subprotocols: []string{api.ProtocolV1}})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("%w: process %s of sandbox %s", errdefs.ErrNotFound, pid, id)
		}
		return nil, err
	}
	c.SetReadLimit(api.FrameHeader + 1<<20)
	return c, nil
}

// purgeOutput removes a deleted sandbox's exported output, in the
// background, trying while JetStream is unreachable.
func (d *Daemon) purgeOutput(id string) {
	if d.exporter == nil {
		return
	}
	d.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), purgeWithin)
		defer cancel()
		go func() {
			select {
			case <-d.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := d.exporter.Purge(ctx, id); err != nil && ctx.Err() == nil {
			d.log.Warn("cluster: a deleted sandbox's output not purged", "sandbox", id, "err", err)
		}
	})
}

// fromCluster serves, for a sandbox whose node is not there to ask, what
// JetStream holds of it: its processes (GET …/exec-stream, each not ended
// node_lost), one process (GET …/exec-stream/{pid}), a process's output
// as kiln.v1 (GET …/exec-stream/{pid}/logs, a WebSocket) and as its log
// (GET …/logs/{pid}, readLostLog), and the list of those logs (GET
// …/logs: every process the copy holds, its one run's completeness). It
// reports whether it served r.
func (d *Daemon) fromCluster(w http.ResponseWriter, r *http.Request, sb api.Sandbox, sub string) bool {
	js := d.cluster.JetStream()
	if js == nil || r.Method != http.MethodGet {
		return false
	}
	if sub == "logs" {
		logs, err := outexport.Logs(r.Context(), js, cluster.Token(sb.Node), sb.ID)
		if err != nil {
			reply.Error(w, err)
			return true
		}
		reply.JSON(w, http.StatusOK, logs)
		return true
	}
	parts := strings.Split(sub, "/")
	if parts[0] == "logs" && len(parts) == 2 {
		parts = []string{"exec-stream", parts[1], "log"} // GET …/logs/{pid}: the same process, read as its log
	} else if parts[0] != "exec-stream" || len(parts) > 3 || len(parts) == 3 && parts[2] != "logs" {
		return false
	}
	procs, err := outexport.Processes(r.Context(), js, cluster.Token(sb.Node), sb.ID, api.SandboxNodeLost)
	if err != nil {
		reply.Error(w, err)
		return true
	}
	if len(parts) == 1 {
		reply.JSON(w, http.StatusOK, procs)
		return true
	}
	pid := parts[1]
	var found *api.Process
	for i := range procs {
		if procs[i].ID == pid || len(pid) >= api.MinIDPrefix && strings.HasPrefix(procs[i].ID, pid) {
			if found != nil {
				reply.Error(w, fmt.Errorf("%w: %s is a prefix of more than one process: give more of the id", errdefs.ErrInvalidArgument, api.Clip(pid)))
				return true
			}
			found = &procs[i]
		}
	}
	if found == nil {
		reply.Error(w, fmt.Errorf("%w: no process %q in the cluster's copy of sandbox %s", errdefs.ErrNotFound, api.Clip(pid), api.ShortID(sb.ID)))
		return true
	}
	if len(parts) == 2 {
		reply.JSON(w, http.StatusOK, found)
		return true
	}
	if parts[2] == "log" {
		d.readLostLog(w, r, sb, found.ID)
		return true
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		reply.Error(w, fmt.Errorf("%w: sandbox %s's node %s is gone: its output is read from the cluster as kiln.v1 (a WebSocket), or as its log (GET /sandboxes/%s/logs/%s)",
			errdefs.ErrFailedPrecondition, api.ShortID(sb.ID), sb.Node, api.ShortID(sb.ID), api.ShortID(found.ID)))
		return true
	}
	d.relayFromCluster(w, r, sb, found.ID)
	return true
}

// relayFromCluster serves process pid's output from JetStream on a
// kiln.v1 WebSocket, from the offsets the query gives, to where
// JetStream's copy ends. A watcher that grants credit (credit=N) is sent
// no more than it granted; acks and releases are read and need nothing
// here: nothing is held.
func (d *Daemon) relayFromCluster(w http.ResponseWriter, r *http.Request, sb api.Sandbox, pid string) {
	q := r.URL.Query()
	from := outexport.Offsets{}
	for _, s := range []string{"stdout", "stderr", "terminal"} {
		if v := q.Get(s); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				reply.Error(w, fmt.Errorf("%w: %s %q: want an offset, 0 or more", errdefs.ErrInvalidArgument, s, api.Clip(v)))
				return
			}
			from[s] = n
		}
	}
	credit := int64(-1) // no credit asked: unbounded
	if v := q.Get("credit"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < api.CreditFrame || n > api.MaxCredit {
			reply.Error(w, fmt.Errorf("%w: credit %q: want %d to %d", errdefs.ErrInvalidArgument, api.Clip(v), api.CreditFrame, api.MaxCredit))
			return
		}
		credit = n
	}
	ctx := r.Context()
	rd, err := outexport.NewReader(ctx, d.cluster.JetStream(), cluster.Token(sb.Node), sb.ID, pid, outexport.ReadOptions{From: from})
	if err != nil {
		reply.Error(w, err)
		return
	}
	defer rd.CloseNow()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{api.ProtocolV1}, InsecureSkipVerify: true})
	if err != nil {
		return
	}
	defer c.CloseNow()
	if c.Subprotocol() != api.ProtocolV1 {
		c.Close(websocket.StatusPolicyViolation, "kiln.v1 only")
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Credit the watcher grants, added up as it comes; wake says more came.
	var granted atomic.Int64
	wake := make(chan struct{}, 1)
	go func() {
		defer cancel()
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			var m struct {
				Type  string `json:"type"`
				Bytes int64  `json:"bytes"`
			}
			if typ == websocket.MessageText && json.Unmarshal(b, &m) == nil && m.Type == api.TypeCredit && m.Bytes > 0 {
				granted.Add(m.Bytes)
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}
	}()
	for {
		typ, b, err := rd.Read(ctx)
		if err != nil {
			break
		}
		if typ == websocket.MessageBinary && credit >= 0 {
			cost := max(int64(len(b)-api.FrameHeader), api.CreditFrame)
			for credit += granted.Swap(0); credit < cost; credit += granted.Swap(0) {
				select {
				case <-wake:
				case <-ctx.Done():
					return
				}
			}
			credit -= cost
		}
		if err := c.Write(ctx, typ, b); err != nil {
			return
		}
	}
	// Where the cluster's copy ends: the rest never reached it, or is
	// still to come from a node that comes back.
	c.Close(websocket.StatusNormalClosure, "")
}
