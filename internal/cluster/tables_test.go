package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/natstest"
)

// fakeLocal is a kilnd with snapshots and previews and no sandboxes.
type fakeLocal struct {
	mu       sync.Mutex // guards what follows
	snaps    []api.Snapshot
	previews []cluster.PreviewRoute
}

func (f *fakeLocal) Sandboxes() []api.Sandbox { return nil }
func (f *fakeLocal) Load() api.Node           { return api.Node{CPUs: 1} }

func (f *fakeLocal) Snapshots() []api.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]api.Snapshot(nil), f.snaps...)
}

func (f *fakeLocal) Previews() []cluster.PreviewRoute {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cluster.PreviewRoute(nil), f.previews...)
}

// join makes node name of the cluster at urls, with local as its kilnd.
func join(t *testing.T, name string, urls []string, local *fakeLocal) *cluster.Node {
	t.Helper()
	n, err := cluster.Join(cluster.Config{Servers: urls, Node: name, APIURL: "http://127.0.0.1:1", Heartbeat: beat, LostAfter: lostAfter}, local, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

func snapshotID(c byte) string { return strings.Repeat(string(c), 64) }

// TestSnapshotAndPreviewTables: each node's snapshots and previews reach
// the others, named by node and told in their node's state; a name two
// other nodes' snapshots have is ambiguous, one id on two nodes (a move)
// is not; a reconcile removes what its node no longer has; an expired
// preview is nobody's.
func TestSnapshotAndPreviewTables(t *testing.T) {
	nats := natstest.Cluster(t, 1)
	urls := nats.URLs()
	lx, ly := &fakeLocal{}, &fakeLocal{}
	x, y, z := join(t, "x", urls, lx), join(t, "y.example", urls, ly), join(t, "z", urls, &fakeLocal{})
	for _, n := range []*cluster.Node{x, y, z} {
		eventually(t, n.Name()+" sees the nodes", func() (bool, string) {
			nodes := n.Nodes()
			return len(nodes) == 3 && n.Status().State == "connected", fmt.Sprint(nodes)
		})
	}
	ctx := context.Background()
	now := time.Now().UTC()
	one := api.Snapshot{ID: snapshotID('1'), Name: "same", CreatedAt: now, Processes: []api.Process{}}
	two := api.Snapshot{ID: snapshotID('2'), Name: "same", CreatedAt: now, Processes: []api.Process{}}
	moved := api.Snapshot{ID: snapshotID('3'), Name: "moved", CreatedAt: now, Processes: []api.Process{}}
	previews := []cluster.PreviewRoute{
		{ID: "00112233aabbccdd", Sandbox: "sb", ExpiresAt: now.Add(time.Hour)},
		{ID: "ffeeddccbbaa9988", Sandbox: "sb", ExpiresAt: now.Add(-time.Second)},
	}
	lx.mu.Lock()
	lx.snaps, lx.previews = []api.Snapshot{one, moved}, previews
	lx.mu.Unlock()
	ly.mu.Lock()
	ly.snaps = []api.Snapshot{two, moved}
	ly.mu.Unlock()
	for _, s := range []api.Snapshot{one, moved} {
		x.PublishSnapshot(ctx, s)
	}
	for _, s := range []api.Snapshot{two, moved} {
		y.PublishSnapshot(ctx, s)
	}
	for _, p := range previews {
		x.PublishPreview(ctx, p)
	}
	eventually(t, "z lists x's and y's snapshots", func() (bool, string) {
		got := map[string]string{}
		for _, s := range z.Snapshots() {
			got[s.ID[:1]+"@"+s.Node] = s.NodeState
		}
		want := map[string]string{"1@x": api.NodeReady, "3@x": api.NodeReady, "2@y.example": api.NodeReady, "3@y.example": api.NodeReady}
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
	})
	// x does not list its own: its kilnd does.
	if list := x.Snapshots(); len(list) != 2 {
		t.Errorf("x lists %d others' snapshots, want y's 2: %+v", len(list), list)
	}
	for _, tc := range []struct {
		on       *cluster.Node
		ref      string
		wantNode string
		wantErr  error
	}{
		{z, "same", "", errdefs.ErrInvalidArgument}, // x's and y's
		{x, "same", "y.example", nil},               // y's: x's own is its kilnd's to find
		{z, snapshotID('1'), "x", nil},
		{z, "2222", "y.example", nil},
		{z, "moved", "x", nil}, // either node's: both serve it
		{z, snapshotID('3'), "x", nil},
		{z, "nothing", "", nil},
		{z, "ab", "", nil}, // a prefix too short finds nothing
	} {
		s, node, found, err := tc.on.ResolveSnapshot(ctx, tc.ref)
		switch {
		case tc.wantErr != nil:
			if !errors.Is(err, tc.wantErr) || found {
				t.Errorf("%s resolves %q: %v %v, want %v", tc.on.Name(), tc.ref, found, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%s resolves %q: %v", tc.on.Name(), tc.ref, err)
		case tc.wantNode == "" && found:
			t.Errorf("%s resolves %q: found %+v", tc.on.Name(), tc.ref, s)
		case tc.wantNode != "" && (!found || node.Name != s.Node || tc.wantNode != "x" && s.Node != tc.wantNode || tc.ref == "moved" && s.ID != moved.ID):
			t.Errorf("%s resolves %q: %v %+v on %+v, want node %s", tc.on.Name(), tc.ref, found, s, node, tc.wantNode)
		}
	}
	eventually(t, "z finds x's preview", func() (bool, string) {
		node, ok := z.PreviewNode("00112233aabbccdd")
		return ok && node.Name == "x" && node.State == api.NodeReady, fmt.Sprint(node, ok)
	})
	if node, ok := z.PreviewNode("ffeeddccbbaa9988"); ok {
		t.Errorf("z finds an expired preview on %+v", node)
	}

	// x's kilnd no longer has one: x's reconcile removes it; y's copy of
	// the moved one stays.
	lx.mu.Lock()
	lx.snaps = []api.Snapshot{moved}
	lx.mu.Unlock()
	x.Reconcile(ctx)
	eventually(t, "z no longer lists x's removed snapshot", func() (bool, string) {
		ids := map[string]int{}
		for _, s := range z.Snapshots() {
			ids[s.ID[:1]]++
		}
		return ids["1"] == 0 && ids["2"] == 1 && ids["3"] == 2, fmt.Sprint(ids)
	})
	// Removed on y: the moved one is x's alone.
	ly.mu.Lock()
	ly.snaps = []api.Snapshot{two}
	ly.mu.Unlock()
	y.ForgetSnapshot(ctx, moved.ID)
	eventually(t, "the moved snapshot x's alone", func() (bool, string) {
		s, node, found, err := z.ResolveSnapshot(ctx, "moved")
		return found && err == nil && node.Name == "x", fmt.Sprint(s, node, err)
	})

	// x gone: its snapshot is told with its state, unreachable, then lost.
	x.Close()
	for _, want := range []string{api.NodeUnreachable, api.NodeLost} {
		eventually(t, "x's snapshot "+want+" to z", func() (bool, string) {
			s, _, found, _ := z.ResolveSnapshot(ctx, moved.ID)
			return found && s.NodeState == want, fmt.Sprint(s)
		})
	}
	if node, ok := z.PreviewNode("00112233aabbccdd"); !ok || node.State != api.NodeLost {
		t.Errorf("z finds x's preview on %+v %v, want x lost", node, ok)
	}
}
