// Package pidfdtest lets tests watch a process by a pidfd opened while it
// runs: whether it has exited, or a kill, goes to that process, never to
// a later one given its pid (a busy host's pids come round in minutes),
// and a zombie not yet reaped counts as exited.
package pidfdtest

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/pidfd"
)

// Process is a process watched through its pidfd.
type Process struct {
	t   testing.TB
	pid int
	f   *os.File
}

// Watch opens a pidfd of process pid, closed with the test; nil (which
// has exited) if the process is gone already. Open it as soon as the pid
// is known.
func Watch(t testing.TB, pid int) *Process {
	t.Helper()
	f, err := pidfd.Open(pid)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		t.Fatalf("watch process %d: %v", pid, err)
	}
	t.Cleanup(func() { f.Close() })
	return &Process{t: t, pid: pid, f: f}
}

// Exited reports whether the process has exited within d (0: by now).
func (p *Process) Exited(d time.Duration) bool {
	if p == nil {
		return true
	}
	if d <= 0 {
		return pidfd.Exited(p.f)
	}
	stop := make(chan struct{})
	timer := time.AfterFunc(d, func() { close(stop) })
	defer timer.Stop()
	return pidfd.Await(p.f, stop)
}

// Kill sends the process, watched while it ran (p not nil), SIGKILL.
func (p *Process) Kill() {
	p.t.Helper()
	sc, err := p.f.SyscallConn()
	if err == nil {
		cerr := sc.Control(func(fd uintptr) { err = unix.PidfdSendSignal(int(fd), unix.SIGKILL, nil, 0) })
		err = errors.Join(cerr, err)
	}
	if err != nil {
		p.t.Fatalf("kill process %d: %v", p.pid, err)
	}
}
