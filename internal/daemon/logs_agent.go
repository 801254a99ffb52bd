// A captured process's output read through its running sandbox's agent:
// the ring, then live, and the log for what the ring no longer held.

package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/coder/websocket"
	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// processLive reports whether process pid of sandbox id may still write
// output: its sandbox runs and its agent has it running, or cannot say.
func (d *Daemon) processLive(ctx context.Context, id, pid string) bool {
	e, err := d.get(id)
	if err != nil {
		return false
	}
	d.mu.Lock()
	p, agentPaused := e.proxy, e.agentPaused()
	d.mu.Unlock()
	if p == nil {
		return false
	}
	if agentPaused {
		return true // it cannot say until the resume
	}
	var st api.Process
	switch err := askAgent(ctx, p.Transport, "/exec-stream/"+url.PathEscape(pid), &st); {
	case errors.Is(err, errdefs.ErrNotFound):
		return false
	case err != nil:
		return true // cannot say
	}
	return st.State != api.StateExited
}

// readFromAgent serves the output of process pid as its sandbox's agent
// has it: the captured log where the ring lost bytes, the ring, then live.
// It reports false, having written nothing, when the agent cannot serve
// it (the sandbox does not run, or no longer knows the process): the
// caller reads the log then. The runs of the log come as trailers, with
// Kiln-Lost: per stream, the bytes of the output neither held.
func (d *Daemon) readFromAgent(w http.ResponseWriter, r *http.Request, id, pid string, logs *capture.Dir, lq logQuery) bool {
	e, err := d.get(id)
	if err != nil {
		return false
	}
	d.mu.Lock()
	// A paused agent would answer after the resume: its captured log is
	// read meanwhile.
	running, sb := e.proxy != nil && !e.agentPaused(), e.sb
	if running {
		e.inflight++ // a reader, as a watcher is, for the idle timeout
	}
	d.mu.Unlock()
	if !running {
		return false
	}
	defer func() {
		d.mu.Lock()
		e.inflight--
		e.lastUsed = time.Now()
		d.mu.Unlock()
	}()
	ctx := r.Context()
	c, _, err := websocket.Dial(ctx, "ws://agent/exec-stream/"+url.PathEscape(pid)+"/logs",
		&websocket.DialOptions{HTTPClient: &http.Client{Transport: sandbox.Transport(sb.Dial)}, Subprotocols: []string{api.ProtocolV1}})
	if err != nil {
		return false
	}
	defer c.CloseNow()
	c.SetReadLimit(api.FrameHeader + 1<<20)
	w.Header().Set("Trailer", "Kiln-Runs, Kiln-Complete, Kiln-Lost")
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	selects := lq.selects
	st := &agentRead{pos: map[string]int64{}, lost: map[string]int64{}, target: map[string]int64{}}
	if !st.relay(ctx, c, w, lq, selects) {
		return true // the client went
	}
	if !st.complete && (lq.follow || !st.caughtUp()) {
		// The agent's stream broke off (the sandbox stopped, or the agent
		// died): the rest is what the log holds; without the trailers if
		// the client went, as when the log's read does not finish.
		_, terminal := st.target["terminal"]
		if ctx.Err() != nil || !restFromLog(ctx, w, logs, terminal, st.pos, st.lost, selects) {
			return true
		}
	}
	if cruns, _, err := capture.Summarize(ctx, logs); err == nil {
		runs, ok := runInfos(cruns)
		rj, _ := json.Marshal(runs)
		w.Header().Set("Kiln-Runs", string(rj))
		w.Header().Set("Kiln-Complete", strconv.FormatBool(ok))
	}
	lj, _ := json.Marshal(st.lost)
	w.Header().Set("Kiln-Lost", string(lj))
	return true
}

// selects reports whether the query's output takes stream.
func (lq logQuery) selects(stream string) bool {
	switch stream {
	case "stderr":
		return lq.filter.Stderr || !lq.filter.Stdout
	}
	return lq.filter.Stdout || !lq.filter.Stderr
}

// agentRead is where readFromAgent's relay of the agent's stream got:
// each stream's next offset (pos), the bytes the agent said were lost,
// each stream's total when it began (target), and whether the exit came.
type agentRead struct {
	pos, lost, target map[string]int64
	complete          bool
}

// caughtUp reports whether every stream got to its total at the start.
func (st *agentRead) caughtUp() bool {
	for s, t := range st.target {
		if st.pos[s] < t {
			return false
		}
	}
	return true
}

// relay writes the output of the agent's kiln.v1 stream c to w until its
// exit, the stream's break, or, without follow, once it has caught up;
// false if the client went.
func (st *agentRead) relay(ctx context.Context, c *websocket.Conn, w http.ResponseWriter, lq logQuery, selects func(string) bool) bool {
	rc := http.NewResponseController(w)
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			return true // the exit's normal close, the client gone, or the agent
		}
		if typ == websocket.MessageBinary {
			f, err := api.ParseFrame(data)
			if err != nil {
				return true
			}
			stream := api.StreamNames[f.Stream]
			st.pos[stream] = int64(f.Offset) + int64(len(f.Data))
			if selects(stream) {
				rc.SetWriteDeadline(time.Now().Add(relayWriteTimeout))
				if _, err := w.Write(f.Data); err != nil {
					return false
				}
				rc.Flush()
			}
		} else {
			var m struct {
				Type    string                   `json:"type"`
				Streams map[string]api.HelloSpan `json:"streams"`
				api.Gap
			}
			if json.Unmarshal(data, &m) != nil {
				return true
			}
			switch m.Type {
			case api.TypeHello:
				for s, span := range m.Streams {
					if known(s) {
						st.target[s] = span.Total
					}
				}
			case api.TypeGap:
				if known(m.Stream) && m.LostBytes >= 0 {
					st.pos[m.Stream], st.lost[m.Stream] = m.To, st.lost[m.Stream]+m.LostBytes
				}
			case api.TypeExit:
				st.complete = true
			}
		}
		if st.complete || !lq.follow && st.caughtUp() {
			return true
		}
	}
}

// known says stream names a stream of the kiln.v1 protocol: the agent's
// messages, which the sandbox may have forged, add no others.
func known(stream string) bool {
	for _, name := range api.StreamNames {
		if stream == name {
			return true
		}
	}
	return false
}

// restFromLog writes, after the bytes the agent gave up to pos, the
// selected streams' bytes the captured log holds beyond pos, in the log's
// order; what it lacks before a record it holds counts in lost. The log's
// stdout is the terminal's output for a terminal process. It reports false
// if the log could not be read to its end or the client went.
func restFromLog(ctx context.Context, w io.Writer, logs *capture.Dir, terminal bool, pos, lost map[string]int64, selects func(string) bool) bool {
	name := func(s capture.LogStream) string {
		if s == capture.LogStdout && terminal {
			return "terminal"
		}
		return s.String()
	}
	from := capture.Positions{Stdout: pos[name(capture.LogStdout)], Stderr: pos["stderr"]}
	rd := capture.NewReader(logs, capture.ReadOptions{From: &from})
	defer rd.Close()
	for {
		e, err := rd.Next(ctx)
		if errors.Is(err, io.EOF) {
			return true
		}
		if err != nil || e.Gap != 0 {
			return false // a log rotated away under the read: the loss is unknown
		}
		if e.Stream == capture.LogMeta || e.Offset < 0 {
			continue
		}
		s, b := name(e.Stream), e.Payload()
		end := e.Offset + int64(len(b))
		if end <= pos[s] {
			continue
		}
		if e.Offset > pos[s] {
			lost[s] += e.Offset - pos[s] // neither the agent nor the log has these
		}
		b = b[max(pos[s]-e.Offset, 0):]
		pos[s] = end
		if selects(s) {
			if _, err := w.Write(b); err != nil {
				return false
			}
		}
	}
}
