package capture

import (
	"fmt"
	"time"
)

// Piece is output of a stream that something other than a writer kept
// (a process's ring, read back), at its offset in the stream.
type Piece struct {
	Stream LogStream
	Offset int64
	Data   []byte
}

// Keep writes, in dir, a run of its own, whole, of output kept elsewhere
// of a process that was not captured: its pieces, in the order the
// process wrote them, each at its offset, and every byte of a stream not
// among them, up to to (where each stream stood), counted lost and
// described by a drop record where it was; then the end, with the run's
// exact loss. Its records carry at. Overlapping bytes are written once,
// where they first come. The log is the format's like any other, begun
// and ended as a writer does, synced; dir must hold no log yet.
func Keep(dir *Dir, run string, at time.Time, pieces []Piece, to Positions) (Result, error) {
	if err := checkRunID(run); err != nil {
		return Result{}, fmt.Errorf("capture: %w", err)
	}
	opt, err := Options{}.withDefaults()
	if err != nil {
		return Result{}, err
	}
	w := &Writer{dir: dir, run: run, opt: opt, done: make(chan struct{}), stopping: make(chan struct{}), epoch: time.Now()}
	defer close(w.done)
	if err := w.open(); err != nil {
		if w.f != nil {
			w.f.Close()
		}
		return Result{}, fmt.Errorf("capture: keep run %s in %s: %w", run, dir.Name(), err)
	}
	w.sink = NewSink(MinQueueBytes) // nothing is pushed: the end's loss is the writer's
	w.stampAt(at.UnixNano())
	for _, p := range pieces {
		s := p.Stream
		stands := w.stands(s)
		data := p.Data
		if p.Offset < stands {
			data = data[min(stands-p.Offset, int64(len(data))):]
		} else if p.Offset > stands {
			w.flushPartial(s)
			w.lose(s, p.Offset-stands)
		}
		w.addData(s, data)
	}
	end := [NumLogStreams]int64{to.Stdout, to.Stderr}
	for s := range LogStream(NumLogStreams) {
		if n := end[s] - w.stands(s); n > 0 {
			// The tail nobody kept: said where it is, not only in the end.
			w.flushPartial(s)
			w.lose(s, n)
			w.describe(s)
		}
	}
	w.finish()
	res := w.Result()
	return res, res.Err
}

// stands is where stream s stands in what the writer has been given: the
// offset of its next byte.
func (w *Writer) stands(s LogStream) int64 {
	return w.pos[s] + w.outBytes[s] + w.outDrops[s] + w.unsaid[s] + int64(len(w.partial[s]))
}
