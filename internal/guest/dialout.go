package guest

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// In a runtime's container the agent serves kilnd on connections it
// makes itself, to a socket kilnd listens on, rather than on a socket it
// binds: gVisor cannot save a sandbox holding a bound host socket (its
// checkpoint refuses), while a host socket the sandbox connected to is
// closed as the sandbox is saved, and is simply made again afterwards,
// in the sandbox that goes on and in each one restored from the image.

// spares is how many connections the agent keeps open to kilnd, waiting
// for a request: kilnd takes one for each of its connections, and the
// agent makes another as soon as one is taken.
const spares = 2

// Redials back off from redialMin to redialMax while kilnd's socket does
// not answer (kilnd restarting): soon enough after it is back that a
// request waits a few milliseconds, rarely enough not to matter.
const (
	redialMin = time.Millisecond
	redialMax = 100 * time.Millisecond
)

// dialListener is a net.Listener whose connections the agent made to
// kilnd's socket: Accept gives one once kilnd has written to it, its
// bytes all unread. Close ends it and waits for its goroutines.
type dialListener struct {
	dial  func() (*net.UnixConn, error)
	ready chan *net.UnixConn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup

	mu sync.Mutex
	// waiting are the connections made and not yet accepted, which Close
	// closes; guarded by mu.
	waiting map[*net.UnixConn]struct{}
}

// newDialListener keeps spares connections made by dial waiting.
func newDialListener(dial func() (*net.UnixConn, error)) *dialListener {
	l := &dialListener{dial: dial, ready: make(chan *net.UnixConn), done: make(chan struct{}), waiting: map[*net.UnixConn]struct{}{}}
	for range spares {
		l.wg.Go(l.keep)
	}
	return l
}

// keep makes a connection, waits until kilnd writes to it, hands it to
// Accept, and makes the next, until Close. A connection that kilnd's end
// closes first (kilnd gone, or the sandbox saved) is made again.
func (l *dialListener) keep() {
	wait := redialMin
	for {
		c, err := l.dial()
		if err != nil {
			select {
			case <-l.done:
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, redialMax)
			continue
		}
		wait = redialMin
		if !l.hold(c) {
			return
		}
		used := awaitRequest(c)
		if !l.release(c) {
			c.Close()
			return
		}
		if !used {
			c.Close()
			continue
		}
		select {
		case l.ready <- c:
		case <-l.done:
			c.Close()
			return
		}
	}
}

// hold records c as waiting, unless the listener is closed (then c is
// closed).
func (l *dialListener) hold(c *net.UnixConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting == nil {
		c.Close()
		return false
	}
	l.waiting[c] = struct{}{}
	return true
}

// release forgets c as waiting; false once the listener is closed.
func (l *dialListener) release(c *net.UnixConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting == nil {
		return false
	}
	delete(l.waiting, c)
	return true
}

// awaitRequest waits, in the runtime's poller, until c has bytes to read
// and reads none of them: true then, false if c ended first.
func awaitRequest(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var ok bool
	b := make([]byte, 1)
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return false
		}
		ok = err == nil && n > 0
		return true
	})
	return err == nil && ok
}

// Reconnect closes the connections waiting whose kilnd end is closed, and
// they are made again: those that a save of the sandbox closed on the
// host's side without waking their reader. One kilnd has written to is
// left to its reader, which hands it on.
func (l *dialListener) Reconnect() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.waiting {
		if ended(c) {
			c.Close()
		}
	}
}

// ended reports whether c's other end is closed, without waiting and
// without reading anything.
func ended(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return true
	}
	done := true
	rc.Control(func(fd uintptr) {
		b := make([]byte, 1)
		n, _, err := unix.Recvfrom(int(fd), b, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		done = !errors.Is(err, unix.EAGAIN) && (err != nil || n == 0)
	})
	return done
}

// Accept implements net.Listener.
func (l *dialListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener: the connections waiting are closed, and
// Close returns once its goroutines have ended. Connections accepted are
// their server's.
func (l *dialListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.mu.Lock()
		for c := range l.waiting {
			c.Close()
		}
		l.waiting = nil
		l.mu.Unlock()
		l.wg.Wait()
	})
	return nil
}

// Addr implements net.Listener.
func (l *dialListener) Addr() net.Addr { return &net.UnixAddr{Net: "unix", Name: "kilnd"} }

// dialAt connects to the unix socket name in the directory open as dir,
// by its /proc/self/fd path: the directory itself may be hidden under
// another mount.
func dialAt(dir int, name string) func() (*net.UnixConn, error) {
	path := "/proc/self/fd/" + strconv.Itoa(dir) + "/" + name
	return func() (*net.UnixConn, error) {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Net: "unix", Name: path})
		if err != nil {
			return nil, err
		}
		return c, nil
	}
}
