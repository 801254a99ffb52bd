// Process events: each running sandbox's agent tells of its processes'
// starts and ends, which kilnd numbers among its own events.

package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// A sandbox's process events are its agent's word, and the events ring is
// every sandbox's: one sandbox starting processes without pause must not
// push the others' events out of it. Past processEventRate a second (and
// a burst of processEventBurst), its events are counted, not kept, and a
// gap says how many.
const (
	processEventRate  = 500
	processEventBurst = 2000
	// maxProcessEvent bounds one event's line from the agent.
	maxProcessEvent = 256 << 10
	// relayRetry is how long the relay waits before it asks the agent
	// again after their connection ended with the agent still running.
	relayRetry = 250 * time.Millisecond
	// relayEnd bounds how long a sandbox's stop waits for the relay to
	// read the agent's last events.
	relayEnd = 2 * time.Second
)

// followProcesses relays e's agent's process events into kilnd's events,
// in a goroutine, for as long as its agent runs: from the agent's first
// (replay) for a sandbox this kilnd made, else from now, not to tell
// again what a kilnd before told.
// The channel it returns is closed once the relay has ended: the
// agent's last events, of the processes its end ended, are then told.
func (d *Daemon) followProcesses(e *entry, replay bool) <-chan struct{} {
	sb, id, name := e.sb, e.rec.ID, e.rec.Name
	done := make(chan struct{})
	d.wg.Go(func() {
		defer close(done)
		ctx, cancel := d.untilClosing()
		defer cancel()
		r := processRelay{d: d, t: sandbox.Transport(sb.Dial), sandbox: id, name: name,
			tokens: processEventBurst, filled: time.Now()}
		after := "now"
		if replay {
			after = "0"
		}
		for ctx.Err() == nil {
			last, again := r.relay(ctx, after)
			if last > 0 {
				after = strconv.FormatInt(last, 10)
			}
			if !again || !sb.Alive() {
				break
			}
			select {
			case <-time.After(relayRetry):
			case <-ctx.Done():
			}
		}
		r.tellDropped()
	})
	return done
}

// processRelay is one sandbox's relay of its process events.
type processRelay struct {
	d             *Daemon
	t             http.RoundTripper
	sandbox, name string
	// The token bucket of processEventRate: tokens left, when last
	// filled, and the events dropped since the last gap told of them.
	tokens  float64
	filled  time.Time
	dropped int64
}

// relay reads the agent's events after after until their connection ends,
// and returns the sequence number of the last it read (0: none), and
// whether to ask again: not of an agent that refuses (one from before
// process events, adopted, answers 404).
func (r *processRelay) relay(ctx context.Context, after string) (last int64, again bool) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://agent/process-events?after="+after, nil)
	if err != nil {
		return 0, false
	}
	resp, err := r.t.RoundTrip(req)
	if err != nil {
		return 0, true
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxProcessEvent)
	for sc.Scan() {
		var e api.Event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Seq <= last {
			continue // nothing but numbered events counts
		}
		last = e.Seq
		switch {
		case e.Type == api.EventGap:
			r.dropped += e.Lost
		case (e.Type == api.EventProcessStarted || e.Type == api.EventProcessExited) && e.Process != nil:
			if !r.take() {
				r.dropped++
				continue
			}
			r.tellDropped()
			r.d.events.emit(api.Event{Type: e.Type, Sandbox: r.sandbox, Name: r.name, Process: e.Process})
		}
	}
	return last, true
}

// take takes a token, if one is left.
func (r *processRelay) take() bool {
	now := time.Now()
	r.tokens = min(processEventBurst, r.tokens+now.Sub(r.filled).Seconds()*processEventRate)
	r.filled = now
	if r.tokens < 1 {
		return false
	}
	r.tokens--
	return true
}

// tellDropped emits a gap for the events dropped since the last one.
func (r *processRelay) tellDropped() {
	if r.dropped == 0 {
		return
	}
	r.d.events.emit(api.Event{Type: api.EventGap, Sandbox: r.sandbox, Name: r.name, Lost: r.dropped,
		Reason: fmt.Sprintf("the sandbox's process events came faster than %d a second, or its agent held no more", processEventRate)})
	r.dropped = 0
}
