package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The host's uids are shared by every kilnd on it. Each kilnd instance
// claims a window of them, room for UIDWindow sandboxes' ranges, so that
// no two kilnds' sandboxes map to the same host users: their files,
// signals and per-user kernel limits would be shared.

// UIDWindow is how many sandboxes' uid ranges a window holds: the most
// sandboxes one kilnd runs at once.
const UIDWindow = 4096

// uidWindows is how many windows fit between DefaultUIDBase and the
// largest uid.
const uidWindows = 15

// UIDClaim is what a kilnd instance records of its window in the
// registry.
type UIDClaim struct {
	Instance string `json:"instance"`
	StateDir string `json:"state_dir"`
	Window   int    `json:"window"`
	// Cgroup is the instance's v2 group (see groupName): while a sandbox's
	// group is in it, its window is held though kilnd has stopped.
	Cgroup string `json:"cgroup"`
}

// First is the first host uid of the claim's window.
func (c UIDClaim) First() int { return DefaultUIDBase + c.Window*UIDWindow*IDRange }

// UIDRegistration is a running kilnd's claim of its window, which it
// holds (a shared lock on the claim's file) until Close.
type UIDRegistration struct {
	UIDClaim
	f *os.File
}

// Close ends kilnd's hold on its window; its sandboxes' groups hold it on.
func (r *UIDRegistration) Close() error { return r.f.Close() }

// ClaimUIDs claims a window of host uids for kilnd instance, on state
// directory stateDir, in the registry dir (made if missing): the window it
// had, if it is free (a restart keeps its sandboxes' users), else the
// first free one. Another instance's claim holds while its kilnd runs or
// a sandbox's group is in its instance's group; the others are forgotten.
func ClaimUIDs(dir, instance, stateDir string) (*UIDRegistration, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: uid registry: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sandbox: uid registry: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("sandbox: uid registry: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: uid registry: %w", err)
	}
	taken := map[int]string{}
	own := -1
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		var c UIDClaim
		if err == nil {
			err = json.Unmarshal(b, &c)
		}
		if err != nil || c.Instance != name || c.Window < 0 || c.Window >= uidWindows {
			continue // not a claim: left as it is
		}
		switch {
		case c.Instance == instance && c.StateDir == stateDir:
			own = c.Window
		case c.StateDir == stateDir || !claimHeld(path) && !hasGroups(c.Cgroup):
			os.Remove(path)
		default:
			taken[c.Window] = fmt.Sprintf("kilnd instance %q (state directory %s)", c.Instance, c.StateDir)
		}
	}
	me := UIDClaim{Instance: instance, StateDir: stateDir, Window: own, Cgroup: instanceGroup(instance)}
	if _, ok := taken[own]; ok || own < 0 {
		me.Window = -1
		for w := range uidWindows {
			if _, ok := taken[w]; !ok {
				me.Window = w
				break
			}
		}
		if me.Window < 0 {
			return nil, fmt.Errorf("sandbox: no free window of host uids: %d kilnds have them all", len(taken))
		}
	}
	f, err := writeUIDClaim(dir, me)
	if err != nil {
		return nil, err
	}
	return &UIDRegistration{UIDClaim: me, f: f}, nil
}

// claimHeld says whether the kilnd that made the claim at path still
// runs: it holds a shared lock on the file, and an exclusive one is
// refused.
func claimHeld(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil
}

// hasGroups says whether the group dir has a group in it.
func hasGroups(dir string) bool {
	if dir == "" {
		return false
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			return true
		}
	}
	return false
}

func writeUIDClaim(dir string, me UIDClaim) (*os.File, error) {
	b, err := json.Marshal(me)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, me.Instance+".json")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("sandbox: uid registry: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("sandbox: uid registry: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sandbox: uid registry: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: uid registry: %w", err)
	}
	return f, nil
}
