// Snapshots across the cluster: each node keeps its own snapshots' files
// and writes their descriptions to the cluster; any node lists them all,
// and what names another node's snapshot is forwarded to that node. A
// sandbox made from a snapshot is made on the node that keeps it.

package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

func (l clusterLocal) Snapshots() []api.Snapshot {
	list, _ := l.d.ListSnapshots("")
	return list
}

// publishSnapshot writes snap, just taken or imported here, to the
// cluster, if d is in one.
func (d *Daemon) publishSnapshot(ctx context.Context, snap api.Snapshot) {
	if d.cluster != nil {
		d.cluster.PublishSnapshot(context.WithoutCancel(ctx), snap)
	}
}

// forgetSnapshot removes snapshot id, removed here, from the cluster.
func (d *Daemon) forgetSnapshot(id string) {
	if d.cluster != nil {
		d.cluster.ForgetSnapshot(context.Background(), id)
	}
}

// ownSnapshot is snap, one of d's, as the API tells it: in a cluster,
// naming this node.
func (d *Daemon) ownSnapshot(snap api.Snapshot) api.Snapshot {
	if d.cluster != nil {
		return d.cluster.OwnSnapshot(snap)
	}
	return snap
}

// snapshotNameTaken refuses a new snapshot's name another node's
// snapshot has, as far as this node has heard (names are checked, not
// claimed: two nodes naming a snapshot alike at one moment both may).
func (d *Daemon) snapshotNameTaken(name string) error {
	if d.cluster == nil || name == "" {
		return nil
	}
	for _, s := range d.cluster.Snapshots() {
		if s.Name == name {
			return fmt.Errorf("%w: a snapshot named %q exists on node %s", errdefs.ErrAlreadyExists, name, s.Node)
		}
	}
	return nil
}

// withRemoteSnapshots adds to list, this node's snapshots (of sandbox
// sandboxRef when it is set), the other nodes' it chooses, oldest first.
func (d *Daemon) withRemoteSnapshots(ctx context.Context, list []api.Snapshot, sandboxRef string) []api.Snapshot {
	n := d.cluster
	for i := range list {
		list[i] = n.OwnSnapshot(list[i])
	}
	id := sandboxRef
	if sandboxRef != "" {
		d.mu.Lock()
		e, err := d.lookup(sandboxRef)
		d.mu.Unlock()
		if err == nil {
			id = e.rec.ID
		} else if sb, _, found, _ := n.Resolve(ctx, sandboxRef); found {
			id = sb.ID
		}
	}
	for _, s := range n.Snapshots() {
		if id == "" || s.Sandbox == id || len(id) >= api.MinIDPrefix && strings.HasPrefix(s.Sandbox, id) {
			list = append(list, s)
		}
	}
	slices.SortStableFunc(list, func(a, b api.Snapshot) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return list
}

// toSnapshotNode serves a request naming another node's snapshot
// (/snapshots/{snapshot}...): it is forwarded to that node, or, the node
// being unreachable, described as the cluster last heard of it. It
// reports whether it served r.
func (d *Daemon) toSnapshotNode(w http.ResponseWriter, r *http.Request) bool {
	n := d.cluster
	rest, ok := strings.CutPrefix(r.URL.Path, "/snapshots/")
	if !ok || n == nil || r.Header.Get(cluster.ForwardedHeader) != "" {
		return false
	}
	ref, sub, _ := strings.Cut(rest, "/")
	if ref == "" || r.Method == http.MethodPost && ref == "import" && sub == "" {
		return false
	}
	if _, err := d.snapshot(ref); !errors.Is(err, errdefs.ErrNotFound) {
		return false // this node's, or an error of this node's to tell
	}
	snap, node, found, err := n.ResolveSnapshot(r.Context(), ref)
	switch {
	case err != nil:
		reply.Error(w, err)
	case !found:
		return false
	case node.State == api.NodeReady || node.State == api.NodeDraining:
		n.Forward(w, r, node)
	case r.Method == http.MethodGet && sub == "":
		reply.JSON(w, http.StatusOK, snap)
	default:
		reply.Error(w, fmt.Errorf("%w: snapshot %s is on node %s, which is %s (last heard from %s ago)", errdefs.ErrUnavailable,
			api.ShortID(snap.ID), node.Name, node.State, time.Since(node.SeenAt).Round(time.Second)))
	}
	return true
}

// placeFromSnapshot places a create from a snapshot on the node that
// keeps the snapshot's files: it reports that node, or why the create
// cannot be made there. A create naming another node is refused, as
// one whose constraints that node does not meet.
func (d *Daemon) placeFromSnapshot(ctx context.Context, req *CreateRequest) (api.Node, error) {
	n := d.cluster
	where, ref := n.Name(), req.Snapshot
	if _, err := d.snapshot(req.Snapshot); !errors.Is(err, errdefs.ErrNotFound) {
		if err != nil {
			return api.Node{}, err
		}
	} else {
		snap, node, found, err := n.ResolveSnapshot(ctx, req.Snapshot)
		switch {
		case err != nil:
			return api.Node{}, err
		case !found:
			return api.Node{}, fmt.Errorf("%w: no snapshot %q on any node", errdefs.ErrNotFound, api.Clip(req.Snapshot))
		case node.State != api.NodeReady && node.State != api.NodeDraining:
			return api.Node{}, fmt.Errorf("%w: snapshot %s is on node %s, which is %s: a sandbox is made from it there alone", errdefs.ErrUnavailable,
				api.ShortID(snap.ID), node.Name, node.State)
		}
		where, req.Snapshot = node.Name, snap.ID
	}
	if req.Node != "" && req.Node != where {
		return api.Node{}, fmt.Errorf("%w: node %s: snapshot %s is on node %s, which keeps its files: leave node out, or name %s (or export it and import it on %s: kiln snapshot export, import)",
			errdefs.ErrInvalidArgument, api.Clip(req.Node), api.Clip(ref), where, where, api.Clip(req.Node))
	}
	return n.Place(where, req.Constraints)
}
