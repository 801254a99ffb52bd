package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
)

// relayWriteTimeout drops a watcher that has taken nothing for this long,
// as the agent does with its own watchers.
const relayWriteTimeout = 30 * time.Second

// relayPipeSize is the most one splice moves: a few of the agent's
// messages at a time.
const relayPipeSize = 256 << 10

// maxAnswerHead bounds the head of the agent's answer to a WebSocket
// request, which kilnd reads before it decides what the client's
// connection becomes.
const maxAnswerHead = 64 << 10

// readAnswer reads the agent's answer to the WebSocket request out. Only a
// switch of protocols (101) may make the client's connection a tunnel to
// the agent: then it returns what the agent has sent so far (the answer's
// head as the agent wrote it, and what followed it), for the relay to
// send on. Any other answer (an unknown process, an offset out of range)
// it relays as an ordinary response and returns upgraded false: the
// client's connection stays kilnd's, so a client that reuses it for its
// next request reaches kilnd again, not this agent.
//
// A protocol, when set, is named in the switch's head if the agent named
// none (see agentRequest).
//
// moving says the agent took up an offer of the client's socket
// (api.MoveHeader), and has said it is ready (the marker, not in sent):
// it waits for moveClient.
func readAnswer(w http.ResponseWriter, out *http.Request, agentConn net.Conn, protocol string) (sent []byte, upgraded, moving bool, err error) {
	// The agent answers at once; one that does not within the relay's
	// timeout is as good as gone.
	agentConn.SetReadDeadline(time.Now().Add(relayWriteTimeout))
	defer agentConn.SetReadDeadline(time.Time{})
	lr := &io.LimitedReader{R: agentConn, N: maxAnswerHead}
	var seen bytes.Buffer
	br := bufio.NewReader(io.TeeReader(lr, &seen))
	resp, err := http.ReadResponse(br, out)
	if err != nil {
		return nil, false, false, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		b := seen.Bytes()
		if out.Header.Get(api.MoveHeader) == "1" && resp.Header.Get(api.MoveHeader) == "1" {
			// The agent writes the marker once the connection is its
			// handler's alone (its server reads no more of it), and then
			// nothing until it is answered.
			if br.Buffered() == 0 {
				b = append(b, 0)
				if _, err := io.ReadFull(agentConn, b[len(b)-1:]); err != nil {
					return nil, false, false, err
				}
			} else if br.Buffered() != 1 {
				return nil, false, false, errors.New("relay: the agent wrote before its move")
			}
			if b[len(b)-1] != api.MoveMarker {
				return nil, false, false, fmt.Errorf("relay: the agent's move began with %q", b[len(b)-1])
			}
			b, moving = b[:len(b)-1], true
		}
		if protocol == "" || resp.Header.Get("Sec-WebSocket-Protocol") != "" {
			return b, true, moving, nil
		}
		// The head ends with an empty line; what follows it is the agent's
		// first messages.
		end := bytes.Index(b, []byte("\r\n\r\n")) + len("\r\n")
		sent = append(slices.Clip(b[:end]), "Sec-WebSocket-Protocol: "+protocol+"\r\n"...)
		return append(sent, b[end:]...), true, moving, nil
	}
	defer resp.Body.Close()
	lr.N = maxAnswerHead // for the body: an error's, small
	for k, v := range resp.Header {
		if k != "Connection" && k != "Keep-Alive" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
	return nil, false, false, nil
}

// movableAddr reports whether r came over a connection kilnd can hand an
// agent: a plain unix or TCP socket.
func movableAddr(r *http.Request) bool {
	switch r.Context().Value(http.LocalAddrContextKey).(type) {
	case *net.UnixAddr, *net.TCPAddr:
		return r.TLS == nil
	}
	return false
}

// join joins the client's hijacked connection, conn (brw buffering what
// it sent early), to agentConn once the agent has switched protocols:
// sent, the agent's answer, goes to the client first; then the client's
// socket moves to the agent when moving and the agent takes it, or bytes
// flow both ways until either side ends. The caller closes both
// connections; join has ended its copies when it returns. kind is the
// WebSocket's, for the metrics.
func (d *Daemon) join(ctx context.Context, conn net.Conn, brw *bufio.ReadWriter, agentConn net.Conn, kind string, sent []byte, moving bool) {
	d.metrics.wsOpened.WithLabelValues(kind).Inc()
	open := d.metrics.wsOpen.WithLabelValues(kind)
	open.Inc()
	defer open.Dec()
	// Hijacked, the connection is no longer the server's to watch: it
	// ends with the request's context (a preview revoked or expired).
	stop := context.AfterFunc(ctx, func() {
		shutdown(conn) // the agent's too, once it has the socket
		conn.Close()
		agentConn.Close()
	})
	defer stop()
	// The server's request deadlines no longer apply: a watcher stays as
	// long as it reads. (Writes get their own deadline below.)
	conn.SetDeadline(time.Time{})
	conn.SetWriteDeadline(time.Now().Add(relayWriteTimeout))
	if _, err := conn.Write(sent); err != nil {
		return
	}
	if moving {
		moved, err := moveClient(conn, brw.Reader, agentConn)
		if err != nil || moved {
			return
		}
	}
	toAgent := make(chan struct{})
	go func() {
		defer close(toAgent)
		io.Copy(agentConn, brw) // the client's messages (and anything it sent early)
		if cw, ok := agentConn.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}()
	copyOut(conn, agentConn) // the output
	conn.Close()
	agentConn.Close()
	<-toAgent
}

// moveClient answers an agent that took up the offer of the client's
// socket (api.MoveHeader): it sends the agent the socket, with what the
// client sent early, and waits until the agent is done with it (closes
// its connection). A client's socket that cannot be sent (none to send)
// the agent is told of instead, and moved is false: kilnd relays as
// before. What the client sent early goes to the agent either way.
func moveClient(client net.Conn, early *bufio.Reader, agentConn net.Conn) (moved bool, err error) {
	ac, ok := agentConn.(*net.UnixConn)
	if !ok {
		return false, errors.New("relay: the agent's connection is not a unix socket")
	}
	if early.Buffered() > api.MaxMoveEarly {
		// Not with net/http's reader, of 4 KiB.
		return false, errors.New("relay: the client sent too much before its handshake ended")
	}
	buffered, _ := early.Peek(early.Buffered())
	msg := make([]byte, 5, 5+len(buffered))
	msg[0] = api.MoveMarker
	binary.BigEndian.PutUint32(msg[1:], uint32(len(buffered)))
	msg = append(msg, buffered...)
	early.Discard(len(buffered))
	ac.SetWriteDeadline(time.Now().Add(relayWriteTimeout))
	defer ac.SetWriteDeadline(time.Time{})
	var werr error
	if sc, ok := client.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			err = raw.Control(func(fd uintptr) {
				_, _, werr = ac.WriteMsgUnix(msg, unix.UnixRights(int(fd)), nil)
			})
			if err == nil {
				if werr != nil {
					return false, werr
				}
				// The agent reads and writes the client's socket now; its
				// connection to kilnd carries nothing more, and ends with
				// the watcher.
				io.Copy(io.Discard, io.LimitReader(agentConn, 1))
				return true, nil
			}
		}
	}
	_, werr = ac.Write(msg)
	return false, werr
}

// shutdown shuts a socket down both ways: for every descriptor of it,
// the agent's that was handed it too, where closing kilnd's alone would
// not end it.
func shutdown(c net.Conn) {
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RDWR) })
		}
	}
}

// copyOut moves the agent's output to the client until either
// side fails, each write bounded by relayWriteTimeout. Between two sockets
// the bytes go through a pipe by splice, so kilnd never copies them: the
// kernel hands the agent's pages on to the client's socket.
func copyOut(dst, src net.Conn) {
	if spliced, err := spliceOut(dst, src); spliced || err != nil {
		return
	}
	buf := make([]byte, 256<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			dst.SetWriteDeadline(time.Now().Add(relayWriteTimeout))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// spliceOut is copyOut through a pipe. It reports false, having moved
// nothing, when either connection has no descriptor to splice.
func spliceOut(dst, src net.Conn) (spliced bool, err error) {
	sc, ok1 := src.(syscall.Conn)
	dc, ok2 := dst.(syscall.Conn)
	if !ok1 || !ok2 {
		return false, nil
	}
	srcRaw, err := sc.SyscallConn()
	if err != nil {
		return false, nil
	}
	dstRaw, err := dc.SyscallConn()
	if err != nil {
		return false, nil
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return false, nil
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	size := relayPipeSize
	if got, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, size); err != nil {
		size = 64 << 10 // the default: a pipe beyond the user's quota stays at it
	} else {
		size = got
	}
	const flags = unix.SPLICE_F_MOVE | unix.SPLICE_F_NONBLOCK
	for {
		var n int64
		var serr error
		if err := srcRaw.Read(func(fd uintptr) bool {
			n, serr = unix.Splice(int(fd), nil, p[1], nil, size, flags)
			return serr != unix.EAGAIN
		}); err != nil {
			return true, err
		}
		if serr == unix.EINVAL && !spliced {
			return false, nil // this kind of socket cannot be spliced
		}
		if serr != nil {
			return true, serr
		}
		if n == 0 {
			return true, io.EOF
		}
		spliced = true
		for n > 0 {
			dst.SetWriteDeadline(time.Now().Add(relayWriteTimeout))
			var m int64
			if err := dstRaw.Write(func(fd uintptr) bool {
				m, serr = unix.Splice(p[0], nil, int(fd), nil, int(n), flags)
				return serr != unix.EAGAIN
			}); err != nil {
				return true, err
			}
			if serr != nil {
				return true, serr
			}
			if m == 0 {
				return true, errors.New("relay: client socket took nothing")
			}
			n -= m
		}
	}
}
