package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/process"
)

// feedKept is how many process events the agent holds for kilnd, which
// reads them as they come and, after a reconnection, from the last it
// read: further behind, it is told how many it lost.
const feedKept = 4096

// maxEventArgs bounds the arguments an event repeats (a command may have
// tens of thousands): those past it are left out, Args ending in "…".
const maxEventArgs = 4096

// feed is the sandbox's process events, numbered from 1: each process as
// it starts and once it has finished (process.Table.Observe).
type feed struct {
	mu   sync.Mutex
	held []api.Event // the last feedKept, oldest first
	next int64
	wake chan struct{}
	// ended is set once the table has shut down: no event comes after
	// those held, and readers end once they have them.
	ended bool
	// sent is the last event a reader was sent; sentWake is closed and
	// replaced when it grows.
	sent     int64
	sentWake chan struct{}
}

// delivered notes that a reader has been sent the events up to seq.
func (f *feed) delivered(seq int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if seq > f.sent {
		f.sent = seq
		close(f.sentWake)
		f.sentWake = make(chan struct{})
	}
}

// awaitSent waits until a reader has been sent every event, or ctx ends.
func (f *feed) awaitSent(ctx context.Context) {
	for {
		f.mu.Lock()
		done, wake := f.sent >= f.next-1, f.sentWake
		f.mu.Unlock()
		if done {
			return
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return
		}
	}
}

// end says no event comes after those held.
func (f *feed) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ended {
		f.ended = true
		close(f.wake)
		f.wake = make(chan struct{})
	}
}

func newFeed() *feed { return &feed{next: 1, wake: make(chan struct{}), sentWake: make(chan struct{})} }

// observe records a process's start, or its end once it has drained.
func (f *feed) observe(st process.Status) {
	typ := api.EventProcessStarted
	if st.State == process.Exited {
		typ = api.EventProcessExited
	}
	p := toAPI(st)
	p.Args = clipArgs(p.Args)
	p.Stdin = nil // where stdin stands is not news
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.held) == feedKept {
		copy(f.held, f.held[1:])
		f.held = f.held[:feedKept-1]
	}
	f.held = append(f.held, api.Event{Seq: f.next, Time: time.Now().UTC(), Type: typ, Process: &p})
	f.next++
	close(f.wake)
	f.wake = make(chan struct{})
}

// clipArgs keeps the first arguments, maxEventArgs bytes of them.
func clipArgs(args []string) []string {
	n := 0
	for i, a := range args {
		if n += len(a); n > maxEventArgs {
			return append(args[:i:i], "…")
		}
	}
	return args
}

// after returns the events after seq, a gap first for those no longer
// held, the number of the last, and a channel closed at the next event
// (nil once the feed has ended).
func (f *feed) after(seq int64) ([]api.Event, int64, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Event
	first := f.next - int64(len(f.held))
	if seq+1 < first {
		out = append(out, api.Event{Type: api.EventGap, Seq: first - 1, Lost: first - 1 - seq, Time: time.Now().UTC()})
		seq = first - 1
	}
	if i := seq + 1 - first; i < int64(len(f.held)) {
		out = append(out, f.held[max(i, 0):]...)
	}
	if f.ended {
		return out, f.next - 1, nil
	}
	return out, f.next - 1, f.wake
}

// serveFeed answers GET /process-events: NDJSON, the events after
// ?after=SEQ (default 0: all held), or with ?after=now those from now on,
// then each as it comes until the reader goes or the agent ends
// (EndEvents), its last events sent.
func (s *Server) serveFeed(w http.ResponseWriter, r *http.Request) {
	var seq int64
	switch v := r.URL.Query().Get("after"); v {
	case "", "now":
	default:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, fmt.Errorf("%w: after %q: want a sequence number or now", errdefs.ErrInvalidArgument, api.Clip(v)))
			return
		}
		seq = n
	}
	evs, last, wake := s.feed.after(seq)
	if r.URL.Query().Get("after") == "now" {
		evs, seq = nil, last
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	for {
		for _, e := range evs {
			if err := enc.Encode(e); err != nil {
				return
			}
			seq = e.Seq
		}
		if rc.Flush() != nil {
			return
		}
		s.feed.delivered(seq)
		if wake == nil {
			return
		}
		select {
		case <-wake:
		case <-r.Context().Done():
			return
		}
		evs, _, wake = s.feed.after(seq)
	}
}

// EndEvents ends the process events' readers once they have every event:
// called when the process table has shut down, its processes' ends told.
// It waits, until ctx ends, for a reader (kilnd) to have been sent them:
// a sandbox whose init ended at once ends before kilnd has asked.
func (s *Server) EndEvents(ctx context.Context) {
	s.feed.end()
	s.feed.awaitSent(ctx)
}
