package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// kilndLeaf is the group kilnd's own processes move into on a pure v2
// host: the group it was started in then holds no process, so it can
// enable controllers for the sandboxes' groups beside the leaf. A kilnd
// started in a leaf of that name (by another kilnd, or as this one's
// restart in place) keeps it, and its sandboxes go beside it.
const kilndLeaf = "kilnd"

// sandboxControllers are what kilnd enables for its sandboxes' groups.
var sandboxControllers = []string{"memory", "pids", "cpu"}

// prepared is PrepareCgroups's result, made once per process: where, on a
// pure v2 host, the sandboxes' groups are made.
var prepared struct {
	once   sync.Once
	parent string
	err    error
}

// PrepareCgroups readies this process, kilnd, to make its sandboxes'
// groups, and says clearly why it cannot. On a pure v2 host it moves
// itself into the leaf kilndLeaf of its own group and enables the memory,
// pids and cpu controllers there, which needs that group delegated to it
// (under systemd: Delegate=yes). On a hybrid host it does nothing: the
// limits are on v1, the sandboxes' v2 groups need no controller. Later
// calls return the first's result; creating a sandbox calls it too.
func PrepareCgroups() error {
	if _, pure := v2Mount(); !pure {
		return nil
	}
	_, err := v2Parent()
	return err
}

// v2Parent is the group the sandboxes' v2 groups are made in, on a pure
// v2 host, with the controllers enabled.
func v2Parent() (string, error) {
	prepared.once.Do(func() { prepared.parent, prepared.err = prepareV2() })
	return prepared.parent, prepared.err
}

func prepareV2() (string, error) {
	mount, _ := v2Mount()
	own, _, err := ownCgroups()
	if err != nil {
		return "", fmt.Errorf("sandbox: read own cgroups: %w", err)
	}
	dir := filepath.Join(mount, own)
	if filepath.Base(dir) == kilndLeaf && dir != mount {
		parent := filepath.Dir(dir)
		if len(notEnabled(parent, sandboxControllers)) == 0 {
			return parent, nil
		}
	}
	if missing := missingControllers(dir, sandboxControllers); len(missing) > 0 {
		return "", fmt.Errorf("sandbox: cgroup v2: kilnd's cgroup %s is not given the %s controller(s) (cgroup.controllers): "+
			"they must be delegated to it: run kilnd as a systemd service with Delegate=yes, "+
			"or in a delegated scope (systemd-run --scope -p Delegate=yes kilnd)", dir, strings.Join(missing, ", "))
	}
	leaf := filepath.Join(dir, kilndLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("sandbox: cgroup v2: make kilnd's leaf: %w (is kilnd's cgroup %s delegated to it? under systemd: Delegate=yes)", err, dir)
	}
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte("0"), 0); err != nil {
		return "", fmt.Errorf("sandbox: cgroup v2: move kilnd into %s: %w (is kilnd's cgroup delegated to it? under systemd: Delegate=yes)", leaf, err)
	}
	enable := "+" + strings.Join(sandboxControllers, " +")
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(enable), 0); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return "", fmt.Errorf("sandbox: cgroup v2: enable %s in %s: other processes share kilnd's cgroup, and a v2 group with "+
				"controllers for its children holds no process: give kilnd a cgroup of its own, delegated "+
				"(a systemd service with Delegate=yes, or systemd-run --scope -p Delegate=yes kilnd)", enable, dir)
		}
		return "", fmt.Errorf("sandbox: cgroup v2: enable %s in %s: %w (is it delegated to kilnd? under systemd: Delegate=yes)", enable, dir, err)
	}
	return dir, nil
}

// missingControllers lists those of want that the v2 group dir cannot
// use: not in its cgroup.controllers, which its parent's subtree_control
// fills.
func missingControllers(dir string, want []string) []string {
	return absent(dir, "cgroup.controllers", want)
}

// notEnabled lists those of want that the v2 group dir does not enable
// for its children (cgroup.subtree_control).
func notEnabled(dir string, want []string) []string {
	return absent(dir, "cgroup.subtree_control", want)
}

// absent lists those of want not in dir's controllers list file.
func absent(dir, file string, want []string) []string {
	b, _ := os.ReadFile(filepath.Join(dir, file))
	have := strings.Fields(string(b))
	var missing []string
	for _, c := range want {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	return missing
}
