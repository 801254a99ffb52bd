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
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/rootfs"
	"golang.org/x/sys/unix"
)

// GVisor is the backend of sandboxes inside gVisor: runsc, as an OCI
// runtime, runs kilnd's binary as the container's init, the same agent
// as on the host, on gVisor's own kernel (the sentry), which answers the
// sandbox's system calls itself and reaches the host's kernel through a
// small filtered set. It costs a slower start (a new kernel per sandbox),
// slower system calls and more memory; the host's kernel is much further
// away.
type GVisor struct {
	// Exe is kilnd's binary, bound read-only into the container for its
	// init to run.
	Exe string
	// Runsc is the runsc binary; Root is its state directory.
	Runsc string
	Root  string
	// Platform is how the sentry intercepts system calls (default
	// "systrap", gVisor's own; "ptrace" also works on any host).
	Platform string
	// Ranges hands out the sandboxes' uid ranges, shared with the other
	// backends.
	Ranges *IDRanges
	// Instance is kilnd's instance (Options.Instance).
	Instance string
	// Binds is the directory of kilnd's where the caller's directories
	// (Options.Mounts) are mounted for runsc's file server, a directory
	// for each sandbox (bindsOf). Nothing there is ever removed but by
	// rmdir, once unmounted: a mount left there by an end cut short
	// keeps what it holds.
	Binds string

	// verMu guards ver, runsc's version as of the binary verOf (its
	// inode, size and time): a checkpoint records it, and asking runsc
	// costs a process as big as runsc.
	verMu      sync.Mutex
	ver, verOf string
	// channels are its sandboxes' channels to their agents.
	channels channels
}

// bindsOf is where sandbox id's directories are mounted on the host.
func (g *GVisor) bindsOf(id string) string { return filepath.Join(g.Binds, id) }

// The room a gVisor sandbox's limits leave for runsc, its kernel and its
// file server, which the host counts with the sandbox's processes: an
// idle one holds about 33 MiB and a few dozen threads.
const (
	gvisorThreads = 256
	gvisorMemory  = 128 << 20
)

// runscTimeout bounds runsc's own commands (kill, delete, version).
const runscTimeout = 20 * time.Second

// Name implements Backend.
func (g *GVisor) Name() string { return RuntimeGVisor }

// Check says why this host cannot run gVisor sandboxes, if it cannot.
func (g *GVisor) Check() error {
	if g.Runsc == "" {
		return errors.New("no runsc binary (install gVisor's runsc, or give kilnd --runsc)")
	}
	v, err := g.version()
	if err != nil {
		return err
	}
	if date, ok := runscDate(v); ok && date < minRunscDate {
		return fmt.Errorf("%s is %s, older than gVisor's releases of 2023, whose kernel keeps a process's parent on CLONE_PARENT "+
			"and answers statx (ls fails in an older one); install a newer runsc, e.g. go install gvisor.dev/gvisor/runsc@%s", g.Runsc, v, RunscModuleVersion)
	}
	return nil
}

// RunscModuleVersion is the version of gVisor's Go module (its go branch)
// whose runsc kilnd is tested with.
const RunscModuleVersion = "v0.0.0-20260905035102-160fafc42237"

// minRunscDate is the oldest runsc build date kilnd runs sandboxes on.
const minRunscDate = "20230101"

// runscDate finds the build date in a runsc version: Debian's
// "0.0~20221219.0", a release's "release-20240513.0". A runsc built from
// the Go module has none.
func runscDate(v string) (string, bool) {
	for i := 0; i+8 <= len(v); i++ {
		d := v[i : i+8]
		if strings.Trim(d, "0123456789") == "" && (d[:2] == "19" || d[:2] == "20") && (i == 0 || v[i-1] < '0' || v[i-1] > '9') {
			return d, true
		}
	}
	return "", false
}

// version is the first line of runsc --version: "runsc version X".
func (g *GVisor) version() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), runscTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, g.Runsc, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %v: %s", g.Runsc, err, strings.TrimSpace(string(out)))
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(strings.TrimPrefix(line, "runsc version ")), nil
}

// cachedVersion is version, asked again only when the binary changed.
func (g *GVisor) cachedVersion() (string, error) {
	fi, err := os.Stat(g.Runsc)
	if err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	of := fmt.Sprint(st.Dev, st.Ino, fi.Size(), fi.ModTime().UnixNano())
	g.verMu.Lock()
	defer g.verMu.Unlock()
	if g.verOf != of {
		v, err := g.version()
		if err != nil {
			return "", err
		}
		g.ver, g.verOf = v, of
	}
	return g.ver, nil
}

// Version is runsc's version.
func (g *GVisor) Version() string {
	v, _ := g.version()
	return v
}

// guestSandbox is a gVisor sandbox: its PID is the `runsc run` that
// holds the container, in kilnd's cgroups for it with everything it
// starts (the sentry, the gofer, the sandbox's processes inside).
type guestSandbox struct {
	Sandbox
	// Container is runsc's name of the container, in runsc's Root.
	Container string `json:"container"`
	Root      string `json:"runsc_root"`
	// DiskMount is the host mount of the sandbox's disk, if it has one;
	// ImageMount that of its image, id-mapped, and RootMount the overlay
	// on it that is the container's root.
	DiskMount  string `json:"disk_mount,omitempty"`
	ImageMount string `json:"image_mount,omitempty"`
	RootMount  string `json:"root_mount,omitempty"`
	// LayerMounts are those of its image's other layers, below
	// ImageMount's.
	LayerMounts []string `json:"layer_mounts,omitempty"`
	// NetNS is the bind mount of its network namespace, when it has a
	// network beyond its loopback: runsc's sandbox runs in it, its netstack
	// on the namespace's link.
	NetNS string `json:"netns,omitempty"`
	// BindMounts are the host mounts of the caller's directories, in
	// the order of the sandbox's mounts.
	BindMounts []string `json:"bind_mounts,omitempty"`
	// SharedRange says its uid range is shared with the sandbox it was
	// restored from (see IDRanges.Share).
	SharedRange bool `json:"shared_range,omitempty"`
	// AgentDials says its agent connects to kilnd (see channel); an agent
	// started by a kilnd before that listens on Socket instead, and is
	// dialled there, as it was.
	AgentDials bool `json:"agent_dials,omitempty"`

	g *GVisor
	// paused says this kilnd paused the sandbox (or took it back paused)
	// and has not resumed it: its agent does not answer meanwhile.
	paused atomic.Bool
	// viaRunsc counts the pauses and resumes runsc made, kilnd's own
	// way to the sandbox's kernel not taken (gvisor_pause.go).
	viaRunsc atomic.Int32
	// ch is where the agent connects to kilnd: made before runsc starts,
	// or as the sandbox is adopted; set before the sandbox is shared.
	ch *channel
}

// Socket is kilnd's socket the agent connects to, in the directory runsc
// passes through to the host's.
func (s *guestSandbox) Socket() string { return filepath.Join(s.Dir, handoff.GuestSock, SocketName) }

// Dial implements Instance: the next connection the agent made.
func (s *guestSandbox) Dial(ctx context.Context) (net.Conn, error) {
	if !s.AgentDials {
		return dialSocket(ctx, s.Socket())
	}
	if s.ch == nil {
		return nil, errors.New("sandbox: no channel to the agent")
	}
	return s.ch.dial(ctx, s.Alive)
}

// State implements Instance.
func (s *guestSandbox) State() json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// runsc runs one of runsc's commands on the container, bounded.
func (s *guestSandbox) runsc(args ...string) error {
	_, err := s.runscOutput(args...)
	return err
}

// runscOutput runs one of runsc's commands on the container, bounded,
// and returns what it wrote to its standard output.
func (s *guestSandbox) runscOutput(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), runscTimeout)
	defer cancel()
	all := append([]string{"--root", s.Root}, args...)
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, s.g.Runsc, all...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("runsc %s: %v: %s", args[0], err, strings.TrimSpace(stderr.String()+string(out)))
	}
	return out, nil
}

// End implements Instance: whatever is left of the container goes, with
// runsc's record of it and the host mount of its disk.
func (s *guestSandbox) End() {
	s.Sandbox.End()
	s.forget()
}

// forget removes runsc's state of the container (it is gone) and the
// host mount of the sandbox's disk.
func (s *guestSandbox) forget() error {
	var errs []error
	if s.ch != nil {
		s.ch.close()
	}
	if _, err := os.Stat(filepath.Join(s.Root, s.Container)); err == nil {
		if err := s.runsc("delete", "--force", s.Container); err != nil {
			errs = append(errs, err)
		}
	}
	for _, m := range append([]string{s.RootMount, s.ImageMount}, append(s.LayerMounts, s.DiskMount, s.NetNS)...) {
		if m == "" {
			continue
		}
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("sandbox: unmount %s: %w", m, err))
		}
	}
	if err := unbind(s.BindMounts); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// unbind unmounts the caller's directories mounted at points, and removes
// the points and their directory, by rmdir alone: a point still mounted
// is refused (EBUSY), never emptied.
func unbind(points []string) error {
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("sandbox: unmount %s: %w", p, err))
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("sandbox: %w", err))
		}
	}
	if len(points) > 0 {
		if err := os.Remove(filepath.Dir(points[0])); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("sandbox: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Halt implements Instance: the agent's own shutdown first, runsc
// passing the signal to the container's init, then whatever is left of
// the runtime is killed with the cgroup. (Its processes cannot be killed
// apart from it, as a namespace sandbox's are: they live in gVisor's
// kernel, in runsc's host processes.)
func (s *guestSandbox) Halt() error {
	s.thaw()
	s.await(stopTimeout, func(int) error { return s.runsc("kill", s.Container, "TERM") })
	return s.killAll()
}

// Destroy implements Instance.
func (s *guestSandbox) Destroy(keepLogs bool) error {
	// The agent's own shutdown first, so captured runs end with their
	// end records: runsc passes the signal to the container's init, which
	// must run to take it.
	s.thaw()
	s.await(stopTimeout, func(int) error { return s.runsc("kill", s.Container, "TERM") })
	return s.remove(keepLogs, s.forget)
}

// Release, as kilnd stops, unmounts what runsc shares between its
// containers under Root: the bind mount of the empty network namespace
// their file servers join, which holds Root busy. Containers that run keep
// theirs, and the next runsc run makes it again. It also stops listening
// for the agents of the sandboxes that run on: each makes its
// connections again to the next kilnd, which listens as it adopts them.
func (g *GVisor) Release() {
	for unix.Unmount(filepath.Join(g.Root, "null-netns"), unix.MNT_DETACH) == nil {
	}
	g.channels.closeAll()
}

// Adopt implements Backend.
func (g *GVisor) Adopt(state json.RawMessage) (Instance, error) {
	// Every gVisor sandbox ends as a whole out of memory, those recorded
	// before the record said so too.
	sb := &guestSandbox{Sandbox: Sandbox{EndOnOOM: true}, g: g}
	if err := json.Unmarshal(state, sb); err != nil {
		return nil, fmt.Errorf("sandbox: state: %w", err)
	}
	if sb.ID == "" || sb.Dir == "" || sb.Container == "" || sb.Root == "" {
		return nil, errors.New("sandbox: gVisor state without an id, a directory or a container")
	}
	hold := g.Ranges.Hold
	if sb.SharedRange {
		hold = g.Ranges.Share
	}
	if err := hold(sb.UIDBase, sb.ID); err != nil {
		return nil, err
	}
	if sb.AgentDials {
		ch, err := g.channels.listen(sb.Socket())
		if err != nil {
			g.Ranges.Release(sb.UIDBase, sb.ID)
			return nil, err
		}
		sb.ch = ch
	}
	sb.ranges = g.Ranges
	sb.adopted()
	return sb, nil
}

// EndLeftover implements Backend: the cgroups, as for a namespace
// sandbox, then runsc's record of the container and the host mount of its
// disk.
func (g *GVisor) EndLeftover(id, dir string) error {
	err := endLeftover(g.Instance, id)
	sb := &guestSandbox{Container: "kiln-" + id, Root: g.Root, DiskMount: filepath.Join(dir, diskName), ImageMount: filepath.Join(dir, lowerName(0)),
		RootMount: filepath.Join(dir, rootName), NetNS: filepath.Join(dir, netnsName), g: g}
	sb.LayerMounts, _ = filepath.Glob(filepath.Join(dir, lowerName(0)+".*"))
	if g.Binds != "" {
		sb.BindMounts, _ = filepath.Glob(filepath.Join(g.bindsOf(id), "*"))
	}
	return errors.Join(err, sb.forget())
}

// guestAgentName is the name of kilnd's binary in handoff.GuestDir, which the
// container's processes list as PID 1's command.
const guestAgentName = "kiln-agent"

// allCaps names every capability runsc knows: the agent's, inside
// gVisor's kernel only; its spawner keeps Docker's default set for the
// sandbox's processes.
var allCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
	"CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN",
	"CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
	"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP",
}

// spec is the OCI runtime spec of a gVisor sandbox: the agent as init;
// the given image as the root (root, an overlay on it) or, without
// one, the host's system directories read-only with the sandbox's own
// /etc files, as on the host backend; the workspace; the agent's handles
// in handoff.GuestDir.
func (g *GVisor) spec(o Options, workspace, root, netns string, binds []string) (*specs.Spec, error) {
	cfg := handoff.AgentConfig{
		ID: o.ID, Hostname: o.Hostname, Env: o.Env, Init: o.Init, Guest: RuntimeGVisor, UIDBase: o.UIDBase,
		Dir: o.Workdir, Entrypoint: o.Entrypoint, Cmd: o.Cmd, User: o.User,
		CaptureQueue: o.CaptureQueue, CaptureMaxSize: o.CaptureMaxSize, CaptureMaxFiles: o.CaptureMaxFiles,
		FlowGrace: o.FlowGrace, PidsMax: o.Limits.Pids,
	}
	if o.Disk != nil {
		// Mounted by the host, not by the agent: it says the sandbox's
		// /workspace is on a disk of its own, whose use the agent reports
		// (gVisor's file server answers statfs with the host's figures).
		cfg.Disk = "/workspace"
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	tmpfs := func(dest, mode string, owned bool) specs.Mount {
		opts := []string{"nosuid", "nodev", "mode=" + mode}
		if owned {
			opts = append(opts, fmt.Sprintf("uid=%d", o.UIDBase), fmt.Sprintf("gid=%d", o.UIDBase))
		}
		if o.Limits.MemoryBytes > 0 {
			opts = append(opts, fmt.Sprintf("size=%d", o.Limits.MemoryBytes))
		}
		return specs.Mount{Destination: dest, Type: "tmpfs", Source: "tmpfs", Options: opts}
	}
	bind := func(src, dest string, ro bool) specs.Mount {
		opts := []string{"rbind", "nosuid", "nodev"}
		if ro {
			opts = append(opts, "ro")
		}
		return specs.Mount{Destination: dest, Type: "bind", Source: src, Options: opts}
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "nodev", "noexec"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "noexec", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"ro", "nosuid", "nodev", "noexec"}},
		tmpfs("/tmp", "1777", false),
		tmpfs("/root", "0700", true),
		bind(workspace, "/workspace", false),
		bind(g.Exe, filepath.Join(handoff.GuestDir, guestAgentName), true),
		bind(filepath.Join(o.Dir, LogsName), filepath.Join(handoff.GuestDir, handoff.GuestLogs), false),
		bind(filepath.Join(o.Dir, handoff.GuestSock), filepath.Join(handoff.GuestDir, handoff.GuestSock), false),
	}
	r := &specs.Root{Path: root}
	if root == "" {
		r = &specs.Root{Path: filepath.Join(o.Dir, rootName), Readonly: true}
		binds, err := hostRoot(r.Path, filepath.Join(o.Dir, "etc"), o.Hostname, o.Resolvers, o.Restart != nil)
		if err != nil {
			return nil, err
		}
		for _, b := range binds {
			mounts = append(mounts, bind(b[0], b[1], true))
		}
	}
	// The caller's directories, after the sandbox's own mounts (one may
	// be below /workspace), each from its host mount (binds).
	for i, m := range o.Mounts {
		mounts = append(mounts, bind(binds[i], m.Target, m.ReadOnly))
	}
	caps := slices.Clone(allCaps)
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: []string{filepath.Join(handoff.GuestDir, guestAgentName)},
			Env:  []string{handoff.AgentEnv + "=" + string(raw)},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}},
		},
		Root:     r,
		Hostname: o.Hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace, Path: netns}},
		},
	}, nil
}

// hostRoot makes, in the empty directory root, the mount points of a root
// built from the host's system directories, and in etc the sandbox's own
// /etc files; it returns the binds (host path, path inside) that fill
// it. again (a sandbox started again) finds them made by its earlier
// start, and makes what is missing, the /etc files afresh.
func hostRoot(root, etc, hostname string, resolvers []string, again bool) ([][2]string, error) {
	if _, err := mkdir(root, 0o755, again); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	var binds [][2]string
	err := rootfs.EachHostDir(root, func(host, target string) error {
		binds = append(binds, [2]string{host, host})
		_, err := mkdir(target, 0o755, again)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"tmp", "workspace", "dev", "proc", "sys", "root", handoff.GuestDir[1:]} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{handoff.GuestLogs, handoff.GuestSock} {
		if _, err := mkdir(filepath.Join(root, handoff.GuestDir, d), 0o700, again); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(root, handoff.GuestDir, guestAgentName), nil, 0o500); err != nil {
		return nil, err
	}
	if _, err := mkdir(etc, 0o755, again); err != nil {
		return nil, err
	}
	for _, f := range rootfs.EtcFiles(hostname, resolvers) {
		if fi, err := os.Lstat(filepath.Join("/etc", f[0])); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		file := filepath.Join(etc, f[0])
		if err := os.WriteFile(file, []byte(f[1]), 0o644); err != nil {
			return nil, err
		}
		binds = append(binds, [2]string{file, "/etc/" + f[0]})
	}
	return binds, nil
}

// joinEnv makes kilnd's binary join cgroups and execute a program (see
// IsJoin): how runsc starts inside a gVisor sandbox's groups.
const joinEnv = "KILN_JOIN"

// joinRequest is joinEnv's value, as JSON.
type joinRequest struct {
	// Groups are v1 cgroup directories to join.
	Groups []string `json:"groups"`
	Path   string   `json:"path"`
	Args   []string `json:"args"`
}

// IsJoin reports whether kilnd's binary was started to join a gVisor
// sandbox's cgroups and execute runsc there (JoinAndExec).
func IsJoin() bool { return os.Getenv(joinEnv) != "" }

// JoinAndExec serves joinEnv: it moves this process into the groups, then
// executes the program in its place, with the rest of the environment. It
// never returns.
func JoinAndExec() {
	var req joinRequest
	err := json.Unmarshal([]byte(os.Getenv(joinEnv)), &req)
	os.Unsetenv(joinEnv)
	for _, dir := range req.Groups {
		if err != nil {
			break
		}
		err = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("0"), 0)
	}
	if err == nil {
		err = syscall.Exec(req.Path, req.Args, os.Environ())
	}
	fmt.Fprintln(os.Stderr, "kiln: start runsc in the sandbox's cgroups:", err)
	os.Exit(1)
}

// joinDirs are the v1 groups a whole runtime joins: the limited ones.
func (c *Cgroups) joinDirs() []string {
	var dirs []string
	for ctrl, dir := range c.V1 {
		if p := c.procsDir(ctrl); p != "" {
			dir = p
		}
		dirs = append(dirs, dir)
	}
	return dirs
}

// netnsName is a gVisor sandbox's network namespace's bind mount in its
// directory.
const netnsName = "netns"

// newNetns makes a network namespace and binds it at path, a file it
// makes, which keeps it until it is unmounted. It is made on a thread of
// its own, brought back to kilnd's namespace after.
func newNetns(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("a network namespace: %w", err)
			return
		}
		err = unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, "")
		// Back, or the thread is not fit for others: it then ends with
		// this goroutine, still locked.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		if err != nil {
			err = fmt.Errorf("bind its network namespace: %w", err)
		}
		errc <- err
	}()
	return <-errc
}
