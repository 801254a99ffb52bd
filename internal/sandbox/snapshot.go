// Snapshots of a sandbox's disk: its image copied while its file system
// is frozen, by sharing extents where the host's file system can, and
// mounted again for another sandbox with its owners shifted into that
// sandbox's range.

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The file system freeze ioctls (linux/fs.h): _IOWR('X', 119 and 120, int).
const (
	fiFreeze = 0xc0045877
	fiThaw   = 0xc0045878
)

// ErrNoDisk says a sandbox has no disk of its own: its writable layers
// are in its directory, and a snapshot has nothing to copy.
var ErrNoDisk = errors.New("the sandbox has no disk of its own")

// FreezeDisk freezes the file system of the sandbox's disk, whose image is
// image: what its processes wrote is on the image and stays as it is
// (their writes wait) until thaw is called. An instance that cannot reach
// its disk's file system, or finds another there, says so.
func FreezeDisk(inst Instance, image string) (thaw func() error, err error) {
	f, err := openDisk(inst)
	if err != nil {
		return nil, err
	}
	if err := onImage(f, image); err != nil {
		f.Close()
		return nil, err
	}
	if err := unix.IoctlSetInt(int(f.Fd()), fiFreeze, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: freeze its disk: %w", err)
	}
	return func() error {
		defer f.Close()
		if err := unix.IoctlSetInt(int(f.Fd()), fiThaw, 0); err != nil {
			return fmt.Errorf("sandbox: thaw its disk: %w", err)
		}
		return nil
	}, nil
}

// ThawDisk thaws the file system of the sandbox's disk, if it is frozen:
// a kilnd that stopped between FreezeDisk and its thaw left it so. It says
// whether it was frozen.
func ThawDisk(inst Instance, image string) bool {
	f, err := openDisk(inst)
	if err != nil {
		return false
	}
	defer f.Close()
	if onImage(f, image) != nil {
		return false
	}
	return unix.IoctlSetInt(int(f.Fd()), fiThaw, 0) == nil
}

// openDisk opens a directory on the file system of inst's disk, as the
// host sees it: gVisor's runtime has it mounted on the host; a namespace
// sandbox's is in its own mount namespace only, reached through its
// agent's root, where its workspace is.
func openDisk(inst Instance) (*os.File, error) {
	var path string
	switch s := inst.(type) {
	case *guestSandbox:
		if s.DiskMount == "" {
			return nil, ErrNoDisk
		}
		path = s.DiskMount
	case *Sandbox:
		path = "/proc/" + strconv.Itoa(s.PID) + "/root/" + WorkspaceName
	default:
		return nil, fmt.Errorf("sandbox: %T has no disk to freeze", inst)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: its disk: %w", err)
	}
	return os.NewFile(uintptr(fd), "disk"), nil
}

// onImage checks that f is on the loop device whose backing file is
// image: a sandbox may have mounted something else over its workspace.
func onImage(f *os.File, image string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("sandbox: its disk: %w", err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(st.Dev), unix.Minor(st.Dev)))
	backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
	if abs, err := filepath.Abs(image); err == nil {
		image = abs
	}
	if real, err := filepath.EvalSymlinks(image); err == nil {
		image = real
	}
	if err != nil || backing != image {
		return errors.New("sandbox: its workspace is not on its disk (something is mounted over it)")
	}
	return nil
}

// CloneFile makes dst, a new file, a copy of src: sharing src's extents
// where the file system can (FICLONE: XFS, btrfs), else copied in the
// kernel (copy_file_range), its holes left holes. It says whether the
// extents are shared. A failed clone leaves no dst.
func CloneFile(dst, src string) (shared bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return false, err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return false, err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return true, nil
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return false, err
	}
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return false, err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return false, err
		}
		for data < hole {
			roff, woff := data, data
			n, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(hole-data), 0)
			if err != nil {
				return false, err
			}
			if n == 0 {
				return false, fmt.Errorf("%s changed as it was copied", src)
			}
			data += int64(n)
		}
		off = hole
	}
	return false, nil
}

// Reflinks says whether files in dir can share extents (CloneFile's
// fast way), trying it on two files of its own.
func Reflinks(dir string) bool {
	src, err := os.CreateTemp(dir, ".reflink-")
	if err != nil {
		return false
	}
	defer os.Remove(src.Name())
	defer src.Close()
	if _, err := src.Write(make([]byte, 4096)); err != nil {
		return false
	}
	dst, err := os.CreateTemp(dir, ".reflink-")
	if err != nil {
		return false
	}
	defer os.Remove(dst.Name())
	defer dst.Close()
	return unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())) == nil
}

// FSName names the file system dir is on, as the kernel's magic says.
func FSName(dir string) string {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return "unknown"
	}
	switch st.Type {
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlay"
	}
	return "0x" + strconv.FormatInt(int64(st.Type), 16)
}

// Allocated is how many bytes of the host's disk path's blocks take.
func Allocated(path string) int64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// DiskAttached says whether image still backs a loop device: the file
// system on it may still be mounted, its last sandbox not quite gone.
func DiskAttached(image string) bool { return backedLoop(image) != "" }
