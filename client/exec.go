package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"

	"github.com/sandkiln/sandkiln/api"
)

// ExecOptions describe a command to run to its end.
type ExecOptions struct {
	// Command and Args run a program directly; Shell runs a command line
	// with /bin/sh -c instead.
	Command string
	Args    []string
	Shell   string
	Env     map[string]string
	Cwd     string
	// User runs the command as a user of the sandbox's (see
	// api.ExecRequest.User).
	User string
	// MaxOutputBytes bounds the output kept, both streams together: 1 to
	// 1 MiB, default 1 MiB. Output beyond it is counted, not kept.
	MaxOutputBytes int64
	// TimeoutMS kills the command after that long (0: none).
	TimeoutMS int64
	// OnOutput, when set, is called for every chunk as it arrives (text).
	OnOutput func(Chunk) error
}

// ExecResult is a finished command: its exit and kept output.
type ExecResult struct {
	Exit           Exit
	Stdout, Stderr []byte
	// Truncated is set when output beyond MaxOutputBytes was not kept (or
	// was lost before it could be read).
	Truncated bool
	TimedOut  bool
}

// Exec runs a command to its end. Without OnOutput it is one request (a
// client that goes away kills the command); with it, the command runs as
// an exec-stream whose output is read as it comes, held for this reader,
// its connection resumed if it breaks (see Follow).
func (s *Sandbox) Exec(ctx context.Context, o ExecOptions) (ExecResult, error) {
	if o.Shell != "" {
		if o.Command != "" || len(o.Args) > 0 {
			return ExecResult{}, fmt.Errorf("client: ExecOptions: Shell or Command, not both")
		}
		o.Command, o.Args = "/bin/sh", []string{"-c", o.Shell}
	}
	if o.MaxOutputBytes < 0 || o.MaxOutputBytes > api.DefaultMaxOutput {
		return ExecResult{}, fmt.Errorf("client: MaxOutputBytes %d: want 1 to %d", o.MaxOutputBytes, api.DefaultMaxOutput)
	}
	if o.OnOutput == nil {
		var r api.ExecResult
		req := api.ExecRequest{Command: o.Command, Args: o.Args, Env: o.Env, Cwd: o.Cwd, User: o.User, MaxOutputBytes: o.MaxOutputBytes, TimeoutMS: o.TimeoutMS}
		resp, sent, err := s.c.request(ctx, s.c.stream, "POST", s.path("/exec"), nil, jsonBody(req), "application/json")
		if err != nil {
			if _, ok := err.(*Error); !ok && sent {
				return ExecResult{}, fmt.Errorf("%w: exec: %w", ErrOutcomeUnknown, err)
			}
			return ExecResult{}, err
		}
		defer resp.Body.Close()
		if err := decodeJSON(resp.Body, &r); err != nil {
			return ExecResult{}, fmt.Errorf("%w: exec: %w", ErrOutcomeUnknown, err)
		}
		res := ExecResult{Exit: ExitOf(r.Exit), Truncated: r.Truncated, TimedOut: r.TimedOut}
		res.Stdout, err = exact(r.Stdout, r.StdoutBase64)
		if err == nil {
			res.Stderr, err = exact(r.Stderr, r.StderrBase64)
		}
		return res, err
	}
	if o.TimeoutMS != 0 {
		return ExecResult{}, fmt.Errorf("client: TimeoutMS with OnOutput: cancel ctx and Terminate instead")
	}
	limit := o.MaxOutputBytes
	if limit == 0 {
		limit = api.DefaultMaxOutput
	}
	// This handle's Output is the command's one reader: held, nothing of
	// it is lost, only cut at MaxOutputBytes.
	p, err := s.Start(ctx, StartOptions{Command: o.Command, Args: o.Args, Env: o.Env, Cwd: o.Cwd, User: o.User, Format: Bytes, Flow: api.FlowBlock})
	if err != nil {
		return ExecResult{}, err
	}
	defer p.Detach()
	var res ExecResult
	var dec decoders
	kept := int64(0)
	for ch, err := range p.Follow(ctx, Resume{}) {
		if err != nil {
			return res, err
		}
		if ch.Lost > 0 {
			res.Truncated = true
			continue
		}
		n := min(int64(len(ch.Bytes)), limit-kept)
		if ch.Stream == "stderr" {
			res.Stderr = append(res.Stderr, ch.Bytes[:n]...)
		} else {
			res.Stdout = append(res.Stdout, ch.Bytes[:n]...)
		}
		kept += n
		if n < int64(len(ch.Bytes)) {
			res.Truncated = true
		}
		text := ch
		text.Text, text.Bytes = dec.decode(ch.Stream, ch.Bytes), nil
		if err := o.OnOutput(text); err != nil {
			return res, fmt.Errorf("client: OnOutput: %w", err)
		}
	}
	r, err := p.Wait(ctx)
	if err != nil {
		return res, err
	}
	res.Exit = r.Exit
	return res, nil
}

func exact(text, b64 string) ([]byte, error) {
	if b64 == "" {
		return []byte(text), nil
	}
	return base64.StdEncoding.DecodeString(b64)
}

func jsonBody(v any) io.Reader {
	b, _ := json.Marshal(v)
	return bytes.NewReader(b)
}

func decodeJSON(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }
