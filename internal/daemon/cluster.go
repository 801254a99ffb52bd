// Clustering: a kilnd among others (kilnd --cluster). Every route answers
// on every node: what names another node's sandbox is forwarded to that
// node, lists take in the whole cluster, creates are placed.

package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// ClusterTokenName is the file in the state directory holding the
// cluster's API token, which every node of the cluster accepts.
const ClusterTokenName = "cluster-token"

// joinCluster makes d a node of the cluster cfg describes (Config.Cluster),
// as Serve starts. d's sandboxes are written to the cluster as they change.
func (d *Daemon) joinCluster(cfg cluster.Config) error {
	// The token this node last had from its cluster is accepted while
	// the cluster is reached again.
	if b, err := os.ReadFile(filepath.Join(d.cfg.StateDir, ClusterTokenName)); err == nil {
		if tok := strings.TrimSpace(string(b)); len(tok) >= 32 {
			d.clusterToken.Store(&tok)
		}
	}
	if cfg.Log == nil {
		cfg.Log = d.log
	}
	n, err := cluster.Join(cfg, clusterLocal{d}, d.acceptClusterToken)
	if err != nil {
		return err
	}
	d.cluster = n
	name := n.Name()
	d.nodeName.Store(&name)
	if err := d.startExport(n); err != nil {
		n.Close()
		d.cluster = nil
		return err
	}
	if err := d.startClusterEvents(n); err != nil {
		d.stopExport()
		n.Close()
		d.cluster = nil
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	d.clusterStop = cancel
	d.wg.Go(func() { d.publishToCluster(ctx) })
	return nil
}

// Cluster is d's node, nil outside a cluster.
func (d *Daemon) Cluster() *cluster.Node { return d.cluster }

// leaveCluster ends d's membership (Close).
func (d *Daemon) leaveCluster() {
	if d.cluster != nil {
		d.stopClusterEvents()
		d.stopExport()
		d.cluster.Close()
	}
}

// acceptClusterToken makes tok, the cluster's API token, one d accepts,
// and keeps it where a node's clients find it.
func (d *Daemon) acceptClusterToken(tok string) {
	d.clusterToken.Store(&tok)
	path := filepath.Join(d.cfg.StateDir, ClusterTokenName)
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == tok {
		return
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(tok+"\n"), 0o600); err != nil {
		d.log.Warn("cluster token not kept", "err", err)
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		d.log.Warn("cluster token not kept", "err", err)
	}
}

// clusterLocal is what the cluster asks of d.
type clusterLocal struct{ d *Daemon }

func (l clusterLocal) Sandboxes() []api.Sandbox { return l.d.List() }

func (l clusterLocal) Load() api.Node {
	d := l.d
	d.mu.Lock()
	running := 0
	for _, id := range d.live {
		if d.sandboxes[id].rec.State == StateRunning {
			running++
		}
	}
	d.mu.Unlock()
	total, avail := meminfo()
	return api.Node{CPUs: runtime.NumCPU(), MemoryBytes: total, FreeMemoryBytes: avail, Sandboxes: running}
}

// meminfo is the host's memory and the part of it available, in bytes.
func meminfo() (total, avail int64) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "MemTotal:":
			total = kb << 10
		case "MemAvailable:":
			avail = kb << 10
		}
	}
	return total, avail
}

// publishToCluster writes each sandbox of d's to the cluster as its
// events tell it changed, until ctx ends.
func (d *Daemon) publishToCluster(ctx context.Context) {
	n := d.cluster
	d.followAll(ctx)
	var seq int64
	for {
		evs, wake := d.events.after(seq)
		for _, ev := range evs {
			seq = ev.Seq
			switch {
			case ev.Type == api.EventGap:
				n.Reconcile(ctx)
			case ev.Sandbox == "":
			case ev.Type == api.EventDeleted:
				n.Forget(ctx, ev.Sandbox, ev.Name)
			case ev.Type == api.EventProcessStarted && ev.Process != nil:
				d.exporter.Follow(ev.Sandbox, *ev.Process)
			default:
				if e, err := d.get(ev.Sandbox); err == nil {
					n.Publish(ctx, d.infoOf(e))
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		}
	}
}

// toOtherNode serves a request naming a sandbox of another node: it is
// forwarded to that node, or, the node being unreachable, answered from
// what the cluster last heard; so is one naming another node's snapshot
// (toSnapshotNode). It reports whether it served r. tcp says r came to
// the API's TCP listener.
func (d *Daemon) toOtherNode(w http.ResponseWriter, r *http.Request, tcp bool) bool {
	n := d.cluster
	if n == nil || r.Header.Get(cluster.ForwardedHeader) != "" {
		return false // a forwarded request is served here, or not at all
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/sandboxes/")
	if !ok {
		return d.toSnapshotNode(w, r)
	}
	ref, sub, _ := strings.Cut(rest, "/")
	if ref == "" {
		return false
	}
	if _, err := d.get(ref); !errors.Is(err, errdefs.ErrNotFound) {
		return false // this node's, or an error of this node's to tell
	}
	sb, node, found, err := n.Resolve(r.Context(), ref)
	if err != nil {
		reply.Error(w, err)
		return true
	}
	if !found {
		return false
	}
	switch {
	case node.State == api.NodeReady || node.State == api.NodeDraining:
		if r.Method == http.MethodPost && sub == "previews" {
			d.forwardPreviewCreate(w, r, sb.ID, node, tcp)
		} else {
			n.Forward(w, r, node)
		}
	case d.fromCluster(w, r, sb, sub):
	case r.Method == http.MethodGet && sub == "":
		reply.JSON(w, http.StatusOK, sb)
	default:
		reply.Error(w, fmt.Errorf("%w: sandbox %s is on node %s, which is %s (last heard from %s ago)", errdefs.ErrUnavailable,
			api.ShortID(sb.ID), node.Name, node.State, time.Since(node.SeenAt).Round(time.Second)))
	}
	return true
}

// placeCreate places a create on the cluster's node for it: when that is
// another node, the create is forwarded there and placeCreate reports
// true, having answered. A kilnd in no cluster takes no node and no
// constraints.
func (d *Daemon) placeCreate(w http.ResponseWriter, r *http.Request, req *CreateRequest) bool {
	n := d.cluster
	if n == nil {
		if req.Node != "" || len(req.Constraints) > 0 {
			field := "node"
			if req.Node == "" {
				field = "constraints"
			}
			reply.Error(w, fmt.Errorf("%w: %s: this kilnd is in no cluster (kilnd --cluster)", errdefs.ErrInvalidArgument, field))
			return true
		}
		return false
	}
	if r.Header.Get(cluster.ForwardedHeader) != "" {
		// Placed by the node that sent it.
		if req.Node != "" && req.Node != n.Name() {
			reply.Error(w, fmt.Errorf("%w: node %s: this is node %s", errdefs.ErrInvalidArgument, api.Clip(req.Node), n.Name()))
			return true
		}
		return false
	}
	var to api.Node
	var err error
	if req.Snapshot != "" {
		to, err = d.placeFromSnapshot(r.Context(), req)
	} else {
		to, err = n.Place(req.Node, req.Constraints)
	}
	if err != nil {
		reply.Error(w, err)
		return true
	}
	if to.Self {
		return false
	}
	req.Node = to.Name
	body, _ := json.Marshal(req)
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	rw := &createdWriter{ResponseWriter: w}
	n.Forward(rw, r, to)
	var sb api.Sandbox
	if rw.code == http.StatusCreated && json.Unmarshal(rw.body.Bytes(), &sb) == nil {
		n.Remember(sb)
	}
	return true
}

// claimClusterName claims req's name across the cluster for a create about to
// be made here; the release it returns gives it back (the create failed)
// or gives it to the sandbox made.
func (d *Daemon) claimClusterName(ctx context.Context, name string) (func(id string), error) {
	n := d.cluster
	if n == nil || name == "" {
		return func(string) {}, nil
	}
	holder := "creating." + n.Name() + "." + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := n.ClaimName(ctx, name, holder); err != nil {
		return nil, err
	}
	return func(id string) {
		if id == "" {
			n.ReleaseName(context.WithoutCancel(ctx), name, holder)
			return
		}
		n.TransferName(context.WithoutCancel(ctx), name, holder, id)
	}, nil
}

// withRemote adds the other nodes' sandboxes s chooses to list, this
// node's, and pages the whole as Select does.
func (d *Daemon) withRemote(list []Info, s Selection) ([]Info, string, error) {
	after, err := parseCursor(s.After)
	if err != nil {
		return nil, "", err
	}
	for _, sb := range d.cluster.Remote() {
		c := cursor{sb.CreatedAt.UnixNano(), sb.ID}
		if s.After != "" && compareCursors(c, after) <= 0 {
			continue
		}
		if s.State != "" && sb.State != s.State || !s.Deleted && sb.State == StateDeleted {
			continue
		}
		if !s.matches(record{ID: sb.ID, Name: sb.Name, Runtime: sb.Runtime, Image: sb.Image, ImageID: sb.ImageID, Labels: sb.Labels}, sb.Node) {
			continue
		}
		list = append(list, sb)
	}
	slices.SortFunc(list, func(a, b Info) int {
		return compareCursors(cursor{a.CreatedAt.UnixNano(), a.ID}, cursor{b.CreatedAt.UnixNano(), b.ID})
	})
	if s.Limit > 0 && len(list) > s.Limit {
		last := list[s.Limit-1]
		return list[:s.Limit], cursor{last.CreatedAt.UnixNano(), last.ID}.String(), nil
	}
	return list, "", nil
}

// Nodes: GET /nodes, GET /nodes/{name}, POST and DELETE
// /nodes/{name}/drain.

func (d *Daemon) clusterOnly() (*cluster.Node, error) {
	if d.cluster == nil {
		return nil, errdefs.New(errdefs.ErrFailedPrecondition, "this kilnd is in no cluster (kilnd --cluster): it has no nodes")
	}
	return d.cluster, nil
}

func (d *Daemon) listNodes(w http.ResponseWriter, r *http.Request) {
	n, err := d.clusterOnly()
	if err != nil {
		reply.Error(w, err)
		return
	}
	nodes := n.Nodes()
	if len(nodes) == 0 {
		// Not even its own heartbeat yet: the cluster has not been
		// reached, which an empty list would hide.
		if err := n.Reached(); err != nil {
			reply.Error(w, err)
			return
		}
		nodes = []api.Node{}
	}
	reply.JSON(w, http.StatusOK, nodes)
}

func (d *Daemon) getNode(w http.ResponseWriter, r *http.Request) {
	n, err := d.clusterOnly()
	if err != nil {
		reply.Error(w, err)
		return
	}
	node, err := n.NodeNamed(r.PathValue("name"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	reply.JSON(w, http.StatusOK, node)
}

func (d *Daemon) drainNode(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, err := d.clusterOnly()
		if err != nil {
			reply.Error(w, err)
			return
		}
		name := r.PathValue("name")
		var req api.DrainRequest
		if on && r.ContentLength != 0 {
			if err := decodeBody(w, r, &req); err != nil {
				reply.Error(w, err)
				return
			}
		}
		if req.MoveStopped && name != n.Name() {
			if r.Header.Get(cluster.ForwardedHeader) != "" {
				reply.Error(w, fmt.Errorf("%w: this is node %s, not %s: it moves its own sandboxes alone", errdefs.ErrInvalidArgument, n.Name(), api.Clip(name)))
				return
			}
			// The node moves its own: it is asked to.
			node, err := n.NodeNamed(name)
			if err != nil {
				reply.Error(w, err)
				return
			}
			if node.State != api.NodeReady && node.State != api.NodeDraining {
				reply.Error(w, fmt.Errorf("%w: node %s is %s: its sandboxes cannot be moved", errdefs.ErrUnavailable, name, node.State))
				return
			}
			body, _ := json.Marshal(req)
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
			r.Header.Set("Content-Length", strconv.Itoa(len(body)))
			n.Forward(w, r, node)
			return
		}
		if err := n.Drain(r.Context(), name, on); err != nil {
			reply.Error(w, err)
			return
		}
		node, err := n.NodeNamed(name)
		if err != nil {
			reply.Error(w, err)
			return
		}
		if req.MoveStopped {
			node.Moved = d.moveStopped(r.Context())
		}
		reply.JSON(w, http.StatusOK, node)
	}
}

// healthz answers GET /healthz: kilnd serves. In a cluster it says too
// whether the cluster is reached (why not, kilnd's log says: this route
// asks no token).
func (d *Daemon) healthz(w http.ResponseWriter, r *http.Request) {
	h := api.Health{Status: "ok"}
	if d.cluster != nil {
		c := d.cluster.Status()
		h.Cluster = &c
	}
	reply.JSON(w, http.StatusOK, h)
}

// readyz answers GET /readyz: 200 when kilnd serves all it should, 503
// while its cluster is down (it serves its own sandboxes meanwhile, not
// the others').
func (d *Daemon) readyz(w http.ResponseWriter, r *http.Request) {
	h := api.Health{Status: "ok"}
	code := http.StatusOK
	if d.cluster != nil {
		c := d.cluster.Status()
		h.Cluster = &c
		if c.State != "connected" {
			h.Status, code = "cluster down", http.StatusServiceUnavailable
		}
	}
	reply.JSON(w, code, h)
}

// createdWriter keeps a create's answer as it passes (a sandbox's
// description, a few KiB) for the node that placed it.
type createdWriter struct {
	http.ResponseWriter
	code int
	body bytes.Buffer
}

func (w *createdWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *createdWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	if w.body.Len()+len(b) <= 1<<20 {
		w.body.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

func (w *createdWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
