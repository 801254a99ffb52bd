// What the cluster's copy of a sandbox's output says of each process's
// completeness, as a node's captured logs say it of theirs.

package outexport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// msgSizeHeader is the payload's size, on a message a headers-only
// consumer delivers without it (the server's header).
const msgSizeHeader = "Nats-Msg-Size"

// Logs describes what JetStream holds of each process of sandbox on node,
// as GET /sandboxes/{id}/logs describes a node's captured logs: one run
// each, the export's, lossless when the copy holds the process from its
// begin record to its end record with nothing lost, lossy when it holds
// both and lost bytes (Dropped, per stream: what a reader of the copy is
// told is a gap), interrupted when the end never came (its node went
// before it), retention-loss when JetStream has discarded its start. The
// stats are the bytes of output held (Bytes) and those before the oldest
// message kept (Before). The processes are those Processes describes; one
// whose subject holds a message no exporter wrote is corrupted.
//
// It reads every message's headers, not their payloads, and the payloads
// of the records. An error wrapping errdefs.ErrUnavailable says JetStream
// could not be asked.
func Logs(ctx context.Context, js jetstream.JetStream, node, sandbox string) ([]api.CapturedLog, error) {
	if !validName(node) || !validToken(sandbox) {
		return nil, fmt.Errorf("%w: outexport: node %q, sandbox %q", errdefs.ErrInvalidArgument, api.Clip(node), api.Clip(sandbox))
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	s, prefix, subjects, err := processSubjects(ctx, js, node, sandbox)
	if s == nil {
		return []api.CapturedLog{}, err
	}
	out := []api.CapturedLog{}
	for _, subj := range subjects {
		l, err := summarize(ctx, js, s, node, subj)
		switch {
		case errors.Is(err, errNoMessage), errors.Is(err, jetstream.ErrMsgNotFound):
			continue // purged meanwhile
		case errors.Is(err, errForeign):
			// Something other than an exporter published there: nothing
			// it says of the process can be trusted.
			l = api.CapturedLog{Runs: []api.Run{{State: capture.Corrupted.String(), Problems: []string{err.Error()}}}}
		case err != nil:
			return nil, unavailableErr(sandbox, err)
		}
		l.Process = strings.TrimPrefix(subj, prefix)
		out = append(out, l)
	}
	return out, nil
}

// summarize reads subject's messages in s, from its first to the last it
// held when asked, and tells what they hold.
func summarize(ctx context.Context, js jetstream.JetStream, s jetstream.Stream, node, subject string) (api.CapturedLog, error) {
	first, err := getMsg(ctx, s, subject, 1)
	if err != nil {
		return api.CapturedLog{}, err
	}
	lctx, cancel := context.WithTimeout(ctx, requestTimeout)
	last, err := lastOnSubject(lctx, js, StreamName(node), subject)
	cancel()
	if err != nil {
		return api.CapturedLog{}, err
	}
	// From the first message kept, with the streams the process has.
	t := tally{pos: vector{has: last.after().has, off: first.at.off}, begun: first.kind == kindRecord && first.rec.Event == eventBegin}
	for st := byte(1); st < numStreams; st++ {
		t.before += first.at.off[st]
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    first.streamSeq,
		HeadersOnly:    true,
	})
	if err != nil {
		return api.CapturedLog{}, err
	}
	it, err := cons.Messages()
	if err != nil {
		return api.CapturedLog{}, err
	}
	defer it.Stop()
	for seq := uint64(0); seq < last.streamSeq; {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return api.CapturedLog{}, err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return api.CapturedLog{}, err
		}
		seq = meta.Sequence.Stream
		h := msg.Headers()
		var m *message
		switch kind := h.Get(hKind); kind {
		case kindRecord:
			// A record's payload says what it is: the first and last are
			// at hand, another (a gap) is asked for.
			switch seq {
			case first.streamSeq:
				m = first
			case last.streamSeq:
				m = last
			default:
				if m, err = getMsg(ctx, s, subject, seq); err != nil {
					return api.CapturedLog{}, err
				}
			}
			t.take(m, 0)
		default:
			m = &message{kind: kind}
			code := m.stream()
			if code == 0 {
				return api.CapturedLog{}, fmt.Errorf("outexport: %w: message %d: kind %q", errForeign, seq, api.Clip(kind))
			}
			if m.at, err = decodeVector(h, code, seq); err != nil {
				return api.CapturedLog{}, err
			}
			size, err := strconv.ParseInt(h.Get(msgSizeHeader), 10, 64)
			if err != nil || size < 0 {
				return api.CapturedLog{}, fmt.Errorf("outexport: %w: message %d: its size %q", errForeign, seq, api.Clip(h.Get(msgSizeHeader)))
			}
			t.take(m, size)
		}
	}
	return t.log(first.run), nil
}

// tally counts, message by message in a subject's order, what a reader
// of the subject from its start would be given and told lost: a Reader's
// walk (vector.advance) without the bytes.
type tally struct {
	pos    vector // where the reader stands
	lost   [numStreams]int64
	stored int64 // output bytes held
	before int64 // bytes before the first message kept
	begun  bool
	ended  bool
}

// take counts message m, a chunk of size bytes or a record.
func (t *tally) take(m *message, size int64) {
	t.pos.advance(m, size, t)
	if m.kind == kindRecord && m.rec.Event == eventEnd {
		t.ended = true
	}
}

func (t *tally) gap(s byte, from, to int64)                     { t.lost[s] += to - from }
func (t *tally) held(m *message, s byte, start, from, to int64) { t.stored += to - from }
func (t *tally) end(s byte, total int64)                        {}

// log is what the tally says, as a captured log's description of its
// one run, run.
func (t *tally) log(run string) api.CapturedLog {
	r := api.Run{ID: run}
	// A log's streams are stdout and stderr; a terminal's output is its
	// stdout.
	if out, errs := t.lost[api.StreamStdout]+t.lost[api.StreamTerminal], t.lost[api.StreamStderr]; out+errs > 0 {
		r.Dropped = map[string]int64{"stdout": out, "stderr": errs}
	}
	state := capture.Unknown
	switch {
	case t.begun && t.ended && r.Dropped == nil:
		state = capture.Lossless
	case t.begun && t.ended:
		state = capture.Lossy
	case t.begun:
		state = capture.Interrupted
	case t.ended:
		state = capture.RetentionLoss
	}
	r.State = state.String()
	return api.CapturedLog{Runs: []api.Run{r}, Complete: state.Complete(),
		Stats: api.LogStats{Before: t.before, Bytes: t.stored}}
}
