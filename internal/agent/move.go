package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
)

// moveTimeout bounds the wait for kilnd's answer to a move.
const moveTimeout = 10 * time.Second

// movable is a connection from kilnd that kilnd may hand its client's
// socket over on (see api.MoveHeader): from then on reads and writes go
// to the client's socket, after the bytes the client had sent early, and
// kilnd's connection stays open only to tell kilnd, by closing, that the
// client's is done with.
type movable struct {
	*net.UnixConn
	to    atomic.Pointer[net.Conn] // the client's, once handed over
	early []byte                   // the client's first bytes, read before its socket; Read's alone
}

// moveListener makes each connection it accepts movable.
type moveListener struct{ net.Listener }

func (l moveListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if uc, ok := c.(*net.UnixConn); ok {
		return &movable{UnixConn: uc}, nil
	}
	return c, err
}

func (c *movable) current() net.Conn {
	if to := c.to.Load(); to != nil {
		return *to
	}
	return c.UnixConn
}

func (c *movable) Read(p []byte) (int, error) {
	if len(c.early) > 0 {
		n := copy(p, c.early)
		c.early = c.early[n:]
		return n, nil
	}
	return c.current().Read(p)
}

func (c *movable) Write(p []byte) (int, error) { return c.current().Write(p) }

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
	return errors.Join(err, c.UnixConn.Close())
}

// awaitMove reads kilnd's answer to a move: after it, the connection is
// the client's socket when kilnd handed it over, kilnd's still otherwise,
// with the client's early bytes first either way. Nothing else may use
// the connection meanwhile.
func (c *movable) awaitMove() error {
	c.UnixConn.SetReadDeadline(time.Now().Add(moveTimeout))
	defer c.UnixConn.SetReadDeadline(time.Time{})
	head := make([]byte, 5)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.UnixConn.ReadMsgUnix(head, oob)
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
	if _, err := io.ReadFull(c.UnixConn, head[n:]); err != nil {
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
	if _, err := io.ReadFull(c.UnixConn, c.early); err != nil {
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
