// Package sandbox is the host's side of kilnd's sandboxes: its backends
// (Linux namespaces, gVisor) make each sandbox's cgroups, disk and
// network hand-off, start its agent (kilnd's own binary re-executed, whose
// side is package guest, reached only through package handoff), adopt it
// again after a restart, and end it.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/pidfd"
	"github.com/sandkiln/sandkiln/internal/rootfs"
)

// DefaultHostname is a sandbox's hostname when its request names none:
// "kiln-" and the id's last 12 hex digits, as Docker names a container's.
// In a UUIDv7 those are random; its first ones are its time, the same for
// sandboxes made in the same millisecond.
func DefaultHostname(id string) string {
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
}

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

// Create makes a sandbox and starts its agent, and returns once the agent
// answers. On failure nothing of it is left running.
func Create(ctx context.Context, o Options) (sb *Sandbox, err error) {
	o = o.withDefaults(10 * time.Second)
	if o.UIDBase == 0 {
		o.UIDBase = DefaultUIDBase
	}
	s, err := begin(o, rootName, LogsName)
	if err != nil {
		return nil, err
	}
	defer s.end(&err)
	cfg := handoff.AgentConfig{
		ID: o.ID, Hostname: o.Hostname, Root: filepath.Join(o.Dir, rootName),
		UIDBase: o.UIDBase, Env: o.Env, Init: o.Init, Dir: o.Workdir, Entrypoint: o.Entrypoint, Cmd: o.Cmd, User: o.User,
		CaptureQueue: o.CaptureQueue, CaptureMaxSize: o.CaptureMaxSize, CaptureMaxFiles: o.CaptureMaxFiles,
		FlowGrace: o.FlowGrace, SpawnerIdle: o.SpawnerIdle, TmpfsBytes: o.Limits.MemoryBytes, PidsMax: o.Limits.Pids,
	}
	if err := writableLayers(o, &cfg); err != nil {
		return nil, err
	}
	cg, err := s.cgroups(o.Instance, o.Limits, o.EndOnOOM, nil)
	if err != nil {
		return nil, err
	}
	sb = &Sandbox{ID: o.ID, Dir: o.Dir, Cgroups: cg, UIDBase: o.UIDBase, EndOnOOM: o.EndOnOOM}
	a, err := agentCommand(s, sb, cfg)
	defer a.close()
	if err != nil {
		return nil, err
	}
	err = a.cmd.Start()
	a.handedOver()
	if err != nil {
		return nil, fmt.Errorf("sandbox: start the agent: %w", err)
	}
	if err := running(ctx, sb, sb, a.cmd, o, "", a.connected); err != nil {
		return nil, err
	}
	return sb, nil
}

// withDefaults is o with the hostname and the wait for the agent (ready)
// that a request leaves out.
func (o Options) withDefaults(ready time.Duration) Options {
	if o.Hostname == "" {
		o.Hostname = DefaultHostname(o.ID)
	}
	if o.Ready == 0 {
		o.Ready = ready
	}
	return o
}

// writableLayers makes the sandbox's writable layers, its workspace and,
// with a root file system of its own, the overlay's upper layer, and says
// where they are in cfg: on the sandbox's disk, which the agent mounts
// where it finds them (in its own mount namespace only), or in its
// directory. The sandbox's root owns them.
func writableLayers(o Options, cfg *handoff.AgentConfig) error {
	layers := o.Dir
	mkdir := func(name string, mode uint32, owner int) error {
		path := filepath.Join(o.Dir, name)
		err := os.Mkdir(path, os.FileMode(mode))
		if err == nil {
			err = os.Chown(path, owner, owner)
		}
		if err == nil {
			err = os.Chmod(path, os.FileMode(mode)) // whatever the umask
		}
		return err
	}
	if o.Disk != nil {
		cfg.Disk = filepath.Join(o.Dir, diskName)
		layers = cfg.Disk
		if err := os.Mkdir(cfg.Disk, 0o700); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		mkdir = func(name string, mode uint32, owner int) error {
			fd := int(o.Disk.Fd())
			err := unix.Mkdirat(fd, name, mode)
			if err == nil {
				err = unix.Fchownat(fd, name, owner, owner, 0)
			}
			if err == nil {
				err = unix.Fchmodat(fd, name, mode, 0)
			}
			return err
		}
	}
	cfg.Workspace = filepath.Join(layers, WorkspaceName)
	if err := mkdir(WorkspaceName, 0o755, o.UIDBase); err != nil {
		return fmt.Errorf("sandbox: workspace: %w", err)
	}
	lowers, err := o.lowers()
	if err != nil || len(lowers) == 0 {
		return err
	}
	cfg.Rootfs, cfg.Layers = lowers[0], lowers
	for i := range lowers {
		cfg.Lowers = append(cfg.Lowers, filepath.Join(o.Dir, lowerName(i)))
		if err := os.Mkdir(cfg.Lowers[i], 0o755); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
	}
	cfg.Upper, cfg.Work = filepath.Join(layers, "upper"), filepath.Join(layers, "work")
	// The merged root is the upper layer's: the sandbox's root owns it.
	if err := mkdir("upper", 0o755, o.UIDBase); err != nil {
		return fmt.Errorf("sandbox: upper layer: %w", err)
	}
	if err := mkdir("work", 0o755, 0); err != nil {
		return fmt.Errorf("sandbox: upper layer: %w", err)
	}
	return nil
}

// agentStart is the agent's command, ready to start, with the descriptors
// it inherits: kilnd's copies of them are closed once it has started
// (handedOver), the rest when Create returns (close).
type agentStart struct {
	cmd *exec.Cmd
	// listener is the agent's API socket; connected, when the sandbox has
	// a network, the pipe kilnd says it is connected on.
	listener  *net.UnixListener
	connected *os.File
	closers   []*os.File
}

// handedOver closes kilnd's copies of what the agent, started, inherited:
// a connection to its socket is then answered by the agent or refused,
// never left waiting.
func (a *agentStart) handedOver() {
	for _, f := range a.cmd.ExtraFiles {
		if f != nil {
			f.Close()
		}
	}
	a.listener.Close()
}

// close closes what is left open of the start.
func (a *agentStart) close() {
	if a.listener != nil {
		a.listener.Close()
	}
	for _, f := range a.closers {
		f.Close()
	}
}

// agentCommand makes the command that starts sb's agent: kilnd's own
// binary, in new namespaces (pid, mount, uts, ipc, network), born in
// sb's cgroup, given cfg and inheriting the descriptors handoff numbers.
// The agentStart it returns is to be closed even with an error.
func agentCommand(s *startup, sb *Sandbox, cfg handoff.AgentConfig) (*agentStart, error) {
	o, cg := s.o, sb.Cgroups
	a := &agentStart{}
	h, err := a.openHandles(s, sb, &cfg)
	if err != nil {
		return a, err
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return a, err
	}
	cmd := exec.Command(o.Exe)
	a.cmd = cmd
	// Its command line is what the sandbox's processes see as PID 1's:
	// a name, not kilnd's path on the host.
	cmd.Args = []string{"kiln-agent"}
	// The agent runs its Go code on one thread (agent.Procs); told so
	// before its runtime starts, it makes no thread for a second one
	// then, and each thread it would keep for good takes a host pid.
	cmd.Env = []string{handoff.AgentEnv + "=" + string(raw), "GOMAXPROCS=1"}
	if v, ok := os.LookupEnv("GORACE"); ok {
		// A build with the race detector (the tests') takes its options
		// here; without them each agent's exit waits a second for it.
		cmd.Env = append(cmd.Env, "GORACE="+v)
	}
	cmd.Stdout, cmd.Stderr = h.agentLog, h.agentLog
	cmd.ExtraFiles = make([]*os.File, handoff.FDLast-2) // handoff.FDListener to handoff.FDLast
	cmd.ExtraFiles[handoff.FDListener-3], cmd.ExtraFiles[handoff.FDLogs-3] = h.listener, h.logs
	// The spawner's forking thread joins the limited groups, and so every
	// process it starts is born in them; the agent joins the CPU group
	// above their CPU limit itself, whose own bounds the two together.
	// (A move into a v1 group waits for an RCU grace period, milliseconds
	// on an idle host: neither holds up the agent's answer.)
	for _, g := range []struct {
		fd        int
		dir, file string
	}{{handoff.FDTasks, cg.Procs, "tasks"}, {handoff.FDMemoryTasks, cg.MemoryProcs, "tasks"}, {handoff.FDCPUTasks, cg.CPUProcs, "tasks"}, {handoff.FDCPUProcs, cg.V1["cpu"], "cgroup.procs"},
		{handoff.FDProcsCgroup, cg.procsDir2(), "cgroup.procs"}, {handoff.FDPidsThreads, cg.pidsDir2(), "cgroup.threads"}} {
		if g.dir == "" {
			continue
		}
		f, err := os.OpenFile(filepath.Join(g.dir, g.file), os.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return a, fmt.Errorf("sandbox: %w", err)
		}
		cmd.ExtraFiles[g.fd-3] = a.keep(f)
	}
	if h.oom != nil {
		cmd.ExtraFiles[handoff.FDOOMEvents-3] = h.oom
	}
	if o.Disk != nil {
		cmd.ExtraFiles[handoff.FDDisk-3] = o.Disk
	}
	if h.await != nil {
		cmd.ExtraFiles[handoff.FDNetwork-3] = h.await
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWNET,
		Setsid:      true,
		UseCgroupFD: true,
		CgroupFD:    int(h.cgroup.Fd()),
		// No supplementary group of kilnd's: they are host groups, in
		// force in the sandbox though unmapped (its spawner drops them
		// too, and refuses to run if it cannot).
		Credential: &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), Groups: []uint32{}},
	}
	return a, nil
}

// agentHandles are the files an agent is started with, beside its
// cgroups' (agentCommand opens those).
type agentHandles struct {
	listener, logs *os.File // its API socket; the capture directory
	cgroup         *os.File // the v2 group it is born in
	agentLog       *os.File // its own output
	oom            *os.File // the out-of-memory counter, with a memory limit
	await          *os.File // the network's pipe's end, with a network
}

// keep adds f to what close closes, and returns it.
func (a *agentStart) keep(f *os.File) *os.File {
	a.closers = append(a.closers, f)
	return f
}

// openHandles opens the agent's socket (a.listener) and the files it is
// started with, and says in cfg which it gets.
func (a *agentStart) openHandles(s *startup, sb *Sandbox, cfg *handoff.AgentConfig) (h agentHandles, err error) {
	o, cg := s.o, sb.Cgroups
	err = withSocketPath(sb.Socket(), func(path string) error {
		l, err := net.Listen("unix", path)
		if err == nil {
			a.listener = l.(*net.UnixListener)
		}
		return err
	})
	if err != nil {
		return h, fmt.Errorf("sandbox: agent socket: %w", err)
	}
	a.listener.SetUnlinkOnClose(false) // the agent serves it after kilnd lets go
	if err := os.Chmod(sb.Socket(), 0o600); err != nil {
		return h, fmt.Errorf("sandbox: %w", err)
	}
	if h.listener, err = a.listener.File(); err != nil {
		return h, fmt.Errorf("sandbox: %w", err)
	}
	a.keep(h.listener)
	if h.logs, err = os.OpenFile(filepath.Join(o.Dir, LogsName), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
		return h, fmt.Errorf("sandbox: %w", err)
	}
	a.keep(h.logs)
	if h.cgroup, err = cg.open(); err != nil {
		return h, fmt.Errorf("sandbox: %w", err)
	}
	a.keep(h.cgroup)
	if h.agentLog, err = s.agentLog(); err != nil {
		return h, err
	}
	a.keep(h.agentLog)
	if h.oom, err = cg.OOMEvents(); err != nil {
		return h, fmt.Errorf("sandbox: %w", err)
	}
	if h.oom != nil {
		a.keep(h.oom)
	}
	cfg.PidsLimited, cfg.MemoryLimited, cfg.CPULimited = cg.Procs != "", cg.MemoryProcs != "", cg.CPUProcs != ""
	cfg.OOMEvents = h.oom != nil
	cfg.ProcsCgroup = cg.procsDir2() != ""
	cfg.PidsThreads = cg.pidsDir2() != ""
	// The agent waits for its network on a pipe: a byte once kilnd has
	// connected it, nothing if that failed.
	if o.Network != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return h, fmt.Errorf("sandbox: %w", err)
		}
		h.await, a.connected = a.keep(r), a.keep(w)
		cfg.Network, cfg.Resolvers = true, o.Resolvers
	}
	return h, nil
}

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

// holderEnv makes kilnd's binary the user-namespace holder (see idmapped).
const holderEnv = "KILN_USERNS_HOLDER"

// IsHolder reports whether kilnd's binary was started to hold a user
// namespace while kilnd id-maps an image's layers (HoldUserns).
func IsHolder() bool { return os.Getenv(holderEnv) != "" }

// HoldUserns serves holderEnv: it holds the user namespace it was started
// in until kilnd closes its standard input. It never returns.
func HoldUserns() {
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// lowers are the directories of o's root filesystem, the top one first,
// each checked to be one; none for the host's system directories.
func (o Options) lowers() ([]string, error) {
	lowers := o.Layers
	if o.Rootfs != "" {
		lowers = []string{o.Rootfs}
	}
	if len(lowers) > maxLayers {
		return nil, fmt.Errorf("sandbox: %d layers, at most %d", len(lowers), maxLayers)
	}
	for _, l := range lowers {
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("sandbox: rootfs %s is not a directory", l)
		}
	}
	return lowers, nil
}

// maxLayers bounds an image's layers (an image store's own bound).
const maxLayers = 128

// lowerName names the mount point of layer i (from the top) in a
// sandbox's directory.
func lowerName(i int) string {
	if i == 0 {
		return "lower"
	}
	return "lower." + strconv.Itoa(i)
}

// idmapped returns dirs as detached mounts whose owners are shifted into
// the sandbox's range, uid 0 becoming base: the sandbox's root owns what
// the image's root owns. The mapping comes from a user namespace that a
// short-lived helper (this binary) holds while the mounts are set up.
func idmapped(exe string, dirs []string, base int) (trees []*os.File, err error) {
	holder := exec.Command(exe)
	holder.Env = []string{holderEnv + "=1"}
	in, err := holder.StdinPipe()
	if err != nil {
		return nil, err
	}
	holder.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: handoff.IDRange}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: handoff.IDRange}},
	}
	if err := holder.Start(); err != nil {
		return nil, fmt.Errorf("user namespace holder: %w", err)
	}
	defer func() {
		in.Close()
		holder.Wait()
	}()
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", holder.Process.Pid))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	defer func() {
		if err != nil {
			for _, t := range trees {
				t.Close()
			}
			trees = nil
		}
	}()
	for _, dir := range dirs {
		fd, err := rootfs.IDMapTree(dir, int(ns.Fd()))
		if err != nil {
			return nil, err
		}
		trees = append(trees, os.NewFile(uintptr(fd), "rootfs"))
	}
	return trees, nil
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
	var errs []error
	if s.Cgroups != nil {
		if err := s.Cgroups.KillProcs(killTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	// Then the agent's own shutdown, and whatever is left.
	s.stop(stopTimeout)
	return errors.Join(append(errs, s.remove(keepLogs, nil))...)
}

// killTimeout bounds the wait for a sandbox's processes to be gone once
// they are killed.
const killTimeout = 10 * time.Second

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
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed stat of %d", pid)
	}
	return strings.Fields(s[i+1:]), nil
}
