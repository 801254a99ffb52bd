package files

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// Server serves the files routes on a sandbox's agent: /files/{path...}
// (a file's content, a directory's listing, writes, removal, mkdir and
// move) and /archive (a tar of a directory, or one extracted into it).
type Server struct {
	// Launch starts a process in the sandbox: the spawner's Start.
	Launch func(*exec.Cmd) (*os.Process, error)

	watches watches
}

// Register adds the routes to m.
func (s *Server) Register(m *http.ServeMux) {
	m.HandleFunc("GET /files/{path...}", s.get)
	m.HandleFunc("PUT /files/{path...}", s.put)
	m.HandleFunc("DELETE /files/{path...}", s.remove)
	m.HandleFunc("POST /files/{path...}", s.post)
	m.HandleFunc("GET /archive", s.getArchive)
	m.HandleFunc("PUT /archive", s.putArchive)
	m.HandleFunc("GET "+handoverPrefix+"{path...}", s.handover)
	m.HandleFunc("PUT "+handoverPrefix+"{path...}", s.handover)
}

// maxPath bounds a path, as the kernel's PATH_MAX does.
const maxPath = 4096

// sandboxPath is the absolute path a route names: "/" and the rest, which
// must be clean (no "..", ".", empty or NUL segment).
func sandboxPath(rest string) (string, error) {
	p := "/" + strings.TrimSuffix(rest, "/")
	if len(p) > maxPath || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: path %.64q: too long or holds a NUL", errdefs.ErrInvalidArgument, p)
	}
	if p != "/" && path.Clean(p) != p {
		return "", fmt.Errorf("%w: path %q: not clean (no \"..\", \".\" or empty segment)", errdefs.ErrInvalidArgument, p)
	}
	return p, nil
}

// queryPath is an absolute path given in a query parameter.
func queryPath(r *http.Request, key string) (string, error) {
	v := r.URL.Query().Get(key)
	if !strings.HasPrefix(v, "/") {
		return "", fmt.Errorf("%w: %s=%q: want an absolute path in the sandbox", errdefs.ErrInvalidArgument, key, v)
	}
	return sandboxPath(strings.TrimPrefix(v, "/"))
}

// call is a running helper.
type call struct {
	proc    *os.Process
	release func()
	conn    *net.UnixConn // its answers
	stdin   *os.File      // our end of its standard input, when it reads one
	h       header
	fd      *os.File // the descriptor it sent, if any
	rest    []byte   // what followed the header in the same read
	stop    func() bool
	// cleans: the helper would leave something behind if killed (an
	// upload's temporary file, an extraction's staging directory), so a
	// request that ends asks it to go, by closing its connection and
	// input, and finish gives it cleanupExit to clean up.
	cleans bool
	once   sync.Once
	err    error // finish's
}

// start runs a helper for op on p with args and reads its header.
func (s *Server) start(ctx context.Context, op, p string, args ...string) (*call, error) {
	c, err := s.launch(false, op, p, args...)
	if err != nil {
		return nil, err
	}
	if err := c.await(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// launch starts a helper for op on p with args; with withStdin, c.stdin
// feeds it.
func (s *Server) launch(withStdin bool, op, p string, args ...string) (*call, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("files: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(pair[0]), "files"), os.NewFile(uintptr(pair[1]), "files")
	defer theirs.Close()
	fc, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return nil, fmt.Errorf("files: %w", err)
	}
	c := &call{conn: fc.(*net.UnixConn), cleans: op == "put" || op == "untar"}
	cmd := &exec.Cmd{
		// The spawner's child executes the spawner's own binary: kilnd's,
		// which is not in the sandbox's file system.
		Path:   "/proc/self/exe",
		Args:   append([]string{"kiln-files", op, p}, args...),
		Env:    []string{Env + "=1"},
		Dir:    "/",
		Stdout: theirs,
		// Not the agent's: that is a host file, outside the sandbox's
		// quota, and kilnd quotes it.
		Stderr: nil,
	}
	var theirIn *os.File
	if withStdin {
		if theirIn, c.stdin, err = os.Pipe(); err != nil {
			c.conn.Close()
			return nil, fmt.Errorf("files: %w", err)
		}
		cmd.Stdin = theirIn
	}
	c.proc, c.release, err = process.Own(func() (*os.Process, error) { return s.Launch(cmd) })
	if theirIn != nil {
		theirIn.Close()
	}
	if err != nil {
		c.conn.Close()
		if c.stdin != nil {
			c.stdin.Close()
		}
		return nil, fmt.Errorf("%w: files: start the helper: %w", errdefs.ErrUnavailable, err)
	}
	return c, nil
}

// await reads the helper's header; if ctx ends before the call is
// finished, the helper is killed, or, one that cleans up after itself,
// told to go (see cleans). On an error the call is finished.
func (c *call) await(ctx context.Context) error {
	c.stop = context.AfterFunc(ctx, func() {
		if !c.cleans {
			c.proc.Kill()
			return
		}
		c.conn.Close()
		if c.stdin != nil {
			c.stdin.Close()
		}
	})
	if err := c.readHeader(); err != nil {
		c.finish()
		return err
	}
	if c.h.Error != "" {
		c.finish()
		return errnoError(c.h)
	}
	return nil
}

// readHeader reads the next header line and the descriptor that came
// with it.
func (c *call) readHeader() error {
	buf := make([]byte, maxHeader)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n := copy(buf, c.rest)
	c.h, c.rest = header{}, nil
	for {
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			c.rest = buf[i+1 : n]
			if err := json.Unmarshal(buf[:i], &c.h); err != nil {
				return fmt.Errorf("%w: files: the helper's answer: %w", errdefs.ErrInternal, err)
			}
			return nil
		}
		k, oobn, _, _, err := c.conn.ReadMsgUnix(buf[n:], oob)
		if oobn > 0 {
			c.takeRights(oob[:oobn])
		}
		if k > 0 {
			n += k
		}
		if bytes.IndexByte(buf[:n], '\n') >= 0 {
			continue
		}
		if err != nil || n == len(buf) {
			return fmt.Errorf("%w: files: the helper ended without an answer", errdefs.ErrInternal)
		}
	}
}

// takeRights keeps the first descriptor received and closes any other.
func (c *call) takeRights(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if c.fd == nil {
				c.fd = os.NewFile(uintptr(fd), "sandbox file")
			} else {
				unix.Close(fd)
			}
		}
	}
}

// body is what the helper writes after its header.
func (c *call) body() io.Reader { return io.MultiReader(bytes.NewReader(c.rest), c.conn) }

// finish ends the call, once: its handles closed, the helper ended (all
// it had to say is read by now; one that stalls is not waited for) and
// reaped. The error is the helper's failing exit, if it failed before.
func (c *call) finish() error {
	c.once.Do(func() {
		if c.stop != nil {
			c.stop()
		}
		c.conn.Close()
		if c.stdin != nil {
			c.stdin.Close()
		}
		if c.fd != nil {
			c.fd.Close()
		}
		exited := make(chan struct{})
		var st *os.ProcessState
		var err error
		go func() {
			st, err = c.proc.Wait()
			close(exited)
		}()
		grace := helperExit
		if c.cleans {
			grace = cleanupExit
		}
		select {
		case <-exited:
		case <-time.After(grace):
			c.proc.Kill()
			<-exited
		}
		c.release()
		if err == nil && !st.Success() && !killed(st) {
			err = fmt.Errorf("files: the helper %s", st)
		}
		c.err = err
	})
	return c.err
}

// helperExit is how long a helper that has answered gets to exit;
// cleanupExit how long one that may have to remove what it made (a
// staging directory of many files) gets.
const (
	helperExit  = 5 * time.Second
	cleanupExit = time.Minute
)

func killed(st *os.ProcessState) bool {
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// regular checks that the descriptor the helper sent is a regular file,
// described: the helper is the sandbox's process, and what it sends is
// not trusted.
func (c *call) regular() (*os.File, error) {
	if c.fd == nil || c.h.Entry == nil {
		return nil, fmt.Errorf("%w: files: the helper sent no file", errdefs.ErrInternal)
	}
	fi, err := c.fd.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: files: the helper sent something that is not a regular file", errdefs.ErrInternal)
	}
	// Nor one of the kernel's files, which the agent, host root, would
	// read or write with its own privileges.
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(c.fd.Fd()), &st); err != nil || kernelFS[st.Type] {
		return nil, fmt.Errorf("%w: files: the kernel's files (/proc, /sys, cgroups) are not read or written through the files API", errdefs.ErrPermissionDenied)
	}
	return c.fd, nil
}

// kernelFS are the file systems whose files are the kernel's interfaces.
var kernelFS = map[int64]bool{
	unix.PROC_SUPER_MAGIC: true, unix.SYSFS_MAGIC: true, unix.CGROUP_SUPER_MAGIC: true, unix.CGROUP2_SUPER_MAGIC: true,
	unix.DEBUGFS_MAGIC: true, unix.SECURITYFS_MAGIC: true, unix.BPF_FS_MAGIC: true, unix.TRACEFS_MAGIC: true,
}

// errnoError turns a helper's error into the API's.
func errnoError(h header) error {
	msg := strings.TrimPrefix(h.Error, "files: ")
	class := errdefs.ErrInternal
	switch syscall.Errno(h.Errno) {
	case unix.ENOENT:
		class = errdefs.ErrNotFound
	case unix.EEXIST:
		class = errdefs.ErrAlreadyExists
	case unix.EACCES, unix.EPERM, unix.EROFS:
		class = errdefs.ErrPermissionDenied
	case unix.ENOSPC, unix.EDQUOT:
		class = errdefs.ErrNoSpace
	case unix.EFBIG, unix.E2BIG:
		class = errdefs.ErrTooLarge
	case unix.EINVAL, unix.ENAMETOOLONG:
		class = errdefs.ErrInvalidArgument
	case unix.ENOTDIR, unix.EISDIR, unix.ENOTEMPTY, unix.ELOOP, unix.EXDEV, unix.EBUSY, unix.ETXTBSY:
		class = errdefs.ErrFailedPrecondition
	}
	return errdefs.New(class, msg)
}

// get serves a file's content (Range honoured), a directory's listing,
// or, with ?stat=true, what the path is.
func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	p, err := sandboxPath(r.PathValue("path"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	if watch, _ := strconv.ParseBool(r.URL.Query().Get("watch")); watch {
		s.serveWatch(w, r, p)
		return
	}
	if stat, _ := strconv.ParseBool(r.URL.Query().Get("stat")); stat {
		c, err := s.start(r.Context(), "stat", p)
		if err != nil {
			reply.Error(w, err)
			return
		}
		c.finish()
		if c.h.Entry == nil {
			reply.Error(w, fmt.Errorf("%w: files: the helper described nothing", errdefs.ErrInternal))
			return
		}
		reply.JSON(w, http.StatusOK, c.h.Entry)
		return
	}
	c, err := s.start(r.Context(), "get", p)
	if err != nil {
		reply.Error(w, err)
		return
	}
	defer c.finish()
	if c.listing(w) {
		return
	}
	f, err := c.regular()
	if err != nil {
		reply.Error(w, err)
		return
	}
	Serve(w, r, f, *c.h.Entry)
}

// listing answers with a directory's listing, if the call's path is one.
func (c *call) listing(w http.ResponseWriter) bool {
	if c.h.Entry == nil || c.h.Entry.Type != api.FileDir {
		return false
	}
	w.Header().Set("Content-Type", "application/json")
	io.Copy(w, io.LimitReader(c.body(), maxListing))
	return true
}

// onlyWriter hides a file's ReadFrom, whose generic copy reads the body
// 32 KiB at a time.
type onlyWriter struct{ io.Writer }

// maxListing bounds a directory's listing: about a million entries.
const maxListing = 256 << 20

// put writes the body to a file, its parents made as needed.
func (s *Server) put(w http.ResponseWriter, r *http.Request) {
	p, err := sandboxPath(r.PathValue("path"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	if p == "/" {
		reply.Error(w, fmt.Errorf("%w: PUT needs a file's path", errdefs.ErrInvalidArgument))
		return
	}
	c, err := s.start(r.Context(), "put", p, r.URL.Query().Get("mode"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	defer c.finish()
	if _, err := c.pending(); err != nil {
		reply.Error(w, err)
		return
	}
	Write(w, r.Body, p, c)
}

// remove deletes a file, an empty directory, or with ?recursive=true a
// directory and everything in it.
func (s *Server) remove(w http.ResponseWriter, r *http.Request) {
	p, err := sandboxPath(r.PathValue("path"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	recursive, err := strconv.ParseBool(cmp.Or(r.URL.Query().Get("recursive"), "false"))
	if err != nil {
		reply.Error(w, fmt.Errorf("%w: recursive must be true or false", errdefs.ErrInvalidArgument))
		return
	}
	mode := ""
	if recursive {
		mode = "recursive"
	}
	c, err := s.start(r.Context(), "remove", p, mode)
	if err != nil {
		reply.Error(w, err)
		return
	}
	c.finish()
	w.WriteHeader(http.StatusNoContent)
}

// post does ?op=mkdir (with its parents; ?mode=) or ?op=move&to=PATH.
func (s *Server) post(w http.ResponseWriter, r *http.Request) {
	p, err := sandboxPath(r.PathValue("path"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	q := r.URL.Query()
	var c *call
	switch q.Get("op") {
	case "mkdir":
		c, err = s.start(r.Context(), "mkdir", p, q.Get("mode"))
	case "move":
		var to string
		if to, err = queryPath(r, "to"); err == nil {
			c, err = s.start(r.Context(), "move", p, to)
		}
	default:
		err = fmt.Errorf("%w: op=%q: want mkdir or move", errdefs.ErrInvalidArgument, q.Get("op"))
	}
	if err != nil {
		reply.Error(w, err)
		return
	}
	c.finish()
	status := http.StatusOK
	if q.Get("op") == "mkdir" {
		status = http.StatusCreated
	}
	reply.JSON(w, status, c.h.Entry)
}

// getArchive streams a tar of ?path= (a directory and what it holds, or
// one file), its entries named from the path's base name.
func (s *Server) getArchive(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r, "path")
	if err != nil {
		reply.Error(w, err)
		return
	}
	c, err := s.start(r.Context(), "tar", p)
	if err != nil {
		reply.Error(w, err)
		return
	}
	defer c.finish()
	stat, _ := json.Marshal(c.h.Entry)
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set(api.PathStatHeader, string(stat))
	if _, err := io.Copy(w, c.body()); err != nil || c.finish() != nil {
		// Cut short: the client sees a broken answer, not a whole tar.
		panic(http.ErrAbortHandler)
	}
}
