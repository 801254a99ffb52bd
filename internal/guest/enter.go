package guest

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/guest/confine"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/rootfs"
)

// setupRoot builds the sandbox's filesystem and moves the agent into it:
// a tmpfs root with the host's system directories (or the given rootfs
// under a writable overlay) read-only, private /tmp, writable /workspace,
// a minimal /dev, its own /proc, the caller's directories; then pivot_root, and the old root
// detached so nothing of the host stays reachable.
func setupRoot(cfg handoff.AgentConfig, userns *os.File) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if cfg.Disk != "" {
		// Here only: the host never sees it, and it ends with the sandbox.
		if err := unix.MoveMount(handoff.FDDisk, "", unix.AT_FDCWD, cfg.Disk, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mount the sandbox's disk: %w", err)
		}
		unix.Close(handoff.FDDisk)
	}
	var err error
	if cfg.Rootfs != "" {
		err = imageRoot(cfg, userns)
	} else {
		err = hostRoot(cfg)
	}
	if err == nil {
		err = mountInRoot(cfg)
	}
	if err == nil {
		err = bindMounts(cfg.Root, cfg.Mounts, cfg.UIDBase)
	}
	if err == nil {
		err = pivot(cfg.Root)
	}
	if err != nil {
		return err
	}
	// The host-bind root holds only mount points: read-only. A given
	// rootfs stays writable through its overlay.
	if cfg.Rootfs == "" {
		if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("make the root read-only: %w", err)
		}
	}
	return nil
}

// imageRoot mounts, at cfg.Root, the overlay of a root file system's
// layers and its writable layer. Each layer, its owners mapped into the
// sandbox's range by its user namespace (the image's root's files are
// the sandbox's root's), becomes one of the overlay's lower layers.
func imageRoot(cfg handoff.AgentConfig, userns *os.File) error {
	if userns == nil {
		return errors.New("no user namespace to map the rootfs with")
	}
	for i, lower := range cfg.Lowers {
		fd, err := rootfs.IDMapTree(cfg.Layers[i], int(userns.Fd()))
		if err == nil {
			err = unix.MoveMount(fd, "", unix.AT_FDCWD, lower, unix.MOVE_MOUNT_F_EMPTY_PATH)
			unix.Close(fd)
		}
		if err != nil {
			return fmt.Errorf("mount the rootfs: %w", err)
		}
	}
	// Paths relative to the sandbox's directory: the overlay's options,
	// in the sandbox's mount table, name no host path.
	base := filepath.Dir(cfg.Lowers[0])
	rel := func(p string) (string, error) {
		r, err := filepath.Rel(base, p)
		if err != nil || strings.HasPrefix(r, "..") || strings.ContainsAny(r, ",:") {
			return "", fmt.Errorf("overlay layer %s is not in %s", p, base)
		}
		return r, nil
	}
	var lowers []string
	for _, p := range cfg.Lowers {
		r, err := rel(p)
		if err != nil {
			return err
		}
		lowers = append(lowers, r)
	}
	upper, err := rel(cfg.Upper)
	if err != nil {
		return err
	}
	work, err := rel(cfg.Work)
	if err != nil {
		return err
	}
	if err := unix.Chdir(base); err != nil {
		return err
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lowers, ":"), upper, work)
	if err := unix.Mount("overlay", cfg.Root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount the rootfs overlay: %w", err)
	}
	if cfg.Network {
		return rootfs.ImageResolvConf(cfg.Root, cfg.Resolvers, cfg.UIDBase)
	}
	return nil
}

// hostRoot mounts, at cfg.Root, a small tmpfs with the host's system
// directories bound read-only and the sandbox's own /etc files.
func hostRoot(cfg handoff.AgentConfig) error {
	if err := unix.Mount("tmpfs", cfg.Root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=16m"); err != nil {
		return fmt.Errorf("mount the root: %w", err)
	}
	if err := rootfs.EachHostDir(cfg.Root, bindReadOnly); err != nil {
		return err
	}
	return ownEtc(cfg.Root, cfg.Hostname, cfg.Resolvers)
}

// mountInRoot mounts what every sandbox's root has of its own: /tmp and
// /root in memory (within its memory limit), the workspace, a minimal
// /dev and its /proc.
func mountInRoot(cfg handoff.AgentConfig) error {
	root := cfg.Root
	for _, d := range []string{"tmp", "workspace", "dev", "proc", "root", ".old"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	size := ""
	if cfg.TmpfsBytes > 0 {
		size = fmt.Sprintf(",size=%d", cfg.TmpfsBytes)
	}
	if err := unix.Mount("tmpfs", filepath.Join(root, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"+size); err != nil {
		return fmt.Errorf("mount /tmp: %w", err)
	}
	if err := unix.Mount(cfg.Workspace, filepath.Join(root, "workspace"), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mount /workspace: %w", err)
	}
	// A bind takes no flags: no setuid file and no device node in the
	// workspace works, there or below it.
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(unix.AT_FDCWD, filepath.Join(root, "workspace"), unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("make /workspace nosuid, nodev: %w", err)
	}
	if err := unix.Mount("tmpfs", filepath.Join(root, "root"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV,
		fmt.Sprintf("mode=0700,uid=%d,gid=%d", cfg.UIDBase, cfg.UIDBase)+size); err != nil {
		return fmt.Errorf("mount /root: %w", err)
	}
	if err := setupDev(filepath.Join(root, "dev")); err != nil {
		return err
	}
	// In a new pid namespace, this proc shows the sandbox's processes only.
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	return maskProc(filepath.Join(root, "proc"))
}

// pivot makes root the agent's root, and detaches the host's.
func pivot(root string) error {
	if err := unix.PivotRoot(root, filepath.Join(root, ".old")); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.old", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	return os.Remove("/.old")
}

// What of /proc a sandbox does not see, and what it cannot write: OCI's
// default masked and read-only paths (as Docker applies them), and, beyond
// them, the kernel's build configuration and command line, which tell an
// exploit what it runs on and where the host boots from.
var (
	maskedProc = []string{"acpi", "asound", "cmdline", "config.gz", "interrupts", "kcore", "keys", "latency_stats",
		"sched_debug", "scsi", "timer_list", "timer_stats"}
	readOnlyProc = []string{"bus", "fs", "irq", "sys", "sysrq-trigger"}
)

// maskProc hides the masked paths of the proc mounted at proc (a file
// reads as empty, a directory as an empty read-only one) and makes the
// read-only ones so. A sandboxed process, in a user namespace that does
// not own the mounts, cannot take either away.
func maskProc(proc string) error {
	sealed := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	for _, name := range maskedProc {
		p := filepath.Join(proc, name)
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // this kernel has none
		}
		if err != nil {
			return err
		}
		if fi.IsDir() {
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=0555")
		} else if err = unix.Mount("/dev/null", p, "", unix.MS_BIND, ""); err == nil {
			// Not nodev: it is /dev/null that reads as empty.
			null := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC}
			err = unix.MountSetattr(unix.AT_FDCWD, p, 0, &null)
		}
		if err != nil {
			return fmt.Errorf("mask /proc/%s: %w", name, err)
		}
	}
	for _, name := range readOnlyProc {
		p := filepath.Join(proc, name)
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind /proc/%s: %w", name, err)
		}
		if err := unix.MountSetattr(unix.AT_FDCWD, p, unix.AT_RECURSIVE, &sealed); err != nil {
			return fmt.Errorf("make /proc/%s read-only: %w", name, err)
		}
	}
	return nil
}

// ownEtc puts the sandbox's rootfs.EtcFiles over the host's, each read-only, where
// the host has a regular file of that name. Where it has a symbolic link
// (resolv.conf's often, to /run) to a directory the sandbox does not get
// from the host, the file is made where the link leads, in the sandbox's
// root.
func ownEtc(root, hostname string, resolvers []string) error {
	src := filepath.Join(root, ".etc")
	if err := os.Mkdir(src, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", src, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount the sandbox's /etc files: %w", err)
	}
	sealed := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC}
	for _, f := range rootfs.EtcFiles(hostname, resolvers) {
		target := filepath.Join(root, "etc", f[0])
		fi, err := os.Lstat(target)
		if err == nil && fi.Mode()&os.ModeSymlink != 0 {
			if err := rootfs.FillLink(root, target, f[1]); err != nil {
				return fmt.Errorf("/etc/%s: %w", f[0], err)
			}
			continue
		}
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		file := filepath.Join(src, f[0])
		if err := os.WriteFile(file, []byte(f[1]), 0o644); err != nil {
			return err
		}
		if err := unix.Mount(file, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mount /etc/%s: %w", f[0], err)
		}
		if err := unix.MountSetattr(unix.AT_FDCWD, target, 0, &sealed); err != nil {
			return fmt.Errorf("make /etc/%s read-only: %w", f[0], err)
		}
	}
	// The binds keep their files; the directory goes.
	if err := unix.Unmount(src, unix.MNT_DETACH); err != nil {
		return err
	}
	return os.Remove(src)
}

func bindReadOnly(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	// Read-only all the way down: a mount below src must not stay
	// writable.
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(unix.AT_FDCWD, dst, unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("make %s read-only: %w", src, err)
	}
	return nil
}

// setupDev makes a minimal /dev: the harmless devices bound from the
// host, a private devpts for terminals, shm, and the usual links.
func setupDev(dev string) error {
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		target := filepath.Join(dev, d)
		f, err := os.Create(target)
		if err != nil {
			return err
		}
		f.Close()
		if err := unix.Mount("/dev/"+d, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", d, err)
		}
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC}
		if err := unix.MountSetattr(unix.AT_FDCWD, target, 0, &attr); err != nil {
			return fmt.Errorf("make /dev/%s nosuid, noexec: %w", d, err)
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := unix.Mount("tmpfs", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size=64m"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	for link, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, link)); err != nil {
			return err
		}
	}
	return nil
}

// loopbackUp brings lo up: the sandbox's only network.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var req [unix.IFNAMSIZ + 24]byte
	copy(req[:], "lo")
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCGIFFLAGS, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
		return fmt.Errorf("read lo's flags: %w", errno)
	}
	flags := (*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ]))
	*flags |= unix.IFF_UP | unix.IFF_RUNNING
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
		return fmt.Errorf("bring lo up: %w", errno)
	}
	return nil
}

// isolate puts the sandbox's spawner, and so every process it starts, in
// the sandbox's user namespace, where root is the unprivileged host range
// from base: it has no capability over the agent, the mounts or the
// network, all owned by the parent namespace. setgroups is allowed there
// (su, sudo and package managers switch groups), and the spawner starts
// with none.
func isolate(base int) func(*syscall.SysProcAttr) {
	return func(a *syscall.SysProcAttr) {
		a.Cloneflags |= unix.CLONE_NEWUSER
		a.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: handoff.IDRange}}
		a.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: handoff.IDRange}}
		a.GidMappingsEnableSetgroups = true
		a.Credential = &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}}
	}
}

// nproc is a sandboxed process's RLIMIT_NPROC: the pids limit, a second
// line behind the pids cgroup, with room for the spawner's own threads,
// which the kernel counts too (zero: no limit).
func nproc(pids int64) uint64 {
	if pids <= 0 {
		return 0
	}
	return uint64(pids) + 32
}

// noFile is a sandboxed process's open files limit: 1024, and up to
// 524288 when it asks (Docker's since 25.0), within the agent's own.
func noFile() [2]uint64 {
	var l unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &l); err != nil {
		return [2]uint64{}
	}
	hard := min(l.Max, 524288)
	return [2]uint64{min(1024, hard), hard}
}

// openSelf opens this binary for the spawner, close-on-exec, on a
// descriptor no start moves a process's files onto.
func openSelf() (*os.File, error) {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("sandbox: open the agent's binary: %w", err)
	}
	defer f.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 100)
	if err != nil {
		return nil, fmt.Errorf("sandbox: open the agent's binary: %w", err)
	}
	return os.NewFile(uintptr(fd), "kilnd"), nil
}

var errNotAgent = errors.New("sandbox: not started as an agent")

// Inside is what a process that Enter made into a sandbox's agent holds:
// its configuration, the API listener, the capture directory, and the
// isolation to apply to every process it starts.
type Inside struct {
	Config   handoff.AgentConfig
	Listener net.Listener
	Logs     *capture.Dir
	// Spawner starts each of the sandbox's processes: in the sandbox's
	// user namespace, mapped to its range, confined, born in its limited
	// cgroups when it has limits.
	Spawner *confine.Spawner
	// OOMKills counts the kernel's out-of-memory kills in the sandbox's
	// memory group so far; nil without a memory limit.
	OOMKills func() int64
	// Usage reads what a runtime's own kernel counts of the sandbox's
	// processes (see handoff.GuestUsage); nil where the host's groups count them.
	Usage func() (handoff.GuestUsage, error)
	// Reconnect makes the agent's connections to kilnd again (see
	// handoff.ReconnectSignal); nil where kilnd connects to the agent.
	Reconnect func()
}

// IsAgent reports whether this process was started as a sandbox's agent.
func IsAgent() bool { return os.Getenv(handoff.AgentEnv) != "" }

// Enter turns this process, started by Create, into its sandbox's agent:
// it builds the sandbox's filesystem and moves into it, names the host,
// brings the loopback up, makes itself impossible to inspect from inside
// (no core dumps, no ptrace, no /proc/1/fd for the sandbox's root), and
// takes its inherited handles, which no child inherits.
func Enter() (*Inside, error) {
	cfg, err := agentConfig()
	if err != nil {
		return nil, err
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if cfg.Guest != "" {
		return enterGuest(cfg)
	}
	spawner, loader, err := startSpawner(cfg)
	if err != nil {
		return nil, err
	}
	if err := enterRoot(cfg, spawner); err != nil {
		return nil, err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return nil, fmt.Errorf("sandbox: hostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if cfg.Network {
		if err := awaitNetwork(os.NewFile(handoff.FDNetwork, "network")); err != nil {
			return nil, err
		}
	}
	in, err := takeHandles(cfg, spawner)
	if err != nil {
		return nil, err
	}
	if idle := cmp.Or(cfg.SpawnerIdle, handoff.DefaultSpawnerIdle); idle > 0 && !loader {
		spawner.StopWhenIdle(idle, cfg.MadeAhead)
	}
	if cfg.MadeAhead {
		// Made ahead, it has the time: its first process does not.
		if err := spawner.Warm(); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
	}
	return in, nil
}

// agentConfig reads the configuration kilnd handed this agent, and takes
// it out of the environment, which the sandbox's processes inherit.
func agentConfig() (handoff.AgentConfig, error) {
	var cfg handoff.AgentConfig
	raw := os.Getenv(handoff.AgentEnv)
	if raw == "" {
		return cfg, errNotAgent
	}
	os.Unsetenv(handoff.AgentEnv)
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return cfg, fmt.Errorf("sandbox: agent config: %w", err)
	}
	return cfg, nil
}

// startSpawner starts the sandbox's spawner, once no inherited descriptor
// can reach it and /proc is this pid namespace's, while the host's root is
// still this mount namespace's. loader reports that it must stay: none
// could start again once the root is the image's.
func startSpawner(cfg handoff.AgentConfig) (spawner *confine.Spawner, loader bool, err error) {
	// Nothing kilnd inherited without close-on-exec (from whatever
	// started it) may reach the sandbox's processes, nor the spawner.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return nil, false, fmt.Errorf("sandbox: close-on-exec for inherited descriptors: %w", err)
	}
	// The spawner is this binary, reached by a descriptor: it is not in
	// the sandbox's filesystem. It starts now, while the host's root is
	// this mount namespace's, and moves into the sandbox's root with the
	// agent. Its user namespace's maps are written through /proc, which
	// must be this pid namespace's first.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, false, fmt.Errorf("sandbox: make mounts private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, false, fmt.Errorf("sandbox: mount the sandbox's /proc: %w", err)
	}
	exe, err := openSelf()
	if err != nil {
		return nil, false, err
	}
	spawner = newSpawner(cfg, exe)
	// Started, and executed, before the root is built: a child forked
	// while it is holds copies of the agent's descriptors, and a fork
	// during pivot_root can keep the old root. It comes up meanwhile; the
	// first process started waits for it to be ready.
	if err := spawner.Begin(); err != nil {
		return nil, false, fmt.Errorf("sandbox: %w", err)
	}
	// A dynamically linked kilnd's loader opens its libraries after the
	// exec: in a sandbox with an image, which has none of them, that must
	// be done before the root is the image's.
	// Nor can a spawner start again there, once the root is the image's:
	// that one stays.
	loader = cfg.Rootfs != "" && rootfs.NeedsLoader(exe)
	if loader {
		if err := spawner.AwaitRunning(); err != nil {
			return nil, false, fmt.Errorf("sandbox: %w", err)
		}
	}
	return spawner, loader, nil
}

// enterRoot builds the sandbox's root filesystem and moves the agent into
// it (setupRoot). An image's layers are mapped by the spawner's user
// namespace, the sandbox's, held open only while the root is built.
func enterRoot(cfg handoff.AgentConfig, spawner *confine.Spawner) error {
	var userns *os.File
	if len(cfg.Layers) > 0 {
		var err error
		if userns, err = spawner.UserNamespace(); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		defer userns.Close()
	}
	if err := setupRoot(cfg, userns); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	return nil
}

// newSpawner makes the sandbox's spawner: this binary (exe), in the
// sandbox's user namespace and owned by its first uid, its forking
// thread in the groups whose files kilnd handed over (cfg says which).
func newSpawner(cfg handoff.AgentConfig, exe *os.File) *confine.Spawner {
	var groups []*os.File
	if cfg.PidsLimited {
		groups = append(groups, os.NewFile(handoff.FDTasks, "pids tasks"))
	}
	if cfg.MemoryLimited {
		groups = append(groups, os.NewFile(handoff.FDMemoryTasks, "memory tasks"))
	}
	if cfg.CPULimited {
		groups = append(groups, os.NewFile(handoff.FDCPUTasks, "cpu tasks"))
		go joinCPU(os.NewFile(handoff.FDCPUProcs, "cpu cgroup.procs"))
	}
	iso := isolate(cfg.UIDBase)
	// The spawner moves itself, every thread, into the v2 procs group
	// before it forks anything (the agent stays outside it): on a pure v2
	// host that group has the limits, and what it allocated to start is
	// charged outside them, so one the limits killed starts again in a
	// sandbox whose memory is full; on either host the sandbox's processes
	// are in a group of their own, which kilnd freezes and kills at once.
	if cfg.ProcsCgroup {
		groups = append(groups, os.NewFile(handoff.FDProcsCgroup, "procs cgroup.procs"))
	}
	// Then its forking thread alone moves on, into the threaded group with
	// the pids limit, where every process it starts is born: the limit
	// counts them and that one thread, not the spawner's others.
	if cfg.PidsThreads {
		groups = append(groups, os.NewFile(handoff.FDPidsThreads, "pids cgroup.threads"))
	}
	return confine.NewSpawner(exe, confine.Config{NoFile: noFile(), NProc: nproc(cfg.PidsMax)}, groups,
		func(cmd *exec.Cmd) error {
			iso(cmd.SysProcAttr)
			return startOwned(cmd, cfg.UIDBase) // its per-user counts the sandbox's alone
		})
}

// takeHandles takes what kilnd handed the agent: its API's listener, the
// capture directory, and the out-of-memory counter when there is one.
func takeHandles(cfg handoff.AgentConfig, spawner *confine.Spawner) (*Inside, error) {
	lf := os.NewFile(handoff.FDListener, "agent.sock")
	l, err := net.FileListener(lf) // a close-on-exec duplicate
	lf.Close()
	if err != nil {
		return nil, fmt.Errorf("sandbox: agent socket: %w", err)
	}
	logs, err := capture.NewDir(os.NewFile(handoff.FDLogs, "logs"))
	if err != nil {
		l.Close()
		return nil, err
	}
	in := &Inside{Config: cfg, Listener: l, Logs: logs, Spawner: spawner}
	if cfg.OOMEvents {
		f := os.NewFile(handoff.FDOOMEvents, "oom events")
		in.OOMKills = func() int64 {
			var b [512]byte
			n, _ := f.ReadAt(b[:], 0)
			return handoff.EventIn(b[:n], "oom_kill")
		}
	}
	return in, nil
}

// awaitNetwork waits until kilnd has connected the sandbox's network: a
// byte on f; its end without one is kilnd's failure (or end), and the
// sandbox's.
func awaitNetwork(f *os.File) error {
	defer f.Close()
	var b [1]byte
	if n, _ := f.Read(b[:]); n != 1 {
		return errors.New("sandbox: kilnd did not connect the sandbox's network")
	}
	return nil
}

// joinCPU moves the agent into the sandbox's v1 cpu group, whose
// cgroup.procs f is: it works for the sandbox's processes, on their share.
// The move waits for an RCU grace period, which nothing else waits for: a
// failure leaves the agent's own work outside the limit (its processes
// are in the group through the spawner) and is logged.
func joinCPU(f *os.File) {
	defer f.Close()
	if _, err := f.Write([]byte(strconv.Itoa(os.Getpid()))); err != nil {
		fmt.Fprintln(os.Stderr, "kiln agent: join the sandbox's cpu cgroup:", err)
	}
}
