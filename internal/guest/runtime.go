package guest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/guest/confine"
	"github.com/sandkiln/sandkiln/internal/handoff"
)

// enterGuest is Enter for an agent that a runtime (gVisor's runsc) made
// its container's init: the root, /proc, /dev, the hostname, the
// loopback and the limits are the runtime's, as the container's spec
// gave them. The agent takes its handles from handoff.GuestDir, hides it from the
// sandbox, and confines each process as on the host: the sandbox's user
// namespace, mapped to its uid range (users other than the agent's, which
// the runtime's kernel keeps apart from it as the host's would), Docker's
// capabilities, rlimits and seccomp filter.
func enterGuest(cfg handoff.AgentConfig) (*Inside, error) {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return nil, fmt.Errorf("sandbox: close-on-exec for inherited descriptors: %w", err)
	}
	exe, err := openSelf()
	if err != nil {
		return nil, err
	}
	logsDir, err := os.OpenFile(filepath.Join(handoff.GuestDir, handoff.GuestLogs), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		exe.Close()
		return nil, fmt.Errorf("sandbox: capture directory: %w", err)
	}
	logs, err := capture.NewDir(logsDir)
	if err != nil {
		exe.Close()
		return nil, err
	}
	// kilnd listens in a directory the runtime passes through to the
	// host's, and the agent connects to it (see dialListener), through the
	// directory kept open: its path is hidden below.
	sockFD, err := unix.Open(filepath.Join(handoff.GuestDir, handoff.GuestSock), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		exe.Close()
		logs.Close()
		return nil, fmt.Errorf("sandbox: kilnd's socket directory: %w", err)
	}
	l := newDialListener(dialAt(sockFD, handoff.SocketName))
	// Hidden, not unmounted: the runtime's file server serves the socket
	// and the capture directory through these mounts. Nothing below an
	// empty read-only mount can be reached, and the sandbox's processes,
	// in a user namespace of their own, cannot unmount it.
	if err := unix.Mount("tmpfs", handoff.GuestDir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0555"); err != nil {
		exe.Close()
		logs.Close()
		l.Close()
		return nil, fmt.Errorf("sandbox: hide %s: %w", handoff.GuestDir, err)
	}
	// The sandbox's processes are born in a group of the runtime's
	// kernel, which counts them and their memory apart from the agent's.
	procs, usage, err := guestProcsGroup(cfg.PidsMax)
	if err != nil {
		exe.Close()
		logs.Close()
		l.Close()
		return nil, err
	}
	groups := []*os.File{procs}
	spawner := confine.NewSpawner(exe, confine.Config{NoFile: noFile(), NProc: nproc(cfg.PidsMax)}, groups,
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
	return &Inside{Config: cfg, Listener: l, Logs: logs, Spawner: spawner, Usage: usage, Reconnect: l.Reconnect}, nil
}

// guestProcsGroup makes, in the runtime's own cgroup file system, the
// group the sandbox's processes are born in, its pids limited to max
// (none when zero), and returns its cgroup.procs file, which the
// spawner's forking thread writes itself to (gVisor's kernel then moves
// the whole spawner, as cgroup.procs does), and a reader of what the
// runtime's kernel counts in it. The sandbox's processes are the runtime kernel's,
// which the host's groups (holding the runtime's threads and its memory)
// do not tell apart from the runtime's own. The hierarchy is mounted
// nowhere the sandbox could see it.
func guestProcsGroup(max int64) (*os.File, func() (handoff.GuestUsage, error), error) {
	fs, err := unix.Fsopen("cgroup2", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: the runtime's cgroups: fsopen: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return nil, nil, fmt.Errorf("sandbox: the runtime's cgroups: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: the runtime's cgroups: fsmount: %w", err)
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
	if err := write("cgroup.subtree_control", "+pids +memory"); err != nil {
		return nil, nil, fmt.Errorf("sandbox: the runtime's pids and memory controllers: %w", err)
	}
	const group = "kiln-procs"
	if err := unix.Mkdirat(m, group, 0o755); err != nil && err != unix.EEXIST {
		return nil, nil, fmt.Errorf("sandbox: the runtime's cgroup for the processes: %w", err)
	}
	if max > 0 {
		if err := write(group+"/pids.max", strconv.FormatInt(max, 10)); err != nil {
			return nil, nil, fmt.Errorf("sandbox: the runtime's pids limit: %w", err)
		}
	}
	dirfd, err := unix.Openat(m, group, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: the runtime's cgroup for the processes: %w", err)
	}
	dir := os.NewFile(uintptr(dirfd), group)
	fd, err := unix.Openat(dirfd, "cgroup.procs", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		dir.Close()
		return nil, nil, fmt.Errorf("sandbox: the runtime's cgroup for the processes: %w", err)
	}
	// The directory stays open for the agent's life: its files are read
	// through it, the hierarchy being mounted nowhere.
	usage := func() (handoff.GuestUsage, error) {
		var u handoff.GuestUsage
		for _, f := range []struct {
			name string
			v    *int64
		}{{"pids.current", &u.Pids}, {"memory.current", &u.MemoryBytes}} {
			n, err := readAt(dir, f.name)
			if err != nil {
				return handoff.GuestUsage{}, err
			}
			*f.v = n
		}
		return u, nil
	}
	return os.NewFile(uintptr(fd), "procs cgroup.procs"), usage, nil
}

// readAt reads the number in the file name of the directory dir.
func readAt(dir *os.File, name string) (int64, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("sandbox: %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	b := make([]byte, 64)
	n, err := f.Read(b)
	if err != nil {
		return 0, fmt.Errorf("sandbox: %s: %w", name, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b[:n])), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sandbox: %s: %w", name, err)
	}
	return v, nil
}
