// A sandbox's image, id-mapped into its range on the host: the layers and
// the user namespace a helper holds while they are mapped.

package sandbox

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/rootfs"
	"golang.org/x/sys/unix"
)

// holderEnv makes kilnd's binary the user-namespace holder (see idmapped).
const holderEnv = "KILN_USERNS_HOLDER"

// IsHolder reports whether kilnd's binary was started to hold a user
// namespace while kilnd id-maps an image's layers (HoldUserns).
func IsHolder() bool { return os.Getenv(holderEnv) != "" }

// HoldUserns serves holderEnv: it holds the user namespace it was started
// in until kilnd closes its standard input. It never returns.
func HoldUserns() {
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// lowers are the directories of o's root filesystem, the top one first,
// each checked to be one; none for the host's system directories.
func (o Options) lowers() ([]string, error) {
	lowers := o.Layers
	if o.Rootfs != "" {
		lowers = []string{o.Rootfs}
	}
	if len(lowers) > maxLayers {
		return nil, fmt.Errorf("sandbox: %d layers, at most %d", len(lowers), maxLayers)
	}
	for _, l := range lowers {
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("sandbox: rootfs %s is not a directory", l)
		}
	}
	return lowers, nil
}

// maxLayers bounds an image's layers (an image store's own bound).
const maxLayers = 128

// lowerName names the mount point of layer i (from the top) in a
// sandbox's directory.
func lowerName(i int) string {
	if i == 0 {
		return "lower"
	}
	return "lower." + strconv.Itoa(i)
}

// idmapped returns dirs as detached mounts whose owners are shifted into
// the sandbox's range, uid 0 becoming base: the sandbox's root owns what
// the image's root owns.
func idmapped(exe string, dirs []string, base int) (trees []*os.File, err error) {
	ns, done, err := holdUserns(exe, []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: handoff.IDRange}})
	if err != nil {
		return nil, err
	}
	defer done()
	defer func() {
		if err != nil {
			for _, t := range trees {
				t.Close()
			}
			trees = nil
		}
	}()
	for _, dir := range dirs {
		fd, err := rootfs.IDMapTree(dir, int(ns.Fd()))
		if err != nil {
			return nil, err
		}
		trees = append(trees, os.NewFile(uintptr(fd), "rootfs"))
	}
	return trees, nil
}

// shiftDisk id-maps o's disk, a copy of another sandbox's whose files
// the range from o.DiskIDs owns, into the sandbox's own range: what that
// sandbox's root owned, this one's root owns, and what it writes is
// written as the disk's own owners, whichever sandbox mounts it next.
// Host root's files on it (its file system's own) stay host root's.
// Nothing to do for a disk of the sandbox's own range.
func shiftDisk(exe string, o Options) error {
	if o.Disk == nil || o.DiskIDs == 0 || o.DiskIDs == o.UIDBase {
		return nil
	}
	ns, done, err := holdUserns(exe, []syscall.SysProcIDMap{
		{ContainerID: 0, HostID: 0, Size: 1},
		{ContainerID: o.DiskIDs, HostID: o.UIDBase, Size: handoff.IDRange},
	})
	if err != nil {
		return fmt.Errorf("sandbox: shift its disk's owners: %w", err)
	}
	defer done()
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())}
	if err := unix.MountSetattr(int(o.Disk.Fd()), "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("sandbox: shift its disk's owners: %w", err)
	}
	return nil
}

// holdUserns starts a short-lived helper (this binary) in a new user
// namespace of the given id mappings (uids and gids alike) and returns
// that namespace, held until done is called.
func holdUserns(exe string, maps []syscall.SysProcIDMap) (ns *os.File, done func(), err error) {
	holder := exec.Command(exe)
	holder.Env = []string{holderEnv + "=1"}
	in, err := holder.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER, UidMappings: maps, GidMappings: maps}
	if err := holder.Start(); err != nil {
		return nil, nil, fmt.Errorf("user namespace holder: %w", err)
	}
	stop := func() {
		in.Close()
		holder.Wait()
	}
	ns, err = os.Open(fmt.Sprintf("/proc/%d/ns/user", holder.Process.Pid))
	if err != nil {
		stop()
		return nil, nil, err
	}
	return ns, func() { ns.Close(); stop() }, nil
}
