// The output of a snapshot's processes: a memory snapshot holds their
// captured runs at its offsets, which the sandbox taken goes on with and
// each sandbox made from it continues in runs of its own; a snapshot of
// files keeps what the rings of those not captured still hold, for the
// history of the sandboxes made from it.

package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/ring"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// runsRetry bounds how long kilnd tries to tell an agent whose memory was
// just saved to release its runs: the save closed its connections, which
// it makes again at once.
const runsRetry = 10 * time.Second

// holdRuns has the agent behind t hold its processes' captured runs where
// their output stands (see capture.Writer.Hold), before their memory is
// saved, and returns its processes, each captured one at where its run is
// held: the snapshot's offsets of it. held is false for an agent older
// than held runs, which is asked for its processes alone.
func holdRuns(ctx context.Context, t http.RoundTripper) (procs []api.Process, held bool, err error) {
	hctx, cancel := context.WithTimeout(ctx, agentListTimeout)
	defer cancel()
	err = agentJSON(hctx, t, "POST", "/capture/hold", &procs)
	if errors.Is(err, errdefs.ErrNotFound) {
		return procs, false, askAgent(ctx, t, "/exec-stream", &procs)
	}
	return procs, err == nil, err
}

// releaseRuns lets the runs holdRuns held go on in sandbox id, whose
// memory has been saved (or not: the snapshot failed), trying again while
// its agent makes its connections again after the save. A release that
// never gets through costs the runs their hold's time (capture's
// HoldTimeout), after which they continue in new runs, not their capture.
func (d *Daemon) releaseRuns(t http.RoundTripper, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), runsRetry)
	defer cancel()
	for {
		err := agentJSON(ctx, t, "POST", "/capture/release", nil)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			d.log.Warn("a memory snapshot's held capture runs were not released: they go on once their hold runs out", "sandbox", id, "err", err)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// continueRuns has the agent behind t, of a sandbox restored from a memory
// snapshot, continue each run its snapshot held in a new run whose begin
// names it, and returns once every begin is durable. An agent older than
// held runs held none.
func continueRuns(ctx context.Context, t http.RoundTripper) error {
	err := agentJSON(ctx, t, "POST", "/capture/continue", nil)
	if err == nil || errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	return fmt.Errorf("%w: its processes' captured runs could not be continued: %w", errdefs.ErrUnavailable, err)
}

// What a snapshot keeps of an uncaptured process's output: at most
// maxKept bytes (a process's ring holds no more, ring.DefaultCapacity),
// read within keepTimeout.
const (
	maxKept     = ring.DefaultCapacity
	keepTimeout = 5 * time.Second
)

// keepRings writes in to, the snapshot's logs directory, a log for each
// of procs that has none in from (the sandbox's: it was not captured),
// of what its ring still holds of its output up to its offsets in the
// snapshot, read through its agent (dial): a run of its own, whose drop
// records and end count exactly the bytes before, between and after what
// was kept that the ring no longer held (capture.Keep). A sandbox made
// from the snapshot reads it as its history's output, as a captured
// one's. A read that fails, or outgrows maxKept, keeps what it got, the
// rest counted lost; only a log that cannot be written fails it.
func keepRings(ctx context.Context, dial func(context.Context) (net.Conn, error), from, to string, procs []api.Process) error {
	logs, err := capture.OpenDir(to)
	if err != nil {
		return err
	}
	defer logs.Close()
	at := time.Now()
	for _, p := range procs {
		if u, err := uuid.Parse(p.ID); err != nil || u.String() != p.ID {
			continue // not a process id: the agent's word
		}
		if _, err := os.Lstat(filepath.Join(from, p.ID)); err == nil {
			continue // captured: its log is copied
		}
		pieces, end := readRing(ctx, dial, p)
		sub, err := logs.Sub(p.ID)
		if err != nil {
			return err
		}
		_, err = capture.Keep(sub, uuid.Must(uuid.NewV7()).String(), at, pieces, end)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// readRing reads, through the agent, what process p's ring holds of its
// output up to p's offsets (where each stream stood in the snapshot),
// and says where those are, per stream of the log (a terminal's is its
// stdout).
func readRing(ctx context.Context, dial func(context.Context) (net.Conn, error), p api.Process) ([]capture.Piece, capture.Positions) {
	logStream := func(name string) (capture.LogStream, bool) {
		switch name {
		case "stdout", "terminal":
			return capture.LogStdout, true
		case "stderr":
			return capture.LogStderr, true
		}
		return 0, false
	}
	target, pos := map[string]int64{}, map[string]int64{}
	var end capture.Positions
	for name, st := range p.Streams {
		if s, ok := logStream(name); ok && st.TotalBytes > 0 {
			target[name] = st.TotalBytes
			if s == capture.LogStdout {
				end.Stdout = st.TotalBytes
			} else {
				end.Stderr = st.TotalBytes
			}
		}
	}
	caught := func() bool {
		for s, t := range target {
			if pos[s] < t {
				return false
			}
		}
		return true
	}
	if caught() {
		return nil, end
	}
	ctx, cancel := context.WithTimeout(ctx, keepTimeout)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://agent/exec-stream/"+url.PathEscape(p.ID)+"/logs",
		&websocket.DialOptions{HTTPClient: &http.Client{Transport: sandbox.Transport(dial)}, Subprotocols: []string{api.ProtocolV1}})
	if err != nil {
		return nil, end
	}
	defer c.CloseNow()
	c.SetReadLimit(api.FrameHeader + 1<<20)
	var pieces []capture.Piece
	kept := 0
	for !caught() {
		typ, data, err := c.Read(ctx)
		if err != nil {
			break
		}
		if typ == websocket.MessageBinary {
			f, err := api.ParseFrame(data)
			if err != nil {
				break
			}
			name := api.StreamNames[f.Stream]
			s, ok := logStream(name)
			off := int64(f.Offset)
			if !ok || off+int64(len(f.Data)) <= pos[name] || off >= target[name] {
				continue
			}
			b := f.Data[max(pos[name]-off, 0):min(int64(len(f.Data)), target[name]-off)]
			off = max(off, pos[name])
			if kept+len(b) > maxKept {
				break // more than a ring holds: the agent's word, not a ring's
			}
			kept += len(b)
			pieces = append(pieces, capture.Piece{Stream: s, Offset: off, Data: b})
			pos[name] = off + int64(len(b))
			continue
		}
		var m struct {
			Type string `json:"type"`
			api.Gap
		}
		if json.Unmarshal(data, &m) != nil {
			break
		}
		switch m.Type {
		case api.TypeGap:
			if _, ok := target[m.Stream]; ok {
				pos[m.Stream] = max(pos[m.Stream], min(m.To, target[m.Stream]))
			}
		case api.TypeExit:
			return pieces, end
		}
	}
	return pieces, end
}
