package sandbox

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/confine"
)

// guestDir is where, in a container a runtime built, the agent finds its
// handles: its binary, the capture directory and the directory of its API
// socket, each mounted there from the host. The agent takes them and hides
// them before any sandboxed process starts.
const guestDir = "/.kiln"

// Names in guestDir (and guestAgentName).
const (
	guestLogs = "logs"
	guestSock = "sock"
)

// enterGuest is Enter for an agent that a runtime (gVisor's runsc) made
// its container's init: the root, /proc, /dev, the hostname, the
// loopback and the limits are the runtime's, as the container's spec
// gave them. The agent takes its handles from guestDir, hides it from the
// sandbox, and confines each process as on the host: the sandbox's user
// namespace, mapped to its uid range (users other than the agent's, which
// the runtime's kernel keeps apart from it as the host's would), Docker's
// capabilities, rlimits and seccomp filter.
func enterGuest(cfg AgentConfig) (*Inside, error) {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return nil, fmt.Errorf("sandbox: close-on-exec for inherited descriptors: %w", err)
	}
	exe, err := openSelf()
	if err != nil {
		return nil, err
	}
	logsDir, err := os.OpenFile(filepath.Join(guestDir, guestLogs), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		exe.Close()
		return nil, fmt.Errorf("sandbox: capture directory: %w", err)
	}
	logs, err := capture.NewDir(logsDir)
	if err != nil {
		exe.Close()
		return nil, err
	}
	// The socket is made in a directory the runtime passes through to the
	// host's, where kilnd dials it.
	l, err := net.Listen("unix", filepath.Join(guestDir, guestSock, SocketName))
	if err != nil {
		exe.Close()
		logs.Close()
		return nil, fmt.Errorf("sandbox: agent socket: %w", err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false) // the host's file, kilnd's to remove
	// Hidden, not unmounted: the runtime's file server serves the socket
	// and the capture directory through these mounts. Nothing below an
	// empty read-only mount can be reached, and the sandbox's processes,
	// in a user namespace of their own, cannot unmount it.
	if err := unix.Mount("tmpfs", guestDir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0555"); err != nil {
		exe.Close()
		logs.Close()
		l.Close()
		return nil, fmt.Errorf("sandbox: hide %s: %w", guestDir, err)
	}
	var groups []*os.File
	if cfg.PidsMax > 0 {
		tasks, err := guestPidsGroup(cfg.PidsMax)
		if err != nil {
			exe.Close()
			logs.Close()
			l.Close()
			return nil, err
		}
		groups = append(groups, tasks)
	}
	spawner := confine.NewSpawner(exe, confine.Config{NoFile: noFile(), NProc: nproc(cfg.PidsMax), OwnCgroups: true}, groups,
		func(cmd *exec.Cmd) error {
			isolate(cfg.UIDBase)(cmd.SysProcAttr)
			return cmd.Start()
		})
	if err := spawner.Begin(); err != nil {
		exe.Close()
		logs.Close()
		l.Close()
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	return &Inside{Config: cfg, Listener: l, Logs: logs, Spawner: spawner}, nil
}

// guestPidsGroup makes, in the runtime's own cgroup file system, a pids
// group limited to max and returns its tasks file, which the spawner's
// forking thread joins: the sandbox's processes are the runtime kernel's,
// which the host's pids group (holding the runtime's threads) does not
// count. The hierarchy is mounted nowhere the sandbox could see it.
func guestPidsGroup(max int64) (*os.File, error) {
	fs, err := unix.Fsopen("cgroup2", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("sandbox: the runtime's cgroups: fsopen: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return nil, fmt.Errorf("sandbox: the runtime's cgroups: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: the runtime's cgroups: fsmount: %w", err)
	}
	defer unix.Close(m)
	write := func(name, value string) error {
		fd, err := unix.Openat(m, name, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		_, err = f.WriteString(value)
		return err
	}
	if err := write("cgroup.subtree_control", "+pids"); err != nil {
		return nil, fmt.Errorf("sandbox: the runtime's pids controller: %w", err)
	}
	const group = "kiln-procs"
	if err := unix.Mkdirat(m, group, 0o755); err != nil && err != unix.EEXIST {
		return nil, fmt.Errorf("sandbox: the runtime's pids cgroup: %w", err)
	}
	if err := write(group+"/pids.max", strconv.FormatInt(max, 10)); err != nil {
		return nil, fmt.Errorf("sandbox: the runtime's pids limit: %w", err)
	}
	fd, err := unix.Openat(m, group+"/cgroup.procs", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: the runtime's pids cgroup: %w", err)
	}
	return os.NewFile(uintptr(fd), "pids cgroup.procs"), nil
}
