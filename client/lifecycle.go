package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sandkiln/sandkiln/api"
)

// StopOptions say how a sandbox is stopped.
type StopOptions struct {
	// Timeout is how long its processes have from SIGTERM until what is
	// left is killed (docker stop -t), rounded up to whole seconds, at
	// most 10 minutes; nil is kilnd's default, 10 s, and zero kills at
	// once.
	Timeout *time.Duration
}

// maxStopTimeout is the longest timeout kilnd takes.
const maxStopTimeout = 10 * time.Minute

// query is o as a stop's parameters, and the longest the stop may take
// beyond an ordinary call.
func (o StopOptions) query() (url.Values, time.Duration, error) {
	if o.Timeout == nil {
		return nil, 10 * time.Second, nil
	}
	t := *o.Timeout
	if t < 0 || t > maxStopTimeout {
		return nil, 0, invalid("stop timeout %v: want 0 to %v", t, maxStopTimeout)
	}
	secs := (t + time.Second - 1) / time.Second
	return url.Values{"timeout": {strconv.FormatInt(int64(secs), 10)}}, secs * time.Second, nil
}

// Stop ends every process of the sandbox and keeps the rest, as docker
// stop does: each process's group gets SIGTERM, and what has not exited
// once o.Timeout has passed is killed. Its files, record and captured
// logs stay, and StartAgain runs it again. It returns the sandbox,
// stopped; one stopped already is left as it is (kilnd answers 304 Not
// Modified) and described as it is now.
func (s *Sandbox) Stop(ctx context.Context, o StopOptions) (api.Sandbox, error) {
	q, grace, err := o.query()
	if err != nil {
		return api.Sandbox{}, err
	}
	return s.change(ctx, "stop", q, grace, true)
}

// StartAgain starts a stopped sandbox, as docker start does (Start starts
// a process): a new instance of it runs its init command again on its
// files as they were, with its id, name, labels, limits and network
// policy. It returns the sandbox, running; one that runs already is left
// as it is (kilnd answers 304 Not Modified). A sandbox past its ttl, which
// counts from its creation, is an error IsFailedPrecondition reports.
func (s *Sandbox) StartAgain(ctx context.Context) (api.Sandbox, error) {
	return s.change(ctx, "start", nil, 0, true)
}

// Restart stops the sandbox if it runs (Stop) and starts it again
// (StartAgain), as docker restart does. It returns the sandbox, running.
// If the answer is lost, the error is ErrOutcomeUnknown: the sandbox may
// have been restarted.
func (s *Sandbox) Restart(ctx context.Context, o StopOptions) (api.Sandbox, error) {
	q, grace, err := o.query()
	if err != nil {
		return api.Sandbox{}, err
	}
	return s.change(ctx, "restart", q, grace, false)
}

// Pause pauses the sandbox, as docker pause does: its every process stops
// where it is, its memory kept, and uses no CPU until Resume. Meanwhile
// what needs it to run (Exec, Start, a process's stdin, its files and
// ports) is an error IsPaused reports; its processes' output stays
// readable and its watchers attached, and they read on at the same
// offsets after the resume. It returns the sandbox, paused (State
// api.SandboxPaused); one paused already is left as it is (kilnd answers
// 304 Not Modified).
func (s *Sandbox) Pause(ctx context.Context) (api.Sandbox, error) {
	return s.change(ctx, "pause", nil, 0, true)
}

// Resume resumes a paused sandbox, as docker unpause does: its processes
// run on from where they were. It returns the sandbox, running; one that
// is not paused is left as it is (kilnd answers 304 Not Modified).
func (s *Sandbox) Resume(ctx context.Context) (api.Sandbox, error) {
	return s.change(ctx, "resume", nil, 0, true)
}

// change POSTs a stop, start, restart, pause or resume (verb) of the sandbox, bounded by
// the client's timeout and grace more, and reads the sandbox it answers;
// after a 304 (nothing to change) it asks how the sandbox is.
func (s *Sandbox) change(ctx context.Context, verb string, q url.Values, grace time.Duration, idempotent bool) (api.Sandbox, error) {
	cctx, cancel := context.WithTimeout(ctx, s.c.timeout+grace)
	defer cancel()
	path := s.path("/" + verb)
	notModified := func(r *http.Response) bool { return r.StatusCode == http.StatusNotModified }
	resp, sent, err := s.c.requestAs(cctx, s.c.hc, "POST", path, q, nil, "", nil,
		func(r *http.Response) bool { return r.StatusCode >= 300 && !notModified(r) })
	if err != nil {
		return api.Sandbox{}, failed(cctx, "POST", path, sent, idempotent, err)
	}
	defer resp.Body.Close()
	if notModified(resp) {
		return s.Info(ctx)
	}
	var info api.Sandbox
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		if !idempotent {
			return api.Sandbox{}, fmt.Errorf("%w: POST %s: reading the answer: %w", ErrOutcomeUnknown, path, err)
		}
		return api.Sandbox{}, fmt.Errorf("client: POST %s: %w", path, err)
	}
	return info, nil
}
