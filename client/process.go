package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
)

// Format is how Output delivers bytes.
type Format int

const (
	// Text decodes UTF-8, correctly across chunk boundaries; invalid bytes
	// become U+FFFD.
	Text Format = iota
	// Bytes delivers the exact bytes.
	Bytes
)

// StartOptions describe a process to start.
type StartOptions struct {
	// Command and Args run a program directly (no shell); Shell, instead,
	// runs a command line with /bin/sh -c.
	Command string
	Args    []string
	Shell   string
	Env     map[string]string
	Cwd     string
	// User runs the process as a user of the sandbox's (see
	// api.ExecRequest.User).
	User string
	// Stdin opens a pipe for Write and CloseStdin; without it stdin is
	// closed.
	Stdin bool
	// Terminal runs the process on a terminal of that size: one combined
	// stream, input through the terminal.
	Terminal *api.TTY
	// Capture keeps the output durably in the sandbox's captured logs.
	Capture bool
	// Flow is api.FlowDrop (the zero value's) or api.FlowBlock: this
	// handle's Output is then given every byte, the process waiting for
	// it if need be, as a command's output waits for its terminal; other
	// readers still lose what they fall behind on, exactly counted. If the
	// handle goes away, the output stays held for kilnd's grace period
	// (30 s) for Reopen to come back to, then drops.
	Flow   string
	Format Format
}

// Process is a handle on a process. Its methods are safe for concurrent
// use; its output has one reader at a time.
type Process struct {
	s        *Sandbox
	ID       string
	format   Format
	terminal bool
	stdin    bool
	hold     bool // Output asks to hold the output (a flow block process's)

	// writing serialises Write and CloseStdin: each carries the offset the
	// previous one left, so two at once would overlap.
	writing sync.Mutex

	// mu guards the fields below.
	mu        sync.Mutex
	offsets   map[string]int64 // the next offset Output expects, per stream
	ended     map[string]bool
	lost      int64            // bytes reported lost to this handle
	lostBy    map[string]int64 // the same, per stream
	exit      *api.Exit
	stdinOff  int64 // the stdin offset of the next write
	uncertain bool  // a write's or the close's outcome is unknown
	closed    bool  // stdin closed
	gone      bool  // detached or disconnected
	reading   bool
	conn      *websocket.Conn
	termErr   error // a terminate whose outcome is unknown, returned again
}

// Sandbox is the sandbox the process runs in.
func (p *Process) Sandbox() *Sandbox { return p.s }

// Terminal reports whether the process runs on a terminal.
func (p *Process) Terminal() bool { return p.terminal }

func newProcess(s *Sandbox, id string, format Format, terminal, stdin bool) *Process {
	return &Process{s: s, ID: id, format: format, terminal: terminal, stdin: stdin,
		offsets: map[string]int64{}, ended: map[string]bool{}, lostBy: map[string]int64{}}
}

// Start starts a process and returns its handle at once. If the answer is
// lost the error is ErrOutcomeUnknown: the process may be running; list
// the sandbox's processes rather than starting it again.
func (s *Sandbox) Start(ctx context.Context, o StartOptions) (*Process, error) {
	if o.Shell != "" {
		if o.Command != "" || len(o.Args) > 0 {
			return nil, errors.New("client: StartOptions: Shell or Command, not both")
		}
		o.Command, o.Args = "/bin/sh", []string{"-c", o.Shell}
	}
	req := api.ExecRequest{Command: o.Command, Args: o.Args, Env: o.Env, Cwd: o.Cwd, User: o.User, TTY: o.Terminal, Capture: o.Capture, Flow: o.Flow}
	if o.Stdin {
		req.Stdin = api.StdinPipe
	}
	var st api.Started
	if err := s.c.call(ctx, "POST", s.path("/exec-stream"), nil, req, &st, false); err != nil {
		return nil, err
	}
	p := newProcess(s, st.ID, o.Format, o.Terminal != nil, o.Stdin)
	p.hold = o.Flow == api.FlowBlock
	return p, nil
}

func (p *Process) path(rest string) string {
	return p.s.path("/exec-stream/" + url.PathEscape(p.ID) + rest)
}

// streams a process has.
func (p *Process) streams() []string {
	if p.terminal {
		return []string{"terminal"}
	}
	return []string{"stdout", "stderr"}
}

// Result is a confirmed exit.
type Result struct {
	Exit Exit
	// OutputComplete is true only when this handle's output reached the
	// end of every stream with no gap. A wait that returns before the
	// output drained says false; a later one can say true.
	OutputComplete bool
	// Streams say, per stream, how far this handle's output has come and
	// how much of that it was told was lost.
	Streams map[string]StreamCount
}

// StreamCount is what a handle's output accounted for of a stream: Bytes
// up to where it stands (delivered or lost), Lost of them lost to it, and
// whether the stream's end was reached.
type StreamCount struct {
	Bytes int64 `json:"bytes"`
	Lost  int64 `json:"lost_bytes"`
	Ended bool  `json:"ended"`
}

// Wait blocks until the exit is confirmed, or ctx ends. It never guesses:
// a connection that breaks is an error, not an exit code.
func (p *Process) Wait(ctx context.Context) (Result, error) {
	if err := p.live(); err != nil {
		return Result{}, err
	}
	resp, _, err := p.s.c.request(ctx, p.s.c.stream, "GET", p.path("/wait"), nil, nil, "")
	if err != nil {
		return Result{}, err
	}
	defer resp.Body.Close()
	var e api.Exit
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		return Result{}, fmt.Errorf("client: wait for %s: %w", p.ID, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exit = &e
	r := Result{Exit: ExitOf(e), OutputComplete: p.completeLocked(), Streams: map[string]StreamCount{}}
	for _, s := range p.streams() {
		r.Streams[s] = StreamCount{Bytes: p.offsets[s], Lost: p.lostBy[s], Ended: p.ended[s]}
	}
	return r, nil
}

func (p *Process) completeLocked() bool {
	if p.lost > 0 {
		return false
	}
	for _, s := range p.streams() {
		if !p.ended[s] {
			return false
		}
	}
	return true
}

// Status states.
const (
	Running = "running"
	Exited  = "exited"
	Unknown = "unknown"
)

// Status is what is known of a process now.
type Status struct {
	State      string // Running, Exited, or Unknown when it cannot be told
	Exit       *api.Exit
	ObservedAt time.Time
	Process    *api.Process // kilnd's description, when it answered
}

// Status asks kilnd. When it cannot answer, State is Unknown (and the
// error says why), except that an exit already confirmed stays.
func (p *Process) Status(ctx context.Context) (Status, error) {
	if err := p.live(); err != nil {
		return Status{State: Unknown}, err
	}
	var st api.Process
	err := p.s.c.call(ctx, "GET", p.path(""), nil, nil, &st, true)
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if p.exit != nil {
			return Status{State: Exited, Exit: p.exit, ObservedAt: now}, err
		}
		return Status{State: Unknown, ObservedAt: now}, err
	}
	s := Status{State: st.State, ObservedAt: now, Process: &st}
	if st.State == api.StateExited {
		e := st.Exit
		s.Exit, p.exit = &e, &e
	}
	return s, nil
}

func (p *Process) live() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return ErrDetached
	}
	return nil
}

// Signal sends sig ("TERM", "SIGINT", "9") to the process's group.
func (p *Process) Signal(ctx context.Context, sig string) error {
	if err := p.live(); err != nil {
		return err
	}
	return p.s.c.call(ctx, "POST", p.path("/signal"), nil, api.SignalRequest{Signal: sig}, nil, false)
}

// Resize changes a terminal's size.
func (p *Process) Resize(ctx context.Context, size api.TTY) error {
	if err := p.live(); err != nil {
		return err
	}
	return p.s.c.call(ctx, "POST", p.path("/resize"), nil, size, nil, true)
}

// Terminate outcomes.
const (
	TerminateRequested = "requested"
	TerminateExited    = "exited"
	TerminateNotFound  = "not-found"
)

// Terminate asks for the process group to be killed. Success does not
// prove the exit: call Wait. If the answer is lost, this and every later
// call return the same ErrOutcomeUnknown without asking again.
func (p *Process) Terminate(ctx context.Context) (string, error) {
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return "", ErrDetached
	}
	if p.termErr != nil {
		err := p.termErr
		p.mu.Unlock()
		return "", err
	}
	p.mu.Unlock()
	var st api.Process
	err := p.s.c.call(ctx, "DELETE", p.path(""), nil, nil, &st, false)
	switch {
	case err == nil && st.State == api.StateExited:
		return TerminateExited, nil
	case err == nil:
		return TerminateRequested, nil
	case IsNotFound(err):
		return TerminateNotFound, nil
	case IsOutcomeUnknown(err):
		p.mu.Lock()
		p.termErr = err
		p.mu.Unlock()
	}
	return "", err
}

// Detach releases this handle's connections. It never kills the process
// or closes its stdin. Calling it again is safe.
func (p *Process) Detach() {
	p.mu.Lock()
	p.gone = true
	c := p.conn
	p.mu.Unlock()
	if c != nil {
		c.CloseNow()
	}
}

// Reference is what Reopen needs to return to a process: serialise it as
// JSON and keep it private.
type Reference struct {
	Sandbox  string           `json:"sandbox"`
	Process  string           `json:"process"`
	Offsets  map[string]int64 `json:"offsets"`
	Stdin    int64            `json:"stdin"`
	HasStdin bool             `json:"has_stdin"`
	Closed   bool             `json:"stdin_closed"`
	Terminal bool             `json:"terminal"`
	Format   Format           `json:"format"`
	Lost     int64            `json:"lost"`
	LostBy   map[string]int64 `json:"lost_by_stream,omitempty"`
	// Hold: the handle held the output (a flow block process's), and the
	// reopened one does too.
	Hold bool `json:"hold,omitempty"`
}

// Disconnect releases the handle as Detach does and returns a reference
// from which Reopen resumes the output where this handle stood. It refuses
// while an input outcome is unknown.
func (p *Process) Disconnect() (Reference, error) {
	p.mu.Lock()
	if p.uncertain {
		p.mu.Unlock()
		return Reference{}, ErrInputUncertain
	}
	ref := Reference{Sandbox: p.s.ID, Process: p.ID, Offsets: map[string]int64{}, Stdin: p.stdinOff, HasStdin: p.stdin,
		Closed: p.closed, Terminal: p.terminal, Format: p.format, Lost: p.lost, LostBy: maps.Clone(p.lostBy), Hold: p.hold}
	for s, o := range p.offsets {
		ref.Offsets[s] = o
	}
	p.mu.Unlock()
	p.Detach()
	return ref, nil
}

// Reopen returns a handle on the process of ref, whose output resumes at
// ref's offsets: it reports a gap only for bytes evicted since, and says
// how many. It never starts a process.
func (s *Sandbox) Reopen(ctx context.Context, ref Reference) (*Process, error) {
	if ref.Sandbox != s.ID {
		return nil, fmt.Errorf("client: the reference is of sandbox %s, not %s", ref.Sandbox, s.ID)
	}
	p := newProcess(s, ref.Process, ref.Format, ref.Terminal, ref.HasStdin)
	if _, err := p.Status(ctx); err != nil {
		return nil, err
	}
	for st, o := range ref.Offsets {
		p.offsets[st] = o
	}
	p.stdinOff, p.closed, p.lost, p.hold = ref.Stdin, ref.Closed, ref.Lost, ref.Hold
	maps.Copy(p.lostBy, ref.LostBy)
	return p, nil
}

// Process returns a handle on an existing process, reading its output from
// the beginning.
func (s *Sandbox) Process(ctx context.Context, id string, format Format) (*Process, error) {
	var st api.Process
	if err := s.c.call(ctx, "GET", s.path("/exec-stream/"+url.PathEscape(id)), nil, nil, &st, true); err != nil {
		return nil, err
	}
	p := newProcess(s, id, format, st.Terminal, st.Stdin != nil)
	if st.Stdin != nil {
		p.stdinOff, p.closed = st.Stdin.Accepted, st.Stdin.Closed
	}
	return p, nil
}
