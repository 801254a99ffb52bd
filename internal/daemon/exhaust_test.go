package daemon_test

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// takeScript takes up to n (its second argument) of a per-user kernel
// resource (its first) in a sandbox, and prints how much it took and why
// it stopped: at the first error, named as errno names it, or OK once it
// has n. More than one it holds, in a process of its own that lives
// until the sandbox ends.
const takeScript = `
import ctypes, errno, os, signal, sys

libc = ctypes.CDLL(None, use_errno=True)

def failed():
    e = ctypes.get_errno()
    return errno.errorcode.get(e, str(e))

def inotify_instances(n):
    got = 0
    while got < n:
        if libc.inotify_init1(0) < 0:
            return got, failed()
        got += 1
    return got, "OK"

def inotify_watches(n):
    # Each instance watches every file once: 2000 files, fewer than 128
    # instances for the default limit.
    os.makedirs("/tmp/watched", exist_ok=True)
    paths = []
    for i in range(min(n, 2000)):
        p = b"/tmp/watched/%d" % i
        open(p, "wb").close()
        paths.append(p)
    got = 0
    while True:
        fd = libc.inotify_init1(0)
        if fd < 0:
            return got, "instances:" + failed()
        for p in paths:
            if got == n:
                return got, "OK"
            if libc.inotify_add_watch(fd, p, 4) < 0:  # IN_ATTRIB
                return got, failed()
            got += 1

def mqueues(n):
    # Queues of the defaults: 10 messages of 8 KiB, 80 KiB of the
    # RLIMIT_MSGQUEUE bytes.
    got = 0
    while got < n:
        if libc.mq_open(b"/kiln-%d-%d" % (os.getpid(), got), os.O_CREAT | os.O_RDWR, 0o600, None) < 0:
            return got, failed()
        got += 1
    return got, "OK"

def pending_signals(n):
    sig = signal.SIGRTMIN
    signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
    got = 0
    while got < n:
        if libc.sigqueue(os.getpid(), sig, ctypes.c_void_p(0)) < 0:
            return got, failed()
        got += 1
    return got, "OK"

def shm_locked_mib(n):
    got = 0
    while got < n:
        shm = libc.shmget(0, 1 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT
        if shm < 0:
            return got, "shmget:" + failed()
        if libc.shmctl(shm, 11, None) < 0:  # SHM_LOCK
            e = failed()
            libc.shmctl(shm, 0, None)  # IPC_RMID
            return got, e
        got += 1
    return got, "OK"

def refused(call):
    def take(n):
        got = 0
        while got < n:
            if call() < 0:
                return got, failed()
            got += 1
        return got, "OK"
    return take

resources = {
    "inotify_instances": inotify_instances,
    "inotify_watches": inotify_watches,
    "mqueues": mqueues,
    "pending_signals": pending_signals,
    "shm_locked_mib": shm_locked_mib,
    "user_namespaces": refused(lambda: libc.unshare(0x10000000)),  # CLONE_NEWUSER
    "fanotify_groups": refused(lambda: libc.fanotify_init(0, 0)),
    "keys": refused(lambda: libc.syscall(248, b"user", b"kiln-%d" % os.getpid(), b"x", 1, -2)),  # add_key
}
take, n = resources[sys.argv[1]], int(sys.argv[2])
if n == 1:
    print(*take(1))
    sys.exit(0)
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    os.setsid()
    got, why = take(n)
    os.write(w, b"%d %s\n" % (got, why.encode()))
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(w)
    while True:
        signal.pause()
os.close(w)
print(os.read(r, 200).decode().strip())
`

// hostUses counts the names hostUseName gives.
var hostUses atomic.Int64

// hostUseName is a name of the host's, for a queue or a key, that no
// other use takes: the runtimes' subtests use the host's side by side.
func hostUseName() string {
	return fmt.Sprintf("kiln-exhaust-test-%d-%d", os.Getpid(), hostUses.Add(1))
}

// hostUse uses one of each resource in the test process, on the host, as
// root, and gives back what it held.
var hostUse = map[string]func(t *testing.T) error{
	"inotify_instances": func(t *testing.T) error {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err == nil {
			unix.Close(fd)
		}
		return err
	},
	"inotify_watches": func(t *testing.T) error {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		_, err = unix.InotifyAddWatch(fd, t.TempDir(), unix.IN_ATTRIB)
		return err
	},
	"mqueues": func(t *testing.T) error {
		// A queue of the defaults, in the host's IPC namespace.
		name, _ := unix.BytePtrFromString(hostUseName())
		fd, _, errno := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600, 0, 0, 0)
		if errno != 0 {
			return errno
		}
		unix.Close(int(fd))
		if _, _, errno := unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0); errno != 0 {
			t.Errorf("mq_unlink: %v", errno)
		}
		return nil
	},
	"pending_signals": func(t *testing.T) error {
		// A POSIX timer holds a queued signal of its own, counted as one
		// pending signal of its owner's from its creation.
		// struct sigevent: value, signal, notify, then its union.
		var ev [64]byte
		*(*int32)(unsafe.Pointer(&ev[12])) = 1 // SIGEV_NONE
		var id int32
		if _, _, errno := unix.Syscall(unix.SYS_TIMER_CREATE, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&ev)), uintptr(unsafe.Pointer(&id))); errno != 0 {
			return errno
		}
		if _, _, errno := unix.Syscall(unix.SYS_TIMER_DELETE, uintptr(id), 0, 0); errno != 0 {
			t.Errorf("timer_delete: %v", errno)
		}
		return nil
	},
	"shm_locked_mib": func(t *testing.T) error {
		id, err := unix.SysvShmGet(unix.IPC_PRIVATE, 1<<20, unix.IPC_CREAT|0o600)
		if err != nil {
			return err
		}
		defer unix.SysvShmCtl(id, unix.IPC_RMID, nil)
		_, err = unix.SysvShmCtl(id, 11, nil) // SHM_LOCK
		return err
	},
	"user_namespaces": func(t *testing.T) error {
		cmd := exec.Command("true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}
		return cmd.Run()
	},
	"fanotify_groups": func(t *testing.T) error {
		fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC, unix.O_RDONLY)
		if err == nil {
			unix.Close(fd)
		}
		return err
	},
	"keys": func(t *testing.T) error {
		// In the test process's own keyring, which ends with it. The
		// kernel keeps the process keyring in the credentials of the
		// thread that made it first: one thread adds the key and
		// invalidates it, or another may not possess it (EPERM).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		id, err := unix.AddKey("user", hostUseName(), []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
		if err != nil {
			return err
		}
		if _, err := unix.KeyctlInt(unix.KEYCTL_INVALIDATE, id, 0, 0, 0); err != nil {
			t.Errorf("invalidate the key: %v", err)
		}
		return nil
	},
}

// TestNoSharedExhaustion: a sandbox that takes all it can of a per-user
// kernel resource leaves another sandbox, and the host's root, able to
// use it. Where a namespace sandbox can take some (inotify's instances and
// watches, POSIX message queues, pending signals, locked shared memory),
// it stops at its own limit, and the other sandbox and the host take one
// after it; where it can take none (user namespaces, fanotify, keys: its
// system call filter refuses them), neither can the other sandbox, and
// the host still can. A gVisor sandbox counts in its own kernel: one
// takes what it can, or for inotify one more than the host allows a user,
// and the host's counts are untouched. The figures are logged.
func TestNoSharedExhaustion(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	// After the subtests, which run side by side: each takes from
	// sandboxes of its own.
	t.Cleanup(k.cleanup)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			for _, tc := range []struct {
				resource string
				limited  bool   // a namespace sandbox can take some, up to a limit
				host     string // the host's per-user limit in /proc/sys, if one
			}{
				{"inotify_instances", true, "user/max_inotify_instances"},
				{"inotify_watches", true, "user/max_inotify_watches"},
				{"mqueues", true, ""},
				{"pending_signals", true, ""},
				{"shm_locked_mib", true, ""},
				{"user_namespaces", false, "user/max_user_namespaces"},
				{"fanotify_groups", false, "user/max_fanotify_groups"},
				{"keys", false, "kernel/keys/maxkeys"},
			} {
				t.Run(tc.resource, func(t *testing.T) {
					t.Parallel()
					k := *k
					k.t = t
					n := int64(1) << 40
					if rt == sandbox.RuntimeGVisor && tc.host != "" {
						// gVisor sets no limit of its own on some: one more
						// than the host's shows the host's is not in play.
						n = sysctl(t, tc.host) + 1
					}
					a := k.sandboxOf(t, rt)
					defer k.remove(t, a)
					took := k.take(t, a, tc.resource, n)
					// The other sandbox is of the namespace runtime: on the
					// host's kernel, where the counts are kept.
					b := k.sandboxOf(t, sandbox.RuntimeNamespaces)
					defer k.remove(t, b)
					other := k.take(t, b, tc.resource, 1)
					host := hostUse[tc.resource](t)
					t.Logf("%s: sandbox A took %s; then sandbox B: %s; the host: %v", tc.resource, took, other, errOr(host))
					if host != nil {
						t.Errorf("the host, after sandbox A: %v", host)
					}
					switch {
					case !tc.limited:
						if !strings.HasPrefix(took, "0 ") || !strings.HasPrefix(other, "0 ") {
							t.Errorf("sandbox A took %s, sandbox B %s: want none", took, other)
						}
					case rt == sandbox.RuntimeNamespaces && (strings.HasPrefix(took, "0 ") || strings.HasSuffix(took, " OK")):
						t.Errorf("sandbox A took %s: want some, up to a limit", took)
					case other != "1 OK":
						t.Errorf("sandbox B, after A: %s, want 1 OK", other)
					}
				})
			}
		})
	}
}

// take runs takeScript in sandbox sb and returns what it printed.
func (k *kilnd) take(t *testing.T, sb, resource string, n int64) string {
	t.Helper()
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "python3", Args: []string{"-c", takeScript, resource, strconv.FormatInt(n, 10)}}, &res)
	if res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("take %d %s in %s: %+v", n, resource, sb, res)
	}
	return strings.TrimSpace(res.Stdout)
}

// remove deletes sandbox sb, and with it all it held.
func (k *kilnd) remove(t *testing.T, sb string) {
	t.Helper()
	if code, b := k.do("DELETE", "/sandboxes/"+sb, k.d.Token(), nil); code != 204 {
		t.Errorf("delete %s: %d %s", sb, code, b)
	}
}

// sysctl reads a number in /proc/sys.
func sysctl(t *testing.T, name string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("/proc/sys/%s: %v", name, err)
	}
	return n
}

func errOr(err error) string {
	if err == nil {
		return "OK"
	}
	return err.Error()
}
