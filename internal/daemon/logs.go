package daemon

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// CapturedLog describes one process's captured log.
type CapturedLog = api.CapturedLog

func runInfos(runs []capture.Run) ([]api.Run, bool) {
	out := make([]api.Run, len(runs))
	complete := len(runs) > 0
	for i, r := range runs {
		out[i] = api.Run{ID: r.ID, State: r.State.String(), Missed: r.Missed, Problems: r.Problems, Parent: r.Parent, ContinuedBy: r.ContinuedBy}
		if r.Dropped != [capture.NumLogStreams]int64{} {
			out[i].Dropped = map[string]int64{"stdout": r.Dropped[capture.LogStdout], "stderr": r.Dropped[capture.LogStderr]}
		}
		complete = complete && r.State.Complete() && !r.Missed
	}
	return out, complete
}

// logsDir opens the capture directory of the sandbox ref stands for, and
// says its id, running or not: logs stay readable after the sandbox
// stopped or was deleted (by its id, then: its name is another's to take).
func (d *Daemon) logsDir(ref string) (*capture.Dir, string, error) {
	d.mu.Lock()
	e, err := d.lookup(ref)
	d.mu.Unlock()
	if err != nil {
		return nil, "", err
	}
	id := e.rec.ID
	dir, err := capture.OpenDir(filepath.Join(d.sandboxDir(id), sandbox.LogsName))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, "", fmt.Errorf("%w: sandbox %s has no captured logs", errdefs.ErrNotFound, id)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		// Someone on the host replaced it; kilnd does not follow links.
		return nil, "", fmt.Errorf("%w: sandbox %s: its capture directory is no longer a directory", errdefs.ErrUnavailable, id)
	}
	return dir, id, err
}

// listLogs answers GET /sandboxes/{id}/logs: every captured process with
// its runs' completeness.
func (d *Daemon) listLogs(w http.ResponseWriter, r *http.Request) {
	dir, _, err := d.logsDir(r.PathValue("id"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	defer dir.Close()
	names, err := dir.List()
	if err != nil {
		reply.Error(w, err)
		return
	}
	out := []CapturedLog{}
	for _, name := range names {
		sub, err := dir.OpenSub(name)
		if err != nil {
			continue
		}
		cruns, st, err := capture.Summarize(r.Context(), sub)
		sub.Close()
		if err != nil {
			continue
		}
		runs, complete := runInfos(cruns)
		out = append(out, CapturedLog{Process: name, Runs: runs, Complete: complete, Stats: api.LogStats{
			Before: st.Before, Missed: st.Missed, MissedUnknown: st.MissedUnknown, Corrupt: st.Corrupt, Torn: st.Torn, Bytes: st.Bytes}})
	}
	reply.JSON(w, http.StatusOK, out)
}

// logQuery is GET …/logs/{pid}'s parameters.
type logQuery struct {
	filter capture.Filter
	follow bool
	json   bool
	// fromLog reads the captured log only, even while the process's
	// sandbox runs (source=log).
	fromLog bool
}

func parseLogQuery(r *http.Request) (logQuery, error) {
	q := r.URL.Query()
	lq := logQuery{filter: capture.Filter{Tail: -1}}
	switch q.Get("stream") {
	case "":
	case "stdout":
		lq.filter.Stdout = true
	case "stderr":
		lq.filter.Stderr = true
	default:
		return lq, fmt.Errorf("%w: stream %q: want stdout or stderr", errdefs.ErrInvalidArgument, api.Clip(q.Get("stream")))
	}
	if v := q.Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return lq, fmt.Errorf("%w: tail %q: want a count of lines", errdefs.ErrInvalidArgument, api.Clip(v))
		}
		lq.filter.Tail = n
	}
	for name, t := range map[string]*time.Time{"since": &lq.filter.Since, "until": &lq.filter.Until} {
		v := q.Get(name)
		if v == "" {
			continue
		}
		if ts, err := time.Parse(time.RFC3339Nano, v); err == nil {
			*t = ts
		} else if dur, err := time.ParseDuration(v); err == nil && dur >= 0 {
			*t = time.Now().Add(-dur)
		} else {
			return lq, fmt.Errorf("%w: %s %q: want an RFC 3339 time or a duration such as 10m", errdefs.ErrInvalidArgument, name, api.Clip(v))
		}
	}
	var err error
	if lq.follow, err = boolParam(q.Get("follow")); err != nil {
		return lq, err
	}
	switch q.Get("format") {
	case "":
		lq.json = acceptsNDJSON(r.Header.Values("Accept"))
	case "raw":
	case "json":
		lq.json = true
	default:
		return lq, fmt.Errorf("%w: format %q: want raw or json", errdefs.ErrInvalidArgument, api.Clip(q.Get("format")))
	}
	switch q.Get("source") {
	case "", "best":
	case "log":
		lq.fromLog = true
	default:
		return lq, fmt.Errorf("%w: source %q: want best or log", errdefs.ErrInvalidArgument, api.Clip(q.Get("source")))
	}
	return lq, nil
}

// acceptsNDJSON reports whether an Accept header asks for NDJSON records
// (application/x-ndjson with a non-zero quality).
func acceptsNDJSON(accept []string) bool {
	for _, v := range accept {
		for _, part := range strings.Split(v, ",") {
			mt, params, _ := strings.Cut(part, ";")
			if !strings.EqualFold(strings.TrimSpace(mt), "application/x-ndjson") {
				continue
			}
			q := 1.0
			for _, p := range strings.Split(params, ";") {
				if k, v, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.EqualFold(k, "q") {
					if f, err := strconv.ParseFloat(v, 64); err == nil {
						q = f
					}
				}
			}
			if q > 0 {
				return true
			}
		}
	}
	return false
}

// keeps says whether the query selects e: a gap always, a drop record
// in JSON (as a gap of its stream) if it selects a stream that lost bytes.
func (lq logQuery) keeps(e capture.Entry) bool {
	if e.Gap != 0 {
		return true
	}
	if e.Stream == capture.LogMeta && e.Lost != [capture.NumLogStreams]int64{} && lq.json {
		f := lq.filter
		f.Meta = true
		if !f.Selects(e.Record) {
			return false // out of the time range
		}
		for s, n := range e.Lost {
			if n > 0 && f.Selects(capture.Record{Stream: capture.LogStream(s), Time: e.Time}) {
				return true
			}
		}
		return false
	}
	return lq.filter.Selects(e.Record)
}

// whole says the query asks for the output itself: raw, every line of it
// at any time. That is served best by the sandbox's agent while it runs:
// from the captured log where the process's ring no longer holds the
// bytes, then from the ring, then live, as one sequence.
func (lq logQuery) whole() bool {
	return !lq.json && !lq.fromLog && lq.filter.Tail < 0 && lq.filter.Since.IsZero() && lq.filter.Until.IsZero()
}

func boolParam(v string) (bool, error) {
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%w: %q is not true or false", errdefs.ErrInvalidArgument, api.Clip(v))
	}
	return b, nil
}

// readLog answers GET /sandboxes/{id}/logs/{pid}: the captured output
// (the payload as it was written, or records as JSON), filtered; each run's
// completeness goes in the Kiln-Runs trailer (JSON) and Kiln-Complete.
// With follow it then keeps streaming what is appended, across rotation.
func (d *Daemon) readLog(w http.ResponseWriter, r *http.Request) {
	lq, err := parseLogQuery(r)
	if err != nil {
		reply.Error(w, err)
		return
	}
	// A process with no captured log is read from the cluster's copy, in
	// a cluster (readLogFilled).
	dir, id, err := d.logsDir(r.PathValue("id"))
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) || !d.readLogFilled(w, r, lq, r.PathValue("id"), r.PathValue("pid")) {
			reply.Error(w, err)
		}
		return
	}
	defer dir.Close()
	pid, err := logOf(dir, r.PathValue("pid"))
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) || !d.readLogFilled(w, r, lq, id, r.PathValue("pid")) {
			reply.Error(w, err)
		}
		return
	}
	sub, err := dir.OpenSub(pid)
	if err != nil {
		if !d.readLogFilled(w, r, lq, id, pid) {
			reply.Error(w, fmt.Errorf("%w: process %s has no captured log", errdefs.ErrNotFound, pid))
		}
		return
	}
	defer sub.Close()
	if lq.whole() && d.readFromAgent(w, r, id, pid, sub, lq) {
		return
	}
	rd := capture.NewReader(sub, capture.ReadOptions{})
	defer rd.Close()
	// The runs are known once the log is read: they come as trailers.
	startLog(w, lq, "Kiln-Runs, Kiln-Complete")
	emit := logEmitter(w, lq)
	if !readCaptured(r.Context(), rd, lq, emit) {
		return // the status is sent; the missing trailers say the read did not finish
	}
	runs, complete := runInfos(rd.Runs())
	rj, _ := json.Marshal(runs)
	w.Header().Set("Kiln-Runs", string(rj))
	w.Header().Set("Kiln-Complete", strconv.FormatBool(complete))
	if lq.follow {
		d.followLog(w, r, rd, lq, emit)
	}
}

// logOf is the process whose captured log in dir ref names: its whole
// id, or a prefix of api.MinIDPrefix characters or more that one log's
// process id begins with (two or more are refused, naming them).
func logOf(dir *capture.Dir, ref string) (string, error) {
	if _, err := uuid.Parse(ref); err == nil && len(ref) == 36 {
		return ref, nil
	}
	notFound := fmt.Errorf("%w: no process %q", errdefs.ErrNotFound, api.Clip(ref))
	if len(ref) < api.MinIDPrefix {
		return "", notFound
	}
	names, err := dir.List()
	if err != nil {
		return "", err
	}
	var matches []string
	for _, name := range names {
		if strings.HasPrefix(name, ref) {
			matches = append(matches, name)
		}
	}
	switch len(matches) {
	case 0:
		return "", notFound
	case 1:
		return matches[0], nil
	}
	return "", fmt.Errorf("%w: process prefix %q matches the logs of %d processes (%s): give more of the id", errdefs.ErrInvalidArgument,
		api.Clip(ref), len(matches), strings.Join(matches[:min(len(matches), 5)], ", "))
}

// startLog sends a log's 200 and headers: its type as lq asks, and the
// trailers that will follow its body.
func startLog(w http.ResponseWriter, lq logQuery, trailers string) {
	w.Header().Set("Trailer", trailers)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if lq.json {
		w.Header().Set("Content-Type", "application/x-ndjson")
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	w.WriteHeader(http.StatusOK)
}

// logEmitter writes each entry of a captured log as lq asks: records as
// JSON lines, or the payload as it was written (a gap of rotation as a
// line saying so).
func logEmitter(w http.ResponseWriter, lq logQuery) func(capture.Entry) error {
	enc := json.NewEncoder(w)
	return func(e capture.Entry) error {
		if lq.json {
			for _, rec := range toRecords(e, lq.filter) {
				if err := enc.Encode(rec); err != nil {
					return err
				}
			}
			return nil
		}
		if e.Gap != 0 {
			_, err := fmt.Fprintf(w, "[%s of the log lost to rotation while reading]\n", gapText(e.Gap))
			return err
		}
		_, err := w.Write(e.Payload())
		return err
	}
}

// entryReader reads a captured log's entries: the log's (capture.Reader),
// or what the cluster's copy of an output reads as (v1Entries). Next
// returns io.EOF at the end.
type entryReader interface {
	Next(ctx context.Context) (capture.Entry, error)
}

// readCaptured emits what the log holds now, filtered; false if the read
// or a write failed. Without tail the output streams as it is read; with
// it, only the entries of the last lines are kept, trimmed as the reading
// goes.
func readCaptured(ctx context.Context, rd entryReader, lq logQuery, emit func(capture.Entry) error) bool {
	var es []capture.Entry
	for {
		e, err := rd.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false
		}
		if !lq.keeps(e) {
			continue
		}
		if lq.filter.Tail < 0 {
			if emit(e) != nil {
				return false
			}
			continue
		}
		e.Content = slices.Clone(e.Content)
		es = append(es, e)
		// Written so that no tail overflows it: 2*tail could, and then
		// every entry would cost a copy of all those before it.
		if (len(es)-4096)/2 > lq.filter.Tail {
			es = slices.Clone(capture.Tail(es, lq.filter.Tail))
		}
	}
	if lq.filter.Tail >= 0 {
		for _, e := range capture.Tail(es, lq.filter.Tail) {
			if emit(e) != nil {
				return false
			}
		}
	}
	return true
}

// followLog keeps emitting what is appended to the log, across rotation.
// Following ends with the process: once it is not live and the log's
// last run has its end record, or has not had one for a whole idle check
// after the process was seen gone (its writer died with it).
func (d *Daemon) followLog(w http.ResponseWriter, r *http.Request, rd *capture.Reader, lq logQuery, emit func(capture.Entry) error) {
	ctx, pid := r.Context(), r.PathValue("pid")
	rc := http.NewResponseController(w)
	rc.Flush()
	rd.SetFollow(true)
	goneBefore := false
	for {
		wait, cancel := context.WithTimeout(ctx, followCheck)
		e, err := rd.Next(wait)
		cancel()
		if err != nil {
			if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
				return // the client left
			}
			if d.processLive(ctx, r.PathValue("id"), pid) {
				goneBefore = false
				continue
			}
			if goneBefore || lastRunEnded(rd.Runs()) {
				return
			}
			goneBefore = true
			continue
		}
		if !lq.keeps(e) {
			continue
		}
		rc.SetWriteDeadline(time.Now().Add(relayWriteTimeout))
		if emit(e) != nil {
			return
		}
		rc.Flush()
	}
}

// followCheck is how long a followed log may be quiet before kilnd looks
// whether its process still lives.
const followCheck = time.Second

// lastRunEnded reports whether the last run of a log was ended by its
// writer: nothing more comes of it.
func lastRunEnded(runs []capture.Run) bool {
	if len(runs) == 0 {
		return false
	}
	switch runs[len(runs)-1].State {
	case capture.Lossless, capture.Lossy, capture.RetentionLoss:
		return true
	}
	return false
}

func gapText(n int64) string {
	if n < 0 {
		return "an unknown amount"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// toRecords is what the JSON shape says of an entry f keeps: a record
// with its stream offset, a gap of the log, or, for a drop record, a
// stream gap per selected stream that lost bytes.
func toRecords(e capture.Entry, f capture.Filter) []api.LogRecord {
	offset := func(o int64) *int64 {
		if o < 0 {
			return nil
		}
		return &o
	}
	if e.Gap != 0 {
		return []api.LogRecord{{Gap: e.Gap}}
	}
	if e.Stream == capture.LogMeta {
		var recs []api.LogRecord
		for s, n := range e.Lost {
			if n > 0 && f.Selects(capture.Record{Stream: capture.LogStream(s), Time: e.Time}) {
				recs = append(recs, api.LogRecord{Time: e.Time, Stream: capture.LogStream(s).String(), Offset: offset(e.LostAt[s]), LostBytes: n})
			}
		}
		return recs
	}
	rec := api.LogRecord{Time: e.Time, Stream: e.Stream.String(), Offset: offset(e.Offset), Partial: e.Partial}
	if utf8.Valid(e.Content) {
		rec.Text = string(e.Content)
	} else {
		rec.Base64 = base64.StdEncoding.EncodeToString(e.Content)
	}
	return []api.LogRecord{rec}
}
