// Package cluster joins kilnds into one cluster kept in NATS JetStream:
// each node's heartbeat, the placement of every sandbox and the names
// they are known by live in JetStream key-value buckets, which NATS
// replicates. It has no consensus, membership or replication of its own:
// a node writes its own keys, reads everyone's through watchers, and the
// buckets' revisions settle races (a name is claimed by Create, which
// one node alone wins).
//
// A node whose NATS is unreachable serves on: its own sandboxes are its
// own kilnd's, and only what needs the cluster (placing on another node,
// claiming a name, reaching another node's sandbox) waits for it.
package cluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/version"
)

// The buckets, all the cluster's alike.
const (
	// BucketNodes holds each node's heartbeat, by node name.
	BucketNodes = "kiln_nodes"
	// BucketSandboxes holds each sandbox's description, by id, written by
	// the node it runs on.
	BucketSandboxes = "kiln_sandboxes"
	// BucketNames holds each sandbox name's id: Create claims a name.
	BucketNames = "kiln_names"
	// BucketCluster holds the cluster's own keys: its API token, and
	// drain.NODE for each node drained.
	BucketCluster = "kiln_cluster"

	keyToken    = "api_token"
	drainPrefix = "drain."
)

// Defaults.
const (
	DefaultLostAfter = time.Minute
	// DefaultHeartbeat is how often a node writes its heartbeat; a node
	// not heard from for unreachableBeats of them is unreachable.
	DefaultHeartbeat = 2 * time.Second
	unreachableBeats = 5
	// reconcileEvery is how often a node writes every sandbox of its own
	// again and removes the keys of those it no longer has.
	reconcileEvery = 30 * time.Second
	// staleClaim is how old a name's claim must be, its sandbox unknown
	// to the cluster, before another sandbox may take the name: a create
	// that claimed it and died before its sandbox was recorded.
	staleClaim = time.Minute
	// opTimeout bounds one request to NATS.
	opTimeout = 5 * time.Second
)

// nodeLabel is each dot-separated part of a node's name: a DNS label.
var nodeLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidateNode checks a node's name: a DNS name (RFC 1123 labels joined by
// dots, at most 253 characters), as Kubernetes names its nodes.
func ValidateNode(name string) error {
	ok := len(name) <= 253
	for l := range strings.SplitSeq(name, ".") {
		ok = ok && nodeLabel.MatchString(l)
	}
	if !ok {
		return fmt.Errorf("node name %q: want a DNS name: labels of 1 to 63 of a-z, 0-9 and '-' (not beginning or ending with '-'), joined by dots, 253 characters at most", api.Clip(name))
	}
	return nil
}

// Token is node's name as a NATS subject token, and a stream name's part:
// its dots, which separate a subject's tokens, become underscores, which
// a DNS name never has.
func Token(node string) string { return strings.ReplaceAll(node, ".", "_") }

// Config says how a node joins its cluster.
type Config struct {
	// Servers are the NATS URLs to connect to; Embedded, instead, runs
	// the NATS server in this process.
	Servers  []string
	Embedded *Embedded
	// Token or NKeyFile (a file holding an nkey seed) authenticate to NATS.
	Token    string
	NKeyFile string
	// Node is this node's name, unique in the cluster; Labels its pairs
	// that a create's constraints match.
	Node   string
	Labels map[string]string
	// APIURL is where the other nodes reach this kilnd's API.
	APIURL string
	// LostAfter is how long a node is unreachable before its sandboxes
	// are node_lost; Heartbeat how often this node tells it lives.
	LostAfter, Heartbeat time.Duration
	// Replicas of each bucket: 0 chooses 3 where the NATS cluster has 3
	// servers or more, else 1.
	Replicas int
	Log      *slog.Logger
}

// Local is what a node asks of its own kilnd.
type Local interface {
	// Sandboxes describes every sandbox of this kilnd not deleted.
	Sandboxes() []api.Sandbox
	// Load is this kilnd's capacity and load, for its heartbeat: CPUs,
	// MemoryBytes, FreeMemoryBytes and Sandboxes.
	Load() api.Node
	// Snapshots describes every snapshot this kilnd keeps; Previews
	// every preview it serves.
	Snapshots() []api.Snapshot
	Previews() []PreviewRoute
}

// Node is this kilnd's membership of its cluster.
type Node struct {
	cfg         Config
	local       Local
	log         *slog.Logger
	srv         *server.Server // the embedded server, if any
	nc          *nats.Conn
	incarnation string
	startedAt   time.Time
	cancel      context.CancelFunc
	done        sync.WaitGroup
	// url and opts connect to NATS: Connect makes more connections so.
	url  string
	opts []nats.Option

	mu sync.Mutex
	// Set once the buckets are open.
	js                               jetstream.JetStream
	nodes, sandboxes, names, cluster jetstream.KeyValue
	token                            string
	// Watched: every node's heartbeat, every sandbox not this node's,
	// the drained nodes.
	peers   map[string]peer
	remote  map[string]api.Sandbox
	drained map[string]bool
	// published is what this node last wrote of each of its sandboxes.
	published map[string][]byte
	// down says why the cluster cannot be used now, "" when it can.
	down    string
	proxies map[string]*httputil.ReverseProxy
	// onToken is told the cluster's API token once it is known.
	onToken func(string)
	// snaps and previews are this node's snapshots and previews, and
	// the others' (tables.go); tablesDue asks for their reconcile.
	snaps, previews *table
	tablesDue       chan struct{}
}

type peer struct {
	node api.Node
	seen time.Time // by NATS's clock: when its heartbeat was stored
}

// Join starts this node's membership: the embedded server, if any, the
// connection to NATS and, in the background, the buckets, heartbeats and
// watchers. NATS being unreachable is no error: the node says the
// cluster is down (Status) and keeps trying. onToken is told the
// cluster's API token, which every node accepts, once it is known.
func Join(cfg Config, local Local, onToken func(string)) (*Node, error) {
	if err := ValidateNode(cfg.Node); err != nil {
		return nil, fmt.Errorf("cluster: --node: %w", err)
	}
	cfg.LostAfter = cmp.Or(cfg.LostAfter, DefaultLostAfter)
	cfg.Heartbeat = cmp.Or(cfg.Heartbeat, DefaultHeartbeat)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	raw := make([]byte, 8)
	rand.Read(raw)
	n := &Node{cfg: cfg, local: local, log: cfg.Log.With("node", cfg.Node), incarnation: hex.EncodeToString(raw), startedAt: time.Now().UTC(),
		peers: map[string]peer{}, remote: map[string]api.Sandbox{}, drained: map[string]bool{}, published: map[string][]byte{},
		proxies: map[string]*httputil.ReverseProxy{}, onToken: onToken, down: "connecting to NATS",
		snaps:     newTable(BucketSnapshots, "snapshots, by id and the node that keeps them", cfg.Node),
		previews:  newTable(BucketPreviews, "previews, by id and the node that serves them", cfg.Node),
		tablesDue: make(chan struct{}, 1)}
	opts := []nats.Option{
		nats.Name("kilnd " + cfg.Node),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		// A dead connection is noticed in seconds, not the default minutes.
		nats.PingInterval(5 * time.Second),
		nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			n.setDown("NATS connection lost")
		}),
	}
	if cfg.Token != "" {
		opts = append(opts, nats.Token(cfg.Token))
	}
	if cfg.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("cluster: --cluster-nkey: %w", err)
		}
		opts = append(opts, o)
	}
	url := strings.Join(cfg.Servers, ",")
	if cfg.Embedded != nil {
		e := *cfg.Embedded
		if e.Token == "" {
			e.Token = cfg.Token
		}
		s, err := e.start(cfg.Node)
		if err != nil {
			return nil, err
		}
		n.srv = s
		opts = append(opts, nats.InProcessServer(s))
		url = s.ClientURL()
	}
	n.url, n.opts = url, opts
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		n.shutdownServer()
		return nil, fmt.Errorf("cluster: NATS %s: %w", url, err)
	}
	n.nc = nc
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.done.Go(func() { n.run(ctx) })
	return n, nil
}

// SetAPIURL says where the other nodes reach this node's API, when its
// Config could not (a port chosen as kilnd started serving); until then
// the node writes no heartbeat.
func (n *Node) SetAPIURL(u string) {
	n.mu.Lock()
	if n.cfg.APIURL == "" {
		n.cfg.APIURL = u
	}
	n.mu.Unlock()
}

// Name is this node's name.
func (n *Node) Name() string { return n.cfg.Node }

// Conn is the node's connection to NATS.
func (n *Node) Conn() *nats.Conn { return n.nc }

// Connect makes another connection to the node's NATS, named what for
// the server's lists, as the node's own is made (retrying while NATS is
// down): bulk traffic on one of its own cannot delay the heartbeats.
func (n *Node) Connect(what string) (*nats.Conn, error) {
	opts := append(slices.Clone(n.opts), nats.Name("kilnd "+n.cfg.Node+" "+what),
		nats.DisconnectErrHandler(func(*nats.Conn, error) {}))
	return nats.Connect(n.url, opts...)
}

// Replicas is how many copies the cluster's streams keep.
func (n *Node) Replicas() int {
	if n.cfg.Replicas > 0 {
		return n.cfg.Replicas
	}
	// The servers this node was given, or has learnt of since: a client
	// of one server of three learns of the other two as it connects.
	servers := max(len(n.cfg.Servers), len(n.nc.Servers()))
	if e := n.cfg.Embedded; e != nil {
		servers = len(e.Routes)
		if !slices.ContainsFunc(e.Routes, func(r string) bool {
			return strings.HasSuffix(r, "//"+e.RouteListen) || strings.HasSuffix(r, "@"+e.RouteListen)
		}) {
			servers++ // its own, which its routes need not name
		}
	}
	if servers >= 3 {
		return 3
	}
	return 1
}

// Close ends the membership: the heartbeat stops (the others see the
// node unreachable, then lost, unless it comes back), the connection
// closes, the embedded server, if any, shuts down.
func (n *Node) Close() {
	n.cancel()
	n.done.Wait()
	n.nc.Close()
	n.shutdownServer()
}

func (n *Node) shutdownServer() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
	}
}

// Status is the node's word on its cluster, for GET /healthz.
func (n *Node) Status() api.Cluster {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down != "" {
		return api.Cluster{Node: n.cfg.Node, State: "down", Error: n.down}
	}
	return api.Cluster{Node: n.cfg.Node, State: "connected"}
}

// ErrDown is the error of what needs the cluster while it is down.
var ErrDown = errdefs.New(errdefs.ErrUnavailable, "the cluster is down")

// Reached is nil while the node reaches its cluster, else ErrDown saying
// why not.
func (n *Node) Reached() error { return n.usable() }

// usable returns the node's buckets, or why they cannot be used.
func (n *Node) usable() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down != "" {
		return fmt.Errorf("%w (%s); this node serves its own sandboxes meanwhile", ErrDown, n.down)
	}
	return nil
}

func (n *Node) setDown(why string) {
	n.mu.Lock()
	if n.down == "" {
		n.log.Warn("cluster down", "why", why)
	}
	n.down = why
	n.mu.Unlock()
}

// run opens the buckets, retrying until NATS answers, then beats,
// watches and reconciles until ctx ends.
func (n *Node) run(ctx context.Context) {
	backoff := 250 * time.Millisecond
	for try := 0; ; try++ {
		err := n.open(ctx)
		if err == nil {
			break
		}
		if try%10 == 0 {
			n.log.Warn("cluster not reached yet; trying again", "err", err)
		}
		n.setDown(err.Error())
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	n.done.Go(func() { n.watchNodes(ctx) })
	n.done.Go(func() { n.watchSandboxes(ctx) })
	n.done.Go(func() { n.watchCluster(ctx) })
	n.startTables(ctx)
	beat := time.NewTicker(n.cfg.Heartbeat)
	defer beat.Stop()
	reconcile := time.NewTicker(reconcileEvery)
	defer reconcile.Stop()
	n.beat(ctx)
	n.Reconcile(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			if n.beat(ctx) && n.wasDown() {
				// Back: what changed meanwhile is written again.
				n.Reconcile(ctx)
			}
		case <-reconcile.C:
			n.Reconcile(ctx)
		}
	}
}

// open makes or opens the buckets and learns the cluster's token.
func (n *Node) open(ctx context.Context) error {
	if !n.nc.IsConnected() {
		return errors.New("NATS not connected")
	}
	js, err := jetstream.New(n.nc)
	if err != nil {
		return err
	}
	r := n.Replicas()
	// Short: while the NATS cluster elects its leader, a request waits
	// for nothing; the next try, soon, finds it.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	buckets := []jetstream.KeyValueConfig{
		{Bucket: BucketNodes, History: 1, Replicas: r, Description: "kilnd heartbeats, by node"},
		{Bucket: BucketSandboxes, History: 5, Replicas: r, Description: "sandboxes, by id, written by their node"},
		{Bucket: BucketNames, History: 1, Replicas: r, Description: "sandbox names, claimed by Create"},
		{Bucket: BucketCluster, History: 1, Replicas: r, Description: "the cluster's API token and drained nodes"},
	}
	var kvs []jetstream.KeyValue
	for _, b := range buckets {
		kv, err := js.CreateOrUpdateKeyValue(ctx, b)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", b.Bucket, err)
		}
		kvs = append(kvs, kv)
	}
	if err := n.openTables(ctx, js, r); err != nil {
		return err
	}
	candidate := make([]byte, 32)
	rand.Read(candidate)
	token := hex.EncodeToString(candidate)
	if _, err := kvs[3].Create(ctx, keyToken, []byte(token)); err != nil {
		e, gerr := kvs[3].Get(ctx, keyToken)
		if gerr != nil {
			return fmt.Errorf("the cluster's token: %w", cmp.Or(gerr, err))
		}
		token = string(e.Value())
	}
	if len(token) < 32 {
		return errors.New("the cluster's token (key api_token of bucket kiln_cluster) is shorter than 32 characters")
	}
	n.mu.Lock()
	n.js, n.nodes, n.sandboxes, n.names, n.cluster = js, kvs[0], kvs[1], kvs[2], kvs[3]
	n.token = token
	n.mu.Unlock()
	if n.onToken != nil {
		n.onToken(token)
	}
	return nil
}

// Token is the cluster's API token, which every node accepts and sends
// the others; empty until the cluster has been reached.
func (n *Node) Token() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.token
}

// JetStream is the node's JetStream context, nil until the cluster has
// been reached.
func (n *Node) JetStream() jetstream.JetStream {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.js
}

func (n *Node) wasDown() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.down != ""
}

// beat writes this node's heartbeat; it reports whether NATS took it.
func (n *Node) beat(ctx context.Context) bool {
	n.mu.Lock()
	apiURL := n.cfg.APIURL
	n.mu.Unlock()
	if apiURL == "" {
		return false // not serving yet: no node could reach it
	}
	info := n.local.Load()
	info.Name, info.APIURL, info.Labels = n.cfg.Node, apiURL, n.cfg.Labels
	info.Version, info.Incarnation, info.StartedAt = version.Get().Version, n.incarnation, n.startedAt
	info.State, info.SeenAt, info.Self = "", time.Time{}, false
	b, _ := json.Marshal(info)
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := n.nodes.Put(ctx, n.cfg.Node, b); err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			n.setDown("heartbeat: " + err.Error())
		}
		return false
	}
	n.mu.Lock()
	wasDown := n.down != ""
	n.down = ""
	// The node knows itself from the moment its heartbeat is stored, not
	// once its watcher brings it back: ready, it takes a create naming it.
	if _, ok := n.peers[n.cfg.Node]; !ok {
		n.peers[n.cfg.Node] = peer{node: info, seen: time.Now()}
	}
	n.mu.Unlock()
	if wasDown {
		n.log.Info("cluster connected", "replicas", n.Replicas())
	}
	return true
}

// watch follows every key of kv, calling put for each value and gone for
// each removal, until ctx ends; it starts again after an error.
func watch(ctx context.Context, log *slog.Logger, kv jetstream.KeyValue, put func(jetstream.KeyValueEntry), gone func(key string)) {
	for ctx.Err() == nil {
		w, err := kv.WatchAll(ctx)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
				continue
			}
		}
		for e := range w.Updates() {
			if e == nil {
				continue // the current values have all come
			}
			switch e.Operation() {
			case jetstream.KeyValuePut:
				put(e)
			default:
				gone(e.Key())
			}
		}
		w.Stop()
		if ctx.Err() == nil {
			log.Debug("watcher ended; watching again", "bucket", kv.Bucket())
		}
	}
}

func (n *Node) watchNodes(ctx context.Context) {
	watch(ctx, n.log, n.nodes, func(e jetstream.KeyValueEntry) {
		var info api.Node
		if json.Unmarshal(e.Value(), &info) != nil || info.Name != e.Key() {
			return
		}
		n.mu.Lock()
		n.peers[e.Key()] = peer{node: info, seen: e.Created()}
		n.mu.Unlock()
	}, func(key string) {
		n.mu.Lock()
		delete(n.peers, key)
		n.mu.Unlock()
	})
}

func (n *Node) watchSandboxes(ctx context.Context) {
	watch(ctx, n.log, n.sandboxes, func(e jetstream.KeyValueEntry) {
		var sb api.Sandbox
		if json.Unmarshal(e.Value(), &sb) != nil || sb.ID != e.Key() {
			return
		}
		n.mu.Lock()
		if sb.Node == n.cfg.Node {
			delete(n.remote, sb.ID) // ours: our kilnd knows it better
		} else {
			n.remote[sb.ID] = sb
		}
		n.mu.Unlock()
	}, func(key string) {
		n.mu.Lock()
		delete(n.remote, key)
		n.mu.Unlock()
	})
}

func (n *Node) watchCluster(ctx context.Context) {
	watch(ctx, n.log, n.cluster, func(e jetstream.KeyValueEntry) {
		if name, ok := strings.CutPrefix(e.Key(), drainPrefix); ok {
			n.mu.Lock()
			n.drained[name] = true
			n.mu.Unlock()
		}
	}, func(key string) {
		if name, ok := strings.CutPrefix(key, drainPrefix); ok {
			n.mu.Lock()
			delete(n.drained, name)
			n.mu.Unlock()
		}
	})
}

// Publish records sb, a sandbox of this node, in the cluster; a
// description unchanged since the last is not written again. The cluster
// being down, it is written at the next reconcile.
func (n *Node) Publish(ctx context.Context, sb api.Sandbox) {
	sb.Node = n.cfg.Node
	b, _ := json.Marshal(sb)
	n.mu.Lock()
	kv, same := n.sandboxes, string(n.published[sb.ID]) == string(b)
	n.mu.Unlock()
	if kv == nil || same {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := kv.Put(ctx, sb.ID, b); err != nil {
		n.log.Debug("sandbox not recorded in the cluster; the next reconcile will", "sandbox", sb.ID, "err", err)
		return
	}
	n.mu.Lock()
	n.published[sb.ID] = b
	n.mu.Unlock()
}

// Forget removes sandbox id, deleted on this node, and its name's claim.
func (n *Node) Forget(ctx context.Context, id, name string) {
	n.mu.Lock()
	kv := n.sandboxes
	delete(n.published, id)
	n.mu.Unlock()
	if kv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	// The name first: whoever no longer finds the sandbox finds its
	// name free.
	if name != "" {
		n.ReleaseName(ctx, name, id)
	}
	kv.Delete(ctx, id)
}

// Reconcile writes every sandbox of this node again and removes from the
// cluster those it no longer has: after a restart, or the cluster's
// return, the cluster agrees with the node's own records.
func (n *Node) Reconcile(ctx context.Context) {
	if n.usable() != nil {
		return
	}
	n.reconcileTablesSoon()
	own := n.local.Sandboxes()
	have := map[string]bool{}
	for _, sb := range own {
		have[sb.ID] = true
		n.Publish(ctx, sb)
	}
	n.mu.Lock()
	kv := n.sandboxes
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 4*opTimeout)
	defer cancel()
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return
	}
	for id := range keys.Keys() {
		if have[id] {
			continue
		}
		e, err := kv.Get(ctx, id)
		if err != nil {
			continue
		}
		var sb api.Sandbox
		if json.Unmarshal(e.Value(), &sb) == nil && sb.Node == n.cfg.Node {
			n.log.Info("cluster: removing a sandbox this node no longer has", "sandbox", id)
			n.Forget(ctx, id, sb.Name)
		}
	}
}

// ClaimName claims sandbox name name for id across the cluster; a name
// another sandbox has is a conflict naming it.
func (n *Node) ClaimName(ctx context.Context, name, id string) error {
	if err := n.usable(); err != nil {
		return fmt.Errorf("sandbox name %s cannot be checked unique: %w", name, err)
	}
	n.mu.Lock()
	kv := n.names
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	// Refused as taken, and then not there or held by a sandbox this
	// node does not know: the name was released meanwhile, the read came
	// from a replica behind the last release (reads of a replicated
	// bucket may come from any of its servers), or another node is
	// creating its sandbox. A few more tries settle the first two.
	var e jetstream.KeyValueEntry
	known := false
	for try := 1; ; try++ {
		_, err := kv.Create(ctx, name, []byte(id))
		if err == nil {
			return nil
		}
		var gerr error
		e, gerr = kv.Get(ctx, name)
		if gerr != nil && (!errors.Is(gerr, jetstream.ErrKeyNotFound) || try == claimTries) {
			return fmt.Errorf("%w: claiming sandbox name %s: %v", errdefs.ErrUnavailable, name, err)
		}
		if gerr == nil {
			if string(e.Value()) == id {
				return nil
			}
			if known = n.knows(string(e.Value())); known || try == claimTries {
				break
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: claiming sandbox name %s: %v", errdefs.ErrUnavailable, name, ctx.Err())
		case <-time.After(time.Duration(try) * 20 * time.Millisecond):
		}
	}
	holder := string(e.Value())
	if !known && time.Since(e.Created()) > staleClaim {
		if _, err := kv.Update(ctx, name, []byte(id), e.Revision()); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: the name %s is taken by sandbox %s", errdefs.ErrAlreadyExists, name, api.ShortID(holder))
}

// knows says whether holder, a name's holder, is a sandbox of the cluster
// this node knows of, or a create of its own under way.
func (n *Node) knows(holder string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, known := n.remote[holder]
	_, own := n.published[holder]
	return known || own || strings.HasPrefix(holder, "creating."+n.cfg.Node+".")
}

// claimTries bounds the tries of a name's claim that found it released.
const claimTries = 5

// ReleaseName gives name back, if id holds it: a create that failed.
func (n *Node) ReleaseName(ctx context.Context, name, id string) { n.passName(ctx, name, id, "") }

// TransferName gives name, held by from, to sandbox id.
func (n *Node) TransferName(ctx context.Context, name, from, id string) {
	n.passName(ctx, name, from, id)
}

// passName gives name, if from holds it, to id, or back when id is "".
func (n *Node) passName(ctx context.Context, name, from, id string) {
	n.mu.Lock()
	names := n.names
	n.mu.Unlock()
	if names == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := names.Get(ctx, name)
	if err != nil || string(e.Value()) != from {
		return
	}
	if id == "" {
		names.Delete(ctx, name, jetstream.LastRevision(e.Revision()))
	} else {
		names.Update(ctx, name, []byte(id), e.Revision())
	}
}

// stateOf is the state of peer p now.
func (n *Node) stateOf(p peer, now time.Time) string {
	age := now.Sub(p.seen)
	switch {
	case p.node.Name == n.cfg.Node:
		if n.drained[p.node.Name] {
			return api.NodeDraining
		}
		return api.NodeReady
	case age > n.cfg.LostAfter:
		return api.NodeLost
	case age > unreachableBeats*n.cfg.Heartbeat:
		return api.NodeUnreachable
	case n.drained[p.node.Name]:
		return api.NodeDraining
	}
	return api.NodeReady
}

// Nodes describes every node of the cluster, by name.
func (n *Node) Nodes() []api.Node {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []api.Node
	for _, name := range slices.Sorted(maps.Keys(n.peers)) {
		out = append(out, n.describe(n.peers[name], now))
	}
	return out
}

func (n *Node) describe(p peer, now time.Time) api.Node {
	d := p.node
	d.State, d.SeenAt, d.Self = n.stateOf(p, now), p.seen.UTC(), p.node.Name == n.cfg.Node
	d.Labels = maps.Clone(d.Labels)
	return d
}

// NodeNamed describes the node of that name.
func (n *Node) NodeNamed(name string) (api.Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.peers[name]
	if !ok {
		return api.Node{}, errdefs.New(errdefs.ErrNotFound, "no node "+api.Clip(name)+" in the cluster")
	}
	return n.describe(p, time.Now()), nil
}

// Drain stops (or, with on false, restarts) placement on node name.
func (n *Node) Drain(ctx context.Context, name string, on bool) error {
	if _, err := n.NodeNamed(name); err != nil {
		return err
	}
	if err := n.usable(); err != nil {
		return err
	}
	n.mu.Lock()
	kv := n.cluster
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	var err error
	if on {
		_, err = kv.Put(ctx, drainPrefix+name, []byte(time.Now().UTC().Format(time.RFC3339)))
	} else {
		err = kv.Delete(ctx, drainPrefix+name)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	// Seen here at once, not only when the watcher brings it.
	n.mu.Lock()
	if on {
		n.drained[name] = true
	} else {
		delete(n.drained, name)
	}
	n.mu.Unlock()
	return nil
}

// Remote describes the sandboxes of the other nodes, each in the state
// its node's heartbeats allow: unknown while the node is unreachable,
// node_lost once it is lost.
func (n *Node) Remote() []api.Sandbox {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]api.Sandbox, 0, len(n.remote))
	for _, sb := range n.remote {
		out = append(out, n.view(sb, now))
	}
	return out
}

// view is sb as its node's state allows it to be told.
func (n *Node) view(sb api.Sandbox, now time.Time) api.Sandbox {
	p, ok := n.peers[sb.Node]
	state := api.NodeLost
	if ok {
		state = n.stateOf(p, now)
	}
	switch {
	case sb.State == api.SandboxStopped || sb.State == api.SandboxDeleted:
		// What it was is still what it is: nothing runs there.
	case state == api.NodeLost:
		sb.State = api.SandboxNodeLost
	case state == api.NodeUnreachable:
		sb.State = api.SandboxUnknown
	}
	return sb
}

// Remember takes in sb, just made on another node at this node's request,
// before the watcher brings it: what a client creates through a node it
// finds there at once.
func (n *Node) Remember(sb api.Sandbox) {
	if sb.ID == "" || sb.Node == "" || sb.Node == n.cfg.Node {
		return
	}
	n.mu.Lock()
	if _, ok := n.remote[sb.ID]; !ok {
		n.remote[sb.ID] = sb
	}
	n.mu.Unlock()
}

// Resolve finds another node's sandbox by id, name or a unique prefix of
// 4 or more of its id.
func (n *Node) Resolve(ctx context.Context, ref string) (api.Sandbox, api.Node, bool, error) {
	if api.IsSandboxID(ref) {
		// A whole id the watcher has not brought yet: asked for.
		n.mu.Lock()
		_, known := n.remote[ref]
		kv := n.sandboxes
		n.mu.Unlock()
		if !known && kv != nil {
			ctx, cancel := context.WithTimeout(ctx, opTimeout)
			e, err := kv.Get(ctx, ref)
			cancel()
			var sb api.Sandbox
			if err == nil && json.Unmarshal(e.Value(), &sb) == nil && sb.ID == ref {
				n.Remember(sb)
			}
		}
	}
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var found []api.Sandbox
	if sb, ok := n.remote[ref]; ok {
		found = []api.Sandbox{sb}
	} else {
		for _, sb := range n.remote {
			if sb.State != api.SandboxDeleted && sb.Name == ref {
				found = []api.Sandbox{sb}
				break
			}
		}
		if found == nil && len(ref) >= 4 {
			for _, sb := range n.remote {
				if strings.HasPrefix(sb.ID, ref) {
					found = append(found, sb)
				}
			}
		}
	}
	switch len(found) {
	case 0:
		return api.Sandbox{}, api.Node{}, false, nil
	case 1:
	default:
		var ids []string
		for _, sb := range found {
			ids = append(ids, api.ShortID(sb.ID))
		}
		slices.Sort(ids)
		return api.Sandbox{}, api.Node{}, false, fmt.Errorf("%w: %s is a prefix of sandboxes %s on other nodes: give more of the id", errdefs.ErrInvalidArgument, api.Clip(ref), strings.Join(ids, ", "))
	}
	sb := n.view(found[0], now)
	node := api.Node{Name: sb.Node, State: api.NodeLost}
	if p, ok := n.peers[sb.Node]; ok {
		node = n.describe(p, now)
	}
	return sb, node, true, nil
}

// Place chooses the node for a new sandbox: the one named, else the
// least loaded of the ready nodes whose labels have every constraint
// (KEY=VALUE).
func (n *Node) Place(name string, constraints []string) (api.Node, error) {
	want := map[string]string{}
	for i, c := range constraints {
		k, v, ok := strings.Cut(c, "=")
		if !ok || k == "" {
			return api.Node{}, fmt.Errorf("%w: constraints[%d] %q: want KEY=VALUE, a node label", errdefs.ErrInvalidArgument, i, api.Clip(c))
		}
		want[k] = v
	}
	if name != "" {
		if err := ValidateNode(name); err != nil {
			return api.Node{}, fmt.Errorf("%w: node: %v", errdefs.ErrInvalidArgument, err)
		}
	}
	if err := n.usable(); err != nil {
		if name != "" && name != n.cfg.Node || len(want) > 0 {
			return api.Node{}, fmt.Errorf("placing the sandbox: %w", err)
		}
		// Down, the cluster cannot say where: here.
		return api.Node{Name: n.cfg.Node, State: api.NodeReady, Self: true}, nil
	}
	nodes := n.Nodes()
	if name != "" {
		for _, d := range nodes {
			if d.Name != name {
				continue
			}
			if d.State != api.NodeReady {
				return api.Node{}, fmt.Errorf("%w: node %s is %s: it takes no new sandboxes", errdefs.ErrFailedPrecondition, name, d.State)
			}
			if !hasLabels(d, want) {
				return api.Node{}, fmt.Errorf("%w: node %s does not have the labels %s", errdefs.ErrFailedPrecondition, name, strings.Join(constraints, ", "))
			}
			return d, nil
		}
		return api.Node{}, fmt.Errorf("%w: node %q: no such node in the cluster (GET /nodes lists them)", errdefs.ErrInvalidArgument, api.Clip(name))
	}
	var fit []api.Node
	for _, d := range nodes {
		if d.State == api.NodeReady && hasLabels(d, want) {
			fit = append(fit, d)
		}
	}
	if len(fit) == 0 {
		if len(want) > 0 {
			return api.Node{}, fmt.Errorf("%w: no ready node has the labels %s", errdefs.ErrFailedPrecondition, strings.Join(constraints, ", "))
		}
		return api.Node{}, fmt.Errorf("%w: no node of the cluster is ready to take a sandbox", errdefs.ErrUnavailable)
	}
	// The most free memory per sandbox it would have; then fewer
	// sandboxes; then this node, which needs no hop; then by name.
	slices.SortStableFunc(fit, func(a, b api.Node) int {
		return cmp.Or(
			cmp.Compare(b.FreeMemoryBytes/int64(b.Sandboxes+1), a.FreeMemoryBytes/int64(a.Sandboxes+1)),
			cmp.Compare(a.Sandboxes, b.Sandboxes),
			boolOrder(b.Self, a.Self),
			strings.Compare(a.Name, b.Name))
	})
	return fit[0], nil
}

func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

func hasLabels(d api.Node, want map[string]string) bool {
	for k, v := range want {
		if got, ok := d.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// ForwardedHeader marks a request one node sends another: it is served
// where it lands, never sent on.
const ForwardedHeader = "Kiln-Forwarded-By"

// Forward serves r by node to, whose API answers it as its own; the
// cluster's token authenticates this node there, the caller's own
// credentials go no further.
func (n *Node) Forward(w http.ResponseWriter, r *http.Request, to api.Node) {
	if u, err := url.Parse(to.APIURL); err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https" {
		// Its heartbeat said so: nothing this node can reach.
		reply.Error(w, errdefs.New(errdefs.ErrUnavailable, "node "+to.Name+" has no API address this node can reach"))
		return
	}
	n.proxy(to).ServeHTTP(w, r)
}

func (n *Node) proxy(to api.Node) *httputil.ReverseProxy {
	n.mu.Lock()
	defer n.mu.Unlock()
	key := to.Name + " " + to.APIURL
	if p := n.proxies[key]; p != nil {
		return p
	}
	p := newProxy(n, to)
	n.proxies[key] = p
	return p
}

// ReadTokenFile reads a token file: its first line, trimmed.
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	t, _, _ := strings.Cut(string(b), "\n")
	t = strings.TrimSpace(t)
	if t == "" {
		return "", errors.New("the file is empty")
	}
	return t, nil
}
