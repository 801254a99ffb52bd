package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
)

// moveTimeout bounds the wait for kilnd's answer to a move.
const moveTimeout = 10 * time.Second

// movable is a connection from kilnd. The agent writes whole WebSocket
// frames to it beside coder/websocket's (see writeMessage), and, on a unix
// socket, kilnd may hand its client's socket over on it (see
// api.MoveHeader): from then on reads and writes go to the client's
// socket, after the bytes the client had sent early, and kilnd's
// connection stays open only to tell kilnd, by closing, that the client's
// is done with.
type movable struct {
	net.Conn                          // kilnd's
	to       atomic.Pointer[net.Conn] // the client's, once handed over
	early    []byte                   // the client's first bytes, read before its socket; Read's alone

	wmu sync.Mutex // one frame at a time
	// framed is set once a handler writes its messages itself, from when
	// every write of coder/websocket is one control frame; closed once
	// one of them was a close frame, after which no frame may follow.
	framed, closed bool
	head           []byte // writeMessage's frame header
	// writeMessage's vector, kept so that writing a message allocates
	// nothing: out, over parts, is consumed by the write.
	parts [4][]byte
	out   net.Buffers
}

// moveListener makes each connection it accepts movable.
type moveListener struct{ net.Listener }

func (l moveListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &movable{Conn: c}, nil
}

// unixConn is kilnd's connection, when it is a unix socket: one kilnd can
// hand a socket over on.
func (c *movable) unixConn() (*net.UnixConn, bool) {
	uc, ok := c.Conn.(*net.UnixConn)
	return uc, ok
}

// WriteMsgUnix writes to kilnd's connection with ancillary data: how a
// file is handed over to kilnd (see files.Handover).
func (c *movable) WriteMsgUnix(b, oob []byte, addr *net.UnixAddr) (int, int, error) {
	uc, ok := c.unixConn()
	if !ok {
		return 0, 0, errors.New("agent: kilnd's connection is not a unix socket")
	}
	return uc.WriteMsgUnix(b, oob, addr)
}

func (c *movable) current() net.Conn {
	if to := c.to.Load(); to != nil {
		return *to
	}
	return c.Conn
}

func (c *movable) Read(p []byte) (int, error) {
	if len(c.early) > 0 {
		n := copy(p, c.early)
		c.early = c.early[n:]
		return n, nil
	}
	return c.current().Read(p)
}

// Write is how net/http and coder/websocket write: coder/websocket flushes
// each frame as it ends it, and a control frame (at most 125 bytes of
// payload) fits its buffer, so once the handler frames its messages every
// write here is one whole control frame. Each gets a write deadline of its
// own, as writeMessage's messages do: a ping to a watcher whose output has
// been quiet must not meet the deadline of the last message, long past.
func (c *movable) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	conn := c.current()
	if c.framed {
		if len(p) > 0 && p[0]&0x0f == wsClose {
			c.closed = true
		}
		if err := conn.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
			return 0, err
		}
	}
	return conn.Write(p)
}

func (c *movable) SetDeadline(t time.Time) error      { return c.current().SetDeadline(t) }
func (c *movable) SetReadDeadline(t time.Time) error  { return c.current().SetReadDeadline(t) }
func (c *movable) SetWriteDeadline(t time.Time) error { return c.current().SetWriteDeadline(t) }

// Close closes the client's socket, if it was handed over, and kilnd's
// connection.
func (c *movable) Close() error {
	var err error
	if to := c.to.Load(); to != nil {
		err = (*to).Close()
	}
	return errors.Join(err, c.Conn.Close())
}

// WebSocket opcodes (RFC 6455, section 5.2).
const (
	wsText   = 0x1
	wsBinary = 0x2
	wsClose  = 0x8
)

// frameMessages has the caller write its WebSocket messages with
// writeMessage from now on, leaving coder/websocket the control frames.
func (c *movable) frameMessages() {
	c.wmu.Lock()
	c.framed = true
	c.wmu.Unlock()
}

// writeMessage writes before (whole frames, possibly none), then one
// unfragmented, unmasked WebSocket message (op wsText or wsBinary) made of
// head and body: one frame, all in one writev, the body not copied.
// coder/websocket would write a message given in parts as a frame per part
// and an empty final one, in a write each. It fails once a close frame
// went out, and after timeout.
func (c *movable) writeMessage(before []byte, op byte, head, body []byte, timeout time.Duration) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	conn := c.current()
	if err := conn.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	c.head = appendWSHeader(c.head[:0], op, len(head)+len(body))
	c.parts = [4][]byte{before, c.head, head, body}
	c.out = c.parts[:]
	_, err := c.out.WriteTo(conn)
	c.parts = [4][]byte{} // nothing of the ring is kept
	return err
}

// writeFrames writes whole frames alone (what writeMessage writes before
// its message): a batch that must go out before the writer waits.
func (c *movable) writeFrames(frames []byte, timeout time.Duration) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	conn := c.current()
	if err := conn.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	_, err := conn.Write(frames)
	return err
}

// appendWSHeader appends the header of a final, unmasked frame of n bytes.
func appendWSHeader(dst []byte, op byte, n int) []byte {
	dst = append(dst, 0x80|op)
	switch {
	case n <= 125:
		return append(dst, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(dst, 126), uint16(n))
	default:
		return binary.BigEndian.AppendUint64(append(dst, 127), uint64(n))
	}
}

// awaitMove reads kilnd's answer to a move: after it, the connection is
// the client's socket when kilnd handed it over, kilnd's still otherwise,
// with the client's early bytes first either way. Nothing else may use
// the connection meanwhile.
func (c *movable) awaitMove() error {
	uc, ok := c.unixConn()
	if !ok {
		return errors.New("move: not a unix socket")
	}
	uc.SetReadDeadline(time.Now().Add(moveTimeout))
	defer uc.SetReadDeadline(time.Time{})
	head := make([]byte, 5)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := uc.ReadMsgUnix(head, oob)
	if err != nil {
		return fmt.Errorf("move: %w", err)
	}
	// Any descriptor that came is taken first, so that none leaks.
	var to net.Conn
	if oobn > 0 {
		if to, err = clientSocket(oob[:oobn]); err != nil {
			return err
		}
	}
	fail := func(err error) error {
		if to != nil {
			to.Close()
		}
		return err
	}
	if _, err := io.ReadFull(uc, head[n:]); err != nil {
		return fail(fmt.Errorf("move: %w", err))
	}
	if head[0] != api.MoveMarker {
		return fail(fmt.Errorf("move: kilnd answered %q", head[0]))
	}
	size := binary.BigEndian.Uint32(head[1:])
	if size > api.MaxMoveEarly {
		return fail(fmt.Errorf("move: %d early bytes, more than %d", size, api.MaxMoveEarly))
	}
	c.early = make([]byte, size)
	if _, err := io.ReadFull(uc, c.early); err != nil {
		return fail(fmt.Errorf("move: %w", err))
	}
	if to != nil {
		c.to.Store(&to)
	}
	return nil
}

// clientSocket is the one socket a move's ancillary data carries.
func clientSocket(oob []byte) (net.Conn, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("move: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		fds = append(fds, got...)
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("move: %d descriptors, not one", len(fds))
	}
	f := os.NewFile(uintptr(fds[0]), "client")
	defer f.Close()
	unix.CloseOnExec(fds[0])
	to, err := net.FileConn(f) // a duplicate
	if err != nil {
		return nil, fmt.Errorf("move: the client's socket: %w", err)
	}
	return to, nil
}
