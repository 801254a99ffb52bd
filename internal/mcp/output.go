package mcp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// maxWaitMS bounds how long process_output waits for new output.
const maxWaitMS = 30_000

// OutputInput is process_output's arguments.
type OutputInput struct {
	Sandbox  string           `json:"sandbox" jsonschema:"the sandbox's id or name"`
	PID      string           `json:"pid" jsonschema:"the process's id, from process_start"`
	Offsets  map[string]int64 `json:"offsets,omitempty" jsonschema:"where to read from, per stream (stdout, stderr), as the last result's next_offsets; a stream left out is read from its beginning"`
	MaxBytes int              `json:"max_bytes,omitempty" jsonschema:"most output bytes in this result, streams together: default 16384, 256 to 65536"`
	WaitMS   int64            `json:"wait_ms,omitempty" jsonschema:"when nothing new is there yet and the process runs, wait up to this many milliseconds for output or the exit: default 0, at most 30000"`
}

// OutputOutput is process_output's result.
type OutputOutput struct {
	Stdout   string `json:"stdout" jsonschema:"stdout's bytes from its offset, as UTF-8 (an invalid byte is U+FFFD)"`
	Stderr   string `json:"stderr" jsonschema:"stderr's bytes from its offset"`
	Terminal string `json:"terminal,omitempty" jsonschema:"a terminal's output, its one stream"`
	// NextOffsets are where the next call reads from.
	NextOffsets map[string]int64 `json:"next_offsets" jsonschema:"per stream, where the next call reads from: pass them back as offsets"`
	// LostBytes counts, per stream, bytes before next_offsets that
	// nothing kept: they will never be read.
	LostBytes map[string]int64 `json:"lost_bytes,omitempty" jsonschema:"per stream, bytes before next_offsets that nothing kept and no call will return"`
	Bytes     int              `json:"bytes" jsonschema:"output bytes in this result"`
	MaxBytes  int              `json:"max_bytes" jsonschema:"the most this result could carry"`
	// More: output beyond NextOffsets was there already.
	More bool `json:"more" jsonschema:"output beyond next_offsets is there already: call again at once"`
	// Exited: the process has ended and this result reaches the end of
	// everything it wrote.
	Exited   bool   `json:"exited" jsonschema:"the process has ended and this result reaches the end of everything it wrote"`
	ExitCode *int   `json:"exit_code,omitempty" jsonschema:"once exited: its exit code (128+N when signal N ended it)"`
	Signal   string `json:"signal,omitempty" jsonschema:"once exited: the signal that ended it, if one did"`
	Note     string `json:"note" jsonschema:"what this result holds and what to do next, in words"`
}

// page gathers one result's output: per stream, the bytes read and where
// the stream stands, within a bound on the bytes of all streams.
type page struct {
	max, taken int
	// cut: a chunk had more than the room left.
	cut  bool
	data map[string][]byte
	next map[string]int64
	lost map[string]int64
}

func newPage(from map[string]int64, max int) *page {
	return &page{max: max, data: map[string][]byte{}, next: maps.Clone(from), lost: map[string]int64{}}
}

// add takes what of ch fits, and reports whether there is room for more.
// Chunks come in each stream's order, starting at the page's offsets.
func (pg *page) add(ch client.Chunk) bool {
	if ch.Lost > 0 {
		pg.lost[ch.Stream] += ch.Lost
		pg.next[ch.Stream] = max(pg.next[ch.Stream], ch.Offset)
		return true
	}
	b := ch.Bytes
	if skip := pg.next[ch.Stream] - ch.Offset; skip > 0 {
		// Never expected (a reopened handle reads on from its offsets),
		// but a byte is never given twice.
		b = b[min(skip, int64(len(b))):]
	}
	if room := pg.max - pg.taken; len(b) > room {
		b, pg.cut = b[:room], true
	}
	pg.data[ch.Stream] = append(pg.data[ch.Stream], b...)
	pg.next[ch.Stream] += int64(len(b))
	pg.taken += len(b)
	return pg.taken < pg.max
}

// reached reports whether every stream stands at or past totals.
func (pg *page) reached(totals map[string]int64) bool {
	for s, t := range totals {
		if pg.next[s] < t {
			return false
		}
	}
	return true
}

// hold gives back, on each stream, the bytes of a UTF-8 character the
// page ends inside: the next call starts with the whole character. A
// stream that has ended keeps them (they become U+FFFD).
func (pg *page) hold() {
	for s, b := range pg.data {
		if n := partialRune(b); n > 0 {
			pg.data[s] = b[:len(b)-n]
			pg.next[s] -= int64(n)
			pg.taken -= n
		}
	}
}

// partialRune is the length of the start of a UTF-8 character that b ends
// with, or 0.
func partialRune(b []byte) int {
	for n := 1; n <= min(utf8.UTFMax-1, len(b)); n++ {
		c := b[len(b)-n]
		if c < utf8.RuneSelf {
			return 0 // ASCII: nothing pending
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[len(b)-n:]) {
				return 0
			}
			return n
		}
	}
	return 0
}

func (s *Server) output(ctx context.Context, _ *mcp.CallToolRequest, in OutputInput) (*mcp.CallToolResult, OutputOutput, error) {
	switch {
	case in.Sandbox == "":
		return nil, OutputOutput{}, errNoSandbox
	case in.PID == "":
		return nil, OutputOutput{}, errNoPID
	case in.WaitMS < 0 || in.WaitMS > maxWaitMS:
		return nil, OutputOutput{}, fmt.Errorf("wait_ms %d: want 0 to %d", in.WaitMS, maxWaitMS)
	}
	bound, err := outputBound("max_bytes", in.MaxBytes)
	if err != nil {
		return nil, OutputOutput{}, err
	}
	r, err := s.read(ctx, in, bound)
	if err != nil {
		return nil, OutputOutput{}, fmt.Errorf("process_output %s: %w", in.PID, err)
	}
	return nil, r, nil
}

// read is process_output once its arguments are checked. It reads the
// process's output from the offsets given until the page is full, or it
// has what was there when it asked (or, with nothing there, the first
// output within the wait), or the output ended.
func (s *Server) read(ctx context.Context, in OutputInput, bound int) (OutputOutput, error) {
	p, st, from, totals, err := s.reopen(ctx, in)
	if err != nil {
		return OutputOutput{}, err
	}
	defer p.Detach()

	pg := newPage(from, bound)
	// Ended before this call: exited, and every stream at its end. A
	// process that has exited may still have output on its way (a
	// child's, or what the pipes held), which its totals do not count
	// yet: until its streams end, this reads on as for a running one.
	exitedBefore := st.State == client.Exited && allEnded(st)
	waiting := pg.reached(totals) && !exitedBefore
	ended := false // the output ran to its end: every stream's, then the exit
	if !pg.reached(totals) || waiting && in.WaitMS > 0 {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if waiting {
			rctx, cancel = context.WithTimeout(ctx, time.Duration(in.WaitMS)*time.Millisecond)
		}
		ended, err = readPage(rctx, p, pg, totals, waiting)
		cancel()
		if err != nil && !(waiting && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)) {
			return OutputOutput{}, err
		}
	}

	r := OutputOutput{MaxBytes: bound, LostBytes: pg.lost}
	var exit *api.Exit
	switch {
	case ended:
		res, err := p.Wait(ctx) // confirmed already: the output ended with it
		if err != nil {
			return OutputOutput{}, err
		}
		e := res.Exit.API()
		exit = &e
	case exitedBefore && pg.reached(totals):
		exit = st.Exit
	default:
		pg.hold()
	}
	r.More = pg.cut || !pg.reached(totals)
	if exit != nil {
		r.Exited, r.More = true, false
		code := client.ExitOf(*exit).Code()
		r.ExitCode, r.Signal = &code, exit.Signal
	}
	r.Stdout, r.Stderr, r.Terminal = text(pg.data["stdout"]), text(pg.data["stderr"]), text(pg.data["terminal"])
	r.NextOffsets, r.Bytes = pg.next, pg.taken
	if len(r.LostBytes) == 0 {
		r.LostBytes = nil
	}
	r.Note = outputNote(r)
	return r, nil
}

// reopen learns where the process's streams stand (totals, and whether
// it has exited), checks the offsets given against them, and returns a
// handle whose output starts there (from: every stream's offset).
func (s *Server) reopen(ctx context.Context, in OutputInput) (_ *client.Process, _ client.Status, from, totals map[string]int64, _ error) {
	fail := func(err error) (*client.Process, client.Status, map[string]int64, map[string]int64, error) {
		return nil, client.Status{}, nil, nil, err
	}
	sb := s.c.Handle(in.Sandbox)
	h, err := sb.Process(ctx, in.PID, client.ProcessOptions{Format: client.Bytes, Overflow: client.OverflowReport})
	if err != nil {
		return fail(err)
	}
	st, err := h.Status(ctx)
	if err != nil {
		h.Detach()
		return fail(err)
	}
	// The handle's reference says what kind of process it is (terminal,
	// stdin); Reopen takes it with the offsets given instead of its own.
	ref, err := h.Disconnect()
	if err != nil {
		return fail(err)
	}
	from, totals = map[string]int64{}, map[string]int64{}
	for name, ss := range st.Process.Streams {
		from[name], totals[name] = 0, ss.TotalBytes
	}
	for name, off := range in.Offsets {
		total, ok := totals[name]
		switch {
		case !ok:
			return fail(fmt.Errorf("offsets: the process has no stream %q; its streams are %s", name, strings.Join(slices.Sorted(maps.Keys(totals)), " and ")))
		case off < 0:
			return fail(fmt.Errorf("offsets.%s %d: an offset is 0 or more", name, off))
		case off > total:
			return fail(fmt.Errorf("offsets.%s %d: the process has written %d bytes of %s so far", name, off, total, name))
		}
		from[name] = off
	}
	ref.Offsets = from
	p, err := sb.Reopen(ctx, ref)
	if err != nil {
		return fail(err)
	}
	return p, st, from, totals, nil
}

// readPage reads p's output into pg: until pg is full; or, waiting (for
// output beyond totals), the first output that comes; or else once pg
// reaches totals. It reports whether the output ran to its end.
func readPage(ctx context.Context, p *client.Process, pg *page, totals map[string]int64, waiting bool) (ended bool, _ error) {
	for ch, err := range p.Output(ctx) {
		if err != nil {
			return false, err
		}
		if !pg.add(ch) || waiting || pg.reached(totals) {
			return false, nil
		}
	}
	return true, nil
}

// allEnded reports whether every stream of the process reached its end.
func allEnded(st client.Status) bool {
	for _, ss := range st.Process.Streams {
		if !ss.Ended {
			return false
		}
	}
	return true
}

// outputNote says in words what a result holds and what to do next.
func outputNote(r OutputOutput) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d bytes of output here; at most %d per call. ", r.Bytes, r.MaxBytes)
	for _, s := range slices.Sorted(maps.Keys(r.LostBytes)) {
		fmt.Fprintf(&b, "%d bytes of %s were lost before next_offsets (not kept). ", r.LostBytes[s], s)
	}
	switch {
	case r.Exited:
		b.WriteString("The process has exited and this is the end of its output.")
	case r.More:
		b.WriteString("More output is waiting: call again with next_offsets.")
	default:
		b.WriteString("The process is running and this is all it has written so far: call again with next_offsets later, or with wait_ms to wait for more.")
	}
	return b.String()
}

// text is output as a model reads it: UTF-8, each invalid byte U+FFFD.
func text(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }
