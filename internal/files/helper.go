// Package files moves files into and out of a sandbox. Every operation is
// done by a short-lived helper, kilnd's binary started through the
// sandbox's spawner like any of its processes: as the sandbox's root, in
// its user namespace, confined, seeing what the sandbox's root sees and
// nothing else. The agent, host root, never opens a path of the sandbox's
// itself: it takes the descriptor the helper opened (for a file's
// content) or the stream it writes (a listing, a tar), so a symbolic link
// or a hostile archive acts with the sandbox's privileges only.
package files

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
)

// Env names the environment variable that makes kilnd's binary a files
// helper.
const Env = "KILN_FILES"

// Is reports whether this process was started as a files helper.
func Is() bool { return os.Getenv(Env) != "" }

// header is the helper's first message to the agent, one line of JSON,
// with the descriptor of an opened file attached when there is one.
type header struct {
	Error string        `json:"error,omitempty"`
	Errno int           `json:"errno,omitempty"`
	Entry *api.FileInfo `json:"entry,omitempty"`
	// Pending: the descriptor is an upload's temporary file, which takes
	// the path's place on a commit (see upload.go).
	Pending bool `json:"pending,omitempty"`
}

// maxHeader bounds a header line.
const maxHeader = 64 << 10

// Main runs the operation its arguments name, answers the agent on its
// standard output (a unix socket) and exits.
func Main() {
	// The sandbox's root may trace its own processes: not this one.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	syscall.Umask(0)
	c, err := net.FileConn(os.Stdout)
	if err != nil {
		os.Exit(2)
	}
	conn := c.(*net.UnixConn)
	args := os.Args[1:]
	if len(args) < 2 {
		answer(conn, nil, -1, errors.New("files: no operation"))
		os.Exit(2)
	}
	op, p := args[0], args[1]
	err = run(conn, op, p, args[2:])
	if err != nil {
		answer(conn, nil, -1, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// run does op on p, answering on conn, unless it fails before it answered.
func run(conn *net.UnixConn, op, p string, rest []string) error {
	arg := func(i int) string {
		if i < len(rest) {
			return rest[i]
		}
		return ""
	}
	switch op {
	case "stat":
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		return answer(conn, info(p, fi), -1, nil)
	case "get":
		return get(conn, p)
	case "put":
		return put(conn, p, arg(0))
	case "remove":
		if p == "/" {
			return fmt.Errorf("files: refusing to remove /: %w", unix.EPERM)
		}
		if arg(0) == "recursive" {
			if _, err := os.Lstat(p); err != nil {
				return err
			}
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		} else if err := os.Remove(p); err != nil {
			return err
		}
		return answer(conn, nil, -1, nil)
	case "mkdir":
		mode, err := parseMode(arg(0), 0o755)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(p, mode); err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		return answer(conn, info(p, fi), -1, nil)
	case "move":
		if err := os.Rename(p, arg(0)); err != nil {
			return err
		}
		fi, err := os.Lstat(arg(0))
		if err != nil {
			return err
		}
		return answer(conn, info(arg(0), fi), -1, nil)
	case "tar":
		return writeTar(conn, p)
	case "untar":
		return untar(conn, p, os.Stdin)
	case "watch":
		return watchTree(conn, p)
	}
	return fmt.Errorf("files: unknown operation %q", op)
}

// answer sends the header: the error, or entry and the descriptor fd (if
// not -1).
func answer(conn *net.UnixConn, entry *api.FileInfo, fd int, err error) error {
	h := header{Entry: entry}
	if err != nil {
		h.Error = err.Error()
		if errno, ok := errors.AsType[syscall.Errno](err); ok {
			h.Errno = int(errno)
		}
	}
	return send(conn, h, fd)
}

// send writes h, with the descriptor fd if not -1.
func send(conn *net.UnixConn, h header, fd int) error {
	b, _ := json.Marshal(h)
	b = append(b, '\n')
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	_, _, werr := conn.WriteMsgUnix(b, oob, nil)
	return werr
}

// refusal is an error in the helper's words alone, answered with errno
// (which its class follows).
func refusal(errno syscall.Errno, format string, args ...any) error {
	return &refused{fmt.Sprintf(format, args...), errno}
}

type refused struct {
	msg   string
	errno syscall.Errno
}

func (e *refused) Error() string { return e.msg }
func (e *refused) Unwrap() error { return e.errno }

// info describes the entry at p, fi its lstat.
func info(p string, fi fs.FileInfo) *api.FileInfo {
	e := &api.FileInfo{Name: path.Base(p), Size: fi.Size(), Mode: fmt.Sprintf("%04o", unixMode(fi.Mode())), ModTime: fi.ModTime().UTC()}
	switch {
	case fi.Mode().IsRegular():
		e.Type = api.FileRegular
	case fi.IsDir():
		e.Type = api.FileDir
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = api.FileSymlink
		e.Link, _ = os.Readlink(p)
	default:
		e.Type = api.FileOther
	}
	return e
}

// unixMode is m's permission, setuid, setgid and sticky bits as chmod
// numbers them.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// parseMode reads an octal permission ("0644"), def when s is empty.
func parseMode(s string, def fs.FileMode) (fs.FileMode, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n > 0o777 {
		return 0, fmt.Errorf("files: mode %q: want octal permission bits, 0000 to 0777: %w", s, unix.EINVAL)
	}
	return fs.FileMode(n), nil
}

// get answers with a regular file's descriptor, or a directory's listing
// after the header.
func get(conn *net.UnixConn, p string) error {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK, 0) // a FIFO must not block the open
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	switch {
	case fi.Mode().IsRegular():
		return answer(conn, info(p, fi), int(f.Fd()), nil)
	case fi.IsDir():
		if err := answer(conn, info(p, fi), -1, nil); err != nil {
			return err
		}
		return list(conn, p, f)
	}
	return fmt.Errorf("files: %s is not a regular file or a directory: %w", p, unix.EINVAL)
}

// list writes the entries of the directory d, at p, as a JSON array in
// the order of their names.
func list(w io.Writer, p string, d *os.File) error {
	names, _ := d.Readdirnames(-1)
	slices.Sort(names)
	bw := bufio.NewWriter(w)
	bw.WriteString("[")
	first := true
	for _, n := range names {
		fi, err := os.Lstat(filepath.Join(p, n))
		if err != nil {
			continue // gone meanwhile
		}
		b, _ := json.Marshal(info(filepath.Join(p, n), fi))
		if !first {
			bw.WriteString(",")
		}
		first = false
		bw.Write(b)
	}
	bw.WriteString("]\n")
	bw.Flush()
	return nil
}

// writeTar answers, then writes a tar of p (a directory with everything
// below it, or one entry), its entries named from p's base name, as
// Docker's archive does.
func writeTar(conn *net.UnixConn, p string) error {
	top, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if err := answer(conn, info(p, top), -1, nil); err != nil {
		return err
	}
	tw := tar.NewWriter(conn)
	base := filepath.Dir(p)
	walkErr := filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable: left out, as tar does with a warning
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(q); err != nil {
				return nil
			}
		}
		if !fi.Mode().IsRegular() && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
			return nil // sockets, devices and FIFOs have no content to move
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(base, q)
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		if fi.Mode().IsRegular() {
			f, err := os.Open(q)
			if err != nil {
				return nil
			}
			defer f.Close()
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			// Copy exactly the size announced: a file growing meanwhile is
			// cut, one shrinking is padded, and the archive stays whole.
			n, err := io.Copy(tw, io.LimitReader(f, h.Size))
			if err == nil && n < h.Size {
				_, err = io.CopyN(tw, zeros{}, h.Size-n)
			}
			return err
		}
		return tw.WriteHeader(h)
	})
	if walkErr != nil {
		return nil // the agent went: nothing to answer
	}
	tw.Close()
	return nil
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}
