// Records and adoption: what kilnd knows of each sandbox, kept in the
// state directory and found again after a restart, and the lookups by
// id, name and prefix.

package daemon

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httputil"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/egress"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/sandbox"
	"golang.org/x/sys/unix"
)

// record is a sandbox's small JSON file, written atomically on every
// change, from which a restarted kilnd finds it again.
type record struct {
	ID string `json:"id"`
	// Name is the name it was created with, if any (see Daemon.names).
	Name      string     `json:"name,omitempty"`
	State     string     `json:"state"`
	CreatedAt time.Time  `json:"created_at"`
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	// PausedAt is when a running sandbox was paused, while it is (see
	// pause.go).
	PausedAt *time.Time     `json:"paused_at,omitempty"`
	Hostname string         `json:"hostname"`
	Rootfs   string         `json:"rootfs,omitempty"`
	Limits   sandbox.Limits `json:"limits"`
	Reason   string         `json:"reason,omitempty"` // why it stopped
	// Init is the command whose exit ends the sandbox; Exit is that exit,
	// once the agent recorded it.
	Init        *api.ExecRequest `json:"init,omitempty"`
	Exit        *api.Exit        `json:"exit,omitempty"`
	IdleTimeout int64            `json:"idle_timeout_seconds,omitempty"`
	TTL         int64            `json:"ttl_seconds,omitempty"`
	// Runtime is the backend that made it (empty in records older than
	// backends: the namespaces one), Sandbox that backend's state of it.
	Runtime string          `json:"runtime,omitempty"`
	Sandbox json.RawMessage `json:"sandbox,omitempty"`
	// Disk is the image of the disk holding its writable layers, when it
	// has a disk quota; deleted with the sandbox.
	Disk string `json:"disk,omitempty"`
	// DiskIDs, when set, is the first host uid of the range that owns
	// Disk's files, when that is not the sandbox's own: a disk copied from
	// a snapshot of another sandbox, whose owners are shifted at each
	// start (sandbox.Options.DiskIDs).
	DiskIDs int `json:"disk_ids,omitempty"`
	// History are the processes that came with the snapshot it was made
	// from or last rolled back to (api.Process.ForkedFrom).
	History []api.Process `json:"history,omitempty"`
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
	// Labels are the caller's own, as the create gave them.
	Labels map[string]string `json:"labels,omitempty"`
	// Mounts are its host directories, as the create gave them: each
	// start opens and checks them again.
	Mounts []api.Mount `json:"mounts,omitempty"`
	// Logs is the rotation of its captured logs, every field set (absent
	// in records older than starting a sandbox again: kilnd's own).
	Logs *api.LogRotation `json:"logs,omitempty"`
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
	// node is its daemon's name in its cluster, if any (JoinCluster).
	node *atomic.Pointer[string]
	rec  record
	// sb is the sandbox as its backend knows it; nil when the backend
	// could not take it back (its state is unreadable, its runtime gone).
	sb       sandbox.Instance
	proxy    *httputil.ReverseProxy
	deleting bool // Delete has it: the watcher leaves it alone
	// unfinished is its deletion until that is finished (see delete.go).
	unfinished *deletion
	// op is the stop or start that changes it now, if one does: one at a
	// time (see lifecycle.go).
	op *lifecycleOp
	// watched is closed once the watcher of sb (watch) has returned,
	// having ended what was left of it; nil when no watcher ever had it.
	watched chan struct{}
	// Activity, for the idle timeout: requests in flight (a watcher's
	// WebSocket counts for as long as it is open) and the last one's end.
	inflight int
	lastUsed time.Time
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

func (d *Daemon) sandboxDir(id string) string {
	return filepath.Join(d.cfg.StateDir, sandboxesDir, id)
}

// save writes a record atomically: a temporary file, synced, renamed.
func (d *Daemon) save(rec record) error { return d.write(rec, true) }

// saveSoon writes a record atomically, and returns once it is in place,
// for kilnd and every kilnd after it: what it does not wait for is the
// disk, which has it synced in the background. Only a host that loses
// power in the next moments loses it, and the sandbox it records goes
// with that host's processes all the same.
func (d *Daemon) saveSoon(rec record) error {
	if err := d.write(rec, false); err != nil {
		return err
	}
	dir := d.sandboxDir(rec.ID)
	d.wg.Go(func() {
		for _, name := range []string{filepath.Join(dir, recordName), dir} {
			if f, err := os.Open(name); err == nil {
				f.Sync()
				f.Close()
			}
		}
	})
	return nil
}

// write writes a record atomically, synced to the disk if durable.
func (d *Daemon) write(rec record, durable bool) error {
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
	if err == nil && durable {
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
	if !durable {
		return nil
	}
	if df, err := os.Open(dir); err == nil {
		df.Sync()
		df.Close()
	}
	return nil
}

// isSandboxDir reports whether e is a sandbox's directory: named by its
// id, of the shape kilnd makes (api.IsSandboxID) or, made by a kilnd
// before, a UUID.
func isSandboxDir(e os.DirEntry) bool {
	if !e.IsDir() {
		return false
	}
	_, err := uuid.Parse(e.Name())
	return err == nil || api.IsSandboxID(e.Name())
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
		if !isSandboxDir(e) {
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
		e := &entry{rec: rec, node: &d.nodeName}
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
				if rec.Disk != "" {
					// A kilnd that died in a snapshot's moment left its
					// disk frozen: its processes' writes would wait for
					// ever.
					sandbox.ThawDisk(e.sb, rec.Disk)
				}
				d.adoptPaused(e)
				d.recovered(e)
				if rec.Network != nil {
					if d.adopted == nil {
						d.adopted = map[string]egress.Attachment{}
					}
					d.adopted[rec.ID] = *rec.Network
				}
				d.running(e, e.sb, false) // its watcher, once what it unplugs is known
				d.log.Info("sandbox adopted", "id", rec.ID, "runtime", runtimeOf(rec), "agent", e.sb.AgentPID(), "state", stateOf(e.rec))
				continue
			}
			if e.sb != nil {
				e.sb.End()
			}
			d.stopped(e, "the agent was gone when kilnd started (host reboot or agent killed)", false)
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

// described names a few of ids' sandboxes, by short id and name, for an
// error that lists them. Called with d.mu held.
func (d *Daemon) described(ids []string) string {
	const most = 5
	var out []string
	for _, id := range ids[:min(len(ids), most)] {
		s := api.ShortID(id)
		if name := d.sandboxes[id].rec.Name; name != "" {
			s += " " + name
		}
		out = append(out, s)
	}
	if len(ids) > most {
		out = append(out, fmt.Sprintf("and %d more", len(ids)-most))
	}
	return strings.Join(out, ", ")
}

// lookup finds the sandbox ref stands for, as Docker finds a container:
// the sandbox whose id it is (a deleted one too), else the one it names,
// else the one not deleted whose id it begins, if it is api.MinIDPrefix
// characters or more. A prefix that two or more ids begin with is
// refused, naming them. Called with d.mu held.
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
	if len(ref) >= api.MinIDPrefix {
		i, _ := slices.BinarySearch(d.live, ref)
		var matches []string
		for _, id := range d.live[i:] {
			if !strings.HasPrefix(id, ref) {
				break
			}
			matches = append(matches, id)
		}
		switch {
		case len(matches) == 1:
			return d.sandboxes[matches[0]], nil
		case len(matches) > 1:
			return nil, fmt.Errorf("%w: sandbox prefix %q matches %d sandboxes (%s): give more of the id, or its name", errdefs.ErrInvalidArgument, api.Clip(ref), len(matches), d.described(matches))
		}
	}
	return nil, fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, api.Clip(ref))
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
		return nil, fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, api.Clip(ref))
	}
	// A running sandbox whose agent died is stopped, as soon as anyone
	// looks; its watcher, woken by the same exit, ends its cgroups.
	d.noticeExit(e)
	return e, nil
}

// noticeExit records stopped a running sandbox whose agent has exited,
// unless its watcher is to: while a stop is under way, or a delete. Called
// with d.mu held.
func (d *Daemon) noticeExit(e *entry) {
	if e.rec.State == StateRunning && !e.deleting && !e.stopping() && !e.sb.Alive() {
		d.stopped(e, agentExited(e.sb), false)
		e.proxy = nil
	}
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
		return nil, fmt.Errorf("unknown runtime %q", api.Clip(rec.Runtime))
	}
	return b.Adopt(rec.Sandbox)
}
