// Package daemon is kilnd: it creates and tracks sandboxes, keeps their records in the state directory, authenticates callers and routes each process call to the sandbox's agent.
package daemon

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/console"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/image"
	"github.com/sandkiln/sandkiln/internal/outexport"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// Config sets up kilnd.
type Config struct {
	// StateDir holds the token, the API socket and every sandbox's
	// directory.
	StateDir string
	// Listen is the TCP address of the API (bearer token required); empty
	// serves the unix socket only.
	Listen string
	// AllowOrigins are browser origins allowed beside kilnd's own.
	AllowOrigins []string
	// AllowHosts are the Host values a TCP request may carry beside
	// localhost, the loopback addresses and the listen address's own, with
	// its port: a name (any port) or a name:port. None may be under
	// PreviewDomain.
	AllowHosts []string
	// PreviewDomain is the domain each preview gets a host of its own
	// under, ID.PreviewDomain (empty: DefaultPreviewDomain, localhost);
	// every name under it is the previews' (see previewHost).
	PreviewDomain string
	// PreviewListen, when set, is the TCP address previews are served on,
	// alone; otherwise the API's TCP listener serves them too, each on
	// its own host.
	PreviewListen string
	// Exe is the binary re-executed as each sandbox's agent.
	Exe string
	// Runsc is gVisor's runsc binary, for the gvisor runtime (empty: that
	// runtime is not available); RunscPlatform its platform (default
	// systrap).
	Runsc         string
	RunscPlatform string
	// Env is the base environment of sandboxed processes.
	Env []string
	// Images is the only directory a sandbox's rootfs may come from
	// (default STATE_DIR/images): any other host directory could hand a
	// sandbox files it must not see, kilnd's own state among them.
	Images string
	// AllowMounts are the host directories a sandbox's mounts may come
	// from (their sources, symbolic links resolved, below one of them);
	// without any, every mount is refused. Each must be an absolute path
	// of an existing directory, which kilnd resolves through symbolic
	// links once, at start (check), and holds no part of StateDir.
	AllowMounts []string
	// CaptureQueue bounds, per captured process, the output queued for
	// its log writer, in bytes (zero: capture.DefaultQueueBytes).
	CaptureQueue int64
	// Logs is the rotation of captured logs of a sandbox whose create
	// request sets none (zero fields: DefaultLogs').
	Logs Logs
	// FlowGrace is how long a flow block process's output waits for its
	// holding watcher: to come, and to come back (zero: 30 s).
	FlowGrace time.Duration
	// ReadTimeout is how long a request, its body included, may take to
	// arrive (zero: a minute); a file upload cut by it changes nothing.
	ReadTimeout time.Duration
	// KeepDeleted is how long a deleted sandbox's record and directory,
	// its captured logs with it, stay after its delete (zero:
	// DefaultKeepDeleted).
	KeepDeleted time.Duration
	// DefaultLimits are the limits of a sandbox whose request leaves them
	// out (nil: DefaultLimits; a zero field there is no limit).
	DefaultLimits *api.Limits
	// Instance is this kilnd's name among the host's (empty:
	// DefaultInstance of StateDir): see instance.go.
	Instance string
	// EgressRange is where the addresses of sandboxes with a network come
	// from (zero: the one this instance had, else the first free one from
	// egress.DefaultRange); EgressDNS the name servers they are given
	// (empty: the host's, egress.HostResolvers).
	EgressRange netip.Prefix
	EgressDNS   []netip.Addr
	// ClaimsDir is where the kilnds of the host claim their egress ranges
	// and uid windows (empty: DefaultClaimsDir).
	ClaimsDir string
	// InsecureRegistries are the registries (host or host:port) images
	// are pulled from over plain HTTP, beside those on loopback addresses.
	InsecureRegistries []string
	Log                *slog.Logger
	// Warm is how many sandboxes of the everyday shape kilnd keeps made
	// ahead, by runtime, for creates of that shape to take at once (see
	// warm.go); a runtime left out, or one this host does not have, gets
	// none.
	Warm map[string]int
	// SnapshotQuota bounds how much of the host's disk snapshots take
	// together (zero: DefaultSnapshotQuota).
	SnapshotQuota int64
	// MCP, when set, serves the Model Context Protocol's streamable HTTP
	// transport at /mcp, behind the token like every other route; nil
	// answers /mcp not found. kilnd's binary gives it the MCP server
	// kiln mcp runs, calling back into kilnd on its unix socket.
	MCP http.Handler
	// Wrap, when set, is put around the API's handler, the socket's and
	// the TCP listener's, as Serve serves them: a test holds every answer
	// to the OpenAPI document with it.
	Wrap func(http.Handler) http.Handler

	// uidFirst is the first uid of the instance's window (New claims
	// it); zero: sandbox.DefaultUIDBase.
	uidFirst int
	// Cluster, when set, makes kilnd a node of a cluster kept in NATS
	// JetStream (kilnd --cluster), joined as Serve starts.
	Cluster *cluster.Config
}

// DefaultLimits are a sandbox's limits unless kilnd is told otherwise: no
// sandbox created with {} can take the host's memory, fill its process
// table or hold every core.
var DefaultLimits = api.Limits{MemoryBytes: 1 << 30, Pids: 1024, CPUs: 1, DiskBytes: 10 << 30}

// Names in the state directory.
const (
	SocketName   = "kilnd.sock"
	TokenName    = "token"
	sandboxesDir = "sandboxes"
	disksDir     = "disks"
	recordName   = "sandbox.json"
)

// Sandbox states, as the API names them.
const (
	StateRunning = api.SandboxRunning
	StateStopped = api.SandboxStopped
	StateDeleted = api.SandboxDeleted
)

// Daemon is kilnd.
type Daemon struct {
	cfg   Config
	token string
	log   *slog.Logger
	// lock is the state directory's (lockState), held from New to Close;
	// so are registration and uids, the instance's claims of its egress
	// range and of its window of host uids.
	lock         *os.File
	registration *egress.Registration
	uids         *sandbox.UIDRegistration
	// disks make sandboxes' disks; nil, with disksErr saying why, where
	// this host cannot.
	disks    *sandbox.Disks
	disksErr error
	// snaps are the snapshots; nil, with snapsErr saying why, where this
	// host cannot keep them (it has no disks).
	snaps    *snapshots
	snapsErr error

	// images are the OCI images sandboxes are made from.
	images *image.Store

	// mu guards sandboxes, names, live, previews, previewing and imageLeases (the
	// images creates in progress use, by ID). Creating and deleting a
	// sandbox happen outside it; the entry is added once the sandbox
	// runs. The image store calls in with its own lock held (imageInUse):
	// nothing holding mu calls it.
	mu        sync.Mutex
	sandboxes map[string]*entry // by id, deleted ones too (their logs stay)
	// names are the names of the sandboxes not deleted, and of those
	// being created, to their ids: a create claims its name before
	// anything is made, so that two creates cannot both take it, and
	// the delete that ends a sandbox frees it.
	names map[string]string
	// live are the ids of the sandboxes not deleted, sorted: where a
	// prefix of an id is looked up, by binary search. (Lists sort by
	// creation.)
	live        []string
	imageLeases map[string]int
	// previewing ends what each preview serves (by its token's hash):
	// revoked, it reaches nothing, WebSockets open through it included.
	previewing map[string]map[*struct{}]context.CancelFunc
	// previews are the sandboxes' preview tokens' hashes to their ids, so
	// that a preview request finds its sandbox without a scan. An entry
	// may outlive its preview (revoked, expired, its sandbox deleted):
	// what it names is checked against the sandbox's record.
	previews map[string]string
	// unfinished are the deletions handed to the finisher, by sandbox id.
	unfinished map[string]*deletion
	// retry wakes the finisher when a deletion is handed to it.
	retry chan struct{}

	// backends make sandboxes, by runtime name; unavailable says why
	// those this host cannot run are missing.
	backends    map[string]sandbox.Backend
	unavailable map[string]error

	// closing ends the watchers (one per running sandbox, waiting for its
	// agent to exit), the janitor and the finisher; wg waits for them.
	closing chan struct{}
	// events are what happened to the sandboxes, for GET /events.
	events *events
	// warm are the sandboxes made ahead (Config.Warm).
	warm *warmPool
	wg   sync.WaitGroup
	// cluster is d's node in a cluster (JoinCluster), nil outside one;
	// clusterStop ends what follows it, clusterToken is the cluster's API
	// token once known, accepted as d's own is.
	cluster      *cluster.Node
	clusterStop  context.CancelFunc
	clusterToken atomic.Pointer[string]
	nodeName     atomic.Pointer[string]
	// exporter keeps d's processes' output in the cluster's JetStream, on
	// exportConn; nil outside a cluster.
	exporter   *outexport.Exporter
	exportConn *nats.Conn

	metrics *metrics
	console *console.Handler

	// tcp is where the TCP listener listens, once it does (set by Serve,
	// read by requests and by TCPAddr's callers).
	tcp atomic.Pointer[net.TCPAddr]
	// previewTCP is where the previews' own listener listens, once it
	// does (Config.PreviewListen).
	previewTCP atomic.Pointer[net.TCPAddr]

	// netMu guards net, made when a sandbox first needs it (so that a
	// kilnd whose sandboxes have no network never touches the host's
	// firewall), and adopted, the attachments of the sandboxes that
	// outlived the last kilnd, which net takes when it is made.
	netMu   sync.Mutex
	net     *egress.Manager
	adopted map[string]egress.Attachment
}

// New opens the state directory (making it and the token on first start)
// and finds the sandboxes of an earlier run: those whose agent still runs
// are adopted as they are; the others are marked stopped, what is left of
// them killed, their captured logs kept.
func New(cfg Config) (_ *Daemon, err error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.DefaultLimits == nil {
		cfg.DefaultLimits = &DefaultLimits
	}
	if cfg.SnapshotQuota == 0 {
		cfg.SnapshotQuota = DefaultSnapshotQuota
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	lock, err := lockState(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	if cfg.Images == "" {
		cfg.Images = filepath.Join(cfg.StateDir, "images")
	}
	if err := os.MkdirAll(cfg.Images, 0o700); err != nil {
		return nil, fmt.Errorf("kilnd: images directory: %w", err)
	}
	// On a pure cgroup v2 host kilnd moves into a leaf of its cgroup and
	// enables the controllers its sandboxes' groups need: refused now,
	// saying why, if that cgroup is not delegated to it, rather than at
	// every create.
	if err := sandbox.PrepareCgroups(); err != nil {
		return nil, fmt.Errorf("kilnd: %w", err)
	}
	uids, err := sandbox.ClaimUIDs(filepath.Join(cmp.Or(cfg.ClaimsDir, DefaultClaimsDir), "uids"), cfg.Instance, canonical(cfg.StateDir))
	if err != nil {
		return nil, fmt.Errorf("kilnd: %w", err)
	}
	defer func() {
		if err != nil {
			uids.Close()
		}
	}()
	cfg.uidFirst = uids.First()
	d := &Daemon{cfg: cfg, log: cfg.Log, lock: lock, uids: uids, sandboxes: map[string]*entry{}, names: map[string]string{},
		unfinished: map[string]*deletion{}, retry: make(chan struct{}, 1), closing: make(chan struct{}), events: newEvents(), warm: newWarmPool()}
	d.backends, d.unavailable = Backends(cfg)
	if d.images, err = image.Open(filepath.Join(cfg.StateDir, imagesDir), image.Options{Insecure: cfg.InsecureRegistries}); err != nil {
		return nil, fmt.Errorf("kilnd: images: %w", err)
	}
	d.metrics = newMetrics(d)
	if d.console, err = console.New(); err != nil {
		return nil, fmt.Errorf("kilnd: the web console: %w", err)
	}
	if d.token, err = loadToken(filepath.Join(cfg.StateDir, TokenName)); err != nil {
		return nil, err
	}
	if err := d.recover(); err != nil {
		return nil, err
	}
	if err := d.registerEgress(); err != nil {
		// The watchers recover started for the sandboxes it adopted.
		close(d.closing)
		d.wg.Wait()
		return nil, err
	}
	var inUse []string
	for _, e := range d.sandboxes {
		if e.rec.Disk != "" && e.rec.State != StateDeleted {
			inUse = append(inUse, e.rec.Disk)
		}
	}
	if d.disks, err = sandbox.NewDisks(filepath.Join(cfg.StateDir, disksDir), cfg.DefaultLimits.DiskBytes, inUse); err != nil {
		// Sandboxes are made without a disk quota, and say so in their
		// limits; one asked for explicitly is refused.
		d.log.Warn("no disk quotas: sandboxes write to the state directory's filesystem", "err", err)
		d.disksErr, d.disks = err, nil
	}
	if d.disks == nil {
		d.snapsErr = d.disksErr
	} else if d.snaps, err = openSnapshots(filepath.Join(cfg.StateDir, snapshotsDir), cfg.SnapshotQuota); err != nil {
		d.snapsErr = err
		d.log.Warn("no snapshots", "err", err)
	} else {
		how := "copied (the state directory's file system does not share extents)"
		if d.snaps.reflink {
			how = "copied by reflink"
		}
		d.log.Info("snapshots: disks "+how, "filesystem", sandbox.FSName(d.snaps.dir), "snapshots", len(d.snaps.byID), "quota", cfg.SnapshotQuota)
	}
	d.wg.Go(d.janitor)
	d.wg.Go(d.finisher)
	if len(d.warmRuntimes()) > 0 {
		d.wg.Go(d.warmer)
	}
	return d, nil
}

// check checks cfg and fills in its defaults, and makes the state
// directory, kilnd's alone (0700, not a symbolic link).
func (cfg *Config) check() error {
	if err := ValidateLimits(*cfg.DefaultLimits, ""); err != nil {
		return fmt.Errorf("kilnd: default limits: %w", err)
	}
	if err := ValidateLogs(api.LogRotation(cfg.Logs), ""); err != nil {
		return fmt.Errorf("kilnd: default log rotation: %w", err)
	}
	if err := ValidatePreviewDomain(cfg.PreviewDomain, cfg.AllowHosts); err != nil {
		return fmt.Errorf("kilnd: %w", err)
	}
	for rt, n := range cfg.Warm {
		if !slices.Contains(RuntimeNames, rt) || n < 0 || n > MaxWarm {
			return fmt.Errorf("kilnd: warm %s=%d: want a runtime (%s) and 0 to %d", rt, n, strings.Join(RuntimeNames, " or "), MaxWarm)
		}
	}
	if cfg.Instance == "" {
		cfg.Instance = DefaultInstance(cfg.StateDir)
	}
	if err := ValidateInstance(cfg.Instance); err != nil {
		return fmt.Errorf("kilnd: %w", err)
	}
	cfg.Logs = DefaultLogs.Apply(api.LogRotation(cfg.Logs))
	if cfg.KeepDeleted <= 0 {
		cfg.KeepDeleted = DefaultKeepDeleted
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, sandboxesDir), 0o700); err != nil {
		return fmt.Errorf("kilnd: state directory: %w", err)
	}
	fi, err := os.Lstat(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("kilnd: state directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("kilnd: state directory %s is not a directory (a symbolic link is refused)", cfg.StateDir)
	}
	if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("kilnd: state directory: %w", err)
	}
	return cfg.checkMounts()
}

// janitor deletes, keeping their captured logs, the sandboxes past
// their TTL or idle for longer than their idle timeout, and removes those
// deleted longer than KeepDeleted ago (sweep).
func (d *Daemon) janitor() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-d.closing:
			return
		case <-t.C:
		}
		now := time.Now()
		d.sweep(now)
		for _, id := range d.expired(now, d.busy(d.idleCandidates(now))) {
			if err := d.delete(id, false, true); err != nil {
				d.log.Error("delete an expired sandbox", "id", id, "err", err)
			} else {
				d.log.Info("expired sandbox deleted", "id", id)
			}
		}
	}
}

// idleCandidates are the running sandboxes that no request has used for
// longer than their idle timeout, each with the transport to its agent.
// A paused sandbox is none: its idle timeout counts from its resume.
func (d *Daemon) idleCandidates(now time.Time) map[string]http.RoundTripper {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]http.RoundTripper{}
	for id, e := range d.sandboxes {
		if e.rec.State == StateRunning && !e.deleting && !e.paused() && e.rec.IdleTimeout > 0 && e.inflight == 0 &&
			now.Sub(e.lastUsed) > time.Duration(e.rec.IdleTimeout)*time.Second && e.proxy != nil {
			out[id] = e.proxy.Transport
		}
	}
	return out
}

// busy asks the agent of each candidate whether a process runs in its
// sandbox (one started and not yet finished: a detached build, a
// server): those are in use, whoever watches. An agent that does not
// answer leaves its sandbox idle.
func (d *Daemon) busy(candidates map[string]http.RoundTripper) map[string]bool {
	ids := slices.Collect(maps.Keys(candidates))
	running := make([]bool, len(ids))
	fewAtATime(len(ids), func(i int) {
		if c := agentCounts(context.Background(), candidates[ids[i]]); c != nil {
			running[i] = c.ProcessesStarted > c.ExitedZero+c.ExitedNonZero+c.Signaled
		}
	})
	out := map[string]bool{}
	for i, id := range ids {
		out[id] = running[i]
	}
	return out
}

// expired marks deleting, and returns, the running sandboxes past their
// TTL, and those of idle (their ids to whether a process runs in them)
// still idle: a sandbox with a process running counts as used now.
// Decided and taken under one lock: a request arriving now finds the
// sandbox being deleted, not half gone.
func (d *Daemon) expired(now time.Time, idle map[string]bool) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for id, e := range d.sandboxes {
		if e.rec.State != StateRunning || e.deleting {
			continue
		}
		switch running, checked := idle[id]; {
		case e.rec.TTL > 0 && now.Sub(e.rec.CreatedAt) > time.Duration(e.rec.TTL)*time.Second:
			e.rec.Reason = fmt.Sprintf("its ttl of %ds ended", e.rec.TTL)
		case checked && running:
			e.lastUsed = now
			continue
		case checked && e.inflight == 0 && now.Sub(e.lastUsed) > time.Duration(e.rec.IdleTimeout)*time.Second:
			e.rec.Reason = fmt.Sprintf("idle for %ds", e.rec.IdleTimeout)
		default:
			continue
		}
		e.deleting, e.proxy = true, nil
		out = append(out, id)
	}
	return out
}

// untilClosing is a context that ends when kilnd closes, or when it is
// cancelled.
func (d *Daemon) untilClosing() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-d.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Token is the bearer token TCP clients must present.
func (d *Daemon) Token() string { return d.token }

// DefaultLogs is the rotation of captured logs that neither kilnd nor a
// create request sets: 10 MiB × 5, the seed's.
var DefaultLogs = Logs{MaxSizeBytes: capture.DefaultMaxSize, MaxFiles: capture.DefaultMaxFiles}

// maxConns bounds the connections each listener serves at once; more wait
// to be accepted.
const maxConns = 4096

// Close stops kilnd's own goroutines (not the sandboxes) and ends the
// sandboxes made ahead, which are nobody's. Call it after Serve has
// returned.
func (d *Daemon) Close() {
	close(d.closing)
	if d.cluster != nil {
		d.clusterStop()
	}
	d.wg.Wait()
	d.leaveCluster()
	d.closeWarm()
	// What a runtime shares between its sandboxes and makes again when it
	// needs it (runsc's mount of its empty network namespace).
	for _, b := range d.backends {
		if r, ok := b.(interface{ Release() }); ok {
			r.Release()
		}
	}
	d.registration.Close()
	d.uids.Close()
	d.lock.Close()
}
