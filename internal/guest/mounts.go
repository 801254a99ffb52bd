// The caller's host directories, bound into the sandbox's root.

package guest

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/handoff"
)

// bindMounts moves the detached mounts kilnd handed over (handoff.FDMounts
// on, their attributes set) onto their targets in root, in order, before
// the agent moves into it. No sandboxed process runs yet, and none could
// take a mount away later: the mounts belong to the agent's mount
// namespace, whose owner is the host's user namespace.
func bindMounts(root string, mounts []handoff.Mount, owner int) error {
	if len(mounts) == 0 {
		return nil
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the root: %w", err)
	}
	defer unix.Close(rfd)
	for i, m := range mounts {
		tree := handoff.FDMounts + i
		dir, err := mountPoint(rfd, m.Target, owner)
		if err == nil {
			err = unix.MoveMount(tree, "", dir, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
			unix.Close(dir)
		}
		unix.Close(tree)
		if err != nil {
			return fmt.Errorf("mount at %s: %w", m.Target, err)
		}
	}
	return nil
}

// mountPoint opens the directory target (absolute, clean) in the root
// rfd, resolved as the sandbox will resolve it: a symbolic link on the
// way, which the sandbox's files may hold (its workspace, an image's
// layers), is followed within the root, never out of it. What is missing
// of it is made, mode 0755, owned by owner (the sandbox's root).
func mountPoint(rfd int, target string, owner int) (int, error) {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	parts := strings.Split(strings.TrimPrefix(target, "/"), "/")
	parent, err := unix.Openat2(rfd, ".", &how)
	if err != nil {
		return -1, err
	}
	for i, name := range parts {
		path := strings.Join(parts[:i+1], "/")
		fd, err := unix.Openat2(rfd, path, &how)
		if errors.Is(err, unix.ENOENT) {
			// Made in the directory its parent resolved to; a link that
			// leads nowhere is refused rather than followed.
			err = unix.Mkdirat(parent, name, 0o755)
			if err == nil {
				err = unix.Fchownat(parent, name, owner, owner, unix.AT_SYMLINK_NOFOLLOW)
			}
			if err == nil {
				fd, err = unix.Openat2(rfd, path, &how)
			}
		}
		unix.Close(parent)
		if err != nil {
			return -1, err
		}
		parent = fd
	}
	return parent, nil
}
