package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// Server is a process API for the scenarios to run against: the agent's,
// or kilnd's for one sandbox.
type Server struct {
	// URL is where the process API is served, by http: the agent's root,
	// or kilnd's /sandboxes/{id}. Its WebSockets are at the same place by
	// ws.
	URL string
	// Do sends a request, adding what the server wants (kilnd's token);
	// nil is http.DefaultClient's.
	Do func(*http.Request) (*http.Response, error)
	// Dial opens a WebSocket offering protocols, adding what the server
	// wants (the token's subprotocol); nil is websocket.Dial's.
	Dial func(ctx context.Context, url string, protocols []string) (*websocket.Conn, *http.Response, error)
	// Grace is how long the server keeps a finished process nobody
	// watches before it becomes a tombstone (zero: process.DefaultGrace):
	// how long the tombstone scenario waits for one.
	Grace time.Duration
	// Tombstones, when set, is where the tombstone scenario runs instead:
	// the same API with a shorter grace. The other scenarios attach again
	// right after a watcher leaves a finished process, so they want a
	// grace of seconds at least.
	Tombstones *Server
}

// Scenarios are the contract's scenarios. Each starts processes of its
// own, so they may run side by side on one server.
var Scenarios = []struct {
	Name string
	Run  func(t *testing.T, s Server)
}{
	{"seed example", SeedExample},
	{"reattach at offsets", Reattach},
	{"gap after a wrap", GapAfterWrap},
	{"tombstone", Tombstone},
	{"flow block", FlowBlock},
}

// Run runs every scenario against s side by side, and returns once all
// have ended.
func Run(t *testing.T, s Server) {
	t.Run("kiln.v1", func(t *testing.T) {
		for _, sc := range Scenarios {
			t.Run(sc.Name, func(t *testing.T) {
				t.Parallel()
				sc.Run(t, s)
			})
		}
	})
}

// scenarioDeadline bounds every scenario, besides the grace a tombstone
// is waited for: a server that takes longer hangs.
const scenarioDeadline = 2 * time.Minute

func scenarioContext(t *testing.T, extra time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), scenarioDeadline+extra)
	t.Cleanup(cancel)
	return ctx
}

// Query is the query that resumes from the offsets from.
func Query(from map[string]int64) string {
	q := url.Values{}
	for name, off := range from {
		q.Set(name, fmt.Sprint(off))
	}
	return q.Encode()
}

// call makes a request of the API and decodes its JSON answer into out
// (when not nil); an answer other than 200 fails the test.
func (s Server) call(t *testing.T, ctx context.Context, method, path string, body any, out any) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := body.(string); !ok && body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	do := s.Do
	if do == nil {
		do = http.DefaultClient.Do
	}
	resp, err := do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %.300s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %.300s", method, path, err, b)
		}
	}
}

func (s Server) start(t *testing.T, ctx context.Context, req api.ExecRequest) string {
	t.Helper()
	var st api.Started
	s.call(t, ctx, "POST", "/exec-stream", req, &st)
	return st.ID
}

func (s Server) wait(t *testing.T, ctx context.Context, pid string) api.Exit {
	t.Helper()
	var e api.Exit
	s.call(t, ctx, "GET", "/exec-stream/"+pid+"/wait", nil, &e)
	return e
}

func (s Server) status(t *testing.T, ctx context.Context, pid string) api.Process {
	t.Helper()
	var p api.Process
	s.call(t, ctx, "GET", "/exec-stream/"+pid, nil, &p)
	return p
}

// stdin appends data to a process's input.
func (s Server) stdin(t *testing.T, ctx context.Context, pid, data string) {
	t.Helper()
	s.call(t, ctx, "POST", "/exec-stream/"+pid+"/stdin", data, nil)
}

// await polls the server until cond holds: the scenarios wait on states
// only its answers show (all output written, a tombstone, a held process).
func (s Server) await(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not before the scenario's deadline", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// dial opens a watcher of pid's output with the query and protocols.
func (s Server) dial(ctx context.Context, pid, query string, protocols ...string) (*websocket.Conn, *http.Response, error) {
	u := "ws" + strings.TrimPrefix(s.URL, "http") + "/exec-stream/" + pid + "/logs"
	if query != "" {
		u += "?" + query
	}
	dial := s.Dial
	if dial == nil {
		dial = func(ctx context.Context, u string, protocols []string) (*websocket.Conn, *http.Response, error) {
			return websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: protocols})
		}
	}
	c, resp, err := dial(ctx, u, protocols)
	if err == nil {
		// A frame carries one chunk of the ring, never more than the ring.
		c.SetReadLimit(api.FrameHeader + ring.DefaultCapacity)
	}
	return c, resp, err
}

// watch opens a kiln.v1 watcher of pid from the offsets from, with more
// of the query in extra; the test ends it.
func (s Server) watch(t *testing.T, ctx context.Context, pid string, from map[string]int64, extra string) *websocket.Conn {
	t.Helper()
	q := Query(from)
	if extra != "" {
		q = strings.TrimPrefix(q+"&"+extra, "&")
	}
	c, _, err := s.dial(ctx, pid, q, api.ProtocolV1)
	if err != nil {
		t.Fatalf("watch %s?%s: %v", pid, q, err)
	}
	t.Cleanup(func() { c.CloseNow() })
	if c.Subprotocol() != api.ProtocolV1 {
		t.Fatalf("watch %s?%s: subprotocol %q, want %q", pid, q, c.Subprotocol(), api.ProtocolV1)
	}
	return c
}

// readAll reads a kiln.v1 watcher of pid from the offsets from to its
// close, keeping the data.
func (s Server) readAll(t *testing.T, ctx context.Context, pid string, from map[string]int64) *Checker {
	t.Helper()
	w, err := ReadAll(ctx, s.watch(t, ctx, pid, from, ""), from)
	if err != nil {
		t.Fatalf("watch %s from %v: %v", pid, from, err)
	}
	return w
}

// readRaw reads a watcher of pid offering protocols (none, or kiln.raw) to
// its close.
func (s Server) readRaw(t *testing.T, ctx context.Context, pid string, protocols ...string) string {
	t.Helper()
	c, _, err := s.dial(ctx, pid, "", protocols...)
	if err != nil {
		t.Fatalf("watch %s offering %q: %v", pid, protocols, err)
	}
	defer c.CloseNow()
	if want := strings.Join(protocols, ""); c.Subprotocol() != want {
		t.Fatalf("watch %s offering %q: subprotocol %q", pid, protocols, c.Subprotocol())
	}
	got, err := ReadRaw(ctx, c)
	if err != nil {
		t.Fatalf("watch %s offering %q: %v", pid, protocols, err)
	}
	return got
}

// outOfRange checks that a watcher asking for offsets past what pid
// produced is refused, with 416 and the API's error.
func (s Server) outOfRange(t *testing.T, ctx context.Context, pid string, from map[string]int64) {
	t.Helper()
	c, resp, err := s.dial(ctx, pid, Query(from), api.ProtocolV1)
	if err == nil {
		c.CloseNow()
		t.Errorf("watch %s from %v, past its output: accepted", pid, from)
		return
	}
	var e api.Error
	var body []byte
	if resp != nil {
		body, _ = io.ReadAll(resp.Body) // what Dial kept of it
	}
	if resp == nil || resp.StatusCode != http.StatusRequestedRangeNotSatisfiable || json.Unmarshal(body, &e) != nil || e.Error.Code != api.CodeOutOfRange {
		t.Errorf("watch %s from %v, past its output: %v (%.300s), want %d %s", pid, from, err, body, http.StatusRequestedRangeNotSatisfiable, api.CodeOutOfRange)
	}
}

// exitCode checks an exit is the code want.
func exitCode(t *testing.T, what string, e *api.Exit, want int) {
	t.Helper()
	if e == nil || e.ExitCode == nil || *e.ExitCode != want || e.Signal != "" {
		t.Errorf("%s: exit %v, want code %d", what, e, want)
	}
}

// SeedExample is the exec-stream design's example: a process printing
// three lines a while apart, read in the raw shape while it runs and again
// after it ended (the same transcript both times), and in kiln.v1.
func SeedExample(t *testing.T, s Server) {
	ctx := scenarioContext(t, 0)
	pid := s.start(t, ctx, api.ExecRequest{Command: "sh", Args: []string{"-c", "for i in 1 2 3; do echo line-$i; sleep 0.3; done"}})
	const want = "line-1\nline-2\nline-3\n[process exited with code 0]\n"
	if during := s.readRaw(t, ctx, pid); during != want {
		t.Errorf("read while it runs: %q, want %q", during, want)
	}
	if after := s.readRaw(t, ctx, pid, api.ProtocolRaw); after != want {
		t.Errorf("read after it ended, as %s: %q, want %q", api.ProtocolRaw, after, want)
	}
	w := s.readAll(t, ctx, pid, nil)
	out, errs := w.Stream("stdout"), w.Stream("stderr")
	if string(out.Data) != "line-1\nline-2\nline-3\n" || out.Lost != 0 || errs.Total != 0 {
		t.Errorf("kiln.v1: %v, stdout %+v, stderr %+v", w, out, errs)
	}
	exitCode(t, "kiln.v1", w.Exit, 0)
}

// Reattach: a watcher that leaves mid-stream and comes back from the
// offsets it had gets exactly the bytes after them, nothing repeated and
// nothing lost; and once the process has ended, a watcher resuming
// anywhere gets exactly what follows, while one asking past the end is
// refused.
func Reattach(t *testing.T, s Server) {
	ctx := scenarioContext(t, 0)
	// The first part is whole lines, so the second goes on with the
	// pattern where the first stopped.
	const first, second = 64 << 10, 64<<10 + 5
	const total = first + second
	pid := s.start(t, ctx, api.ExecRequest{Command: "sh", Stdin: api.StdinPipe, Args: []string{"-c",
		Line.Shell(first) + "; printf err1 >&2; read x; " + Line.Shell(second) + "; printf err22 >&2; exit 5"}})
	check := func(stream string, off int64, data []byte) error {
		if stream == "stdout" {
			return Line.Check(stream, off, data)
		}
		return nil
	}
	// The process waits for its input after the first part: the watcher
	// reads all of it, then leaves.
	w := &Checker{Keep: true, Check: check, NoGaps: true}
	c := s.watch(t, ctx, pid, nil, "")
	for w.Stream("stdout").Next < first || w.Stream("stderr").Next < 4 {
		if _, err := w.Next(ctx, c); err != nil {
			t.Fatalf("the first part: %v", err)
		}
	}
	if out, errs := w.Stream("stdout"), w.Stream("stderr"); out.Next != first || string(errs.Data) != "err1" {
		t.Fatalf("the first part: %v, stderr %q", w, errs.Data)
	}
	c.Close(websocket.StatusNormalClosure, "")
	s.stdin(t, ctx, pid, "go\n")
	from := w.Position()
	again := &Checker{From: from, Keep: true, Check: check, NoGaps: true}
	if err := again.Read(ctx, s.watch(t, ctx, pid, from, "")); err != nil {
		t.Fatalf("back from %v: %v", from, err)
	}
	out, errs := again.Stream("stdout"), again.Stream("stderr")
	if !bytes.Equal(out.Data, Line.Bytes(first, second)) || out.Total != total || string(errs.Data) != "err22" || errs.Total != 9 {
		t.Errorf("back from %v: stdout %d bytes of %d, ended at %d; stderr %q, ended at %d", from, len(out.Data), second, out.Total, errs.Data, errs.Total)
	}
	exitCode(t, "back from "+Query(from), again.Exit, 5)

	// Over: from anywhere, exactly what follows.
	full := map[string][]byte{"stdout": Line.Bytes(0, total), "stderr": []byte("err1err22")}
	for _, from := range []map[string]int64{
		nil, {"stdout": 1}, {"stderr": 4}, {"stdout": first, "stderr": 4}, {"stdout": 12345, "stderr": 2},
		{"stdout": total - 1, "stderr": 8}, {"stdout": total, "stderr": 9},
	} {
		w := &Checker{From: from, Keep: true, NoGaps: true}
		if err := w.Read(ctx, s.watch(t, ctx, pid, from, "")); err != nil {
			t.Errorf("from %v: %v", from, err)
			continue
		}
		for name, want := range full {
			if st := w.Stream(name); !bytes.Equal(st.Data, want[from[name]:]) || st.Total != int64(len(want)) {
				t.Errorf("from %v: %s gave %d bytes (%.40q…), ended at %d; want the %d after %d", from, name, len(st.Data), st.Data, st.Total, int64(len(want))-from[name], from[name])
			}
		}
		exitCode(t, "from "+Query(from), w.Exit, 5)
	}
	s.outOfRange(t, ctx, pid, map[string]int64{"stdout": total + 1})
	s.outOfRange(t, ctx, pid, map[string]int64{"stderr": 10})
}

// GapAfterWrap: a process writes three times what the ring holds with
// nobody reading. A watcher from 0 is told of exactly what was evicted,
// in one gap from 0 to where the ring's retained output begins, then gets
// that output, to the end.
func GapAfterWrap(t *testing.T, s Server) {
	ctx := scenarioContext(t, 0)
	const size = 3*ring.DefaultCapacity + 7
	// It waits for its input once it has written: nothing is evicted
	// while the watcher reads, and the process is not finished, so no
	// grace period runs.
	pid := s.start(t, ctx, api.ExecRequest{Command: "sh", Stdin: api.StdinPipe, Args: []string{"-c",
		fmt.Sprintf("%s; printf tail >&2; read x", Line.Shell(size))}})
	s.await(t, ctx, "all output written", func() bool {
		p := s.status(t, ctx, pid)
		return p.Streams["stdout"].TotalBytes == size && p.Streams["stderr"].TotalBytes == 4
	})
	check := func(stream string, off int64, data []byte) error {
		if stream == "stdout" {
			return Line.Check(stream, off, data)
		}
		return nil
	}
	w := &Checker{Check: check}
	c := s.watch(t, ctx, pid, nil, "")
	for w.Stream("stdout").Next < size || w.Stream("stderr").Next < 4 {
		if _, err := w.Next(ctx, c); err != nil {
			t.Fatalf("the retained output: %v", err)
		}
	}
	s.stdin(t, ctx, pid, "\n")
	if err := w.Read(ctx, c); err != nil {
		t.Fatalf("after the input: %v", err)
	}
	// Per stream, one gap from 0 to where the hello said the retained
	// output begins (none if it begins at 0), then all of that output.
	// stderr's 4 bytes, though written last, may have been evicted too:
	// the ring's order is the pumps', and stdout's pump may still have had
	// the pipe's worth to read when stderr's came in.
	retained := int64(0)
	for name, total := range map[string]int64{"stdout": size, "stderr": 4} {
		h, st := w.Hello.Streams[name], w.Stream(name)
		if h.Total != total || int64(st.Gaps) != min(h.First, 1) || st.Lost != h.First || st.Delivered != total-h.First || st.Total != total {
			t.Errorf("%s: hello %+v; %d gaps of %d bytes in all, %d bytes delivered, ended at %d; want one gap [0, %d) if any, then the %d retained, ending at %d",
				name, h, st.Gaps, st.Lost, st.Delivered, st.Total, h.First, total-h.First, total)
		}
		retained += st.Delivered
	}
	if first := w.Hello.Streams["stdout"].First; first == 0 || retained > ring.DefaultCapacity {
		t.Errorf("stdout retained from %d, %d bytes retained in all: want the ring's %d at most, and a loss", first, retained, ring.DefaultCapacity)
	}
	exitCode(t, "after the wrap", w.Exit, 0)
}

// Tombstone: a process over and unwatched for its grace period becomes a
// tombstone, which keeps its exit and totals but no output. A watcher
// from 0, or from the middle, gets each stream's loss up to its total and
// its end, then the exit; in the raw shape, a line for each loss, then the
// exit's.
func Tombstone(t *testing.T, s Server) {
	if s.Tombstones != nil {
		s = *s.Tombstones
	}
	grace := s.Grace
	if grace == 0 {
		grace = process.DefaultGrace
	}
	ctx := scenarioContext(t, grace)
	pid := s.start(t, ctx, api.ExecRequest{Command: "sh", Args: []string{"-c", "printf out-bytes; printf errs >&2; exit 3"}})
	exitCode(t, "wait", ptr(s.wait(t, ctx, pid)), 3)
	// A tombstone keeps no pid.
	s.await(t, ctx, "the tombstone", func() bool {
		p := s.status(t, ctx, pid)
		return p.State == api.StateExited && p.PID == 0
	})
	totals := map[string]int64{"stdout": 9, "stderr": 4}
	for _, from := range []map[string]int64{nil, {"stdout": 2, "stderr": 4}} {
		w := s.readAll(t, ctx, pid, from)
		for name, total := range totals {
			h, st := w.Hello.Streams[name], w.Stream(name)
			if h.First != total || h.Total != total || st.Delivered != 0 || st.Lost != total-from[name] || st.Total != total {
				t.Errorf("from %v: %s: hello %+v, %d delivered, %d lost, ended at %d; want %d lost and the end at %d",
					from, name, h, st.Delivered, st.Lost, st.Total, total-from[name], total)
			}
		}
		exitCode(t, "from "+Query(from), w.Exit, 3)
	}
	raw := s.readRaw(t, ctx, pid)
	lines := strings.SplitAfter(raw, "\n")
	last := lines[len(lines)-2] // after the final newline comes ""
	lines = slices.Sorted(slices.Values(lines[:len(lines)-2]))
	if want := []string{"[4 bytes of stderr lost]\n", "[9 bytes of stdout lost]\n"}; !slices.Equal(lines, want) || last != "[process exited with code 3]\n" {
		t.Errorf("raw: %q, want the lines %q in any order, then the exit", raw, want)
	}
	s.outOfRange(t, ctx, pid, map[string]int64{"stdout": 10})
}

func ptr[T any](v T) *T { return &v }

// FlowBlock: a process started with flow block writes sixteen times what
// the ring holds, to a watcher holding its output (flow=block&ack=true)
// that stops reading until the process waits for it, then reads on,
// acking what it takes. The watcher gets every byte, with no gap, and the
// process's exit.
func FlowBlock(t *testing.T, s Server) {
	ctx := scenarioContext(t, 0)
	const size = 16 * ring.DefaultCapacity
	pid := s.start(t, ctx, api.ExecRequest{Command: "sh", Args: []string{"-c", Line.Shell(size)}, Flow: api.FlowBlock})
	c := s.watch(t, ctx, pid, nil, "flow=block&ack=true")
	w := &Checker{NoGaps: true, Check: Line.Check}
	for w.Stream("stdout").Frames == 0 {
		if _, err := w.Next(ctx, c); err != nil {
			t.Fatalf("the first frame: %v", err)
		}
	}
	s.await(t, ctx, "the process held for its watcher", func() bool { return s.status(t, ctx, pid).Held })
	for {
		typ, err := w.Next(ctx, c)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading on: %v", err)
		}
		if typ != TypeFrame {
			continue
		}
		// Acked after every frame: a holding watcher acks at least every
		// 256 KiB it takes, and a frame is at most that.
		ack, _ := json.Marshal(api.ClientMessage{Type: api.TypeAck, Offsets: w.Position()})
		if err := c.Write(ctx, websocket.MessageText, ack); err != nil {
			t.Fatalf("ack at %v: %v", w, err)
		}
	}
	if out := w.Stream("stdout"); out.Delivered != size || out.Total != size || w.Stream("stderr").Total != 0 {
		t.Errorf("stdout: %+v; want all %d bytes", out, size)
	}
	exitCode(t, "flow block", w.Exit, 0)
	if p := s.status(t, ctx, pid); p.Flow != api.FlowBlock || p.Held {
		t.Errorf("status %+v, want flow block, no longer held", p)
	}
}
