package outexport

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// MaxProcesses bounds the processes Processes describes: a sandbox's
// first ones, by id.
const MaxProcesses = 4096

// Processes describes the processes of sandbox on node whose output
// JetStream holds, as their export last told: the command of its begin
// record, how far each stream came, and the exit where its end record is
// there. A process whose end is not there is in state unended (its node
// is gone: nobody knows that it exited). An error wrapping
// errdefs.ErrUnavailable says JetStream could not be asked.
func Processes(ctx context.Context, js jetstream.JetStream, node, sandbox, unended string) ([]api.Process, error) {
	if !validName(node) || !validToken(sandbox) {
		return nil, fmt.Errorf("%w: outexport: node %q, sandbox %q", errdefs.ErrInvalidArgument, api.Clip(node), api.Clip(sandbox))
	}
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	unavailable := func(err error) error { return unavailableErr(sandbox, err) }
	s, prefix, subjects, err := processSubjects(ctx, js, node, sandbox)
	if s == nil {
		return nil, err
	}
	out := []api.Process{}
	for _, subj := range subjects {
		p := api.Process{ID: strings.TrimPrefix(subj, prefix), State: unended, Flow: api.FlowDrop, Streams: map[string]api.StreamStatus{}}
		if first, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj)); err == nil {
			if m, err := decode(first.Header, first.Data, first.Sequence); err == nil && m.kind == kindRecord && m.rec.Event == eventBegin {
				if len(m.rec.Argv) > 0 {
					p.Command, p.Args = m.rec.Argv[0], m.rec.Argv[1:]
				}
				if m.rec.Start != nil {
					p.StartedAt = *m.rec.Start
				}
				p.Terminal = m.rec.Terminal
				for _, st := range m.rec.Streams {
					p.Streams[st] = api.StreamStatus{}
				}
			}
		} else {
			return nil, unavailable(err)
		}
		last, err := lastOnSubject(ctx, js, StreamName(node), subj)
		if err != nil && !errors.Is(err, errNoMessage) {
			return nil, unavailable(err)
		}
		if last != nil {
			for st, n := range last.after().offsets() {
				p.Streams[st] = api.StreamStatus{TotalBytes: n}
			}
			if last.kind == kindRecord && last.rec.Event == eventEnd {
				p.State = api.StateExited
				if last.rec.Exit != nil {
					p.Exit = *last.rec.Exit
				}
				for st, n := range last.rec.Totals {
					p.Streams[st] = api.StreamStatus{TotalBytes: n, Ended: true}
				}
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// listTimeout bounds a description of a sandbox's processes (Processes,
// Logs) as a whole.
const listTimeout = 30 * time.Second

// unavailableErr is err, met asking JetStream about sandbox's output, as
// the caller's: nil for a node's stream that is not there (none of its
// output was exported), errdefs.ErrUnavailable otherwise.
func unavailableErr(sandbox string, err error) error {
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	return fmt.Errorf("%w: the cluster's copy of sandbox %s's output: %v", errdefs.ErrUnavailable, api.ShortID(sandbox), err)
}

// processSubjects is node's stream and the subjects in it of sandbox's
// processes, sorted, the first MaxProcesses, each the subject prefix and
// a process's id. With no stream (an error, or none: err nil, from
// unavailableErr) it is nil.
func processSubjects(ctx context.Context, js jetstream.JetStream, node, sandbox string) (jetstream.Stream, string, []string, error) {
	s, err := js.Stream(ctx, StreamName(node))
	if err != nil {
		return nil, "", nil, unavailableErr(sandbox, err)
	}
	prefix := Subject(node, sandbox, "")
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(prefix+"*"))
	if err != nil {
		return nil, "", nil, unavailableErr(sandbox, err)
	}
	subjects := slices.Sorted(maps.Keys(info.State.Subjects))
	if len(subjects) > MaxProcesses {
		subjects = subjects[:MaxProcesses]
	}
	return s, prefix, subjects, nil
}
