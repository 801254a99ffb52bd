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
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// A handover gives kilnd the open file a GET or PUT names, so that the
// content moves between the client's connection and the file without
// passing through the agent: GET /handover/{path...} (a file to read) and
// PUT /handover/{path...}?mode= (an upload's temporary file, made as PUT
// /files makes it) answer with one line, the file's header, carrying the
// file's descriptor (SCM_RIGHTS) on the agent's unix socket. Anything
// else (an error, a directory's listing) is an ordinary HTTP answer, for
// kilnd to pass on. kilnd never routes a client to these: they are its
// own.
//
// A PUT's header is marked Pending: kilnd writes the body, then sends its
// verdict line on the same connection ("commit SIZE" or "abort"), which
// the agent passes to the helper, and the helper's answer back, as one
// header line. The connection's end without a verdict is an abort.
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
	var f *os.File
	if op == "put" {
		f, err = c.pending()
	} else {
		f, err = c.regular()
	}
	if err != nil {
		reply.Error(w, err)
		return
	}
	line, err := json.Marshal(header{Entry: c.h.Entry, Pending: op == "put"})
	if err != nil {
		reply.Error(w, err)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		reply.Error(w, fmt.Errorf("%w: files: hand the file over: %w", errdefs.ErrInternal, err))
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
	if _, _, err := uc.WriteMsgUnix(append(line, '\n'), unix.UnixRights(int(f.Fd())), nil); err != nil || op != "put" {
		return
	}
	// kilnd's verdict, passed on; none is an abort (finish).
	v, err := readLine(brw.Reader, maxVerdict)
	if err != nil {
		return
	}
	if _, _, ok := parseVerdict(v); !ok {
		v = verdictAbort + "\n"
	}
	h, err := c.settle(v)
	if err != nil {
		h = header{Error: err.Error()}
	}
	if line, err = json.Marshal(h); err == nil {
		conn.Write(append(line, '\n'))
	}
}

// Handed is what the agent handed kilnd: a file to read, or an upload's
// temporary file to write (an Upload).
type Handed struct {
	Entry   api.FileInfo
	f       *os.File
	conn    *net.UnixConn // to the agent, for an upload's verdict
	pending bool
}

// File is the file handed over.
func (h *Handed) File() *os.File { return h.f }

// Commit asks the agent to put the upload's file, size bytes long, in its
// target's place. An agent that handed over the target itself (one that
// predates atomic uploads, adopted by a newer kilnd) is not asked: the
// file is written already.
func (h *Handed) Commit(size int64) (api.FileInfo, error) {
	if !h.pending {
		fi, err := h.f.Stat()
		if err != nil {
			return api.FileInfo{}, fmt.Errorf("%w: files: %w", errdefs.ErrInternal, err)
		}
		e := h.Entry
		e.Size, e.ModTime = fi.Size(), fi.ModTime().UTC()
		return e, nil
	}
	a, err := h.settle(fmt.Sprintf("%s %d\n", verdictCommit, size))
	if err != nil {
		return api.FileInfo{}, err
	}
	return committed(a)
}

// Abort asks the agent to remove the upload's file, and waits until it
// is gone.
func (h *Handed) Abort() {
	if h.pending {
		h.settle(verdictAbort + "\n")
	}
}

// settle sends the verdict line v and reads the agent's answer.
func (h *Handed) settle(v string) (header, error) {
	h.conn.SetDeadline(time.Now().Add(settleTimeout))
	if _, err := io.WriteString(h.conn, v); err != nil {
		return header{}, fmt.Errorf("%w: files: the agent went before the upload was settled", errdefs.ErrOutcomeUnknown)
	}
	line, err := readLine(h.conn, maxHeader)
	var a header
	if err == nil {
		err = json.Unmarshal([]byte(line), &a)
	}
	if err != nil {
		return header{}, fmt.Errorf("%w: files: the agent's answer to the upload's %s: %w", errdefs.ErrOutcomeUnknown, strings.Fields(v)[0], err)
	}
	return a, nil
}

// Close closes the file and the connection to the agent: an upload
// neither committed nor aborted is aborted.
func (h *Handed) Close() error {
	err := h.f.Close()
	if h.conn != nil {
		h.conn.Close()
	}
	return err
}

// Handover asks the agent on conn (a connection to its socket, which it
// closes, or the Handed's Close does) for the file of a GET or PUT r,
// whose path in the sandbox is rest (escaped as rawRest, if it needs to
// be; as after /files/). It returns what was handed over; or, when the
// agent answered otherwise (an error, a directory's listing), that
// answer, whose body the caller passes on and closes.
func Handover(conn *net.UnixConn, r *http.Request, rest, rawRest string) (*Handed, *http.Response, error) {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "http://agent/", http.NoBody)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	out.URL.Path, out.URL.RawQuery = handoverPrefix+rest, r.URL.RawQuery
	if rawRest != "" {
		out.URL.RawPath = handoverPrefix + rawRest
	}
	if err := out.Write(conn); err != nil {
		conn.Close()
		return nil, nil, err
	}
	buf := make([]byte, maxHeader)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	if oobn == 0 {
		// An ordinary answer: the connection goes with its body.
		resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(bytes.NewReader(buf[:n]), conn)), out)
		if err != nil {
			conn.Close()
			return nil, nil, err
		}
		resp.Body = closeBoth{resp.Body, conn}
		return nil, resp, nil
	}
	f, err := takeFile(oob[:oobn])
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	hd, err := handed(conn, f, buf[:n], buf)
	if err != nil {
		f.Close()
		conn.Close()
		return nil, nil, err
	}
	if !hd.pending {
		conn.Close()
		hd.conn = nil
	}
	return hd, nil, nil
}

// handed reads the rest of the header line that came with f (line, read
// into buf) and checks f.
func handed(conn *net.UnixConn, f *os.File, line, buf []byte) (*Handed, error) {
	// The line is one write of the agent's, short: the rest of it, if
	// the first read did not take it all.
	for !bytes.HasSuffix(line, []byte("\n")) && len(line) < maxHeader {
		m, err := conn.Read(buf[len(line):])
		if err != nil {
			return nil, fmt.Errorf("files: the handover's header: %w", err)
		}
		line = buf[:len(line)+m]
	}
	var h header
	if err := json.Unmarshal(line, &h); err != nil || h.Entry == nil {
		return nil, fmt.Errorf("files: the handover's header: %w", err)
	}
	// The agent checked it; so does kilnd, which writes it.
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, errors.New("files: the agent handed over something that is not a regular file")
	}
	return &Handed{Entry: *h.Entry, f: f, conn: conn, pending: h.Pending}, nil
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
