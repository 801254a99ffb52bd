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

// Out of memory, a sandbox ends as a whole, by default on both runtimes:
// every process, the agent with them, is killed at once, and the sandbox
// is stopped with the reason ExitReason gives. A namespace sandbox may
// instead lose only the process the kernel's killer picks (Options.
// EndOnOOM false), as a Docker container does; a gVisor sandbox may not.
//
// Why not in gVisor: the host's memory group of a gVisor sandbox holds
// the whole runtime: runsc, gVisor's kernel (the sentry, whose memory
// file holds every page of the sandbox's processes and files), its file
// server, and one stub process of the host's per process inside. gVisor
// has no out-of-memory killer of its own, so past the limit the host's
// picks one of those, by how much of the memory file each has mapped: a
// stub, and then one process inside dies by SIGKILL, not told apart from
// a kill sent; the sentry, and then the whole sandbox does; a stub again
// and again when what fills the memory is a file in /tmp or /dev/shm,
// which no process holds. The agent runs on the sentry, within that
// limit: it cannot be kept out of the killer's reach as the namespace
// backend's agent is. So the only outcome the host can promise is the
// whole sandbox ending.
//
// How: on a pure v2 host the kernel kills the limited group as a whole
// (memory.oom.group), and kilnd, woken by the change of its
// memory.events, kills the rest (a namespace sandbox's agent, outside
// that group); on a hybrid host, whose v1 groups have no such setting,
// kilnd, woken by the kernel's out-of-memory event, kills every process
// of the sandbox. One that ran out while kilnd was stopped is ended when
// kilnd is back.

// oomName is the file in a sandbox's directory saying kilnd ended it for
// its memory, so that a kilnd restarted since knows why.
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

// AwaitExit implements Instance: it returns once the agent has exited or
// stop is closed. While it waits, for a sandbox that ends out of memory,
// it watches the sandbox's limited memory group, and when the kernel
// finds it out of memory it ends the whole sandbox: at once, if that
// happened while nobody watched (kilnd was restarting).
func (s *Sandbox) AwaitExit(stop <-chan struct{}) {
	if !s.EndOnOOM || s.Cgroups == nil {
		s.awaitAgent(stop)
		return
	}
	ev, err := s.Cgroups.oomWatch()
	if err != nil || ev == nil {
		s.awaitAgent(stop)
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		// Out of memory while nobody watched, or an event: v1's when the
		// kernel began to handle it (before it picks what to kill, so
		// nothing is to be read yet but the event), v2's when a counter
		// changed; or the group was removed. A read error: ev was closed.
		for s.Cgroups.OOMKills() == 0 {
			var b [4096]byte
			if _, err := ev.Read(b[:]); err != nil {
				return
			}
			if s.Cgroups.MemoryProcs != "" {
				if _, err := os.Stat(s.Cgroups.MemoryProcs); err != nil {
					return
				}
				break // v1's event comes before the kill: it is enough
			}
		}
		os.WriteFile(filepath.Join(s.Dir, oomName), nil, 0o600)
		s.Cgroups.Kill(10 * time.Second)
	})
	s.awaitAgent(stop)
	ev.Close()
	wg.Wait()
}

// oomWatch returns a file whose reads return when the kernel finds the
// sandbox's limited memory group out of memory: on a hybrid host an
// eventfd the kernel signals (and when the group is removed), on a pure
// v2 host an inotify descriptor that reads an event each time the group's
// memory.events changes. Its reads block in the runtime's poller, and
// Close ends one. Nil without a memory limit.
func (c *Cgroups) oomWatch() (*os.File, error) {
	if c.MemoryProcs != "" {
		return c.oomEventfd()
	}
	if !c.Leaves || !memoryLimited(c.procsDir2()) {
		return nil, nil
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("sandbox: inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, filepath.Join(c.procsDir2(), "memory.events"), unix.IN_MODIFY); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sandbox: watch for out of memory: %w", err)
	}
	return os.NewFile(uintptr(fd), "oom events"), nil
}

// oomEventfd returns an eventfd the kernel signals when the sandbox's v1
// memory group is out of memory (and when the group is removed).
func (c *Cgroups) oomEventfd() (*os.File, error) {
	dir := c.MemoryProcs
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

// OOMReason is the reason a sandbox ended out of memory is stopped with.
const OOMReason = "out of memory: past its memory limit, the sandbox was ended as a whole"

// ExitReason implements Instance: whether the sandbox ended for its
// memory (see above). A sandbox that loses one process out of memory
// does not end for it: its agent is outside the limit.
func (s *Sandbox) ExitReason() string {
	if !s.EndOnOOM {
		return ""
	}
	_, err := os.Stat(filepath.Join(s.Dir, oomName))
	if err != nil && (s.Cgroups == nil || s.Cgroups.OOMKills() == 0) {
		return ""
	}
	return OOMReason
}
