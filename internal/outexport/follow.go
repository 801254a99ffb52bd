// One process's export: read its output as a kiln.v1 reader, publish it
// with compare-and-append, resume where its subject ends.

package outexport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// errFenced says another writer holds a process's subject: its last
// message is neither this exporter's nor where this exporter stands.
var errFenced = errors.New("outexport: another writer holds the subject")

// errSource says a process's kiln.v1 stream broke off before its exit.
var errSource = errors.New("outexport: the output's stream broke off")

// errAdopted says the follower goes on after another writer's last
// message (see settle): the output is to be read again from there.
var errAdopted = errors.New("outexport: went on after another writer's message")

// follower exports one process's output. Follow sets its first fields;
// the rest are its goroutine's (run), which alone publishes on its
// subject: one publish in flight, each expecting the last one stored.
type follower struct {
	x       *Exporter
	key     procKey
	proc    api.Process
	subject string
	cancel  context.CancelFunc
	done    chan struct{} // closed when run has returned

	// last is the sequence of the subject's last message, which the next
	// publish expects (0: the subject has none).
	last uint64
	// pos is where each of the process's streams stands after the last
	// message stored: where the export goes on from.
	pos   vector
	runID string // the run's UUID, once begun
	begun bool   // the begin record is stored
	// wrote says a message of this follower's is stored; finished, that
	// the subject's last message is the end record.
	wrote, finished bool
	// totals are the streams' totals, as their ends said.
	totals vector
	// down says, per stream, that a publish had to be tried again, or
	// waited for NATS to come back, or the export resumes after a time
	// it did not run, since a chunk of the stream was last published at
	// the first try: a gap of it now is export-down's, not the ring's
	// alone.
	down [numStreams]bool
	// failing says the last publish failed: its failure was told.
	failing bool
	// since is when the span the follower measures its work over began:
	// worked is the time it spent publishing since then; lapped says the
	// ring let output go before the export read it (see rest).
	since  time.Time
	worked time.Duration
	lapped bool
	// waited is the time publishes spent on tries that failed (NATS
	// unreachable, an election), which is not work, since the export
	// loop last counted.
	waited time.Duration
}

// A follower the output outruns rests. The export's cost is the
// servers' (every byte written, checksummed and replicated three times),
// several times the process's own for the same bytes: a follower that
// chased a flood would take those cores from the process, which the
// export must never slow, or from the kilnd relaying it to a client that
// holds it, which then holds it back to the export's own pace. So once
// the ring has let bytes go before the export came for them (lapped), or
// the follower has spent busyShare of a span of busySpan or more
// publishing (saturated: the output comes as fast as it can export),
// it stops publishing for restShare times as long as it worked in the
// span, up to maxRest. Lapped or saturated, it publishes a tenth of the
// time: the process runs on, its ring lets more go, and the gap record
// says exactly how much. (On a loaded 2-core machine, a 256 MiB burst
// ran at 0.58-0.74 of its rate without the export when the export chased
// it; with these rests, 0.85-0.90 with nobody reading it and 0.65-0.74
// held by a client, the copy holding 4-10% of it:
// bench/results/2026-12-05-cluster-export-epyc-2core.md.) Output the
// export keeps up with, most of the time idle, never waits.
const (
	restShare = 9
	maxRest   = time.Second
	busySpan  = 100 * time.Millisecond
	busyShare = 0.9
)

// shouldRest reports whether a follower rests, having worked for worked
// of the span since it began measuring, lapped or not since.
func shouldRest(lapped bool, worked, span time.Duration) bool {
	return lapped || span >= busySpan && float64(worked) >= busyShare*float64(span)
}

// run exports the process until its end record is stored, it cannot be
// read any more, another writer takes its subject, or ctx ends.
func (f *follower) run(ctx context.Context) {
	select {
	case <-f.x.ready:
	case <-ctx.Done():
		return
	}
	log := f.x.log.With("sandbox", f.key.sandbox, "process", f.key.process)
	err := f.resume(ctx)
	var b backoff
	for err == nil && !f.finished {
		at := f.pos
		if err = f.export(ctx); err == nil || f.finished {
			break
		}
		if ctx.Err() != nil || errors.Is(err, errFenced) || errors.Is(err, errdefs.ErrNotFound) {
			break
		}
		if errors.Is(err, errAdopted) {
			err = nil
			continue
		}
		// The agent dropped a reader that fell behind, or went for a
		// moment: open the output again from where the export stands,
		// soon if it got somewhere.
		if f.pos != at {
			b.reset()
		}
		err = b.wait(ctx)
	}
	switch {
	case f.finished || ctx.Err() != nil:
	case errors.Is(err, errFenced):
		f.x.stats.fenced.Add(1)
		log.Error("outexport: another writer holds the process's subject; this exporter stops exporting it", "subject", f.subject, "err", err)
	case errors.Is(err, errdefs.ErrNotFound):
		log.Warn("outexport: the process's output cannot be read any more; its export ends without an end record", "offsets", f.pos.offsets(), "err", err)
	default:
		log.Error("outexport: the process's export stopped", "err", err)
	}
}

// resume finds where the subject ends: its last message's vector, past
// it, is where the export goes on (nothing there: a new process; its end
// record: the export is finished). It tries again while JetStream is
// unreachable.
func (f *follower) resume(ctx context.Context) error {
	last, err := f.lastMessage(ctx)
	if errors.Is(err, errNoMessage) {
		return nil
	}
	if err != nil {
		return err
	}
	f.goOnAfter(last)
	f.allDown() // it did not run, or not here, since
	return nil
}

// goOnAfter makes last, a stored message, the one the export goes on
// after.
func (f *follower) goOnAfter(last *message) {
	f.last, f.pos, f.runID, f.begun = last.streamSeq, last.after(), last.run, true
	f.finished = last.kind == kindRecord && last.rec.Event == eventEnd
	if f.runID == "" {
		f.runID = uuid.NewString()
	}
}

// lastMessage is the subject's last stored message, errNoMessage if there
// is none; it tries again while JetStream cannot say, until ctx ends.
func (f *follower) lastMessage(ctx context.Context) (*message, error) {
	var b backoff
	for {
		actx, cancel := context.WithTimeout(ctx, requestTimeout)
		m, err := lastOnSubject(actx, f.x.js, f.x.stream, f.subject)
		cancel()
		if err == nil || errors.Is(err, errNoMessage) {
			return m, err
		}
		if errors.Is(err, errForeign) {
			return nil, fmt.Errorf("%w: %w", errFenced, err)
		}
		if !f.failing {
			f.failing = true
			f.x.log.Warn("outexport: cannot read the subject's last message; trying again", "subject", f.subject, "err", err)
		}
		if b.wait(ctx) != nil {
			return nil, ctx.Err()
		}
	}
}

// export reads the process's output from where the export stands and
// publishes it, until the end record is stored (nil) or something stops
// it: the output's stream breaking off (errSource), the process gone for
// good (errdefs.ErrNotFound), another writer (errFenced), or ctx.
func (f *follower) export(ctx context.Context) error {
	c, err := f.x.cfg.Source.Open(ctx, f.key.sandbox, f.key.process, f.pos.offsets())
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
		return fmt.Errorf("%w: %w", errSource, err)
	}
	// A reader reads ahead while a publish is in flight; it ends with
	// the conn, which ends when this returns.
	rctx, cancel := context.WithCancel(ctx)
	in := newInbox()
	var wg sync.WaitGroup
	wg.Go(func() { in.fill(rctx, c) })
	defer wg.Wait()
	defer c.CloseNow()
	defer cancel()
	for {
		items, err := in.take(ctx)
		if err != nil {
			return fmt.Errorf("%w: %w", errSource, err)
		}
		ops, err := merge(items, f.chunkCap())
		if err != nil {
			return fmt.Errorf("%w: %w", errSource, err)
		}
		began := time.Now()
		if f.since.IsZero() {
			f.since = began
		}
		for _, op := range ops {
			if op.frame != nil {
				err = f.chunk(ctx, *op.frame)
			} else {
				err = f.control(ctx, op.text)
			}
			if err != nil || f.finished {
				return err
			}
		}
		now := time.Now()
		f.worked += max(0, now.Sub(began)-f.waited)
		f.waited = 0
		switch span := now.Sub(f.since); {
		case shouldRest(f.lapped, f.worked, span):
			if err := f.rest(ctx); err != nil {
				return err
			}
		case span >= busySpan:
			f.since, f.worked = now, 0 // a span measured: the next
		}
	}
}

// rest waits while a follower rests (see restShare), and begins a span;
// its reader reads on meanwhile, up to the inbox's bound.
func (f *follower) rest(ctx context.Context) error {
	d := min(f.worked*restShare, maxRest)
	f.x.stats.rests.Add(1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	f.since, f.worked, f.lapped = time.Now(), 0, false
	return nil
}

// control acts on a control message of the output: the hello, a gap, a
// stream's end, the exit (after which the export is finished).
func (f *follower) control(ctx context.Context, data []byte) error {
	var m struct {
		Type    string                   `json:"type"`
		Streams map[string]api.HelloSpan `json:"streams"`
		api.Gap
		TotalBytes int64 `json:"total_bytes"`
		api.Exit
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("%w: a control message: %w", errSource, err)
	}
	switch m.Type {
	case api.TypeHello:
		return f.hello(ctx, m.Streams)
	case api.TypeGap:
		if s := streamCode(m.Stream); s != 0 && m.To >= m.From {
			return f.gap(ctx, s, m.To)
		}
	case api.TypeEnd:
		if s := streamCode(m.Stream); s != 0 {
			f.totals.has[s], f.totals.off[s] = true, m.TotalBytes
		}
	case api.TypeExit:
		return f.end(ctx, m.Exit)
	}
	return nil
}

// hello takes the process's streams from the output's first message and,
// for a process new to the subject, stores its begin record.
func (f *follower) hello(ctx context.Context, streams map[string]api.HelloSpan) error {
	for name := range streams {
		if s := streamCode(name); s != 0 {
			f.pos.has[s] = true
		}
	}
	if f.begun {
		return nil
	}
	f.runID = uuid.NewString()
	start := f.proc.StartedAt
	r := record{
		Event: eventBegin, Node: f.x.cfg.Node, Sandbox: f.key.sandbox, Process: f.key.process,
		Argv: append([]string{f.proc.Command}, f.proc.Args...), Terminal: f.proc.Terminal,
		Streams: slices.Sorted(maps.Keys(f.pos.offsets())),
	}
	if !start.IsZero() {
		r.Start = &start
	}
	if err := f.publish(ctx, recordMsg(r, f.pos, f.runID, f.x.writer)); err != nil {
		return err
	}
	f.begun = true
	return nil
}

// chunk publishes a frame's bytes that the subject does not have yet,
// after a gap record for any it skips, in messages of chunkCap at most.
func (f *follower) chunk(ctx context.Context, fr api.Frame) error {
	s := fr.Stream
	f.pos.has[s] = true
	off, data, seq := int64(fr.Offset), fr.Data, fr.Seq
	if off > f.pos.off[s] {
		// The agent says what it skips with a gap first; this is the
		// same, should it not.
		if err := f.gap(ctx, s, off); err != nil {
			return err
		}
	}
	if skip := f.pos.off[s] - off; skip > 0 {
		if skip >= int64(len(data)) {
			return nil // had already
		}
		data, seq = data[skip:], seq+uint64(skip)
	}
	for n := f.chunkCap(); len(data) > 0; {
		piece := data[:min(n, len(data))]
		m := &message{kind: kinds[s], at: f.pos, seq: seq, run: f.runID, writer: f.x.writer, data: piece}
		if err := f.publish(ctx, m); err != nil {
			return err
		}
		f.x.stats.bytes.Add(int64(len(piece)))
		data, seq = data[len(piece):], seq+uint64(len(piece))
	}
	return nil
}

// chunkCap bounds a chunk's bytes in one message: maxChunk, less where
// the server takes smaller messages, or the stream is so small that a
// larger one would push most of it out.
func (f *follower) chunkCap() int {
	n := maxChunk
	if mp := int(f.x.cfg.Conn.MaxPayload()); mp > 0 {
		n = min(n, mp-8<<10)
	}
	if mb := f.x.cfg.MaxBytes; mb > 0 {
		n = min(n, int(mb/8))
	}
	return max(n, 1<<10)
}

// gap stores a gap record saying the bytes of stream s up to to, from
// where the export stands, never reached the subject.
func (f *follower) gap(ctx context.Context, s byte, to int64) error {
	f.pos.has[s] = true
	from := f.pos.off[s]
	if to <= from {
		return nil
	}
	cause := CauseRingEvicted
	if f.down[s] {
		cause = CauseExportDown
	}
	r := record{Event: eventGap, Stream: api.StreamNames[s], From: from, Lost: to - from, Cause: cause}
	if err := f.publish(ctx, recordMsg(r, f.pos, f.runID, f.x.writer)); err != nil {
		return err
	}
	f.x.stats.lost.Add(to - from)
	f.lapped = f.lapped || cause == CauseRingEvicted
	f.down[s] = false
	return nil
}

// end stores the end record: the exit the agent observed and the
// streams' totals, after a gap for any bytes the export did not get.
func (f *follower) end(ctx context.Context, exit api.Exit) error {
	for s := byte(1); s < numStreams; s++ {
		if f.totals.has[s] && f.totals.off[s] > f.pos.off[s] {
			if err := f.gap(ctx, s, f.totals.off[s]); err != nil {
				return err
			}
		}
	}
	r := record{Event: eventEnd, Exit: &exit, Totals: f.pos.offsets()}
	if err := f.publish(ctx, recordMsg(r, f.pos, f.runID, f.x.writer)); err != nil {
		return err
	}
	f.x.stats.ended.Add(1)
	return nil
}

// publish stores m on the subject right after the last message stored,
// and moves the export past it. It tries again, with the same message
// and expectation, until the message is stored, the subject turns out to
// be another writer's (errFenced), or ctx ends: a try whose answer was
// lost may have been stored, and the compare-and-append then refuses the
// next, which settle recognises as its own.
func (f *follower) publish(ctx context.Context, m *message) error {
	msg := m.natsMsg(f.subject)
	nc := f.x.cfg.Conn
	reconnects := nc.Stats().Reconnects
	var b backoff
	for first := true; ; first = false {
		tried := time.Now()
		actx, cancel := context.WithTimeout(ctx, requestTimeout)
		ack, err := f.x.js.PublishMsg(actx, msg, jetstream.WithExpectLastSequencePerSubject(f.last))
		cancel()
		stored := err == nil
		if stored {
			f.last = ack.Sequence
		} else if ctx.Err() != nil {
			return ctx.Err()
		} else if apiCode(err) == jetstream.JSErrCodeStreamWrongLastSequence {
			f.x.stats.conflicts.Add(1)
			if stored, err = f.settle(ctx, m); err != nil {
				return err
			}
			if !stored {
				continue // the expectation is right now
			}
		}
		if stored {
			f.pos, f.wrote = m.after(), true
			f.finished = m.kind == kindRecord && m.rec.Event == eventEnd
			f.x.stats.messages.Add(1)
			if f.failing {
				f.failing = false
				f.x.log.Info("outexport: publishing again", "subject", f.subject)
			}
			// At the first try, without NATS going meanwhile, the
			// export keeps up: a gap after this one is the ring's.
			if clean := first && nc.Stats().Reconnects == reconnects && nc.IsConnected(); !clean {
				f.allDown()
			} else if s := m.stream(); s != 0 {
				f.down[s] = false
			}
			return nil
		}
		// Unreachable, an election, a timeout, or a publish of this
		// subject's still in flight (JSErrCodeStreamWrongLastSequenceConstant
		// on a replicated stream): the same again, later.
		f.x.stats.retries.Add(1)
		f.allDown()
		if !f.failing {
			f.failing = true
			f.x.log.Warn("outexport: cannot publish; trying again", "subject", f.subject, "err", err)
		}
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			f.x.ensure(ctx) // no stream takes the subject: was it deleted?
		}
		if b.wait(ctx) != nil {
			return ctx.Err()
		}
		f.waited += time.Since(tried) // a try that failed, and the wait after it: no work of the servers'
	}
}

// settle finds out, after a refused compare-and-append of m, what the
// subject's last message is:
//   - m itself, stored by an earlier try whose answer was lost: settle
//     reports true;
//   - none (the stream discarded all of the subject), or this writer's
//     message before m, stored at a sequence other than expected: the
//     next try expects that;
//   - another writer's, while nothing of this follower's is stored yet:
//     the export goes on after it (errAdopted). That is the last publish
//     of an exporter this one took over from, landing after this one
//     looked, or a writer it races with; whichever of two writes on after
//     the other has written is fenced, so one of them stays;
//   - another writer's, after this follower's own: errFenced.
func (f *follower) settle(ctx context.Context, m *message) (stored bool, err error) {
	last, err := f.lastMessage(ctx)
	switch {
	case errors.Is(err, errNoMessage):
		f.last = 0
		return false, nil
	case err != nil:
		return false, err
	case last.same(m):
		f.last = last.streamSeq
		return true, nil
	case last.writer == m.writer && last.after() == m.at:
		f.last = last.streamSeq
		return false, nil
	case !f.wrote:
		f.goOnAfter(last)
		return false, errAdopted
	}
	return false, fmt.Errorf("%w: its last message, %d, is writer %s's at %v; this one's (%s) is at %v",
		errFenced, last.streamSeq, api.Clip(last.writer), last.at.offsets(), m.writer, m.at.offsets())
}

// allDown marks every stream's next gap export-down's.
func (f *follower) allDown() {
	for s := range f.down {
		f.down[s] = true
	}
}

// ensure creates or updates the node's stream once.
func (x *Exporter) ensure(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	x.js.CreateOrUpdateStream(ctx, x.streamConfig())
}
