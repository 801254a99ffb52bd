package files

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// An upload (PUT /files/{path...}) is atomic: its body goes to a
// temporary file beside the target, which the helper makes, and which
// takes the target's place by a rename only once the whole body is in
// and synced. Until then the target is as it was; an upload that fails
// (a body cut short or that stops coming, a full disk, a helper or agent
// that goes) leaves no temporary file behind, nor a directory made for
// it.
//
// The helper answers with the temporary file's descriptor and a header
// marked Pending, then waits on its connection for one verdict line from
// whoever wrote the body (the agent, or kilnd after a handover): "commit
// SIZE", answered with the header of the file put in place, or "abort",
// answered once the temporary file is gone. The connection's end is an
// abort too.
//
// A file replaced keeps its owner, its group and its permission bits
// (those of ?mode= when given), as a file written in place by cp would:
// not its setuid, setgid and sticky bits, its extended attributes or
// ACLs, nor its other hard links, which keep the old content. A new file
// belongs to the helper's user (the sandbox's root), its permission
// ?mode= or 0644. A target that is a directory, a symbolic link or
// anything but a regular file is refused: an upload never writes through
// a link.

// tempPrefix begins an upload's temporary file's name: hidden, and
// followed by 128 random bits.
const tempPrefix = ".kiln-put-"

// The verdicts on an upload, one line each.
const (
	verdictCommit = "commit"
	verdictAbort  = "abort"
)

// maxVerdict bounds a verdict line.
const maxVerdict = 64

// settleTimeout bounds a commit, which syncs what was written: a slow
// disk and a large file take long, a helper gone for good takes longer.
const settleTimeout = 5 * time.Minute

// upload is the helper's side of one: the temporary file in the target's
// directory, and what was made for it.
type upload struct {
	p    string   // the target, for messages
	root *os.Root // the target's directory
	name string   // the target's name in root
	temp string   // the temporary file's name in root
	f    *os.File // the temporary file
	made []string // directories made for it, outermost first
	done bool     // put in place: nothing to clean up
}

// put makes an upload's temporary file for p, answers with it, and does
// what the verdict says. mode, when given, is the file's permission.
func put(conn *net.UnixConn, p, modeArg string) error {
	u, err := newUpload(p, modeArg)
	if err != nil {
		return err
	}
	defer u.cleanup()
	fi, err := u.f.Stat()
	if err != nil {
		return err
	}
	h := header{Entry: info(p, fi), Pending: true}
	if err := send(conn, h, int(u.f.Fd())); err != nil {
		return nil // the agent went: nothing to answer
	}
	commit, size, err := readVerdict(conn)
	if err != nil {
		return nil // the agent went: an abort, which cleanup does
	}
	if !commit {
		u.cleanup()
		return answer(conn, nil, -1, nil)
	}
	e, err := u.commit(size)
	if err != nil {
		return err
	}
	return answer(conn, e, -1, nil)
}

// newUpload makes p's directory (and its parents) if missing, checks
// that p is a regular file or nothing, and makes the temporary file,
// with the permission asked for or p's, and p's owner.
func newUpload(p, modeArg string) (u *upload, err error) {
	mode, err := parseMode(modeArg, 0o644)
	if err != nil {
		return nil, err
	}
	u = &upload{p: p, name: filepath.Base(p)}
	if u.made, err = mkdirs(filepath.Dir(p)); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			u.cleanup()
		}
	}()
	if u.root, err = os.OpenRoot(filepath.Dir(p)); err != nil {
		return u, err
	}
	// Where no file can be made, and the agent would refuse it anyway.
	var sfs unix.Statfs_t
	if unix.Statfs(filepath.Dir(p), &sfs) == nil && kernelFS[sfs.Type] {
		return u, refusal(unix.EPERM, "files: %s: the kernel's files (/proc, /sys, cgroups) are not written through the files API", p)
	}
	uid, gid := -1, -1
	old, err := u.root.Lstat(u.name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return u, err
	case old.IsDir():
		return u, refusal(unix.EISDIR, "files: %s is a directory: a PUT writes a file", p)
	case old.Mode()&fs.ModeSymlink != 0:
		return u, refusal(unix.ELOOP, "files: %s is a symbolic link: a PUT replaces a regular file and never writes through a link (name the link's target)", p)
	case !old.Mode().IsRegular():
		return u, refusal(unix.EINVAL, "files: %s is not a regular file", p)
	default:
		if modeArg == "" {
			mode = old.Mode().Perm()
		}
		if st, ok := old.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid()) {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	}
	u.temp = tempPrefix + rand.Text()
	// O_EXCL: made here and now, never a file or link already there.
	if u.f, err = u.root.OpenFile(u.temp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, mode); err != nil {
		u.temp = ""
		return u, fmt.Errorf("files: %s: a temporary file beside it: %w", p, errnoOf(err))
	}
	if uid >= 0 {
		if err := u.f.Chown(uid, gid); err != nil {
			return u, refusal(unix.EPERM, "files: %s belongs to %d:%d, which the new content cannot be given", p, uid, gid)
		}
	}
	return u, nil
}

// commit puts the temporary file, size bytes long, in the target's
// place, durably, and describes it.
func (u *upload) commit(size int64) (*api.FileInfo, error) {
	fi, err := u.f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() != size {
		// Only another of the sandbox's processes could have done it.
		return nil, refusal(unix.EBUSY, "files: %s: the temporary file holds %d bytes, not the %d written: it was changed meanwhile", u.p, fi.Size(), size)
	}
	if err := u.f.Sync(); err != nil {
		return nil, spaceError(u.p, err)
	}
	if err := u.root.Rename(u.temp, u.name); err != nil {
		return nil, fmt.Errorf("files: %s: putting the new content in its place: %w", u.p, errnoOf(err))
	}
	u.done = true
	// The rename too must survive a crash.
	if d, err := u.root.Open("."); err == nil {
		d.Sync()
		d.Close()
	}
	return info(u.p, fi), nil
}

// cleanup removes, unless the upload was put in place, its temporary
// file and the directories made for it (those still empty). It is called
// again after an abort: the second time does nothing.
func (u *upload) cleanup() {
	if !u.done && u.f != nil {
		// Only the file made here: another of the sandbox's processes may
		// have put something else under its name.
		if fi, err := u.f.Stat(); err == nil {
			if now, err := u.root.Lstat(u.temp); err == nil && os.SameFile(fi, now) {
				u.root.Remove(u.temp)
			}
		}
	}
	if u.f != nil {
		u.f.Close()
		u.f = nil
	}
	if u.root != nil {
		u.root.Close()
		u.root = nil
	}
	if !u.done {
		for i := len(u.made) - 1; i >= 0; i-- {
			os.Remove(u.made[i])
		}
	}
	u.made = nil
}

// mkdirs makes dir and its missing parents, as os.MkdirAll does, and
// returns those it made, outermost first.
func mkdirs(dir string) ([]string, error) {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			if !fi.IsDir() {
				return nil, refusal(unix.ENOTDIR, "files: %s is not a directory", d)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || d == "/" {
			return nil, err
		}
		missing = append(missing, d)
	}
	var made []string
	for i := len(missing) - 1; i >= 0; i-- {
		err := os.Mkdir(missing[i], 0o755)
		if err == nil {
			made = append(made, missing[i])
			continue
		}
		if !errors.Is(err, fs.ErrExist) {
			for j := len(made) - 1; j >= 0; j-- {
				os.Remove(made[j])
			}
			return nil, err
		}
	}
	return made, nil
}

// readVerdict reads a verdict line from conn: commit (with the size
// written) or abort. Anything else is an abort.
func readVerdict(conn io.Reader) (commit bool, size int64, err error) {
	line, err := readLine(conn, maxVerdict)
	if err != nil {
		return false, 0, err
	}
	commit, size, _ = parseVerdict(line)
	return commit, size, nil
}

// parseVerdict reads "commit SIZE" or "abort"; ok is false for anything
// else.
func parseVerdict(line string) (commit bool, size int64, ok bool) {
	line = strings.TrimSuffix(line, "\n")
	if line == verdictAbort {
		return false, 0, true
	}
	n, found := strings.CutPrefix(line, verdictCommit+" ")
	if !found {
		return false, 0, false
	}
	size, err := strconv.ParseInt(n, 10, 64)
	if err != nil || size < 0 {
		return false, 0, false
	}
	return true, size, true
}

// readLine reads up to and with a newline, one byte at a time (what
// follows it is not this reader's), at most max bytes.
func readLine(r io.Reader, max int) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for len(b) < max {
		if _, err := io.ReadFull(r, one); err != nil {
			return "", err
		}
		b = append(b, one[0])
		if one[0] == '\n' {
			return string(b), nil
		}
	}
	return "", errors.New("files: a line too long")
}

// errnoOf is err's errno, when it has one: a message that names the
// operation itself needs no more of err.
func errnoOf(err error) error {
	if errno, ok := errors.AsType[syscall.Errno](err); ok {
		return errno
	}
	return err
}

// spaceError describes a failed write to p: in words of its own when the
// disk is full (the sandbox's quota reached), else with its errno.
func spaceError(p string, err error) error {
	errno, _ := errors.AsType[syscall.Errno](err)
	if errno == unix.ENOSPC || errno == unix.EDQUOT {
		return refusal(errno, "files: %s: the sandbox's disk is full (its quota): nothing was written", p)
	}
	return fmt.Errorf("files: %s: %w", p, errnoOf(err))
}

// An Upload is the file a PUT's body goes to: a temporary file beside
// its target, put in the target's place by Commit once the whole body is
// in, or removed by Abort. Its writer writes File, then calls exactly one
// of Commit and Abort.
type Upload interface {
	File() *os.File
	// Commit puts the file, size bytes long, in its target's place and
	// describes it there.
	Commit(size int64) (api.FileInfo, error)
	// Abort removes the file, and returns once it is gone.
	Abort()
}

// Write writes body to u's file and, once all of it has come, commits
// it; then answers with the file's description. p is the target's path
// in the sandbox, for messages. On any failure the target is as it was.
func Write(w http.ResponseWriter, body io.Reader, p string, u Upload) {
	src := &bodyReader{r: body}
	n, err := io.CopyBuffer(onlyWriter{u.File()}, src, make([]byte, 1<<20))
	if err != nil {
		u.Abort()
		reply.Error(w, bodyError(p, n, err, src.err))
		return
	}
	e, err := u.Commit(n)
	if err != nil {
		reply.Error(w, err)
		return
	}
	reply.JSON(w, http.StatusOK, e)
}

// bodyReader keeps the error its reader failed with, so that a copy's
// error tells whose it was.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// bodyError is the answer to an upload to p that failed after n bytes:
// with bodyErr, the body's fault; else err is the file's.
func bodyError(p string, n int64, err, bodyErr error) error {
	if bodyErr != nil {
		return BrokeOff(p, n, bodyErr)
	}
	errno, _ := errors.AsType[syscall.Errno](err)
	if errno == unix.ENOSPC || errno == unix.EDQUOT {
		return errdefs.New(errdefs.ErrNoSpace, fmt.Sprintf("%s: the sandbox's disk is full (its quota) after %d bytes of the body: nothing was written", p, n))
	}
	return errnoError(header{Error: fmt.Sprintf("files: %s: writing the body failed after %d bytes (%v): nothing was written", p, n, errnoOf(err)), Errno: int(errno)})
}

// BrokeOff is the answer to an upload or extraction into p (the
// sandbox's path) whose body failed with err after n bytes: the client's
// fault, and nothing was written, since both are all or nothing.
func BrokeOff(p string, n int64, err error) error {
	why := "it could not be read"
	var ne net.Error
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		why = "its connection ended before it did"
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		why = "it stopped coming: the server's read timeout passed"
	}
	return errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("%s: the body broke off after %d bytes (%s): nothing was written", p, n, why))
}

// pending checks that the helper answered an upload with its temporary
// file, and returns it.
func (c *call) pending() (*os.File, error) {
	f, err := c.regular()
	if err != nil {
		return nil, err
	}
	if !c.h.Pending {
		return nil, fmt.Errorf("%w: files: the helper sent a file that is not an upload's", errdefs.ErrInternal)
	}
	return f, nil
}

// A call of an upload's helper is its Upload, when the agent writes the
// body itself.

func (c *call) File() *os.File { return c.fd }

func (c *call) Commit(size int64) (api.FileInfo, error) {
	h, err := c.settle(fmt.Sprintf("%s %d\n", verdictCommit, size))
	if err != nil {
		return api.FileInfo{}, err
	}
	return committed(h)
}

func (c *call) Abort() { c.settle(verdictAbort + "\n") }

// settle gives the helper the verdict line v and returns its answer.
func (c *call) settle(v string) (header, error) {
	c.conn.SetDeadline(time.Now().Add(settleTimeout))
	defer c.conn.SetDeadline(time.Time{})
	if _, err := io.WriteString(c.conn, v); err != nil {
		return header{}, fmt.Errorf("%w: files: the helper went before the upload was settled", errdefs.ErrInternal)
	}
	if err := c.readHeader(); err != nil {
		return header{}, err
	}
	return c.h, nil
}

// committed is the description of a file a commit answered with h.
func committed(h header) (api.FileInfo, error) {
	if h.Error != "" {
		return api.FileInfo{}, errnoError(h)
	}
	if h.Entry == nil {
		return api.FileInfo{}, fmt.Errorf("%w: files: the helper described nothing", errdefs.ErrInternal)
	}
	return *h.Entry, nil
}
