// How kilnd reaches a gVisor sandbox's agent: kilnd listens, the agent
// connects. gVisor cannot save (checkpoint) a sandbox that holds a bound
// host socket, and an agent that listened would hold one; a host socket
// the sandbox connected to is closed as the sandbox is saved, and the
// agent connects again, to the kilnd of the sandbox it goes on in. The
// agent keeps a few connections waiting (see guest's dialListener), so a
// Dial is an accept of one that is there already.

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// agentWait bounds a Dial's wait for the agent's next connection when the
// caller's context does not end sooner: an agent that runs connects within
// milliseconds of kilnd's taking the last one.
const agentWait = 10 * time.Second

// agentPoll is how often a Dial that waits asks whether the agent still
// runs.
const agentPoll = 100 * time.Millisecond

// channel is kilnd's end of a gVisor sandbox's agent channel: the socket
// it listens on, which only that sandbox's agent reaches. Its methods are
// safe for concurrent use.
type channel struct {
	path string
	l    *net.UnixListener
	// turn is held by the one Dial accepting at a time: a listener's
	// deadline is the listener's, not one Accept's.
	turn chan struct{}
	of   *channels
	made os.FileInfo // the socket's file, as it was made
}

// channels are a backend's channels, open until each is closed, or all
// are as kilnd stops (closeAll). The zero value is ready.
type channels struct {
	mu   sync.Mutex
	open map[*channel]struct{} // guarded by mu
}

// listen makes a channel's socket at path, in place of whatever an
// earlier kilnd or instance left there.
func (cs *channels) listen(path string) (*channel, error) {
	c, err := listen(path)
	if err != nil {
		return nil, err
	}
	c.of = cs
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.open == nil {
		cs.open = map[*channel]struct{}{}
	}
	cs.open[c] = struct{}{}
	return c, nil
}

// closeAll closes every channel open.
func (cs *channels) closeAll() {
	cs.mu.Lock()
	open := cs.open
	cs.open = nil
	cs.mu.Unlock()
	for c := range open {
		c.close()
	}
}

// listen makes the channel's socket at path, in place of whatever an
// earlier kilnd or instance left there.
func listen(path string) (*channel, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sandbox: the agent's socket: %w", err)
	}
	var l *net.UnixListener
	err := withSocketPath(path, func(p string) error {
		var err error
		l, err = net.ListenUnix("unix", &net.UnixAddr{Net: "unix", Name: p})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox: the agent's socket: %w", err)
	}
	// Removed by close, by its path: the one it was made by may have
	// named a descriptor since closed.
	l.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("sandbox: the agent's socket: %w", err)
	}
	return &channel{path: path, l: l, turn: make(chan struct{}, 1), made: fi}, nil
}

// close stops listening; the agent's waiting connections end with it,
// and the agent makes them again, to a kilnd that listens there next.
func (c *channel) close() error {
	if c.of != nil {
		c.of.mu.Lock()
		delete(c.of.open, c)
		c.of.mu.Unlock()
	}
	err := c.l.Close()
	// Unless another channel listens there since.
	if fi, serr := os.Lstat(c.path); serr == nil && os.SameFile(fi, c.made) {
		os.Remove(c.path)
	}
	return err
}

// dial takes the next connection the agent made, waiting for one until
// ctx ends, agentWait passes or alive says the agent is gone (asked every
// agentPoll). A connection whose agent end is already closed (the sandbox
// saved since, or an agent gone) is passed over.
func (c *channel) dial(ctx context.Context, alive func() bool) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, agentWait)
	defer cancel()
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("sandbox: no connection from the agent: %w", ctx.Err())
	}
	defer func() { <-c.turn }()
	// ctx's end (a cancel) wakes the Accept at once; the next turn sets
	// its own deadline after this one's function is done (stop, then mu).
	var mu sync.Mutex
	active := true
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if active {
			c.l.SetDeadline(time.Unix(1, 0))
		}
	})
	defer func() {
		stop()
		mu.Lock()
		active = false
		mu.Unlock()
	}()
	for {
		mu.Lock()
		if ctx.Err() == nil {
			c.l.SetDeadline(time.Now().Add(agentPoll))
		}
		mu.Unlock()
		conn, err := c.l.AcceptUnix()
		switch {
		case err == nil && open(conn):
			return conn, nil
		case err == nil:
			conn.Close()
		case ctx.Err() != nil:
			return nil, fmt.Errorf("sandbox: no connection from the agent: %w", ctx.Err())
		case !errors.Is(err, os.ErrDeadlineExceeded):
			return nil, fmt.Errorf("sandbox: the agent's socket: %w", err)
		case !alive():
			return nil, fmt.Errorf("sandbox: no connection from the agent: %w", errAgentExited)
		}
	}
}

// open reports whether the agent's end of c is still open and has sent
// nothing: the agent speaks only once spoken to.
func open(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	rc.Control(func(fd uintptr) {
		b := make([]byte, 1)
		_, _, err := unix.Recvfrom(int(fd), b, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		alive = errors.Is(err, unix.EAGAIN)
	})
	return alive
}
