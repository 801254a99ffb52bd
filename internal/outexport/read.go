// A process's output read back from its subject, as kiln.v1 messages.

package outexport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// ReadOptions say what of a process's output a Reader reads.
type ReadOptions struct {
	// From is where to start, per stream (streams left out start at 0).
	From Offsets
	// Follow goes on past what the subject holds when the Reader opens,
	// with the messages stored after (a live process's, on a node that
	// still exports it), until the end record; without it the Reader
	// ends where the subject ended when it opened.
	Follow bool
}

// readBuffer bounds the bytes a Reader's consumer holds ahead of it: a
// few of the largest messages.
const readBuffer = 4 << 20

// Reader reads a process's output back from JetStream as a kiln.v1
// stream: a hello (each stream's first offset JetStream holds and its
// total so far), its bytes in binary frames at their offsets, a gap with
// the exact count for what JetStream does not hold (never received, or
// discarded since), and, once the process's end record is read, each
// stream's end and the exit. It is a Conn: the daemon serves it as it
// relays an agent's. Read is called from one goroutine at a time;
// CloseNow from any.
//
// It replays and then follows with one ordered consumer, which it starts
// at the first message that reaches past From (found by a binary search
// over the stream's sequences), and trims what it has read already.
type Reader struct {
	it      jetstream.MessagesContext
	follow  bool
	lastSeq uint64 // the subject's last message when opened
	readTo  uint64 // the last message read, of the stream's sequences
	pos     vector // where the reader stands in each stream
	queue   []outMsg
	ended   bool
	// run is the export's run, as the subject's first message names
	// it; begun says that message is the begin record (the subject
	// still holds the export's start).
	run   string
	begun bool
	// stored is when JetStream stored the message the last Read's came
	// of (zero for the hello).
	stored time.Time
}

// outMsg is one kiln.v1 message waiting to be read, and when JetStream
// stored the message it came of.
type outMsg struct {
	typ    websocket.MessageType
	data   []byte
	stored time.Time
}

// NewReader opens process's output on node as JetStream holds it. An
// error wrapping errdefs.ErrNotFound says JetStream holds none of it;
// errdefs.ErrUnavailable, that JetStream could not be asked.
func NewReader(ctx context.Context, js jetstream.JetStream, node, sandbox, process string, o ReadOptions) (*Reader, error) {
	if !validName(node) || !validToken(sandbox) || !validToken(process) {
		return nil, fmt.Errorf("%w: outexport: node %q, sandbox %q, process %q", errdefs.ErrInvalidArgument, api.Clip(node), api.Clip(sandbox), api.Clip(process))
	}
	subject := Subject(node, sandbox, process)
	// Each request has a time of its own: one sent to a server as it
	// went is never answered.
	sctx, cancel := context.WithTimeout(ctx, requestTimeout)
	s, err := js.Stream(sctx, StreamName(node))
	cancel()
	if err != nil {
		return nil, lookupErr(ctx, subject, err)
	}
	// The last message from the stream's leader: a replica behind it
	// would end a reader that does not follow short of the copy, with no
	// gap to say so.
	lctx, cancel := context.WithTimeout(ctx, requestTimeout)
	last, err := lastOnSubject(lctx, js, StreamName(node), subject)
	cancel()
	if errors.Is(err, errNoMessage) {
		err = jetstream.ErrMsgNotFound
	}
	if err != nil {
		return nil, lookupErr(ctx, subject, fmt.Errorf("last: %w", err))
	}
	first, err := getMsg(ctx, s, subject, 1)
	if err != nil {
		return nil, lookupErr(ctx, subject, fmt.Errorf("first: %w", err))
	}
	r := &Reader{follow: o.Follow, lastSeq: last.streamSeq, run: first.run,
		begun: first.kind == kindRecord && first.rec.Event == eventBegin}
	streams := last.after()
	for s := byte(1); s < numStreams; s++ {
		r.pos.has[s] = streams.has[s]
	}
	for name, off := range o.From {
		if s := streamCode(name); s != 0 && r.pos.has[s] {
			r.pos.off[s] = max(off, 0)
		}
	}
	r.hello(first, last)
	start, err := r.search(ctx, s, subject, first, last)
	if err != nil {
		return nil, lookupErr(ctx, subject, fmt.Errorf("search: %w", err))
	}
	r.readTo = start - 1
	if !r.follow && start > r.lastSeq {
		return r, nil // nothing stored reaches past From
	}
	cctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	cons, err := s.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    start,
	})
	if err != nil {
		return nil, lookupErr(ctx, subject, err)
	}
	if r.it, err = cons.Messages(jetstream.PullMaxBytes(readBuffer)); err != nil {
		return nil, lookupErr(ctx, subject, err)
	}
	return r, nil
}

// lookupErr classes an error looking subject up, under ctx: a request
// that timed out before ctx ended is JetStream's unavailability.
func lookupErr(ctx context.Context, subject string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("%w: outexport: no output on %s: %w", errdefs.ErrNotFound, subject, err)
	case errors.Is(err, errForeign):
		return err
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("%w: outexport: %s: %w", errdefs.ErrUnavailable, subject, err)
}

// getMsg is subject's first message at or after seq, from any replica
// (direct get).
func getMsg(ctx context.Context, s jetstream.Stream, subject string, seq uint64) (*message, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	raw, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
	if err != nil {
		return nil, err
	}
	return decode(raw.Header, raw.Data, raw.Sequence)
}

// hello queues the first message: each stream's first offset the subject
// holds (where its first message begins, or ends for a gap record), and
// its total so far (where its last ends, or the end record's).
func (r *Reader) hello(first, last *message) {
	h := api.Hello{Type: api.TypeHello, Streams: map[string]api.HelloSpan{}}
	from, total := first.at, last.after()
	if first.kind == kindRecord && first.rec.Event == eventGap {
		from = first.after()
	}
	for s := byte(1); s < numStreams; s++ {
		if !r.pos.has[s] {
			continue
		}
		t := total.off[s]
		if last.kind == kindRecord && last.rec.Event == eventEnd {
			t = max(t, last.rec.Totals[api.StreamNames[s]])
		}
		h.Streams[api.StreamNames[s]] = api.HelloSpan{First: min(from.off[s], t), Total: t}
	}
	r.queueJSON(h)
}

// search finds where to start reading: the sequence of the first message
// of the subject that takes a stream past r.pos, or the end record,
// among first … last; past last if none. The subject's vectors only grow
// along it, so "reaches past" is false and then true along its
// sequences: a binary search, each probe the first message at or after a
// sequence (a direct get). A replica behind the leader answers "none" for
// what it lacks, which only makes the search start earlier; what is read
// twice is trimmed.
func (r *Reader) search(ctx context.Context, s jetstream.Stream, subject string, first, last *message) (uint64, error) {
	lo, hi := first.streamSeq, last.streamSeq+1
	if r.reaches(first) {
		return lo, nil
	}
	lo++
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, err := getMsg(ctx, s, subject, mid)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			hi = mid
		case err != nil:
			return 0, err
		case r.reaches(m):
			hi = mid
		default:
			lo = min(m.streamSeq+1, hi) // none between mid and m reaches further
		}
	}
	return lo, nil
}

// reaches reports whether m takes some stream past where the reader
// starts, or ends the subject.
func (r *Reader) reaches(m *message) bool {
	if m.kind == kindRecord && m.rec.Event == eventEnd {
		return true
	}
	after := m.after()
	for s := byte(1); s < numStreams; s++ {
		if after.has[s] && after.off[s] > r.pos.off[s] {
			return true
		}
	}
	return false
}

// Read returns the next kiln.v1 message; io.EOF after the exit, or, not
// following, once the subject's messages as they were at the start are
// read.
func (r *Reader) Read(ctx context.Context) (websocket.MessageType, []byte, error) {
	for len(r.queue) == 0 {
		if r.ended || !r.follow && r.readTo >= r.lastSeq {
			return 0, nil, io.EOF
		}
		msg, err := r.it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return 0, nil, ctx.Err()
			}
			return 0, nil, fmt.Errorf("%w: outexport: %w", errdefs.ErrUnavailable, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return 0, nil, fmt.Errorf("%w: outexport: %w", errdefs.ErrUnavailable, err)
		}
		m, err := decode(msg.Headers(), msg.Data(), meta.Sequence.Stream)
		if err != nil {
			return 0, nil, err
		}
		r.readTo = m.streamSeq
		n := len(r.queue)
		r.take(m)
		for i := n; i < len(r.queue); i++ {
			r.queue[i].stored = meta.Timestamp
		}
	}
	out := r.queue[0]
	r.queue[0] = outMsg{}
	r.queue = r.queue[1:]
	r.stored = out.stored
	return out.typ, out.data, nil
}

// Stored is when JetStream stored the message the last Read's message
// came of: the time a chunk reached the cluster, the nearest the copy
// has to when it was written. It is zero for the hello.
func (r *Reader) Stored() time.Time { return r.stored }

// Run is the export's run, a UUID, as the subject's first message names
// it, and whether that message is the begin record: false once
// JetStream discarded the export's start (its age limit).
func (r *Reader) Run() (id string, begun bool) { return r.run, r.begun }

// take queues what message m says beyond where the reader stands
// (vector.advance), and an end record's exit.
func (r *Reader) take(m *message) {
	r.pos.advance(m, int64(len(m.data)), readerWalk{r})
	if m.kind == kindRecord && m.rec.Event == eventEnd {
		if m.rec.Exit != nil {
			r.queueJSON(api.ExitMessage{Type: api.TypeExit, Exit: *m.rec.Exit})
		}
		r.ended = true
	}
}

// readerWalk queues, for its Reader, each gap as a gap message, bytes
// held as a binary frame, an end as an end message.
type readerWalk struct{ r *Reader }

func (w readerWalk) gap(s byte, from, to int64) {
	w.r.queueJSON(api.Gap{Type: api.TypeGap, Stream: api.StreamNames[s], From: from, To: to, LostBytes: to - from})
}

func (w readerWalk) held(m *message, s byte, start, from, to int64) {
	skip := from - start
	f := api.Frame{Stream: s, Offset: uint64(from), Seq: m.seq + uint64(skip), Data: m.data[skip : to-start]}
	w.r.queue = append(w.r.queue, outMsg{typ: websocket.MessageBinary, data: api.AppendFrame(make([]byte, 0, api.FrameHeader+len(f.Data)), f)})
}

func (w readerWalk) end(s byte, total int64) {
	w.r.queueJSON(api.End{Type: api.TypeEnd, Stream: api.StreamNames[s], TotalBytes: total})
}

func (r *Reader) queueJSON(v any) {
	b, _ := json.Marshal(v)
	r.queue = append(r.queue, outMsg{typ: websocket.MessageText, data: b})
}

// CloseNow stops the reader's consumer.
func (r *Reader) CloseNow() error {
	if r.it != nil {
		r.it.Stop()
	}
	return nil
}

// Offsets are where the reader stands in each stream, between Reads: the
// offsets a reader that comes back resumes from.
func (r *Reader) Offsets() Offsets { return r.pos.offsets() }
