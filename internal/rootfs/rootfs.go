// Package rootfs builds what a sandbox's root file system is made of, on
// whichever side builds it: the host's system directories bound in, the
// files of /etc a sandbox has of its own, an image's layers id-mapped
// into the sandbox's range. The namespace backend's agent builds its root
// itself, inside (package guest); gVisor's is built by kilnd, on the host
// (package sandbox).
package rootfs

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// hostDirs are bound read-only from the host when no rootfs is given.
var hostDirs = []string{"usr", "etc", "bin", "lib", "lib64", "sbin"}

// HostDirs are the host's directories a sandbox without a root file
// system of its own has, read-only, each at its name below /.
func HostDirs() []string { return slices.Clone(hostDirs) }

// EachHostDir puts hostDirs in root: the same link where the host has a
// symbolic link (a merged /usr's /bin), bind(host, target) for a
// directory; one the host lacks is left out. A link root has already,
// the same, is kept (a root made again, for a sandbox started again).
func EachHostDir(root string, bind func(host, target string) error) error {
	for _, d := range hostDirs {
		host := "/" + d
		fi, err := os.Lstat(host)
		if err != nil {
			continue
		}
		target := filepath.Join(root, d)
		if fi.Mode()&os.ModeSymlink != 0 {
			link, err := os.Readlink(host)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				if had, rerr := os.Readlink(target); rerr != nil || had != link {
					return err
				}
			}
			continue
		}
		if err := bind(host, target); err != nil {
			return err
		}
	}
	return nil
}

// EtcFiles are the host's /etc files a sandbox on the host's system sees
// its own of instead: its users, its name, its network (loopback only and
// no resolver, or the resolvers given). The rest of /etc (the loader's cache, certificates,
// alternatives) is the host's, read-only, as the programs of /usr need.
func EtcFiles(hostname string, resolvers []string) [][2]string {
	resolv := "# This sandbox has no network beyond its loopback, and no resolver.\n"
	if len(resolvers) > 0 {
		resolv = resolvConf(resolvers)
	}
	return [][2]string{
		{"passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"},
		{"group", "root:x:0:\ntty:x:5:\nusers:x:100:\nnogroup:x:65534:\n"},
		{"hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + hostname + "\n"},
		{"hostname", hostname + "\n"},
		{"resolv.conf", resolv},
		{"nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n"},
		{"shadow", ""},
		{"gshadow", ""},
	}
}

// resolvConf names resolvers.
func resolvConf(resolvers []string) string {
	var b strings.Builder
	for _, r := range resolvers {
		b.WriteString("nameserver " + r + "\n")
	}
	return b.String()
}

// ImageResolvConf gives a sandbox with an image and a network its
// resolvers: /etc/resolv.conf written in its writable layer, the
// sandbox's root's to change, in place of whatever the image had there (a
// link included: resolved in root, it is not followed out of it).
func ImageResolvConf(root string, resolvers []string, owner int) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.MkdirAll("etc", 0o755); err != nil {
		return fmt.Errorf("/etc/resolv.conf: %w", err)
	}
	if fi, err := r.Lstat("etc/resolv.conf"); err == nil && !fi.Mode().IsRegular() {
		if err := r.RemoveAll("etc/resolv.conf"); err != nil {
			return fmt.Errorf("/etc/resolv.conf: %w", err)
		}
	}
	err = r.WriteFile("etc/resolv.conf", []byte(resolvConf(resolvers)), 0o644)
	if err == nil {
		err = r.Lchown("etc/resolv.conf", owner, owner)
	}
	if err != nil {
		return fmt.Errorf("/etc/resolv.conf: %w", err)
	}
	return nil
}

// FillLink writes content where link, a host /etc file's symbolic link
// seen in root, leads, if that is outside the directories bound from
// the host: in root's own tmpfs, which nothing of the host's is in.
func FillLink(root, link, content string) error {
	dest, err := os.Readlink(link)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(dest) {
		dest = filepath.Join("/etc", dest)
	}
	dest = filepath.Clean(dest)
	top, _, _ := strings.Cut(strings.TrimPrefix(dest, "/"), "/")
	if top == "" || slices.Contains(hostDirs, top) {
		return nil
	}
	p := filepath.Join(root, dest)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(content), 0o644)
}

// NeedsLoader reports whether the binary exe is linked dynamically (has an
// ELF interpreter), as a build with cgo is.
func NeedsLoader(exe *os.File) bool {
	f, err := elf.NewFile(io.NewSectionReader(exe, 0, 1<<62))
	if err != nil {
		return true
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// IDMapTree returns a detached copy of the mount tree at dir whose owners
// are shifted by the user namespace userns's mapping.
func IDMapTree(dir string, userns int) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return -1, fmt.Errorf("rootfs: %s: open_tree: %w", dir, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("rootfs: %s: id-map the mount: %w", dir, err)
	}
	return fd, nil
}

// BindTree returns a detached copy of the mount tree at the directory dir
// (a descriptor, O_PATH will do), as a bind mount of it is: nosuid and
// nodev all the way down, read-only too when readOnly, and private, so
// that no mount made later on either side reaches the other. Its owners
// are the host's, as they are: a sandbox's user namespace shows those
// outside its range as the overflow id, and grants its root no
// capability over their files.
func BindTree(dir *os.File, readOnly bool) (int, error) {
	fd, err := unix.OpenTree(int(dir.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("rootfs: open_tree: %w", err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("rootfs: mount_setattr: %w", err)
	}
	return fd, nil
}
