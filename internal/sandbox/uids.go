package sandbox

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/sandkiln/sandkiln/internal/claims"
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
	reg, err := claims.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: uids: %w", err)
	}
	defer reg.Close()
	all, err := reg.List()
	if err != nil {
		return nil, fmt.Errorf("sandbox: uids: %w", err)
	}
	taken := map[int]bool{}
	own := -1
	for _, f := range all {
		var c UIDClaim
		if json.Unmarshal(f.Data, &c) != nil || c.Instance != f.Name || c.Window < 0 || c.Window >= uidWindows {
			continue // not a claim: left as it is
		}
		switch {
		case c.Instance == instance && c.StateDir == stateDir:
			own = c.Window
		case c.StateDir == stateDir || !f.Held() && !hasGroups(c.Cgroup):
			reg.Remove(f)
		default:
			taken[c.Window] = true
		}
	}
	me := UIDClaim{Instance: instance, StateDir: stateDir, Window: own, Cgroup: instanceGroup(instance)}
	if own < 0 || taken[own] {
		me.Window = -1
		for w := range uidWindows {
			if !taken[w] {
				me.Window = w
				break
			}
		}
		if me.Window < 0 {
			return nil, fmt.Errorf("sandbox: no free window of host uids: %d kilnds have them all", len(taken))
		}
	}
	f, err := reg.Write(instance, me)
	if err != nil {
		return nil, fmt.Errorf("sandbox: uids: %w", err)
	}
	return &UIDRegistration{UIDClaim: me, f: f}, nil
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
