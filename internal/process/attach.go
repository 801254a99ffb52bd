package process

import (
	"context"
	"io"

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
}

// Next returns the next event; io.EOF after the exit event. The Data of the
// previous event is invalid once Next is called again.
func (a *Attachment) Next(ctx context.Context) (Event, error) {
	if a.closed {
		return Event{}, io.ErrClosedPipe
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
		// keep running: the exit is reported only once observed.
		e, err := a.p.Wait(ctx)
		if err != nil {
			return Event{}, err
		}
		a.exit, a.exitOK = e, true
	}
	a.sent = true
	return Event{Event: ring.Event{Kind: ring.Exit}, Exit: a.exit}, nil
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
func (a *Attachment) Position() ring.Offsets {
	if a.cur == nil {
		p := a.totals
		for _, e := range a.pending {
			if e.Kind == ring.Gap {
				p[e.Stream] = e.Offset
			}
		}
		return p
	}
	return a.cur.Position()
}

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
