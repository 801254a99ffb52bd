// A sandbox's life: its creation, what it is made from (limits, rootfs,
// disk, logs) and its end, watched.

package daemon

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/image"
	"github.com/sandkiln/sandkiln/internal/sandbox"
	"golang.org/x/sys/unix"
)

// stopped records that a sandbox is no longer running. The init
// command's exit, if the agent recorded one, becomes the sandbox's, and
// the reason, unless the stop was requested (kiln stop), which is the
// reason whatever the init command did as it was stopped; otherwise its
// exit is unknown. Whatever is left of it is the caller's to end
// (Instance.End), outside d.mu: that can take a while. Called with d.mu
// held.
func (d *Daemon) stopped(e *entry, reason string, requested bool) {
	rec := &e.rec
	if e.sb != nil {
		if ie := e.sb.InitExit(); ie != nil {
			rec.Exit, reason = &ie.Exit, "the init command ended: "+ie.Exit.String()
		}
	}
	switch {
	case requested:
		reason = reasonStopped
	case rec.Exit == nil:
		reason += "; exit unknown"
	}
	now := time.Now().UTC()
	rec.State, rec.StoppedAt, rec.Reason, rec.PausedAt = StateStopped, &now, reason, nil
	if err := d.save(*rec); err != nil {
		d.log.Error("record a stopped sandbox", "id", rec.ID, "err", err)
	}
	d.events.emit(sandboxEvent(api.EventStopped, *rec))
}

// agentExited is the reason a sandbox whose agent exited stopped.
func agentExited(sb sandbox.Instance) string {
	if r := sb.ExitReason(); r != "" {
		return r
	}
	return "the agent exited"
}

// watch waits, in a goroutine, for a running sandbox's agent to exit, and
// then ends what is left of it and records the sandbox stopped (with its
// init command's exit): the one place a stop is recorded while kilnd
// runs, whether the sandbox ended by itself or a stop asked it to
// (e.stopping), but where someone looked first (noticeExit). e.watched is
// closed once it is done: a start of the same sandbox waits for it, so
// that nothing of this instance's end (its cgroups, named by the
// sandbox's id; its network) reaches the next one's. It relays the
// agent's process events meanwhile (followProcesses, replay saying from
// the first), the last of them told before the stop. Called with d.mu
// held.
func (d *Daemon) watch(e *entry, replay bool) {
	sb, id := e.sb, e.rec.ID
	watched := make(chan struct{})
	e.watched = watched
	relayed := d.followProcesses(e, replay)
	d.wg.Go(func() {
		defer close(watched)
		sb.AwaitExit(d.closing)
		select {
		case <-relayed:
		case <-time.After(relayEnd):
		case <-d.closing:
		}
		select {
		case <-d.closing:
			return // kilnd goes; the sandbox runs on, for the next to adopt
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
		if e.deleting || e.rec.State != StateRunning || e.sb != sb {
			return
		}
		d.stopped(e, reason, e.stopping())
		e.proxy = nil
		d.metrics.stopped.WithLabelValues("stopped").Inc()
		d.log.Info("sandbox stopped", "id", e.rec.ID, "reason", e.rec.Reason)
	})
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
	i := Info{ID: e.rec.ID, Name: e.rec.Name, State: stateOf(e.rec), CreatedAt: e.rec.CreatedAt, StoppedAt: e.rec.StoppedAt,
		Hostname: e.rec.Hostname, Rootfs: e.rec.Rootfs, Image: e.rec.Image, ImageID: e.rec.ImageID, Limits: e.rec.Limits, Reason: e.rec.Reason,
		Exit: e.rec.Exit, IdleTimeoutSeconds: e.rec.IdleTimeout, TTLSeconds: e.rec.TTL, Runtime: runtimeOf(e.rec), OnOOM: onOOMOf(e.rec),
		Labels: e.rec.Labels, Mounts: e.rec.Mounts}
	if e.rec.State == StateRunning && e.sb != nil {
		i.AgentPID = e.sb.AgentPID()
	}
	if e.node != nil {
		if name := e.node.Load(); name != nil {
			i.Node = *name
		}
	}
	if e.paused() {
		i.PausedAt = e.rec.PausedAt
	}
	if a := e.rec.Network; a != nil {
		n := a.Policy
		n.Address = a.Addr.String()
		i.Network = &n
	}
	return i
}

// newID is a new sandbox's id: 64 hex digits of 32 random bytes, as
// Docker's container ids, so that its first few tell it from every other
// (api.ShortID).
func newID() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Create makes a sandbox and records it: the request is checked whole
// (plan), then the sandbox made, and it is recorded as it starts.
func (d *Daemon) Create(ctx context.Context, req CreateRequest) (Info, error) {
	var snap *snapshotRecord
	if req.Snapshot != "" {
		s, err := d.fromSnapshot(&req)
		if err != nil {
			return Info{}, err
		}
		snap = &s
	}
	p, err := d.plan(req)
	if err != nil {
		return Info{}, err
	}
	defer p.release()
	if w := d.takeWarm(p); w != nil {
		return d.createWarm(w, p.req)
	}
	req, limits, backend := p.req, p.limits, p.backend
	id := newID()
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
	diskMount, diskImage, err := d.takeDisk(id, limits, snap)
	if err != nil {
		return Info{}, err
	}
	if diskMount != nil {
		// The agent has it once it started; this copy goes either way.
		defer diskMount.Close()
	}
	began := time.Now()
	rec := newRecord(id, p, diskImage, began)
	if snap != nil {
		rec.Image, rec.DiskIDs = snap.Image, snap.DiskIDs
		if !snap.Memory {
			// Its processes run on in a sandbox made from its memory;
			// otherwise they are its history.
			rec.History = history(*snap)
		}
	}
	opts := d.options(p, &rec, diskMount)
	if snap != nil && snap.Memory {
		opts.RestoreFrom = d.snaps.path(snap.ID, snapshotMemory)
	}
	if egress.Wanted(req.Network) {
		if err := d.plug(id, *req.Network, &rec, &opts); err != nil {
			if diskImage != "" {
				d.disks.Release(diskImage)
			}
			return Info{}, err
		}
	}
	// undo is what a failed create leaves to release.
	undo := func() {
		if diskImage != "" {
			d.disks.Release(diskImage)
		}
		if rec.Network != nil {
			d.unplug(id)
		}
	}
	sb, err := d.launch(ctx, backend, opts, &rec, undo)
	if err != nil {
		return Info{}, err
	}
	d.metrics.creates.Observe(time.Since(began).Seconds())
	if snap != nil && !snap.Memory {
		// Its history's output, readable as its own processes' is.
		if err := copyLogs(d.snaps.path(snap.ID, snapshotLogs), filepath.Join(d.sandboxDir(id), sandbox.LogsName), snap.Processes); err != nil {
			d.log.Warn("the captured logs of a snapshot's processes were not all copied", "snapshot", snap.ID, "sandbox", id, "err", err)
		}
	}
	e := &entry{rec: rec, node: &d.nodeName}
	d.mu.Lock()
	d.add(e)
	// Told before its processes are (running starts their relay).
	ev := sandboxEvent(api.EventCreated, rec)
	if snap != nil {
		ev.Snapshot = snap.ID
	}
	d.events.emit(ev)
	d.running(e, sb, true)
	agent := e.proxy.Transport
	d.mu.Unlock()
	created = true
	if snap != nil && snap.Memory {
		// Its processes go on from where the snapshot held their
		// captured runs, in runs of their own.
		if err := continueRuns(ctx, agent); err != nil {
			d.Delete(id, true)
			return Info{}, fmt.Errorf("sandbox %s made from snapshot %s: %w", id, snap.ID, err)
		}
	}
	d.log.Info("sandbox created", "id", id, "name", req.Name, "runtime", backend.Name(), "agent", sb.AgentPID())
	return d.infoOf(e), nil
}

// newRecord is the record of sandbox id, made from the plan p at began:
// running, its disk's image diskImage ("" without one), its hostname the
// request's, else its name, else one made of its ID.
func newRecord(id string, p createPlan, diskImage string, began time.Time) record {
	req := p.req
	rec := record{ID: id, Name: req.Name, State: StateRunning, CreatedAt: began.UTC(), Hostname: req.Hostname,
		Rootfs: req.Rootfs, Limits: p.limits, Init: req.Init, IdleTimeout: req.IdleTimeoutSeconds, TTL: req.TTLSeconds,
		Runtime: p.backend.Name(), Disk: diskImage, OnOOM: cmp.Or(req.OnOOM, api.OnOOMEndSandbox), Labels: req.Labels, Mounts: req.Mounts,
		Logs: &api.LogRotation{MaxSizeBytes: p.logs.MaxSizeBytes, MaxFiles: p.logs.MaxFiles}}
	if req.Image != "" {
		rec.Image, rec.ImageID = req.Image, p.img.ID
	}
	if rec.Hostname == "" {
		rec.Hostname = req.Name
	}
	if rec.Hostname == "" {
		rec.Hostname = sandbox.DefaultHostname(id)
	}
	return rec
}

// launch makes the sandbox of rec with its backend, and records the state
// the backend gives it where that is not what its start recorded (see
// options). On a failure nothing of the sandbox is left (but, for a
// sandbox started again, what it had: its files), and undo releases what
// Create or Start took for it.
func (d *Daemon) launch(ctx context.Context, backend sandbox.Backend, opts sandbox.Options, rec *record, undo func()) (sandbox.Instance, error) {
	sb, err := d.launchUnrecorded(ctx, backend, opts, rec, undo)
	if err != nil {
		return nil, err
	}
	if state := sb.State(); !bytes.Equal(state, rec.Sandbox) {
		rec.Sandbox = state
		if err := d.save(*rec); err != nil {
			sb.Destroy(false)
			undo()
			return nil, d.hostFailure(fmt.Sprintf("sandbox %s could not be recorded", rec.ID), err)
		}
	}
	return sb, nil
}

// launchUnrecorded is launch but for the record's saving.
func (d *Daemon) launchUnrecorded(ctx context.Context, backend sandbox.Backend, opts sandbox.Options, rec *record, undo func()) (sandbox.Instance, error) {
	sb, err := backend.Create(ctx, opts)
	if err != nil {
		what := "could not be made"
		if opts.Restart == nil {
			os.RemoveAll(d.sandboxDir(rec.ID))
		} else {
			what = "could not be started"
		}
		undo()
		if ctx.Err() != nil {
			// Not the host's failure: whoever asked went away (a client
			// hung up, kilnd is stopping) before the agent answered.
			d.log.Info("sandbox "+what+": its request ended first", "id", rec.ID, "err", err)
			return nil, errdefs.Opaque(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s %s: its request ended first", rec.ID, what), err)
		}
		return nil, d.hostFailure(fmt.Sprintf("sandbox %s %s", rec.ID, what), err)
	}
	return sb, nil
}

// takeDisk takes a disk of limits.DiskBytes for sandbox id, if it has a
// quota: its mount, for the agent, and its image ("" and nil without).
func (d *Daemon) takeDisk(id string, limits api.Limits, snap *snapshotRecord) (*os.File, string, error) {
	if snap != nil {
		return d.snapshotDisk(id, *snap)
	}
	if limits.DiskBytes == 0 {
		return nil, "", nil
	}
	disk, err := d.disks.Take(limits.DiskBytes)
	if err != nil {
		return nil, "", d.hostFailure(fmt.Sprintf("sandbox %s: its disk could not be made", id), err)
	}
	return disk.Mount, disk.Image, nil
}

// options are the sandbox's options for its backend, made from the plan
// and its record rec, which they write as the agent starts.
func (d *Daemon) options(p createPlan, rec *record, disk *os.File) sandbox.Options {
	req, img := p.req, p.img
	opts := sandbox.Options{
		Dir: d.sandboxDir(rec.ID), ID: rec.ID, Hostname: rec.Hostname,
		Rootfs: req.Rootfs, Layers: p.layers, Limits: p.limits, Disk: disk, Env: d.cfg.Env, Init: req.Init, CaptureQueue: d.cfg.CaptureQueue,
		CaptureMaxSize: p.logs.MaxSizeBytes, CaptureMaxFiles: p.logs.MaxFiles, FlowGrace: d.cfg.FlowGrace,
		EndOnOOM: rec.OnOOM == api.OnOOMEndSandbox, Mounts: p.mounts, DiskIDs: rec.DiskIDs,
		Workdir: img.Config.WorkingDir, Entrypoint: img.Config.Entrypoint, Cmd: img.Config.Cmd, User: img.Config.User,
		// The record is written while the agent sets itself up (a backend
		// that cannot say when it runs has it written once it answers).
		Started: func(state json.RawMessage) error {
			rec.Sandbox = state
			return d.save(*rec)
		},
	}
	if req.Image != "" {
		opts.Env = withEnv(d.cfg.Env, img.Config.Env)
	}
	return opts
}

// createPlan is a create request checked whole, with what it comes to:
// its limits (kilnd's defaults where it leaves them out), its image and
// the image's layers (held from removal until release), its rotation of
// logs, the backend of its runtime and its mounts' directories (closed by
// release).
type createPlan struct {
	req     CreateRequest
	limits  api.Limits
	img     image.Image
	layers  []string
	logs    Logs
	backend sandbox.Backend
	mounts  []sandbox.Mount
	release func()
}

// withMounts opens ms for p, closed with what p releases already. A
// refusal is of class, and its message begins with prefix.
func (d *Daemon) withMounts(p *createPlan, ms []api.Mount, class *errdefs.Class, prefix string) error {
	var err error
	if p.mounts, err = d.openMounts(ms, class, prefix); err != nil {
		return err
	}
	release := p.release
	p.release = func() {
		closeMounts(p.mounts)
		release()
	}
	return nil
}

// plan checks a create request before anything of the host's is read or
// made, its image included; an init without a command, which takes its
// image's, is checked again once it has it.
func (d *Daemon) plan(req CreateRequest) (p createPlan, err error) {
	p.release = func() {}
	limits := req.Limits.Apply(*d.cfg.DefaultLimits)
	if err := d.mountsAllowed(req.Mounts, ""); err != nil {
		return p, err
	}
	if err := validateCreate(req, limits); err != nil {
		return p, err
	}
	if req.Image != "" {
		if req.Rootfs != "" {
			return p, fmt.Errorf("%w: an image or a rootfs, not both", errdefs.ErrInvalidArgument)
		}
		if p.img, p.layers, p.release, err = d.imageRoot(req.Image); err != nil {
			p.release = func() {}
			return p, err
		}
		defer func() {
			if err != nil {
				p.release()
			}
		}()
		if req.Init != nil && req.Init.Command == "" {
			// The image's command, as docker run has it.
			if argv := p.img.Config.Command(req.Init.Args); len(argv) > 0 {
				init := *req.Init
				init.Command, init.Args = argv[0], argv[1:]
				req.Init = &init
			}
			if err := req.Init.Check(false); err != nil {
				return p, fmt.Errorf("%w: init: %w", errdefs.ErrInvalidArgument, err)
			}
		}
	}
	p.logs = d.cfg.Logs
	if req.Logs != nil {
		p.logs = p.logs.Apply(*req.Logs)
	}
	runtime := req.Runtime
	if runtime == "" {
		runtime = sandbox.RuntimeNamespaces
	}
	var ok bool
	if p.backend, ok = d.backends[runtime]; !ok {
		return p, fmt.Errorf("%w: runtime %q: want %s", errdefs.ErrInvalidArgument, api.Clip(runtime), strings.Join(RuntimeNames, " or "))
	}
	if why := d.unavailable[runtime]; why != nil {
		return p, errdefs.Opaque(errdefs.ErrUnavailable, fmt.Sprintf("runtime %s is not available on this host (kilnd --runtimes says why)", runtime), why)
	}
	if req.Rootfs, err = d.resolveRootfs(req.Rootfs); err != nil {
		return p, err
	}
	if d.disks == nil && limits.DiskBytes > 0 {
		if req.Limits.DiskBytes != nil {
			return p, errdefs.Opaque(errdefs.ErrUnavailable, "this host cannot make sandbox disks, so no disk quota (kilnd's log says why, when it started)", d.disksErr)
		}
		limits.DiskBytes = 0 // the default, which this host cannot apply
	}
	if err := d.diskFits(limits.DiskBytes); err != nil {
		return p, err
	}
	if err := d.withMounts(&p, req.Mounts, errdefs.ErrInvalidArgument, ""); err != nil {
		return p, err
	}
	p.req, p.limits = req, limits
	return p, nil
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
		return "", fmt.Errorf("%w: rootfs %q: no such directory in kilnd's images directory", errdefs.ErrNotFound, api.Clip(p))
	}
	if err == nil {
		if rel, rerr := filepath.Rel(images, real); rerr != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", fmt.Errorf("%w: rootfs %q: a root filesystem must be a directory in kilnd's images directory (--images), and this is not in it", errdefs.ErrInvalidArgument, api.Clip(p))
		}
		var fi os.FileInfo
		if fi, err = os.Stat(real); err == nil && !fi.IsDir() {
			return "", fmt.Errorf("%w: rootfs %q: not a directory", errdefs.ErrInvalidArgument, api.Clip(p))
		}
	}
	if err != nil {
		return "", d.hostFailure(fmt.Sprintf("rootfs %q cannot be read", api.Clip(p)), err)
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
	msg := what + " (kilnd's log says why)"
	if errors.Is(cause, unix.ENOSPC) || errors.Is(cause, unix.EDQUOT) {
		class, msg = errdefs.ErrNoSpace, what+": no space left in kilnd's state directory"
	}
	d.log.Error(what, "err", cause)
	return errdefs.Opaque(class, msg, cause)
}
