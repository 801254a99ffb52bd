package sandbox_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/guest/confine"
	"github.com/sandkiln/sandkiln/internal/pidfd/pidfdtest"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// probeEnv makes this test binary, copied into a sandbox's workspace and
// run there, the probe: it tries each of probes and prints its result.
const probeEnv = "KILN_PROBE"

// A probe tries what a sandboxed process must not be able to do, and
// returns the errno that stopped it (nil: it was not stopped).
type probe struct {
	name string
	want error // the errno that stops it
	try  func() error
}

// mayBeAbsent are probes of files a kernel may not have (without
// CONFIG_PROC_KCORE, CONFIG_MAGIC_SYSRQ): ENOENT passes them too.
var mayBeAbsent = map[string]bool{"write /proc/sysrq-trigger": true, "read /proc/kcore": true}

// inGVisor are the probes gVisor's kernel stops before the filter or the
// masks are reached, with its own errno: its /proc has none of the host's
// files, and its /proc/sys belongs to its root, not the sandbox's.
var inGVisor = map[string]error{
	"write /proc/sys":           unix.EACCES,
	"write /proc/sysrq-trigger": unix.EACCES,
	"read /proc/keys":           unix.ENOENT,
	"read /proc/timer_list":     unix.ENOENT,
}

func sys(trap uintptr, a ...uintptr) error {
	var args [6]uintptr
	copy(args[:], a)
	_, _, e := unix.Syscall6(trap, args[0], args[1], args[2], args[3], args[4], args[5])
	if e != 0 {
		return e
	}
	return nil
}

func str(s string) uintptr {
	p, _ := unix.BytePtrFromString(s)
	return uintptr(unsafe.Pointer(p))
}

var probes = []probe{
	{"unshare a user namespace", unix.EPERM, func() error { return sys(unix.SYS_UNSHARE, unix.CLONE_NEWUSER) }},
	{"unshare a mount namespace", unix.EPERM, func() error { return sys(unix.SYS_UNSHARE, unix.CLONE_NEWNS) }},
	{"unshare a network namespace", unix.EPERM, func() error { return sys(unix.SYS_UNSHARE, unix.CLONE_NEWNET) }},
	// CLONE_FS with CLONE_NEWUSER is EINVAL to the kernel: only the
	// filter answers EPERM, and nothing is ever forked.
	{"clone a user namespace", unix.EPERM, func() error {
		return sys(unix.SYS_CLONE, unix.CLONE_NEWUSER|unix.CLONE_FS|uintptr(unix.SIGCHLD))
	}},
	// A bad pointer is EFAULT to the kernel: ENOSYS is the filter's.
	{"clone3", unix.ENOSYS, func() error { return sys(unix.SYS_CLONE3, 1, 88) }},
	{"setns", unix.EPERM, func() error {
		fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return sys(unix.SYS_SETNS, uintptr(fd), unix.CLONE_NEWNET)
	}},
	{"mount a tmpfs", unix.EPERM, func() error { return unix.Mount("t", "/tmp", "tmpfs", 0, "") }},
	{"open_tree", unix.EPERM, func() error { return sys(unix.SYS_OPEN_TREE, atFDCWD, str("/tmp"), 0) }},
	{"fsopen", unix.EPERM, func() error { return sys(unix.SYS_FSOPEN, str("tmpfs"), 0) }},
	{"io_uring_setup", unix.EPERM, func() error {
		var params [120]byte
		return sys(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])))
	}},
	{"add_key", unix.EPERM, func() error {
		return sys(unix.SYS_ADD_KEY, str("user"), str("kiln"), str("v"), 1, uintptr(0xfffffffe)) // the process keyring
	}},
	{"keyctl", unix.EPERM, func() error { return sys(unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffe), 0) }},
	{"request_key", unix.EPERM, func() error { return sys(unix.SYS_REQUEST_KEY, str("user"), str("kiln"), 0, 0) }},
	{"bpf", unix.EPERM, func() error {
		var attr [128]byte
		return sys(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr[0])), 128)
	}},
	{"perf_event_open", unix.EPERM, func() error {
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK, Bits: unix.PerfBitExcludeKernel}
		attr.Size = uint32(unsafe.Sizeof(attr))
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}},
	{"userfaultfd", unix.EPERM, func() error { return sys(unix.SYS_USERFAULTFD, unix.O_CLOEXEC) }},
	{"kexec_load", unix.EPERM, func() error { return sys(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0) }},
	{"init_module", unix.EPERM, func() error { return sys(unix.SYS_INIT_MODULE, 0, 0, str("")) }},
	{"ptrace the agent", unix.EPERM, func() error { return sys(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 1) }},
	{"personality ADDR_NO_RANDOMIZE", unix.EPERM, func() error { return sys(unix.SYS_PERSONALITY, 0x0040000) }},
	{"a packet socket", unix.EPERM, func() error { return socket(unix.AF_PACKET, unix.SOCK_RAW, 0) }},
	{"a raw IP socket", unix.EPERM, func() error { return socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP) }},
	{"a vsock socket", unix.EPERM, func() error { return socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0) }},
	{"a kernel crypto socket", unix.EPERM, func() error { return socket(unix.AF_ALG, unix.SOCK_SEQPACKET, 0) }},
	{"write /proc/sys", unix.EROFS, func() error {
		return os.WriteFile("/proc/sys/kernel/hostname", []byte("x"), 0)
	}},
	{"write /proc/sysrq-trigger", unix.EROFS, func() error {
		return os.WriteFile("/proc/sysrq-trigger", []byte("h"), 0)
	}},
	// A masked file reads as empty: a probe that reads anything failed.
	{"read /proc/kcore", io.EOF, func() error { return readSome("/proc/kcore") }},
	{"read /proc/keys", io.EOF, func() error { return readSome("/proc/keys") }},
	{"read /proc/timer_list", io.EOF, func() error { return readSome("/proc/timer_list") }},
	{"create a device node", unix.EPERM, func() error {
		return unix.Mknod("/workspace/probe-null", unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	}},
	{"lower oom_score_adj", unix.EACCES, func() error {
		return os.WriteFile("/proc/self/oom_score_adj", []byte("0"), 0)
	}},
	{"chroot out", nil, func() error { return unix.Chroot("/") }}, // allowed, as Docker does: it leads nowhere
	{"personality query", nil, func() error { return sys(unix.SYS_PERSONALITY, 0xffffffff) }},
}

// hostHasCap reports whether this process (as kilnd) holds capability c.
func hostHasCap(c uint) bool {
	b, _ := os.ReadFile("/proc/self/status")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<c) != 0
		}
	}
	return false
}

func socket(family, typ, proto int) error {
	fd, err := unix.Socket(family, typ, proto)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

func readSome(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.Read(b[:]); err != nil {
		return err
	}
	return errors.New("read a byte")
}

// probeMain runs the probes, one line each: its name, a tab, the errno's
// name or "ok".
func probeMain() {
	for _, p := range probes {
		fmt.Printf("%s\t%s\n", p.name, errName(p.try()))
	}
}

func errName(err error) string {
	var errno syscall.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &errno):
		return unix.ErrnoName(errno)
	case errors.Is(err, io.EOF):
		return "EOF"
	}
	return err.Error()
}

// TestProbes runs the probe suite inside a sandbox: every way into the
// kernel that Docker's default profile closes is closed, each by the errno
// that says so, and the process holds what a Docker container's does.
func TestProbes(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testProbes)
}

func testProbes(t *testing.T, runtime string) {
	sb := newBox(t, runtime, sandbox.Options{})
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sb.Workspace, "probe"), self, 0o755); err != nil {
		t.Fatal(err)
	}
	r := run(t, sb, probeEnv+"=1 /workspace/probe")
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		name, res, _ := strings.Cut(line, "\t")
		got[name] = res
	}
	for _, p := range probes {
		want := "ok"
		if p.want != nil {
			want = errName(p.want)
		}
		if errno, ok := inGVisor[p.name]; ok && runtime == sandbox.RuntimeGVisor {
			want = errName(errno)
		}
		if p.name == "lower oom_score_adj" && !hostHasCap(unix.CAP_SYS_RESOURCE) {
			// Only a writer with CAP_SYS_RESOURCE sets the floor; some
			// hosts' root does not hold it.
			t.Logf("%s: %s (kilnd's root lacks CAP_SYS_RESOURCE here, so the floor is not set)", p.name, got[p.name])
			continue
		}
		if got[p.name] != want && !(mayBeAbsent[p.name] && got[p.name] == "ENOENT") {
			t.Errorf("%s: %q, want %s", p.name, got[p.name], want)
		}
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("stdout %q, stderr %q", r.Stdout, r.Stderr)
	}

	if r := run(t, sb, "cat /proc/self/oom_score_adj"); strings.TrimSpace(r.Stdout) != strconv.Itoa(confine.OOMScoreAdj) {
		t.Errorf("oom_score_adj %q, want %d", r.Stdout, confine.OOMScoreAdj)
	}
	// A cgroup namespace: no host path to the sandbox's groups.
	r = run(t, sb, "cat /proc/self/cgroup")
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		if !strings.HasSuffix(line, ":/") {
			t.Errorf("/proc/self/cgroup: %q, want the namespace's root", line)
		}
	}

	r = run(t, sb, "grep -E '^(Cap|NoNewPrivs|Seccomp|Groups)' /proc/self/status")
	status := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		k, v, _ := strings.Cut(line, ":")
		status[k] = strings.TrimSpace(v)
	}
	// CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP,
	// NET_BIND_SERVICE, SYS_CHROOT, SETFCAP.
	const caps = "00000000800405fb"
	for k, want := range map[string]string{
		"CapInh": "0000000000000000", "CapPrm": caps, "CapEff": caps, "CapBnd": caps,
		"CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2", "Groups": "",
	} {
		if status[k] != want {
			t.Errorf("%s: %q, want %q", k, status[k], want)
		}
	}
}

// atFDCWD is AT_FDCWD as a system call's argument.
const atFDCWD = ^uintptr(99)

// TestOrdinaryPrograms: the filter and the dropped capabilities leave
// ordinary work alone: pipelines, a compiler, threads, an interpreter
// starting subprocesses, git, and root's ownership of files.
func TestOrdinaryPrograms(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testOrdinaryPrograms)
}

func testOrdinaryPrograms(t *testing.T, runtime string) {
	sb := newBox(t, runtime, sandbox.Options{})
	cases := []struct {
		name, needs, script, want string
	}{
		{"a pipeline", "sort", "seq 1000 | sort -rn | head -1", "1000"},
		{"a threaded C program", "gcc", `cd /tmp && printf '#include <stdio.h>\n#include <pthread.h>\nstatic void *f(void *a) { return a; }\nint main(void) { pthread_t t[8]; for (int i = 0; i < 8; i++) pthread_create(&t[i], 0, f, 0); for (int i = 0; i < 8; i++) pthread_join(t[i], 0); puts("joined"); return 0; }\n' > t.c && gcc -O1 -pthread -o t t.c && ./t`, "joined"},
		{"python with threads and a subprocess", "python3", `python3 -c 'import threading, subprocess; t = threading.Thread(target=lambda: None); t.start(); t.join(); print(subprocess.run(["echo", "sub"], capture_output=True, text=True).stdout.strip())'`, "sub"},
		{"git init and commit", "git", "cd /tmp && git init -q r && cd r && echo a > a && git add a && git -c user.email=k@example.invalid -c user.name=k commit -q -m first && git rev-list --count HEAD", "1"},
		{"root chowns and bypasses modes", "chown", "cd /tmp && echo x > f && chown 1000:1000 f && chmod 0600 f && cat f && stat -c %u f", "x\n1000"},
		{"a user switch", "setpriv", "setpriv --reuid 1000 --regid 1000 --clear-groups id -u", "1000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if code(run(t, sb, "command -v "+tc.needs)) != 0 {
				t.Skipf("no %s in the sandbox", tc.needs)
			}
			r := run(t, sb, tc.script)
			if code(r) != 0 || strings.TrimSpace(r.Stdout) != tc.want {
				t.Errorf("exit %d, stdout %q, stderr %q; want %q", code(r), r.Stdout, r.Stderr, tc.want)
			}
		})
	}
}

// TestOwnEtc: on the host's system, a sandbox's users, name and network
// files are its own, not the host's; the rest of /etc still serves /usr.
func TestOwnEtc(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testOwnEtc)
}

func testOwnEtc(t *testing.T, runtime string) {
	sb := newBox(t, runtime, sandbox.Options{Hostname: "etc-probe"})
	for _, tc := range []struct{ script, want string }{
		{"cut -d: -f1 /etc/passwd | tr '\\n' ' '", "root nobody"},
		{"getent passwd root | cut -d: -f6", "/root"},
		{"grep -c . /etc/group", "4"},
		{"grep etc-probe /etc/hosts | cut -f2", "etc-probe"},
		{"cat /etc/hostname", "etc-probe"},
		{"grep -c nameserver /etc/resolv.conf || true", "0"},
		{"wc -c < /etc/shadow", "0"},
		{"echo x > /etc/passwd 2>/dev/null || echo read-only", "read-only"},
		{"ls /etc/.. | grep -c '^.etc$' || true", "0"},
		{"test -s /etc/ld.so.cache && echo host-cache", "host-cache"},
	} {
		if r := run(t, sb, tc.script); strings.TrimSpace(r.Stdout) != tc.want {
			t.Errorf("%s: %q (stderr %q), want %q", tc.script, r.Stdout, r.Stderr, tc.want)
		}
	}
}

// TestSpawnerKilled: the sandbox's processes may kill its spawner (they
// are the same user, with CAP_KILL as Docker gives); the next process
// starts all the same, through a new one. (Killed here from the host, once
// no start is under way: a process that kills it while its own start is
// being answered gets an error, and runs unwatched.)
func TestSpawnerKilled(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.Options{})
	first := spawnerOf(t, sb)
	spawner := pidfdtest.Watch(t, first)
	if spawner == nil {
		t.Fatalf("the spawner %d is gone before its kill", first)
	}
	spawner.Kill()
	awaitExit(t, spawner, time.Minute)
	if r := run(t, sb, "echo alive"); strings.TrimSpace(r.Stdout) != "alive" {
		t.Errorf("after the spawner was killed: stdout %q, stderr %q", r.Stdout, r.Stderr)
	}
	if again := spawnerOf(t, sb); again == first {
		t.Errorf("the spawner %d is still the one that was killed", first)
	}
}

// TestSpawnerStopsWhenIdle: a spawner that has started nothing for its
// idle time, in a sandbox where nothing runs, ends; one where a process
// still runs (here one that left its session, the agent's orphan) stays.
// The next process starts through a new spawner, as the same users with
// the same maps.
func TestSpawnerStopsWhenIdle(t *testing.T) {
	const idle = 200 * time.Millisecond
	sb := newSandbox(t, sandbox.Options{SpawnerIdle: idle})
	maps := run(t, sb, "cat /proc/self/uid_map /proc/self/gid_map; touch /workspace/before")
	first := spawnerOf(t, sb)
	awaitExit(t, pidfdtest.Watch(t, first), time.Minute)

	if got := run(t, sb, "cat /proc/self/uid_map /proc/self/gid_map"); got.Stdout != maps.Stdout {
		t.Errorf("the maps of a process of the next spawner:\n%s\nbefore:\n%s", got.Stdout, maps.Stdout)
	}
	if got := run(t, sb, "stat -c %u:%g /workspace/before && touch /workspace/after && id -u"); strings.Fields(got.Stdout)[0] != "0:0" || code(got) != 0 {
		t.Errorf("a file made before, after: %+v", got)
	}
	if r := run(t, sb, "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & until pgrep -x sleep >/dev/null; do :; done; echo started"); strings.TrimSpace(r.Stdout) != "started" {
		t.Fatalf("start a process that outlives its shell: %q %q", r.Stdout, r.Stderr)
	}
	// Looked up once the process runs, which keeps it: an idle time may
	// pass before the look on a slow machine.
	second := spawnerOf(t, sb)
	if second == first {
		t.Fatalf("the spawner %d is the one that ended", first)
	}
	// Watched from its lookup: asked by pid later, it may be another's.
	secondSpawner := pidfdtest.Watch(t, second)
	// (sleep runs once setsid has left the shell's group, which its end
	// kills.) Ten idle times and more, with a process running: the spawner stays.
	if secondSpawner.Exited(20 * idle) {
		t.Fatalf("the spawner ended while a process of the sandbox ran")
	}
	if r := run(t, sb, "pkill -x sleep; echo $?"); strings.TrimSpace(r.Stdout) != "0" {
		t.Fatalf("kill the process that outlived its shell: %+v", r)
	}
	// Idle again, the same spawner ends. (Asking which spawner runs now
	// would start a process, and on a slow machine a new spawner: the old
	// one may have ended its idle time first.)
	awaitExit(t, secondSpawner, time.Minute)
}

// awaitExit waits until process p has exited, within d.
func awaitExit(t *testing.T, p *pidfdtest.Process, d time.Duration) {
	t.Helper()
	if !p.Exited(d) {
		t.Fatalf("the process still runs after %v", d)
	}
}

// TestMadeAheadSpawnerWarmed: a sandbox made ahead has its spawner go once
// through a start before any process asks (a program that does not
// exist): nothing of it is left (the agent's children are the spawner
// alone, no zombie), the idle count still waits for the first process,
// and that process starts through the same spawner.
func TestMadeAheadSpawnerWarmed(t *testing.T) {
	// Long enough that the spawner that ran the first process is still
	// there for the look after it on a loaded machine.
	const idle = time.Second
	sb := newSandbox(t, sandbox.Options{MadeAhead: true, SpawnerIdle: idle})
	children := func() []string {
		paths, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", sb.PID))
		var out []string
		for _, p := range paths {
			c, _ := os.ReadFile(p)
			out = append(out, strings.Fields(string(c))...)
		}
		return out
	}
	// The warm start's child, failed, is the agent's (the spawner forks
	// with CLONE_PARENT) until the agent reaps it, at its SIGCHLD.
	deadline := time.Now().Add(time.Minute)
	var kids []string
	for kids = children(); len(kids) != 1 && time.Now().Before(deadline); kids = children() {
		time.Sleep(10 * time.Millisecond)
	}
	if len(kids) != 1 {
		t.Fatalf("the agent's children: %v; want the spawner alone", kids)
	}
	if comm, _ := os.ReadFile("/proc/" + kids[0] + "/comm"); strings.TrimSpace(string(comm)) != "kiln-spawner" {
		t.Fatalf("the agent's child %s is %q, not the spawner", kids[0], comm)
	}
	first, _ := strconv.Atoi(kids[0])
	if pidfdtest.Watch(t, first).Exited(3 * idle) {
		t.Fatal("the spawner of a sandbox made ahead ended before its first process")
	}
	r := run(t, sb, "ps -eo stat= | grep -c ^Z; true")
	if strings.TrimSpace(r.Stdout) != "0" {
		t.Errorf("zombies in the sandbox: %q %q", r.Stdout, r.Stderr)
	}
	if got := spawnerOf(t, sb); got != first {
		t.Errorf("the first process came from spawner %d, not the warmed %d", got, first)
	}
}
