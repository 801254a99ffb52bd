package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"sync"

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
	// 1 MiB, default (0) 1 MiB. Output beyond it is counted, not kept.
	MaxOutputBytes int64
	// TimeoutMS kills the command after that long (0: none). Not with
	// OnOutput or Stdin: cancel ctx and Terminate instead.
	TimeoutMS int64
	// DrainMS bounds how long the output is read after the command exits
	// (see StartOptions.DrainMS).
	DrainMS int64
	// Stdin, when set, is the command's input: sent in writes of at most
	// 64 KiB, then end-of-input. The command then runs as with OnOutput.
	Stdin []byte
	// OnOutput, when set, is called for every chunk as it arrives (text,
	// decoded per stream), each call returning before the next.
	OnOutput func(Chunk) error
}

func (o *ExecOptions) check() error {
	if o.Shell != "" && (o.Command != "" || len(o.Args) > 0) {
		return invalid("ExecOptions: Shell or Command, not both")
	}
	if o.MaxOutputBytes < 0 || o.MaxOutputBytes > api.DefaultMaxOutput {
		return invalid("MaxOutputBytes %d: want 1 to %d (0: the most)", o.MaxOutputBytes, api.DefaultMaxOutput)
	}
	if o.TimeoutMS < 0 {
		return invalid("TimeoutMS %d: want 0 (none) or more", o.TimeoutMS)
	}
	if o.TimeoutMS != 0 && (o.OnOutput != nil || o.Stdin != nil) {
		return invalid("TimeoutMS with OnOutput or Stdin: cancel ctx and Terminate instead")
	}
	return checkDrain(o.DrainMS)
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

// Exec runs a command to its end. Without OnOutput or Stdin it is one
// request (a client that goes away kills the command); with them, the
// command runs as an exec-stream whose output is read as it comes, held
// for this reader, its connection resumed if it breaks (see Follow), and
// the exact bytes kept from the same run: it is never run again. Output
// lost on the way fails it with a *CapacityError. When it fails after the
// command started (OnOutput's error, which it wraps; ctx; lost output),
// the result holds what was kept and the exit if one was confirmed; the
// command is not terminated.
func (s *Sandbox) Exec(ctx context.Context, o ExecOptions) (ExecResult, error) {
	if err := o.check(); err != nil {
		return ExecResult{}, err
	}
	if o.Shell != "" {
		o.Command, o.Args = "/bin/sh", []string{"-c", o.Shell}
	}
	if o.OnOutput == nil && o.Stdin == nil {
		var r api.ExecResult
		req := api.ExecRequest{Command: o.Command, Args: o.Args, Env: o.Env, Cwd: o.Cwd, User: o.User, MaxOutputBytes: o.MaxOutputBytes,
			TimeoutMS: o.TimeoutMS, DrainMS: o.DrainMS}
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
	return s.execLive(ctx, o)
}

// execLive runs a command as an exec-stream read to its end.
func (s *Sandbox) execLive(ctx context.Context, o ExecOptions) (res ExecResult, err error) {
	limit := o.MaxOutputBytes
	if limit == 0 {
		limit = api.DefaultMaxOutput
	}
	// This handle's Output is the command's one reader: held, nothing of
	// it is lost, only cut at MaxOutputBytes.
	p, err := s.Start(ctx, StartOptions{Command: o.Command, Args: o.Args, Env: o.Env, Cwd: o.Cwd, User: o.User, Format: Bytes,
		Stdin: o.Stdin != nil, DrainMS: o.DrainMS})
	if err != nil {
		return ExecResult{}, err
	}
	var wg sync.WaitGroup
	// Let go (its writes in progress fail with it) before they are waited for.
	defer func() {
		p.Detach()
		wg.Wait()
	}()
	defer func() {
		if err != nil {
			// What is known of the exit goes with the error.
			if st, serr := p.Status(context.WithoutCancel(ctx)); serr == nil && st.Exit != nil {
				res.Exit = ExitOf(*st.Exit)
			}
		}
	}()
	var inputErr error
	if o.Stdin != nil {
		wg.Go(func() { inputErr = p.feed(ctx, o.Stdin) })
	}
	var dec decoders
	kept := int64(0)
	// onOutput gives ch to OnOutput as text.
	onOutput := func(ch Chunk, text string) error {
		if text == "" || o.OnOutput == nil {
			return nil
		}
		ch.Text, ch.Bytes = text, nil
		if err := o.OnOutput(ch); err != nil {
			return fmt.Errorf("client: OnOutput: %w", err)
		}
		return nil
	}
	for ch, err := range p.Follow(ctx, Resume{}) {
		if err != nil {
			return res, err
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
		if err := onOutput(ch, dec.decode(ch.Stream, ch.Bytes)); err != nil {
			return res, err
		}
	}
	// A character the output ended inside: one replacement.
	for _, st := range []string{"stdout", "stderr"} {
		if err := onOutput(Chunk{Stream: st}, dec.flush(st)); err != nil {
			return res, err
		}
	}
	wg.Wait()
	if inputErr != nil {
		return res, inputErr
	}
	r, err := p.Wait(ctx)
	if err != nil {
		return res, err
	}
	res.Exit = r.Exit
	return res, nil
}

// feed writes in as the process's input, in writes of at most
// api.MaxStdin, then closes it.
func (p *Process) feed(ctx context.Context, in []byte) error {
	for len(in) > 0 {
		n := min(len(in), api.MaxStdin)
		if err := p.Write(ctx, in[:n]); err != nil {
			return err
		}
		in = in[n:]
	}
	return p.CloseStdin(ctx)
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
