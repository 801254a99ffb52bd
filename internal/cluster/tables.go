package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// The buckets of what each node keeps beside its sandboxes: its
// snapshots, whose files are on it, and its previews, which it serves.
const (
	// BucketSnapshots holds each snapshot's description, by id and node.
	BucketSnapshots = "kiln_snapshots"
	// BucketPreviews holds each preview's node and sandbox, by id and
	// node.
	BucketPreviews = "kiln_previews"
)

// maxSnapshotValue bounds a snapshot's description in its bucket: one
// with more processes than that holds is written without them (GET
// /snapshots/{id}, which its node answers, has them all).
const maxSnapshotValue = 256 << 10

// PreviewRoute is where a preview is served: the node whose sandbox it
// reaches. Any node's previews' host takes the preview's requests there.
type PreviewRoute struct {
	ID        string    `json:"id"`
	Node      string    `json:"node"`
	Sandbox   string    `json:"sandbox"`
	ExpiresAt time.Time `json:"expires_at"`
}

// A table is a bucket of records each node writes of its own things,
// keyed ID.NODE (the node's name as a Token): the same id may be on two
// nodes a moment (a snapshot exported, imported, then removed where it
// was), each its own key. A node writes its own keys alone; it watches
// the others'.
type table struct {
	bucket, description string
	self                string

	mu sync.Mutex // guards what follows
	kv jetstream.KeyValue
	// published is what this node last wrote of each of its own, by id.
	published map[string][]byte
	// remote are the other nodes' records, by key.
	remote map[string]record
}

// A record is one of a table's values: every one names its id and node.
type record struct {
	ID   string `json:"id"`
	Node string `json:"node"`
	raw  []byte
}

func newTable(bucket, description, self string) *table {
	return &table{bucket: bucket, description: description, self: self, published: map[string][]byte{}, remote: map[string]record{}}
}

func (t *table) key(id string) string { return id + "." + Token(t.self) }

// open makes or opens the table's bucket.
func (t *table) open(ctx context.Context, js jetstream.JetStream, replicas int) error {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: t.bucket, History: 1, Replicas: replicas, Description: t.description})
	if err != nil {
		return fmt.Errorf("bucket %s: %w", t.bucket, err)
	}
	t.mu.Lock()
	t.kv = kv
	t.mu.Unlock()
	return nil
}

func (t *table) bucketKV() jetstream.KeyValue {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.kv
}

// put writes v, one of this node's, whose id is id, unless it is what
// was written last.
func (t *table) put(ctx context.Context, log *slog.Logger, id string, b []byte) {
	t.mu.Lock()
	kv, same := t.kv, string(t.published[id]) == string(b)
	t.mu.Unlock()
	if kv == nil || same {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := kv.Put(ctx, t.key(id), b); err != nil {
		log.Debug("not recorded in the cluster; the next reconcile will", "bucket", t.bucket, "id", id, "err", err)
		return
	}
	t.mu.Lock()
	t.published[id] = b
	t.mu.Unlock()
}

// remove removes id, one of this node's, if it was written (one that
// was not, or is there from before this node started, the next
// reconcile removes).
func (t *table) remove(ctx context.Context, id string) {
	t.mu.Lock()
	kv := t.kv
	_, had := t.published[id]
	delete(t.published, id)
	t.mu.Unlock()
	if kv == nil || !had {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	kv.Delete(ctx, t.key(id))
}

// reconcile writes each of own (this node's, by id) and removes this
// node's keys of those it no longer has.
func (t *table) reconcile(ctx context.Context, log *slog.Logger, own map[string][]byte) {
	for id, b := range own {
		t.put(ctx, log, id, b)
	}
	kv := t.bucketKV()
	if kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 4*opTimeout)
	defer cancel()
	keys, err := kv.ListKeysFiltered(ctx, "*."+Token(t.self))
	if err != nil {
		return
	}
	for key := range keys.Keys() {
		id, _, _ := strings.Cut(key, ".")
		if _, ok := own[id]; !ok {
			t.mu.Lock()
			delete(t.published, id)
			t.mu.Unlock()
			kv.Delete(ctx, key)
		}
	}
}

// parse reads a value of key; ok is false for one not of its key's
// form, or this node's own.
func (t *table) parse(key string, b []byte) (record, bool) {
	var r record
	if json.Unmarshal(b, &r) != nil || r.ID == "" || key != r.ID+"."+Token(r.Node) || r.Node == t.self {
		return record{}, false
	}
	r.raw = b
	return r, true
}

// watch follows the other nodes' records until ctx ends.
func (t *table) watch(ctx context.Context, log *slog.Logger) {
	watch(ctx, log, t.bucketKV(), func(e jetstream.KeyValueEntry) {
		r, ok := t.parse(e.Key(), e.Value())
		if !ok {
			return
		}
		t.mu.Lock()
		t.remote[e.Key()] = r
		t.mu.Unlock()
	}, func(key string) {
		t.mu.Lock()
		delete(t.remote, key)
		t.mu.Unlock()
	})
}

// all is every other node's record.
func (t *table) all() []record {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Collect(maps.Values(t.remote))
}

// watched is the other nodes' records of whole id id, as watched.
func (t *table) watched(id string) []record {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []record
	for _, r := range t.remote {
		if r.ID == id {
			out = append(out, r)
		}
	}
	return out
}

// remember takes in r, another node's record written at this node's
// request, before the watcher brings it.
func (t *table) remember(r record) {
	key := r.ID + "." + Token(r.Node)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.remote[key]; !ok && r.Node != t.self {
		t.remote[key] = r
	}
}

// byID is the other nodes' records of whole id id: as watched, or, none
// being watched yet (just written), as the bucket has them. Asking the
// bucket costs NATS a consumer: only an authenticated request may.
func (t *table) byID(ctx context.Context, id string) []record {
	out := t.watched(id)
	kv := t.bucketKV()
	if out != nil || kv == nil {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	keys, err := kv.ListKeysFiltered(ctx, id+".*")
	if err != nil {
		return nil
	}
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue
		}
		if r, ok := t.parse(key, e.Value()); ok {
			out = append(out, r)
		}
	}
	return out
}

// nodeOf is node name as this node sees it now: unheard of, it is lost.
// Called with n.mu held.
func (n *Node) nodeOf(name string, now time.Time) api.Node {
	if p, ok := n.peers[name]; ok {
		return n.describe(p, now)
	}
	return api.Node{Name: name, State: api.NodeLost}
}

// Snapshots.

// OwnSnapshot is s, one of this node's, as the cluster tells it: naming
// this node and its state.
func (n *Node) OwnSnapshot(s api.Snapshot) api.Snapshot {
	n.mu.Lock()
	defer n.mu.Unlock()
	s.Node = n.cfg.Node
	s.NodeState = api.NodeReady
	if n.drained[n.cfg.Node] {
		s.NodeState = api.NodeDraining
	}
	return s
}

// snapshotValue is s as its bucket keeps it.
func (n *Node) snapshotValue(s api.Snapshot) []byte {
	s.Node, s.NodeState = n.cfg.Node, ""
	b, _ := json.Marshal(s)
	if len(b) > maxSnapshotValue {
		s.Processes = []api.Process{}
		b, _ = json.Marshal(s)
	}
	return b
}

// PublishSnapshot records s, a snapshot this node keeps, in the cluster;
// the cluster being down, the next reconcile does.
func (n *Node) PublishSnapshot(ctx context.Context, s api.Snapshot) {
	if n.usable() != nil {
		return
	}
	n.snaps.put(ctx, n.log, s.ID, n.snapshotValue(s))
}

// ForgetSnapshot removes snapshot id, removed from this node.
func (n *Node) ForgetSnapshot(ctx context.Context, id string) {
	if n.usable() != nil {
		return
	}
	n.snaps.remove(ctx, id)
}

// reconcileSnapshots writes every snapshot of this node's again, and
// removes those it no longer has.
func (n *Node) reconcileSnapshots(ctx context.Context) {
	own := map[string][]byte{}
	for _, s := range n.local.Snapshots() {
		own[s.ID] = n.snapshotValue(s)
	}
	n.snaps.reconcile(ctx, n.log, own)
}

// snapshotOf is r's snapshot, told with its node's state now.
func (n *Node) snapshotOf(r record, now time.Time) (api.Snapshot, api.Node, bool) {
	var s api.Snapshot
	if json.Unmarshal(r.raw, &s) != nil {
		return api.Snapshot{}, api.Node{}, false
	}
	n.mu.Lock()
	node := n.nodeOf(s.Node, now)
	n.mu.Unlock()
	s.NodeState = node.State
	if s.Processes == nil {
		s.Processes = []api.Process{}
	}
	return s, node, true
}

// Snapshots describes the snapshots of the other nodes, each naming its
// node and that node's state.
func (n *Node) Snapshots() []api.Snapshot {
	now := time.Now()
	var out []api.Snapshot
	for _, r := range n.snaps.all() {
		if s, _, ok := n.snapshotOf(r, now); ok {
			out = append(out, s)
		}
	}
	return out
}

// ResolveSnapshot finds another node's snapshot by id, name or a unique
// prefix of api.MinIDPrefix or more of its id, and its node.
func (n *Node) ResolveSnapshot(ctx context.Context, ref string) (api.Snapshot, api.Node, bool, error) {
	now := time.Now()
	var found []api.Snapshot
	var nodes []api.Node
	add := func(r record) {
		if s, node, ok := n.snapshotOf(r, now); ok {
			found, nodes = append(found, s), append(nodes, node)
		}
	}
	if isSnapshotID(ref) {
		for _, r := range n.snaps.byID(ctx, ref) {
			add(r)
		}
	} else {
		all := n.snaps.all()
		for _, r := range all {
			var named struct{ Name string }
			if json.Unmarshal(r.raw, &named) == nil && named.Name == ref && ref != "" {
				add(r)
			}
		}
		if found == nil && len(ref) >= api.MinIDPrefix {
			for _, r := range all {
				if strings.HasPrefix(r.ID, ref) {
					add(r)
				}
			}
		}
	}
	switch len(found) {
	case 0:
		return api.Snapshot{}, api.Node{}, false, nil
	case 1:
		return found[0], nodes[0], true, nil
	}
	// One id on two nodes (moved, and not yet removed where it was):
	// the node that serves it now.
	if i := slices.IndexFunc(nodes, func(d api.Node) bool { return d.State == api.NodeReady || d.State == api.NodeDraining }); i >= 0 &&
		!slices.ContainsFunc(found, func(s api.Snapshot) bool { return s.ID != found[0].ID }) {
		return found[i], nodes[i], true, nil
	}
	var names []string
	for _, s := range found {
		names = append(names, api.ShortID(s.ID)+" on node "+s.Node)
	}
	slices.Sort(names)
	return api.Snapshot{}, api.Node{}, false, fmt.Errorf("%w: snapshot %q is ambiguous on other nodes (%s): give its whole id", errdefs.ErrInvalidArgument,
		api.Clip(ref), strings.Join(names[:min(len(names), 5)], ", "))
}

// isSnapshotID says s is a whole snapshot id: 64 lower-case hex digits.
func isSnapshotID(s string) bool {
	return len(s) == 64 && strings.IndexFunc(s, func(c rune) bool { return !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') }) < 0
}

// Previews.

// PublishPreview records p, a preview this node serves, in the cluster.
func (n *Node) PublishPreview(ctx context.Context, p PreviewRoute) {
	if n.usable() != nil {
		return
	}
	p.Node = n.cfg.Node
	b, _ := json.Marshal(p)
	n.previews.put(ctx, n.log, p.ID, b)
}

// ForgetPreview removes preview id, revoked or gone with its sandbox.
func (n *Node) ForgetPreview(ctx context.Context, id string) {
	if n.usable() != nil {
		return
	}
	n.previews.remove(ctx, id)
}

// reconcilePreviews writes every preview of this node's not expired
// again, and removes the others.
func (n *Node) reconcilePreviews(ctx context.Context) {
	own := map[string][]byte{}
	now := time.Now()
	for _, p := range n.local.Previews() {
		if now.Before(p.ExpiresAt) {
			p.Node = n.cfg.Node
			own[p.ID], _ = json.Marshal(p)
		}
	}
	n.previews.reconcile(ctx, n.log, own)
}

// RememberPreview takes in p, a preview just made on another node at this
// node's request, before the watcher brings it: its URL, this node's,
// works at once.
func (n *Node) RememberPreview(p PreviewRoute) {
	b, _ := json.Marshal(p)
	n.previews.remember(record{ID: p.ID, Node: p.Node, raw: b})
}

// PreviewNode finds the node that serves preview id, another node's not
// expired, as watched: a request for a preview asks NATS nothing, since
// anyone may make one.
func (n *Node) PreviewNode(id string) (api.Node, bool) {
	now := time.Now()
	for _, r := range n.previews.watched(id) {
		var p PreviewRoute
		if json.Unmarshal(r.raw, &p) != nil || !now.Before(p.ExpiresAt) {
			continue
		}
		n.mu.Lock()
		node := n.nodeOf(p.Node, now)
		n.mu.Unlock()
		return node, true
	}
	return api.Node{}, false
}

// openTables opens the tables' buckets.
func (n *Node) openTables(ctx context.Context, js jetstream.JetStream, replicas int) error {
	for _, t := range []*table{n.snaps, n.previews} {
		if err := t.open(ctx, js, replicas); err != nil {
			return err
		}
	}
	return nil
}

// startTables follows the tables, and reconciles them when asked
// (reconcileTablesSoon), until ctx ends: apart from the heartbeats,
// which a reconcile's listing of keys would otherwise hold up.
func (n *Node) startTables(ctx context.Context) {
	for _, t := range []*table{n.snaps, n.previews} {
		n.done.Go(func() { t.watch(ctx, n.log) })
	}
	n.done.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-n.tablesDue:
				if n.usable() == nil {
					n.reconcileSnapshots(ctx)
					n.reconcilePreviews(ctx)
				}
			}
		}
	})
}

// reconcileTablesSoon asks for the tables' records of this node to be
// written again, and those it no longer has removed; a round asked for
// already is not asked again.
func (n *Node) reconcileTablesSoon() {
	select {
	case n.tablesDue <- struct{}{}:
	default:
	}
}
