// Package daemon is kilnd: it creates and tracks sandboxes, keeps their records in the state directory, authenticates callers and routes each process call to the sandbox's agent.
package daemon

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/console"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/image"
	"github.com/sandkiln/sandkiln/internal/reply"
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

// record is a sandbox's small JSON file, written atomically on every
// change, from which a restarted kilnd finds it again.
type record struct {
	ID string `json:"id"`
	// Name is the name it was created with, if any (see Daemon.names).
	Name      string         `json:"name,omitempty"`
	State     string         `json:"state"`
	CreatedAt time.Time      `json:"created_at"`
	StoppedAt *time.Time     `json:"stopped_at,omitempty"`
	Hostname  string         `json:"hostname"`
	Rootfs    string         `json:"rootfs,omitempty"`
	Limits    sandbox.Limits `json:"limits"`
	Reason    string         `json:"reason,omitempty"` // why it stopped
	// Init is the command whose exit ends the sandbox; Exit is that exit,
	// once the agent recorded it.
	Init        *api.ExecRequest `json:"init,omitempty"`
	Exit        *api.Exit        `json:"exit,omitempty"`
	IdleTimeout int64            `json:"idle_timeout_seconds,omitempty"`
	// Runtime is the backend that made it (empty in records older than
	// backends: the namespaces one), Sandbox that backend's state of it.
	Runtime string          `json:"runtime,omitempty"`
	Sandbox json.RawMessage `json:"sandbox,omitempty"`
	// Disk is the image of the disk holding its writable layers, when it
	// has a disk quota; deleted with the sandbox.
	Disk string `json:"disk,omitempty"`
	// Previews are its preview URLs (their tokens' hashes).
	Previews []preview `json:"previews,omitempty"`
	// Network is its place on the network beyond its loopback, if any.
	Network *egress.Attachment `json:"network,omitempty"`
	// Image is the image it was made from, as its create named it;
	// ImageID that image's ID, which keeps it from removal while the
	// sandbox runs.
	Image   string `json:"image,omitempty"`
	ImageID string `json:"image_id,omitempty"`
	// OnOOM is what happens to it past its memory limit (api.OnOOM*;
	// empty in records older than the choice: see onOOMOf).
	OnOOM string `json:"on_oom,omitempty"`
}

// onOOMOf is what happens to rec's sandbox past its memory limit. A
// record older than the choice was made when a namespace sandbox lost
// one process and a gVisor sandbox ended as a whole, and still does.
func onOOMOf(rec record) string {
	switch {
	case rec.OnOOM != "":
		return rec.OnOOM
	case runtimeOf(rec) == sandbox.RuntimeGVisor:
		return api.OnOOMEndSandbox
	}
	return api.OnOOMKillProcess
}

// entry is a known sandbox and, while it runs, the route to its agent.
type entry struct {
	rec record
	// sb is the sandbox as its backend knows it; nil when the backend
	// could not take it back (its state is unreadable, its runtime gone).
	sb       sandbox.Instance
	proxy    *httputil.ReverseProxy
	deleting bool // Delete has it: the watcher leaves it alone
	// unfinished is its deletion until that is finished (see delete.go).
	unfinished *deletion
	// Activity, for the idle timeout: requests in flight (a watcher's
	// WebSocket counts for as long as it is open) and the last one's end.
	inflight int
	lastUsed time.Time
}

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
	// live are the ids of the sandboxes not deleted, in order (v7 ids
	// sort by creation): List's order, and where a prefix of an id is
	// looked up, by binary search.
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
	wg      sync.WaitGroup

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
	if err := ValidateLimits(*cfg.DefaultLimits, ""); err != nil {
		return nil, fmt.Errorf("kilnd: default limits: %v", err)
	}
	if err := ValidateLogs(api.LogRotation(cfg.Logs), ""); err != nil {
		return nil, fmt.Errorf("kilnd: default log rotation: %v", err)
	}
	if err := ValidatePreviewDomain(cfg.PreviewDomain, cfg.AllowHosts); err != nil {
		return nil, fmt.Errorf("kilnd: %v", err)
	}
	if cfg.Instance == "" {
		cfg.Instance = DefaultInstance(cfg.StateDir)
	}
	if err := ValidateInstance(cfg.Instance); err != nil {
		return nil, fmt.Errorf("kilnd: %v", err)
	}
	cfg.Logs = DefaultLogs.Apply(api.LogRotation(cfg.Logs))
	if cfg.KeepDeleted <= 0 {
		cfg.KeepDeleted = DefaultKeepDeleted
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, sandboxesDir), 0o700); err != nil {
		return nil, fmt.Errorf("kilnd: state directory: %w", err)
	}
	fi, err := os.Lstat(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("kilnd: state directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("kilnd: state directory %s is not a directory (a symbolic link is refused)", cfg.StateDir)
	}
	if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("kilnd: state directory: %w", err)
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
		unfinished: map[string]*deletion{}, retry: make(chan struct{}, 1), closing: make(chan struct{})}
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
	d.wg.Go(d.janitor)
	d.wg.Go(d.finisher)
	return d, nil
}

// janitor deletes, keeping their captured logs, the sandboxes idle for
// longer than their idle timeout, and removes those deleted longer than
// KeepDeleted ago (sweep).
func (d *Daemon) janitor() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-d.closing:
			return
		case <-t.C:
		}
		d.sweep(time.Now())
		var idle []string
		d.mu.Lock()
		for id, e := range d.sandboxes {
			if e.rec.State == StateRunning && !e.deleting && e.rec.IdleTimeout > 0 && e.inflight == 0 &&
				time.Since(e.lastUsed) > time.Duration(e.rec.IdleTimeout)*time.Second {
				// Decided and taken under one lock: a request arriving now
				// finds it being deleted, not half gone.
				e.rec.Reason = fmt.Sprintf("idle for %ds", e.rec.IdleTimeout)
				e.deleting, e.proxy = true, nil
				idle = append(idle, id)
			}
		}
		d.mu.Unlock()
		for _, id := range idle {
			if err := d.delete(id, false, true); err != nil {
				d.log.Error("delete an idle sandbox", "id", id, "err", err)
			} else {
				d.log.Info("idle sandbox deleted", "id", id)
			}
		}
	}
}

// loadToken reads the API token, making it on first start.
func loadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if t := strings.TrimSpace(string(b)); len(t) >= 32 {
			return t, nil
		}
		return "", fmt.Errorf("kilnd: token file %s is too short; remove it to make a new one", path)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("kilnd: token: %w", err)
	}
	raw := make([]byte, 32)
	rand.Read(raw)
	t := hex.EncodeToString(raw)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", fmt.Errorf("kilnd: token: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(t + "\n"); err != nil {
		return "", fmt.Errorf("kilnd: token: %w", err)
	}
	return t, f.Sync()
}

// Token is the bearer token TCP clients must present.
func (d *Daemon) Token() string { return d.token }

func (d *Daemon) sandboxDir(id string) string {
	return filepath.Join(d.cfg.StateDir, sandboxesDir, id)
}

// save writes a record atomically: a temporary file, synced, renamed.
func (d *Daemon) save(rec record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	dir := d.sandboxDir(rec.ID)
	tmp := filepath.Join(dir, recordName+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("kilnd: save %s: %w", rec.ID, err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, recordName))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("kilnd: save %s: %w", rec.ID, err)
	}
	if df, err := os.Open(dir); err == nil {
		df.Sync()
		df.Close()
	}
	return nil
}

// recover reads every record and reconciles it with what runs; the
// deletions an earlier kilnd left unfinished are handed to the finisher.
func (d *Daemon) recover() error {
	ents, err := os.ReadDir(filepath.Join(d.cfg.StateDir, sandboxesDir))
	if err != nil {
		return fmt.Errorf("kilnd: %w", err)
	}
	marked := d.markers()
	for _, e := range ents {
		if _, err := uuid.Parse(e.Name()); err != nil || !e.IsDir() {
			continue
		}
		removeLogs, deleting := marked[e.Name()]
		delete(marked, e.Name())
		b, err := os.ReadFile(filepath.Join(d.sandboxDir(e.Name()), recordName))
		if err != nil {
			// Created but never recorded: kilnd died during the create.
			// Its agent may run on: end it by its cgroups, then remove it.
			d.log.Warn("sandbox without a record; removing it", "id", e.Name(), "err", err)
			for _, b := range d.backends {
				if err := b.EndLeftover(e.Name(), d.sandboxDir(e.Name())); err != nil {
					d.log.Error("end a sandbox left without a record", "id", e.Name(), "runtime", b.Name(), "err", err)
				}
			}
			os.RemoveAll(d.sandboxDir(e.Name()))
			if deleting {
				os.Remove(d.marker(e.Name(), removeLogs))
			}
			continue
		}
		var rec record
		if err := json.Unmarshal(b, &rec); err != nil || rec.ID != e.Name() {
			d.log.Error("unreadable sandbox record; left as it is", "id", e.Name(), "err", err)
			continue
		}
		e := &entry{rec: rec}
		if deleting {
			// The finisher takes the sandbox back, and ends it.
			d.resume(e, removeLogs)
			d.recovered(e)
			continue
		}
		if rec.State != StateDeleted && rec.Sandbox != nil {
			e.sb, err = d.adopt(rec)
			if err != nil {
				d.log.Error("sandbox not taken back", "id", rec.ID, "runtime", rec.Runtime, "err", err)
			}
		}
		if rec.State == StateRunning {
			if e.sb != nil && e.sb.Alive() {
				e = d.route(rec, e.sb)
				e.lastUsed = time.Now()
				d.recovered(e)
				if rec.Network != nil {
					if d.adopted == nil {
						d.adopted = map[string]egress.Attachment{}
					}
					d.adopted[rec.ID] = *rec.Network
				}
				d.watch(e)
				d.log.Info("sandbox adopted", "id", rec.ID, "runtime", runtimeOf(rec), "agent", e.sb.AgentPID())
				continue
			}
			if e.sb != nil {
				e.sb.End()
			}
			d.stopped(e, "the agent was gone when kilnd started (host reboot or agent killed)")
		}
		d.recovered(e)
	}
	// Markers of deletions whose directory is gone: finished but for them.
	for id, removeLogs := range marked {
		os.Remove(d.marker(id, removeLogs))
	}
	return nil
}

// recovered adds a sandbox of an earlier run to those kilnd knows, with
// its name: the first record read that has a name keeps it (the records
// of one kilnd never share one; a state directory put together by hand
// might).
func (d *Daemon) recovered(e *entry) {
	if name := e.rec.Name; name != "" && e.rec.State != StateDeleted {
		if other, taken := d.names[name]; taken {
			d.log.Error("two sandboxes have the same name; the second is found by its id only", "name", name, "id", other, "second", e.rec.ID)
		} else {
			d.names[name] = e.rec.ID
		}
	}
	d.add(e)
}

// indexPreview records that the preview of hash is sandbox id's. Called
// with d.mu held.
func (d *Daemon) indexPreview(hash, id string) {
	if d.previews == nil {
		d.previews = map[string]string{}
	}
	d.previews[hash] = id
}

// add makes e one of the sandboxes kilnd knows (its name, if it has one,
// claimed already). Called with d.mu held, or from New.
func (d *Daemon) add(e *entry) {
	id := e.rec.ID
	d.sandboxes[id] = e
	for _, p := range e.rec.Previews {
		d.indexPreview(p.Hash, id)
	}
	if e.rec.State != StateDeleted {
		if i, found := slices.BinarySearch(d.live, id); !found {
			d.live = slices.Insert(d.live, i, id)
		}
	}
}

// forget leaves a deleted sandbox to be found by its exact id alone (its
// captured logs may stay): its name is free and its id's prefixes find
// other sandboxes. Called with d.mu held.
func (d *Daemon) forget(e *entry) {
	id := e.rec.ID
	if e.rec.Name != "" && d.names[e.rec.Name] == id {
		delete(d.names, e.rec.Name)
	}
	if i, found := slices.BinarySearch(d.live, id); found {
		d.live = slices.Delete(d.live, i, i+1)
	}
}

// claimName reserves name for the sandbox id that a create is making;
// the create frees it with freeName if it fails.
func (d *Daemon) claimName(name, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if other, taken := d.names[name]; taken {
		return fmt.Errorf("%w: sandbox name %q is taken by sandbox %s", errdefs.ErrAlreadyExists, name, other)
	}
	d.names[name] = id
	return nil
}

func (d *Daemon) freeName(name, id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.names[name] == id {
		delete(d.names, name)
	}
}

// lookup finds the sandbox ref stands for, as Docker finds a container:
// the sandbox whose id it is (a deleted one too), else the one it names,
// else the one not deleted whose id it begins. A prefix that two or more
// ids begin with is refused. Called with d.mu held.
func (d *Daemon) lookup(ref string) (*entry, error) {
	if e, ok := d.sandboxes[ref]; ok {
		return e, nil
	}
	if id, ok := d.names[ref]; ok {
		if e, ok := d.sandboxes[id]; ok {
			return e, nil
		}
		// Claimed by a create that has not made it yet: it may still be
		// a prefix.
	}
	if ref != "" {
		i, _ := slices.BinarySearch(d.live, ref)
		n := 0
		for _, id := range d.live[i:] {
			if !strings.HasPrefix(id, ref) {
				break
			}
			n++
		}
		switch {
		case n == 1:
			return d.sandboxes[d.live[i]], nil
		case n > 1:
			return nil, fmt.Errorf("%w: sandbox prefix %q matches %d sandboxes: give more of the id, or its name", errdefs.ErrInvalidArgument, clip(ref), n)
		}
	}
	return nil, fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, clip(ref))
}

// runtimeOf is the runtime that made a sandbox.
func runtimeOf(rec record) string {
	if rec.Runtime == "" {
		return sandbox.RuntimeNamespaces
	}
	return rec.Runtime
}

// adopt takes a recorded sandbox back from its backend.
func (d *Daemon) adopt(rec record) (sandbox.Instance, error) {
	b, ok := d.backends[runtimeOf(rec)]
	if !ok {
		return nil, fmt.Errorf("unknown runtime %q", clip(rec.Runtime))
	}
	return b.Adopt(rec.Sandbox)
}

// stopped records that a sandbox is no longer running. The init
// command's exit, if the agent recorded one, becomes the sandbox's;
// otherwise its exit is unknown. Whatever is left of it is the caller's
// to end (Instance.End), outside d.mu: that can take a while.
func (d *Daemon) stopped(e *entry, reason string) {
	rec := &e.rec
	if e.sb != nil {
		if ie := e.sb.InitExit(); ie != nil {
			rec.Exit, reason = &ie.Exit, "the init command ended: "+ie.Exit.String()
		}
	}
	if rec.Exit == nil {
		reason += "; exit unknown"
	}
	now := time.Now().UTC()
	rec.State, rec.StoppedAt, rec.Reason = StateStopped, &now, reason
	if err := d.save(*rec); err != nil {
		d.log.Error("record a stopped sandbox", "id", rec.ID, "err", err)
	}
}

// agentExited is the reason a sandbox whose agent exited stopped.
func agentExited(sb sandbox.Instance) string {
	if r := sb.ExitReason(); r != "" {
		return r
	}
	return "the agent exited"
}

// watch waits, in a goroutine, for a running sandbox's agent to exit, and
// then records the sandbox stopped (with its init command's exit).
func (d *Daemon) watch(e *entry) {
	sb, id := e.sb, e.rec.ID
	d.wg.Go(func() {
		sb.AwaitExit(d.closing)
		select {
		case <-d.closing:
			return
		default:
		}
		d.mu.Lock()
		deleting := e.deleting
		d.mu.Unlock()
		if deleting {
			return
		}
		reason := agentExited(sb) // before End takes its groups
		sb.End()
		d.unplug(id)
		d.mu.Lock()
		defer d.mu.Unlock()
		if e.deleting || e.rec.State != StateRunning {
			return
		}
		d.stopped(e, reason)
		e.proxy = nil
		d.metrics.stopped.WithLabelValues("stopped").Inc()
		d.log.Info("sandbox stopped", "id", e.rec.ID, "reason", e.rec.Reason)
	})
}

// Close stops kilnd's own goroutines (not the sandboxes). Call it after
// Serve has returned.
func (d *Daemon) Close() {
	close(d.closing)
	d.wg.Wait()
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

// route makes the entry of a running sandbox, with its proxy to the
// agent: /sandboxes/{id}/rest goes to the agent as /rest.
func (d *Daemon) route(rec record, sb sandbox.Instance) *entry {
	p := &httputil.ReverseProxy{
		Transport: sandbox.Transport(sb.Dial),
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "agent"
			pr.Out.Host = "agent"
			pr.Out.URL.Path, pr.Out.URL.RawPath = agentPath(pr.In.URL)
			// The token never reaches the agent.
			stripCredentials(pr.In, pr.Out.Header)
		},
		FlushInterval: -1, // output goes out as it comes
		BufferPool:    proxyBuffers,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if err := brokenUpload(r); err != nil {
				reply.Error(w, err)
				return
			}
			if !sb.Alive() {
				reply.Error(w, errdefs.New(errdefs.ErrUnavailable, "kilnd: sandbox "+rec.ID+" is not running"))
				return
			}
			// The request may have reached the agent: nobody can say
			// whether it took effect. (What the transport said of it
			// names the agent's socket, a path of the host's.)
			reply.Error(w, errdefs.Opaque(errdefs.ErrOutcomeUnknown, "kilnd: sandbox "+rec.ID+": no answer from the agent", err))
		},
	}
	return &entry{rec: rec, sb: sb, proxy: p}
}

// proxyBuffers are the forwarding proxies' copy buffers: a file read or
// a tar moves in fewer, larger writes than the default 32 KiB.
var proxyBuffers = &bufferPool{sync.Pool{New: func() any { return new([proxyBuffer]byte) }}}

const proxyBuffer = 256 << 10

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte { return b.p.Get().(*[proxyBuffer]byte)[:] }

func (b *bufferPool) Put(x []byte) {
	if len(x) == proxyBuffer {
		b.p.Put((*[proxyBuffer]byte)(x))
	}
}

// agentPath is a process call's path at the agent: what follows
// /sandboxes/{id}, as the client escaped it. An escaped slash or dot stays
// inside its segment, a process id the agent does not know, instead of
// becoming a separator or a dot-dot the agent would clean and redirect.
func agentPath(u *url.URL) (path, rawPath string) {
	rest := u.EscapedPath()
	for range 2 { // "sandboxes", then the id
		_, after, ok := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
		if !ok {
			return "/", ""
		}
		rest = "/" + after
	}
	path, err := url.PathUnescape(rest)
	if err != nil { // not from a parsed URL
		return "/", ""
	}
	return path, rest
}

// CreateRequest is the body of POST /sandboxes.
type CreateRequest = api.CreateSandbox

// Info describes a sandbox in the API.
type Info = api.Sandbox

// infoOf describes e under the lock that guards its record.
func (d *Daemon) infoOf(e *entry) Info {
	d.mu.Lock()
	defer d.mu.Unlock()
	return e.info()
}

func (e *entry) info() Info {
	i := Info{ID: e.rec.ID, Name: e.rec.Name, State: e.rec.State, CreatedAt: e.rec.CreatedAt, StoppedAt: e.rec.StoppedAt,
		Hostname: e.rec.Hostname, Rootfs: e.rec.Rootfs, Image: e.rec.Image, ImageID: e.rec.ImageID, Limits: e.rec.Limits, Reason: e.rec.Reason,
		Exit: e.rec.Exit, IdleTimeoutSeconds: e.rec.IdleTimeout, Runtime: runtimeOf(e.rec), OnOOM: onOOMOf(e.rec)}
	if e.rec.State == StateRunning && e.sb != nil {
		i.AgentPID = e.sb.AgentPID()
	}
	if a := e.rec.Network; a != nil {
		n := a.Policy
		n.Address = a.Addr.String()
		i.Network = &n
	}
	return i
}

// Create makes a sandbox and records it.
func (d *Daemon) Create(ctx context.Context, req CreateRequest) (Info, error) {
	limits := req.Limits.Apply(*d.cfg.DefaultLimits)
	// The request is checked whole before anything of the host's is read
	// or made, its image included; an init without a command, which takes
	// its image's, is checked again once it has it.
	if err := validateCreate(req, limits); err != nil {
		return Info{}, err
	}
	var img image.Image
	var layers []string
	if req.Image != "" {
		if req.Rootfs != "" {
			return Info{}, fmt.Errorf("%w: an image or a rootfs, not both", errdefs.ErrInvalidArgument)
		}
		var release func()
		var err error
		if img, layers, release, err = d.imageRoot(req.Image); err != nil {
			return Info{}, err
		}
		defer release()
		if req.Init != nil && req.Init.Command == "" {
			// The image's command, as docker run has it.
			if argv := img.Config.Command(req.Init.Args); len(argv) > 0 {
				init := *req.Init
				init.Command, init.Args = argv[0], argv[1:]
				req.Init = &init
			}
			if err := req.Init.Check(false); err != nil {
				return Info{}, fmt.Errorf("%w: init: %w", errdefs.ErrInvalidArgument, err)
			}
		}
	}
	logs := d.cfg.Logs
	if req.Logs != nil {
		logs = logs.Apply(*req.Logs)
	}
	runtime := req.Runtime
	if runtime == "" {
		runtime = sandbox.RuntimeNamespaces
	}
	backend, ok := d.backends[runtime]
	if !ok {
		return Info{}, fmt.Errorf("%w: runtime %q: want %s", errdefs.ErrInvalidArgument, clip(runtime), strings.Join(RuntimeNames, " or "))
	}
	if why := d.unavailable[runtime]; why != nil {
		return Info{}, errdefs.Opaque(errdefs.ErrUnavailable, fmt.Sprintf("kilnd: runtime %s is not available on this host (kilnd --runtimes says why)", runtime), why)
	}
	rootfs, err := d.resolveRootfs(req.Rootfs)
	if err != nil {
		return Info{}, err
	}
	req.Rootfs = rootfs
	if d.disks == nil && limits.DiskBytes > 0 {
		if req.Limits.DiskBytes != nil {
			return Info{}, errdefs.Opaque(errdefs.ErrUnavailable, "kilnd: this host cannot make sandbox disks, so no disk quota (kilnd's log says why, when it started)", d.disksErr)
		}
		limits.DiskBytes = 0 // the default, which this host cannot apply
	}
	if err := d.diskFits(limits.DiskBytes); err != nil {
		return Info{}, err
	}
	id := uuid.Must(uuid.NewV7()).String()
	created := false
	if req.Name != "" {
		if err := d.claimName(req.Name, id); err != nil {
			return Info{}, err
		}
		defer func() {
			if !created {
				d.freeName(req.Name, id)
			}
		}()
	}
	var disk *sandbox.Disk
	if limits.DiskBytes > 0 {
		if disk, err = d.disks.Take(limits.DiskBytes); err != nil {
			return Info{}, d.hostFailure(fmt.Sprintf("sandbox %s: its disk could not be made", id), err)
		}
		// The agent has it once it started; this copy goes either way.
		defer disk.Mount.Close()
	}
	var diskMount *os.File
	var diskImage string
	if disk != nil {
		diskMount, diskImage = disk.Mount, disk.Image
	}
	began := time.Now()
	rec := record{ID: id, Name: req.Name, State: StateRunning, CreatedAt: began.UTC(), Hostname: req.Hostname,
		Rootfs: req.Rootfs, Limits: limits, Init: req.Init, IdleTimeout: req.IdleTimeoutSeconds,
		Runtime: backend.Name(), Disk: diskImage, OnOOM: cmp.Or(req.OnOOM, api.OnOOMEndSandbox)}
	if req.Image != "" {
		rec.Image, rec.ImageID = req.Image, img.ID
	}
	if rec.Hostname == "" {
		rec.Hostname = req.Name
	}
	if rec.Hostname == "" {
		rec.Hostname = sandbox.DefaultHostname(id)
	}
	opts := sandbox.Options{
		Dir: d.sandboxDir(id), ID: id, Hostname: rec.Hostname,
		Rootfs: req.Rootfs, Layers: layers, Limits: limits, Disk: diskMount, Env: d.cfg.Env, Init: req.Init, CaptureQueue: d.cfg.CaptureQueue,
		CaptureMaxSize: logs.MaxSizeBytes, CaptureMaxFiles: logs.MaxFiles, FlowGrace: d.cfg.FlowGrace,
		EndOnOOM: rec.OnOOM == api.OnOOMEndSandbox,
		Workdir:  img.Config.WorkingDir, Entrypoint: img.Config.Entrypoint, Cmd: img.Config.Cmd, User: img.Config.User,
		// The record is written while the agent sets itself up (a backend
		// that cannot say when it runs has it written once it answers).
		Started: func(state json.RawMessage) error {
			rec.Sandbox = state
			return d.save(rec)
		},
	}
	if req.Image != "" {
		opts.Env = withEnv(d.cfg.Env, img.Config.Env)
	}
	if egress.Wanted(req.Network) {
		if err := d.plug(id, *req.Network, &rec, &opts); err != nil {
			if disk != nil {
				d.disks.Release(diskImage)
			}
			return Info{}, err
		}
	}
	// undo is what a failed create leaves to release.
	undo := func() {
		if disk != nil {
			d.disks.Release(diskImage)
		}
		if rec.Network != nil {
			d.unplug(id)
		}
	}
	sb, err := backend.Create(ctx, opts)
	if err != nil {
		os.RemoveAll(d.sandboxDir(id))
		undo()
		return Info{}, d.hostFailure(fmt.Sprintf("sandbox %s could not be made", id), err)
	}
	if state := sb.State(); !bytes.Equal(state, rec.Sandbox) {
		rec.Sandbox = state
		if err := d.save(rec); err != nil {
			sb.Destroy(false)
			undo()
			return Info{}, d.hostFailure(fmt.Sprintf("sandbox %s could not be recorded", id), err)
		}
	}
	d.metrics.creates.Observe(time.Since(began).Seconds())
	e := d.route(rec, sb)
	e.lastUsed = time.Now()
	d.mu.Lock()
	d.add(e)
	d.watch(e)
	d.mu.Unlock()
	created = true
	d.log.Info("sandbox created", "id", id, "name", req.Name, "runtime", backend.Name(), "agent", sb.AgentPID())
	return d.infoOf(e), nil
}

// withEnv is base with env's entries added, each replacing base's of the
// same name: an image's environment over kilnd's.
func withEnv(base, env []string) []string {
	out := slices.Clone(base)
	for _, e := range env {
		name, _, _ := strings.Cut(e, "=")
		out = slices.DeleteFunc(out, func(b string) bool { return strings.HasPrefix(b, name+"=") })
		out = append(out, e)
	}
	return out
}

// DefaultLogs is the rotation of captured logs that neither kilnd nor a
// create request sets: 10 MiB × 5, the seed's.
var DefaultLogs = Logs{MaxSizeBytes: capture.DefaultMaxSize, MaxFiles: capture.DefaultMaxFiles}

// Logs is a captured log's rotation, every field set.
type Logs api.LogRotation

// Apply returns l with what r sets in place of it.
func (l Logs) Apply(r api.LogRotation) Logs {
	if r.MaxSizeBytes != 0 {
		l.MaxSizeBytes = r.MaxSizeBytes
	}
	if r.MaxFiles != 0 {
		l.MaxFiles = r.MaxFiles
	}
	return l
}

// resolveRootfs finds a requested rootfs in the images directory: a name
// in it, or an absolute path that (symbolic links resolved) lies inside
// it. Nothing else is accepted. Its errors name the rootfs as the request
// gave it, never the images directory's path on the host.
func (d *Daemon) resolveRootfs(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	images, err := filepath.EvalSymlinks(d.cfg.Images)
	if err != nil {
		return "", d.hostFailure("the images directory cannot be read", err)
	}
	path := p
	if !filepath.IsAbs(path) {
		path = filepath.Join(images, path)
	}
	real, err := filepath.EvalSymlinks(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%w: rootfs %q: no such directory in kilnd's images directory", errdefs.ErrNotFound, clip(p))
	}
	if err == nil {
		if rel, rerr := filepath.Rel(images, real); rerr != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", fmt.Errorf("%w: rootfs %q: a root filesystem must be a directory in kilnd's images directory (--images), and this is not in it", errdefs.ErrInvalidArgument, clip(p))
		}
		var fi os.FileInfo
		if fi, err = os.Stat(real); err == nil && !fi.IsDir() {
			return "", fmt.Errorf("%w: rootfs %q: not a directory", errdefs.ErrInvalidArgument, clip(p))
		}
	}
	if err != nil {
		return "", d.hostFailure(fmt.Sprintf("rootfs %q cannot be read", clip(p)), err)
	}
	return real, nil
}

// diskFits refuses a disk larger than the filesystem of the state
// directory, which holds the disks' images: sparse, they may together
// promise more than it holds, but one that alone cannot be filled is no
// quota.
func (d *Daemon) diskFits(bytes int64) error {
	if bytes == 0 {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d.cfg.StateDir, &st); err != nil {
		return d.hostFailure("the state directory's filesystem cannot be read", err)
	}
	if size := int64(st.Blocks) * st.Bsize; bytes > size {
		return fmt.Errorf("%w: limits.disk_bytes %d: the filesystem of kilnd's state directory holds %d bytes", errdefs.ErrNoSpace, bytes, size)
	}
	return nil
}

// hostFailure is what a client is told of a failure on the host, what
// failed: an error of its class (no_space when the host's storage is
// full, unavailable otherwise) whose message leaves out the cause's
// words, which name host paths or speak the kernel's language. The cause
// stays wrapped, and goes to kilnd's log with them: the one place an
// operator reads it.
func (d *Daemon) hostFailure(what string, cause error) error {
	class := errdefs.ErrUnavailable
	msg := "kilnd: " + what + " (kilnd's log says why)"
	if errors.Is(cause, unix.ENOSPC) || errors.Is(cause, unix.EDQUOT) {
		class, msg = errdefs.ErrNoSpace, "kilnd: "+what+": no space left in kilnd's state directory"
	}
	d.log.Error(what, "err", cause)
	return errdefs.Opaque(class, msg, cause)
}

// get finds a sandbox not deleted by its id, its name or a unique
// prefix of its id (lookup).
func (d *Daemon) get(ref string) (*entry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, err := d.lookup(ref)
	if err != nil {
		return nil, err
	}
	if e.rec.State == StateDeleted {
		return nil, fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, clip(ref))
	}
	// A running sandbox whose agent died is stopped, as soon as anyone
	// looks; its watcher, woken by the same exit, ends its cgroups.
	if e.rec.State == StateRunning && !e.sb.Alive() && !e.deleting {
		d.stopped(e, agentExited(e.sb))
		e.proxy = nil
	}
	return e, nil
}

// List returns every sandbox not deleted, oldest first.
//
// It takes d.mu twice whatever the count: once for the entries, once for
// their infos. Between the two, outside the lock, it asks each running
// sandbox whether its agent lives (a read of /proc each): one whose agent
// died is recorded stopped, as get does, so that a list never shows it
// running.
func (d *Daemon) List() []Info {
	type seen struct {
		e    *entry
		sb   sandbox.Instance // when running and not being deleted
		dead bool
	}
	d.mu.Lock()
	all := make([]seen, 0, len(d.live))
	for _, id := range d.live {
		e := d.sandboxes[id]
		s := seen{e: e}
		if e.rec.State == StateRunning && !e.deleting {
			s.sb = e.sb
		}
		all = append(all, s)
	}
	d.mu.Unlock()
	for i := range all {
		if sb := all[i].sb; sb != nil {
			all[i].dead = !sb.Alive()
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Info, 0, len(all))
	for _, s := range all {
		e := s.e
		if e.rec.State == StateDeleted {
			continue // deleted meanwhile
		}
		if s.dead && e.rec.State == StateRunning && e.sb == s.sb && !e.deleting {
			d.stopped(e, agentExited(e.sb))
			e.proxy = nil
		}
		out = append(out, e.info())
	}
	return out
}

func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// TCPAddr is the address the TCP listener listens on, once Serve has
// started it; empty without one.
func (d *Daemon) TCPAddr() string {
	ip, port := d.tcpAddr()
	if port == "" {
		return ""
	}
	return net.JoinHostPort(ip.String(), port)
}

// tcpAddr is the TCP listener's address and port, empty without one.
func (d *Daemon) tcpAddr() (net.IP, string) {
	a := d.tcp.Load()
	if a == nil {
		return nil, ""
	}
	return a.IP, strconv.Itoa(a.Port)
}

// Serve serves the API on the unix socket (no token: its mode keeps
// others out) and, when configured, on TCP with the bearer token, until
// ctx ends. Sandboxes keep running after it returns.
func (d *Daemon) Serve(ctx context.Context) error {
	sock := filepath.Join(d.cfg.StateDir, SocketName)
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		return fmt.Errorf("kilnd: another kilnd serves %s", sock)
	}
	// TCP first: once the socket answers, both do.
	var tl net.Listener
	if d.cfg.Listen != "" {
		var err error
		if tl, err = net.Listen("tcp", d.cfg.Listen); err != nil {
			return fmt.Errorf("kilnd: %w", err)
		}
		d.tcp.Store(tl.Addr().(*net.TCPAddr))
	}
	var pl net.Listener
	if d.cfg.PreviewListen != "" {
		var err error
		if pl, err = net.Listen("tcp", d.cfg.PreviewListen); err != nil {
			if tl != nil {
				tl.Close()
			}
			return fmt.Errorf("kilnd: previews: %w", err)
		}
		d.previewTCP.Store(pl.Addr().(*net.TCPAddr))
	}
	d.readopt()
	os.Remove(sock)
	ul, err := net.Listen("unix", sock)
	if err == nil {
		err = os.Chmod(sock, 0o600)
	}
	if err != nil {
		for _, l := range []net.Listener{ul, tl, pl} {
			if l != nil {
				l.Close()
			}
		}
		return fmt.Errorf("kilnd: %w", err)
	}
	wrap := func(h http.Handler) http.Handler {
		if d.cfg.Wrap != nil {
			return d.cfg.Wrap(h)
		}
		return h
	}
	servers := []*http.Server{newServer(wrap(d.Handler(false)), d.cfg.ReadTimeout)}
	listeners := []net.Listener{ul}
	if tl != nil {
		servers = append(servers, newServer(wrap(d.Handler(true)), d.cfg.ReadTimeout))
		listeners = append(listeners, tl)
	}
	if pl != nil {
		servers = append(servers, newServer(wrap(d.PreviewHandler()), d.cfg.ReadTimeout))
		listeners = append(listeners, pl)
	}
	errs := make(chan error, len(servers))
	for i, s := range servers {
		go func() { errs <- s.Serve(limitListener(listeners[i], maxConns)) }()
	}
	d.mu.Lock()
	n := len(d.sandboxes)
	d.mu.Unlock()
	listen := "" // the address bound: a port 0 asked for is chosen now
	if tl != nil {
		listen = tl.Addr().String()
	}
	previews := "" // where previews are served, each on a host of its own
	if port := d.previewPort(); port != "" {
		previews = "http://ID." + d.previewDomain() + ":" + port + "/"
	}
	// Where TCP clients find the token (its value is never logged).
	d.log.Info("kilnd serving", "instance", d.cfg.Instance, "socket", sock, "listen", listen, "token", filepath.Join(d.cfg.StateDir, TokenName),
		"sandboxes", n, "previews", previews, "egress_range", d.cfg.EgressRange, "uids_from", d.uids.First())
	var serr error
	select {
	case <-ctx.Done():
	case serr = <-errs:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		s.Shutdown(sctx)
	}
	// Its sandboxes keep their disks; the spare ones go.
	if d.disks != nil {
		d.disks.Close()
	}
	if errors.Is(serr, http.ErrServerClosed) {
		serr = nil
	}
	return serr
}

// maxConns bounds the connections each listener serves at once; more wait
// to be accepted.
const maxConns = 4096

// limitListener accepts at most n connections at a time.
func limitListener(l net.Listener, n int) net.Listener {
	return &limited{Listener: l, slots: make(chan struct{}, n)}
}

type limited struct {
	net.Listener
	slots chan struct{}
}

func (l *limited) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &slotConn{Conn: c, free: func() { <-l.slots }}, nil
}

type slotConn struct {
	net.Conn
	once sync.Once
	free func()
}

// SyscallConn lets the WebSocket relay splice to the connection.
func (c *slotConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// CloseWrite lets the HTTP server end an answer it gives before closing
// (headers too large, a malformed request) with a FIN: without it the
// client gets a reset instead of the answer.
func (c *slotConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}

// newServer bounds what a client can hold: a request's headers and body
// must arrive in time (read, a minute when zero), and an idle connection
// is closed.
func newServer(h http.Handler, read time.Duration) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       cmp.Or(read, time.Minute), // bodies are at most 1 MiB
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

// authorized checks a TCP request's token: the Authorization header, or
// a WebSocket subprotocol kiln.token.<token> for clients that cannot set
// headers.
// authorized is nil for a request with kilnd's token, and otherwise says
// whether a token was missing or was not kilnd's.
func (d *Daemon) authorized(r *http.Request) error {
	want := []byte(d.token)
	presented, found := "", false
	if t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		presented, found = strings.TrimSpace(t), true
	} else {
		for _, p := range offeredProtocols(r) {
			if t, ok := strings.CutPrefix(p, api.TokenProtocolPrefix); ok {
				presented, found = t, true
				break
			}
		}
	}
	switch {
	case !found:
		return errdefs.New(errdefs.ErrUnauthenticated, "kilnd: a bearer token is required (the token file in kilnd's state directory)")
	case subtle.ConstantTimeCompare([]byte(presented), want) != 1:
		return errdefs.New(errdefs.ErrUnauthenticated, "kilnd: the bearer token is not kilnd's (compare it with the token file in kilnd's state directory)")
	}
	return nil
}

func offeredProtocols(r *http.Request) []string {
	var out []string
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func isTokenProtocol(p string) bool { return strings.HasPrefix(p, api.TokenProtocolPrefix) }

// hostAllowed refuses a TCP request for a Host that is not kilnd's: a web
// page whose own name was made to resolve to kilnd's address (DNS
// rebinding) reaches kilnd with that name. kilnd's are localhost, the
// loopback addresses and the address it listens on, with its port, and
// those configured. (The names under localhost are the previews', by
// default: see previewHost.)
func (d *Daemon) hostAllowed(r *http.Request) bool {
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		host, port = r.Host, "80" // no port: the scheme's
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	for _, h := range d.cfg.AllowHosts {
		if h = strings.ToLower(h); h == host || h == net.JoinHostPort(host, port) {
			return true
		}
	}
	tcpIP, tcpPort := d.tcpAddr()
	if port != tcpPort {
		return false
	}
	if host == "localhost" {
		return true // RFC 6761: never resolved elsewhere
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || !tcpIP.IsUnspecified() && ip.Equal(tcpIP))
}

// originAllowed refuses requests a web page makes behind a user's back:
// a browser sends Origin, and only kilnd's own or a listed one may pass.
func (d *Daemon) originAllowed(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	if o == "http://"+r.Host || o == "https://"+r.Host {
		return true
	}
	return slices.Contains(d.cfg.AllowOrigins, o)
}
