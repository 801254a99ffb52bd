// Pausing a gVisor sandbox without a run of runsc.
//
// `runsc pause` and `runsc resume` spend most of their time starting: the
// work is one call to the sandbox's control server (containerManager.Pause,
// which pauses gVisor's kernel, or containerManager.Resume), made under the
// lock runsc keeps for the container, after which runsc writes the
// container's new status ("paused", "running") into its state file. kilnd
// does the same itself, as runsc does it, so that every later runsc
// command (state, kill, checkpoint, resume, delete) finds what it would
// have found after runsc's own pause:
//
//   - the state file is <container>_sandbox:<sandbox>.state in runsc's
//     root, JSON, with the container's "status" and its "sandbox"'s "id"
//     and "controlSocketPath"; the lock is an flock(2) of the file beside
//     it ending in .lock, held by runsc for each read and write;
//   - the control server listens on that path, or on runsc-<sandbox>.sock
//     in the root, a unix stream socket; a call is a JSON object
//     {"method": M, "arg": A}, its answer {"success", "err", "result"},
//     one after the other on the connection (gVisor's urpc, no files
//     passed for these two).
//
// gVisor's kernel counts its pauses (a resume ends one), and runsc only
// asks the kernel to pause a container its state file says runs, to
// resume one it says is paused: kilnd checks the same, under the lock.
// Whatever does not look as expected before the call is sent (no state
// file, no socket, a status neither of the two, a method the server does
// not know) leaves the work to runsc, as before. Once the call is sent,
// its outcome is the outcome: asking runsc again could pause the kernel
// twice.

package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The control server's methods (runsc/boot's ContMgrPause, ContMgrResume,
// ContMgrSignal) and runsc's statuses.
const (
	runscMethodPause  = "containerManager.Pause"
	runscMethodResume = "containerManager.Resume"
	runscMethodSignal = "containerManager.Signal"
	runscRunning      = "running"
	runscPaused       = "paused"
)

// errNoFastPath says the fast path could not be taken and nothing was
// asked of the sandbox: runsc is.
var errNoFastPath = errors.New("sandbox: no direct way to runsc's sandbox")

// setPausedDirect pauses (pause) or resumes the sandbox's kernel through
// its control server and records it in runsc's state file, as runsc
// does. It returns errNoFastPath, wrapped, when runsc must do it
// instead; nil when the container is in the wanted state already.
func (s *guestSandbox) setPausedDirect(pause bool) error {
	from, to, method := runscRunning, runscPaused, runscMethodPause
	if !pause {
		from, to, method = runscPaused, runscRunning, runscMethodResume
	}
	st, unlock, err := s.runscState()
	if err != nil {
		return err
	}
	defer unlock()
	switch st.status {
	case to:
		return nil
	case from:
	default:
		return fmt.Errorf("%w: %s is %s", errNoFastPath, s.Container, st.status)
	}
	if err := runscCall(st.sock, method, nil, runscTimeout); err != nil {
		return err
	}
	status, err := json.Marshal(to)
	if err != nil {
		return err
	}
	st.rec["status"] = status
	out, err := json.Marshal(st.rec)
	if err != nil {
		return err
	}
	// Whole or not at all, beside it (runsc's listings match *.state only).
	tmp := filepath.Join(s.Root, ".kiln-state-"+strconv.Itoa(os.Getpid())+"-"+s.Container)
	if err := os.WriteFile(tmp, out, 0o640); err != nil {
		return fmt.Errorf("sandbox: %s is %s, its state file not: %w", s.Container, to, err)
	}
	if err := os.Rename(tmp, st.path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("sandbox: %s is %s, its state file not: %w", s.Container, to, err)
	}
	return nil
}

// signalDirect sends signal signo to the container's init process (the
// agent) through the sandbox's control server, as `runsc kill` does, to
// a container runsc's state file says runs. It returns errNoFastPath,
// wrapped, when runsc must do it instead.
func (s *guestSandbox) signalDirect(signo int) error {
	st, unlock, err := s.runscState()
	if err != nil {
		return err
	}
	defer unlock()
	if st.status != runscRunning {
		return fmt.Errorf("%w: %s is %s", errNoFastPath, s.Container, st.status)
	}
	// runsc/boot's SignalArgs, its Mode DeliverToProcess (0): PID 0 is
	// the container's init.
	arg := struct {
		CID   string
		Signo int32
		PID   int32
		Mode  int
	}{CID: s.Container, Signo: int32(signo)}
	return runscCall(st.sock, runscMethodSignal, arg, runscTimeout)
}

// runscStateFile is the container's state as runsc keeps it: the file,
// its fields, the status, and the control server's socket.
type runscStateFile struct {
	path, status, sock string
	rec                map[string]json.RawMessage
}

// runscState reads the container's state file under runsc's lock of it,
// and finds its control server's socket; unlock gives the lock back. An
// error wrapping errNoFastPath says runsc must be asked instead.
func (s *guestSandbox) runscState() (st runscStateFile, unlock func(), err error) {
	states, err := filepath.Glob(filepath.Join(s.Root, globEscape(s.Container)+"_sandbox:*.state"))
	if err != nil || len(states) != 1 {
		return st, nil, fmt.Errorf("%w: %d state files of %s", errNoFastPath, len(states), s.Container)
	}
	st.path = states[0]
	// Held apart from the named result, which each failing return below
	// sets to nil before the deferred release runs.
	release, err := lockRunscState(st.path[:len(st.path)-len("state")]+"lock", runscTimeout)
	if err != nil {
		return st, nil, fmt.Errorf("%w: %v", errNoFastPath, err)
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	b, err := os.ReadFile(st.path)
	if err != nil {
		return st, nil, fmt.Errorf("%w: %v", errNoFastPath, err)
	}
	var sb struct {
		ID                string `json:"id"`
		ControlSocketPath string `json:"controlSocketPath"`
	}
	if json.Unmarshal(b, &st.rec) != nil || json.Unmarshal(st.rec["status"], &st.status) != nil ||
		json.Unmarshal(st.rec["sandbox"], &sb) != nil || sb.ID == "" {
		return st, nil, fmt.Errorf("%w: %s is not the state file it should be", errNoFastPath, st.path)
	}
	st.sock = sb.ControlSocketPath
	if unix.Access(st.sock, unix.F_OK) != nil {
		st.sock = filepath.Join(s.Root, "runsc-"+sb.ID+".sock")
		if unix.Access(st.sock, unix.F_OK) != nil {
			return st, nil, fmt.Errorf("%w: no control socket for %s", errNoFastPath, s.Container)
		}
	}
	return st, release, nil
}

// lockRunscState takes runsc's lock of a container (an exclusive flock of
// path, which runsc makes with the state file) within timeout, and
// returns what gives it back.
func lockRunscState(path string, timeout time.Duration) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		time.Sleep(wait)
	}
	return func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// runscCall makes one call to the control server at sock, its argument
// arg (nil for none), bounded by timeout. An error wrapping errNoFastPath
// says the call was not made.
func runscCall(sock, method string, arg any, timeout time.Duration) error {
	addr := sock
	if len(addr) >= len(unix.RawSockaddrUnix{}.Path) {
		// Too long for a socket address: through /proc, as runsc does.
		fd, err := unix.Open(sock, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: %v", errNoFastPath, err)
		}
		defer unix.Close(fd)
		addr = "/proc/self/fd/" + strconv.Itoa(fd)
	}
	conn, err := net.DialTimeout("unix", addr, timeout)
	if err != nil {
		return fmt.Errorf("%w: %v", errNoFastPath, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	req, err := json.Marshal(struct {
		Method string `json:"method"`
		Arg    any    `json:"arg"`
	}{method, arg})
	if err != nil {
		return err
	}
	if _, err := conn.Write(req); err != nil {
		return fmt.Errorf("sandbox: %s: %w", method, err)
	}
	var res struct {
		Success bool   `json:"success"`
		Err     string `json:"err"`
	}
	if err := json.NewDecoder(conn).Decode(&res); err != nil {
		return fmt.Errorf("sandbox: %s: %w", method, err)
	}
	if !res.Success {
		if res.Err == "unknown method" {
			return fmt.Errorf("%w: %s: %s", errNoFastPath, method, res.Err)
		}
		return fmt.Errorf("sandbox: %s: %s", method, res.Err)
	}
	return nil
}

// globEscape quotes the characters filepath.Match reads specially.
func globEscape(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', '\\':
			out = append(out, '\\')
		}
		out = append(out, s[i])
	}
	return string(out)
}
