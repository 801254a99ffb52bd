// Package pidfd waits for processes to exit in the Go runtime's poller, so that a wait holds no OS thread.
package pidfd

// A goroutine blocked in wait(2), as os.Process.Wait is, holds an OS thread
// for as long as the process runs: kilnd waits for every agent it starts, and
// each such thread takes a pid of the host's and lengthens every walk of its
// threads (pivot_root's, for one). A pidfd is readable once its process has
// exited; waiting for that in the poller holds a goroutine and nothing more.

import (
	"errors"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Open returns a pidfd of the process pid, registered with the runtime's
// poller. Who passes a pid not its own unreaped child must check, after
// Open, that the pid still names the process it meant.
func Open(pid int) (*os.File, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("pidfd_open", err)
	}
	return os.NewFile(uintptr(fd), "pidfd"), nil
}

// Await blocks until the process of f has exited, until stop (if not nil)
// is closed, or until f is; it reports whether the process exited. One
// Await at a time per f.
func Await(f *os.File, stop <-chan struct{}) bool {
	sc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	if stop != nil {
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			select {
			case <-stop:
				f.SetReadDeadline(time.Now())
			case <-done:
			}
		})
		defer func() {
			// f may be awaited again: no deadline of this wait's left.
			close(done)
			wg.Wait()
			f.SetReadDeadline(time.Time{})
		}()
	}
	exited := false
	sc.Read(func(fd uintptr) bool {
		exited = readable(fd)
		return exited
	})
	return exited
}

// AwaitChild parks the caller until pid, a child of this process not yet
// reaped, has exited, leaving the reaping to the caller's wait (which then
// returns at once). Where pidfds are missing it returns at once, and that
// wait does the job.
func AwaitChild(pid int) {
	f, err := Open(pid)
	if err != nil {
		return
	}
	defer f.Close()
	Await(f, nil)
}

// Take returns a pidfd of p, a child of this process not yet waited for,
// and releases p (closing its own pidfd, and setting its Pid to -1): the
// pidfd stands for it from now on, one descriptor per child, not two.
// On error p is left as it was.
func Take(p *os.Process) (*os.File, error) {
	if p.Pid <= 0 {
		return nil, errors.New("pidfd: a released process")
	}
	f, err := Open(p.Pid)
	if err != nil {
		return nil, err
	}
	p.Release()
	return f, nil
}

// Wait waits for pid, a child of this process that nothing else waits
// for, to exit, through f, its pidfd, in the poller; then it reaps it, as
// os.Process.Wait does.
func Wait(f *os.File, pid int) (syscall.WaitStatus, error) {
	if pid <= 0 {
		// To wait for pid -1 would reap any child.
		return 0, errors.New("pidfd: wait for pid " + strconv.Itoa(pid))
	}
	Await(f, nil)
	for {
		// The child has exited, so this returns at once; it is ours and
		// unreaped, so its pid cannot have been reused.
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return 0, os.NewSyscallError("wait4", err)
		case got == 0:
			// Not exited after all (the poller failed us): wait as
			// os.Process.Wait would.
			if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
				return 0, os.NewSyscallError("wait4", err)
			}
		}
		return ws, nil
	}
}

// Exited reports whether the process of f has exited, at once: one
// system call, where /proc's stat is a path walk and a read. A closed f
// (closed once its process was reaped or its sandbox ended) has.
func Exited(f *os.File) bool {
	sc, err := f.SyscallConn()
	if err != nil {
		return true
	}
	exited := false
	if sc.Control(func(fd uintptr) { exited = readable(fd) }) != nil {
		return true
	}
	return exited
}

// readable reports whether the pidfd fd is readable now: its process has
// exited. A failed poll says no, so that a running process is never taken
// for an ended one; a watcher in Await sees the real exit.
func readable(fd uintptr) bool {
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

// Describe says how a process with status ws ended, in the words of
// os.ProcessState's String.
func Describe(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return "exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		s := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			s += " (core dumped)"
		}
		return s
	}
	return "status " + strconv.Itoa(int(ws))
}
