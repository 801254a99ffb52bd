package guest

import (
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// secbitNoSetuidFixup keeps a thread's effective capabilities when its
// effective uid leaves 0 (capabilities(7)).
const secbitNoSetuidFixup = 1 << 2

// startOwned starts cmd, whose SysProcAttr makes it a new user namespace,
// with owner, a host uid, as that namespace's owner instead of root.
//
// The kernel counts what a user namespace's processes hold of each
// per-user resource (inotify instances and watches, message queue bytes,
// pending signals, namespaces) against their uid in that namespace and
// again against the namespace's owner in its parent, under the parent's
// limits: every sandbox's namespace owned by root would put all their
// counts on the host root's, and one sandbox could use up, for every
// other one and for the host's root, what the host allows a user. Owned
// by the first uid of the sandbox's range, which nothing else on the host
// runs as, a sandbox's counts are its own.
//
// The owner is the creating thread's effective uid, so cmd is started
// from a thread of its own whose effective uid is owner for that while:
// its real and saved uids stay root, and with SECBIT_NO_SETUID_FIXUP so do
// its effective capabilities, with which it writes the new namespace's
// maps. The thread is then given root's uid back, and is never given back
// to the Go runtime even so: it ends with the goroutine that locked it.
// The runtime makes no thread from a locked one (it asks its template
// thread), so none inherits the owner's uid.
func startOwned(cmd *exec.Cmd, owner int) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		done <- startAs(cmd, owner)
	}()
	return <-done
}

// startAs starts cmd with this thread's effective uid owner; the thread
// is locked and is not used again.
func startAs(cmd *exec.Cmd, owner int) error {
	bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("sandbox: read the securebits: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits|secbitNoSetuidFixup), 0, 0, 0); err != nil {
		return fmt.Errorf("sandbox: keep capabilities across a uid change: %w", err)
	}
	euid := unix.Geteuid()
	if err := setEUID(owner); err != nil {
		return fmt.Errorf("sandbox: take uid %d to own the user namespace: %w", owner, err)
	}
	err = cmd.Start()
	// Whatever becomes of these, the thread ends: a process started is
	// not failed for them.
	setEUID(euid)
	unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0)
	return err
}

// setEUID sets this thread's effective uid alone: the library's setresuid
// changes every thread's.
func setEUID(uid int) error {
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); errno != 0 {
		return errno
	}
	return nil
}
