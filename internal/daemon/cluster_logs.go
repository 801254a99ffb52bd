// GET /sandboxes/{id}/logs/{pid} from the cluster's copy of a process's
// output: for a lost node's process, and, on its own node, for one that
// has no captured log.

package daemon

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/cluster"
	"github.com/sandkiln/sandkiln/internal/outexport"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// v1Reader is a process's output as kiln.v1 messages, read one at a time:
// the cluster's copy (outexport.Reader), or filled.
type v1Reader interface {
	Read(ctx context.Context) (websocket.MessageType, []byte, error)
}

// v1Entries reads a kiln.v1 stream as a captured log's entries, framed as
// capture frames its records: a record per line, its content without the
// newline, a line longer than capture.MaxContent in P records of that
// size, a line the stream's end or a loss cuts off as a P record; each
// loss a drop entry, at its offset, standing before the stream's next
// record. A terminal's output is stdout, as in a captured log. A record's
// time is when its line ended: when the cluster stored the message that
// ended it (outexport.Reader.Stored), or when it was read here.
type v1Entries struct {
	src    v1Reader
	stored func() time.Time // nil: the time of reading
	// Per log stream: the unfinished line, and its first byte's offset.
	line   [capture.NumLogStreams][]byte
	lineAt [capture.NumLogStreams]int64
	queue  []capture.Entry
	// lost counts each stream's bytes the stream said it lacked; pos is
	// where each stream got (the offsets a reader resumes from).
	lost, pos map[string]int64
	// ended says the exit came: nothing more comes of the process.
	ended, done bool
	// target, when set, ends the read once every stream got to it: its
	// total when the hello came (a read without follow).
	target map[string]int64
}

func newV1Entries(src v1Reader, stored func() time.Time) *v1Entries {
	return &v1Entries{src: src, stored: stored, lost: map[string]int64{}, pos: map[string]int64{}}
}

// logStream is the captured log's stream of a kiln.v1 stream.
func logStream(name string) capture.LogStream {
	if name == "stderr" {
		return capture.LogStderr
	}
	return capture.LogStdout
}

// Next returns the next entry; io.EOF at the stream's end, once the
// unfinished lines are given.
func (v *v1Entries) Next(ctx context.Context) (capture.Entry, error) {
	for len(v.queue) == 0 {
		if v.done {
			return capture.Entry{}, io.EOF
		}
		typ, b, err := v.src.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return capture.Entry{}, ctx.Err()
			}
			// The end of what is there (a normal close, the copy's end) or
			// of what could be read: either way, what came is all there is.
			v.done = true
			now := v.now()
			for s := range capture.LogStdout + 2 {
				v.cut(s, now)
			}
			continue
		}
		v.take(typ, b)
		if v.caughtUp() {
			v.done = true
			now := v.now()
			for s := range capture.LogStdout + 2 {
				v.cut(s, now)
			}
		}
	}
	e := v.queue[0]
	v.queue = v.queue[1:]
	return e, nil
}

// caughtUp reports whether a read that ends at its hello's totals got
// there.
func (v *v1Entries) caughtUp() bool {
	if len(v.target) == 0 {
		return false
	}
	for s, t := range v.target {
		if v.pos[s] < t {
			return false
		}
	}
	return true
}

func (v *v1Entries) now() time.Time {
	if v.stored != nil {
		if t := v.stored(); !t.IsZero() {
			return t
		}
	}
	return time.Now().UTC()
}

// take queues what a kiln.v1 message says.
func (v *v1Entries) take(typ websocket.MessageType, b []byte) {
	now := v.now()
	if typ == websocket.MessageBinary {
		f, err := api.ParseFrame(b)
		if err != nil || int(f.Stream) >= len(api.StreamNames) || api.StreamNames[f.Stream] == "" {
			return
		}
		name := api.StreamNames[f.Stream]
		v.pos[name] = int64(f.Offset) + int64(len(f.Data))
		s := logStream(name)
		if len(v.line[s]) == 0 {
			v.lineAt[s] = int64(f.Offset)
		}
		for data := f.Data; len(data) > 0; {
			i := 0
			for i < len(data) && data[i] != '\n' && len(v.line[s])+i < capture.MaxContent {
				i++
			}
			v.line[s] = append(v.line[s], data[:i]...)
			switch {
			case i < len(data) && data[i] == '\n':
				v.record(s, false, now)
				data = data[i+1:]
				v.lineAt[s] += 1
			case len(v.line[s]) >= capture.MaxContent:
				v.record(s, true, now)
				data = data[i:]
			default:
				data = nil
			}
		}
		return
	}
	var m struct {
		Type    string                   `json:"type"`
		Streams map[string]api.HelloSpan `json:"streams"`
		api.Gap
	}
	if json.Unmarshal(b, &m) != nil {
		return
	}
	switch m.Type {
	case api.TypeHello:
		if v.target != nil {
			for s, span := range m.Streams {
				v.target[s] = span.Total
			}
		}
	case api.TypeGap:
		if m.LostBytes <= 0 {
			return
		}
		s := logStream(m.Stream)
		v.cut(s, now)
		e := capture.Entry{Record: capture.Record{Time: now, Stream: capture.LogMeta, On: s}, Offset: m.From}
		e.Lost[s], e.LostAt[s] = m.LostBytes, m.From
		v.queue = append(v.queue, e)
		v.lost[m.Stream] += m.LostBytes
		v.pos[m.Stream] = m.To
		v.lineAt[s] = m.To
	case api.TypeExit:
		v.ended = true
	}
}

// record queues stream s's line so far as a record, partial or full,
// and begins the next at its end.
func (v *v1Entries) record(s capture.LogStream, partial bool, at time.Time) {
	e := capture.Entry{Record: capture.Record{Time: at, Stream: s, Partial: partial, Content: v.line[s]}, Offset: v.lineAt[s]}
	v.queue = append(v.queue, e)
	v.lineAt[s] += int64(len(v.line[s]))
	v.line[s] = nil
}

// cut queues stream s's unfinished line, if any, as a P record.
func (v *v1Entries) cut(s capture.LogStream, at time.Time) {
	if len(v.line[s]) > 0 {
		v.record(s, true, at)
	}
}

// run is the one run the cluster's copy says of a process's output: the
// export's, lossless or lossy once its end came, else interrupted
// (nothing says it ended); retention-loss when the copy no longer holds
// its begin. Its drops are what this read lost.
func (v *v1Entries) run(id string, begun bool) api.Run {
	r := api.Run{ID: id}
	switch {
	case !begun && v.ended:
		r.State = capture.RetentionLoss.String()
	case !begun:
		r.State = capture.Unknown.String()
	case !v.ended:
		r.State = capture.Interrupted.String()
	case v.lost["stdout"]+v.lost["stderr"]+v.lost["terminal"] > 0:
		r.State = capture.Lossy.String()
	default:
		r.State = capture.Lossless.String()
	}
	if n := v.lost["stdout"] + v.lost["terminal"]; n > 0 || v.lost["stderr"] > 0 {
		r.Dropped = map[string]int64{"stdout": n, "stderr": v.lost["stderr"]}
	}
	return r
}

// logFromCluster answers GET /sandboxes/{id}/logs/{pid} from src, a
// process's output as the cluster's copy has it (and, on the process's
// own node, its agent after): as its captured log is answered (raw or
// NDJSON records, filtered, a loss as a record of its own), with the
// trailers Kiln-Runs (the export's one run), Kiln-Complete and Kiln-Lost
// (per stream, the bytes neither held). run and begun are the export's
// run (outexport.Reader.Run).
func logFromCluster(w http.ResponseWriter, r *http.Request, lq logQuery, src *v1Entries, run string, begun bool) {
	startLog(w, lq, "Kiln-Runs, Kiln-Complete, Kiln-Lost")
	if !readCaptured(r.Context(), src, lq, logEmitter(w, lq)) {
		return // the status is sent; the missing trailers say the read did not finish
	}
	rn := src.run(run, begun)
	rj, _ := json.Marshal([]api.Run{rn})
	lj, _ := json.Marshal(src.lost)
	w.Header().Set("Kiln-Runs", string(rj))
	w.Header().Set("Kiln-Complete", strconv.FormatBool(rn.State == capture.Lossless.String()))
	w.Header().Set("Kiln-Lost", string(lj))
}

// readLostLog answers GET /sandboxes/{id}/logs/{pid} for process pid of
// sandbox sb, whose node is gone, from the cluster's copy: all of it, to
// where it ends (follow too: nothing more comes from a node that is gone).
func (d *Daemon) readLostLog(w http.ResponseWriter, r *http.Request, sb api.Sandbox, pid string) {
	lq, err := parseLogQuery(r)
	if err != nil {
		reply.Error(w, err)
		return
	}
	rd, err := outexport.NewReader(r.Context(), d.cluster.JetStream(), cluster.Token(sb.Node), sb.ID, pid, outexport.ReadOptions{})
	if err != nil {
		reply.Error(w, err)
		return
	}
	defer rd.CloseNow()
	run, begun := rd.Run()
	logFromCluster(w, r, lq, newV1Entries(rd, rd.Stored), run, begun)
}

// readLogFilled answers GET /sandboxes/{id}/logs/{pid} on a node in a
// cluster, for a process of its own sandbox ref with no captured log: the
// cluster's copy for what its agent no longer holds, then the agent's
// ring and, with follow, its output live (filled); the copy alone when
// the agent does not have the process (its sandbox stopped). It reports
// false, having answered nothing, when neither has the process.
func (d *Daemon) readLogFilled(w http.ResponseWriter, r *http.Request, lq logQuery, ref, pid string) bool {
	if d.exporter == nil || d.cluster == nil || d.cluster.JetStream() == nil || lq.fromLog {
		return false
	}
	ctx := r.Context()
	e, err := d.get(ref)
	if err != nil {
		return false
	}
	d.mu.Lock()
	id := e.rec.ID
	d.mu.Unlock()
	q := url.Values{}
	f, err := d.openFilled(ctx, e, pid, nil, q, nil, true)
	if err != nil || f == nil {
		rd, err := outexport.NewReader(ctx, d.cluster.JetStream(), cluster.Token(d.cluster.Name()), id, pid, outexport.ReadOptions{})
		if err != nil {
			return false
		}
		defer rd.CloseNow()
		run, begun := rd.Run()
		logFromCluster(w, r, lq, newV1Entries(rd, rd.Stored), run, begun)
		return true
	}
	defer f.Close()
	src := newV1Entries(f, f.stored)
	if !lq.follow && !f.exited {
		// Where the output stands now, not what comes later; an exited
		// process's stream ends with its exit.
		src.target = map[string]int64{}
	}
	// The read begins at the process's start: what neither holds of it
	// is counted lost.
	logFromCluster(w, r, lq, src, f.run, true)
	return true
}
