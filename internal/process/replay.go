package process

import (
	"context"
	"errors"
	"io"
	"math"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// replayPiece bounds the bytes of one event a replay makes of the log's
// records, which are at most 16 KiB each: fewer, larger messages for a
// watcher reading megabytes of them.
const replayPiece = 64 << 10

// replay fills a reader's gaps from the process's captured log: for each
// stream with a gap, the log's bytes of the span, then a gap for what the
// log does not hold either (its capture dropped it, or rotation removed
// it), so that every byte of the span is accounted for, once, at its
// offset. The log's records are read in log order, so the streams'
// interleaving is the log's. Each event's seq is the sum, over the
// streams, of where the log stands in each (bounded by where the reader
// stands in the streams without a gap, and by the end of the gaps), or
// the end of the event before it if that is higher: so events follow each
// other in the process's output without overlapping, as the ring's do,
// and end before the seq of the ring's event after the gaps (the sum of
// the bounds is at most that, and the events' lengths are the bytes the
// bounds leave room for). Of a process still running, the lines its log
// writer holds unfinished follow the log's end, as the records they will
// become.
type replay struct {
	dir  *capture.Dir
	r    *capture.Reader
	ptys bool // the process's one stream is the terminal: the log's stdout

	at, to   ring.Offsets // per stream, the span still to account for
	gapped   [ring.NumStreams]bool
	caps     ring.Offsets // where each stream bounds seq
	logAt    ring.Offsets // where the log stands per stream
	held     [capture.NumLogStreams]capture.HeldLine
	seqEnd   *uint64      // the attachment's: where the event returned last ends
	out      []ring.Event // events made, not yet returned
	piece    ring.Event   // data being gathered, Kind Data when any
	finished bool
}

// newReplay starts a replay of the gaps, a gap per stream at most, from the
// log in dir; where reports where the reader stands in every stream.
func newReplay(dir *capture.Dir, gaps []ring.Event, where ring.Offsets, held [capture.NumLogStreams]capture.HeldLine, terminal bool, seqEnd *uint64) *replay {
	rp := &replay{dir: dir, ptys: terminal, seqEnd: seqEnd}
	rp.span(gaps, where, held)
	from := capture.Positions{Stdout: math.MaxInt64, Stderr: math.MaxInt64}
	for _, g := range gaps {
		switch rp.logStream(g.Stream) {
		case capture.LogStdout:
			from.Stdout = min(from.Stdout, g.Offset)
		case capture.LogStderr:
			from.Stderr = min(from.Stderr, g.Offset)
		}
	}
	rp.r = capture.NewReader(dir, capture.ReadOptions{From: &from})
	return rp
}

// span sets the gaps to account for.
func (rp *replay) span(gaps []ring.Event, where ring.Offsets, held [capture.NumLogStreams]capture.HeldLine) {
	rp.at, rp.to, rp.gapped, rp.caps, rp.held = ring.Offsets{}, ring.Offsets{}, [ring.NumStreams]bool{}, where, held
	for _, g := range gaps {
		s := g.Stream
		rp.at[s], rp.to[s], rp.gapped[s], rp.caps[s] = g.Offset, g.To, true, g.To
	}
	rp.out, rp.piece, rp.finished = nil, ring.Event{}, false
}

// resume takes on the next gaps of a reader that falls behind again, with
// the log read on from where this replay stopped, when that is not past
// them: a slow watcher reads the log through once, not from its file's
// start at every gap. It reports false when the log was read past them.
func (rp *replay) resume(gaps []ring.Event, where ring.Offsets, held [capture.NumLogStreams]capture.HeldLine) bool {
	for _, g := range gaps {
		if rp.logAt[g.Stream] > g.Offset {
			return false
		}
	}
	rp.span(gaps, where, held)
	return true
}

func (rp *replay) logStream(s ring.Stream) capture.LogStream {
	if s == ring.Stderr {
		return capture.LogStderr
	}
	return capture.LogStdout
}

func (rp *replay) ringStream(s capture.LogStream) ring.Stream {
	switch {
	case s == capture.LogStderr:
		return ring.Stderr
	case rp.ptys:
		return ring.PTY
	}
	return ring.Stdout
}

// close releases the log.
func (rp *replay) close() {
	rp.r.Close()
	rp.dir.Close()
}

// next returns the next event of the replay; false once every gap is
// accounted for. An event's Data stays valid after later calls.
func (rp *replay) next(ctx context.Context) (ring.Event, bool, error) {
	for len(rp.out) == 0 {
		if rp.finished {
			return ring.Event{}, false, nil
		}
		e, err := rp.r.Next(ctx)
		if errors.Is(err, io.EOF) {
			// The log holds no more; after it, the lines its writer holds
			// unfinished; what is left of the gaps is lost.
			for s, h := range rp.held {
				if len(h.Data) > 0 {
					rp.record(rp.ringStream(capture.LogStream(s)), h.Offset, h.Data, false)
				}
			}
			rp.held = [capture.NumLogStreams]capture.HeldLine{}
			rp.flush()
			for s := range rp.gapped {
				rp.lose(ring.Stream(s), rp.to[s])
			}
			rp.finished = true
			continue
		}
		if err != nil {
			return ring.Event{}, false, err
		}
		if e.Gap != 0 || e.Stream == capture.LogMeta || e.Offset < 0 {
			continue
		}
		rp.record(rp.ringStream(e.Stream), e.Offset, e.Content, !e.Partial)
		if rp.done() {
			rp.flush()
			rp.finished = true
		}
	}
	e := rp.out[0]
	rp.out = rp.out[1:]
	return e, true, nil
}

// record takes one log record of stream s at offset off: content, and a
// newline after it for a whole line.
func (rp *replay) record(s ring.Stream, off int64, content []byte, newline bool) {
	n := int64(len(content))
	if newline {
		n++
	}
	defer func() { rp.logAt[s] = max(rp.logAt[s], off+n) }()
	if !rp.gapped[s] || off+n <= rp.at[s] {
		return
	}
	if off >= rp.to[s] {
		rp.lose(s, rp.to[s])
		return
	}
	if off > rp.at[s] {
		rp.lose(s, off) // the log lacks these bytes too
	}
	skip := rp.at[s] - off
	end := min(n, rp.to[s]-off)
	if p := &rp.piece; p.Kind == ring.Data && (p.Stream != s || p.Offset+int64(len(p.Data)) != rp.at[s] || len(p.Data) >= replayPiece) {
		rp.flush()
	}
	if rp.piece.Kind != ring.Data {
		rp.piece = ring.Event{Kind: ring.Data, Stream: s, Offset: rp.at[s], Seq: rp.seq(s), Data: make([]byte, 0, replayPiece)}
	}
	line := content
	if newline {
		line = append(content[:len(content):len(content)], '\n')
	}
	rp.piece.Data = append(rp.piece.Data, line[skip:end]...)
	rp.at[s] = off + end
}

// seq is the seq of an event of s starting where the replay stands in s.
func (rp *replay) seq(s ring.Stream) uint64 {
	var sum uint64
	for x := range ring.Stream(ring.NumStreams) {
		at := rp.logAt[x]
		if x == s {
			at = rp.at[s]
		}
		sum += uint64(min(at, rp.caps[x]))
	}
	end := *rp.seqEnd // past what was returned, and what is made and not yet
	for _, e := range rp.out {
		if e.Kind == ring.Data {
			end = max(end, e.Seq+uint64(len(e.Data)))
		}
	}
	return max(sum, end)
}

// lose accounts for s up to to as lost, after what was gathered of it.
func (rp *replay) lose(s ring.Stream, to int64) {
	if !rp.gapped[s] || rp.at[s] >= to {
		return
	}
	if rp.piece.Kind == ring.Data && rp.piece.Stream == s {
		rp.flush()
	}
	rp.out = append(rp.out, ring.Event{Kind: ring.Gap, Stream: s, Offset: rp.at[s], To: to})
	rp.at[s] = to
}

// flush makes an event of the data gathered.
func (rp *replay) flush() {
	if rp.piece.Kind == ring.Data && len(rp.piece.Data) > 0 {
		rp.out = append(rp.out, rp.piece)
	}
	rp.piece = ring.Event{}
}

// done reports whether every gap is accounted for.
func (rp *replay) done() bool {
	for s, g := range rp.gapped {
		if g && rp.at[s] < rp.to[s] {
			return false
		}
	}
	return true
}
