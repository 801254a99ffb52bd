package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockName is the file in the state directory whose lock a kilnd holds
// for as long as it runs; it holds that kilnd's pid, for the error the
// next one gives.
const lockName = "kilnd.lock"

// lockState takes the state directory's lock, before anything in the
// directory is read: a second kilnd on the same directory is refused
// before it looks at a single record, so it never adopts, stops or
// removes the first one's sandboxes. A kilnd older than the lock takes
// none, but serves the socket: one that answers refuses as well. The lock
// ends with the file (Close, or the process).
func lockState(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kilnd: state directory lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := "another kilnd"
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				who += " (pid " + strconv.Itoa(pid) + ")"
			}
			return nil, fmt.Errorf("kilnd: %s uses the state directory %s", who, dir)
		}
		return nil, fmt.Errorf("kilnd: state directory lock: %w", err)
	}
	sock := filepath.Join(dir, SocketName)
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		f.Close()
		return nil, fmt.Errorf("kilnd: another kilnd serves %s", sock)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
