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

// Overflow is what Output does at a gap: bytes of a stream lost to the
// handle before it read them (kilnd could not keep them while its reader
// was behind, or while it was away).
type Overflow int

const (
	// OverflowFail (the default): Output yields a *CapacityError
	// (ErrOutputCapacity) saying how many bytes of which stream were lost,
	// after everything before the gap, and ends. Calling it again reads on
	// after the gap, which the handle's counts keep.
	OverflowFail Overflow = iota
	// OverflowReport: a Chunk with Lost set says how many bytes were lost,
	// and the output goes on.
	OverflowReport
)

func (o Overflow) check() error {
	if o != OverflowFail && o != OverflowReport {
		return invalid("overflow %d: want OverflowFail or OverflowReport", o)
	}
	return nil
}

func (f Format) check() error {
	if f != Text && f != Bytes {
		return invalid("format %d: want Text or Bytes", f)
	}
	return nil
}

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
	// Flow is api.FlowBlock (what the zero value means) or api.FlowDrop.
	// With block, the process waits for this handle's reader when it
	// falls behind, as a program waits for its terminal, so a reader that
	// keeps reading loses nothing; it stops waiting once the handle stops
	// reading (its Output loop left early or cancelled, Wait called while
	// nothing reads, Detach, the client's Close). A handle that went away
	// otherwise (a broken connection, Disconnect) has its output held for
	// kilnd's grace period (30 s) for Output or Reopen to come back to.
	// Other readers lose what they fall behind on, exactly counted. With
	// drop, the process never waits: what kilnd cannot keep while the
	// reader is behind is lost to it (see Overflow).
	Flow     string
	Format   Format
	Overflow Overflow
	// DrainMS bounds, in milliseconds, how long the output is read after
	// the process exits while something it left behind (a background
	// child) holds it open: 0 is kilnd's default (3 s), at most 60 s
	// (api.MaxDrainMS). Past it the output is cut, and the exit says so
	// (Exit.OutputCut).
	DrainMS int64
	// ChunkBytes bounds the output one Chunk carries: 0 is MaxChunkBytes
	// (16 KiB, the streaming contract's), at most MaxChunkCeiling. A
	// reader that copies the output on, as kiln does, takes fewer, larger
	// chunks with more.
	ChunkBytes int
	// Borrow gives out each Chunk's Bytes in the handle's own buffer,
	// valid only until the reader asks for the next chunk, as
	// bufio.Scanner does: a reader that copies the output on at once, as
	// kiln does, saves a copy and an allocation per message. Without it a
	// chunk owns its bytes.
	Borrow bool
}

// check refuses what kilnd would refuse, or the handle could not honour,
// before anything is sent.
func (o *StartOptions) check() error {
	if o.Shell != "" && (o.Command != "" || len(o.Args) > 0) {
		return invalid("StartOptions: Shell or Command, not both")
	}
	switch o.Flow {
	case "", api.FlowBlock, api.FlowDrop:
	default:
		return invalid("flow %q: want %q or %q", o.Flow, api.FlowBlock, api.FlowDrop)
	}
	if err := checkDrain(o.DrainMS); err != nil {
		return err
	}
	if err := checkChunkBytes(o.ChunkBytes); err != nil {
		return err
	}
	if t := o.Terminal; t != nil && (t.Cols == 0 || t.Rows == 0 || t.Cols > api.MaxTTYSize || t.Rows > api.MaxTTYSize) {
		return invalid("terminal size %dx%d: want 1 to %d each", t.Cols, t.Rows, api.MaxTTYSize)
	}
	if err := o.Format.check(); err != nil {
		return err
	}
	return o.Overflow.check()
}

func checkChunkBytes(n int) error {
	if n != 0 && (n < MaxChunkBytes || n > MaxChunkCeiling) {
		return invalid("ChunkBytes %d: want 0 (%d) or %d to %d", n, MaxChunkBytes, MaxChunkBytes, MaxChunkCeiling)
	}
	return nil
}

func checkDrain(ms int64) error {
	if ms < 0 || ms > api.MaxDrainMS {
		return invalid("DrainMS %d: want 0 (kilnd's default, %d) to %d", ms, api.DefaultDrainMS, api.MaxDrainMS)
	}
	return nil
}

// Process is a handle on a process. Its methods are safe for concurrent
// use; its output has one reader at a time.
//
// A handle is let go by Detach, Disconnect, its client's Close, or its
// sandbox's Delete through the same client: a call of it then in
// progress (Wait, Status, Write, …) fails with ErrDetached, as every
// later call does, but that a confirmed exit is still given by Wait.
type Process struct {
	s          *Sandbox
	ID         string
	format     Format
	overflow   Overflow
	chunkBytes int  // the most output one Chunk carries; 0 is MaxChunkBytes
	borrow     bool // Chunk.Bytes is the read buffer's, until the next chunk
	terminal   bool
	stdin      bool
	hold       bool // Output asks to hold the output (a flow block process's)

	// writing is the turn of Write and CloseStdin, one at a time: each
	// carries the offset the previous one left, so two at once would
	// overlap. A channel, so that one waiting for its turn can give up.
	writing chan struct{}

	// mu guards the fields below. It is never held across a request.
	mu        sync.Mutex
	offsets   map[string]int64 // the next offset Output expects, per stream
	ended     map[string]bool
	lost      int64            // bytes reported lost to this handle
	lostBy    map[string]int64 // the same, per stream
	exit      *api.Exit        // confirmed: by Wait, Status or the output's exit message
	stdinOff  int64            // the stdin offset of the next write
	uncertain bool             // a write's or the close's outcome is unknown
	closed    bool             // stdin closed
	closing   bool             // an end-of-input is on its way
	queued    int              // Write calls waiting for their turn or sending
	queuedLen int              // their bytes
	gone      bool             // let go: detached or disconnected
	released  bool             // let go by Detach or Close: a connection still opening releases too
	// holding: the output may be held for this handle (a process it
	// started with flow block, or one whose output it read held), so
	// that when it stops reading, a release is owed: the process must
	// not wait for a reader nobody runs.
	holding bool
	reading bool
	// conn is Output's connection while it reads. Whoever takes it from
	// here (Output at its end, or letGo) closes it.
	conn *websocket.Conn
	// pending are the calls in progress, cancelled (cause ErrDetached)
	// when the handle is let go.
	pending  map[uint64]context.CancelCauseFunc
	nextCall uint64
	term     *termCall // the termination request on its way, which its callers share
	waiters  int       // callers waiting for term
	termErr  error     // a terminate whose outcome is unknown, returned again
}

// Sandbox is the sandbox the process runs in.
func (p *Process) Sandbox() *Sandbox { return p.s }

// Terminal reports whether the process runs on a terminal.
func (p *Process) Terminal() bool { return p.terminal }

// newProcess makes a handle, which the client knows of until it is let go.
func newProcess(s *Sandbox, id string, format Format, terminal, stdin bool) *Process {
	p := &Process{s: s, ID: id, format: format, terminal: terminal, stdin: stdin, writing: make(chan struct{}, 1),
		offsets: map[string]int64{}, ended: map[string]bool{}, lostBy: map[string]int64{}, pending: map[uint64]context.CancelCauseFunc{}}
	s.c.adopt(p)
	return p
}

// Start starts a process and returns its handle at once. If the answer is
// lost the error is ErrOutcomeUnknown: the process may be running; list
// the sandbox's processes rather than starting it again. Options out of
// bounds are refused (ErrInvalidArgument) before anything is sent.
func (s *Sandbox) Start(ctx context.Context, o StartOptions) (*Process, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err // nothing sent
	}
	if o.Shell != "" {
		o.Command, o.Args = "/bin/sh", []string{"-c", o.Shell}
	}
	if o.Flow == "" {
		o.Flow = api.FlowBlock
	}
	req := api.ExecRequest{Command: o.Command, Args: o.Args, Env: o.Env, Cwd: o.Cwd, User: o.User, TTY: o.Terminal,
		Capture: o.Capture, Flow: o.Flow, DrainMS: o.DrainMS}
	if o.Stdin {
		req.Stdin = api.StdinPipe
	}
	var st api.Started
	if err := s.c.call(ctx, "POST", s.path("/exec-stream"), nil, req, &st, false); err != nil {
		return nil, err
	}
	p := newProcess(s, st.ID, o.Format, o.Terminal != nil, o.Stdin)
	p.overflow, p.chunkBytes, p.borrow = o.Overflow, o.ChunkBytes, o.Borrow
	// Held from its start for its first reader: this handle.
	p.hold = o.Flow == api.FlowBlock
	p.holding = p.hold
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

// bind is ctx for a call of this handle: cancelled, with ErrDetached as
// its cause, when the handle is let go. done forgets it; a handle let go
// already refuses the call.
func (p *Process) bind(ctx context.Context) (_ context.Context, done func(), _ error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return nil, nil, ErrDetached
	}
	ctx, done = p.bindLocked(ctx)
	return ctx, done, nil
}

// bindLocked is bind, with mu held and the handle not gone.
func (p *Process) bindLocked(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	id := p.nextCall
	p.nextCall++
	p.pending[id] = cancel
	return ctx, func() {
		p.mu.Lock()
		delete(p.pending, id)
		p.mu.Unlock()
		cancel(nil)
	}
}

// settled is the error of a call made with a context from bind: one the
// handle's going ended says so (ErrDetached, and what the call met).
func settled(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), ErrDetached) && !errors.Is(err, ErrDetached) {
		return fmt.Errorf("%w: %w", ErrDetached, err)
	}
	return err
}

// Result is a confirmed exit.
type Result struct {
	Exit Exit
	// OutputComplete is true only when this handle's output reached the
	// end of every stream with no gap, and the output was not cut after
	// the exit (Exit.OutputCut). A wait that returns before the output
	// drained says false; a later one can say true.
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
// a connection that breaks is an error (ErrUnavailable), not an exit
// code. An exit already confirmed (by an earlier Wait, Status or the
// output's end) is given without asking again, even after the handle was
// let go; a wait in progress when the handle is let go fails with
// ErrDetached.
//
// While no Output of this handle reads, the process no longer waits for
// its reader (see StartOptions.Flow): start reading before waiting.
func (p *Process) Wait(ctx context.Context) (Result, error) {
	p.mu.Lock()
	known, gone := p.exit != nil, p.gone
	release := !known && !gone && !p.reading && p.holding
	if release {
		p.holding = false
	}
	p.mu.Unlock()
	switch {
	case known:
		return p.result(), nil
	case gone:
		return Result{}, ErrDetached
	}
	if release {
		p.releaseHeld()
	}
	e, err := p.wait(ctx)
	if err != nil {
		return Result{}, err
	}
	p.mu.Lock()
	p.confirmLocked(e)
	p.mu.Unlock()
	return p.result(), nil
}

// wait asks kilnd for the exit.
func (p *Process) wait(ctx context.Context) (api.Exit, error) {
	ctx, done, err := p.bind(ctx)
	if err != nil {
		return api.Exit{}, err
	}
	defer done()
	resp, _, err := p.s.c.request(ctx, p.s.c.stream, "GET", p.path("/wait"), nil, nil, "")
	if err == nil {
		defer resp.Body.Close()
		var e api.Exit
		if err = json.NewDecoder(resp.Body).Decode(&e); err == nil {
			return e, nil
		}
	}
	if _, answered := errors.AsType[*Error](err); !answered && ctx.Err() == nil {
		err = fmt.Errorf("%w: wait for %s: %w", ErrUnavailable, p.ID, err)
	}
	return api.Exit{}, settled(ctx, err)
}

// result is what the handle knows of the confirmed exit and its output.
func (p *Process) result() Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := Result{Exit: ExitOf(*p.exit), OutputComplete: p.completeLocked(), Streams: map[string]StreamCount{}}
	for _, s := range p.streams() {
		r.Streams[s] = StreamCount{Bytes: p.offsets[s], Lost: p.lostBy[s], Ended: p.ended[s]}
	}
	return r
}

// confirmLocked keeps an exit kilnd reported. What an earlier report
// said of the output's cut stays: a wait can answer before the output
// ended, and so before the cut is known.
func (p *Process) confirmLocked(e api.Exit) {
	if p.exit != nil && e.OutputCut == "" {
		e.OutputCut = p.exit.OutputCut
	}
	p.exit = &e
}

func (p *Process) completeLocked() bool {
	if p.lost > 0 || p.exit != nil && p.exit.OutputCut != "" {
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

// Status asks kilnd, without reading any output. When it cannot answer,
// State is Unknown (and the error says why), except that an exit already
// confirmed stays. A status in progress when the handle is let go fails
// with ErrDetached.
func (p *Process) Status(ctx context.Context) (Status, error) {
	bound, done, err := p.bind(ctx)
	if err != nil {
		return Status{State: Unknown}, err
	}
	defer done()
	var st api.Process
	err = settled(bound, p.s.c.call(bound, "GET", p.path(""), nil, nil, &st, true))
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if p.exit != nil && !errors.Is(err, ErrDetached) {
			e := *p.exit
			return Status{State: Exited, Exit: &e, ObservedAt: now}, err
		}
		return Status{State: Unknown, ObservedAt: now}, err
	}
	s := Status{State: st.State, ObservedAt: now, Process: &st}
	if st.State == api.StateExited {
		p.confirmLocked(st.Exit)
		e := *p.exit
		s.Exit = &e
	}
	return s, nil
}

// Signal sends sig ("TERM", "SIGINT", "9") to the process's group.
func (p *Process) Signal(ctx context.Context, sig string) error {
	if sig == "" {
		return invalid("a signal's name or number is needed")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, done, err := p.bind(ctx)
	if err != nil {
		return err
	}
	defer done()
	return settled(ctx, p.s.c.call(ctx, "POST", p.path("/signal"), nil, api.SignalRequest{Signal: sig}, nil, false))
}

// Resize changes a terminal's size.
func (p *Process) Resize(ctx context.Context, size api.TTY) error {
	if size.Cols == 0 || size.Rows == 0 || size.Cols > api.MaxTTYSize || size.Rows > api.MaxTTYSize {
		return invalid("terminal size %dx%d: want 1 to %d each", size.Cols, size.Rows, api.MaxTTYSize)
	}
	ctx, done, err := p.bind(ctx)
	if err != nil {
		return err
	}
	defer done()
	return settled(ctx, p.s.c.call(ctx, "POST", p.path("/resize"), nil, size, nil, true))
}

// Terminate outcomes.
const (
	TerminateRequested = "requested"
	TerminateExited    = "exited"
	TerminateNotFound  = "not-found"
)

// termCall is a termination request on its way, shared by the callers of
// Terminate meanwhile: done is closed once status and err are set.
type termCall struct {
	done   chan struct{}
	status string
	err    error
}

// Terminate asks for the process group to be killed. Success does not
// prove the exit: call Wait. Callers at the same time share one request;
// a caller whose ctx ends stops waiting for it, the others do not. If the
// answer is lost, this and every later call return the same
// ErrOutcomeUnknown without asking again. A ctx ended already sends
// nothing.
func (p *Process) Terminate(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	p.mu.Lock()
	switch {
	case p.gone:
		p.mu.Unlock()
		return "", ErrDetached
	case p.termErr != nil:
		err := p.termErr
		p.mu.Unlock()
		return "", err
	}
	tc := p.term
	if tc == nil {
		// The request is the handle's, not its first caller's: bound by
		// the client's timeout and the handle's life, not by a ctx that
		// may end while others wait for it. letGo waits for it.
		rctx, done := p.bindLocked(context.Background())
		tc = &termCall{done: make(chan struct{})}
		p.term = tc
		go func() {
			defer close(tc.done)
			defer done()
			tc.status, tc.err = p.terminate(rctx)
			p.mu.Lock()
			p.term = nil
			if IsOutcomeUnknown(tc.err) {
				p.termErr = tc.err
			}
			p.mu.Unlock()
		}()
	}
	p.waiters++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.waiters--
		p.mu.Unlock()
	}()
	select {
	case <-tc.done:
		return tc.status, tc.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (p *Process) terminate(ctx context.Context) (string, error) {
	var st api.Process
	err := settled(ctx, p.s.c.call(ctx, "DELETE", p.path(""), nil, nil, &st, false))
	switch {
	case err == nil && st.State == api.StateExited:
		p.mu.Lock()
		p.confirmLocked(st.Exit)
		p.mu.Unlock()
		return TerminateExited, nil
	case err == nil:
		return TerminateRequested, nil
	case IsNotFound(err):
		return TerminateNotFound, nil
	}
	return "", err
}

// Detach lets go of this handle: its connections close, unread output is
// discarded, calls in progress fail with ErrDetached, and the process no
// longer waits for its reader (its held output is released: on Output's
// connection while one is open, else by a request of its own, bounded by
// a few seconds, whose failure costs only kilnd's grace period). It never
// kills the process or closes its stdin. Calling it again is safe.
func (p *Process) Detach() { p.letGo(true) }

// releaseTimeout bounds a release on its own (the WebSocket message, or
// POST …/release): a release that fails costs the process only kilnd's
// grace period of waiting.
const releaseTimeout = 5 * time.Second

// letGo lets the handle go: with release, the output held for it too.
func (p *Process) letGo(release bool) {
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return
	}
	p.gone, p.released = true, release
	release = release && p.holding
	if release {
		p.holding = false
	}
	c := p.conn
	p.conn = nil
	pending := p.pending
	p.pending = map[uint64]context.CancelCauseFunc{}
	tc := p.term
	p.mu.Unlock()
	// Calls waiting settle first; Output's reading is not among them (its
	// connection is closed below, after the release it may carry).
	for _, cancel := range pending {
		cancel(ErrDetached)
	}
	switch {
	case release && c != nil:
		releaseOn(c)
	case release:
		p.releaseHeld()
	case c != nil:
		c.CloseNow()
	}
	if tc != nil {
		<-tc.done // cancelled above: it ends now
	}
	p.s.c.forget(p)
}

// releaseHeld lets go of the output a flow block process holds for this
// handle while it has no connection (POST …/release), bounded by
// releaseTimeout; a failure costs the process only kilnd's grace period.
func (p *Process) releaseHeld() {
	ctx, cancel := context.WithTimeout(context.Background(), min(releaseTimeout, p.s.c.timeout))
	defer cancel()
	p.s.c.call(ctx, "POST", p.path("/release"), nil, nil, nil, true)
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
	Overflow Overflow         `json:"overflow,omitempty"`
	Lost     int64            `json:"lost"`
	LostBy   map[string]int64 `json:"lost_by_stream,omitempty"`
	// Hold: the handle held the output (a flow block process's), and the
	// reopened one does too.
	Hold bool `json:"hold,omitempty"`
}

// Disconnect lets go of the handle as Detach does, but leaves the output
// held for it (within kilnd's grace period, 30 s) and the process waiting
// for it, and returns a reference from which Reopen resumes the output
// where this handle stood. It refuses while an input outcome is unknown
// (ErrInputUncertain) or a write or end-of-input is on its way
// (ErrInputPending).
func (p *Process) Disconnect() (Reference, error) {
	p.mu.Lock()
	switch {
	case p.gone:
		p.mu.Unlock()
		return Reference{}, ErrDetached
	case p.uncertain:
		p.mu.Unlock()
		return Reference{}, ErrInputUncertain
	case p.queued > 0 || p.closing:
		p.mu.Unlock()
		return Reference{}, ErrInputPending
	}
	ref := Reference{Sandbox: p.s.ID, Process: p.ID, Offsets: maps.Clone(p.offsets), Stdin: p.stdinOff, HasStdin: p.stdin,
		Closed: p.closed, Terminal: p.terminal, Format: p.format, Overflow: p.overflow, Lost: p.lost,
		LostBy: maps.Clone(p.lostBy), Hold: p.hold}
	p.mu.Unlock()
	p.letGo(false)
	return ref, nil
}

// Reopen returns a handle on the process of ref, whose output resumes at
// ref's offsets: it reports a gap only for bytes evicted since, and says
// how many. It never starts a process.
func (s *Sandbox) Reopen(ctx context.Context, ref Reference) (*Process, error) {
	if ref.Sandbox != s.ID {
		return nil, invalid("the reference is of sandbox %s, not %s", ref.Sandbox, s.ID)
	}
	if err := ref.Format.check(); err != nil {
		return nil, err
	}
	if err := ref.Overflow.check(); err != nil {
		return nil, err
	}
	for st, o := range ref.Offsets {
		if o < 0 || st != "stdout" && st != "stderr" && st != "terminal" {
			return nil, invalid("the reference's %s offset %d", st, o)
		}
	}
	var st api.Process
	if err := s.c.call(ctx, "GET", s.path("/exec-stream/"+url.PathEscape(ref.Process)), nil, nil, &st, true); err != nil {
		return nil, err
	}
	if err := ref.against(st); err != nil {
		return nil, err
	}
	p := newProcess(s, ref.Process, ref.Format, ref.Terminal, ref.HasStdin)
	p.mu.Lock()
	defer p.mu.Unlock()
	maps.Copy(p.offsets, ref.Offsets)
	maps.Copy(p.lostBy, ref.LostBy)
	p.stdinOff, p.closed, p.lost, p.overflow = ref.Stdin, ref.Closed, ref.Lost, ref.Overflow
	// What the handle it came from held is held for this one.
	p.hold, p.holding = ref.Hold, ref.Hold
	if st.State == api.StateExited {
		p.confirmLocked(st.Exit)
	}
	return p, nil
}

// against checks a reference against the process kilnd describes: the
// same kind of process, and a position it has reached.
func (ref Reference) against(st api.Process) error {
	if st.Terminal != ref.Terminal {
		return invalid("process %s is a terminal: %v; the reference says %v", ref.Process, st.Terminal, ref.Terminal)
	}
	if !st.Terminal && (st.Stdin != nil) != ref.HasStdin {
		return invalid("process %s has a stdin pipe: %v; the reference says %v", ref.Process, st.Stdin != nil, ref.HasStdin)
	}
	for name, at := range ref.Offsets {
		s, ok := st.Streams[name]
		if !ok {
			return invalid("process %s has no stream %s", ref.Process, name)
		}
		if at > s.TotalBytes {
			return fmt.Errorf("%w: the reference stands at %d bytes of %s; process %s wrote %d", errAhead, at, name, ref.Process, s.TotalBytes)
		}
	}
	if st.Stdin != nil && ref.Stdin > st.Stdin.Accepted {
		return fmt.Errorf("%w: the reference wrote %d bytes of input; kilnd accepted %d", errAhead, ref.Stdin, st.Stdin.Accepted)
	}
	return nil
}

// ProcessOptions say how a handle on a process it did not start reads
// its output. The zero value reads text and fails at a gap.
type ProcessOptions struct {
	Format   Format
	Overflow Overflow
	// Hold makes the handle hold the output of a process started with
	// flow block, as the handle that started it does: the process waits
	// for this handle's reader when it falls behind, until the handle
	// stops reading. A foreground reader, such as kiln attach, asks for
	// it. For a flow drop process it changes nothing.
	Hold bool
	// ChunkBytes and Borrow are as StartOptions'.
	ChunkBytes int
	Borrow     bool
}

// Process returns a handle on an existing process (one another client
// started, say), reading its output from the beginning: what kilnd still
// has of it. Unless o.Hold, it does not hold the process's output: what
// kilnd cannot keep while its reader is behind is lost to it (see
// Overflow).
func (s *Sandbox) Process(ctx context.Context, id string, o ProcessOptions) (*Process, error) {
	if err := o.Format.check(); err != nil {
		return nil, err
	}
	if err := o.Overflow.check(); err != nil {
		return nil, err
	}
	if err := checkChunkBytes(o.ChunkBytes); err != nil {
		return nil, err
	}
	var st api.Process
	if err := s.c.call(ctx, "GET", s.path("/exec-stream/"+url.PathEscape(id)), nil, nil, &st, true); err != nil {
		return nil, err
	}
	p := newProcess(s, id, o.Format, st.Terminal, st.Stdin != nil)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.overflow, p.chunkBytes, p.borrow = o.Overflow, o.ChunkBytes, o.Borrow
	p.hold = o.Hold && st.Flow == api.FlowBlock
	p.holding = p.hold
	if st.Stdin != nil {
		p.stdinOff, p.closed = st.Stdin.Accepted, st.Stdin.Closed
	}
	if st.State == api.StateExited {
		p.confirmLocked(st.Exit)
	}
	return p, nil
}
