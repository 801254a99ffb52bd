package agent

import (
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
	spec, err := s.spec(req, true)
	if err != nil {
		writeError(w, err)
		return
	}
	// This handler is the process's one reader, and it keeps up: held, the
	// output is only ever cut by max_output_bytes, never lost.
	spec.Flow = process.FlowBlock
	limit := req.MaxOutputBytes
	if limit == 0 {
		limit = api.DefaultMaxOutput
	}
	id, err := s.cfg.Table.Start(spec)
	if err != nil {
		writeError(w, err)
		return
	}
	a, err := s.cfg.Table.Attach(id, ring.Offsets{}, process.AttachOptions{Hold: true})
	if err != nil {
		s.cfg.Table.Terminate(id)
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
	res := api.ExecResult{}
	var out [2][]byte
	kept := int64(0)
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
		k := 0
		if e.Stream == ring.Stderr {
			k = 1
		}
		switch e.Kind {
		case ring.Data:
			n := min(int64(len(e.Data)), limit-kept)
			out[k] = append(out[k], e.Data[:n]...)
			kept += n
			if n < int64(len(e.Data)) {
				res.Truncated = true
			}
		case ring.Gap:
			res.Truncated = true
		case ring.End:
			if k == 0 {
				res.StdoutBytes += e.Offset
			} else {
				res.StderrBytes += e.Offset
			}
		case ring.Exit:
			res.Exit = toExit(&e.Exit)
		}
	}
	res.TimedOut = timedOut.Load()
	res.Stdout, res.Stderr = encodeOutput(out[0], &res.StdoutBase64), encodeOutput(out[1], &res.StderrBase64)
	writeJSON(w, http.StatusOK, res)
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
