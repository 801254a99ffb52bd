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
	"github.com/sandkiln/sandkiln/internal/seqlog"
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
	log *seqlog.Log[api.Event]
	// sent is the last event a reader was sent; sentWake is closed and
	// replaced when it grows.
	mu       sync.Mutex
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
		last := f.log.Last()
		f.mu.Lock()
		done, wake := f.sent >= last, f.sentWake
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

// end says no event comes after those held: readers end once they have
// them.
func (f *feed) end() { f.log.End() }

func newFeed() *feed {
	return &feed{log: seqlog.New[api.Event](feedKept), sentWake: make(chan struct{})}
}

// observe records a process's start, or its end once it has drained.
func (f *feed) observe(st process.Status) {
	typ := api.EventProcessStarted
	if st.State == process.Exited {
		typ = api.EventProcessExited
	}
	p := toAPI(st)
	p.Args = clipArgs(p.Args)
	p.Stdin = nil // where stdin stands is not news
	f.log.Append(func(seq int64) api.Event {
		return api.Event{Seq: seq, Time: time.Now().UTC(), Type: typ, Process: &p}
	})
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
	evs, lost, last, wake := f.log.After(seq)
	if lost > 0 {
		evs = append([]api.Event{{Type: api.EventGap, Seq: seq + lost, Lost: lost, Time: time.Now().UTC()}}, evs...)
	}
	return evs, last, wake
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
