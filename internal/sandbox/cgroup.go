package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/handoff"
)

// Limits bound a sandbox's resources; zero means no limit.
type Limits = api.Limits

const cgroupRoot = "/sys/fs/cgroup"

// Cgroups are a sandbox's control groups: a v2 group for its lifecycle
// (the agent is born into it; cgroup.kill ends everything in it) and, on a
// host whose controllers are on v1 hierarchies, one v1 group per limited
// controller. Every group nests under kilnd's own, so the host's
// accounting of kilnd keeps covering its sandboxes.
//
// On a pure v2 host (Leaves) the v2 group holds two leaves, as the v2 rule
// of no processes beside enabled controllers wants: "agent", where the
// agent is born, outside the memory and pids limits, and "procs", which
// holds them: the sandbox's spawner moves in before it forks anything, so
// every process it starts is born there (a gVisor sandbox's runsc is born
// there, by CLONE_INTO_CGROUP).
//
// On a hybrid host (ProcsLeaf) the v2 group, which has no controller
// there, holds the agent and a child, "procs", that the spawner moves into
// as it does on a pure v2 host: the sandbox's processes are apart from
// the agent in both layouts, and can be frozen and killed together while
// the agent goes on (KillProcs).
//
// The CPU limit holds the processes too, in procs (v2) or CPUProcs (v1);
// the group above has the limit and agentCPUs more, which the agent runs
// in. A workload at its limit is throttled, and its output and kilnd's
// calls are not: the agent relays and keeps that output on a core of its
// own, as a container's shim does outside the container's limits, and
// still within a bound.
type Cgroups struct {
	V2 string            `json:"v2"`
	V1 map[string]string `json:"v1,omitempty"` // controller → directory
	// Procs is the v1 pids group, below V1["pids"], that the sandbox's
	// processes are born in and whose limit they share. The agent stays
	// above it: a fork bomb that uses every pid cannot stop the agent from
	// making the thread it needs.
	Procs string `json:"procs,omitempty"`
	// MemoryProcs is the same for memory, below V1["memory"]: the limit
	// holds the processes, and the agent, outside it, is never the one the
	// out-of-memory killer picks.
	MemoryProcs string `json:"memory_procs,omitempty"`
	// CPUProcs is the same for the CPU limit, below V1["cpu"], whose own
	// limit is agentCPUs more.
	CPUProcs string `json:"cpu_procs,omitempty"`
	// Leaves says V2 has the agent and procs leaves (a pure v2 host).
	Leaves bool `json:"leaves,omitempty"`
	// ProcsLeaf says V2 holds the agent and a procs child (a hybrid
	// host; sandboxes made before it have neither).
	ProcsLeaf bool `json:"procs_leaf,omitempty"`
	// PidsLeaf says the procs leaf has a threaded child with the pids
	// limit (a pure v2 host; sandboxes made before it have the limit on
	// procs itself).
	PidsLeaf bool `json:"pids_leaf,omitempty"`
}

// The leaves of a sandbox's v2 group on a pure v2 host.
const (
	agentLeaf = "agent"
	procsLeaf = "procs"
	// pidsLeaf is procs's threaded child with the pids limit: v2 counts a
	// process's every thread in its process's group, unless the group is
	// threaded, where each thread is in a group of its own. The spawner
	// is in procs (its memory and CPU are the sandbox's), its forking
	// thread in pids, and so is every process it starts; the limit holds
	// them and that one thread, as v1's tasks files do.
	pidsLeaf = "pids"
)

// agentCPUs is the CPU, in cores, that a sandbox with a CPU limit has
// beyond it for its agent: enough for the agent to relay its output at
// the pace of one process writing at its limit.
const agentCPUs = 1

// spawnerTasks is what a sandbox's pids group holds of its spawner, which
// starts its processes there: its forking thread. The limit written is
// the sandbox's and this more, so that a limit of N lets the sandbox's
// own processes have N tasks.
const spawnerTasks = 1

// oldSpawnerTasks is the same for a sandbox made on a pure v2 host before
// its procs group had a threaded pids child: the whole spawner is in the
// limited group, and its threads (five at rest, a few more while system
// calls block) count.
const oldSpawnerTasks = 16

// cfsQuota is a CPU limit in cores as a quota of microseconds per
// period of cfsPeriod.
func cfsQuota(cpus float64) int64 { return int64(cpus * cfsPeriod) }

const cfsPeriod = 100000

// agentDir is the v2 group the agent is born in.
func (c *Cgroups) agentDir() string {
	if c.Leaves {
		return filepath.Join(c.V2, agentLeaf)
	}
	return c.V2
}

// procsDir2 is the v2 group the sandbox's processes are born in; empty
// for a sandbox made before they had one on a hybrid host, whose
// processes are in the agent's.
func (c *Cgroups) procsDir2() string {
	if c.Leaves || c.ProcsLeaf {
		return filepath.Join(c.V2, procsLeaf)
	}
	return ""
}

// pidsDir2 is the threaded v2 group with the pids limit, below procs, on
// a pure v2 host; empty without a pids limit or on other hosts.
func (c *Cgroups) pidsDir2() string {
	if c.PidsLeaf {
		return filepath.Join(c.V2, procsLeaf, pidsLeaf)
	}
	return ""
}

// procsDir is the group below V1[ctrl] (or, on a pure v2 host, below V2)
// that holds the processes, if any.
func (c *Cgroups) procsDir(ctrl string) string {
	if c.PidsLeaf && ctrl == "pids" {
		return c.pidsDir2()
	}
	if c.Leaves && (ctrl == "pids" || ctrl == "memory" || ctrl == "cpu") {
		return c.procsDir2()
	}
	switch ctrl {
	case "pids":
		return c.Procs
	case "memory":
		return c.MemoryProcs
	case "cpu":
		return c.CPUProcs
	}
	return ""
}

// ownCgroups reads /proc/self/cgroup: the v2 path and each v1
// controller's path.
func ownCgroups() (v2 string, v1 map[string]string, err error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	v1 = map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			v1[ctrl] = parts[2]
		}
	}
	return v2, v1, sc.Err()
}

// v2Mount is where the v2 hierarchy is mounted: the root on a pure v2
// host, "unified" on a hybrid one.
func v2Mount() (string, bool) {
	for _, p := range []string{cgroupRoot, filepath.Join(cgroupRoot, "unified")} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p, p == cgroupRoot
		}
	}
	return "", false
}

// newCgroups makes the groups of sandbox name with its limits: on a pure
// v2 host, one group with the agent's leaf and the limited procs leaf
// (limitPure); on a hybrid one, a v2 group for killing and freezing, and
// v1 groups with the limits (limitHybrid).
func newCgroups(name string, lim Limits) (*Cgroups, error) {
	own2, own1, err := ownCgroups()
	if err != nil {
		return nil, fmt.Errorf("sandbox: read own cgroups: %w", err)
	}
	mount, pure := v2Mount()
	if mount == "" {
		return nil, errors.New("sandbox: no cgroup v2 hierarchy is mounted (needed to kill a sandbox's every process at once)")
	}
	parent := filepath.Join(mount, own2)
	if pure {
		if parent, err = v2Parent(); err != nil {
			return nil, err
		}
	}
	cg := &Cgroups{V2: filepath.Join(parent, name), V1: map[string]string{}, Leaves: pure, ProcsLeaf: !pure}
	if err := os.Mkdir(cg.V2, 0o755); err != nil {
		return nil, fmt.Errorf("sandbox: make cgroup: %w", err)
	}
	if _, err = os.Stat(filepath.Join(cg.V2, "cgroup.kill")); err != nil {
		err = fmt.Errorf("sandbox: this kernel's cgroup v2 has no cgroup.kill: %w", err)
	} else if pure {
		err = cg.limitPure(lim)
	} else {
		err = cg.limitHybrid(lim, own1, name)
	}
	if err != nil {
		cg.Destroy()
		return nil, err
	}
	return cg, nil
}

// setCgroup writes value to a cgroup's file.
func setCgroup(dir, file, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("sandbox: set %s to %s: %w", file, value, err)
	}
	return nil
}

// limitPure makes, on a pure v2 host, the agent's leaf and the procs leaf
// below c.V2, and puts the limits on procs.
func (c *Cgroups) limitPure(lim Limits) error {
	for _, leaf := range []string{agentLeaf, procsLeaf} {
		if err := os.Mkdir(filepath.Join(c.V2, leaf), 0o755); err != nil {
			return fmt.Errorf("sandbox: make cgroup: %w", err)
		}
	}
	// The group holds no process itself: its leaves can have the
	// controllers, the limits on procs alone.
	controllers := "+memory +pids"
	if lim.CPUs > 0 {
		controllers += " +cpu"
	}
	if err := setCgroup(c.V2, "cgroup.subtree_control", controllers); err != nil {
		return err
	}
	procs := c.procsDir2()
	if lim.MemoryBytes > 0 {
		if err := setCgroup(procs, "memory.max", strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
			return err
		}
		// Without swap the limit is the limit (no such file without
		// swap accounting, where there is nothing to turn off).
		setCgroup(procs, "memory.swap.max", "0")
	}
	if lim.Pids > 0 {
		pids := filepath.Join(procs, pidsLeaf)
		if err := os.Mkdir(pids, 0o755); err != nil {
			return fmt.Errorf("sandbox: make cgroup: %w", err)
		}
		c.PidsLeaf = true
		if err := setCgroup(pids, "cgroup.type", "threaded"); err != nil {
			return err
		}
		if err := setCgroup(procs, "cgroup.subtree_control", "+pids"); err != nil {
			return err
		}
		if err := setCgroup(pids, "pids.max", strconv.FormatInt(lim.Pids+spawnerTasks, 10)); err != nil {
			return err
		}
	}
	if lim.CPUs > 0 {
		if err := setCgroup(c.V2, "cpu.max", fmt.Sprintf("%d %d", cfsQuota(lim.CPUs+agentCPUs), cfsPeriod)); err != nil {
			return err
		}
		if err := setCgroup(procs, "cpu.max", fmt.Sprintf("%d %d", cfsQuota(lim.CPUs), cfsPeriod)); err != nil {
			return err
		}
	}
	return nil
}

// limitHybrid makes, on a hybrid host, the v2 procs child and, for each
// limit, a v1 group of its controller below kilnd's own (own1), with a
// procs child holding the limit.
func (c *Cgroups) limitHybrid(lim Limits, own1 map[string]string, name string) error {
	if err := os.Mkdir(c.procsDir2(), 0o755); err != nil {
		return fmt.Errorf("sandbox: make cgroup: %w", err)
	}
	v1 := func(ctrl string) (string, error) {
		own, ok := own1[ctrl]
		if !ok {
			return "", fmt.Errorf("sandbox: no %s cgroup controller on this host", ctrl)
		}
		dir := filepath.Join(cgroupRoot, ctrl, own, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return "", fmt.Errorf("sandbox: make %s cgroup: %w", ctrl, err)
		}
		c.V1[ctrl] = dir
		return dir, nil
	}
	if lim.MemoryBytes > 0 {
		dir, err := v1("memory")
		if err != nil {
			return err
		}
		c.MemoryProcs = filepath.Join(dir, "procs")
		if err := os.Mkdir(c.MemoryProcs, 0o755); err != nil {
			return fmt.Errorf("sandbox: make memory cgroup: %w", err)
		}
		if err := setCgroup(c.MemoryProcs, "memory.limit_in_bytes", strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
			return err
		}
		// Without swap the limit is the limit.
		setCgroup(c.MemoryProcs, "memory.memsw.limit_in_bytes", strconv.FormatInt(lim.MemoryBytes, 10))
		setCgroup(c.MemoryProcs, "memory.swappiness", "0")
	}
	if lim.Pids > 0 {
		dir, err := v1("pids")
		if err != nil {
			return err
		}
		c.Procs = filepath.Join(dir, "procs")
		if err := os.Mkdir(c.Procs, 0o755); err != nil {
			return fmt.Errorf("sandbox: make pids cgroup: %w", err)
		}
		if err := setCgroup(c.Procs, "pids.max", strconv.FormatInt(lim.Pids+spawnerTasks, 10)); err != nil {
			return err
		}
	}
	if lim.CPUs > 0 {
		dir, err := v1("cpu")
		if err != nil {
			return err
		}
		c.CPUProcs = filepath.Join(dir, "procs")
		if err := os.Mkdir(c.CPUProcs, 0o755); err != nil {
			return fmt.Errorf("sandbox: make cpu cgroup: %w", err)
		}
		// The group's before its child's: a v1 child's quota may not
		// exceed its parent's.
		for _, q := range []struct {
			dir  string
			cpus float64
		}{{dir, lim.CPUs + agentCPUs}, {c.CPUProcs, lim.CPUs}} {
			if err := setCgroup(q.dir, "cpu.cfs_period_us", strconv.Itoa(cfsPeriod)); err != nil {
				return err
			}
			if err := setCgroup(q.dir, "cpu.cfs_quota_us", strconv.FormatInt(cfsQuota(q.cpus), 10)); err != nil {
				return err
			}
		}
	}
	return nil
}

// open returns the v2 group the agent is born in, for starting it there.
func (c *Cgroups) open() (*os.File, error) { return openDir(c.agentDir()) }

// openProcs returns the v2 group a gVisor sandbox's runtime is born in,
// the procs leaf, on a pure v2 host; nil on a hybrid one, where it is
// born in the agent's group (and its procs child stays empty).
func (c *Cgroups) openProcs() (*os.File, error) {
	if !c.Leaves {
		return nil, nil
	}
	return openDir(c.procsDir2())
}

func openDir(dir string) (*os.File, error) {
	return os.OpenFile(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// Populated reports whether any process is left in the sandbox.
func (c *Cgroups) Populated() bool {
	b, err := os.ReadFile(filepath.Join(c.V2, "cgroup.events"))
	if err != nil {
		return false
	}
	return strings.Contains(string(b), "populated 1")
}

// Kill ends every process in the sandbox and waits, bounded, until none
// is left.
func (c *Cgroups) Kill(timeout time.Duration) error {
	if _, err := os.Stat(c.V2); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	deadline := time.Now().Add(timeout)
	// Watched before the kill: the change it makes is not missed.
	w := watchEvents(c.V2)
	defer w.close()
	if err := os.WriteFile(filepath.Join(c.V2, "cgroup.kill"), []byte("1"), 0); err != nil {
		return fmt.Errorf("sandbox: kill cgroup: %w", err)
	}
	for c.Populated() {
		if !w.wait(deadline) {
			return fmt.Errorf("sandbox: processes left in %s after %v", c.V2, timeout)
		}
	}
	return nil
}

// eventsWatch tells of changes to a v2 group's cgroup.events, which the
// kernel reports as modifications (its populated and frozen lines).
type eventsWatch struct{ fd int }

// watchEvents watches dir's cgroup.events. A watch that cannot be made
// (fd -1) has wait poll every millisecond instead.
func watchEvents(dir string) eventsWatch {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return eventsWatch{-1}
	}
	if _, err := unix.InotifyAddWatch(fd, filepath.Join(dir, "cgroup.events"), unix.IN_MODIFY); err != nil {
		unix.Close(fd)
		return eventsWatch{-1}
	}
	return eventsWatch{fd}
}

// wait returns once cgroup.events may have changed (or at once, if it
// has since the last wait), false if deadline passed first. The caller
// reads the file again either way.
func (w eventsWatch) wait(deadline time.Time) bool {
	left := time.Until(deadline)
	if left <= 0 {
		return false
	}
	if w.fd < 0 {
		time.Sleep(min(left, time.Millisecond))
		return true
	}
	// A millisecond at least, so that a wait near the deadline ends with
	// one more look rather than a busy loop.
	ms := int(min(max(left, time.Millisecond), time.Second) / time.Millisecond)
	if _, err := unix.Poll([]unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}, ms); err != nil && !errors.Is(err, unix.EINTR) {
		time.Sleep(time.Millisecond)
	}
	var buf [4096]byte
	for {
		if _, err := unix.Read(w.fd, buf[:]); err != nil {
			break // drained (EAGAIN)
		}
	}
	return true
}

func (w eventsWatch) close() {
	if w.fd >= 0 {
		unix.Close(w.fd)
	}
}

// KillProcs ends every process of the sandbox's own, in the procs group,
// and leaves the agent running: the group is frozen, so that nothing in
// it forks or runs while it is killed (a fork bomb competes for neither
// the CPU nor the pids with what kills it), killed, and thawed, and then
// KillProcs waits, bounded, until the group is empty. A freeze that does
// not take within the bound is not waited for: cgroup.kill reaches a
// child forked meanwhile too. A sandbox with no procs group has nothing
// apart from its agent: KillProcs does nothing.
func (c *Cgroups) KillProcs(timeout time.Duration) error {
	dir := c.procsDir2()
	if dir == "" {
		return nil
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	deadline := time.Now().Add(timeout)
	write := func(file, value string) error {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
			return fmt.Errorf("sandbox: %s %s: %w", file, value, err)
		}
		return nil
	}
	w := watchEvents(dir)
	defer w.close()
	if err := write("cgroup.freeze", "1"); err != nil {
		return err
	}
	// Thawed whatever happens: the kill takes effect as the tasks run,
	// and a group left frozen would hold whatever the kill missed.
	defer write("cgroup.freeze", "0")
	for !c.event(dir, "frozen 1") && w.wait(deadline) {
	}
	if err := write("cgroup.kill", "1"); err != nil {
		return err
	}
	if err := write("cgroup.freeze", "0"); err != nil {
		return err
	}
	for c.event(dir, "populated 1") {
		if !w.wait(deadline) {
			return fmt.Errorf("sandbox: processes left in %s after %v", dir, timeout)
		}
	}
	return nil
}

// event reports whether the v2 group dir's cgroup.events has the line
// (key and value) line.
func (c *Cgroups) event(dir, line string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	return err == nil && strings.Contains(string(b), line)
}

// Destroy removes the groups. They must be empty.
func (c *Cgroups) Destroy() error {
	var errs []error
	for _, dir := range []string{c.Procs, c.MemoryProcs, c.CPUProcs, c.pidsDir2(), c.procsDir2()} {
		if dir == "" {
			continue
		}
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("sandbox: remove %s: %w", dir, err))
		}
	}
	for _, dir := range c.V1 {
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("sandbox: remove %s: %w", dir, err))
		}
	}
	if c.Leaves {
		if err := unix.Rmdir(c.agentDir()); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("sandbox: remove %s: %w", c.agentDir(), err))
		}
	}
	if err := unix.Rmdir(c.V2); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("sandbox: remove %s: %w", c.V2, err))
	}
	return errors.Join(errs...)
}

// OOMEvents opens the file that counts the kernel's out-of-memory kills in
// the sandbox's limited memory group (v1 memory.oom_control, v2
// memory.events); nil without a memory limit.
func (c *Cgroups) OOMEvents() (*os.File, error) {
	switch {
	case c.MemoryProcs != "":
		return os.Open(filepath.Join(c.MemoryProcs, "memory.oom_control"))
	case c.Leaves && memoryLimited(c.procsDir2()):
		return os.Open(filepath.Join(c.procsDir2(), "memory.events"))
	}
	return nil, nil
}

// OOMKills counts the kernel's out-of-memory kills in the sandbox's
// limited memory group so far (zero without one).
func (c *Cgroups) OOMKills() int64 {
	f, err := c.OOMEvents()
	if err != nil || f == nil {
		return 0
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	return handoff.EventIn(b, "oom_kill")
}

// memoryLimited reports whether the v2 group dir has a memory limit.
func memoryLimited(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "memory.max"))
	return err == nil && strings.TrimSpace(string(b)) != "max"
}

// ReadEvent reads a counter from a v1 or v2 events file (memory oom_kill,
// pids max), for reporting why a sandbox's process died.
func (c *Cgroups) ReadEvent(ctrl, file, key string) int64 {
	dir := c.V1[ctrl]
	if p := c.procsDir(ctrl); p != "" {
		dir = p
	}
	if dir == "" {
		dir = c.V2
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0
	}
	return handoff.EventIn(b, key)
}

// EndLeftover kills and removes the cgroups of a sandbox, name (see
// groupName), if a crash left them behind without a record: where they
// would be, below this process's own groups.
func EndLeftover(name string) error {
	own2, own1, err := ownCgroups()
	if err != nil {
		return err
	}
	mount, pure := v2Mount()
	if mount == "" {
		return nil
	}
	parent := filepath.Join(mount, own2)
	if pure {
		if parent, err = v2Parent(); err != nil {
			return err
		}
	}
	cg := &Cgroups{V2: filepath.Join(parent, name), V1: map[string]string{}, Leaves: pure}
	if _, err := os.Stat(cg.V2); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if _, err := os.Stat(filepath.Join(cg.V2, procsLeaf)); err == nil {
		cg.ProcsLeaf = !pure
	}
	for _, ctrl := range []string{"memory", "pids", "cpu"} {
		if own, ok := own1[ctrl]; ok {
			dir := filepath.Join(cgroupRoot, ctrl, own, name)
			if _, err := os.Stat(dir); err == nil {
				cg.V1[ctrl] = dir
				if _, err := os.Stat(filepath.Join(dir, "procs")); err == nil {
					switch ctrl {
					case "pids":
						cg.Procs = filepath.Join(dir, "procs")
					case "memory":
						cg.MemoryProcs = filepath.Join(dir, "procs")
					case "cpu":
						cg.CPUProcs = filepath.Join(dir, "procs")
					}
				}
			}
		}
	}
	return errors.Join(cg.Kill(10*time.Second), cg.Destroy())
}
