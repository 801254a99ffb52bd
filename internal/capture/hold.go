package capture

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// HoldTimeout bounds how long a held writer waits to be told how its run
// goes on. Past it, the writer continues in a new run by itself, as a
// copy restored from a memory snapshot would be told to: whether this is
// the sandbox that goes on is not known, and a new run that begins where
// the hold was is true in both. Its owner tells it within seconds; a
// sandbox restored from the snapshot later than HoldTimeout after it was
// taken finds its monotonic clock moved on by the time since (gVisor's),
// and its writers continue at once, before the owner can say so.
const HoldTimeout = 5 * time.Minute

// ErrNotHeld reports a Continue of a writer that is not held: released,
// or its hold ran out (it continued by itself).
var ErrNotHeld = errdefs.New(errdefs.ErrFailedPrecondition, "capture: the writer is not held")

// ErrHeld reports a Hold of a writer held already.
var ErrHeld = errdefs.New(errdefs.ErrFailedPrecondition, "capture: the writer is held already")

// hold is one Hold of a writer: the way its run goes on, decided once,
// by its owner or by the writer when it gives up waiting.
type hold struct {
	mu      sync.Mutex // guards decided
	decided bool
	decide  chan goOn // holds the decision, once made
}

// goOn is how a held run goes on: the same run (run is ""), or a new run
// that continues it, whose begin done (if any) is told of.
type goOn struct {
	run  string
	done chan error
}

// settle makes g the decision, unless one was made: it reports whether g
// is the one.
func (h *hold) settle(g goOn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.decided {
		return false
	}
	h.decided = true
	h.decide <- g
	return true
}

// Hold stops the run, in the log, at where each stream stands now, which
// it returns (per engine stream, every byte pushed so far, queued or
// lost): everything pushed before goes to the log as ever, the loss
// before it described there, and everything pushed after waits in the
// queue (which the pumps never wait for: what does not fit is counted
// lost, as ever) until the writer is released or continued, or
// continues by itself after HoldTimeout. held is false, nothing held,
// once the sink is closed: every byte is pushed, and the run ends as it
// would have.
func (w *Writer) Hold() (at ring.Offsets, held bool, err error) {
	w.mu.Lock()
	if w.holding != nil {
		w.mu.Unlock()
		return ring.Offsets{}, false, ErrHeld
	}
	h := &hold{decide: make(chan goOn, 1)}
	w.holding = h
	w.mu.Unlock()
	at, held = w.sink.mark(h)
	if !held {
		w.mu.Lock()
		w.holding = nil
		w.mu.Unlock()
	}
	return at, held, nil
}

// Release lets a held run go on as it was. A writer not held is left as
// it is.
func (w *Writer) Release() {
	w.mu.Lock()
	h := w.holding
	w.holding = nil
	w.mu.Unlock()
	if h != nil {
		h.settle(goOn{})
	}
}

// Continue has a held writer go on in a new run, run, that continues the
// one it was writing: once the records before the hold are written and
// synced, with the loss before it described, the writer starts a new
// file whose begin record names the old run and where each stream stood,
// syncs it, and writes on from there; the new run's end counts its own
// loss. It returns once that begin is durable, or why it is not: the
// writer not held (ErrNotHeld), its file system failing, ctx ending.
func (w *Writer) Continue(ctx context.Context, run string) error {
	if err := checkRunID(run); err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	w.mu.Lock()
	h := w.holding
	w.holding = nil
	w.mu.Unlock()
	g := goOn{run: run, done: make(chan error, 1)}
	if h == nil || !h.settle(g) {
		return ErrNotHeld
	}
	select {
	case err := <-g.done:
		return err
	case <-w.done:
		select {
		case err := <-g.done:
			return err
		default:
			return ErrStopped
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// await waits, in the writer goroutine at a Cut item, until the run's
// way on is decided, HoldTimeout passes (then it continues in a new run)
// or the writer is stopped (then it writes nothing more anyway).
func (w *Writer) await(h *hold) goOn {
	t := time.NewTimer(HoldTimeout)
	defer t.Stop()
	select {
	case g := <-h.decide:
		return g
	case <-t.C:
		h.settle(goOn{run: uuid.Must(uuid.NewV7()).String()})
	case <-w.stopping:
		h.settle(goOn{})
	}
	w.mu.Lock()
	if w.holding == h {
		w.holding = nil
	}
	w.mu.Unlock()
	return <-h.decide
}

// continueAs makes run, which continues the run being written, the
// writer's run, at the Cut item cut: the records before it are written
// (an unfinished line's bytes as P records, each stream's loss not yet
// described as a drop record) and synced, so the old run's records end
// exactly where the streams stood at the cut; then a new file begins the
// new run there.
func (w *Writer) continueAs(run string, cut Item) error {
	w.stamp()
	w.flushPartials()
	for s := range LogStream(NumLogStreams) {
		if !w.describe(s) {
			break
		}
	}
	w.flush()
	if w.failed {
		return fmt.Errorf("capture: run %s could not be written up to where it is continued: %w", w.run, cmp.Or(w.Result().Err, errWriteFailed))
	}
	var at [NumLogStreams]int64
	for rs, n := range cut.Offsets {
		at[logStream(ring.Stream(rs))] += n
	}
	if w.pos != at {
		// Never: every byte pushed before the cut is in the log or
		// described lost.
		return fmt.Errorf("capture: run %s stands at %v in its log, its cut at %v", w.run, w.pos, at)
	}
	if err := w.sync(); err != nil {
		w.failWrite(err)
		return fmt.Errorf("capture: run %s: %w", w.run, err)
	}
	var base [NumLogStreams]int64
	for rs, n := range cut.RunDropped {
		base[logStream(ring.Stream(rs))] += n
	}
	for s, n := range w.lost {
		base[s] += n
	}
	old, oldParent, oldBase := w.run, w.parent, w.base
	w.setRun(run, old)
	w.base = base
	if err := w.rotateTo(true); err != nil {
		// The old run's file stays the active one: it goes on there.
		w.setRun(old, oldParent)
		w.base = oldBase
		w.failWrite(err)
		return fmt.Errorf("capture: begin run %s, continuing %s: %w", run, old, err)
	}
	if err := w.sync(); err != nil {
		w.failWrite(err)
		return fmt.Errorf("capture: begin run %s, continuing %s: %w", run, old, err)
	}
	w.enterFS()
	defer w.leaveFS()
	return w.dir.sync()
}

// setRun makes run, continuing parent (if any), the run being written.
func (w *Writer) setRun(run, parent string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.run, w.parent = run, parent
}

var errWriteFailed = errors.New("its file system failed")
