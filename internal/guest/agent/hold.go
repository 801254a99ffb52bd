// A memory snapshot's captured runs: kilnd holds every captured
// process's log writer where its output stands as the sandbox's memory is
// saved, then releases them in the sandbox that goes on, and has them
// continue in new runs in each sandbox restored from the snapshot (see
// capture.Writer.Hold). Only kilnd calls these routes: none of kilnd's
// own leads to them.

package agent

import (
	"errors"
	"net/http"
	"sync"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// runs are the captured processes' writers, by process id, from their
// start until their run ends.
type runs struct {
	// mu guards byID and held; it is held across a hold, so that a
	// release or a continue finds every writer it held.
	mu   sync.Mutex
	byID map[string]*capture.Writer
	// held are the processes whose writers the last hold held, until
	// their release or continuation.
	held map[string]bool
}

func (r *runs) add(id string, w *capture.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID == nil {
		r.byID, r.held = map[string]*capture.Writer{}, map[string]bool{}
	}
	r.byID[id] = w
}

func (r *runs) remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byID, id)
	delete(r.held, id)
}

// takeHeld returns the writers held, and forgets that they are.
func (r *runs) takeHeld() map[string]*capture.Writer {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]*capture.Writer{}
	for id := range r.held {
		if w := r.byID[id]; w != nil {
			out[id] = w
		}
	}
	clear(r.held)
	return out
}

// holdRuns answers POST /capture/hold: every captured process's writer
// is held, and the processes are listed as GET /exec-stream lists them,
// but that a held process's streams' totals are where its writer was held
// (what its pumps had handed over then): the snapshot's offsets of it.
func (s *Server) holdRuns(w http.ResponseWriter, r *http.Request) {
	at, err := s.runs.hold()
	if err != nil {
		writeError(w, err)
		return
	}
	sts := s.cfg.Table.List()
	out := make([]api.Process, len(sts))
	for i, st := range sts {
		if cut, ok := at[st.ID]; ok {
			for _, str := range st.Streams {
				st.Totals[str] = cut[str]
			}
		}
		out[i] = toAPI(st)
	}
	writeJSON(w, http.StatusOK, out)
}

// hold holds every writer and says where each was held. A writer whose
// run is ending is not held; one held already (a hold not yet ended) fails
// the whole hold, releasing the others.
func (r *runs) hold() (map[string]ring.Offsets, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := map[string]ring.Offsets{}
	for id, w := range r.byID {
		cut, held, err := w.Hold()
		if err != nil {
			for id := range at {
				r.byID[id].Release()
				delete(r.held, id)
			}
			return nil, err
		}
		if held {
			at[id] = cut
			r.held[id] = true
		}
	}
	return at, nil
}

// releaseRuns answers POST /capture/release: the writers held go on in
// their runs.
func (s *Server) releaseRuns(w http.ResponseWriter, r *http.Request) {
	for _, wr := range s.runs.takeHeld() {
		wr.Release()
	}
	w.WriteHeader(http.StatusNoContent)
}

// continueRuns answers POST /capture/continue, in a sandbox restored from
// a memory snapshot: each writer held goes on in a new run that continues
// its old one, and the answer comes once every new run's begin is
// durable, or says why one is not. A writer whose hold ran out has
// continued by itself (restored long after the snapshot was taken).
func (s *Server) continueRuns(w http.ResponseWriter, r *http.Request) {
	var errs []error
	for _, wr := range s.runs.takeHeld() {
		if err := wr.Continue(r.Context(), uuid.Must(uuid.NewV7()).String()); !errors.Is(err, capture.ErrNotHeld) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
