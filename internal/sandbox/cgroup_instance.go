package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A sandbox's groups are made below kilnd's own (Cgroups), in a group of
// its kilnd instance's: "kiln-INSTANCE" (v2, and each limited v1
// controller), so that the sandboxes of two kilnds that share a cgroup
// never share a parent, and each kilnd's are found, counted and ended
// together. A kilnd of no instance (a test's) and one older than
// instances made them in its own group directly.

// groupName is the name, relative to kilnd's own group, of sandbox id's
// groups, their instance's group made if it is missing.
func groupName(instance, id string) (string, error) {
	name := "kiln-" + id
	if instance == "" {
		return name, nil
	}
	if err := makeInstanceGroup(instance); err != nil {
		return "", err
	}
	return filepath.Join("kiln-"+instance, name), nil
}

// instanceDirs are the groups of instance: in kilnd's own v2 group, then
// (on a hybrid host) in each of its v1 groups of the controllers limits
// use. pure says the host is pure v2.
func instanceDirs(instance string) (dirs []string, pure bool, err error) {
	own2, own1, err := ownCgroups()
	if err != nil {
		return nil, false, fmt.Errorf("sandbox: read own cgroups: %w", err)
	}
	mount, pure := v2Mount()
	if mount == "" {
		return nil, false, errors.New("sandbox: no cgroup v2 hierarchy is mounted (needed to kill a sandbox's every process at once)")
	}
	v2 := filepath.Join(mount, own2)
	if pure {
		if v2, err = v2Parent(); err != nil {
			return nil, false, err
		}
	}
	name := "kiln-" + instance
	dirs = []string{filepath.Join(v2, name)}
	if !pure {
		for _, ctrl := range sandboxControllers {
			if own, ok := own1[ctrl]; ok {
				dirs = append(dirs, filepath.Join(cgroupRoot, ctrl, own, name))
			}
		}
	}
	return dirs, pure, nil
}

// instanceGroup is the v2 group of instance, which holds a group for each
// of its sandboxes; empty if there is none to be had.
func instanceGroup(instance string) string {
	dirs, _, err := instanceDirs(instance)
	if err != nil {
		return ""
	}
	return dirs[0]
}

// makeInstanceGroup makes the groups of instance; on a pure v2 host it
// enables for their children the controllers kilnd's group enables for
// it.
func makeInstanceGroup(instance string) error {
	dirs, pure, err := instanceDirs(instance)
	if err != nil {
		return err
	}
	for _, dir := range dirs {
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("sandbox: make the instance's cgroup: %w", err)
		}
	}
	if pure {
		enable := "+" + strings.Join(sandboxControllers, " +")
		if err := os.WriteFile(filepath.Join(dirs[0], "cgroup.subtree_control"), []byte(enable), 0); err != nil {
			return fmt.Errorf("sandbox: cgroup v2: enable %s in the instance's cgroup: %w", enable, err)
		}
	}
	return nil
}

// removeInstanceGroup removes the groups of instance if no sandbox's are
// left in them (a kilnd that stops leaves its running sandboxes' there,
// and the groups with them).
func removeInstanceGroup(instance string) {
	if instance == "" {
		return
	}
	dirs, _, err := instanceDirs(instance)
	if err != nil {
		return
	}
	for _, dir := range dirs {
		unix.Rmdir(dir) // refused while a sandbox's group is in it
	}
}

// endLeftover ends the groups a create of sandbox id interrupted by a
// crash left, wherever its kilnd made them: in its instance's group, or
// (a kilnd older than instances) in its own.
func endLeftover(instance, id string) error {
	var errs []error
	if instance != "" {
		errs = append(errs, EndLeftover(filepath.Join("kiln-"+instance, "kiln-"+id)))
	}
	return errors.Join(append(errs, EndLeftover("kiln-"+id))...)
}
