// Package sandbox is the host's side of kilnd's sandboxes: its backends
// (Linux namespaces, gVisor) make each sandbox's cgroups, disk and
// network hand-off, start its agent (kilnd's own binary re-executed, whose
// side is package guest, reached only through package handoff), adopt it
// again after a restart, pause and resume it, and end it.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/pidfd"
	"github.com/sandkiln/sandkiln/internal/procfs"
	"github.com/sandkiln/sandkiln/internal/rootfs"
)

// DefaultHostname is a sandbox's hostname when its request names none:
// "kiln-" and its short id (api.ShortID), as Docker names a container's,
// so that the name a shell's prompt shows is one kiln takes. A sandbox
// made when ids were UUIDv7s has the id's last 12 hex digits, its random
// ones (the first are its time).
func DefaultHostname(id string) string {
	if api.IsSandboxID(id) {
		return "kiln-" + api.ShortID(id)
	}
	id = strings.ReplaceAll(id, "-", "")
	return "kiln-" + id[max(0, len(id)-12):]
}

// Options describe a sandbox to create.
type Options struct {
	// Dir is the sandbox's directory in kilnd's state directory; it must
	// not exist yet. The sandbox's files (agent socket, captured logs,
	// workspace) live there, outside anything the sandbox can see.
	Dir string
	// ID names the sandbox; Hostname defaults to DefaultHostname's.
	ID       string
	Hostname string
	// Exe is the binary to re-execute as the agent.
	Exe string
	// Instance is the kilnd instance whose cgroup the sandbox's groups
	// are made in (see groupName); empty: kilnd's own.
	Instance string
	// Rootfs, when set, is a root filesystem directory to use instead of
	// the host's system directories, read-only under a writable overlay.
	Rootfs string
	// Layers, when set, are an image's layers (directories, the top one
	// first) used as Rootfs is, stacked in one overlay.
	Layers []string
	Limits Limits
	// Disk, when set, is the detached mount of a disk (see Disks) that
	// holds the sandbox's writable layers: its workspace, and its image's
	// upper layer. Without one they are in Dir, on the host's filesystem.
	Disk *os.File
	// DiskIDs, when set, is the first host uid of the range that owns
	// Disk's files, when that is not the sandbox's own: a disk copied from
	// another sandbox's (a snapshot's), mounted with its owners shifted
	// into this sandbox's range. Its layers are taken as they are, as a
	// restart takes them.
	DiskIDs int
	// UIDBase is the first host uid of the range the sandbox's users map
	// to (default DefaultUIDBase).
	UIDBase int
	// Env is the base environment of the sandbox's processes; Workdir
	// their default working directory (default /workspace); Entrypoint and
	// Cmd, an image's, what one of no command of its own runs
	// (api.ImageConfig.Command).
	Env             []string
	Workdir         string
	Entrypoint, Cmd []string
	// User, an image's, is who a process of no user runs as.
	User string
	// EndOnOOM ends the whole sandbox when it runs out of memory, instead
	// of the one process the kernel's killer picks (see AwaitExit).
	// gVisor sandboxes always end so.
	EndOnOOM bool
	// Ready bounds the wait for the agent to answer.
	Ready time.Duration
	// Init, when set, is the command whose exit ends the sandbox.
	Init *api.ExecRequest
	// CaptureQueue bounds, per captured process, the output queued for
	// its log writer (zero: capture.DefaultQueueBytes).
	CaptureQueue int64
	// CaptureMaxSize and CaptureMaxFiles rotate each captured process's
	// log (zero: capture.DefaultMaxSize, capture.DefaultMaxFiles).
	CaptureMaxSize  int64
	CaptureMaxFiles int
	// FlowGrace is how long a flow block process's output waits for its
	// holding watcher (zero: process.DefaultFlowGrace).
	FlowGrace time.Duration
	// SpawnerIdle is how long the sandbox's spawner outlasts its last
	// process (zero: handoff.DefaultSpawnerIdle; negative: it stays).
	SpawnerIdle time.Duration
	// MadeAhead says the sandbox is made ahead of the create that will
	// take it (see handoff.AgentConfig.MadeAhead).
	MadeAhead bool
	// Started, when set, is called with the instance's state (what
	// Backend.Adopt takes) once its agent runs, before it answers: kilnd
	// records the sandbox while the agent sets itself up. An error ends
	// the sandbox and is Create's.
	Started func(state json.RawMessage) error
	// Network, when set, connects the sandbox beyond its loopback: it is
	// called with the path of the sandbox's network namespace (its
	// agent's /proc/PID/ns/net, after Started, the agent waiting for it
	// before it answers or starts the init command; gVisor's, before runsc
	// starts in it). An error ends the sandbox. Resolvers are then the
	// name servers of its resolv.conf.
	Network   func(nsPath string) error
	Resolvers []string
	// Mounts are the caller's host directories, bound into the sandbox at
	// their targets (in order: a later one may be below an earlier one's).
	// Their directories are the caller's to close once Create returns.
	Mounts []Mount
	// Restart, when set, is the stopped instance (Halt, then End) of the
	// same sandbox that this one starts again from: Dir is its directory,
	// whose files are taken as they are (its captured logs, and its
	// writable layers there or on Disk, a disk of its image mounted
	// again), and its uid range, which owns those files, is this one's.
	Restart Instance
	// RestoreFrom, when set, is the directory of a gVisor sandbox's
	// checkpoint (Checkpointer): the sandbox is restored from it instead
	// of started, its processes going on where they were, in its own
	// directory, network (its namespace's addresses, not the saved
	// one's) and disk (a copy of the saved sandbox's, taken while
	// Checkpoint paused it, which the caller makes). Its other options
	// must make the same container as the saved one's did (image, the
	// mounts' targets and modes, memory limit), or runsc refuses; what
	// its kernel held is the saved one's whatever they say (hostname,
	// environment, init command). It keeps the saved sandbox's uid range,
	// whose users its processes are.
	RestoreFrom string
}

// layersExist says the sandbox's writable layers are there already, as
// its processes left them: it is started again, or its disk is a copy
// (of a snapshot's, or of the sandbox whose memory it is restored from).
func (o Options) layersExist() bool { return o.Restart != nil || o.DiskIDs != 0 || o.RestoreFrom != "" }

// Mount is a host directory bound into a sandbox: Dir, opened by whoever
// checked it may be (kilnd, against the directories it allows mounts
// from), so that what is bound is what was checked, whatever its path
// names meanwhile.
type Mount struct {
	Dir      *os.File
	Target   string
	ReadOnly bool
}

// bindTrees returns the detached mounts of ms's directories, in order,
// each with its attributes set (rootfs.BindTree); nil with an error.
func bindTrees(ms []Mount) ([]*os.File, error) {
	var trees []*os.File
	for _, m := range ms {
		fd, err := rootfs.BindTree(m.Dir, m.ReadOnly)
		if err != nil {
			for _, t := range trees {
				t.Close()
			}
			return nil, fmt.Errorf("sandbox: mount at %s: %w", m.Target, err)
		}
		trees = append(trees, os.NewFile(uintptr(fd), "mount"))
	}
	return trees, nil
}

// restarting is the stopped instance o starts again from, or nil for a
// new sandbox.
func (o Options) restarting() *Sandbox {
	if r, ok := o.Restart.(interface{ base() *Sandbox }); ok {
		return r.base()
	}
	return nil
}

// base is the part of an instance every backend's shares.
func (s *Sandbox) base() *Sandbox { return s }

// DefaultUIDBase is the host uid a sandbox's root maps to unless told
// otherwise; kilnd gives each sandbox a range of its own from there.
const DefaultUIDBase = 100000

// IDRange is how many uids (and gids) a sandbox maps.
const IDRange = handoff.IDRange

// Names in a sandbox's directory.
const (
	SocketName    = handoff.SocketName
	LogsName      = "logs"
	WorkspaceName = "workspace"
	diskName      = "disk" // where the agent mounts the sandbox's disk
	rootName      = "root"
	agentLogName  = "agent.log"
)

// Sandbox is a running sandbox as kilnd knows it: enough to reach its
// agent, kill it, and find it again after kilnd restarts.
type Sandbox struct {
	ID      string   `json:"id"`
	Dir     string   `json:"dir"`
	PID     int      `json:"pid"`      // the agent, in kilnd's pid namespace
	Started uint64   `json:"started"`  // the agent's start time in clock ticks, against pid reuse
	UIDBase int      `json:"uid_base"` // the host uid the sandbox's root is
	Cgroups *Cgroups `json:"cgroups"`
	// EndOnOOM says the sandbox ends as a whole when it is out of memory
	// (see AwaitExit); otherwise the kernel's killer ends one process.
	EndOnOOM bool `json:"end_on_oom,omitempty"`

	// reaped is closed once this kilnd has waited for the agent it started;
	// nil for an agent adopted after a restart.
	reaped chan struct{}
	// agent is a pidfd of the agent, once this kilnd holds one: from its
	// start until it is reaped, or from its adoption (while it ran) until
	// the sandbox ends; nil otherwise. Set before the sandbox is shared.
	// Alive asks it: kilnd's list asks every sandbox, and a poll of each
	// costs a fraction of a read of its /proc stat.
	agent *os.File
	// exited says how the agent this kilnd started exited, once it did.
	exited func() string
	// ranges, when set, holds the uid range until the sandbox is destroyed.
	ranges *IDRanges
}

// AgentPID implements Instance.
func (s *Sandbox) AgentPID() int { return s.PID }

// State implements Instance.
func (s *Sandbox) State() json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// End implements Instance: it kills what is left of a sandbox whose agent
// is gone (the kernel ends a pid namespace with its init, so normally
// nothing) and removes its cgroups.
func (s *Sandbox) End() {
	s.release()
	if s.Cgroups != nil {
		s.Cgroups.Kill(10 * time.Second)
		s.Cgroups.Destroy()
	}
}

// Socket is the path of the agent's API socket.
func (s *Sandbox) Socket() string { return filepath.Join(s.Dir, SocketName) }

// running records cmd, just started, as the agent of s (the instance inst
// is), has kilnd record the sandbox (o.Started) and connect it (o.Network,
// telling the agent through connected), and waits until the agent
// answers; where names the runtime in the error.
func running(ctx context.Context, s *Sandbox, inst Instance, cmd *exec.Cmd, o Options, where string, connected *os.File) error {
	// Its start time before anything waits for it: until then an agent
	// that exited at once is a zombie whose /proc entry is still there.
	started, err := startTime(cmd.Process.Pid)
	s.reap(cmd)
	if err != nil {
		return fmt.Errorf("sandbox: the agent's start time: %w", err)
	}
	s.Started = started
	if o.Started != nil {
		if err := o.Started(inst.State()); err != nil {
			return err
		}
	}
	if o.Network != nil {
		if err := o.Network(fmt.Sprintf("/proc/%d/ns/net", s.PID)); err != nil {
			return fmt.Errorf("sandbox: connect its network: %w", err)
		}
		if _, err := connected.Write([]byte{1}); err != nil {
			return fmt.Errorf("sandbox: connect its network: %w", err)
		}
	}
	err = awaitReady(ctx, inst, o.Ready, o.Dir, where)
	if errors.Is(err, errAgentExited) {
		// What it exited with says more than an empty log: a signal, or
		// the status runsc gives up with.
		err = fmt.Errorf("%w (%s)", err, s.exited())
	}
	return err
}

// reap records cmd, the agent just started, as the sandbox's: kilnd reaps
// the agent it started if it outlives it; an agent that outlives kilnd is
// adopted by the host. The wait is in the runtime's poller: kilnd may hold
// thousands, and a blocking wait would hold a thread (and a pid) for each.
// (The goroutine has its own copy of the channel: a failed Create returns
// a nil sandbox while the agent it started is still reaped.)
func (s *Sandbox) reap(cmd *exec.Cmd) {
	pid := cmd.Process.Pid
	s.PID = pid
	reaped := make(chan struct{})
	s.reaped = reaped
	agent, err := pidfd.Take(cmd.Process)
	if err == nil {
		s.agent = agent
	}
	var how string
	go func() {
		defer close(reaped)
		if err != nil {
			cmd.Wait()
			how = cmd.ProcessState.String()
			return
		}
		defer agent.Close()
		ws, err := pidfd.Wait(agent, pid)
		how = pidfd.Describe(ws)
		if err != nil {
			how = err.Error()
		}
	}()
	s.exited = func() string {
		select {
		case <-reaped:
			return how
		case <-time.After(time.Second):
			return "not reaped yet"
		}
	}
}

// awaitReady waits, up to ready, until the agent of the sandbox in dir
// answers; the error says why not, with the agent's log (where names
// the runtime, if any).
func awaitReady(ctx context.Context, s Instance, ready time.Duration, dir, where string) error {
	ctx, cancel := context.WithTimeout(ctx, ready)
	defer cancel()
	if err := pollReady(ctx, s); err != nil {
		msg, _ := os.ReadFile(filepath.Join(dir, agentLogName))
		return fmt.Errorf("sandbox: the agent did not start%s: %w: %s", where, err, strings.TrimSpace(string(msg)))
	}
	return nil
}

// errAgentExited: the agent exited before it answered.
var errAgentExited = errors.New("the agent exited")

// pollReady polls the agent's health until it answers.
func pollReady(ctx context.Context, s Instance) error {
	c := &http.Client{Transport: Transport(s.Dial)}
	defer c.CloseIdleConnections()
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://agent/healthz", nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if !s.Alive() {
			return errAgentExited
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// Client is an HTTP client whose every request goes to the agent.
func (s *Sandbox) Client() *http.Client {
	return &http.Client{Transport: Transport(s.Dial)}
}

// Dial connects to the agent's socket.
func (s *Sandbox) Dial(ctx context.Context) (net.Conn, error) { return dialSocket(ctx, s.Socket()) }

// dialSocket connects to the unix socket at path.
func dialSocket(ctx context.Context, path string) (c net.Conn, err error) {
	var d net.Dialer
	err = withSocketPath(path, func(path string) error {
		c, err = d.DialContext(ctx, "unix", path)
		return err
	})
	return c, err
}

// InitExit reads the exit of the sandbox's init command, which the agent
// recorded before ending the sandbox; nil when there is none.
func (s *Sandbox) InitExit() *handoff.InitExit {
	b, err := os.ReadFile(filepath.Join(s.Dir, LogsName, handoff.InitExitName))
	if err != nil {
		return nil
	}
	var e handoff.InitExit
	if json.Unmarshal(b, &e) != nil {
		return nil
	}
	return &e
}

// AwaitExit blocks until the agent has exited or stop is closed; it works
// for an agent this kilnd started and for one it adopted.
func (s *Sandbox) awaitAgent(stop <-chan struct{}) {
	if s.reaped != nil {
		// Its reaper's channel says it: no descriptor and no goroutine
		// more per sandbox, of which kilnd may have thousands.
		select {
		case <-s.reaped:
		case <-stop:
		}
		return
	}
	if s.agent != nil {
		pidfd.Await(s.agent, stop)
		return
	}
	f, err := pidfd.Open(s.PID)
	if err != nil {
		return // gone already
	}
	defer f.Close()
	if !s.Alive() { // the pid may have been reused before the pidfd was opened
		return
	}
	pidfd.Await(f, stop)
}

// maxSocketPath is the longest path a unix socket address holds.
const maxSocketPath = 107

// withSocketPath calls f with a path for the socket at path that fits in a
// socket address: the path itself, or, for a state directory deep enough
// to make it too long, the same file reached through a descriptor of its
// directory.
func withSocketPath(path string, f func(string) error) error {
	if len(path) <= maxSocketPath {
		return f(path)
	}
	dir, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer dir.Close()
	return f(fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
}

// Alive reports whether the agent still runs (and is the same process).
func (s *Sandbox) Alive() bool {
	if s.agent != nil {
		return !pidfd.Exited(s.agent)
	}
	return s.runs()
}

// runs reports, from /proc, whether the agent still runs (and is the same
// process).
func (s *Sandbox) runs() bool {
	// One read of its stat for both.
	f, err := statFields(s.PID)
	if err != nil || len(f) < 20 {
		return false
	}
	// A zombie has exited when it is its group's last thread (field 20,
	// the thread count, is 1). A first thread that shows as a zombie
	// while others run belongs to a live process: one whose first thread
	// ended, or one executing a program from another thread (a Go
	// program may, as kilnd's binary does when it starts runsc), for
	// that moment.
	if threads, err := strconv.Atoi(f[17]); f[0] == "Z" && (err != nil || threads <= 1) {
		return false
	}
	t, err := strconv.ParseUint(f[19], 10, 64)
	return err == nil && t == s.Started
}

// release closes the pidfd of an adopted agent, which has ended: Alive
// says so from then on. (The reaper of an agent this kilnd started closes
// its own once it has reaped it.)
func (s *Sandbox) release() {
	if s.agent != nil && s.reaped == nil {
		s.agent.Close()
	}
}

// adopted takes a pidfd of the agent of a sandbox adopted after a
// restart, if it still runs.
func (s *Sandbox) adopted() {
	f, err := pidfd.Open(s.PID)
	if err != nil {
		return
	}
	// The pid may have been reused before the pidfd was opened: it is the
	// agent's if the process still has the agent's start time.
	if !s.runs() {
		f.Close()
		return
	}
	s.agent = f
}

// Destroy kills everything in the sandbox and removes its cgroups and
// files; with keepLogs the captured logs (and the directory holding them)
// stay.
func (s *Sandbox) Destroy(keepLogs bool) error {
	// The sandbox's processes first, all at once (frozen, killed, thawed),
	// the agent left running: it sees each of them end, drains their
	// output and ends their captured runs with their end records. Asked
	// first, it would wait for them to its own shutdown's bound, and a
	// fork bomb, or processes that left their process group, outlasts it
	// (30 s and more went by before such a sandbox was gone).
	//
	// Without its logs, nothing the agent's shutdown writes is kept: it
	// is killed with everything else, at once (a third of a delete's
	// time was its shutdown).
	var errs []error
	if keepLogs {
		if s.Cgroups != nil {
			if err := s.Cgroups.KillProcs(killTimeout); err != nil {
				errs = append(errs, err)
			}
		}
		// Then the agent's own shutdown, and whatever is left.
		s.stop(stopTimeout)
	}
	return errors.Join(append(errs, s.remove(keepLogs, nil))...)
}

// killTimeout bounds the wait for a sandbox's processes to be gone once
// they are killed.
const killTimeout = 10 * time.Second

// Halt implements Instance: the sandbox's processes are killed at once,
// the agent left running to see them end (as Destroy does, and for the
// same reason), then the agent shuts down, and whatever is left, the
// agent too, is killed with the cgroup.
func (s *Sandbox) Halt() error {
	var errs []error
	if s.Cgroups != nil {
		if err := s.Cgroups.KillProcs(killTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	s.stop(stopTimeout)
	return errors.Join(append(errs, s.killAll())...)
}

// killAll kills whatever is left in the sandbox's cgroups, and waits,
// bounded, until this kilnd has reaped the agent it started.
func (s *Sandbox) killAll() error {
	var errs []error
	if s.Cgroups != nil {
		if err := s.Cgroups.Kill(killTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	if s.reaped != nil {
		select {
		case <-s.reaped:
		case <-time.After(killTimeout):
			errs = append(errs, fmt.Errorf("sandbox: the agent %d was not reaped", s.PID))
		}
	}
	return errors.Join(errs...)
}

// remove kills whatever is left in the sandbox, calls forget (if set)
// once nothing runs, and removes its cgroups and files, the logs kept
// when keepLogs.
func (s *Sandbox) remove(keepLogs bool, forget func() error) error {
	var errs []error
	if s.Cgroups != nil {
		if err := s.Cgroups.Kill(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
		s.release()
		if s.reaped != nil {
			select {
			case <-s.reaped:
			case <-time.After(10 * time.Second):
				errs = append(errs, fmt.Errorf("sandbox: the agent %d was not reaped", s.PID))
			}
		}
	}
	if forget != nil {
		if err := forget(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.Cgroups != nil {
		if err := s.Cgroups.Destroy(); err != nil {
			errs = append(errs, err)
		}
	}
	ents, err := os.ReadDir(s.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if keepLogs && (e.Name() == LogsName || strings.HasSuffix(e.Name(), ".json")) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.Dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if !keepLogs {
		if err := os.Remove(s.Dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 && s.ranges != nil {
		// Nothing of the sandbox's runs any more, and its files are gone
		// but for the logs, which kilnd owns.
		s.ranges.Release(s.UIDBase, s.ID)
	}
	return errors.Join(errs...)
}

// stopTimeout bounds the agent's own shutdown when a sandbox is deleted.
const stopTimeout = 20 * time.Second // beyond the agent's own shutdown bound

// stop sends the agent SIGTERM and waits, bounded, for it to exit.
func (s *Sandbox) stop(timeout time.Duration) {
	s.await(timeout, func(fd int) error { return unix.PidfdSendSignal(fd, unix.SIGTERM, nil, 0) })
}

// await calls signal (if set) with a pidfd of the agent, then waits,
// bounded, for the agent to exit.
func (s *Sandbox) await(timeout time.Duration, signal func(pidfd int) error) {
	if !s.Alive() {
		return
	}
	fd, err := unix.PidfdOpen(s.PID, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if !s.Alive() { // the pid may have been reused before the pidfd was opened
		return
	}
	if signal != nil {
		if err := signal(fd); err != nil {
			return
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left/time.Millisecond)+1)
		if n > 0 || (err != nil && err != unix.EINTR) {
			return
		}
	}
}

// startTime reads a process's start time (field 22 of its stat), which
// with the pid identifies it across pid reuse.
func startTime(pid int) (uint64, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 20 {
		return 0, fmt.Errorf("short stat of %d", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// statFields returns /proc/PID/stat's fields after the command name,
// starting with the state (field 3).
func statFields(pid int) ([]string, error) {
	_, f, err := procfs.Stat(pid)
	return f, err
}
