package agent

import (
	"cmp"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/decode"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// exec runs a process to its end and answers with its exit and output, at
// most MaxOutputBytes of it kept (both streams together), the rest counted.
// A client that goes away kills the process: nobody is left to answer.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := decode.Body(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	id, a, err := s.startHeld(req)
	if err != nil {
		writeError(w, err)
		return
	}
	defer a.Close()

	var timedOut atomic.Bool
	if req.TimeoutMS > 0 {
		t := time.AfterFunc(time.Duration(req.TimeoutMS)*time.Millisecond, func() {
			timedOut.Store(true)
			s.cfg.Table.Terminate(id)
		})
		defer t.Stop()
	}
	out := execOutput{limit: cmp.Or(req.MaxOutputBytes, api.DefaultMaxOutput)}
	for {
		e, err := a.Next(r.Context())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// The client left: kill the process and let it be reaped,
			// its output held for nobody.
			a.Abandon()
			s.cfg.Table.Terminate(id)
			bg, cancel := background()
			s.cfg.Table.Wait(bg, id)
			cancel()
			return
		}
		out.add(e)
	}
	res := out.result()
	res.TimedOut = timedOut.Load()
	writeJSON(w, http.StatusOK, res)
}

// startHeld starts a finite exec's process and attaches to it as its one
// reader, which holds its output (Hold): the process's id, and the
// attachment, the caller's to close. A process it cannot attach to is
// ended.
func (s *Server) startHeld(req api.ExecRequest) (string, *process.Attachment, error) {
	spec, err := s.spec(req, true)
	if err != nil {
		return "", nil, err
	}
	// This handler is the process's one reader, and it keeps up: held, the
	// output is only ever cut by max_output_bytes, never lost.
	spec.Flow = process.FlowBlock
	id, err := s.cfg.Table.Start(spec)
	if err != nil {
		return "", nil, err
	}
	a, err := s.cfg.Table.Attach(id, ring.Offsets{}, process.AttachOptions{Hold: true})
	if err != nil {
		s.cfg.Table.Terminate(id)
		return "", nil, err
	}
	return id, a, nil
}

// execOutput is what exec keeps of a process's output as it reads it: at
// most limit bytes of both streams together, and what its result says of
// the rest (each stream's length, whether any was not kept) and of the
// exit.
type execOutput struct {
	limit, kept int64
	out         [2][]byte // stdout's, then stderr's
	res         api.ExecResult
}

// add takes in the next event of the process's output.
func (o *execOutput) add(e process.Event) {
	k := 0
	if e.Stream == ring.Stderr {
		k = 1
	}
	switch e.Kind {
	case ring.Data:
		n := min(int64(len(e.Data)), o.limit-o.kept)
		o.out[k] = append(o.out[k], e.Data[:n]...)
		o.kept += n
		if n < int64(len(e.Data)) {
			o.res.Truncated = true
		}
	case ring.Gap:
		o.res.Truncated = true
	case ring.End:
		if k == 0 {
			o.res.StdoutBytes += e.Offset
		} else {
			o.res.StderrBytes += e.Offset
		}
	case ring.Exit:
		o.res.Exit = toExit(&e.Exit)
	}
}

// result is the exec's result: what add gathered, the output kept as
// text (or base64, where it is not UTF-8).
func (o *execOutput) result() api.ExecResult {
	res := o.res
	res.Stdout, res.Stderr = encodeOutput(o.out[0], &res.StdoutBase64), encodeOutput(o.out[1], &res.StderrBase64)
	return res
}

// encodeOutput returns b as text, setting *b64 to its exact bytes when it
// is not valid UTF-8.
func encodeOutput(b []byte, b64 *string) string {
	t, ok := text(b)
	if !ok {
		*b64 = base64.StdEncoding.EncodeToString(b)
	}
	return t
}
