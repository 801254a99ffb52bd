package files

import (
	"archive/tar"
	"cmp"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// An extraction (PUT /archive?path=DIR) is all or nothing as DIR's
// readers see it. The helper extracts the archive into a staging
// directory it makes in DIR (same file system, so a rename moves what it
// holds), checking each member as it comes: regular files, directories,
// and symbolic and hard links that stay in DIR are extracted; any other
// member (a sparse file, a contiguous file, a FIFO, a device, a type it
// does not know) or a name or link that leads out of DIR fails the whole
// extraction. Once the archive has been read whole it syncs what it
// staged and answers Pending; the agent, once it has the whole body,
// sends its verdict ("commit" or "abort", as for an upload). On a commit
// the helper checks the staged tree against DIR, then moves it in: a
// member DIR does not have is renamed into place whole (a directory with
// everything in it at once); a directory DIR has is merged into, member
// by member, what else it holds kept; a file or link DIR has is replaced
// by a rename. A member that would replace a directory with something
// else, or the reverse, or cross into another file system, fails the
// extraction before anything moves. The archive's directories then get
// their modes and times. On any failure the staging directory is
// removed, and DIR is as it was; only a failure between renames (DIR
// changed by the sandbox's own processes meanwhile) leaves part of it
// moved in.

// stagePrefix begins an extraction's staging directory's name: hidden,
// and followed by 128 random bits.
const stagePrefix = ".kiln-untar-"

const (
	// maxTrailer bounds what may follow an archive's end: its last
	// record's padding, 10 KiB for GNU tar.
	maxTrailer = 1 << 20
	// maxMembers bounds an archive's members.
	maxMembers = 1 << 20
	// maxDirNames bounds the bytes of directory names an extraction keeps
	// to give them their modes and times at the end.
	maxDirNames = 64 << 20
)

// extraction is the helper's side of one.
type extraction struct {
	dir      string   // DIR, for messages
	root     *os.Root // DIR
	stage    string   // the staging directory's name in root
	sroot    *os.Root // the staging directory
	dirs     []dirMember
	dirBytes int
	members  int
}

// dirMember is a directory of the archive, given its mode and times once
// its contents are in.
type dirMember struct {
	name         string
	mode         fs.FileMode
	atime, mtime time.Time
}

// untar extracts the tar on r into the directory dir, as described
// above. What it makes is the helper's user's (the sandbox's root), with
// the archive's permissions (without setuid and setgid) and times.
func untar(conn *net.UnixConn, dir string, r io.Reader) error {
	x, err := newExtraction(dir)
	if err != nil {
		return err
	}
	defer x.cleanup()
	if err := x.read(tar.NewReader(r)); err != nil {
		return err
	}
	// What follows the archive's end is read too: the agent knows the
	// body whole only once all of it has been taken.
	if n, _ := io.Copy(io.Discard, io.LimitReader(r, maxTrailer+1)); n > maxTrailer {
		return refusal(unix.EINVAL, "files: more than %d bytes follow the archive's end; nothing was extracted", maxTrailer)
	}
	if err := x.sync(); err != nil {
		return err
	}
	if err := send(conn, header{Pending: true}, -1); err != nil {
		return nil // the agent went: nothing to answer
	}
	commit, _, err := readVerdict(conn)
	if err != nil {
		return nil // the agent went: an abort, which cleanup does
	}
	if !commit {
		x.cleanup()
		return answer(conn, nil, -1, nil)
	}
	if err := x.commit(); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	return answer(conn, info(dir, fi), -1, nil)
}

// newExtraction makes the staging directory in dir.
func newExtraction(dir string) (*extraction, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	x := &extraction{dir: dir, root: root, stage: stagePrefix + rand.Text()}
	if err := root.Mkdir(x.stage, 0o700); err != nil {
		root.Close()
		return nil, fmt.Errorf("files: %s: a staging directory in it: %w", dir, errnoOf(err))
	}
	if x.sroot, err = root.OpenRoot(x.stage); err != nil {
		root.Remove(x.stage)
		root.Close()
		return nil, err
	}
	return x, nil
}

// cleanup removes the staging directory and what is left in it. It is
// called again after an abort: the second time does nothing.
func (x *extraction) cleanup() {
	if x.root == nil {
		return
	}
	x.sroot.Close()
	x.root.RemoveAll(x.stage)
	x.root.Close()
	x.root = nil
}

// read stages every member of tr, or fails at the first it refuses.
func (x *extraction) read(tr *tar.Reader) error {
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return refusal(unix.EINVAL, "files: the archive could not be read after %d members (%v); nothing was extracted", x.members, err)
		}
		if x.members++; x.members > maxMembers {
			return refusal(unix.E2BIG, "files: the archive has more than %d members", maxMembers)
		}
		if err := x.member(h, tr); err != nil {
			return err
		}
	}
}

// member checks and stages one member, its content on r.
func (x *extraction) member(h *tar.Header, r io.Reader) error {
	if h.Typeflag == tar.TypeXGlobalHeader {
		return nil // the archive's own metadata: nothing to make
	}
	if err := supported(h); err != nil {
		return err
	}
	name, err := memberName(h.Name)
	if err != nil {
		return err
	}
	if name == "." {
		return nil // DIR itself
	}
	mode := fs.FileMode(h.Mode) & fs.ModePerm
	if h.Typeflag == tar.TypeDir && h.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	if h.Typeflag == tar.TypeDir {
		if err := x.sroot.MkdirAll(name, 0o700); err != nil {
			return memberError(h, err)
		}
		x.dirBytes += len(name)
		if x.dirBytes > maxDirNames {
			return refusal(unix.E2BIG, "files: the archive's directories' names pass %d bytes", maxDirNames)
		}
		x.dirs = append(x.dirs, dirMember{name, mode, h.AccessTime, h.ModTime})
		return nil
	}
	if err := x.sroot.MkdirAll(path.Dir(name), 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return refusal(unix.ENOTDIR, "files: archive member %.256q: the archive has a file where it needs a directory; nothing was extracted", h.Name)
		}
		return memberError(h, err)
	}
	// A later member of the same name replaces an earlier one.
	if err := x.sroot.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return memberError(h, err)
	}
	switch h.Typeflag {
	case tar.TypeReg:
		return x.file(h, name, mode, r)
	case tar.TypeSymlink:
		if escapes(name, h.Linkname) {
			return refusal(unix.EPERM, "files: archive member %.256q: a link to %.256q leads out of %s; nothing was extracted", h.Name, h.Linkname, x.dir)
		}
		if err := x.sroot.Symlink(h.Linkname, name); err != nil {
			return memberError(h, err)
		}
	case tar.TypeLink:
		target, err := memberName(h.Linkname)
		if err != nil || target == "." {
			return refusal(unix.EPERM, "files: archive member %.256q: a hard link to %.256q leads out of %s; nothing was extracted", h.Name, h.Linkname, x.dir)
		}
		// To a member staged before it, or else to what DIR holds.
		if _, serr := x.sroot.Lstat(target); serr == nil {
			err = x.sroot.Link(target, name)
		} else {
			err = x.root.Link(target, path.Join(x.stage, name))
		}
		if err != nil {
			return memberError(h, err)
		}
	}
	return nil
}

// file stages a regular file.
func (x *extraction) file(h *tar.Header, name string, mode fs.FileMode, r io.Reader) error {
	f, err := x.sroot.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return memberError(h, err)
	}
	src := &bodyReader{r: r}
	_, err = io.Copy(onlyWriter{f}, src)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case src.err != nil:
		return refusal(unix.EINVAL, "files: the archive broke off in member %.256q (%v); nothing was extracted", h.Name, src.err)
	case err != nil:
		return memberError(h, err)
	}
	if !h.ModTime.IsZero() {
		x.sroot.Chtimes(name, h.AccessTime, h.ModTime)
	}
	return nil
}

// supported refuses a member that is not a regular file, a directory, or
// a symbolic or hard link, naming it and its type.
func supported(h *tar.Header) error {
	what := ""
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
		for k := range h.PAXRecords {
			if strings.HasPrefix(k, "GNU.sparse.") {
				what = "a sparse file (in GNU's PAX format)"
				break
			}
		}
		if what == "" {
			return nil
		}
	case tar.TypeGNUSparse:
		what = "a sparse file (GNU's type 'S')"
	case tar.TypeCont:
		what = "a contiguous file (type '7')"
	case tar.TypeFifo:
		what = "a FIFO (type '6')"
	case tar.TypeChar:
		what = "a character device (type '3')"
	case tar.TypeBlock:
		what = "a block device (type '4')"
	default:
		what = fmt.Sprintf("of a type not extracted (%q)", h.Typeflag)
	}
	return refusal(unix.EINVAL, "files: archive member %.256q is %s: only regular files, directories, and symbolic and hard links are extracted; nothing was extracted", h.Name, what)
}

// memberError describes a failure to stage h: the disk full in words of
// its own, else with its errno.
func memberError(h *tar.Header, err error) error {
	errno, _ := errors.AsType[syscall.Errno](err)
	if errno == unix.ENOSPC || errno == unix.EDQUOT {
		return refusal(errno, "files: archive member %.256q: the sandbox's disk is full (its quota): nothing was extracted", h.Name)
	}
	return fmt.Errorf("files: archive member %.256q: %w", h.Name, errnoOf(err))
}

// sync makes what was staged durable before any of it is moved in.
func (x *extraction) sync() error {
	d, err := x.root.Open(x.stage)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil && err != unix.ENOSYS {
		return spaceError(x.dir, err)
	}
	return nil
}

// commit moves what was staged into DIR, once all of it has been checked
// against what DIR holds, then gives the archive's directories their
// modes and times.
func (x *extraction) commit() error {
	st, err := x.root.Lstat(x.stage)
	if err != nil {
		return err
	}
	var moves []string
	if err := x.plan(".", device(st), &moves); err != nil {
		return err
	}
	into := map[string]bool{}
	for _, p := range moves {
		if err := x.root.Rename(path.Join(x.stage, p), p); err != nil {
			return fmt.Errorf("files: %s: moving %.256q into place: %w", x.dir, p, errnoOf(err))
		}
		into[path.Dir(p)] = true
	}
	// Deepest first, so that a directory's times are set after what goes
	// into it; of one name the archive's last.
	slices.SortStableFunc(x.dirs, func(a, b dirMember) int {
		return cmp.Compare(strings.Count(b.name, "/"), strings.Count(a.name, "/"))
	})
	for _, d := range x.dirs {
		// A later member of its name may have replaced it (with a link,
		// which Chmod would follow).
		if fi, err := x.root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue
		}
		x.root.Chmod(d.name, d.mode)
		if !d.mtime.IsZero() {
			x.root.Chtimes(d.name, d.atime, d.mtime)
		}
	}
	// The renames durable: the directories they went into.
	for p := range into {
		if d, err := x.root.Open(p); err == nil {
			d.Sync()
			d.Close()
		}
	}
	return nil
}

// plan lists, into moves, what of the staged directory rel is renamed
// into DIR: what DIR lacks, and the files and links that replace DIR's;
// and goes into the directories both have. dev is the staging
// directory's file system.
func (x *extraction) plan(rel string, dev uint64, moves *[]string) error {
	d, err := x.sroot.Open(rel)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, n := range names {
		p := path.Join(rel, n)
		staged, err := x.sroot.Lstat(p)
		if err != nil {
			return err
		}
		there, err := x.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			*moves = append(*moves, p)
			continue
		case err != nil:
			return fmt.Errorf("files: %s: %w", path.Join(x.dir, p), errnoOf(err))
		case device(there) != dev:
			return refusal(unix.EXDEV, "files: %s is on another file system (a mount point): extract into it instead; nothing was extracted", path.Join(x.dir, p))
		case staged.IsDir() && there.IsDir():
			if err := x.plan(p, dev, moves); err != nil {
				return err
			}
		case !staged.IsDir() && !there.IsDir():
			*moves = append(*moves, p)
		case staged.IsDir():
			return refusal(unix.ENOTDIR, "files: archive member %.256q is a directory and %s is not: nothing was extracted", p, path.Join(x.dir, p))
		default:
			return refusal(unix.EISDIR, "files: archive member %.256q is not a directory and %s is one: nothing was extracted", p, path.Join(x.dir, p))
		}
	}
	return nil
}

// device is the file system fi is on.
func device(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Dev
	}
	return 0
}

// memberName is an archive member's name made relative and clean, or an
// error if it is absolute or climbs out with "..".
func memberName(name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") || strings.ContainsRune(name, 0) {
		return "", refusal(unix.EPERM, "files: archive member %.256q: absolute or empty names are refused; nothing was extracted", name)
	}
	if len(name) > maxPath {
		return "", refusal(unix.ENAMETOOLONG, "files: archive member %.256q: a name longer than %d bytes", name, maxPath)
	}
	for part := range strings.SplitSeq(name, "/") {
		if part == ".." {
			return "", refusal(unix.EPERM, "files: archive member %.256q: \"..\" is refused; nothing was extracted", name)
		}
	}
	return path.Clean(name), nil
}

// escapes reports whether a symbolic link at name (relative to the
// extraction's directory) to target leads out of it.
func escapes(name, target string) bool {
	if target == "" || strings.HasPrefix(target, "/") {
		return true
	}
	p := path.Join(path.Dir(name), target)
	return p == ".." || strings.HasPrefix(p, "../")
}

// putArchive extracts the tar in the body into the directory ?path=,
// which must exist, all or nothing (see above).
func (s *Server) putArchive(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r, "path")
	if err != nil {
		reply.Error(w, err)
		return
	}
	c, err := s.launch(true, "untar", p)
	if err != nil {
		reply.Error(w, err)
		return
	}
	defer c.finish()
	// The helper answers once it has read the archive and all that
	// follows it (its input closed here after the body), or at the first
	// member it refuses, when it stops reading and the feeding here stops
	// too.
	answered := make(chan error, 1)
	go func() { answered <- c.await(r.Context()) }()
	src := &bodyReader{r: r.Body}
	n, _ := io.Copy(c.stdin, src)
	c.stdin.Close()
	if err := <-answered; err != nil {
		reply.Error(w, err)
		return
	}
	if !c.h.Pending {
		reply.Error(w, fmt.Errorf("%w: files: the helper did not stage the archive", errdefs.ErrInternal))
		return
	}
	if src.err != nil {
		// The archive read whole, maybe, but not the body: nothing of it
		// is taken.
		c.Abort()
		reply.Error(w, BrokeOff(p, n, src.err))
		return
	}
	h, err := c.settle(verdictCommit + " 0\n")
	if err == nil {
		_, err = committed(h)
	}
	if err != nil {
		reply.Error(w, err)
		return
	}
	reply.JSON(w, http.StatusOK, h.Entry)
}
