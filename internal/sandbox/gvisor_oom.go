package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Out of memory, a gVisor sandbox ends as a whole.
//
// The host's memory group of a gVisor sandbox holds the whole runtime:
// runsc, gVisor's kernel (the sentry, whose memory file holds every page
// of the sandbox's processes and files), its file server, and one stub
// process of the host's per process inside. gVisor has no out-of-memory
// killer of its own, so past the limit the host's picks one of those, by
// how much of the memory file each has mapped: a stub, and then one
// process inside dies by SIGKILL, not told apart from a kill sent; the
// sentry, and then the whole sandbox does; a stub again and again when
// what fills the memory is a file in /tmp or /dev/shm, which no process
// holds. The agent runs on the sentry, within that limit: it cannot be kept
// out of the killer's reach as the namespace backend's agent is. So the
// only outcome the host can promise is the whole sandbox ending, and
// kilnd makes it the only one: on a pure v2 host the kernel kills the
// group as a whole (memory.oom.group); on a hybrid one kilnd, woken by
// the kernel's out-of-memory event, kills every process of the sandbox.
// The sandbox is then stopped with the reason ExitReason gives.

// oomName is the file in a gVisor sandbox's directory saying kilnd ended
// it for its memory, so that a kilnd restarted since knows why.
const oomName = "out-of-memory"

// oomGroup makes the kernel end every process of the sandbox's limited
// memory group at once when it is out of memory, on a pure v2 host; on a
// hybrid host, whose v1 groups have no such setting, AwaitExit does.
func (c *Cgroups) oomGroup() error {
	if !c.Leaves || !memoryLimited(c.procsDir2()) {
		return nil
	}
	if err := os.WriteFile(filepath.Join(c.procsDir2(), "memory.oom.group"), []byte("1"), 0); err != nil {
		return fmt.Errorf("sandbox: set memory.oom.group: %w", err)
	}
	return nil
}

// AwaitExit implements Instance. While it waits, on a hybrid host, it
// watches the sandbox's limited memory group, and when the kernel finds
// it out of memory it ends the whole sandbox (see above): at once, if
// that happened while nobody watched (kilnd was restarting).
func (s *guestSandbox) AwaitExit(stop <-chan struct{}) {
	ev, err := s.oomEvents()
	if err != nil || ev == nil {
		s.Sandbox.AwaitExit(stop)
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		// Out of memory while nobody watched, or an event: the kernel
		// began to handle it (before it picks what to kill, so nothing is
		// to be read yet but the event), or the group was removed. A read
		// error: ev was closed.
		if !s.killedForMemory() {
			var b [8]byte
			if _, err := ev.Read(b[:]); err != nil {
				return
			}
			if _, err := os.Stat(s.Cgroups.MemoryProcs); err != nil {
				return
			}
		}
		os.WriteFile(filepath.Join(s.Dir, oomName), nil, 0o600)
		s.Cgroups.Kill(10 * time.Second)
	})
	s.Sandbox.AwaitExit(stop)
	ev.Close()
	wg.Wait()
}

// oomEvents returns an eventfd the kernel signals when the sandbox's v1
// memory group is out of memory (and when the group is removed); nil
// where there is none (no memory limit, or a v2 host).
func (s *guestSandbox) oomEvents() (*os.File, error) {
	if s.Cgroups == nil || s.Cgroups.MemoryProcs == "" {
		return nil, nil
	}
	dir := s.Cgroups.MemoryProcs
	ctl, err := os.Open(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("sandbox: eventfd: %w", err)
	}
	// Nonblocking: the file reads in the runtime's poller, and Close ends
	// a read.
	ev := os.NewFile(uintptr(efd), "oom events")
	req := strconv.Itoa(efd) + " " + strconv.Itoa(int(ctl.Fd()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(req), 0); err != nil {
		ev.Close()
		return nil, fmt.Errorf("sandbox: watch for out of memory: %w", err)
	}
	return ev, nil
}

// killedForMemory reports whether the kernel has killed in the
// sandbox's v1 memory group for want of memory.
func (s *guestSandbox) killedForMemory() bool {
	b, err := os.ReadFile(filepath.Join(s.Cgroups.MemoryProcs, "memory.oom_control"))
	return err == nil && EventIn(b, "oom_kill") > 0
}

// ExitReason implements Instance: whether the sandbox ended for its
// memory (see above).
func (s *guestSandbox) ExitReason() string {
	_, err := os.Stat(filepath.Join(s.Dir, oomName))
	if err != nil && (s.Cgroups == nil || s.Cgroups.OOMKills() == 0) {
		return ""
	}
	return "out of memory: past its memory limit, the gVisor sandbox was ended as a whole"
}
