// Pausing a sandbox: its processes stopped where they are, their memory
// kept, none of them scheduled until it is resumed.
//
// A namespace sandbox freezes its procs group (cgroup v2's cgroup.freeze),
// which holds the spawner and every process the sandbox runs, and nothing
// else: the agent goes on. It holds each process's output and its
// watchers' connections; a watcher stays attached, is sent nothing while
// nothing is written, and after the resume reads on at the same offsets,
// since no byte was ever dropped by the pause (the processes are stopped
// before they write, never their output after). What needs a process of
// the sandbox to run (a start through the spawner, a files helper, an
// app's port) waits for the resume, and kilnd refuses it meanwhile.
//
// Every namespace sandbox has that group in the v2 hierarchy, on a hybrid
// host too (kilnd needs cgroup.kill, which came in Linux 5.14, after
// cgroup.freeze, in 5.2): v1's freezer is never needed. A sandbox made
// before its processes had a group apart from the agent's cannot be
// paused (ErrNotPausable).
//
// A gVisor sandbox is paused as runsc pause pauses it (gvisor_pause.go),
// which stops every task of gVisor's kernel, the agent among them: kilnd
// refuses every call for the agent meanwhile, and those it has open (an
// attached watcher's) wait.

package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/handoff"
)

// ErrNotPausable: the sandbox was made before its processes had a cgroup
// apart from its agent's, and cannot be frozen without it.
var ErrNotPausable = errors.New("sandbox: made before sandboxes could be paused (its processes share its agent's cgroup); stop and start it to pause it")

// freezeTimeout bounds the wait for a sandbox's every task to be frozen:
// a task in an uninterruptible wait (a slow disk, a hung FUSE server)
// freezes only once it leaves it.
const freezeTimeout = 10 * time.Second

// Pause implements Instance: the procs group is frozen.
func (s *Sandbox) Pause() error {
	if s.Cgroups == nil {
		return fmt.Errorf("sandbox: %s has no cgroups", s.ID)
	}
	return s.Cgroups.Freeze(freezeTimeout)
}

// Resume implements Instance: the procs group is thawed.
func (s *Sandbox) Resume() error {
	if s.Cgroups == nil {
		return fmt.Errorf("sandbox: %s has no cgroups", s.ID)
	}
	return s.Cgroups.Thaw()
}

// Freeze freezes every process of the sandbox's own (the procs group;
// the agent stays out) and returns once all of them are frozen, which
// cgroup.events says, watched for its change; within timeout, else it
// thaws them again and fails. A group frozen already stays so.
func (c *Cgroups) Freeze(timeout time.Duration) error {
	dir := c.procsDir2()
	if dir == "" {
		return ErrNotPausable
	}
	if err := setCgroup(dir, "cgroup.freeze", "1"); err != nil {
		return err
	}
	if err := awaitEvent(dir, "frozen", 1, timeout); err != nil {
		setCgroup(dir, "cgroup.freeze", "0")
		return err
	}
	return nil
}

// Thaw lets the procs group's processes run again. The kernel wakes them
// as the write returns: nothing is waited for.
func (c *Cgroups) Thaw() error {
	dir := c.procsDir2()
	if dir == "" {
		return ErrNotPausable
	}
	return setCgroup(dir, "cgroup.freeze", "0")
}

// Frozen reports whether the procs group is frozen (every task in it).
func (c *Cgroups) Frozen() bool {
	dir := c.procsDir2()
	if dir == "" {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	return err == nil && handoff.EventIn(b, "frozen") == 1
}

// awaitEvent waits until the v2 group dir's cgroup.events has key at
// value, or timeout has passed. The kernel tells of each change of the
// file as a modification, which an inotify descriptor reads in the
// runtime's poller; the watch is set before the first look, so that no
// change falls between the two. It tells of them at most once per 10 ms
// (CGROUP_FILE_NOTIFY_MIN_INTV), later for a change that comes sooner
// after the last, and a freeze takes a fraction of that: the file is
// read again, too, after waits that start at pollFirst and double, for a
// freeze that follows a thaw (a pause soon after a resume) not to wait
// out the kernel's interval.
func awaitEvent(dir, key string, value int64, timeout time.Duration) error {
	file := filepath.Join(dir, "cgroup.events")
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("sandbox: inotify: %w", err)
	}
	watch := os.NewFile(uintptr(fd), "cgroup events")
	defer watch.Close()
	if _, err := unix.InotifyAddWatch(fd, file, unix.IN_MODIFY); err != nil {
		return fmt.Errorf("sandbox: watch %s: %w", file, err)
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 4096)
	for wait := pollFirst; ; wait = min(2*wait, pollMost) {
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		if handoff.EventIn(b, key) == value {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: %s not %s %d after %v (a task in an uninterruptible wait?)", dir, key, value, timeout)
		}
		next := time.Now().Add(wait)
		if next.After(deadline) {
			next = deadline
		}
		watch.SetReadDeadline(next)
		if _, err := watch.Read(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("sandbox: watch %s: %w", file, err)
		}
	}
}

// The waits between two reads of cgroup.events while no change is told:
// the first, and the longest they double to.
const (
	pollFirst = 50 * time.Microsecond
	pollMost  = 5 * time.Millisecond
)

// Pause implements Instance: gVisor's kernel pauses every task of the
// sandbox, the agent's too, asked by kilnd itself (setPausedDirect) or,
// when that cannot be, by runsc pause. A sandbox paused already (runsc
// refuses to pause it again) is paused.
func (s *guestSandbox) Pause() error {
	if err := s.setPaused(true); err != nil {
		return err
	}
	s.paused.Store(true)
	return nil
}

// Resume implements Instance: gVisor's kernel resumes the sandbox, as
// Pause paused it. A sandbox that runs already is resumed.
func (s *guestSandbox) Resume() error {
	if err := s.setPaused(false); err != nil {
		return err
	}
	s.paused.Store(false)
	return nil
}

// setPaused pauses or resumes the sandbox's kernel: directly, else
// through runsc.
func (s *guestSandbox) setPaused(pause bool) error {
	err := s.setPausedDirect(pause)
	if !errors.Is(err, errNoFastPath) {
		return err
	}
	s.viaRunsc.Add(1)
	verb, want := "pause", runscPaused
	if !pause {
		verb, want = "resume", runscRunning
	}
	if err := s.runsc(verb, s.Container); err != nil {
		if st, serr := s.status(); serr != nil || st != want {
			return err
		}
	}
	return nil
}

// thaw resumes the sandbox if this kilnd paused it, or took it back
// paused: what ends it asks its agent first, which must run to answer.
func (s *guestSandbox) thaw() {
	if s.paused.Load() {
		s.Resume()
	}
}

// status is runsc's status of the container: "running", "paused",
// "stopped" or "created".
func (s *guestSandbox) status() (string, error) {
	out, err := s.runscOutput("state", s.Container)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("sandbox: runsc state: %w", err)
	}
	return st.Status, nil
}
