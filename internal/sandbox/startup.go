package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/handoff"
)

// startup is what the two backends' Create share of a sandbox's start-up:
// its directory and the directories in it, the cgroups, the agent's log,
// and the undoing of all of it if the start fails. Each backend adds its
// own steps: its root file system, how the agent gets its handles (the
// namespace backend's inherits descriptors, gVisor's finds paths in its
// container), and the room its limits need.
type startup struct {
	o Options
	// undo is what to undo, in reverse order, if the start fails.
	undo []func()
}

// begin makes the sandbox's directory, and in it the directories names;
// a sandbox started again (Options.Restart) has them from its first
// start. What the earlier agent left that would stand in the new one's
// way goes: its API socket, and its init command's exit.
func begin(o Options, names ...string) (*startup, error) {
	again := o.Restart != nil
	if _, err := mkdir(o.Dir, 0o700, again); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s := &startup{o: o}
	for _, d := range names {
		if _, err := mkdir(filepath.Join(o.Dir, d), 0o700, again); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
	}
	if again {
		for _, dir := range append([]string{""}, names...) {
			sock := filepath.Join(o.Dir, dir, SocketName)
			if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("sandbox: the earlier agent's socket: %w", err)
			}
		}
		// The init command's exit is the new agent's to record.
		if err := os.Remove(filepath.Join(o.Dir, LogsName, handoff.InitExitName)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("sandbox: the earlier init command's exit: %w", err)
		}
	}
	return s, nil
}

// mkdir makes directory path with mode; again (a sandbox started again,
// Options.Restart), a directory there already, made by its earlier start,
// is taken as it is, and made says which. A symbolic link is never taken.
func mkdir(path string, mode os.FileMode, again bool) (made bool, err error) {
	err = os.Mkdir(path, mode)
	if again && errors.Is(err, os.ErrExist) {
		if fi, lerr := os.Lstat(path); lerr == nil && fi.IsDir() {
			return false, nil
		}
	}
	return err == nil, err
}

// onFailure adds f to what is undone if the start fails.
func (s *startup) onFailure(f func()) { s.undo = append(s.undo, f) }

// end undoes the start if it failed (*err is not nil). Deferred.
func (s *startup) end(err *error) {
	if *err == nil {
		return
	}
	for i := len(s.undo) - 1; i >= 0; i-- {
		s.undo[i]()
	}
}

// cgroups makes the sandbox's groups in kilnd instance's, with the limits
// lim (the sandbox's, and what its runtime needs beyond them), set to end
// the sandbox as a whole out of memory if endOnOOM; forget, if set, runs
// between their processes' end and their removal when the start fails.
func (s *startup) cgroups(instance string, lim Limits, endOnOOM bool, forget func()) (*Cgroups, error) {
	group, err := groupName(instance, s.o.ID)
	if err != nil {
		return nil, err
	}
	cg, err := newCgroups(group, lim)
	if err != nil {
		return nil, err
	}
	s.onFailure(func() {
		cg.Kill(5 * time.Second)
		if forget != nil {
			forget()
		}
		cg.Destroy()
	})
	if endOnOOM {
		if err := cg.oomGroup(); err != nil {
			return nil, err
		}
	}
	return cg, nil
}

// agentLog opens the log the agent (or the runtime) writes its own
// output to, in the sandbox's directory. The caller closes it once the
// agent has its copy.
func (s *startup) agentLog() (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(s.o.Dir, agentLogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	return f, nil
}

// withDefaults is o with the hostname and the wait for the agent (ready)
// that a request leaves out.
func (o Options) withDefaults(ready time.Duration) Options {
	if o.Hostname == "" {
		o.Hostname = DefaultHostname(o.ID)
	}
	if o.Ready == 0 {
		o.Ready = ready
	}
	return o
}
