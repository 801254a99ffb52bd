package process

import (
	"os"
	"strconv"
	"sync"

	"github.com/sandkiln/sandkiln/internal/procfs"
	"golang.org/x/sys/unix"
)

// owned holds the pids of this process's children that a Process started
// and whose reaper has not waited for them yet. Start holds the lock from
// before the fork until the pid is recorded, so ReapOrphans never sees an
// owned child it does not know.
var owned = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

// ReapOrphans waits for every exited child of this process that no Process
// owns, and returns how many. A process that adopts orphans (a sandbox's
// PID 1, or a subreaper) calls it on every SIGCHLD; the children a Process
// started are left to that Process's reaper, whose exit report depends on
// being the one to wait.
func ReapOrphans() int {
	owned.Lock()
	defer owned.Unlock()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || owned.pids[pid] {
			continue
		}
		ppid, zombie := parentAndState(pid)
		if ppid != self || !zombie {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			n++
		}
	}
	return n
}

// parentAndState reads /proc/PID/stat: the parent's pid and whether the
// process is a zombie.
func parentAndState(pid int) (int, bool) {
	_, f, err := procfs.Stat(pid)
	if err != nil || len(f) < 2 {
		return 0, false
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid, f[0] == "Z"
}

// Own starts a child of this process with start and keeps ReapOrphans
// from waiting for it: the caller waits for it (Process.Wait), then calls
// release.
func Own(start func() (*os.Process, error)) (p *os.Process, release func(), err error) {
	owned.Lock()
	defer owned.Unlock()
	if p, err = start(); err != nil {
		return nil, nil, err
	}
	owned.pids[p.Pid] = true
	return p, func() {
		owned.Lock()
		delete(owned.pids, p.Pid)
		owned.Unlock()
	}, nil
}
