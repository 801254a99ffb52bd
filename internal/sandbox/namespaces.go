// The namespace backend's start: the writable layers, and the agent's
// command with the descriptors it inherits (package handoff numbers them).

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandkiln/sandkiln/internal/handoff"
	"golang.org/x/sys/unix"
)

// Create makes a sandbox and starts its agent, and returns once the agent
// answers. On failure nothing of it is left running.
func Create(ctx context.Context, o Options) (sb *Sandbox, err error) {
	// As long as gVisor's: no kernel starts first, but on a host whose
	// cores are all busy the agent and its spawner (and, in tests, a
	// binary built with the race detector) may wait for a CPU longer than
	// a quiet host's millisecond suggests, and a create that fails for
	// that is worse than a slow one.
	o = o.withDefaults(30 * time.Second)
	if o.UIDBase == 0 {
		o.UIDBase = DefaultUIDBase
	}
	s, err := begin(o, rootName, LogsName)
	if err != nil {
		return nil, err
	}
	defer s.end(&err)
	if err := shiftDisk(o.Exe, o); err != nil {
		return nil, err
	}
	cfg := handoff.AgentConfig{
		ID: o.ID, Hostname: o.Hostname, Root: filepath.Join(o.Dir, rootName),
		UIDBase: o.UIDBase, Env: o.Env, Init: o.Init, Dir: o.Workdir, Entrypoint: o.Entrypoint, Cmd: o.Cmd, User: o.User,
		CaptureQueue: o.CaptureQueue, CaptureMaxSize: o.CaptureMaxSize, CaptureMaxFiles: o.CaptureMaxFiles,
		FlowGrace: o.FlowGrace, SpawnerIdle: o.SpawnerIdle, MadeAhead: o.MadeAhead, TmpfsBytes: o.Limits.MemoryBytes, PidsMax: o.Limits.Pids,
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

// writableLayers makes the sandbox's writable layers, its workspace and,
// with a root file system of its own, the overlay's upper layer, and says
// where they are in cfg: on the sandbox's disk, which the agent mounts
// where it finds them (in its own mount namespace only), or in its
// directory. The sandbox's root owns them.
//
// A sandbox started again (Options.Restart) has them from its earlier
// start, with what its processes wrote and the owners and modes they
// left: they are taken as they are.
func writableLayers(o Options, cfg *handoff.AgentConfig) error {
	layers := o.Dir
	again := o.layersExist()
	mkdirOwned := func(name string, mode uint32, owner int) error {
		path := filepath.Join(o.Dir, name)
		made, err := mkdir(path, os.FileMode(mode), again)
		if made {
			err = os.Chown(path, owner, owner)
		}
		if made && err == nil {
			err = os.Chmod(path, os.FileMode(mode)) // whatever the umask
		}
		return err
	}
	if o.Disk != nil {
		cfg.Disk = filepath.Join(o.Dir, diskName)
		layers = cfg.Disk
		if _, err := mkdir(cfg.Disk, 0o700, again); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		mkdirOwned = func(name string, mode uint32, owner int) error {
			fd := int(o.Disk.Fd())
			err := unix.Mkdirat(fd, name, mode)
			if again && errors.Is(err, unix.EEXIST) {
				var st unix.Stat_t
				if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
					return nil
				}
			}
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
	if err := mkdirOwned(WorkspaceName, 0o755, o.UIDBase); err != nil {
		return fmt.Errorf("sandbox: workspace: %w", err)
	}
	lowers, err := o.lowers()
	if err != nil || len(lowers) == 0 {
		return err
	}
	cfg.Rootfs, cfg.Layers = lowers[0], lowers
	for i := range lowers {
		cfg.Lowers = append(cfg.Lowers, filepath.Join(o.Dir, lowerName(i)))
		if _, err := mkdir(cfg.Lowers[i], 0o755, again); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
	}
	cfg.Upper, cfg.Work = filepath.Join(layers, "upper"), filepath.Join(layers, "work")
	// The merged root is the upper layer's: the sandbox's root owns it.
	if err := mkdirOwned("upper", 0o755, o.UIDBase); err != nil {
		return fmt.Errorf("sandbox: upper layer: %w", err)
	}
	if err := mkdirOwned("work", 0o755, 0); err != nil {
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
	// handoff.FDListener to handoff.FDLast, then the mounts'.
	cmd.ExtraFiles = make([]*os.File, handoff.FDLast-2, handoff.FDLast-2+len(h.mounts))
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
	cmd.ExtraFiles = append(cmd.ExtraFiles, h.mounts...)
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
	listener, logs *os.File   // its API socket; the capture directory
	cgroup         *os.File   // the v2 group it is born in
	agentLog       *os.File   // its own output
	oom            *os.File   // the out-of-memory counter, with a memory limit
	await          *os.File   // the network's pipe's end, with a network
	mounts         []*os.File // the caller's directories, detached mounts
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
	// The caller's directories, each a detached mount the agent moves
	// into the sandbox's root: nothing of them is mounted on the host.
	trees, err := bindTrees(o.Mounts)
	if err != nil {
		return h, err
	}
	for i, t := range trees {
		h.mounts = append(h.mounts, a.keep(t))
		cfg.Mounts = append(cfg.Mounts, handoff.Mount{Target: o.Mounts[i].Target})
	}
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
