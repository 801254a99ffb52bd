// Previews across the cluster: every node's previews' host serves every
// preview. A request for a preview this node does not serve goes to the
// node that does, whose API serves it as its previews' host would
// (cluster.ForwardPreview); the cluster's bucket of previews says which
// node that is. A preview made through a node has a URL of that node's.

package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

func (l clusterLocal) Previews() []cluster.PreviewRoute {
	d := l.d
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []cluster.PreviewRoute
	for _, e := range d.sandboxes {
		if e.rec.State == StateDeleted {
			continue
		}
		for _, p := range e.rec.Previews {
			out = append(out, cluster.PreviewRoute{ID: p.ID, Sandbox: e.rec.ID, ExpiresAt: p.ExpiresAt})
		}
	}
	return out
}

// publishPreview writes preview id of sandbox, just made here, to the
// cluster, if d is in one.
func (d *Daemon) publishPreview(ctx context.Context, id, sandbox string, expires time.Time) {
	if d.cluster != nil {
		d.cluster.PublishPreview(context.WithoutCancel(ctx), cluster.PreviewRoute{ID: id, Sandbox: sandbox, ExpiresAt: expires})
	}
}

// forgetPreview removes preview id, revoked here, from the cluster.
func (d *Daemon) forgetPreview(id string) {
	if d.cluster != nil {
		d.cluster.ForgetPreview(context.Background(), id)
	}
}

// previewOnOtherNode serves r, a request to preview id's host that no
// preview of this node's answers, by the node that serves preview id.
// It reports whether it served r: not when no other node serves it.
func (d *Daemon) previewOnOtherNode(w http.ResponseWriter, r *http.Request, id string) bool {
	n := d.cluster
	if n == nil {
		return false
	}
	node, found := n.PreviewNode(id)
	if !found || node.Name == n.Name() {
		return false
	}
	if node.State != api.NodeReady && node.State != api.NodeDraining {
		reply.Error(w, errdefs.New(errdefs.ErrUnavailable, "this preview's sandbox is on a node that does not answer now"))
		return true
	}
	n.ForwardPreview(w, r, node, id)
	return true
}

// previewFromNode serves r if it is a preview's request another node
// forwarded (cluster.ForwardPreview): to the API's listener, with the
// cluster's token, naming the preview. It is served as that preview's
// host would serve it, and nothing else is: no route of the API. It
// reports whether r was one.
func (d *Daemon) previewFromNode(w http.ResponseWriter, r *http.Request) bool {
	if !d.previewForwarded(r) {
		return false
	}
	id := r.Header.Get(cluster.PreviewHeader)
	if err := d.authorized(r); err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="kilnd"`)
		reply.Error(w, err)
		return true
	}
	if !previewID(id) {
		reply.Error(w, fmt.Errorf("%w: header %s %q: want a preview's id, 8 to 32 lower-case hex digits", errdefs.ErrInvalidArgument, cluster.PreviewHeader, api.Clip(id)))
		return true
	}
	if !strings.HasPrefix(r.URL.Path, previewPrefix) {
		reply.Error(w, errdefs.New(errdefs.ErrNotFound, "a preview's host serves "+previewPrefix+"TOKEN/ alone (no route "+api.Clip(r.URL.Path)+")"))
		return true
	}
	if p := r.URL.EscapedPath(); path.Clean(p) != strings.TrimSuffix(p, "/") {
		reply.Error(w, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("path %s is not clean (no \"..\", \".\" or empty segment)", api.Clip(p))))
		return true
	}
	// The cluster's token and kilnd's own headers stop here: the app
	// has the request as the previews' host of its own node gives it.
	r = r.Clone(r.Context())
	r.Header.Del("Authorization")
	r.Header.Del(cluster.PreviewHeader)
	r.Header.Del(cluster.ForwardedHeader)
	r.Header.Del(api.PrefixHeader)
	d.servePreviewOf(w, r, id, true)
	return true
}

// previewForwarded says r is a preview's request another node forwarded
// (cluster.ForwardPreview), to be served as a preview's host serves it.
func (d *Daemon) previewForwarded(r *http.Request) bool {
	return d.cluster != nil && r.Header.Get(cluster.PreviewHeader) != "" && r.Header.Get(cluster.ForwardedHeader) != ""
}

// forwardPreviewCreate forwards r, a create of a preview of sandbox sb of
// node to, there, and gives the preview made a URL of this node's
// previews' host, which serves it as every node does: the URL its
// caller can reach, as it reached this node.
func (d *Daemon) forwardPreviewCreate(w http.ResponseWriter, r *http.Request, sb string, to api.Node, tcp bool) {
	authority, err := d.previewAuthority(r, tcp)
	if err != nil {
		// No URL of this node's: the other node's, as it made it.
		d.cluster.Forward(w, r, to)
		return
	}
	rec := &bodyRecorder{header: http.Header{}}
	d.cluster.Forward(rec, r, to)
	var p api.Preview
	if rec.code != http.StatusCreated || json.Unmarshal(rec.body.Bytes(), &p) != nil || !previewID(p.ID) || p.Token == "" {
		copyAnswer(w, rec)
		return
	}
	p.URL = previewURL(p.ID, authority, p.Token)
	d.cluster.RememberPreview(cluster.PreviewRoute{ID: p.ID, Node: to.Name, Sandbox: sb, ExpiresAt: p.ExpiresAt})
	reply.JSON(w, http.StatusCreated, p)
}
