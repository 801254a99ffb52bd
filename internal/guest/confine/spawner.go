package confine

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/pidfd"
)

// request is one process for the spawner to start; its three descriptors
// (stdin, stdout, stderr) travel beside it.
type request struct {
	Path    string   `json:"path"`
	Args    []string `json:"args"`
	Env     []string `json:"env"`
	Dir     string   `json:"dir,omitempty"`
	Setsid  bool     `json:"setsid,omitempty"`
	Setctty bool     `json:"setctty,omitempty"`
	Setpgid bool     `json:"setpgid,omitempty"`
	// User, when set, is who the process runs as, in the sandbox's user
	// namespace.
	User *credential `json:"user,omitempty"`
}

// credential is a process's uid, gid and supplementary groups.
type credential struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
}

// reply is the spawner's answer: Running first, once its program runs
// (its loader has opened its libraries); then Ready once it has confined
// itself, or Error; then for each request a PID, or the Errno or Error
// that stopped it.
type reply struct {
	Running bool   `json:"running,omitempty"`
	Ready   bool   `json:"ready,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Errno   int    `json:"errno,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Bounds of a message: a request carries at most the kernel's argument
// and environment space (the agent checks its own tighter bounds first).
const (
	maxRequest = 8 << 20
	maxReply   = 64 << 10
)

// Timeouts of a spawner's start and of each request: it answers at once
// unless something stopped it.
const (
	readyTimeout   = 20 * time.Second
	requestTimeout = 10 * time.Second
)

func readConfig() (Config, error) {
	var cfg Config
	if err := json.Unmarshal([]byte(os.Getenv(Env)), &cfg); err != nil {
		return cfg, fmt.Errorf("confine: spawner config: %w", err)
	}
	os.Unsetenv(Env)
	return cfg, nil
}

func unsafePointer(s string) unsafe.Pointer {
	p, _ := unix.BytePtrFromString(s)
	return unsafe.Pointer(p)
}

// frame is a message's length, then the message.
func frame(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b))), b...), nil
}

// writeReply, in the spawner, writes r whole on the blocking socket.
func writeReply(fd int, r reply) error {
	b, err := frame(r)
	if err != nil {
		return err
	}
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// readRequest, in the spawner, reads one request and the descriptors
// that came with it.
func readRequest(fd int) (request, []int, error) {
	var req request
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(3*4))
	var files []int
	var got []byte
	for len(got) < 4 {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return req, files, err
		}
		if n == 0 {
			return req, files, io.EOF
		}
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return req, files, err
			}
			for _, m := range msgs {
				fds, err := unix.ParseUnixRights(&m)
				if err == nil {
					files = append(files, fds...)
				}
			}
		}
		got = append(got, buf[:n]...)
	}
	size := int(binary.BigEndian.Uint32(got))
	if size > maxRequest {
		return req, files, fmt.Errorf("confine: a request of %d bytes", size)
	}
	for len(got) < 4+size {
		n, err := unix.Read(fd, buf[:min(len(buf), 4+size-len(got))])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return req, files, err
		}
		if n == 0 {
			return req, files, io.ErrUnexpectedEOF
		}
		got = append(got, buf[:n]...)
	}
	if len(got) != 4+size {
		return req, files, errors.New("confine: data after a request")
	}
	return req, files, json.Unmarshal(got[4:], &req)
}

// Spawner is the agent's side of a sandbox's spawner: it starts the
// spawner when the first process starts, and again if it has died.
type Spawner struct {
	exe    *os.File
	cfg    Config
	groups []*os.File
	start  func(*exec.Cmd) error

	mu      sync.Mutex
	conn    *net.UnixConn
	helper  *exec.Cmd
	gone    chan struct{} // closed once the helper has been waited for
	running bool          // it said so
	ready   bool          // it said so
	closed  bool
	idle    time.Duration // see StopWhenIdle; zero: never
	used    time.Time     // the last start's end
	timer   *time.Timer   // the next idle check, once idle is set
}

// NewSpawner makes a Spawner that runs exe (an open descriptor of kilnd's
// binary) with cfg, its forking thread in the cgroups whose tasks files
// groups are, started by start (which adds the sandbox's user namespace).
// The Spawner owns exe and groups.
func NewSpawner(exe *os.File, cfg Config, groups []*os.File, start func(*exec.Cmd) error) *Spawner {
	cfg.Groups = len(groups)
	return &Spawner{exe: exe, cfg: cfg, groups: groups, start: start}
}

// UserNamespace opens the user namespace of the spawner that runs (one is
// started unless it does): the sandbox's, in which every process it
// starts runs.
func (s *Spawner) UserNamespace() (*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		if err := s.begin(); err != nil {
			return nil, err
		}
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", s.helper.Process.Pid))
	if err != nil {
		return nil, fmt.Errorf("confine: the spawner's user namespace: %w", err)
	}
	return f, nil
}

// Start starts cmd's program through the spawner, with cmd's arguments,
// environment, directory, standard descriptors (each an *os.File or nil)
// and session attributes. The process it returns is this process's child,
// running its program; on an error nothing runs.
func (s *Spawner) Start(cmd *exec.Cmd) (*os.Process, error) {
	req := request{Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir}
	if req.Env == nil {
		req.Env = os.Environ()
	}
	if a := cmd.SysProcAttr; a != nil {
		req.Setsid, req.Setctty, req.Setpgid = a.Setsid, a.Setctty, a.Setpgid
		if c := a.Credential; c != nil {
			req.User = &credential{UID: c.Uid, GID: c.Gid, Groups: c.Groups}
		}
	}
	var fds [3]int
	for i, v := range []any{cmd.Stdin, cmd.Stdout, cmd.Stderr} {
		switch f := v.(type) {
		case *os.File:
			fds[i] = int(f.Fd())
		case nil:
			null, err := os.Open(os.DevNull)
			if err != nil {
				return nil, err
			}
			defer null.Close()
			fds[i] = int(null.Fd())
		default:
			return nil, fmt.Errorf("confine: standard descriptor %d is not a file", i)
		}
	}
	msg, err := frame(req)
	if err != nil {
		return nil, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("confine: the sandbox is shutting down")
	}
	// A spawner that died (the sandbox's processes may kill it) refuses
	// the request before it reads any of it: then a new one gets it. Once
	// it is sent, it is never sent again, lest a program run twice.
	for attempt := 0; ; attempt++ {
		if err = s.ensure(); err != nil {
			return nil, err
		}
		if err = s.send(msg, fds[:]); err == nil || attempt > 0 {
			break
		}
		s.stop()
	}
	defer s.armIdle()
	var r reply
	if err == nil {
		if r, err = readReply(s.conn); errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = errors.New("it ended before it answered (killed from inside the sandbox?); if the process started, it runs unwatched")
		}
	}
	if err != nil {
		// The spawner died or hangs: the next start has a new one. A
		// process it forked before it went is nobody's to watch.
		s.stop()
		return nil, fmt.Errorf("confine: the sandbox's spawner: %w", err)
	}
	switch {
	case r.PID > 0:
		return os.FindProcess(r.PID)
	case r.Errno != 0:
		return nil, &os.PathError{Op: "fork/exec", Path: cmd.Path, Err: syscall.Errno(r.Errno)}
	case r.Error != "":
		return nil, errors.New(r.Error)
	}
	return nil, fmt.Errorf("confine: the spawner answered %+v", r)
}

// Warm has the spawner, started unless it runs, go once through a start
// whose program does not exist (warmPath): its child forks and fails to
// execute it, so nothing runs in the sandbox, and the code and memory a
// start uses are in place before the first process asks for them (a
// sandbox made ahead's first start took about twice its next ones'). It
// does not count as a start for StopWhenIdle.
func (s *Spawner) Warm() error {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	fd := int(null.Fd())
	msg, err := frame(request{Path: warmPath, Args: []string{warmPath}})
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("confine: the sandbox is shutting down")
	}
	if err := s.ensure(); err != nil {
		return err
	}
	if err := s.send(msg, []int{fd, fd, fd}); err != nil {
		s.stop()
		return fmt.Errorf("confine: warm the spawner: %w", err)
	}
	r, err := readReply(s.conn)
	if err != nil {
		s.stop()
		return fmt.Errorf("confine: warm the spawner: %w", err)
	}
	if r.PID > 0 {
		return fmt.Errorf("confine: warm the spawner: %s ran", warmPath)
	}
	return nil
}

// warmPath is a path no sandbox's filesystem has (/proc refuses to make
// anything below its root): Warm's program.
const warmPath = "/proc/kiln-spawner-warm"

// send writes a request; the descriptors go with its first bytes, and a
// large request's rest follows as the socket takes it. s.mu is held.
func (s *Spawner) send(msg []byte, fds []int) error {
	s.conn.SetDeadline(time.Now().Add(requestTimeout))
	first := min(len(msg), 4096)
	n, _, err := s.conn.WriteMsgUnix(msg[:first], unix.UnixRights(fds...), nil)
	if err == nil {
		_, err = s.conn.Write(msg[n:])
	}
	return err
}

// Begin starts the spawner, unless one runs, without waiting for it to be
// ready: a sandbox's agent starts it while it goes on setting up.
func (s *Spawner) Begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("confine: the spawner is closed")
	}
	if s.conn != nil {
		return nil
	}
	return s.begin()
}

// AwaitRunning starts the spawner unless it runs, and waits until its
// program does (a dynamically linked one's loader has opened its
// libraries), not until it is ready.
func (s *Spawner) AwaitRunning() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		if err := s.begin(); err != nil {
			return err
		}
	}
	if err := s.awaitRunning(); err != nil {
		s.stop()
		return fmt.Errorf("confine: the sandbox's spawner did not start: %w", err)
	}
	return nil
}

// awaitRunning reads the spawner's first reply, once. s.mu is held.
func (s *Spawner) awaitRunning() error {
	if s.running {
		return nil
	}
	s.conn.SetDeadline(time.Now().Add(readyTimeout))
	r, err := readReply(s.conn)
	if err == nil && !r.Running {
		err = errors.New(r.Error)
		if r.Error == "" {
			err = errors.New("its first message was not that it runs")
		}
	}
	if err != nil {
		return err
	}
	s.running = true
	return nil
}

// ensure makes sure a spawner runs and is ready. s.mu is held.
func (s *Spawner) ensure() error {
	if s.conn != nil {
		select {
		case <-s.gone:
			s.stop() // it died: start another
		default:
		}
	}
	if s.conn == nil {
		if err := s.begin(); err != nil {
			return err
		}
	}
	if s.ready {
		return nil
	}
	err := s.awaitRunning()
	var r reply
	if err == nil {
		s.conn.SetDeadline(time.Now().Add(readyTimeout))
		r, err = readReply(s.conn)
	}
	if err == nil && !r.Ready {
		err = errors.New(r.Error)
	}
	if err != nil {
		s.stop()
		return fmt.Errorf("confine: the sandbox's spawner did not start: %w", err)
	}
	s.ready = true
	return nil
}

// begin starts a spawner. s.mu is held.
func (s *Spawner) begin() error {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("confine: spawner socket: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(pair[0]), "spawner"), os.NewFile(uintptr(pair[1]), "spawner")
	defer theirs.Close()
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return fmt.Errorf("confine: spawner socket: %w", err)
	}
	conn := c.(*net.UnixConn)
	b, err := json.Marshal(s.cfg)
	if err != nil {
		conn.Close()
		return err
	}
	// One thread runs its Go code (it forks one process at a time), from
	// its runtime's start, which then makes no thread for a second.
	cmd := &exec.Cmd{
		Path:        "/proc/self/fd/" + strconv.Itoa(int(s.exe.Fd())),
		Args:        []string{"kiln-spawner"},
		Env:         []string{Env + "=" + string(b), "GOMAXPROCS=1"},
		Dir:         "/",
		ExtraFiles:  append([]*os.File{theirs}, s.groups...),
		SysProcAttr: &syscall.SysProcAttr{},
	}
	if err := s.start(cmd); err != nil {
		conn.Close()
		return fmt.Errorf("confine: start the sandbox's spawner: %w", err)
	}
	gone := make(chan struct{})
	go func() {
		pidfd.AwaitChild(cmd.Process.Pid) // no thread held in wait while it runs
		cmd.Wait()
		close(gone)
	}()
	s.conn, s.helper, s.gone, s.running, s.ready = conn, cmd, gone, false, false
	// Before it forks anything: it has not read a request yet.
	adj := fmt.Sprintf("/proc/%d/oom_score_adj", cmd.Process.Pid)
	if err := os.WriteFile(adj, []byte(strconv.Itoa(OOMScoreAdj)), 0); err != nil {
		s.stop()
		return fmt.Errorf("confine: the spawner's oom_score_adj: %w", err)
	}
	return nil
}

// stop ends the spawner and waits for it. s.mu is held.
func (s *Spawner) stop() {
	if s.conn == nil {
		return
	}
	s.conn.Close()
	select {
	case <-s.gone:
	case <-time.After(2 * time.Second):
		s.helper.Process.Kill()
		<-s.gone
	}
	s.conn, s.helper, s.gone = nil, nil, nil
}

// StopWhenIdle makes the spawner end once it has started nothing for d
// and nothing of the sandbox runs: no process in this pid namespace (the
// sandbox's, whose first process is the agent) but the agent and the
// spawner. An idle sandbox then costs its agent alone; its next process
// starts through a new spawner, as after one that died, which takes a few
// milliseconds. The sandbox's user namespace ends with the spawner that
// made it, when no process of it is left; the next one's has the same
// maps, so nothing of it (files, their owners) tells them apart. With
// afterUse the count starts at the first process it starts, not now.
func (s *Spawner) StopWhenIdle(d time.Duration, afterUse bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idle = d
	if !afterUse {
		s.armIdle()
	}
}

// armIdle counts the spawner used now and makes sure an idle check comes.
// s.mu is held.
func (s *Spawner) armIdle() {
	if s.idle <= 0 || s.closed {
		return
	}
	s.used = time.Now()
	if s.timer == nil {
		s.timer = time.AfterFunc(s.idle, s.idleCheck)
		return
	}
	s.timer.Reset(s.idle)
}

// idleCheck ends the spawner if it has been idle for s.idle and the
// sandbox runs nothing; otherwise it looks again later.
func (s *Spawner) idleCheck() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.conn == nil {
		return
	}
	if since := time.Since(s.used); since < s.idle {
		s.timer.Reset(s.idle - since)
		return
	}
	if othersRun(s.helper.Process.Pid) {
		s.timer.Reset(s.idle)
		return
	}
	s.stop()
}

// othersRun reports whether a process runs in this pid namespace beside
// this one and the spawner's: one of the sandbox's, or one going.
// Anything it cannot read counts as running.
func othersRun(spawner int) bool {
	d, err := os.Open("/proc")
	if err != nil {
		return true
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return true
	}
	self := os.Getpid()
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil && pid != self && pid != spawner {
			return true
		}
	}
	return false
}

// Close ends the spawner; Start fails from then on.
func (s *Spawner) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	s.stop()
	for _, f := range s.groups {
		f.Close()
	}
	s.exe.Close()
}

func readReply(c *net.UnixConn) (reply, error) {
	var r reply
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return r, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxReply {
		return r, fmt.Errorf("a reply of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}
