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
	parent := "kiln-" + instance
	if err := makeInstanceGroup(parent); err != nil {
		return "", err
	}
	return filepath.Join(parent, name), nil
}

// makeInstanceGroup makes the group of an instance, parent, in kilnd's own
// v2 group and in each of its v1 groups of the controllers limits use; on
// a pure v2 host it enables for its children the controllers kilnd's
// group enables for it.
func makeInstanceGroup(parent string) error {
	own2, own1, err := ownCgroups()
	if err != nil {
		return fmt.Errorf("sandbox: read own cgroups: %w", err)
	}
	mount, pure := v2Mount()
	if mount == "" {
		return errors.New("sandbox: no cgroup v2 hierarchy is mounted (needed to kill a sandbox's every process at once)")
	}
	v2 := filepath.Join(mount, own2)
	if pure {
		if v2, err = v2Parent(); err != nil {
			return err
		}
	}
	dirs := []string{filepath.Join(v2, parent)}
	if !pure {
		for _, ctrl := range sandboxControllers {
			if own, ok := own1[ctrl]; ok {
				dirs = append(dirs, filepath.Join(cgroupRoot, ctrl, own, parent))
			}
		}
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

// removeInstanceGroup removes the groups of instance if no sandbox's are
// left in them (a kilnd that stops leaves its running sandboxes' there,
// and the groups with them).
func removeInstanceGroup(instance string) {
	if instance == "" {
		return
	}
	own2, own1, err := ownCgroups()
	if err != nil {
		return
	}
	mount, pure := v2Mount()
	if mount == "" {
		return
	}
	v2 := filepath.Join(mount, own2)
	if pure {
		if v2, err = v2Parent(); err != nil {
			return
		}
	}
	dirs := []string{filepath.Join(v2, "kiln-"+instance)}
	for _, ctrl := range sandboxControllers {
		if own, ok := own1[ctrl]; ok && !pure {
			dirs = append(dirs, filepath.Join(cgroupRoot, ctrl, own, "kiln-"+instance))
		}
	}
	for _, dir := range dirs {
		unix.Rmdir(dir) // refused while a sandbox's group is in it
	}
}
