package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"net/url"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

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

// Chunk is a piece of output, or a gap.
type Chunk struct {
	Stream string // "stdout", "stderr" or "terminal"
	Offset int64  // of the first byte, in the stream
	Seq    uint64 // one counter across the process's streams
	// Bytes (Format Bytes) or Text (Format Text) is the output. A chunk
	// owns its bytes.
	Bytes []byte
	Text  string
	// Lost, when non-zero, makes this chunk a gap: that many bytes of
	// Stream, before Offset, were lost to this reader (evicted before it
	// read them). It carries no output.
	Lost int64

	next int64 // where the stream stands once this chunk is delivered
	end  bool  // the stream's end
}

// maxFrame bounds one message from kilnd.
const maxFrame = api.FrameHeader + 1<<20

// Errors of a process handle.
var (
	ErrDetached = errors.New("client: the process handle was detached or disconnected")
	// ErrInterrupted says Output's connection broke, or could not be made,
	// for a reason a later call may not meet (the network, kilnd
	// restarting): calling Output again resumes from the last byte
	// delivered. A held process's output stays held for its grace period.
	ErrInterrupted    = errors.New("client: output interrupted")
	ErrOutputInUse    = errors.New("client: the process's output has a reader already")
	ErrInputUncertain = errors.New("client: an earlier write's outcome is unknown; call ResyncInput first")
	ErrStdinClosed    = errors.New("client: stdin is closed")
	ErrNoStdin        = errors.New("client: the process has no stdin pipe")
	ErrWriteTooLarge  = fmt.Errorf("client: a write carries at most %d bytes", api.MaxStdin)
)

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

// Output reads the process's output from where this handle stands (the
// beginning, or where a reopened handle's reference stood), replay then
// live, until every stream ended and the exit arrived. A gap is a Chunk
// with Lost set. If the connection breaks, the error says so
// (ErrInterrupted), and calling Output again resumes from the last byte
// delivered, with nothing repeated.
// Leaving the loop early closes the connection; nothing else changes.
func (p *Process) Output(ctx context.Context) iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		p.mu.Lock()
		switch {
		case p.gone:
			p.mu.Unlock()
			yield(Chunk{}, ErrDetached)
			return
		case p.reading:
			p.mu.Unlock()
			yield(Chunk{}, ErrOutputInUse)
			return
		}
		p.reading = true
		q := url.Values{}
		for s, off := range p.offsets {
			q.Set(s, strconv.FormatInt(off, 10))
		}
		if p.hold {
			q.Set("flow", api.FlowBlock)
			q.Set("ack", "true")
		}
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			p.reading, p.conn = false, nil
			p.mu.Unlock()
		}()
		c, err := p.s.c.dialOutput(ctx, p.path("/logs"), q)
		if err != nil {
			if _, answered := errors.AsType[*Error](err); (!answered || IsUnavailable(err)) && ctx.Err() == nil {
				err = fmt.Errorf("%w: output of %s (call Output again to resume): %w", ErrInterrupted, p.ID, err)
			}
			yield(Chunk{}, err)
			return
		}
		defer c.CloseNow()
		// A frame carries at most a ring block (256 KiB); control
		// messages are small.
		c.SetReadLimit(maxFrame)
		p.mu.Lock()
		if p.gone {
			p.mu.Unlock()
			yield(Chunk{}, ErrDetached)
			return
		}
		p.conn = c
		p.mu.Unlock()
		var dec decoders
		var unacked int64 // bytes given out since the last ack
		var buf []byte    // each message, read into the same buffer
		for {
			typ, data, err := readMessage(ctx, c, &buf)
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				return
			}
			if err != nil {
				p.mu.Lock()
				gone := p.gone
				p.mu.Unlock()
				if gone {
					err = ErrDetached
				} else if ctx.Err() == nil {
					err = fmt.Errorf("%w: output of %s (call Output again to resume): %w", ErrInterrupted, p.ID, err)
				}
				yield(Chunk{}, err)
				return
			}
			for _, ch := range p.handle(typ, data, &dec) {
				if ch.end && ch.Text == "" {
					p.delivered(ch) // nothing to show, only the end to record
					continue
				}
				// Given out is delivered, even if the reader stops after it.
				p.delivered(ch)
				if !yield(ch, nil) {
					return
				}
				if unacked += int64(len(ch.Bytes) + len(ch.Text)); p.hold && unacked >= ackEvery {
					// What the reader has taken need not be kept for it.
					unacked = 0
					if err := p.ack(ctx, c); err != nil {
						yield(Chunk{}, fmt.Errorf("%w: output of %s (call Output again to resume): %w", ErrInterrupted, p.ID, err))
						return
					}
				}
			}
		}
	}
}

// readMessage reads the next message into *buf, grown as it needs, and
// returns it: valid until the next call. (websocket.Conn.Read allocates
// each message anew, growing it from 512 bytes: for a stream of 256 KiB
// frames, most of a reader's time.)
func readMessage(ctx context.Context, c *websocket.Conn, buf *[]byte) (websocket.MessageType, []byte, error) {
	typ, r, err := c.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	b := (*buf)[:0]
	if cap(b) == 0 {
		b = make([]byte, 0, api.FrameHeader+256<<10)
	}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // room for more; the read limit bounds it
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			*buf = b
			return typ, b, nil
		}
		if err != nil {
			*buf = b
			return 0, nil, err
		}
	}
}

// Resume says how Follow reconnects a broken output connection. The zero
// value is the default of each field.
type Resume struct {
	// First is the wait before the first reconnect, 100 ms by default;
	// each next wait is twice as long, up to Max, 5 s by default.
	First, Max time.Duration
	// For bounds the waits since the last chunk delivered, 25 s by
	// default: within the 30 s a held output is held for by default.
	For time.Duration
	// OnResume, if set, is told of each break before its wait.
	OnResume func(err error, wait time.Duration)
}

// Follow is Output that resumes: a broken connection (ErrInterrupted) is
// reconnected from the last byte delivered, nothing lost or repeated, as
// r says; the error is yielded only once r.For has passed without a
// chunk, or for an error that reconnecting cannot mend.
func (p *Process) Follow(ctx context.Context, r Resume) iter.Seq2[Chunk, error] {
	first, maxWait, patience := cmp.Or(r.First, 100*time.Millisecond), cmp.Or(r.Max, 5*time.Second), cmp.Or(r.For, 25*time.Second)
	return func(yield func(Chunk, error) bool) {
		wait, waited := first, time.Duration(0)
		for {
			var broke error
			for ch, err := range p.Output(ctx) {
				if err != nil {
					broke = err
					break
				}
				wait, waited = first, 0
				if !yield(ch, nil) {
					return
				}
			}
			switch {
			case broke == nil:
				return
			case !errors.Is(broke, ErrInterrupted) || ctx.Err() != nil:
				yield(Chunk{}, broke)
				return
			case waited+wait > patience:
				yield(Chunk{}, fmt.Errorf("%w; gave up resuming after %v", broke, waited.Round(time.Millisecond)))
				return
			}
			if r.OnResume != nil {
				r.OnResume(broke, wait)
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				yield(Chunk{}, ctx.Err())
				return
			}
			waited += wait
			wait = min(2*wait, maxWait)
		}
	}
}

// ackEvery is how much output a holding handle takes between acks: a
// quarter of the agent's ring, the room at which its pumps read on.
const ackEvery = 256 << 10

// ack tells kilnd where this handle's output stands, so that it keeps no
// more of it than what may still be on its way.
func (p *Process) ack(ctx context.Context, c *websocket.Conn) error {
	p.mu.Lock()
	m := api.ClientMessage{Type: api.TypeAck, Offsets: maps.Clone(p.offsets)}
	p.mu.Unlock()
	b, _ := json.Marshal(m)
	return c.Write(ctx, websocket.MessageText, b)
}

// handle turns one message into the chunks it stands for. Each chunk says
// where its stream stands once it is delivered (next) and what it reports
// lost; the handle's position moves only as chunks are delivered, so a
// reader that stops early, or a connection that breaks, resumes exactly
// after the last chunk given out. Bytes of a character not yet complete
// are not counted as delivered: on resume they come again.
func (p *Process) handle(typ websocket.MessageType, data []byte, dec *decoders) []Chunk {
	p.mu.Lock()
	defer p.mu.Unlock()
	// pos is where each stream stands once every chunk so far is out,
	// held bytes included.
	pos := func(stream string) int64 { return p.offsets[stream] + int64(len(dec.carry[stream])) }
	if typ == websocket.MessageBinary {
		f, err := api.ParseFrame(data)
		if err != nil {
			return nil
		}
		name := api.StreamNames[f.Stream]
		var out []Chunk
		if at := pos(name); int64(f.Offset) > at {
			// The server reports gaps itself; a jump it did not explain
			// is reported all the same.
			out = append(out, gapChunks(name, at, int64(f.Offset), dec)...)
		}
		ch := Chunk{Stream: name, Offset: int64(f.Offset), Seq: f.Seq}
		end := int64(f.Offset) + int64(len(f.Data))
		if p.format == Bytes {
			ch.Bytes = bytes.Clone(f.Data)
		} else {
			ch.Text = dec.decode(name, f.Data)
		}
		ch.next = end - int64(len(dec.carry[name]))
		return append(out, ch)
	}
	var head struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &head) != nil {
		return nil
	}
	switch head.Type {
	case api.TypeGap:
		var g api.Gap
		json.Unmarshal(data, &g)
		return gapChunks(g.Stream, max(g.From, pos(g.Stream)), g.To, dec)
	case api.TypeEnd:
		var e api.End
		json.Unmarshal(data, &e)
		var out []Chunk
		if at := pos(e.Stream); e.TotalBytes > at {
			out = gapChunks(e.Stream, at, e.TotalBytes, dec)
		}
		// Bytes of a character the stream ended inside can never
		// complete: one replacement character.
		t := dec.flush(e.Stream)
		out = append(out, Chunk{Stream: e.Stream, Offset: e.TotalBytes, Text: t, next: e.TotalBytes, end: true})
		return out
	case api.TypeExit:
		var e api.ExitMessage
		json.Unmarshal(data, &e)
		exit := e.Exit
		p.exit = &exit
	}
	return nil
}

// gapChunks reports bytes from..to of stream as lost: what the decoder
// held of a cut character first (one replacement), then the gap.
func gapChunks(stream string, from, to int64, dec *decoders) []Chunk {
	var out []Chunk
	if t := dec.flush(stream); t != "" {
		out = append(out, Chunk{Stream: stream, Offset: from, Text: t, next: from})
	}
	return append(out, Chunk{Stream: stream, Offset: to, Lost: to - from, next: to})
}

// delivered moves the handle past a chunk given out.
func (p *Process) delivered(ch Chunk) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.offsets[ch.Stream] = max(p.offsets[ch.Stream], ch.next)
	p.lost += ch.Lost
	p.lostBy[ch.Stream] += ch.Lost
	if ch.end {
		p.ended[ch.Stream] = true
	}
}

// decoders hold, per stream, the bytes of a UTF-8 sequence split across
// chunks.
type decoders struct {
	carry map[string][]byte
}

func (d *decoders) decode(stream string, b []byte) string {
	if d.carry == nil {
		d.carry = map[string][]byte{}
	}
	buf := b
	if len(d.carry[stream]) > 0 {
		buf = append(d.carry[stream], b...)
	}
	// Keep an incomplete sequence at the end for the next chunk.
	cut := len(buf)
	for i := len(buf) - 1; i >= 0 && i >= len(buf)-3; i-- {
		if utf8.RuneStart(buf[i]) {
			if !utf8.FullRune(buf[i:]) {
				cut = i
			}
			break
		}
	}
	d.carry[stream] = bytes.Clone(buf[cut:])
	return validUTF8(buf[:cut])
}

// validUTF8 replaces each invalid byte with U+FFFD. (bytes.ToValidUTF8
// merges a run of them into one, which would make the text depend on
// where the output was cut into chunks.)
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = append(out, "\uFFFD"...)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return string(out)
}

// flush ends a stream's pending sequence (at a gap or the end): it can
// never complete, so it is one replacement character.
func (d *decoders) flush(stream string) string {
	if len(d.carry[stream]) == 0 {
		return ""
	}
	delete(d.carry, stream)
	return "\uFFFD"
}

// dialOutput opens a kiln.v1 WebSocket on path.
func (c *Client) dialOutput(ctx context.Context, path string, q url.Values) (*websocket.Conn, error) {
	conn, err := c.dial(ctx, path, q, api.ProtocolV1)
	if err != nil {
		if _, ok := errors.AsType[*Error](err); !ok {
			return nil, fmt.Errorf("client: output: %w", err)
		}
	}
	return conn, err
}

// dial opens a WebSocket of protocol to kilnd's path.
func (c *Client) dial(ctx context.Context, path string, q url.Values, protocol string) (*websocket.Conn, error) {
	u := "ws" + c.base[len("http"):] + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	protos := []string{protocol}
	if c.token != "" {
		protos = append(protos, api.TokenProtocolPrefix+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.stream, Subprotocols: protos})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			var e api.Error
			if resp.Body != nil {
				json.NewDecoder(resp.Body).Decode(&e)
			}
			if e.Error.Code != "" {
				return nil, &Error{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
			}
		}
		return nil, err
	}
	return conn, nil
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

// Write sends data (at most 64 KiB) to stdin, after every earlier write.
// Success means kilnd accepted it, not that the program read it. Each
// write carries its stdin offset, so kilnd applies it once even if sent
// twice; but if an answer is lost the error is ErrOutcomeUnknown and
// further writes wait for ResyncInput, which learns from kilnd where the
// input stands.
func (p *Process) Write(ctx context.Context, data []byte) error {
	if len(data) > api.MaxStdin {
		return ErrWriteTooLarge
	}
	p.writing.Lock()
	defer p.writing.Unlock()
	p.mu.Lock()
	err := p.inputLocked()
	if err == nil && p.closed {
		err = ErrStdinClosed
	}
	off := p.stdinOff
	p.mu.Unlock()
	if err != nil {
		return err
	}
	var acc api.StdinAccepted
	err = p.s.c.call(ctx, "POST", p.path("/stdin"), url.Values{"offset": {strconv.FormatInt(off, 10)}}, data, &acc, false)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if IsOutcomeUnknown(err) {
			p.uncertain = true
		}
		return err
	}
	p.stdinOff = max(p.stdinOff, acc.Accepted)
	return nil
}

// inputLocked says why input cannot be sent now, if it cannot. Called
// under mu.
func (p *Process) inputLocked() error {
	switch {
	case p.gone:
		return ErrDetached
	case !p.stdin:
		return ErrNoStdin
	case p.uncertain:
		return ErrInputUncertain
	}
	return nil
}

// ResyncInput asks kilnd where stdin stands after an unknown outcome, so
// that writing can go on: what kilnd accepted is not sent again.
func (p *Process) ResyncInput(ctx context.Context) (accepted int64, err error) {
	st, err := p.Status(ctx)
	if err != nil {
		return 0, err
	}
	if st.Process == nil || st.Process.Stdin == nil {
		return 0, ErrNoStdin
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stdinOff, p.uncertain = st.Process.Stdin.Accepted, false
	p.closed = st.Process.Stdin.Closed
	return p.stdinOff, nil
}

// CloseStdin sends end-of-input once every earlier write is delivered.
// Closing again does nothing.
func (p *Process) CloseStdin(ctx context.Context) error {
	p.writing.Lock()
	defer p.writing.Unlock()
	p.mu.Lock()
	err, closed := p.inputLocked(), p.closed
	p.mu.Unlock()
	if err != nil || closed {
		return err
	}
	err = p.s.c.call(ctx, "POST", p.path("/stdin/close"), nil, nil, nil, false)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		p.closed = true
	case IsOutcomeUnknown(err):
		p.uncertain = true
	}
	return err
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
