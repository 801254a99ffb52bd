package files

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// A handover gives kilnd the open file a GET or PUT names, so that the
// content moves between the client's connection and the file without
// passing through the agent: GET /handover/{path...} (a file to read) and
// PUT /handover/{path...}?mode= (one to write, made as PUT /files makes
// it) answer with one line, the file's header, carrying the file's
// descriptor (SCM_RIGHTS) on the agent's unix socket. Anything else (an
// error, a directory's listing) is an ordinary HTTP answer, for kilnd to
// pass on. kilnd never routes a client to these: they are its own.
const handoverPrefix = "/handover/"

// handover serves GET and PUT /handover/{path...}.
func (s *Server) handover(w http.ResponseWriter, r *http.Request) {
	p, err := sandboxPath(r.PathValue("path"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	op, args := "get", []string(nil)
	if r.Method == http.MethodPut {
		if p == "/" {
			reply.Error(w, fmt.Errorf("%w: PUT needs a file's path", errdefs.ErrInvalidArgument))
			return
		}
		op, args = "put", []string{r.URL.Query().Get("mode")}
	}
	c, err := s.start(r.Context(), op, p, args...)
	if err != nil {
		reply.Error(w, err)
		return
	}
	defer c.finish()
	if op == "get" && c.listing(w) {
		return
	}
	f, err := c.regular()
	if err != nil {
		reply.Error(w, err)
		return
	}
	line, err := json.Marshal(header{Entry: c.h.Entry})
	if err != nil {
		reply.Error(w, err)
		return
	}
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		reply.Error(w, fmt.Errorf("%w: files: hand the file over: %v", errdefs.ErrInternal, err))
		return
	}
	defer conn.Close()
	// A unix socket, or the agent's wrapping of one.
	uc, ok := conn.(interface {
		WriteMsgUnix(b, oob []byte, addr *net.UnixAddr) (n, oobn int, err error)
	})
	if !ok {
		return // kilnd sees the connection end, and says so
	}
	uc.WriteMsgUnix(append(line, '\n'), unix.UnixRights(int(f.Fd())), nil)
}

// Handover asks the agent on conn (a connection to its socket, which it
// closes) for the file of a GET or PUT r, whose path in the sandbox is
// rest (escaped as rawRest, if it needs to be; as after /files/). It
// returns the open file and its header; or, when the agent answered
// otherwise (an error, a directory's listing), that answer, whose body
// the caller passes on and closes.
func Handover(conn *net.UnixConn, r *http.Request, rest, rawRest string) (*os.File, api.FileInfo, *http.Response, error) {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://agent/", http.NoBody)
	if err != nil {
		conn.Close()
		return nil, api.FileInfo{}, nil, err
	}
	out.URL.Path, out.URL.RawQuery = handoverPrefix+rest, r.URL.RawQuery
	if rawRest != "" {
		out.URL.RawPath = handoverPrefix + rawRest
	}
	if err := out.Write(conn); err != nil {
		conn.Close()
		return nil, api.FileInfo{}, nil, err
	}
	buf := make([]byte, maxHeader)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		conn.Close()
		return nil, api.FileInfo{}, nil, err
	}
	if oobn == 0 {
		// An ordinary answer: the connection goes with its body.
		resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(bytes.NewReader(buf[:n]), conn)), out)
		if err != nil {
			conn.Close()
			return nil, api.FileInfo{}, nil, err
		}
		resp.Body = closeBoth{resp.Body, conn}
		return nil, api.FileInfo{}, resp, nil
	}
	defer conn.Close()
	f, err := takeFile(oob[:oobn])
	if err != nil {
		return nil, api.FileInfo{}, nil, err
	}
	// The line is one write of the agent's, short: the rest of it, if
	// the first read did not take it all.
	line := buf[:n]
	for !bytes.HasSuffix(line, []byte("\n")) && len(line) < maxHeader {
		m, err := conn.Read(buf[len(line):])
		if err != nil {
			f.Close()
			return nil, api.FileInfo{}, nil, fmt.Errorf("files: the handover's header: %w", err)
		}
		line = buf[:len(line)+m]
	}
	var h header
	if err := json.Unmarshal(line, &h); err != nil || h.Entry == nil {
		f.Close()
		return nil, api.FileInfo{}, nil, fmt.Errorf("files: the handover's header: %v", err)
	}
	// The agent checked it; so does kilnd, which writes it.
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, api.FileInfo{}, nil, errors.New("files: the agent handed over something that is not a regular file")
	}
	return f, *h.Entry, nil, nil
}

// takeFile is the one descriptor of a control message.
func takeFile(oob []byte) (*os.File, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		return nil, errors.New("files: the handover carries no descriptor")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, errors.New("files: the handover carries no single descriptor")
	}
	return os.NewFile(uintptr(fds[0]), "handed over"), nil
}

type closeBoth struct {
	io.ReadCloser
	conn net.Conn
}

func (c closeBoth) Close() error {
	err := c.ReadCloser.Close()
	c.conn.Close()
	return err
}

// Serve answers a GET of the file f, described by e, Range honoured.
func Serve(w http.ResponseWriter, r *http.Request, f *os.File, e api.FileInfo) {
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", e.ModTime, f)
}

// Write writes body into the file f at path p (described by e, as it was
// opened) and answers with what it is then.
func Write(w http.ResponseWriter, body io.Reader, f *os.File, p string, e api.FileInfo) {
	n, err := io.CopyBuffer(onlyWriter{f}, body, make([]byte, 1<<20))
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			reply.Error(w, errnoError(header{Error: fmt.Sprintf("%s: wrote %d bytes of the body, then: %v", p, n, errno), Errno: int(errno)}))
			return
		}
		reply.Error(w, fmt.Errorf("%w: %s: wrote %d bytes of the body, then the body failed: %v", errdefs.ErrInvalidArgument, p, n, err))
		return
	}
	fi, err := f.Stat()
	if err != nil {
		reply.Error(w, fmt.Errorf("%w: %v", errdefs.ErrInternal, err))
		return
	}
	e.Size, e.ModTime = fi.Size(), fi.ModTime().UTC()
	reply.JSON(w, http.StatusOK, e)
}
