package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// unpacked is what unpacking a layer found.
type unpacked struct {
	size    int64 // bytes of its regular files
	devices int   // device nodes skipped: a sandbox has its own /dev
}

// unpacker writes one layer's tar into an empty directory that only it
// writes to. The tar is untrusted and kilnd is root, so nothing may land
// outside the directory: every name is a clean relative path without
// "..", every parent of a member must be a directory this layer made (a
// member beneath a symlink is refused, never followed), and members are
// made with *at calls on a single component relative to a parent opened
// through root, never following a final symlink.
type unpacker struct {
	ctx  context.Context
	dir  string
	root *os.Root
	// dirs is the tree of directories made in the layer; every one of them
	// is a real directory, never a symlink.
	dirs *dirNode
	// whiteouts are the names this layer whited out; a directory made
	// later at one of them replaces what lower layers had there, so it is
	// made opaque rather than merged.
	whiteouts map[string]bool
	// times are the explicit directories' times, set once their contents
	// are written.
	times []dirTime
	// parent is the open directory parentName, the parent of the last
	// member: tars list a directory's members together.
	parentName string
	parent     *os.File
	entries    int
	u          unpacked
}

type dirNode struct{ children map[string]*dirNode }

type dirTime struct {
	name         string
	atime, mtime time.Time
}

// unpack writes the layer tar r into the empty directory dir.
func unpack(ctx context.Context, dir string, r io.Reader) (unpacked, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return unpacked{}, storeError(err, "unpack")
	}
	u := &unpacker{ctx: ctx, dir: dir, root: root, dirs: &dirNode{}, whiteouts: map[string]bool{}}
	defer u.close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return u.u, fmt.Errorf("%w: image: layer is not a valid tar: %w", errdefs.ErrInvalidArgument, err)
		}
		if u.entries++; u.entries > maxEntries {
			return u.u, fmt.Errorf("%w: image: layer has more than %d members", errdefs.ErrTooLarge, maxEntries)
		}
		if u.entries%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return u.u, err
			}
		}
		if err := u.member(hdr, tr); err != nil {
			return u.u, err
		}
	}
	return u.u, u.finish()
}

func (u *unpacker) close() {
	if u.parent != nil {
		u.parent.Close()
	}
	u.root.Close()
}

// memberName returns the clean form of a member's name (or a hard link's
// target), refusing what could leave the layer.
func memberName(n string) (string, error) {
	switch {
	case len(n) > maxNameLen:
		return "", fmt.Errorf("%w: image: layer member %.64q…: name longer than %d bytes", errdefs.ErrInvalidArgument, n, maxNameLen)
	case strings.HasPrefix(n, "/"):
		return "", fmt.Errorf("%w: image: layer member %q: absolute name", errdefs.ErrInvalidArgument, n)
	case strings.ContainsRune(n, 0):
		return "", fmt.Errorf("%w: image: layer member %q: NUL in name", errdefs.ErrInvalidArgument, n)
	}
	for c := range strings.SplitSeq(n, "/") {
		if c == ".." {
			return "", fmt.Errorf("%w: image: layer member %q: name has a \"..\"", errdefs.ErrInvalidArgument, n)
		}
	}
	return path.Clean(n), nil
}

func invalid(member, format string, args ...any) error {
	return fmt.Errorf("%w: image: layer member %q: %s", errdefs.ErrInvalidArgument, member, fmt.Sprintf(format, args...))
}

// storeError is a failure of the store's own filesystem while doing what:
// no space when it is full (ENOSPC, or a quota's EDQUOT), internal
// otherwise. Its cause names the store's paths, which kilnd logs and
// does not show a client.
func storeError(err error, what string, args ...any) error {
	class := errdefs.ErrInternal
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		class = errdefs.ErrNoSpace
	}
	return fmt.Errorf("%w: image: %s: %w", class, fmt.Sprintf(what, args...), err)
}

// fsError classes a failed system call on member: one the tar's content
// caused (a name too long, a file where a directory should be) is the
// layer's fault, anything else the store's (storeError).
func fsError(member string, err error) error {
	if errors.Is(err, unix.ENAMETOOLONG) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EEXIST) ||
		errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%w: image: layer member %q: %w", errdefs.ErrInvalidArgument, member, err)
	}
	return storeError(err, "layer member %q", member)
}

func (u *unpacker) member(hdr *tar.Header, r io.Reader) error {
	n, err := memberName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || int64(hdr.Uid) >= 1<<32-1 || int64(hdr.Gid) >= 1<<32-1 {
		return invalid(hdr.Name, "owner %d:%d out of range", hdr.Uid, hdr.Gid)
	}
	if dir := path.Dir(n); strings.HasPrefix(dir, ".wh..wh.") || strings.Contains(dir, "/.wh..wh.") {
		return nil // beneath aufs bookkeeping (.wh..wh.plnk and the like)
	}
	if base := path.Base(n); strings.HasPrefix(base, ".wh.") {
		return u.whiteout(hdr.Name, n)
	}
	if n == "." {
		if hdr.Typeflag != tar.TypeDir {
			return invalid(hdr.Name, "the layer's root is not a directory")
		}
		return u.rootDir(hdr)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.mkdir(hdr, n)
	case tar.TypeReg, tar.TypeCont:
		return u.file(hdr, n, r)
	case tar.TypeSymlink:
		return u.symlink(hdr, n)
	case tar.TypeLink:
		return u.link(hdr, n)
	case tar.TypeFifo:
		return u.fifo(hdr, n)
	case tar.TypeChar, tar.TypeBlock:
		u.u.devices++
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	}
	return invalid(hdr.Name, "unsupported type %q", hdr.Typeflag)
}

// openParent makes sure the parent directory of n exists, as a directory
// of this layer's tree, and returns it open.
func (u *unpacker) openParent(member, n string) (int, error) {
	dir := path.Dir(n)
	if u.parent != nil && u.parentName == dir && u.lookupDir(dir) {
		return int(u.parent.Fd()), nil
	}
	if err := u.ensureDir(member, dir); err != nil {
		return -1, err
	}
	f, err := u.root.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, fsError(member, err)
	}
	if u.parent != nil {
		u.parent.Close()
	}
	u.parent, u.parentName = f, dir
	return int(f.Fd()), nil
}

func (u *unpacker) lookupDir(dir string) bool {
	node := u.dirs
	if dir == "." {
		return true
	}
	for c := range strings.SplitSeq(dir, "/") {
		if node = node.children[c]; node == nil {
			return false
		}
	}
	return true
}

// ensureDir makes each missing directory of dir, as root:root 0755 as
// tar does, and refuses a component that exists as anything else.
func (u *unpacker) ensureDir(member, dir string) error {
	if dir == "." {
		return nil
	}
	node, at := u.dirs, ""
	for c := range strings.SplitSeq(dir, "/") {
		at = path.Join(at, c)
		if next := node.children[c]; next != nil {
			node = next
			continue
		}
		fi, err := u.root.Lstat(at)
		if err == nil && u.whiteouts[at] && fi.Mode()&os.ModeCharDevice != 0 {
			// This layer whited out at and now puts a directory there.
			if err := u.root.Remove(at); err != nil {
				return fsError(member, err)
			}
			err = os.ErrNotExist
		}
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := u.root.Mkdir(at, 0o700); err != nil {
				return fsError(member, err)
			}
			if err := u.root.Chmod(at, 0o755); err != nil {
				return fsError(member, err)
			}
			if u.whiteouts[at] {
				if err := u.setOpaque(member, at); err != nil {
					return err
				}
			}
		case err != nil:
			return fsError(member, err)
		case fi.Mode()&os.ModeSymlink != 0:
			return invalid(member, "beneath the symlink %s", at)
		case !fi.IsDir():
			return invalid(member, "beneath %s, not a directory", at)
		}
		node = node.add(c)
	}
	return nil
}

func (d *dirNode) add(c string) *dirNode {
	if d.children == nil {
		d.children = map[string]*dirNode{}
	}
	next := d.children[c]
	if next == nil {
		next = &dirNode{}
		d.children[c] = next
	}
	return next
}

// forgetDir drops dir and everything beneath it from the tree.
func (u *unpacker) forgetDir(dir string) {
	parent := u.dirs
	parts := strings.Split(dir, "/")
	for _, c := range parts[:len(parts)-1] {
		if parent = parent.children[c]; parent == nil {
			return
		}
	}
	delete(parent.children, parts[len(parts)-1])
}

// clear makes way at n (in the open parent pfd) for a new member, as tar
// does, the later member winning: what is there is removed, but for a
// directory when the new member is one too (which says whether it was).
// A symlink is removed itself, never followed.
func (u *unpacker) clear(member string, pfd int, n string, keepDir bool) (isDir bool, err error) {
	base := path.Base(n)
	var st unix.Stat_t
	err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fsError(member, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(pfd, base, 0); err != nil {
			return false, fsError(member, err)
		}
		return false, nil
	}
	if keepDir {
		return true, nil
	}
	u.forgetDir(n)
	if err := u.root.RemoveAll(n); err != nil {
		return false, fsError(member, err)
	}
	return false, nil
}

// own gives the member n (in pfd) the tar's owner (the image's own ids:
// kilnd maps them into a sandbox's range when it mounts the layer) and
// times, and, unless it is a symlink, mode, after the owner since a chown
// clears setuid.
func (u *unpacker) own(member string, pfd int, n string, hdr *tar.Header, mode bool) error {
	base := path.Base(n)
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fsError(member, err)
	}
	if mode {
		if err := unix.Fchmodat(pfd, base, uint32(hdr.Mode&0o7777), 0); err != nil {
			return fsError(member, err)
		}
	}
	if err := unix.UtimesNanoAt(pfd, base, timespecs(hdr.AccessTime, hdr.ModTime), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fsError(member, err)
	}
	return nil
}

func timespecs(atime, mtime time.Time) []unix.Timespec {
	if atime.IsZero() {
		atime = mtime
	}
	return []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
}

// rootDir gives the layer's root the attributes of the tar's "./".
func (u *unpacker) rootDir(hdr *tar.Header) error {
	if err := os.Lchown(u.dir, hdr.Uid, hdr.Gid); err != nil {
		return fsError(hdr.Name, err)
	}
	if err := unix.Chmod(u.dir, uint32(hdr.Mode&0o7777)); err != nil {
		return fsError(hdr.Name, err)
	}
	u.times = append(u.times, dirTime{".", hdr.AccessTime, hdr.ModTime})
	return nil
}

func (u *unpacker) mkdir(hdr *tar.Header, n string) error {
	pfd, err := u.openParent(hdr.Name, n)
	if err != nil {
		return err
	}
	existed, err := u.clear(hdr.Name, pfd, n, true)
	if err != nil {
		return err
	}
	if !existed {
		if err := unix.Mkdirat(pfd, path.Base(n), 0o700); err != nil {
			return fsError(hdr.Name, err)
		}
		if u.whiteouts[n] {
			if err := u.setOpaque(hdr.Name, n); err != nil {
				return err
			}
		}
	}
	u.dirs.addPath(n)
	if err := u.own(hdr.Name, pfd, n, hdr, true); err != nil {
		return err
	}
	u.times = append(u.times, dirTime{n, hdr.AccessTime, hdr.ModTime})
	return nil
}

func (d *dirNode) addPath(n string) {
	for c := range strings.SplitSeq(n, "/") {
		d = d.add(c)
	}
}

func (u *unpacker) file(hdr *tar.Header, n string, r io.Reader) error {
	if u.u.size+hdr.Size > maxLayerBytes {
		return fmt.Errorf("%w: image: layer unpacks to more than %d bytes", errdefs.ErrTooLarge, int64(maxLayerBytes))
	}
	pfd, err := u.openParent(hdr.Name, n)
	if err != nil {
		return err
	}
	if _, err := u.clear(hdr.Name, pfd, n, false); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, path.Base(n), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fsError(hdr.Name, err)
	}
	f := os.NewFile(uintptr(fd), n)
	written, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil && cerr != nil {
		return fsError(hdr.Name, cerr)
	}
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) && pe.Path == n {
			return fsError(hdr.Name, err)
		}
		// The tar's stream failed; its caller knows why.
		return fmt.Errorf("%w: image: layer member %q: %w", errdefs.ErrInvalidArgument, hdr.Name, err)
	}
	u.u.size += written
	return u.own(hdr.Name, pfd, n, hdr, true)
}

func (u *unpacker) symlink(hdr *tar.Header, n string) error {
	// The target is any text: it is resolved in the sandbox, never here.
	if hdr.Linkname == "" || len(hdr.Linkname) > maxNameLen || strings.ContainsRune(hdr.Linkname, 0) {
		return invalid(hdr.Name, "symlink target %.64q", hdr.Linkname)
	}
	pfd, err := u.openParent(hdr.Name, n)
	if err != nil {
		return err
	}
	if _, err := u.clear(hdr.Name, pfd, n, false); err != nil {
		return err
	}
	if err := unix.Symlinkat(hdr.Linkname, pfd, path.Base(n)); err != nil {
		return fsError(hdr.Name, err)
	}
	return u.own(hdr.Name, pfd, n, hdr, false)
}

// link makes a hard link to an earlier regular file of this layer: since
// the layer started empty, a regular file in it is one the layer wrote.
func (u *unpacker) link(hdr *tar.Header, n string) error {
	target, err := memberName(hdr.Linkname)
	if err != nil {
		return invalid(hdr.Name, "hard link target %.64q leaves the layer", hdr.Linkname)
	}
	if target == n || target == "." {
		return invalid(hdr.Name, "hard link to %q", hdr.Linkname)
	}
	if !u.lookupDir(path.Dir(target)) {
		return invalid(hdr.Name, "hard link target %q is not an earlier file of the layer", hdr.Linkname)
	}
	fi, err := u.root.Lstat(target)
	if err != nil || !fi.Mode().IsRegular() {
		return invalid(hdr.Name, "hard link target %q is not an earlier file of the layer", hdr.Linkname)
	}
	pfd, err := u.openParent(hdr.Name, n)
	if err != nil {
		return err
	}
	if _, err := u.clear(hdr.Name, pfd, n, false); err != nil {
		return err
	}
	if err := u.root.Link(target, n); err != nil {
		return fsError(hdr.Name, err)
	}
	return nil
}

func (u *unpacker) fifo(hdr *tar.Header, n string) error {
	pfd, err := u.openParent(hdr.Name, n)
	if err != nil {
		return err
	}
	if _, err := u.clear(hdr.Name, pfd, n, false); err != nil {
		return err
	}
	if err := unix.Mknodat(pfd, path.Base(n), unix.S_IFIFO|0o600, 0); err != nil {
		return fsError(hdr.Name, err)
	}
	return u.own(hdr.Name, pfd, n, hdr, true)
}

// whiteout turns an OCI whiteout into overlayfs's: "dir/.wh.NAME" into a
// character device 0:0 NAME, "dir/.wh..wh..opq" into dir's opaque xattr.
// Other ".wh..wh." names are aufs bookkeeping, skipped.
func (u *unpacker) whiteout(member, n string) error {
	dir, base := path.Dir(n), path.Base(n)
	if base == ".wh..wh..opq" {
		if err := u.ensureDir(member, dir); err != nil {
			return err
		}
		return u.setOpaque(member, dir)
	}
	if strings.HasPrefix(base, ".wh..wh.") {
		return nil
	}
	hidden := strings.TrimPrefix(base, ".wh.")
	if hidden == "" || hidden == "." || hidden == ".." {
		return invalid(member, "whiteout of %q", hidden)
	}
	target := path.Join(dir, hidden)
	pfd, err := u.openParent(member, target)
	if err != nil {
		return err
	}
	if _, err := u.clear(member, pfd, target, false); err != nil {
		return err
	}
	if err := unix.Mknodat(pfd, hidden, unix.S_IFCHR, 0); err != nil {
		return fsError(member, err)
	}
	u.whiteouts[target] = true
	return nil
}

func (u *unpacker) setOpaque(member, dir string) error {
	f, err := u.root.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fsError(member, err)
	}
	defer f.Close()
	if err := unix.Fsetxattr(int(f.Fd()), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		return fsError(member, err)
	}
	return nil
}

// finish sets the directories' times, their contents being written, the
// deepest last-listed first.
func (u *unpacker) finish() error {
	for i := len(u.times) - 1; i >= 0; i-- {
		t := u.times[i]
		if t.name == "." {
			if err := unix.UtimesNano(u.dir, timespecs(t.atime, t.mtime)); err != nil {
				return fsError(".", err)
			}
			continue
		}
		if !u.lookupDir(t.name) {
			continue // replaced later in the tar
		}
		pfd, err := u.openParent(t.name, t.name)
		if err != nil {
			return err
		}
		if err := unix.UtimesNanoAt(pfd, path.Base(t.name), timespecs(t.atime, t.mtime), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fsError(t.name, err)
		}
	}
	return nil
}
