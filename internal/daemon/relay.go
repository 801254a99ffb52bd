package daemon

import (
	"errors"
	"io"
	"net"
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

// copyOut moves the agent's answer and output to the client until either
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
