package process

import (
	"context"
	"io"
	"slices"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// Event is what an attachment delivers: the ring's Data, Gap and End events,
// then one event of Kind ring.Exit carrying the observed exit.
type Event struct {
	ring.Event
	Exit Exit // for Kind ring.Exit
}

// Attachment is one reader of a process's output: replay from its starting
// offsets, then the live tail, each stream's end, and the exit, as one
// sequence. It belongs to one goroutine. A reader that stops calling Next
// costs only itself; when it resumes it is told exactly what it missed.
//
// For a captured process, what the ring no longer holds is read from the
// captured log instead (see replay): a gap is reported only for bytes
// neither holds, exactly counted.
type Attachment struct {
	cur     *ring.Cursor // nil for a tombstone
	p       *Process     // nil for a tombstone
	pending []Event      // a tombstone's synthesized events
	totals  ring.Offsets // a tombstone's stream totals
	exit    Exit
	exitOK  bool // exit known (a tombstone's) or observed
	sent    bool // the exit event was returned
	onClose func()
	closed  bool

	// pos is where each stream stands in what Next returned; seqEnd is
	// where the last Data returned ends in the process's output (its seq
	// plus its length), 0 before any.
	pos    ring.Offsets
	seqEnd uint64
	// merged holds the Data NextMerged joined, until its next call.
	merged []byte

	// log opens the process's captured log; nil if it has none. caught,
	// for a process still running, waits until what its pumps pushed is
	// in the log, or in the unfinished lines it returns, however late the
	// writer is, unless its disk has stalled. rep is the
	// replay under way; done, the last one, kept for the next gaps to
	// read the log on from; held, an event taken from the ring (or the
	// tombstone) while looking past a gap, returned after the replay.
	log      func() (*capture.Dir, error)
	caught   func(context.Context) ([capture.NumLogStreams]capture.HeldLine, error)
	terminal bool
	rep      *replay
	done     *replay
	held     *Event
}

// Next returns the next event; io.EOF after the exit event. The Data of the
// previous event is invalid once Next is called again.
func (a *Attachment) Next(ctx context.Context) (Event, error) {
	if a.closed {
		return Event{}, io.ErrClosedPipe
	}
	for {
		if a.rep != nil {
			e, ok, err := a.rep.next(ctx)
			if err != nil {
				return Event{}, err
			}
			if ok {
				return a.returned(Event{Event: e}), nil
			}
			a.done, a.rep = a.rep, nil
		}
		e, err := a.source(ctx)
		if err != nil {
			return Event{}, err
		}
		if e.Kind == ring.Gap && a.log != nil && a.replay(ctx, e) {
			continue
		}
		return a.returned(e), nil
	}
}

// NextMerged is Next, except that a Data event is joined by the Data events
// that follow it without waiting and continue it exactly (the same
// stream, each starting at the offset and seq the one before ended), up to
// max bytes: for a reader that is behind, fewer and larger messages, the
// offset and seq those of the first, no byte or order changed. A merged
// event's Data is the attachment's, valid until the next call.
func (a *Attachment) NextMerged(ctx context.Context, max int) (Event, error) {
	e, err := a.Next(ctx)
	if err != nil || e.Kind != ring.Data {
		return e, err
	}
	joined := false
	for n := len(e.Data); ; {
		next, ok := a.peekData()
		if !ok || next.Stream != e.Stream || next.Offset != e.Offset+int64(n) || next.Seq != e.Seq+uint64(n) || n+len(next.Data) > max {
			break
		}
		if !joined {
			// e's Data is the ring's until Next is called again.
			a.merged = append(a.merged[:0], e.Data...)
			joined = true
		}
		got, err := a.Next(ctx) // next, without waiting
		if err != nil {
			return Event{}, err
		}
		a.merged = append(a.merged, got.Data...)
		n += len(got.Data)
	}
	if joined {
		e.Data = a.merged
	}
	return e, nil
}

// peekData returns the next event when it is Data that Next returns at
// once from the ring, as it is there: not a replay, nor one held back.
func (a *Attachment) peekData() (ring.Event, bool) {
	if a.rep != nil || a.held != nil || len(a.pending) > 0 || a.cur == nil {
		return ring.Event{}, false
	}
	e, ok := a.cur.Peek()
	return e, ok && e.Kind == ring.Data
}

// returned notes what Next returns.
func (a *Attachment) returned(e Event) Event {
	switch e.Kind {
	case ring.Data:
		a.pos[e.Stream] = e.Offset + int64(len(e.Data))
		a.seqEnd = e.Seq + uint64(len(e.Data))
	case ring.Gap:
		a.pos[e.Stream] = e.To
	}
	return e
}

// source returns the next event of the ring (or of the tombstone), then
// the exit.
func (a *Attachment) source(ctx context.Context) (Event, error) {
	if a.held != nil {
		e := *a.held
		a.held = nil
		return e, nil
	}
	if len(a.pending) > 0 {
		e := a.pending[0]
		a.pending = a.pending[1:]
		return e, nil
	}
	if a.cur != nil {
		e, err := a.cur.Next(ctx)
		if err == nil {
			return Event{Event: e}, nil
		}
		if err != io.EOF {
			return Event{}, err
		}
	}
	if a.sent {
		return Event{}, io.EOF
	}
	if !a.exitOK {
		// Every stream has ended, but a process may close its output and
		// keep running: the exit is reported only once observed, and with
		// whether the drain cut its output.
		e, err := a.p.Ended(ctx)
		if err != nil {
			return Event{}, err
		}
		a.exit, a.exitOK = e, true
	}
	a.sent = true
	return Event{Event: ring.Event{Kind: ring.Exit}, Exit: a.exit}, nil
}

// Ready reports whether Next would return at once: the next event is in
// hand, not to be waited for, nor read from the captured log (a gap a log
// may fill, a replay under way). After the exit it is false: there is no
// next event.
func (a *Attachment) Ready() bool {
	if a.closed || a.sent || a.rep != nil {
		return false
	}
	if a.held != nil || len(a.pending) > 0 {
		return true
	}
	if a.cur == nil {
		return false
	}
	e, ok := a.cur.Peek()
	return ok && (e.Kind != ring.Gap || a.log == nil)
}

// ready reports how many events source returns without waiting.
func (a *Attachment) ready() int {
	n := len(a.pending)
	if a.held != nil {
		n++
	}
	if a.cur != nil {
		n += a.cur.Pending()
	}
	return n
}

// replay starts filling gap, and the other streams' gaps that come with
// it, from the captured log. It reports false when the log cannot be read:
// the gap is then returned as it is.
func (a *Attachment) replay(ctx context.Context, gap Event) bool {
	gaps := []ring.Event{gap.Event}
	// The ring reports the streams' gaps together: fill them together, in
	// the log's order. What follows them is kept for after.
	for a.ready() > 0 {
		e, err := a.source(ctx)
		if err != nil {
			break
		}
		if e.Kind != ring.Gap || slices.ContainsFunc(gaps, func(g ring.Event) bool { return g.Stream == e.Stream }) {
			a.held = &e
			break
		}
		gaps = append(gaps, e.Event)
	}
	// The writer is waited for however late it is: what it holds is not
	// lost. Only a writer whose disk does not answer (capture.ErrStalled)
	// leaves the reader with what the log holds, then a gap.
	var held [capture.NumLogStreams]capture.HeldLine
	if a.caught != nil {
		var err error
		if held, err = a.caught(ctx); err != nil {
			held = [capture.NumLogStreams]capture.HeldLine{} // what the log holds, then a gap
		}
	}
	if a.done != nil {
		if a.done.resume(gaps, a.pos, held) {
			a.rep, a.done = a.done, nil
			return true
		}
		a.done.close()
		a.done = nil
	}
	dir, err := a.log()
	if err != nil {
		// The gaps are returned as they are, in their order; what was
		// taken after them comes next, before anything newer.
		back := make([]Event, 0, len(gaps))
		for _, g := range gaps[1:] {
			back = append(back, Event{Event: g})
		}
		if a.held != nil {
			back = append(back, *a.held)
			a.held = nil
		}
		a.pending = append(back, a.pending...)
		return false
	}
	a.rep = newReplay(dir, gaps, a.pos, held, a.terminal, &a.seqEnd)
	return true
}

// Ack tells a holding attachment where its reader has got to: the output
// from there on stays held for it (see ring.Cursor.Ack). Safe to call
// while another goroutine calls Next.
func (a *Attachment) Ack(at ring.Offsets) {
	if a.cur != nil {
		a.cur.Ack(at)
	}
}

// Position returns the per-stream offsets a client that consumed every
// event so far would resume from.
func (a *Attachment) Position() ring.Offsets { return a.pos }

// Close releases the attachment; the process may then become a tombstone.
// The output a holding attachment had not read stays held for the
// process's grace period, for its reader to come back to.
func (a *Attachment) Close() { a.close(false) }

// Abandon is Close for a reader that will not come back: the output it
// held is not held any more.
func (a *Attachment) Abandon() { a.close(true) }

func (a *Attachment) close(abandon bool) {
	if a.closed {
		return
	}
	a.closed = true
	if a.cur != nil {
		if abandon {
			a.cur.Abandon()
		} else {
			a.cur.Close()
		}
	}
	for _, rp := range []*replay{a.rep, a.done} {
		if rp != nil {
			rp.close()
		}
	}
	a.rep, a.done = nil, nil
	if a.onClose != nil {
		a.onClose()
	}
}

// tombstoneEvents is what a late reader of a finished process gets: for each
// stream, the bytes it had not seen as one gap (they were released), the
// stream's end with its total, then the exit.
func tombstoneEvents(streams []ring.Stream, totals, from ring.Offsets) []Event {
	var evs []Event
	for _, s := range streams {
		if from[s] < totals[s] {
			evs = append(evs, Event{Event: ring.Event{Kind: ring.Gap, Stream: s, Offset: from[s], To: totals[s]}})
		}
	}
	for _, s := range streams {
		evs = append(evs, Event{Event: ring.Event{Kind: ring.End, Stream: s, Offset: totals[s]}})
	}
	return evs
}
