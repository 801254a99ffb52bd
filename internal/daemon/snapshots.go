// Snapshots: a sandbox's disk copied while its file system is frozen,
// kept in the state directory after the sandbox is gone, and the
// sandboxes made from one (kiln run --from, kiln fork) or rolled back to
// one, whose history holds the processes that were there when it was
// taken.

package daemon

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// Names in the state directory and in a snapshot's directory.
const (
	snapshotsDir     = "snapshots"
	snapshotFile     = "snapshot.json"
	snapshotDisk     = "disk.img"
	snapshotLogs     = "logs"
	snapshotMemory   = "memory"
	snapshotNewMark  = ".new-"
	snapshotGoneMark = ".gone-"
)

// DefaultSnapshotQuota is how much of the host's disk kilnd's snapshots
// may take unless it is told (kilnd --snapshot-quota).
const DefaultSnapshotQuota = 100 << 30

// snapshotRecord is a snapshot's file: what it is, and what a sandbox
// made from it is made with.
type snapshotRecord struct {
	api.Snapshot
	// DiskIDs is the first host uid of the range its disk's files are
	// owned by.
	DiskIDs int `json:"disk_ids"`
	// Hostname is the sandbox's: a sandbox made from its memory keeps it.
	Hostname string            `json:"hostname,omitempty"`
	ImageID  string            `json:"image_id,omitempty"`
	Rootfs   string            `json:"rootfs,omitempty"`
	Limits   api.Limits        `json:"limits"`
	Network  *api.Network      `json:"network,omitempty"`
	Init     *api.ExecRequest  `json:"init,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	OnOOM    string            `json:"on_oom,omitempty"`
	Logs     *api.LogRotation  `json:"logs,omitempty"`
	// IdleTimeout and TTL are the sandbox's, in seconds.
	IdleTimeout int64 `json:"idle_timeout_seconds,omitempty"`
	TTL         int64 `json:"ttl_seconds,omitempty"`
	// Transient marks a fork's snapshot, removed once its sandboxes are
	// made: its files are not synced to the disk, and a kilnd that finds
	// it as it starts (the one before stopped during the fork) removes it.
	Transient bool `json:"transient,omitempty"`
}

// snapshots are kilnd's snapshots, by id.
type snapshots struct {
	dir string
	// reflink says the state directory's file system shares extents.
	reflink bool
	quota   int64
	mu      sync.Mutex
	byID    map[string]*snapshotRecord
	// taking are the names claimed by snapshots being taken; reserved
	// what those being taken may take, counted against the quota.
	taking   map[string]bool
	reserved int64
}

// openSnapshots loads the snapshots of dir, removing what a snapshot
// being taken, or removed, as kilnd stopped left.
func openSnapshots(dir string, quota int64) (*snapshots, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("kilnd: snapshots: %w", err)
	}
	s := &snapshots{dir: dir, quota: quota, byID: map[string]*snapshotRecord{}, taking: map[string]bool{}, reflink: sandbox.Reflinks(dir)}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("kilnd: snapshots: %w", err)
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), snapshotNewMark) || strings.HasPrefix(e.Name(), snapshotGoneMark) {
			os.RemoveAll(path)
			continue
		}
		b, err := os.ReadFile(filepath.Join(path, snapshotFile))
		if err != nil {
			continue
		}
		var rec snapshotRecord
		if json.Unmarshal(b, &rec) != nil || rec.ID != e.Name() {
			continue
		}
		if rec.Transient {
			os.RemoveAll(path)
			continue
		}
		if rec.Processes == nil {
			rec.Processes = []api.Process{}
		}
		s.byID[rec.ID] = &rec
	}
	return s, nil
}

// used is how much of the host's disk the snapshots take, and those
// being taken may. Called with s.mu held.
func (s *snapshots) used() int64 {
	n := s.reserved
	for _, r := range s.byID {
		n += r.SizeBytes
	}
	return n
}

// lookup finds the snapshot ref stands for: its id, its name, or a
// unique prefix of its id of api.MinIDPrefix characters or more. Called
// with s.mu held.
func (s *snapshots) lookup(ref string) (*snapshotRecord, error) {
	if r, ok := s.byID[ref]; ok {
		return r, nil
	}
	var matches []string
	for id, r := range s.byID {
		if r.Name == ref && ref != "" {
			return r, nil
		}
		if len(ref) >= api.MinIDPrefix && strings.HasPrefix(id, ref) {
			matches = append(matches, id)
		}
	}
	switch len(matches) {
	case 0:
		return nil, fmt.Errorf("%w: no snapshot %q", errdefs.ErrNotFound, api.Clip(ref))
	case 1:
		return s.byID[matches[0]], nil
	}
	slices.Sort(matches)
	for i, id := range matches {
		matches[i] = api.ShortID(id)
	}
	return nil, fmt.Errorf("%w: snapshot prefix %q matches %d snapshots (%s): give more of the id, or its name", errdefs.ErrInvalidArgument,
		api.Clip(ref), len(matches), strings.Join(matches[:min(len(matches), 5)], ", "))
}

// get is the snapshot ref stands for, a copy.
func (s *snapshots) get(ref string) (snapshotRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.lookup(ref)
	if err != nil {
		return snapshotRecord{}, err
	}
	return *r, nil
}

func (s *snapshots) path(id string, name ...string) string {
	return filepath.Join(append([]string{s.dir, id}, name...)...)
}

// copyWay names how s copies a disk.
func (s *snapshots) copyWay() string {
	if s.reflink {
		return "reflink"
	}
	return "copy"
}

// sandboxUIDBase is the first host uid of the range of the sandbox of
// rec, from its backend's state.
func sandboxUIDBase(rec record) int {
	var st struct {
		UIDBase int `json:"uid_base"`
	}
	json.Unmarshal(rec.Sandbox, &st)
	return st.UIDBase
}

// diskIDsOf is the first host uid of the range that owns the files of
// the disk of rec's sandbox.
func diskIDsOf(rec record) int {
	if rec.DiskIDs != 0 {
		return rec.DiskIDs
	}
	return sandboxUIDBase(rec)
}

// Snapshot takes a snapshot of the sandbox ref stands for, running or
// stopped: its disk, copied while its file system is frozen (its
// processes' writes wait meanwhile, nothing else does), the processes it
// has then, with their offsets, their captured logs, and of those not
// captured what their rings still hold (keepRings).
func (d *Daemon) Snapshot(ctx context.Context, ref string, req api.SnapshotRequest) (api.Snapshot, error) {
	return d.takeSnapshot(ctx, ref, req, false)
}

// takeSnapshot is Snapshot; a transient one is a fork's (see
// snapshotRecord.Transient).
func (d *Daemon) takeSnapshot(ctx context.Context, ref string, req api.SnapshotRequest, transient bool) (api.Snapshot, error) {
	if req.Name != "" && !isLabel(req.Name) {
		return api.Snapshot{}, fmt.Errorf("%w: snapshot name %q: want a DNS label (RFC 1123): a-z, 0-9 and '-', 1 to 63 characters, not beginning or ending with '-'", errdefs.ErrInvalidArgument, api.Clip(req.Name))
	}
	if d.snaps == nil {
		return api.Snapshot{}, errdefs.Opaque(errdefs.ErrUnavailable, "this kilnd cannot keep snapshots (kilnd's log says why, when it started)", d.snapsErr)
	}
	s := d.snaps
	id := newID()
	s.mu.Lock()
	if req.Name != "" {
		if _, err := s.lookup(req.Name); err == nil || s.taking[req.Name] {
			s.mu.Unlock()
			return api.Snapshot{}, fmt.Errorf("%w: a snapshot named %q exists", errdefs.ErrAlreadyExists, req.Name)
		}
		s.taking[req.Name] = true
		defer func() {
			s.mu.Lock()
			delete(s.taking, req.Name)
			s.mu.Unlock()
		}()
	}
	s.mu.Unlock()

	op := newOp(false)
	e, err := d.claim(ctx, ref, op)
	if err != nil {
		return api.Snapshot{}, err
	}
	d.noticeExit(e)
	rec := e.rec
	rec.Labels = maps.Clone(rec.Labels)
	sb := e.sb
	running := rec.State == StateRunning && sb != nil
	paused := e.paused()
	var agent http.RoundTripper
	if running && e.proxy != nil && !e.agentPaused() {
		agent = e.proxy.Transport
	}
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		e.finishOp()
		d.mu.Unlock()
	}()
	if rec.Disk == "" {
		return api.Snapshot{}, fmt.Errorf("%w: sandbox %s has no disk of its own (its limits' disk_bytes is 0): a snapshot copies a sandbox's disk", errdefs.ErrFailedPrecondition, rec.ID)
	}
	if req.Memory {
		if err := memorySnapshottable(rec, sb, running, paused); err != nil {
			return api.Snapshot{}, err
		}
	}
	srcSize := sandbox.Allocated(rec.Disk)
	s.mu.Lock()
	used := s.used()
	if used+srcSize <= s.quota {
		s.reserved += srcSize
		defer func() {
			s.mu.Lock()
			s.reserved -= srcSize
			s.mu.Unlock()
		}()
	}
	s.mu.Unlock()
	if used+srcSize > s.quota {
		return api.Snapshot{}, fmt.Errorf("%w: snapshot quota: snapshots take %d bytes of kilnd's %d (kilnd --snapshot-quota), and this one would take up to %d more: remove snapshots (kiln snapshot rm) first",
			errdefs.ErrPermissionDenied, used, s.quota, srcSize)
	}

	snap := snapshotRecord{Snapshot: api.Snapshot{ID: id, Name: req.Name, Sandbox: rec.ID, SandboxName: rec.Name, Runtime: runtimeOf(rec),
		Image: rec.Image, DiskBytes: rec.Limits.DiskBytes, Copy: s.copyWay()},
		DiskIDs: diskIDsOf(rec), ImageID: rec.ImageID, Rootfs: rec.Rootfs, Limits: rec.Limits, Init: rec.Init, Labels: rec.Labels,
		OnOOM: rec.OnOOM, Logs: rec.Logs, IdleTimeout: rec.IdleTimeout, TTL: rec.TTL, Hostname: rec.Hostname, Transient: transient}
	if rec.Network != nil {
		n := rec.Network.Policy
		snap.Network = &n
	}
	tmp := s.path(snapshotNewMark + id)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return api.Snapshot{}, d.hostFailure("snapshot of sandbox "+rec.ID, err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	// rings are the processes whose output not captured is kept as the
	// rings hold it (a snapshot of a running sandbox's files).
	var rings []api.Process
	switch {
	case req.Memory:
		// Its processes' captured runs stand still at their offsets
		// listed here: what comes after goes on in this sandbox's runs,
		// and in each made from the snapshot in runs of their own.
		var procs []api.Process
		held := false
		if agent != nil {
			var err error
			if procs, held, err = holdRuns(ctx, agent); err != nil {
				return api.Snapshot{}, errdefs.Opaque(errdefs.ErrUnavailable, fmt.Sprintf("sandbox %s: its agent did not hold its processes' captured runs for the snapshot: take it again", rec.ID), err)
			}
		}
		err := sb.(sandbox.Checkpointer).Checkpoint(ctx, filepath.Join(tmp, snapshotMemory), func() error {
			// Its processes stand still: what the file server wrote is
			// flushed to the image, then copied with the memory's image.
			thaw, err := sandbox.FreezeDisk(sb, rec.Disk)
			if err != nil {
				return err
			}
			_, cerr := sandbox.CloneFile(filepath.Join(tmp, snapshotDisk), rec.Disk)
			return errors.Join(cerr, thaw())
		})
		if held {
			d.releaseRuns(agent, rec.ID)
		}
		if err != nil {
			if errdefs.ClassOf(err) != nil {
				return api.Snapshot{}, err
			}
			return api.Snapshot{}, d.hostFailure(fmt.Sprintf("memory snapshot of sandbox %s", rec.ID), err)
		}
		snap.Processes, snap.Memory = procs, true
	case running:
		thaw, err := sandbox.FreezeDisk(sb, rec.Disk)
		if err != nil {
			if !sb.Alive() {
				return api.Snapshot{}, fmt.Errorf("%w: sandbox %s stopped as its snapshot began: take it again", errdefs.ErrUnavailable, rec.ID)
			}
			return api.Snapshot{}, errdefs.Opaque(errdefs.ErrFailedPrecondition, fmt.Sprintf("sandbox %s: its disk could not be frozen for the snapshot", rec.ID), err)
		}
		var procs []api.Process
		if agent != nil {
			askAgent(ctx, agent, "/exec-stream", &procs)
		}
		_, cerr := sandbox.CloneFile(filepath.Join(tmp, snapshotDisk), rec.Disk)
		terr := thaw()
		if err := errors.Join(cerr, terr); err != nil {
			return api.Snapshot{}, d.hostFailure(fmt.Sprintf("snapshot of sandbox %s: its disk could not be copied", rec.ID), err)
		}
		snap.Processes = procs
		if agent != nil {
			rings = procs
		}
	default:
		if sandbox.DiskAttached(rec.Disk) {
			return api.Snapshot{}, fmt.Errorf("%w: sandbox %s is still letting go of its disk as it stopped: take the snapshot again", errdefs.ErrUnavailable, rec.ID)
		}
		if _, err := sandbox.CloneFile(filepath.Join(tmp, snapshotDisk), rec.Disk); err != nil {
			return api.Snapshot{}, d.hostFailure(fmt.Sprintf("snapshot of sandbox %s: its disk could not be copied", rec.ID), err)
		}
		snap.Processes = d.loggedProcesses(rec)
	}
	// The logs of a memory snapshot's processes are its checkpoint's: they
	// go on in a fork, not as its history.
	logsOf := snap.Processes
	if snap.Memory {
		logsOf = nil
	}
	logs := filepath.Join(d.sandboxDir(rec.ID), sandbox.LogsName)
	if err := copyLogs(logs, filepath.Join(tmp, snapshotLogs), logsOf); err != nil {
		return api.Snapshot{}, d.hostFailure(fmt.Sprintf("snapshot of sandbox %s: its captured logs could not be copied", rec.ID), err)
	}
	if len(rings) > 0 {
		if err := keepRings(ctx, sb.Dial, logs, filepath.Join(tmp, snapshotLogs), rings); err != nil {
			return api.Snapshot{}, d.hostFailure(fmt.Sprintf("snapshot of sandbox %s: the output of its processes not captured could not be kept", rec.ID), err)
		}
	}
	if snap.Processes == nil {
		snap.Processes = []api.Process{}
	}
	snap.CreatedAt = time.Now().UTC()
	snap.SizeBytes = allocatedTree(tmp)
	err = writeJSON(filepath.Join(tmp, snapshotFile), snap)
	switch {
	case err != nil:
	case transient:
		// Its record alone, which says to remove it (written synced),
		// is on the disk with the directory's entry of it before it is
		// renamed: the rest is read from the page cache by the fork's
		// sandboxes, and gone once they are made. Syncing a memory
		// snapshot's image took a tenth of a fork.
		err = syncPath(tmp)
	default:
		err = syncTree(tmp)
	}
	if err != nil {
		return api.Snapshot{}, d.hostFailure("snapshot of sandbox "+rec.ID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Rename(tmp, s.path(id)); err != nil {
		return api.Snapshot{}, d.hostFailure("snapshot of sandbox "+rec.ID, err)
	}
	done = true
	s.byID[id] = &snap
	ev := sandboxEvent(api.EventSnapshotted, rec)
	ev.Snapshot = id
	d.events.emit(ev)
	d.log.Info("snapshot taken", "id", id, "sandbox", rec.ID, "copy", snap.Copy, "bytes", snap.SizeBytes)
	return snap.Snapshot, nil
}

// infoEvent is an event of type typ of e's sandbox.
func (d *Daemon) infoEvent(e *entry, typ string) api.Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	return sandboxEvent(typ, e.rec)
}

// memorySnapshottable says why the memory of the sandbox of rec cannot
// be saved now, if it cannot.
func memorySnapshottable(rec record, sb sandbox.Instance, running, paused bool) error {
	switch {
	case runtimeOf(rec) != sandbox.RuntimeGVisor:
		return sandbox.ErrNoMemorySnapshot
	case !running:
		return fmt.Errorf("%w: sandbox %s is %s: a memory snapshot saves a running sandbox's processes (without memory, its files)", errdefs.ErrFailedPrecondition, rec.ID, rec.State)
	case paused:
		return fmt.Errorf("%w: sandbox %s is paused: resume it first (a memory snapshot pauses it for the moment it takes)", errdefs.ErrFailedPrecondition, rec.ID)
	case len(rec.Mounts) > 0:
		return fmt.Errorf("%w: sandbox %s has host directories mounted: its memory is not saved (what its processes hold of them would not be there in a fork); without memory, its files are", errdefs.ErrFailedPrecondition, rec.ID)
	}
	if _, ok := sb.(sandbox.Checkpointer); !ok {
		return sandbox.ErrNoMemorySnapshot
	}
	return nil
}

// loggedProcesses are the processes of stopped sandbox rec, as its
// captured logs know them: each one's id and its streams' offsets, and
// what the records that exist say of it beside (describedProcesses): its
// command, terminal, flow and start, and its exit where one was observed.
// Its state is exited (or forked, for one of its history): the sandbox
// stopped.
func (d *Daemon) loggedProcesses(rec record) []api.Process {
	logs := filepath.Join(d.sandboxDir(rec.ID), sandbox.LogsName)
	ents, _ := os.ReadDir(logs)
	known := d.describedProcesses(rec)
	var procs []api.Process
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		dir, err := capture.OpenDir(filepath.Join(logs, e.Name()))
		if err != nil {
			continue
		}
		p := api.Process{ID: e.Name(), State: api.StateExited, Flow: api.FlowDrop, Streams: map[string]api.StreamStatus{}}
		if k, ok := known[p.ID]; ok {
			p.Command, p.Args, p.Terminal, p.StartedAt = k.Command, k.Args, k.Terminal, k.StartedAt
			p.Flow = cmp.Or(k.Flow, p.Flow)
			if k.State == api.StateExited || k.State == api.StateForked {
				p.State, p.Exit, p.ExitedAt = k.State, k.Exit, k.ExitedAt
			}
		}
		for name, n := range logOffsets(dir) {
			if name == "stdout" && p.Terminal {
				name = "terminal"
			}
			p.Streams[name] = api.StreamStatus{TotalBytes: n, Ended: true}
		}
		dir.Close()
		procs = append(procs, p)
	}
	return procs
}

// describedProcesses is what the records kilnd has say of the processes
// of sandbox rec, by id, each as the first of these that describes it
// with its command: the events kilnd holds of its processes, newest first
// (an exit's says the most); the snapshots taken of it, newest first; its
// history; and its init command, with the exit its agent recorded, for
// the process that exit names.
func (d *Daemon) describedProcesses(rec record) map[string]api.Process {
	out := map[string]api.Process{}
	add := func(p api.Process) {
		if _, ok := out[p.ID]; !ok && p.ID != "" && p.Command != "" {
			out[p.ID] = p
		}
	}
	evs, _, _, _ := d.events.log.After(0)
	for _, ev := range slices.Backward(evs) {
		if ev.Sandbox == rec.ID && ev.Process != nil {
			add(*ev.Process)
		}
	}
	if d.snaps != nil {
		d.snaps.mu.Lock()
		var taken []*snapshotRecord
		for _, r := range d.snaps.byID {
			if r.Sandbox == rec.ID {
				taken = append(taken, r)
			}
		}
		slices.SortFunc(taken, func(a, b *snapshotRecord) int { return b.CreatedAt.Compare(a.CreatedAt) })
		for _, r := range taken {
			for _, p := range r.Processes {
				add(p)
			}
		}
		d.snaps.mu.Unlock()
	}
	for _, p := range rec.History {
		add(p)
	}
	if rec.Init != nil {
		var ie handoff.InitExit
		b, err := os.ReadFile(filepath.Join(d.sandboxDir(rec.ID), sandbox.LogsName, handoff.InitExitName))
		if err == nil && json.Unmarshal(b, &ie) == nil {
			exited := ie.ExitedAt
			add(api.Process{ID: ie.Process, Command: rec.Init.Command, Args: rec.Init.Args, Terminal: rec.Init.TTY != nil,
				State: api.StateExited, Exit: ie.Exit, ExitedAt: &exited})
		}
	}
	return out
}

// logOffsets reads a captured log whole and says how far each of its
// streams came.
func logOffsets(dir *capture.Dir) map[string]int64 {
	rd := capture.NewReader(dir, capture.ReadOptions{})
	defer rd.Close()
	out := map[string]int64{}
	names := map[capture.LogStream]string{capture.LogStdout: "stdout", capture.LogStderr: "stderr"}
	for {
		e, err := rd.Next(context.Background())
		if err != nil {
			return out
		}
		if name, ok := names[e.Stream]; ok && e.Gap == 0 && e.Offset >= 0 {
			out[name] = max(out[name], e.Offset+int64(e.PayloadLen()))
		}
	}
}

// copyLogs copies, from the logs directory from into to, the captured
// logs of procs (those that have one).
func copyLogs(from, to string, procs []api.Process) error {
	if err := os.MkdirAll(to, 0o700); err != nil {
		return err
	}
	for _, p := range procs {
		src := filepath.Join(from, p.ID)
		ents, err := os.ReadDir(src)
		if err != nil || filepath.Base(src) != p.ID {
			continue // not captured
		}
		dst := filepath.Join(to, p.ID)
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		for _, e := range ents {
			if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
				continue
			}
			if _, err := sandbox.CloneFile(filepath.Join(dst, e.Name()), filepath.Join(src, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// allocatedTree is how much of the host's disk the files under dir take.
func allocatedTree(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err == nil {
			n += sandbox.Allocated(path)
		}
		return nil
	})
	return n
}

// writeJSON writes v to a new file, synced.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// syncTree syncs every file under dir, and dir.
func syncTree(dir string) error {
	return filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return syncPath(path)
	})
}

// syncPath flushes path, a file or a directory, to the disk.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// history is what a sandbox made from, or rolled back to, snap has of
// its processes: each one, with where it came from; those that ran then
// run no more.
func history(snap snapshotRecord) []api.Process {
	var out []api.Process
	for _, p := range snap.Processes {
		h := p
		h.PID, h.Held, h.Stdin = 0, false, nil
		h.ForkedFrom = &api.ForkedFrom{Sandbox: snap.Sandbox, Process: p.ID, Snapshot: snap.ID, Offsets: map[string]int64{}}
		h.Streams = map[string]api.StreamStatus{}
		for name, st := range p.Streams {
			h.ForkedFrom.Offsets[name] = st.TotalBytes
			h.Streams[name] = api.StreamStatus{TotalBytes: st.TotalBytes, Ended: true}
		}
		if h.State == api.StateRunning {
			h.State = api.StateForked
		}
		out = append(out, h)
	}
	return out
}

// ListSnapshots lists the snapshots, oldest first; of one sandbox (its
// id, or a unique prefix of it) when sandbox is set.
func (d *Daemon) ListSnapshots(sandboxRef string) ([]api.Snapshot, error) {
	if d.snaps == nil {
		return []api.Snapshot{}, nil
	}
	var id string
	if sandboxRef != "" {
		d.mu.Lock()
		e, err := d.lookup(sandboxRef)
		d.mu.Unlock()
		if err == nil {
			id = e.rec.ID
		} else {
			id = sandboxRef // a sandbox gone: its snapshots stay
		}
	}
	d.snaps.mu.Lock()
	defer d.snaps.mu.Unlock()
	out := []api.Snapshot{}
	for _, r := range d.snaps.byID {
		if id == "" || r.Sandbox == id || len(id) >= api.MinIDPrefix && strings.HasPrefix(r.Sandbox, id) {
			out = append(out, r.Snapshot)
		}
	}
	slices.SortFunc(out, func(a, b api.Snapshot) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

// RemoveSnapshot removes a snapshot; the sandboxes made from it keep
// their own copies.
func (d *Daemon) RemoveSnapshot(ref string) error {
	if d.snaps == nil {
		return fmt.Errorf("%w: no snapshot %q", errdefs.ErrNotFound, api.Clip(ref))
	}
	s := d.snaps
	s.mu.Lock()
	r, err := s.lookup(ref)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	id := r.ID
	gone := s.path(snapshotGoneMark + id)
	if err := os.Rename(s.path(id), gone); err != nil {
		s.mu.Unlock()
		return d.hostFailure("remove snapshot "+id, err)
	}
	delete(s.byID, id)
	s.mu.Unlock()
	os.RemoveAll(gone)
	d.forgetSnapshot(id)
	d.log.Info("snapshot removed", "id", id)
	return nil
}

// snapshotImageInUse says whether a snapshot keeps image id.
func (d *Daemon) snapshotImageInUse(id string) bool {
	if d.snaps == nil {
		return false
	}
	d.snaps.mu.Lock()
	defer d.snaps.mu.Unlock()
	for _, r := range d.snaps.byID {
		if r.ImageID == id {
			return true
		}
	}
	return false
}

// fromSnapshot fills in a create request from the snapshot it names,
// where the request leaves things out, and refuses one that asks for
// what the snapshot's disk cannot be: another image, another size.
func (d *Daemon) fromSnapshot(req *CreateRequest) (snapshotRecord, error) {
	snap, err := d.snapshot(req.Snapshot)
	if err != nil {
		return snapshotRecord{}, err
	}
	short := api.ShortID(snap.ID)
	switch {
	case req.Image != "" || req.Rootfs != "":
		return snapshotRecord{}, fmt.Errorf("%w: image and rootfs: a sandbox made from snapshot %s has its image (%s)", errdefs.ErrInvalidArgument, short, cmp.Or(snap.Image, snap.Rootfs, "the host's system directories"))
	case req.Limits.DiskBytes != nil && *req.Limits.DiskBytes != snap.DiskBytes:
		return snapshotRecord{}, fmt.Errorf("%w: limits.disk_bytes: a sandbox made from snapshot %s has its disk, of %d bytes", errdefs.ErrInvalidArgument, short, snap.DiskBytes)
	case snap.Memory && (req.Runtime != "" && req.Runtime != snap.Runtime || req.Limits.MemoryBytes != nil && *req.Limits.MemoryBytes != snap.Limits.MemoryBytes ||
		req.Hostname != "" || req.Init != nil || len(req.Mounts) > 0):
		return snapshotRecord{}, fmt.Errorf("%w: snapshot %s holds its processes' memory: a sandbox made from it has its runtime, memory limit, hostname and init command, and no mounts", errdefs.ErrInvalidArgument, short)
	}
	if snap.Memory {
		req.Hostname = snap.Hostname
	}
	req.Image, req.Rootfs = snap.ImageID, snap.Rootfs
	req.Limits.DiskBytes = &snap.DiskBytes
	if req.Limits.MemoryBytes == nil {
		req.Limits.MemoryBytes = &snap.Limits.MemoryBytes
	}
	if req.Limits.Pids == nil {
		req.Limits.Pids = &snap.Limits.Pids
	}
	if req.Limits.CPUs == nil {
		req.Limits.CPUs = &snap.Limits.CPUs
	}
	req.Runtime = cmp.Or(req.Runtime, snap.Runtime)
	if req.Network == nil && snap.Network != nil {
		n := *snap.Network
		n.Address = ""
		req.Network = &n
	}
	if req.Init == nil {
		req.Init = snap.Init
	}
	if req.Logs == nil {
		req.Logs = snap.Logs
	}
	req.OnOOM = cmp.Or(req.OnOOM, snap.OnOOM)
	req.IdleTimeoutSeconds = cmp.Or(req.IdleTimeoutSeconds, snap.IdleTimeout)
	req.TTLSeconds = cmp.Or(req.TTLSeconds, snap.TTL)
	labels := maps.Clone(snap.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, req.Labels)
	if len(labels) > 0 {
		req.Labels = labels
	}
	return snap, nil
}

// snapshotDisk is a new disk for sandbox id, a copy of snap's: its mount
// and its image.
func (d *Daemon) snapshotDisk(id string, snap snapshotRecord) (*os.File, string, error) {
	if d.disks == nil {
		return nil, "", errdefs.Opaque(errdefs.ErrUnavailable, "this host cannot make sandbox disks (kilnd's log says why, when it started)", d.disksErr)
	}
	img, err := d.disks.CloneFrom(d.snaps.path(snap.ID, snapshotDisk))
	if err != nil {
		return nil, "", d.hostFailure(fmt.Sprintf("sandbox %s: its disk could not be copied from snapshot %s", id, snap.ID), err)
	}
	m, err := d.disks.Mount(img)
	if err != nil {
		d.disks.Release(img)
		return nil, "", d.hostFailure(fmt.Sprintf("sandbox %s: its disk could not be mounted", id), err)
	}
	return m, img, nil
}

// Rollback gives the sandbox ref stands for the files of one of its
// snapshots: a running sandbox is stopped (grace as Stop's), its disk
// replaced by a copy of the snapshot's, and started again, its init
// command run again; a stopped one stays stopped. Its id, name, labels
// and captured logs stay; the snapshot's processes are its history.
func (d *Daemon) Rollback(ctx context.Context, ref, snapRef string, grace time.Duration) (Info, error) {
	if snapRef == "" {
		return Info{}, fmt.Errorf("%w: snapshot: want the snapshot to roll back to", errdefs.ErrInvalidArgument)
	}
	snap, err := d.snapshot(snapRef)
	if err != nil {
		return Info{}, err
	}
	e, err := d.get(ref)
	if err != nil {
		return Info{}, err
	}
	d.mu.Lock()
	id, wasRunning := e.rec.ID, e.rec.State == StateRunning
	d.mu.Unlock()
	if snap.Sandbox != id {
		return Info{}, fmt.Errorf("%w: snapshot %s was taken of sandbox %s, not of %s: make a sandbox from it (kiln run --from) instead", errdefs.ErrInvalidArgument,
			api.ShortID(snap.ID), api.ShortID(snap.Sandbox), api.ShortID(id))
	}
	if wasRunning {
		if _, _, err := d.Stop(ctx, id, grace); err != nil {
			return Info{}, err
		}
	}
	img, err := d.disks.CloneFrom(d.snaps.path(snap.ID, snapshotDisk))
	if err != nil {
		return Info{}, d.hostFailure(fmt.Sprintf("sandbox %s: its disk could not be copied from snapshot %s", id, snap.ID), err)
	}
	op := newOp(false)
	if e, err = d.claim(ctx, id, op); err != nil {
		d.disks.Release(img)
		return Info{}, err
	}
	old := e.rec.Disk
	e.rec.Disk, e.rec.DiskIDs, e.rec.History = img, snap.DiskIDs, history(snap)
	if e.rec.DiskIDs == sandboxUIDBase(e.rec) {
		e.rec.DiskIDs = 0
	}
	err = d.save(e.rec)
	if err != nil {
		e.rec.Disk = old
	}
	e.finishOp()
	d.mu.Unlock()
	if err != nil {
		d.disks.Release(img)
		return Info{}, d.hostFailure("sandbox "+id+" could not be recorded", err)
	}
	d.disks.Release(old)
	// Its history's output that it does not have in its own captured
	// logs: what the snapshot kept of those not captured.
	own := filepath.Join(d.sandboxDir(id), sandbox.LogsName)
	var kept []api.Process
	for _, p := range snap.Processes {
		if _, err := os.Lstat(filepath.Join(own, p.ID)); errors.Is(err, fs.ErrNotExist) {
			kept = append(kept, p)
		}
	}
	if err := copyLogs(d.snaps.path(snap.ID, snapshotLogs), own, kept); err != nil {
		d.log.Warn("the logs a snapshot kept of its processes were not all copied", "snapshot", snap.ID, "sandbox", id, "err", err)
	}
	ev := d.infoEvent(e, api.EventRolledBack)
	ev.Snapshot = snap.ID
	d.events.emit(ev)
	d.log.Info("sandbox rolled back", "id", id, "snapshot", snap.ID)
	if wasRunning {
		info, _, err := d.Start(ctx, id)
		return info, err
	}
	return d.infoOf(e), nil
}

// Fork makes count sandboxes, each with the files the sandbox ref stands
// for has now (a snapshot of it, removed once they are made), and its
// image, limits, runtime, network policy (each a new address), init
// command and labels, with labels added. Either all are made or none.
func (d *Daemon) Fork(ctx context.Context, ref string, req api.ForkRequest) ([]Info, error) {
	n := cmp.Or(req.Count, 1)
	if n < 1 || n > api.MaxForks {
		return nil, fmt.Errorf("%w: count %d: want 1 to %d", errdefs.ErrInvalidArgument, req.Count, api.MaxForks)
	}
	if err := validateLabels(req.Labels); err != nil {
		return nil, err
	}
	memory := false
	if !req.FilesOnly {
		d.mu.Lock()
		if e, err := d.lookup(ref); err == nil {
			memory = runtimeOf(e.rec) == sandbox.RuntimeGVisor && e.rec.State == StateRunning && !e.paused() && len(e.rec.Mounts) == 0
		}
		d.mu.Unlock()
	}
	snap, err := d.takeSnapshot(ctx, ref, api.SnapshotRequest{Memory: memory}, true)
	if err != nil {
		return nil, err
	}
	defer d.RemoveSnapshot(snap.ID)
	// Made forkParallel at a time: most of a create is its agent's start,
	// which waits on the kernel as much as it computes.
	out := make([]Info, n)
	errs := make([]error, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range min(n, forkParallel) {
		wg.Go(func() {
			for i := range next {
				out[i], errs[i] = d.Create(ctx, CreateRequest{Snapshot: snap.ID, Labels: req.Labels})
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i, made := range out {
			if errs[i] == nil {
				d.Delete(made.ID, false)
			}
		}
		for _, e := range errs {
			if e != nil {
				return nil, e // the first, whose class the answer takes
			}
		}
	}
	return out, nil
}

// forkParallel bounds the sandboxes a fork makes at once.
const forkParallel = 4

func (d *Daemon) snapshotHandler(w http.ResponseWriter, r *http.Request) {
	var req api.SnapshotRequest
	if err := decodeBody(w, r, &req); err != nil {
		reply.Error(w, err)
		return
	}
	if err := d.snapshotNameTaken(req.Name); err != nil {
		reply.Error(w, err)
		return
	}
	snap, err := d.Snapshot(r.Context(), r.PathValue("id"), req)
	if err != nil {
		reply.Error(w, err)
		return
	}
	d.publishSnapshot(r.Context(), snap)
	w.Header().Set("Location", "/snapshots/"+snap.ID)
	reply.JSON(w, http.StatusCreated, d.ownSnapshot(snap))
}

func (d *Daemon) listSnapshotsHandler(w http.ResponseWriter, r *http.Request) {
	sb := r.PathValue("id")
	for k, v := range r.URL.Query() {
		if k != "sandbox" || sb != "" || len(v) != 1 {
			reply.Error(w, fmt.Errorf("%w: parameter %q: want only sandbox, once", errdefs.ErrInvalidArgument, api.Clip(k)))
			return
		}
		sb = v[0]
	}
	if r.PathValue("id") != "" {
		if _, err := d.get(sb); err != nil {
			reply.Error(w, err)
			return
		}
	}
	out, err := d.ListSnapshots(sb)
	if err != nil {
		reply.Error(w, err)
		return
	}
	if d.cluster != nil {
		out = d.withRemoteSnapshots(r.Context(), out, sb)
	}
	reply.JSON(w, http.StatusOK, out)
}

// snapshot is the snapshot ref stands for (snapshots.lookup).
func (d *Daemon) snapshot(ref string) (snapshotRecord, error) {
	if d.snaps == nil {
		return snapshotRecord{}, fmt.Errorf("%w: no snapshot %q", errdefs.ErrNotFound, api.Clip(ref))
	}
	return d.snaps.get(ref)
}

func (d *Daemon) getSnapshotHandler(w http.ResponseWriter, r *http.Request) {
	snap, err := d.snapshot(r.PathValue("snapshot"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	reply.JSON(w, http.StatusOK, d.ownSnapshot(snap.Snapshot))
}

func (d *Daemon) removeSnapshotHandler(w http.ResponseWriter, r *http.Request) {
	if err := d.RemoveSnapshot(r.PathValue("snapshot")); err != nil {
		reply.Error(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (d *Daemon) rollbackHandler(w http.ResponseWriter, r *http.Request) {
	grace, err := stopTimeout(r.URL.Query())
	if err != nil {
		reply.Error(w, err)
		return
	}
	var req api.RollbackRequest
	if err := decodeBody(w, r, &req); err != nil {
		reply.Error(w, err)
		return
	}
	info, err := d.Rollback(r.Context(), r.PathValue("id"), req.Snapshot, grace)
	if err != nil {
		reply.Error(w, err)
		return
	}
	reply.JSON(w, http.StatusOK, info)
}

func (d *Daemon) forkHandler(w http.ResponseWriter, r *http.Request) {
	var req api.ForkRequest
	if err := decodeBody(w, r, &req); err != nil {
		reply.Error(w, err)
		return
	}
	made, err := d.Fork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		reply.Error(w, err)
		return
	}
	reply.JSON(w, http.StatusCreated, api.Forked{Sandboxes: made})
}

// historyOf is the history of the sandbox ref stands for (nil when it
// has none).
func (d *Daemon) historyOf(ref string) []api.Process {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, err := d.lookup(ref)
	if err != nil {
		return nil
	}
	return e.rec.History
}

// listProcesses lists a sandbox's processes, its agent's and then its
// history's.
func (d *Daemon) listProcesses(w http.ResponseWriter, r *http.Request) {
	hist := d.historyOf(r.PathValue("id"))
	if len(hist) == 0 || r.Header.Get("Upgrade") != "" {
		d.forward(w, r)
		return
	}
	rec := &bodyRecorder{header: http.Header{}}
	d.forward(rec, r)
	if rec.code != http.StatusOK {
		copyAnswer(w, rec)
		return
	}
	var procs []api.Process
	if err := json.Unmarshal(rec.body.Bytes(), &procs); err != nil {
		copyAnswer(w, rec)
		return
	}
	reply.JSON(w, http.StatusOK, append(procs, hist...))
}

// getProcess describes one process of a sandbox: its history's, or its
// agent's.
func (d *Daemon) getProcess(w http.ResponseWriter, r *http.Request) {
	pid := r.PathValue("pid")
	for _, p := range d.historyOf(r.PathValue("id")) {
		if p.ID == pid && r.Header.Get("Upgrade") == "" {
			reply.JSON(w, http.StatusOK, p)
			return
		}
	}
	d.forward(w, r)
}

// bodyRecorder keeps an answer for a handler to look at before it is
// sent.
type bodyRecorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bodyRecorder) Header() http.Header { return b.header }

func (b *bodyRecorder) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}

func (b *bodyRecorder) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	if b.body.Len()+len(p) > maxAgentAnswer {
		return 0, errors.New("answer too large")
	}
	return b.body.Write(p)
}

func copyAnswer(w http.ResponseWriter, b *bodyRecorder) {
	maps.Copy(w.Header(), b.header)
	w.WriteHeader(cmp.Or(b.code, http.StatusOK))
	w.Write(b.body.Bytes())
}
