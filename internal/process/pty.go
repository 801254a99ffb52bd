package process

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openTerminal opens a new PTY: the master, left non-blocking so that its
// pump waits in the runtime's poller and the drain's deadline can end that
// wait, and the slave, for the child. Every ioctl goes through the file's
// raw descriptor: taking File.Fd would switch the master to blocking mode,
// and a read of it would then hold an OS thread and outlive any deadline.
func openTerminal(ws WindowSize) (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	var n uint32
	err = control(master, func(fd int) error {
		var err error
		if n, err = unix.IoctlGetUint32(fd, unix.TIOCGPTN); err != nil {
			return fmt.Errorf("TIOCGPTN: %w", err)
		}
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock: %w", err)
		}
		return nil
	})
	if err == nil {
		err = setSize(master, ws)
	}
	if err == nil {
		slave, err = os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|unix.O_NOCTTY, 0)
	}
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// setSize sets a terminal's window size through its master.
func setSize(master *os.File, ws WindowSize) error {
	return control(master, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: ws.Cols, Row: ws.Rows})
	})
}

// control runs f on f's raw descriptor without changing its mode.
func control(file *os.File, f func(fd int) error) error {
	rc, err := file.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
