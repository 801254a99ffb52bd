package daemon

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
// none (see relay).
func readAnswer(w http.ResponseWriter, out *http.Request, agentConn net.Conn, protocol string) (sent []byte, upgraded bool, err error) {
	// The agent answers at once; one that does not within the relay's
	// timeout is as good as gone.
	agentConn.SetReadDeadline(time.Now().Add(relayWriteTimeout))
	defer agentConn.SetReadDeadline(time.Time{})
	lr := &io.LimitedReader{R: agentConn, N: maxAnswerHead}
	var seen bytes.Buffer
	br := bufio.NewReader(io.TeeReader(lr, &seen))
	resp, err := http.ReadResponse(br, out)
	if err != nil {
		return nil, false, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if protocol == "" || resp.Header.Get("Sec-WebSocket-Protocol") != "" {
			return seen.Bytes(), true, nil
		}
		// The head ends with an empty line; what follows it (buffered) is
		// the agent's first messages.
		b := seen.Bytes()
		end := len(b) - br.Buffered() - len("\r\n")
		sent = append(slices.Clip(b[:end]), "Sec-WebSocket-Protocol: "+protocol+"\r\n"...)
		return append(sent, b[end:]...), true, nil
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
	return nil, false, nil
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
