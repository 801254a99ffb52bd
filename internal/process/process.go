// Package process runs commands and owns their output: always-on pumps into a ring, stdin,
// signals, the observed exit, the shutdown drain, and tombstones for finished processes.
package process

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/pidfd"
	"github.com/sandkiln/sandkiln/internal/ring"
	"github.com/sandkiln/sandkiln/internal/stdin"
)

// Errors of the engine, each of an errdefs class. Callers test with
// errors.Is; each error names the value that was wrong.
var (
	ErrInvalid  = errdefs.New(errdefs.ErrInvalidArgument, "invalid argument")
	ErrNotFound = errdefs.New(errdefs.ErrNotFound, "not found")
	ErrFinished = errdefs.New(errdefs.ErrFailedPrecondition, "process has finished")
	ErrStart    = errdefs.New(errdefs.ErrInvalidArgument, "process could not start")
	// ErrNoDir: the working directory asked for is not there.
	ErrNoDir = errdefs.New(errdefs.ErrNotFound, "process could not start: no such working directory")
	// ErrNoCommand and ErrNotExecutable are the start failures a shell
	// tells apart (127 and 126): no such program, and one it cannot run.
	ErrNoCommand     = errdefs.New(errdefs.ErrCommandNotFound, "command not found")
	ErrNotExecutable = errdefs.New(errdefs.ErrNotExecutable, "not executable")
	// ErrProcessLimit: the kernel made no process for the program (EAGAIN
	// from the fork): the sandbox holds as many as its limits.pids allows.
	// Start tries again for a moment first, as a shell does, for what a
	// process just killed leaves until it is reaped.
	ErrProcessLimit = errdefs.New(errdefs.ErrFailedPrecondition, "process could not start: the sandbox has as many processes as its limits.pids allows")
	ErrNoStdin      = errdefs.New(errdefs.ErrInvalidArgument, "process has no stdin pipe")
	ErrNotTerminal  = errdefs.New(errdefs.ErrInvalidArgument, "process has no terminal")
	ErrTerminalEOF  = errdefs.New(errdefs.ErrInvalidArgument, "a terminal has no end-of-input; send Ctrl-D as input")
	ErrOutOfRange   = ring.ErrOutOfRange
	// ErrCapture: the capture the process asked for could not begin (its
	// directory cannot be written), so it was not started. The request
	// was good; the host's storage is not.
	ErrCapture = errdefs.New(errdefs.ErrUnavailable, "process not started: its capture could not begin")
)

// StdinMode says whether a process gets a stdin pipe.
type StdinMode uint8

const (
	// StdinClosed gives the process /dev/null: it reads end-of-input at once.
	StdinClosed StdinMode = iota
	// StdinPipe gives the process a pipe fed by Write and ended by CloseStdin.
	StdinPipe
)

// Flow says what a process's output does when a reader falls behind.
type Flow uint8

const (
	// FlowDrop: the ring drops its oldest bytes and the reader is told
	// exactly what it missed; the workload never waits for a reader.
	FlowDrop Flow = iota
	// FlowBlock: a reader that attaches with a hold (a foreground client)
	// is given every byte: when the ring is full of what it has not read,
	// the pumps stop reading and the kernel pipe holds the process back.
	// The output is held from the start, for the reader to come, and for
	// a while after a holding reader goes; then it drops again.
	FlowBlock
)

// DefaultFlowGrace is how long a FlowBlock process's output waits for its
// holding reader: to come after the start, and to come back after it went.
const DefaultFlowGrace = 30 * time.Second

// WindowSize is a terminal's size in character cells.
type WindowSize struct {
	Cols, Rows uint16
}

// Spec describes a process to start.
type Spec struct {
	// Argv is the program and its arguments. Without Shell, Argv[0] is
	// looked up in the PATH of Env (or of this process when Env has none).
	Argv []string
	// Shell runs Argv[0] as a script with /bin/sh -c; Argv must then have
	// exactly one element.
	Shell bool
	// Env is the complete environment; nil inherits this process's.
	Env []string
	// Dir is the working directory; empty inherits this process's.
	Dir string
	// Credential, when set, is the user the process runs as.
	Credential *syscall.Credential
	Stdin      StdinMode
	// Terminal, when set, runs the process on a PTY of that size: one
	// combined output stream, input through the terminal.
	Terminal *WindowSize
	// RingBytes bounds the retained output; zero means ring.DefaultCapacity.
	RingBytes int
	// Flow is what the output does for a reader that falls behind;
	// FlowGrace bounds a FlowBlock process's wait for its holding reader
	// (zero means DefaultFlowGrace).
	Flow      Flow
	FlowGrace time.Duration
	// Capture, when set, is the durable log writer for this run, begun
	// (its begin record synced) before Start is called. The process owns
	// it from then on: its pumps push to its sink, and once they have
	// joined the process closes the sink and waits for the writer to write
	// the end record, for at most CaptureTimeout. If the process fails to
	// start, the run is ended at once.
	Capture Capturer
	// Begin, when set (and Capture is not), is called with the process's
	// id before anything runs, to begin its capture; an error fails the
	// start.
	Begin func(id string) (Capturer, error)
	// Launch, when set, starts the command in place of its Start, after
	// the engine has set its own attributes (process group, terminal): a
	// sandbox starts it in its user namespace, confined, born in the
	// cgroups its limits apply to. It returns the process once its
	// program runs, a child of this one, which the engine then waits for;
	// or why it does not run, having left nothing to wait for.
	Launch func(cmd *exec.Cmd) (*os.Process, error)
	// OOMKills, when set, counts the out-of-memory kills where the
	// process runs, for its exit to say whether it was one.
	OOMKills func() int64
	// Drain bounds how long the output is read after the process exits
	// while something it left behind still holds it open (zero means
	// DefaultDrain); see Process.reap.
	Drain time.Duration
}

// Capturer is what a process needs of its durable log's writer (a
// capture.Writer): the sink its pumps push to, the run's end and outcome,
// and the lines it holds for readers that come while a line is cut.
type Capturer interface {
	Sink() *capture.Sink
	Finish(ctx context.Context) error
	Result() capture.Result
	Caught(ctx context.Context) ([capture.NumLogStreams]capture.HeldLine, error)
}

// DefaultDrain is how long a process's output may go on after its exit,
// written by what the process left behind, before it is cut.
const DefaultDrain = 3 * time.Second

// Exit is how a process ended, as observed by waiting for it: a code, or
// the signal that killed it (then Code is -1).
type Exit struct {
	Code   int
	Signal syscall.Signal
	// OOMKilled says the kernel's out-of-memory killer ended it: it died
	// of SIGKILL, which nobody sent through this engine, while its
	// sandbox's count of such kills rose.
	OOMKilled bool
	// OutputCut says the output did not end by itself: the drain time
	// after the exit ran out while something the process left behind
	// held it open. It is set once the output has ended (Done).
	OutputCut bool
}

func (e Exit) String() string {
	if e.Signal != 0 {
		return "killed by " + unix.SignalName(e.Signal)
	}
	return fmt.Sprintf("exit code %d", e.Code)
}

// State is a process's lifecycle state as far as it has been observed.
type State string

const (
	Running State = "running"
	Exited  State = "exited"
)

// Status is a process's state without its output.
type Status struct {
	ID     string
	Argv   []string
	PID    int
	State  State
	Exit   *Exit // set only once observed
	Totals ring.Offsets
	// First is, per stream, the oldest offset still retained: a reader
	// attaching from below it is told of a gap.
	First ring.Offsets
	Ended [ring.NumStreams]bool // which streams reached their end
	// Dropped counts bytes the capture sink could not take, per stream.
	Dropped ring.Offsets
	// Capture is the log writer's outcome, once the drain has finished
	// with it; nil without capture or before.
	Capture *capture.Result
	// Flow is the process's; Held says its pumps wait now for a holding
	// reader to take what the ring holds.
	Flow      Flow
	Held      bool
	Streams   []ring.Stream
	Terminal  bool
	Stdin     *stdin.State // nil without a stdin pipe
	StartedAt time.Time
	ExitedAt  time.Time
}

// DefaultDrainTimeout bounds how long a finished process's pumps may take to
// reach end of output after what was left of its process group was
// killed.
const DefaultDrainTimeout = 2 * time.Second

// CaptureTimeout bounds how long the drain waits for the log writer to
// write what is queued and the end record. On timeout the writer is
// stopped and the run stays without an end record (interrupted).
const CaptureTimeout = 10 * time.Second

// Process is one started command. Its pumps, its reaper and its stdin
// writer are goroutines it owns: the reaper ends them all (the drain) once
// the exit is observed, and Done is closed when nothing of them is left.
type Process struct {
	id   string
	argv []string
	proc *os.Process // a child of this process, waited for by reap
	// oomKills counts out-of-memory kills where it runs; oomBefore is the
	// count before it started, killSent whether it was sent SIGKILL.
	oomKills  func() int64
	oomBefore int64
	killSent  bool
	ring      *ring.Ring
	sink      *capture.Sink
	capture   Capturer
	stdin     *stdin.Queue // nil for StdinClosed
	terminal  bool
	openLog   func() (*capture.Dir, error) // a captured process's log, for readers; set before it is shared
	flow      Flow
	grace     time.Duration // a FlowBlock process's wait for its holder
	started   time.Time
	drain     time.Duration // the output's time to end by itself after the exit
	drainFor  time.Duration // the pumps' time to end after the group's kill
	onDone    func()        // called by the reaper once the drain has finished

	pumps   sync.WaitGroup
	outputs []*os.File // read ends the pumps own; the drain may set their deadline

	exited chan struct{} // closed once exit is set
	ended  chan struct{} // closed once the output has ended and exit says how
	done   chan struct{} // closed when the drain has finished

	// mu guards the fields below. The reaper holds it while it turns the
	// waited-for zombie into an exit, so a signal sent under mu never
	// reaches a reused pid.
	mu       sync.Mutex
	exit     Exit
	exitedAt time.Time
	reaped   bool            // the zombie is reaped: its pid, and so its group's, may be reused
	captured *capture.Result // the log writer's outcome, after the drain
	master   *os.File        // the PTY master, for resizing; nil once the pump closed it
}

// Start starts a process and its pumps. A process that cannot start (no
// such program, not executable, bad working directory) is an error here,
// never an exit code.
func Start(id string, spec Spec) (*Process, error) {
	return start(id, spec, DefaultDrainTimeout, nil)
}

func start(id string, spec Spec, drainFor time.Duration, onDone func()) (*Process, error) {
	if spec.Begin != nil && spec.Capture == nil {
		w, err := spec.Begin(id)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCapture, err)
		}
		spec.Capture = w
	}
	p, err := startProcess(id, spec, drainFor, onDone)
	for wait := startRetry; errors.Is(err, ErrProcessLimit) && wait <= startRetryMax; wait *= 2 {
		time.Sleep(wait)
		p, err = startProcess(id, spec, drainFor, onDone)
	}
	if err != nil && spec.Capture != nil {
		// Nothing ran: end the run, empty, so it does not read as cut.
		spec.Capture.Sink().Close()
		ctx, cancel := context.WithTimeout(context.Background(), CaptureTimeout)
		spec.Capture.Finish(ctx)
		cancel()
	}
	return p, err
}

func startProcess(id string, spec Spec, drainFor time.Duration, onDone func()) (*Process, error) {
	argv, err := resolveArgv(spec)
	if err != nil {
		return nil, err
	}
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Env: spec.Env, Dir: spec.Dir}
	if spec.Dir != "" {
		fi, err := os.Stat(spec.Dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %q: %w", ErrNoDir, spec.Dir, errors.Unwrap(err))
		}
		if err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%w: working directory %q: %w", ErrStart, spec.Dir, notDir(err))
		}
	}
	p := &Process{
		id:       id,
		argv:     append([]string(nil), spec.Argv...),
		capture:  spec.Capture,
		terminal: spec.Terminal != nil,
		flow:     spec.Flow,
		grace:    cmp.Or(spec.FlowGrace, DefaultFlowGrace),
		drain:    cmp.Or(spec.Drain, DefaultDrain),
		drainFor: drainFor,
		onDone:   onDone,
		exited:   make(chan struct{}),
		ended:    make(chan struct{}),
		done:     make(chan struct{}),
	}
	if spec.Capture != nil {
		p.sink = spec.Capture.Sink()
	}
	streams, childEnds, err := p.openStdio(cmd, spec)
	if err != nil {
		return nil, err
	}
	p.ring = ring.New(ring.Config{Capacity: spec.RingBytes, Streams: streams})
	if p.flow == FlowBlock {
		p.ring.Hold(p.grace) // until the holding reader comes
	}
	if spec.OOMKills != nil {
		p.oomKills, p.oomBefore = spec.OOMKills, spec.OOMKills()
	}
	owned.Lock()
	if spec.Launch != nil {
		p.proc, err = spec.Launch(cmd)
	} else if err = cmd.Start(); err == nil {
		p.proc = cmd.Process
	}
	if err == nil {
		owned.pids[p.proc.Pid] = true
	}
	owned.Unlock()
	closeAll(childEnds)
	if err != nil {
		closeAll(p.outputs)
		if p.stdin != nil {
			p.stdin.Stop()
		}
		return nil, startError(argv[0], unwrapExecErr(err))
	}
	p.started = time.Now()
	for i, s := range streams {
		p.pumps.Go(func() { p.pump(s, p.outputs[i]) })
	}
	go p.reap()
	return p, nil
}

// openStdio gives cmd its standard descriptors: a terminal, or a pipe for
// each output stream and, with StdinPipe, one for its input. p keeps the
// ends it reads and writes; childEnds are closed once the child has
// them. It returns the streams p's ring holds.
func (p *Process) openStdio(cmd *exec.Cmd, spec Spec) (streams []ring.Stream, childEnds []*os.File, err error) {
	defer func() {
		if err != nil {
			closeAll(p.outputs)
			closeAll(childEnds)
		}
	}()
	if spec.Terminal != nil {
		master, slave, err := openTerminal(*spec.Terminal)
		if err != nil {
			return nil, nil, fmt.Errorf("process: open terminal: %w", err)
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Credential: spec.Credential}
		childEnds = append(childEnds, slave)
		in, err := dupFile(master)
		if err != nil {
			master.Close()
			return nil, childEnds, err
		}
		p.master = master
		p.outputs = []*os.File{master}
		p.stdin = stdin.New(in)
		return []ring.Stream{ring.PTY}, childEnds, nil
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: spec.Credential}
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, childEnds, fmt.Errorf("process: pipe: %w", err)
		}
		growPipe(r)
		p.outputs = append(p.outputs, r)
		childEnds = append(childEnds, w)
	}
	cmd.Stdout, cmd.Stderr = childEnds[0], childEnds[1]
	if spec.Stdin == StdinPipe {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, childEnds, fmt.Errorf("process: pipe: %w", err)
		}
		cmd.Stdin = r
		childEnds = append(childEnds, r)
		p.stdin = stdin.New(w)
	}
	return []ring.Stream{ring.Stdout, ring.Stderr}, childEnds, nil
}

// closeAll closes each file of fs that is not nil.
func closeAll(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

func notDir(err error) error {
	if err == nil {
		return errors.New("not a directory")
	}
	return errors.Unwrap(err)
}

// A start refused for the process limit is tried again after startRetry,
// then after twice as long each time up to startRetryMax: 0.3 s in all.
// The processes of a group just killed hold their pids until they are
// reaped, a few milliseconds; a sandbox that stays at its limit is told
// so after that.
const (
	startRetry    = 5 * time.Millisecond
	startRetryMax = 160 * time.Millisecond
)

// startError says why prog did not start, of the class a shell's exit code
// tells apart: not there (127), there but not runnable (126), or another
// failure.
func startError(prog string, err error) error {
	class := ErrStart
	switch {
	case errors.Is(err, errNotInPath) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
		class = ErrNoCommand
	case errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOEXEC) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EPERM):
		class = ErrNotExecutable
	case errors.Is(err, unix.EAGAIN):
		// The kernel's words ("resource temporarily unavailable") say
		// less than the limit's name.
		return fmt.Errorf("%w (%s not started)", ErrProcessLimit, prog)
	}
	return fmt.Errorf("%w: %s: %w", class, prog, err)
}

// errNotInPath is lookPath's: no directory of PATH has the program.
var errNotInPath = errors.New("executable file not found in PATH")

func unwrapExecErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// resolveArgv applies Shell and finds the program in the process's PATH,
// so errors about it come from Start, with the name the caller gave.
func resolveArgv(spec Spec) ([]string, error) {
	argv := spec.Argv
	if len(argv) == 0 || argv[0] == "" {
		return nil, fmt.Errorf("%w: process: empty command", ErrInvalid)
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, fmt.Errorf("%w: process: argument %q contains a NUL byte", ErrInvalid, a)
		}
	}
	for _, kv := range spec.Env {
		if strings.IndexByte(kv, 0) >= 0 || !strings.Contains(kv, "=") {
			return nil, fmt.Errorf("%w: process: environment entry %q is not KEY=VALUE", ErrInvalid, kv)
		}
	}
	if spec.Shell {
		if len(argv) != 1 {
			return nil, fmt.Errorf("%w: process: a shell command is one string, got %d", ErrInvalid, len(argv))
		}
		return []string{"/bin/sh", "-c", argv[0]}, nil
	}
	prog := argv[0]
	if !strings.Contains(prog, "/") {
		path, ok := os.LookupEnv("PATH")
		if spec.Env != nil {
			path, ok = "", false
			for _, kv := range spec.Env {
				if v, found := strings.CutPrefix(kv, "PATH="); found {
					path, ok = v, true
				}
			}
		}
		if !ok {
			path = "/usr/local/bin:/usr/bin:/bin"
		}
		found, err := lookPath(prog, path, spec.Dir)
		if err != nil {
			return nil, startError(prog, err)
		}
		prog = found
	}
	return append([]string{prog}, argv[1:]...), nil
}

func lookPath(prog, path, dir string) (string, error) {
	var denied error
	for d := range strings.SplitSeq(path, ":") {
		if d == "" {
			d = "."
		}
		cand := filepath.Join(d, prog)
		check := cand
		if !filepath.IsAbs(check) && dir != "" {
			check = filepath.Join(dir, check)
		}
		fi, err := os.Stat(check)
		if err != nil || fi.IsDir() {
			continue
		}
		if err := unix.Access(check, unix.X_OK); err != nil {
			denied = err
			continue
		}
		return cand, nil
	}
	if denied != nil {
		return "", denied
	}
	return "", errNotInPath
}

// growPipe raises a pipe's buffer to 1 MiB where the system allows it:
// fewer, larger reads per byte. Failure only costs speed.
func growPipe(f *os.File) {
	control(f, func(fd int) error {
		_, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, 1<<20)
		return err
	})
}

// dupFile duplicates f's descriptor without switching f to blocking mode
// (as f.Fd would), so both copies keep working with deadlines.
func dupFile(f *os.File) (*os.File, error) {
	var nfd int
	if err := control(f, func(fd int) error {
		var err error
		nfd, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	}); err != nil {
		return nil, fmt.Errorf("process: dup terminal: %w", err)
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}

// pump drains one stream from the moment the process starts, whether or not
// anyone watches: into the ring (which never waits) and the capture sink
// (which never waits). Only the kernel pipe can slow the workload down.
func (p *Process) pump(s ring.Stream, f *os.File) {
	rc, err := f.SyscallConn()
	// held is what the capture sink has not been given yet: consecutive
	// reads into one block go to it as one chunk, handed over when the
	// next read lands in another block or the pipe is empty. That keeps
	// the writer from waking for every read.
	var held ring.Chunk
	hand := func() {
		if held.Data != nil {
			p.sink.Push(held)
			held.Release()
			held = ring.Chunk{}
		}
	}
	for err == nil {
		buf := p.ring.Buffer(s)
		var n int
		var rerr error
		err = rc.Read(func(fd uintptr) bool {
			for {
				n, rerr = unix.Read(int(fd), buf)
				switch rerr {
				case unix.EINTR:
					continue
				case unix.EAGAIN:
					// The pipe is empty: before this goroutine parks,
					// wake the readers for what it committed so far and
					// give the sink what it holds.
					p.ring.Flush()
					if p.sink != nil {
						hand()
					}
					return false
				}
				return true
			}
		})
		if n > 0 {
			c := p.ring.Commit(s, n, n == len(buf))
			if p.sink == nil {
				c.Release()
			} else if grown, ok := held.Extend(c); ok {
				held = grown
			} else {
				hand()
				held = c
			}
		}
		if err == nil && (rerr != nil || n <= 0) {
			// EOF, or EIO from a PTY whose last writer is gone: no more
			// output is coming. (err is set instead when the drain's
			// deadline ended the wait.)
			err = io.EOF
		}
	}
	if p.sink != nil {
		hand()
	}
	p.ring.CloseStream(s)
	p.mu.Lock()
	if p.master == f {
		p.master = nil
	}
	p.mu.Unlock()
	f.Close()
}

// reap owns waiting for the process. Once the exit is observed it runs the
// drain: the output goes on until its last writer closes it (a background
// child may still hold the pipes), for at most the drain time, which a
// holding reader's wait does not count against; then what is left of the
// process group is killed, the pumps reach end of output (bounded: a
// writer outside the group, one that called setsid, is cut off where it
// is), stdin stops, and the sink's single sender is closed. The zombie is
// reaped only after the group's kill: until then it keeps its pid, and so
// its group's, from being reused.
func (p *Process) reap() {
	pid := p.proc.Pid
	pidfd.AwaitChild(pid) // no thread held in wait while it runs
	var info unix.Siginfo
	for {
		// WNOWAIT leaves the zombie in place, so the pid cannot be reused
		// until we reap it below under mu.
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	p.mu.Lock()
	p.exit = exitOfSiginfo(&info)
	if p.exit.Signal == unix.SIGKILL && !p.killSent && p.oomKills != nil && p.oomKills() > p.oomBefore {
		p.exit.OOMKilled = true
	}
	p.exitedAt = time.Now()
	close(p.exited)
	p.mu.Unlock()

	pumped := make(chan struct{})
	go func() {
		p.pumps.Wait()
		close(pumped)
	}()
	cut := !p.awaitOutput(pumped, p.drain)
	// The zombie leader still holds its pid and so its group id: this
	// reaches only what the process left behind, never a group that
	// reused the number.
	unix.Kill(-pid, unix.SIGKILL)
	if cut && !p.awaitOutput(pumped, p.drainFor) {
		// Something outside the group (it called setsid) still holds a
		// write end. End the streams where they are; what it writes
		// later was never emitted as far as anyone can tell.
		for _, f := range p.outputs {
			f.SetReadDeadline(time.Now())
		}
		<-pumped
	}
	p.mu.Lock()
	p.proc.Wait() // the exit is the one waitid reported
	p.reaped = true
	owned.Lock()
	delete(owned.pids, pid)
	owned.Unlock()
	p.exit.OutputCut = cut
	p.mu.Unlock()
	close(p.ended)
	if p.stdin != nil {
		p.stdin.Stop()
	}
	if p.capture != nil {
		p.sink.Close()
		ctx, cancel := context.WithTimeout(context.Background(), CaptureTimeout)
		p.capture.Finish(ctx)
		cancel()
		res := p.capture.Result()
		p.mu.Lock()
		p.captured = &res
		p.mu.Unlock()
	}
	close(p.done)
	if p.onDone != nil {
		p.onDone()
	}
}

// awaitOutput waits for pumped, for at most d; a pump that waits for a
// holding reader to take what the ring holds is not stuck, it is being
// read (or waits out the reader's grace), so that wait does not count. It
// reports whether the pumps ended.
func (p *Process) awaitOutput(pumped <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-pumped:
			return true
		case <-t.C:
			if !p.ring.Held() {
				return false
			}
			t.Reset(d)
		}
	}
}

// si_code values of SIGCHLD (asm-generic/siginfo.h).
const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

// exitOfSiginfo reads the exit waitid reported for a child (SIGCHLD's
// siginfo: si_code, then si_status in the union after si_pid and si_uid).
func exitOfSiginfo(info *unix.Siginfo) Exit {
	c := (*struct {
		signo, errno, code, _ int32
		pid                   int32
		uid                   uint32
		status                int32
	})(unsafe.Pointer(info))
	switch c.code {
	case cldExited:
		return Exit{Code: int(c.status)}
	case cldKilled, cldDumped:
		return Exit{Code: -1, Signal: syscall.Signal(c.status)}
	}
	return Exit{Code: -1}
}

// ID is the process's identifier.
func (p *Process) ID() string { return p.id }

// Done is closed once the process has exited and its output has drained.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait returns the exit once observed. A signal or terminate request is not
// an exit; only this is.
func (p *Process) Wait(ctx context.Context) (Exit, error) {
	select {
	case <-p.exited:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.exit, nil
	case <-ctx.Done():
		return Exit{}, ctx.Err()
	}
}

// Ended returns the exit once the output has ended too: then it says
// whether the drain cut the output (Exit.OutputCut).
func (p *Process) Ended(ctx context.Context) (Exit, error) {
	select {
	case <-p.ended:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.exit, nil
	case <-ctx.Done():
		return Exit{}, ctx.Err()
	}
}

// Status reports the process's state and output totals without touching
// its output.
func (p *Process) Status() Status {
	totals, ended := p.ring.Totals()
	st := Status{
		ID:        p.id,
		Argv:      p.argv,
		PID:       p.proc.Pid,
		State:     Running,
		Totals:    totals,
		First:     p.ring.First(),
		Ended:     ended,
		Streams:   p.ring.Streams(),
		Terminal:  p.terminal,
		StartedAt: p.started,
		Flow:      p.flow,
		Held:      p.ring.Held(),
	}
	if p.sink != nil {
		st.Dropped = p.sink.Dropped()
	}
	if p.stdin != nil {
		s := p.stdin.State()
		st.Stdin = &s
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if isClosed(p.exited) {
		e := p.exit
		st.State, st.Exit, st.ExitedAt = Exited, &e, p.exitedAt
	}
	st.Capture = p.captured
	return st
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process, or to its whole process group. Delivery
// is not an exit: Wait says when the process has ended.
func (p *Process) Signal(sig syscall.Signal, group bool) error {
	if sig < 0 || sig > 64 {
		return fmt.Errorf("%w: process: signal %d", ErrInvalid, sig)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if isClosed(p.exited) {
		if sig == unix.SIGKILL && group && !p.reaped {
			// What the process left behind, still holding its output
			// within the drain time, is killed with the group.
			unix.Kill(-p.proc.Pid, sig)
		}
		return fmt.Errorf("%w: %s (%v)", ErrFinished, p.id, p.exit)
	}
	pid := p.proc.Pid
	if group {
		pid = -pid
	}
	if sig == unix.SIGKILL {
		p.killSent = true
	}
	if err := unix.Kill(pid, sig); err != nil && err != unix.ESRCH {
		return fmt.Errorf("process: signal %v to %d: %w", sig, pid, err)
	}
	return nil
}

// Terminate kills the process's whole group with SIGKILL.
func (p *Process) Terminate() error { return p.Signal(unix.SIGKILL, true) }

// Write queues input at a stdin offset; see stdin.Queue.Write. It returns
// the total bytes accepted.
func (p *Process) Write(offset int64, data []byte) (int64, error) {
	if p.stdin == nil {
		return 0, fmt.Errorf("%w: %s", ErrNoStdin, p.id)
	}
	if isClosed(p.exited) {
		return 0, fmt.Errorf("%w: %s: stdin is gone", ErrFinished, p.id)
	}
	return p.stdin.Write(offset, data)
}

// CloseStdin sends end-of-input once, after earlier writes.
func (p *Process) CloseStdin() error {
	switch {
	case p.terminal:
		return fmt.Errorf("%w: %s", ErrTerminalEOF, p.id)
	case p.stdin == nil:
		return fmt.Errorf("%w: %s", ErrNoStdin, p.id)
	}
	return p.stdin.Close()
}

// Resize changes the terminal's size.
func (p *Process) Resize(ws WindowSize) error {
	if ws.Cols == 0 || ws.Rows == 0 {
		return fmt.Errorf("%w: process: window size %dx%d", ErrInvalid, ws.Cols, ws.Rows)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.terminal {
		return fmt.Errorf("%w: %s", ErrNotTerminal, p.id)
	}
	if p.master == nil {
		return fmt.Errorf("%w: %s: terminal closed", ErrFinished, p.id)
	}
	return setSize(p.master, ws)
}

// AttachOptions say how a reader attaches.
type AttachOptions struct {
	// Hold makes the reader hold the output of a FlowBlock process: it is
	// given every byte, the process waiting for it if need be. A reader
	// that goes away leaves the hold for the process's grace period, for
	// it to come back to. Refused for a FlowDrop process.
	Hold bool
	// Acked says a holding reader acknowledges what it got (Attachment.Ack)
	// from its start: the output is held from there, not from what was
	// sent, so that what was on its way when the reader went is kept too.
	Acked bool
}

// Attach opens a reader at the given per-stream offsets; see Attachment.
func (p *Process) Attach(from ring.Offsets, o AttachOptions) (*Attachment, error) {
	if o.Hold && p.flow != FlowBlock {
		return nil, fmt.Errorf("%w: %s was started with flow drop: no reader may hold its output", ErrInvalid, p.id)
	}
	c, err := p.ring.Cursor(from)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.id, err)
	}
	if o.Hold {
		c.Hold(p.grace, o.Acked) // false once the process is shut down: then it drops
	}
	a := &Attachment{cur: c, p: p, pos: from, terminal: p.terminal}
	if p.openLog != nil {
		a.log, a.caught = p.openLog, p.capture.Caught
	}
	return a, nil
}

// Release lets go of the output held for readers that are not attached:
// for its first holding reader, and for holding readers that went and may
// come back. The process no longer waits for them; a holding reader
// attached now keeps its hold.
func (p *Process) Release() { p.ring.Release() }

// Kill kills the whole process group and waits, bounded by ctx, until the
// drain has finished. Its output is held for nobody any more: the drain
// does not wait on a reader.
func (p *Process) Kill(ctx context.Context) error {
	p.ring.Unhold()
	p.Terminate()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("process: %s did not finish draining: %w", p.id, ctx.Err())
	}
}
