package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/pidfd/pidfdtest"
	"github.com/sandkiln/sandkiln/internal/roles"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

func TestMain(m *testing.M) {
	if os.Getenv(probeEnv) != "" {
		probeMain()
		os.Exit(0)
	}
	if os.Getenv(prepareEnv) != "" {
		prepareMain()
		os.Exit(0)
	}
	roles.PlayIfReexecuted()
	goleak.VerifyTestMain(m)
}

func newSandbox(t *testing.T, o sandbox.Options) *sandbox.Sandbox {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the namespace backend needs root")
	}
	o.ID = uuid.Must(uuid.NewV7()).String()
	o.Dir = filepath.Join(t.TempDir(), o.ID)
	o.Exe = os.Args[0]
	if o.Env == nil {
		o.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root", "LANG=C.UTF-8"}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sb, err := sandbox.Create(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(false); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	return sb
}

// run is a finite exec of sh -c script in the sandbox.
func run(t *testing.T, sb dialer, script string) api.ExecResult {
	t.Helper()
	body, _ := json.Marshal(api.ExecRequest{Command: "sh", Args: []string{"-c", script}})
	c := &http.Client{Transport: sandbox.Transport(sb.Dial)}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://agent/exec", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var res api.ExecResult
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &res) != nil {
		t.Fatalf("exec %q: status %d: %s", script, resp.StatusCode, b)
	}
	return res
}

func code(r api.ExecResult) int {
	if r.ExitCode == nil {
		return -1
	}
	return *r.ExitCode
}

func TestIsolation(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testIsolation)
}

func testIsolation(t *testing.T, runtime string) {
	sb := newBox(t, runtime, sandbox.Options{})
	cases := []struct {
		name, script string
		wantCode     int
		wantOut      string // a substring of stdout, when set
	}{
		{"root inside", "id -u", 0, "0"},
		{"own hostname", "hostname", 0, sandbox.DefaultHostname(sb.ID)},
		{"only its own processes", "ls /proc | grep -c '^[0-9]'", 0, ""},
		{"host /usr is read-only", "touch /usr/kiln-probe", 1, ""},
		{"host /etc is read-only", "touch /etc/kiln-probe", 1, ""},
		{"root is read-only", "touch /kiln-probe", 1, ""},
		{"workspace is writable", "echo hi > /workspace/f && cat /workspace/f", 0, "hi"},
		{"tmp is writable", "echo hi > /tmp/f && cat /tmp/f", 0, "hi"},
		{"nothing of the host's shadow", "wc -c < /etc/shadow", 0, "0"},
		{"the agent's descriptors are hidden", "ls /proc/1/fd", 2, ""},
		{"the agent's environment is hidden", "cat /proc/1/environ", 1, ""},
		{"no way back to the host's root", "ls /.old", 2, ""},
		{"loopback only", "grep -c ':' /proc/net/dev", 0, "1"},
		{"cannot mount", "mount -t tmpfs t /tmp", 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, sb, tc.script)
			if code(r) == 0 != (tc.wantCode == 0) || (tc.wantOut != "" && strings.TrimSpace(r.Stdout) != tc.wantOut) {
				t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d, stdout %q", tc.script, code(r), r.Stdout, r.Stderr, tc.wantCode, tc.wantOut)
			}
		})
	}
	// The sandbox's root is an unprivileged host user.
	fi, err := os.Stat(filepath.Join(sb.Dir, sandbox.WorkspaceName, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != sandbox.DefaultUIDBase {
		t.Errorf("a file the sandbox's root made belongs to host uid %d, want %d", st.Uid, sandbox.DefaultUIDBase)
	}
	// Few processes: the agent, the shell and ls/grep.
	if n := strings.TrimSpace(run(t, sb, "ls /proc | grep -c '^[0-9]'").Stdout); n > "5" || len(n) > 1 {
		t.Errorf("%s processes visible in the sandbox", n)
	}
}

// TestLimits: a fork bomb stops at the pids limit and memory over the
// limit is killed; the agent survives both and keeps serving.
func TestLimits(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.Options{Limits: sandbox.Limits{Pids: 64, MemoryBytes: 64 << 20}})
	forkBomb(t, sb)
	if got := sb.Cgroups.ReadEvent("pids", "pids.events", "max"); got == 0 {
		t.Errorf("the pids limit was never hit")
	}
	// The drain of the bomb's shell killed its group; what escaped into
	// other groups is killed with the sandbox. The agent still answers.
	mem := run(t, sb, `python3 -c "b = bytearray(256 << 20); print(len(b))"`)
	if mem.Signal != "KILL" && code(mem) == 0 || mem.Signal == "KILL" && !mem.OOMKilled {
		t.Errorf("256 MiB in a 64 MiB sandbox: exit %d, signal %q, oom_killed %v, stdout %q", code(mem), mem.Signal, mem.OOMKilled, mem.Stdout)
	}
	if r := run(t, sb, "echo alive"); strings.TrimSpace(r.Stdout) != "alive" {
		t.Errorf("after the limits: %q", r.Stdout)
	}
	// Not made to end out of memory, it does not, nor says it did.
	if r := sb.ExitReason(); r != "" || !sb.Alive() {
		t.Errorf("after the limits: alive %v, exit reason %q", sb.Alive(), r)
	}
}

// TestPidsLimitCountsTheSandboxsOwn: a pids limit of N is N tasks for
// the sandbox's processes, the spawner that starts them aside: with a
// limit of 1 a shell runs, exactly one: its first fork fails. (Only the
// spawner's forking thread is in the limited group: v1's tasks files put
// it there alone, and on a pure v2 host the group is a threaded one.)
func TestPidsLimitCountsTheSandboxsOwn(t *testing.T) {
	t.Parallel()
	one := newSandbox(t, sandbox.Options{Limits: sandbox.Limits{Pids: 1}})
	if r := run(t, one, "echo alone"); strings.TrimSpace(r.Stdout) != "alone" || code(r) != 0 {
		t.Fatalf("a shell with a pids limit of 1: exit %d, stdout %q, stderr %q", code(r), r.Stdout, r.Stderr)
	}
	if r := run(t, one, "/bin/true && echo forked"); strings.Contains(r.Stdout, "forked") || code(r) == 0 {
		t.Errorf("a second task with a pids limit of 1: exit %d, stdout %q", code(r), r.Stdout)
	}
	two := newSandbox(t, sandbox.Options{Limits: sandbox.Limits{Pids: 2}})
	if r := run(t, two, "/bin/true && echo forked"); strings.TrimSpace(r.Stdout) != "forked" {
		t.Errorf("a second task with a pids limit of 2: exit %d, stdout %q, stderr %q", code(r), r.Stdout, r.Stderr)
	}
}

// TestGVisorLimits: in a gVisor sandbox the pids limit holds as in the
// namespace backend's (the runtime's kernel counts its processes in a
// group of its own), and memory past the limit ends the whole sandbox,
// which says so.
func TestGVisorLimits(t *testing.T) {
	t.Parallel()
	sb := newBox(t, sandbox.RuntimeGVisor, sandbox.Options{Limits: sandbox.Limits{Pids: 64, MemoryBytes: 64 << 20}})
	forkBomb(t, sb)
	if r := run(t, sb, "echo alive"); strings.TrimSpace(r.Stdout) != "alive" {
		t.Fatalf("after the bomb: %q", r.Stdout)
	}
	if sb.ExitReason() != "" {
		t.Errorf("a running sandbox's exit reason: %q", sb.ExitReason())
	}
	// No answer comes: the sandbox ends under the request.
	body, _ := json.Marshal(api.ExecRequest{Command: "python3", Args: []string{"-c", "b = bytearray(512 << 20); print(len(b))"}})
	if code, b, ok := postExec(sb, body); ok {
		t.Fatalf("512 MiB in a 64 MiB gVisor sandbox answered %d: %s", code, b)
	}
	endedOutOfMemory(t, sb, agentEnded(sb))
}

// forkBomb runs, in a sandbox limited to 64 processes, a bomb that keeps
// every child it made: it spawns until the kernel refuses, says how far
// it got, and leaves its children to the drain. (posix_spawn shares the
// parent's memory until the exec: a memory limit stays out of it.)
func forkBomb(t *testing.T, sb dialer) {
	t.Helper()
	bomb := run(t, sb, `python3 -c '
import errno, os
n = 0
try:
    while True:
        os.posix_spawnp("sleep", ["sleep", "1000"], os.environ)
        n += 1
except OSError as e:
    print(n, errno.errorcode[e.errno])
'`)
	var forked int
	var why string
	if _, err := fmt.Sscan(bomb.Stdout, &forked, &why); err != nil || forked >= 64 || forked < 8 || why != "EAGAIN" {
		t.Errorf("fork bomb: stdout %q, stderr %q: want fewer than 64 forks, then EAGAIN", bomb.Stdout, clipS(bomb.Stderr))
	}
}

// TestCPULimit: a busy loop in a sandbox limited to a fifth of a core is
// throttled, which it would not be outside the sandbox's cpu group; and
// the agent is outside that limit, in the group above it, which has the
// limit and one core more: a workload at its limit does not slow the
// relay of its output, nor kilnd's calls.
func TestCPULimit(t *testing.T) {
	sb := newSandbox(t, sandbox.Options{Limits: sandbox.Limits{CPUs: 0.2}})
	if r := run(t, sb, "timeout 1 sh -c 'while :; do :; done'; echo done"); strings.TrimSpace(r.Stdout) != "done" {
		t.Fatalf("busy loop: stdout %q, stderr %q", r.Stdout, clipS(r.Stderr))
	}
	if got := sb.Cgroups.ReadEvent("cpu", "cpu.stat", "nr_throttled"); got == 0 {
		t.Errorf("a second of busy loop at 0.2 CPUs was never throttled")
	}
	want := func(dir, file, value string) {
		t.Helper()
		if b, err := os.ReadFile(filepath.Join(dir, file)); err != nil || strings.TrimSpace(string(b)) != value {
			t.Errorf("%s of %s: %q (%v), want %s", file, dir, b, err, value)
		}
	}
	dir := sb.Cgroups.V1["cpu"]
	if dir == "" {
		// On v2 the processes' limit is on the procs leaf, the agent's
		// bound on the sandbox's group, and the agent is born in its leaf.
		want(filepath.Join(sb.Cgroups.V2, "procs"), "cpu.max", "20000 100000")
		want(sb.Cgroups.V2, "cpu.max", "120000 100000")
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sb.PID))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); !strings.HasSuffix(got, "/kiln-"+sb.ID+"/agent") {
			t.Errorf("the agent's cgroup: %q, want the sandbox's agent leaf", got)
		}
		return
	}
	if sb.Cgroups.CPUProcs != filepath.Join(dir, "procs") {
		t.Fatalf("the processes' cpu group: %q, want %s/procs", sb.Cgroups.CPUProcs, dir)
	}
	want(sb.Cgroups.CPUProcs, "cpu.cfs_quota_us", "20000")
	want(dir, "cpu.cfs_quota_us", "120000")
	// The agent moves itself in without holding anything up: wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(strings.Fields(string(b)), strconv.Itoa(sb.PID)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent (pid %d) is not in its cpu group: %q", sb.PID, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b, err := os.ReadFile(filepath.Join(sb.Cgroups.CPUProcs, "cgroup.procs")); err != nil || slices.Contains(strings.Fields(string(b)), strconv.Itoa(sb.PID)) {
		t.Errorf("the agent (pid %d) within its processes' CPU limit: %q (%v)", sb.PID, b, err)
	}
}

// TestOutOfMemoryNeverKillsTheAgent fills the memory limit with what no
// process holds (a file on the sandbox's own tmpfs), so the out-of-memory
// killer's choice falls on the biggest process it may pick. The agent is
// outside the limited group: it is never that process, and it answers
// after. On a hybrid host the spawner is outside too (its forking thread
// alone is in the group); on a pure v2 host a process is in one group
// with all its threads, and the spawner, in procs with what it starts,
// may be picked: then the next process starts through a new one.
func TestOutOfMemoryNeverKillsTheAgent(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.Options{Limits: sandbox.Limits{MemoryBytes: 32 << 20}})
	if sb.Cgroups.MemoryProcs == "" && !sb.Cgroups.Leaves {
		t.Fatalf("a memory limit and no group that holds it: %+v", sb.Cgroups)
	}
	if sb.Cgroups.Leaves {
		// The agent's group is its own leaf, not the limited one.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sb.PID))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); !strings.HasSuffix(got, "/kiln-"+sb.ID+"/agent") {
			t.Errorf("the agent's cgroup: %q, want the sandbox's agent leaf", got)
		}
	}
	spawner := spawnerOf(t, sb)
	fill := run(t, sb, "exec dd if=/dev/zero of=/tmp/fill bs=1M count=64")
	if fill.Signal != "KILL" || !fill.OOMKilled {
		t.Errorf("64 MiB to a tmpfs in a 32 MiB sandbox: exit %d, signal %q, oom_killed %v, stderr %q", code(fill), fill.Signal, fill.OOMKilled, clipS(fill.Stderr))
	}
	// A SIGKILL that is not the kernel's is not reported as one.
	if self := run(t, sb, "kill -KILL $$"); self.Signal != "KILL" || self.OOMKilled {
		t.Errorf("a shell that killed itself: signal %q, oom_killed %v", self.Signal, self.OOMKilled)
	}
	if got := sb.Cgroups.OOMKills(); got == 0 {
		t.Errorf("no out-of-memory kill was counted")
	}
	if err := unix.Kill(sb.PID, 0); err != nil {
		t.Fatalf("the agent is gone: %v", err)
	}
	if got := spawnerOf(t, sb); got != spawner && !sb.Cgroups.Leaves {
		t.Errorf("the spawner was %d before the kill, %d after", spawner, got)
	}
	resp, err := sb.Client().Get("http://agent/exec-stream")
	if err != nil {
		t.Fatalf("the agent does not answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the agent answers %d", resp.StatusCode)
	}
	if r := run(t, sb, "echo alive"); strings.TrimSpace(r.Stdout) != "alive" {
		t.Errorf("a process after the kill: stdout %q, stderr %q", r.Stdout, clipS(r.Stderr))
	}
}

// TestSpawnerInTheSandboxRoot: the spawner starts while the agent builds
// the sandbox's root, and ends up in it, with the agent, whichever was
// first; so do the processes it starts. (Its root and the agent's are the
// same directory; the host's is another.)
func TestSpawnerInTheSandboxRoot(t *testing.T) {
	t.Parallel()
	for range 3 {
		sb := newSandbox(t, sandbox.Options{})
		spawner := spawnerOf(t, sb)
		var agent, sp, host unix.Stat_t
		for _, c := range []struct {
			path string
			st   *unix.Stat_t
		}{{fmt.Sprintf("/proc/%d/root/", sb.PID), &agent}, {fmt.Sprintf("/proc/%d/root/", spawner), &sp}, {"/", &host}} {
			if err := unix.Stat(c.path, c.st); err != nil {
				t.Fatal(err)
			}
		}
		if sp.Dev != agent.Dev || sp.Ino != agent.Ino {
			t.Errorf("the spawner's root is %d:%d, the agent's %d:%d", sp.Dev, sp.Ino, agent.Dev, agent.Ino)
		}
		if agent.Dev == host.Dev && agent.Ino == host.Ino {
			t.Errorf("the agent's root is the host's")
		}
		if r := run(t, sb, "test -d /workspace && test ! -e "+sb.Dir+" && echo in"); strings.TrimSpace(r.Stdout) != "in" {
			t.Errorf("a process's root: stdout %q, stderr %q", r.Stdout, clipS(r.Stderr))
		}
	}
}

// TestInheritedDescriptorsStayOut: a descriptor kilnd inherited without
// close-on-exec (from a shell, a supervisor) reaches neither the agent's
// processes nor anything else in the sandbox.
func TestInheritedDescriptorsStayOut(t *testing.T) { eachRuntime(t, testInheritedDescriptorsStayOut) }

func testInheritedDescriptorsStayOut(t *testing.T, runtime string) {
	// A descriptor above the agent's own, without O_CLOEXEC, as inherited.
	const fd = 200
	if err := unix.Dup3(0, fd, 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	sb := newBox(t, runtime, sandbox.Options{})
	// ls's own descriptor for the directory is 3.
	if got := strings.Fields(run(t, sb, "ls /proc/self/fd").Stdout); !slices.Equal(got, []string{"0", "1", "2", "3"}) {
		t.Errorf("descriptors of a sandboxed process: %v, want 0 1 2 and ls's own 3 (fd %d leaked?)", got, fd)
	}
}

// spawnerOf finds the sandbox's spawner: the agent's child of that name.
func spawnerOf(t *testing.T, sb *sandbox.Sandbox) int {
	t.Helper()
	// A spawner with a short idle time may end between the run that
	// starts it and the look (a slow machine's, an emulated one's): the
	// next run starts it again.
	var b []byte
	for range 5 {
		run(t, sb, "true") // it runs by now
		// Each thread's children: any of the agent's threads may have
		// forked it.
		paths, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", sb.PID))
		b = b[:0]
		for _, p := range paths {
			c, _ := os.ReadFile(p)
			b = append(b, c...)
		}
		for _, f := range strings.Fields(string(b)) {
			if comm, _ := os.ReadFile("/proc/" + f + "/comm"); strings.TrimSpace(string(comm)) == "kiln-spawner" {
				pid, _ := strconv.Atoi(f)
				return pid
			}
		}
	}
	t.Fatalf("no spawner among the agent's children %q", b)
	return 0
}

func clipS(s string) string {
	if len(s) > 300 {
		return s[:300]
	}
	return s
}

// TestBackgroundChildOrphan: a process that leaves a background child and
// exits ends cleanly; the child, killed with its group, is reaped by the
// agent, so no zombie is left behind.
func TestBackgroundChildOrphan(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testBackgroundChildOrphan)
}

func testBackgroundChildOrphan(t *testing.T, runtime string) {
	sb := newBox(t, runtime, sandbox.Options{})
	r := run(t, sb, "sleep 1000 & echo started")
	if strings.TrimSpace(r.Stdout) != "started" || code(r) != 0 {
		t.Fatalf("got %+v", r)
	}
	// The child is killed with its group and reaped by the agent when its
	// SIGCHLD comes, which may be a moment after the exec answered: look
	// again, within a bound, until no zombie is left.
	deadline := time.Now().Add(10 * time.Second)
	for {
		zombies := run(t, sb, `for s in /proc/[0-9]*/stat; do read -r line < $s; case "$line" in *") Z "*) echo "$line";; esac; done; exit 0`)
		z := strings.TrimSpace(zombies.Stdout)
		if z == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombies left: %s", z)
		}
	}
}

// TestRootfsOverlay: a given root filesystem (here busybox's) is the
// sandbox's root, writable through an overlay while the directory itself
// stays untouched.
func TestRootfsOverlay(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testRootfsOverlay)
}

func testRootfsOverlay(t *testing.T, runtime string) {
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs /bin/busybox (Debian's busybox-static) to make a root filesystem")
	}
	rootfs := t.TempDir()
	for _, d := range []string{"bin", "etc"} {
		if err := os.Mkdir(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), busybox, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "cat", "echo", "ls", "id", "stat"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "marker"), []byte("from the image\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := sandbox.Options{Rootfs: rootfs}
	if runtime == sandbox.RuntimeGVisor {
		backend(t, runtime, "") // or skip before the build
		o.Exe = staticKilnd(t)
	}
	sb := newBox(t, runtime, o)
	r := run(t, sb, "cat /etc/marker; echo written > /etc/added; cat /etc/added; ls /usr 2>&1 | head -c 0; test -e /usr/bin/python3 && echo host-usr-visible; exit 0")
	if r.Stdout != "from the image\nwritten\n" {
		t.Errorf("inside the rootfs: stdout %q, stderr %q", r.Stdout, r.Stderr)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "etc", "added")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the image was written to: %v", err)
	}
	// Nor by the runtime: the mount points it needed are not in it.
	if ents, _ := os.ReadDir(rootfs); len(ents) != 2 {
		t.Errorf("the image's root holds %v, want bin and etc alone", ents)
	}
	// The image's root's files are the sandbox's root's.
	if r := run(t, sb, "echo changed > /etc/marker && cat /etc/marker && stat -c %u:%g /bin/busybox"); r.Stdout != "changed\n0:0\n" {
		t.Errorf("the sandbox's root over the image's files: %q %q", r.Stdout, r.Stderr)
	}
	if runtime == sandbox.RuntimeGVisor {
		return // its overlay is gVisor's own, in no mount table
	}
	// Nor does the overlay's line of the mount table name where on the
	// host its layers are (the workspace, without a disk, is a bind of a
	// host directory; with one it is not: see the daemon's TestDiskQuota).
	r = run(t, sb, "grep ' - overlay ' /proc/self/mountinfo")
	if line := strings.TrimSpace(r.Stdout); line == "" || strings.Contains(line, sb.Dir) || !strings.Contains(line, "upperdir=upper") {
		t.Errorf("the overlay's mountinfo line: %q", line)
	}
}

// TestLayers stacks an image's layers as an image store leaves them, with
// overlayfs's whiteouts: a file removed by a layer above is gone, a
// directory made opaque holds only the top layer's files.
func TestLayers(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testLayers)
}

func testLayers(t *testing.T, runtime string) {
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs /bin/busybox (Debian's busybox-static) to make a root filesystem")
	}
	bottom, middle, top := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(dir, name, content string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(bottom, "bin/busybox", string(busybox))
	for _, applet := range []string{"sh", "cat", "ls"} {
		if err := os.Symlink("busybox", filepath.Join(bottom, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	write(bottom, "etc/a", "a\n")
	write(bottom, "etc/b", "b\n")
	write(bottom, "data/x", "x\n")
	write(middle, "etc/c", "c\n")
	write(middle, "data/y", "y\n")
	write(top, "data/z", "z\n")
	if err := os.Mkdir(filepath.Join(top, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(top, "etc", "a"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(top, "data"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	o := sandbox.Options{Layers: []string{top, middle, bottom}}
	if runtime == sandbox.RuntimeGVisor {
		backend(t, runtime, "")
		o.Exe = staticKilnd(t)
	}
	sb := newBox(t, runtime, o)
	if r := run(t, sb, "ls /etc /data; cat /etc/b /etc/c /data/z"); r.Stdout != "/data:\nz\n\n/etc:\nb\nc\nb\nc\nz\n" {
		t.Errorf("the layers stacked: stdout %q, stderr %q", r.Stdout, r.Stderr)
	}
}

// TestHostGroupsStayOut: kilnd's supplementary groups are real host
// groups (a member of shadow's group reads /etc/shadow); neither the agent
// nor a sandboxed process keeps them, whatever groups kilnd runs with.
func TestHostGroupsStayOut(t *testing.T) { eachRuntime(t, testHostGroupsStayOut) }

func testHostGroupsStayOut(t *testing.T, runtime string) {
	had, err := unix.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	// Every thread of this process takes them, as a kilnd started with
	// them has them.
	if err := unix.Setgroups([]int{0, 42}); err != nil {
		t.Fatal(err)
	}
	defer unix.Setgroups(had)
	sb := newBox(t, runtime, sandbox.Options{})
	r := run(t, sb, "grep '^Groups:' /proc/self/status /proc/1/status")
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		if _, groups, _ := strings.Cut(line, "Groups:"); strings.TrimSpace(groups) != "" {
			t.Errorf("%s: want no supplementary groups", line)
		}
	}
	if n := strings.Count(r.Stdout, "Groups:"); n != 2 {
		t.Fatalf("read %d Groups lines: %q %q", n, r.Stdout, r.Stderr)
	}
}

// TestWritableMountsAreNosuidNodev: no mount a sandbox can write honours
// a setuid bit, nor, outside /dev (its devices and terminals), a device
// node.
func TestWritableMountsAreNosuidNodev(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testWritableMountsAreNosuidNodev)
}

func testWritableMountsAreNosuidNodev(t *testing.T, runtime string) {
	sb := newBox(t, runtime, sandbox.Options{})
	r := run(t, sb, "cat /proc/self/mountinfo")
	seen := map[string]bool{}
	for line := range strings.Lines(r.Stdout) {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		point, opts := f[4], strings.Split(f[5], ",")
		if slices.Contains(opts, "ro") {
			continue
		}
		seen[point] = true
		if !slices.Contains(opts, "nosuid") {
			t.Errorf("%s is writable without nosuid: %s", point, f[5])
		}
		if runtime == sandbox.RuntimeGVisor && strings.HasPrefix(point, "/.kiln/") {
			continue // the agent's, under the empty mount that hides them
		}
		devices := point == "/dev" || strings.HasPrefix(point, "/dev/") && point != "/dev/shm"
		// gVisor's mount table shows no nodev: no device node can be made
		// there (no CAP_MKNOD, the probes' "create a device node"), and
		// its kernel has none of the host's devices behind one.
		if !devices && !slices.Contains(opts, "nodev") && runtime != sandbox.RuntimeGVisor {
			t.Errorf("%s is writable without nodev: %s", point, f[5])
		}
	}
	for _, p := range []string{"/workspace", "/tmp", "/root", "/dev/shm"} {
		if !seen[p] {
			t.Errorf("no writable mount at %s in %q", p, r.Stdout)
		}
	}
}

// TestProcIsMasked: what of /proc tells of or reaches the host's kernel
// reads as empty, and /proc/sys and the like cannot be written, by the
// sandbox's root either.
func TestProcIsMasked(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testProcIsMasked)
}

func testProcIsMasked(t *testing.T, runtime string) {
	sb := newBox(t, runtime, sandbox.Options{})
	// gVisor's /proc/cmdline is its own kernel's, not the host's.
	if r := run(t, sb, "cat /proc/cmdline"); runtime == sandbox.RuntimeGVisor {
		if host, _ := os.ReadFile("/proc/cmdline"); code(r) != 0 || strings.Contains(r.Stdout, strings.TrimSpace(string(host))) {
			t.Errorf("/proc/cmdline in gVisor: %q (exit %d), the host's is %q", r.Stdout, code(r), host)
		}
	}
	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/cmdline", "/proc/config.gz"} {
		if p == "/proc/cmdline" && runtime == sandbox.RuntimeGVisor {
			continue
		}
		r := run(t, sb, "test ! -e "+p+" || wc -c < "+p)
		if n := strings.TrimSpace(r.Stdout); code(r) != 0 || n != "" && n != "0" {
			t.Errorf("%s: %s bytes (exit %d, %q)", p, n, code(r), r.Stderr)
		}
	}
	if r := run(t, sb, "ls -A /proc/acpi /proc/scsi 2>/dev/null | grep -v ':$' | grep -c ."); strings.TrimSpace(r.Stdout) != "0" {
		t.Errorf("masked directories list %s entries", strings.TrimSpace(r.Stdout))
	}
	for _, p := range []string{"/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"} {
		r := run(t, sb, "test ! -e "+p+" && echo absent || echo 1 > "+p)
		if r.Stdout == "absent\n" {
			continue // this kernel has none
		}
		// gVisor's /proc/sys is its root's, not the sandbox's root's.
		want := "Read-only file system"
		if runtime == sandbox.RuntimeGVisor {
			want = "Permission denied"
		}
		if code(r) == 0 || !strings.Contains(r.Stderr, want) {
			t.Errorf("write to %s: exit %d, %q; want %q", p, code(r), r.Stderr, want)
		}
	}
	// Reading what is not masked still works.
	if r := run(t, sb, "head -c 5 /proc/sys/kernel/ostype"); strings.TrimSpace(r.Stdout) != "Linux" {
		t.Errorf("read /proc/sys: %q %q", r.Stdout, r.Stderr)
	}
}

// TestTmpfsWithinTheMemoryLimit: /tmp and /root are memory, so a sandbox
// with a memory limit gets them no larger than it: a full /tmp is ENOSPC,
// not half the host's RAM taken.
func TestTmpfsWithinTheMemoryLimit(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testTmpfsWithinTheMemoryLimit)
}

func testTmpfsWithinTheMemoryLimit(t *testing.T, runtime string) {
	sb := newBox(t, runtime, sandbox.Options{Limits: sandbox.Limits{MemoryBytes: 64 << 20}})
	r := run(t, sb, "df -k /tmp /root | tail -n +2")
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("df: %q %q", r.Stdout, r.Stderr)
	}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) < 6 || f[1] != "65536" {
			t.Errorf("%s: want a size of 65536 KiB", l)
		}
	}
}

// TestCreateWhenTheAgentDies: an agent that exits at once fails Create,
// and kilnd reaps it without touching the sandbox it did
// not return (goleak waits for that reaper to finish).
func TestCreateWhenTheAgentDies(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the namespace backend needs root")
	}
	o := sandbox.Options{ID: uuid.Must(uuid.NewV7()).String(), Exe: "/bin/false", Ready: 10 * time.Second}
	o.Dir = filepath.Join(t.TempDir(), o.ID)
	sb, err := sandbox.Create(t.Context(), o)
	if err == nil {
		sb.Destroy(false)
		t.Fatal("Create succeeded with an agent that exits")
	}
	// Where it notices depends on how far Create got when the agent died.
	if !strings.Contains(err.Error(), "agent") {
		t.Errorf("Create: %v, want it to say what became of the agent", err)
	}
}

// TestAliveWhileItsFirstThreadIsGone: a process whose first thread shows
// as a zombie while another runs (as while a Go program executes another
// from a thread not its first) is alive; once its last thread is gone, it
// is not, reaped or not.
func TestAliveWhileItsFirstThreadIsGone(t *testing.T) {
	cmd := exec.Command("python3", "-c", `import ctypes, sys, threading
threading.Thread(target=sys.stdin.read).start()
ctypes.CDLL(None).pthread_exit(None)`)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	stat := func() []string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	}
	// Nothing signals the first thread's end: its stat is watched, bounded.
	for deadline := time.Now().Add(time.Minute); ; {
		if f := stat(); f[0] == "Z" && f[17] == "2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first thread did not end: %v", stat())
		}
		time.Sleep(time.Millisecond)
	}
	started, err := strconv.ParseUint(stat()[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	sb := &sandbox.Sandbox{PID: cmd.Process.Pid, Started: started}
	if !sb.Alive() {
		t.Fatal("a process whose other thread runs is not alive")
	}
	// Its other thread ends with its input; the pidfd says when the
	// process has exited, before anyone reaps it.
	p := pidfdtest.Watch(t, cmd.Process.Pid)
	stdin.Close()
	awaitExit(t, p, time.Minute)
	if sb.Alive() {
		t.Errorf("an exited process, not reaped, is alive: %v", stat())
	}
}
