package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/process"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// agent is a Server on a test HTTP server, over a fresh table.
type agent struct {
	t     *testing.T
	srv   *httptest.Server
	table *process.Table
	logs  string // the capture directory
}

func newAgent(t *testing.T) *agent {
	t.Helper()
	return newAgentWith(t, process.TableConfig{})
}

// newAgentWith is newAgent over a table configured with cfg.
func newAgentWith(t *testing.T, cfg process.TableConfig) *agent {
	t.Helper()
	logs := t.TempDir()
	d, err := capture.OpenDir(logs)
	if err != nil {
		t.Fatal(err)
	}
	// As in a sandbox, readers take from a captured process's log what
	// its ring no longer holds.
	cfg.Logs = d.OpenSub
	table := process.NewTable(cfg)
	s := New(Config{Table: table, Env: os.Environ(), Logs: d})
	srv := serveAsTheAgent(s)
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := table.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		d.Close()
	})
	return &agent{t: t, srv: srv, table: table, logs: logs}
}

// serveAsTheAgent serves h on a test server as Server.Serve does: the
// output watchers' handlers need their connections.
func serveAsTheAgent(h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnContext = withConn
	srv.Listener = moveListener{srv.Listener}
	srv.Start()
	return srv
}

// call makes a request and decodes a JSON answer into out (when not nil).
func (a *agent) call(method, path string, body any, out any) int {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctxT(a.t), method, a.srv.URL+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	if resp.StatusCode >= 400 {
		var e api.Error
		if err := json.Unmarshal(raw, &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
			a.t.Fatalf("%s %s: status %d with a body that is not an error object: %q", method, path, resp.StatusCode, raw)
		}
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			a.t.Fatalf("%s %s: %v in %q", method, path, err, raw)
		}
	}
	return resp.StatusCode
}

func (a *agent) start(req api.ExecRequest) string {
	a.t.Helper()
	var st api.Started
	if code := a.call("POST", "/exec-stream", req, &st); code != 200 {
		a.t.Fatalf("start %v: status %d", req, code)
	}
	return st.ID
}

func (a *agent) wait(id string) api.Exit {
	a.t.Helper()
	var e api.Exit
	if code := a.call("GET", "/exec-stream/"+id+"/wait", nil, &e); code != 200 {
		a.t.Fatalf("wait: status %d", code)
	}
	return e
}

func (a *agent) dial(path string, protocols ...string) *websocket.Conn {
	a.t.Helper()
	c, _, err := websocket.Dial(ctxT(a.t), "ws"+strings.TrimPrefix(a.srv.URL, "http")+path, &websocket.DialOptions{Subprotocols: protocols})
	if err != nil {
		a.t.Fatal(err)
	}
	c.SetReadLimit(-1)
	return c
}

// rawTranscript reads a raw-shape WebSocket to its close: binary payloads
// and text lines, concatenated, the exit's line last.
func rawTranscript(t *testing.T, c *websocket.Conn) string {
	t.Helper()
	got, err := apitest.ReadRaw(ctxT(t), c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return got
}

// server is the agent as the conformance scenarios reach it.
func (a *agent) server() apitest.Server {
	return apitest.Server{URL: a.srv.URL}
}

// TestConformance runs the kiln.v1 scenarios against the agent; the
// tombstone scenario against one whose finished processes become
// tombstones after a short grace.
func TestConformance(t *testing.T) {
	s := newAgent(t).server()
	tombs := newAgentWith(t, process.TableConfig{Grace: 100 * time.Millisecond}).server()
	tombs.Grace = 100 * time.Millisecond
	s.Tombstones = &tombs
	apitest.Run(t, s)
}

// TestSeedExample is the exec-stream document's example: attach mid-run and
// after the end; both see the same complete transcript.
func TestSeedExample(t *testing.T) {
	a := newAgent(t)
	id := a.start(api.ExecRequest{Command: "sh", Args: []string{"-c", "for i in 1 2 3; do echo line-$i; sleep 0.2; done"}})
	first := a.dial("/exec-stream/" + id + "/logs")
	mid := rawTranscript(t, first)
	second := a.dial("/exec-stream/" + id + "/logs")
	after := rawTranscript(t, second)
	want := "line-1\nline-2\nline-3\n[process exited with code 0]\n"
	if mid != want || after != want {
		t.Errorf("first attach %q, second %q; want both %q", mid, after, want)
	}
	// The plain HTTP shape gives the same bytes.
	resp, err := http.Get(a.srv.URL + "/exec-stream/" + id + "/logs?follow=0")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != want {
		t.Errorf("plain HTTP %q", body)
	}
}

func TestKilnV1Frames(t *testing.T) {
	a := newAgent(t)
	id := a.start(api.ExecRequest{Command: "sh", Args: []string{"-c", "printf 'out1\\n'; printf 'err1\\n' >&2; printf 'out2'; exit 7"}})
	a.wait(id)
	// read holds the whole connection to the kiln.v1 contract: offsets,
	// gaps, seqs rising, the ends, the exit last.
	read := func(from map[string]int64) *apitest.Checker {
		t.Helper()
		c := a.dial("/exec-stream/"+id+"/logs?"+apitest.Query(from), api.ProtocolV1)
		if c.Subprotocol() != api.ProtocolV1 {
			t.Fatalf("subprotocol %q", c.Subprotocol())
		}
		w, err := apitest.ReadAll(ctxT(t), c, from)
		if err != nil {
			t.Fatalf("from %v: %v", from, err)
		}
		return w
	}
	// The exit can be known before the output is all read from the
	// pipes (a child may still write): a first watcher, read to the exit,
	// which comes after both ends, makes sure every byte is in before the
	// hello of the next is checked.
	read(nil)
	w := read(nil)
	if out, errs := w.Stream("stdout"), w.Stream("stderr"); string(out.Data) != "out1\nout2" || string(errs.Data) != "err1\n" || out.Lost+errs.Lost != 0 {
		t.Errorf("stdout %q, stderr %q, lost %d and %d", out.Data, errs.Data, out.Lost, errs.Lost)
	}
	if diff := cmp.Diff(map[string]api.HelloSpan{"stdout": {First: 0, Total: 9}, "stderr": {First: 0, Total: 5}}, w.Hello.Streams); diff != "" {
		t.Errorf("hello (-want +got):\n%s", diff)
	}
	ends := map[string]int64{}
	for name, st := range w.Streams {
		ends[name] = st.Total
	}
	if diff := cmp.Diff(map[string]int64{"stdout": 9, "stderr": 5}, ends); diff != "" {
		t.Errorf("ends (-want +got):\n%s", diff)
	}
	if w.Exit.String() != "process exited with code 7" {
		t.Errorf("exit %v", w.Exit)
	}
	// Resuming from offsets gives exactly what follows them: one frame.
	w = read(map[string]int64{"stdout": 5, "stderr": 5})
	if out, errs := w.Stream("stdout"), w.Stream("stderr"); out.Frames != 1 || string(out.Data) != "out2" || errs.Frames != 0 || out.Lost+errs.Lost != 0 {
		t.Errorf("resumed from stdout=5&stderr=5: stdout %+v, stderr %+v; want one frame of stdout at 5, \"out2\"", out, errs)
	}
}

func TestFiniteExec(t *testing.T) {
	a := newAgent(t)
	var res api.ExecResult
	if code := a.call("POST", "/exec", api.ExecRequest{Command: "sh", Args: []string{"-c", "echo out; echo err >&2; exit 3"}}, &res); code != 200 {
		t.Fatalf("status %d", code)
	}
	if res.ExitCode == nil || *res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" || res.Truncated {
		t.Errorf("result %+v", res)
	}
	res = api.ExecResult{}
	a.call("POST", "/exec", api.ExecRequest{Command: "head", Args: []string{"-c", "100000", "/dev/zero"}, MaxOutputBytes: 10}, &res)
	if !res.Truncated || len(res.Stdout) != 10 || res.StdoutBytes != 100000 {
		t.Errorf("truncated result: truncated %v, %d bytes kept, total %d", res.Truncated, len(res.Stdout), res.StdoutBytes)
	}
	res = api.ExecResult{}
	a.call("POST", "/exec", api.ExecRequest{Command: "printf", Args: []string{"a\\377b"}}, &res)
	if b, _ := base64.StdEncoding.DecodeString(res.StdoutBase64); string(b) != "a\xffb" {
		t.Errorf("non-UTF-8 output: text %q, base64 %q", res.Stdout, res.StdoutBase64)
	}
	res = api.ExecResult{}
	a.call("POST", "/exec", api.ExecRequest{Command: "sleep", Args: []string{"1000"}, TimeoutMS: 50}, &res)
	if !res.TimedOut || res.Signal != "KILL" {
		t.Errorf("timeout result %+v", res)
	}
}

func TestStdinSignalAndWait(t *testing.T) {
	a := newAgent(t)
	id := a.start(api.ExecRequest{Command: "cat", Stdin: api.StdinPipe})
	var acc api.StdinAccepted
	if code := a.call("POST", "/exec-stream/"+id+"/stdin?offset=0", "hello ", &acc); code != 200 || acc.Accepted != 6 {
		t.Fatalf("stdin: %d, %+v", code, acc)
	}
	// A retry of the same write is applied once.
	a.call("POST", "/exec-stream/"+id+"/stdin?offset=0", "hello ", &acc)
	a.call("POST", "/exec-stream/"+id+"/stdin", "world\n", &acc)
	if acc.Accepted != 12 {
		t.Errorf("accepted %d, want 12", acc.Accepted)
	}
	if code := a.call("POST", "/exec-stream/"+id+"/stdin/close", nil, nil); code != 204 {
		t.Errorf("close: %d", code)
	}
	if e := a.wait(id); e.ExitCode == nil || *e.ExitCode != 0 {
		t.Errorf("exit %+v", e)
	}
	resp, err := http.Get(a.srv.URL + "/exec-stream/" + id + "/logs")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello world\n[process exited with code 0]\n" {
		t.Errorf("logs %q", body)
	}

	id = a.start(api.ExecRequest{Command: "sleep", Args: []string{"1000"}})
	if code := a.call("POST", "/exec-stream/"+id+"/signal", api.SignalRequest{Signal: "TERM"}, nil); code != 204 {
		t.Fatalf("signal: %d", code)
	}
	// The shell's and Docker's convention: 128 plus the signal's number.
	if e := a.wait(id); e.Signal != "TERM" || e.ExitCode == nil || *e.ExitCode != 128+15 {
		t.Errorf("exit %+v, want TERM and code 143", e)
	}
	var p api.Process
	a.call("GET", "/exec-stream/"+id, nil, &p)
	if p.State != api.StateExited || p.Signal != "TERM" || p.Command != "sleep" {
		t.Errorf("status %+v", p)
	}
	var list []api.Process
	a.call("GET", "/exec-stream", nil, &list)
	if len(list) != 2 {
		t.Errorf("list has %d processes, want 2", len(list))
	}
}

func TestWebSocketStdin(t *testing.T) {
	a := newAgent(t)
	id := a.start(api.ExecRequest{Command: "cat", Stdin: api.StdinPipe})
	c := a.dial("/exec-stream/"+id+"/logs?stdin=1", api.ProtocolV1)
	ctx := ctxT(t)
	if err := c.Write(ctx, websocket.MessageBinary, []byte("over the socket\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"stdin_close"}`)); err != nil {
		t.Fatal(err)
	}
	w := &apitest.Checker{Keep: true}
	if err := w.Read(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got := w.Stream("stdout").Data; string(got) != "over the socket\n" || w.Exit.ExitCode == nil || *w.Exit.ExitCode != 0 {
		t.Errorf("echoed %q, exit %v", got, w.Exit)
	}
}

func TestCaptureThroughTheAPI(t *testing.T) {
	a := newAgent(t)
	id := a.start(api.ExecRequest{Command: "sh", Args: []string{"-c", "echo kept; echo also >&2"}, Capture: true})
	// The run's end record is written by the drain, which Done follows.
	p, err := a.table.Process(id)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-ctxT(t).Done():
		t.Fatal("the process did not finish")
	}
	d, err := capture.OpenDir(a.logs + "/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l, err := capture.ReadLog(ctxT(t), d, capture.Filter{Tail: -1})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range l.Entries {
		got[e.Stream.String()] += string(e.Payload())
	}
	if diff := cmp.Diff(map[string]string{"stdout": "kept\n", "stderr": "also\n"}, got); diff != "" || l.Runs[0].State != capture.Lossless {
		t.Errorf("captured (-want +got):\n%s\nruns %+v", diff, l.Runs)
	}
}

func TestBadRequests(t *testing.T) {
	a := newAgent(t)
	id := a.start(api.ExecRequest{Command: "sleep", Args: []string{"1000"}})
	defer a.call("DELETE", "/exec-stream/"+id, nil, nil)
	big := strings.Repeat("x", api.MaxBody+1)
	cases := []struct {
		method, path string
		body         any
		want         int
	}{
		{"GET", "/exec-stream/01a22779-5cfd-7451-9354-2e19949d5c7f", nil, 404},
		{"GET", "/exec-stream/not-an-id", nil, 404},
		{"GET", "/exec-stream/..%2f..%2fetc", nil, 404},
		{"GET", "/no/such/route", nil, 404},
		{"POST", "/exec-stream", `{"command":`, 400},
		{"POST", "/exec-stream", `{"command":"true"} trailing`, 400},
		{"POST", "/exec-stream", `{"command":"true","unknown":1}`, 400},
		{"POST", "/exec-stream", `{}`, 400},
		{"POST", "/exec-stream", `{"command":"/no/such/program"}`, 400},
		{"POST", "/exec-stream", `{"command":"true","stdin":"maybe"}`, 400},
		{"POST", "/exec-stream", `{"command":"true","tty":{"cols":0,"rows":5}}`, 400},
		{"POST", "/exec-stream", `{"command":"true","args":["a\u0000b"]}`, 400},
		{"POST", "/exec-stream", `{"command":"true","env":{"A=B":"c"}}`, 400},
		{"POST", "/exec-stream", `{"command":"` + big + `"}`, 413},
		{"POST", "/exec-stream", api.ExecRequest{Command: "true", Args: make([]string, api.MaxArgs)}, 413},
		{"POST", "/exec", `{"command":"true","max_output_bytes":99999999}`, 400},
		{"POST", "/exec-stream/" + id + "/signal", `{"signal":"NOPE"}`, 400},
		{"POST", "/exec-stream/" + id + "/signal", `{"signal":"99"}`, 400},
		{"POST", "/exec-stream/" + id + "/stdin", "x", 400}, // no stdin pipe
		{"POST", "/exec-stream/" + id + "/resize", `{"cols":80,"rows":24}`, 400},
		{"GET", "/exec-stream/" + id + "/logs?stdout=99999", nil, 416},
		{"GET", "/exec-stream/" + id + "/logs?stdout=-1", nil, 400},
		{"GET", "/exec-stream/" + id + "/logs?follow=perhaps", nil, 400},
	}
	for _, tc := range cases {
		if got := a.call(tc.method, tc.path, tc.body, nil); got != tc.want {
			t.Errorf("%s %s: status %d, want %d", tc.method, tc.path, got, tc.want)
		}
	}
	pipe := a.start(api.ExecRequest{Command: "sleep", Args: []string{"1000"}, Stdin: api.StdinPipe})
	defer a.call("DELETE", "/exec-stream/"+pipe, nil, nil)
	if got := a.call("POST", "/exec-stream/"+pipe+"/stdin", bytes.Repeat([]byte("y"), api.MaxStdin+1), nil); got != 413 {
		t.Errorf("oversized stdin: %d", got)
	}
	if got := a.call("POST", "/exec-stream/"+pipe+"/stdin?offset=5", "hole", nil); got != 400 {
		t.Errorf("stdin leaving a hole: %d", got)
	}
}

// TestWatcherOfACapturedProcessGetsEverything: a kiln.v1 watcher of a
// captured process whose output outran its ring, from the start and from
// the middle, gets every byte, held to the stream contract: what the ring
// dropped comes from the captured log, its frames in order and without
// overlapping the ring's in the process's output.
func TestWatcherOfACapturedProcessGetsEverything(t *testing.T) {
	a := newAgent(t)
	var want [2]strings.Builder
	for i := range 60000 {
		fmt.Fprintf(&want[0], "line %d of a build that prints one short line at a time\n", i)
		if i%7 == 0 {
			fmt.Fprintf(&want[1], "warning %d\n", i)
		}
	}
	script := `i=0; while [ $i -lt 60000 ]; do echo "line $i of a build that prints one short line at a time"; ` +
		`[ $((i % 7)) -eq 0 ] && echo "warning $i" >&2; i=$((i+1)); done; exit 0`
	var st api.Started
	a.call("POST", "/exec-stream", api.ExecRequest{Command: "sh", Args: []string{"-c", script}, Capture: true}, &st)
	a.call("GET", "/exec-stream/"+st.ID+"/wait", nil, nil)
	for _, from := range []map[string]int64{nil, {"stdout": int64(want[0].Len() / 3), "stderr": int64(want[1].Len() / 2)}} {
		path := "/exec-stream/" + st.ID + "/logs"
		if from != nil {
			path += "?stdout=" + strconv.FormatInt(from["stdout"], 10) + "&stderr=" + strconv.FormatInt(from["stderr"], 10)
		}
		c := a.dial(path, api.ProtocolV1)
		chk := &apitest.Checker{From: from, Keep: true, NoGaps: true}
		if err := chk.Read(ctxT(t), c); err != nil {
			t.Fatalf("from %v: %v", from, err)
		}
		for i, name := range []string{"stdout", "stderr"} {
			if got := string(chk.Stream(name).Data); got != want[i].String()[from[name]:] {
				t.Errorf("from %v: %s %d bytes of %d", from, name, len(got), want[i].Len()-int(from[name]))
			}
		}
		if h := chk.Hello.Streams["stdout"]; h.First != 0 {
			t.Errorf("hello says stdout is kept from %d, the log has it from 0", h.First)
		}
	}
}

// A connection's messages start small and grow: a link that breaks after a
// few tens of KiB, every time, still brings whole messages, and a client
// that resumes from where it got reaches the end, every byte once.
func TestMessagesStartSmall(t *testing.T) {
	a := newAgent(t)
	const total = 1 << 20
	// One write of 1 MiB: the ring holds it in chunks of up to 256 KiB.
	id := a.start(api.ExecRequest{Command: "sh", Args: []string{"-c", "dd if=/dev/zero bs=1048576 count=1 status=none | tr '\\0' x"}})
	a.wait(id)

	// The first connection, read whole: sizes from firstMessage, each at
	// most twice the one before, none over maxMerged.
	var sizes []int
	w := &apitest.Checker{NoGaps: true, Check: func(_ string, _ int64, data []byte) error {
		sizes = append(sizes, len(data))
		return nil
	}}
	if err := w.Read(ctxT(t), a.dial("/exec-stream/"+id+"/logs", api.ProtocolV1)); err != nil {
		t.Fatal(err)
	}
	if got := w.Stream("stdout").Delivered; got != total {
		t.Fatalf("delivered %d bytes, want %d", got, total)
	}
	limit := firstMessage
	for i, n := range sizes {
		if n > limit {
			t.Fatalf("message %d carries %d bytes, over %d (sizes %v)", i, n, limit, sizes)
		}
		if 2*n >= limit {
			limit = min(2*limit, maxMerged)
		}
	}
	// A merge stops before a chunk that would take it past the limit, so
	// a message at the top limit may carry a little less than it: one
	// past half of it shows the limit reached.
	if limit != maxMerged || slices.Max(sizes) <= maxMerged/2 {
		t.Errorf("sizes %v: want them to grow to %d", sizes, maxMerged)
	}

	// Connections cut after 40 KiB of output each: the first message of
	// each gets through, and resuming from it goes on.
	const budget = 40 << 10
	from := map[string]int64{}
	var got []byte
	for conns := 1; ; conns++ {
		if conns > total/firstMessage+1 {
			t.Fatalf("%d connections and at %v: no progress", conns, from)
		}
		w := &apitest.Checker{From: maps.Clone(from), NoGaps: true, Keep: true}
		c := a.dial("/exec-stream/"+id+"/logs?"+apitest.Query(from), api.ProtocolV1)
		var carried int
		for {
			before := w.Stream("stdout")
			var at int64
			if before != nil {
				at = before.Next
			}
			kind, err := w.Next(ctxT(t), c)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if kind != apitest.TypeFrame {
				continue
			}
			st := w.Stream("stdout")
			if carried += int(st.Next - at); carried > budget {
				// This message was cut on its way: it did not arrive.
				st.Data = st.Data[:len(st.Data)-int(st.Next-at)]
				st.Next = at
				break
			}
		}
		c.CloseNow()
		st := w.Stream("stdout")
		if st.Next == from["stdout"] && w.Exit == nil {
			t.Fatalf("connection %d from %v brought nothing", conns, from)
		}
		got = append(got, st.Data...)
		from["stdout"] = st.Next
		if w.Exit != nil {
			break
		}
	}
	if len(got) != total || strings.Trim(string(got), "x") != "" {
		t.Errorf("got %d bytes, want %d of x", len(got), total)
	}
}

// TestBatchedMessagesWaitForNothing: a watcher behind on two streams that
// interleave (whose chunks are never merged) gets their small messages
// written together, every byte in order, and nothing stays in a batch
// while the process waits: the watcher has every line before it answers.
func TestBatchedMessagesWaitForNothing(t *testing.T) {
	a := newAgent(t)
	const lines = 300
	id := a.start(api.ExecRequest{Command: "sh", Stdin: api.StdinPipe, Args: []string{"-c",
		`i=0; while [ $i -lt ` + strconv.Itoa(lines) + ` ]; do echo out-$i; echo err-$i >&2; i=$((i+1)); done; read x; echo "after $x"`}})
	var out, errs strings.Builder
	for i := range lines {
		fmt.Fprintf(&out, "out-%d\n", i)
		fmt.Fprintf(&errs, "err-%d\n", i)
	}
	c := a.dial("/exec-stream/"+id+"/logs?stdin=1", api.ProtocolV1)
	ctx := ctxT(t)
	w := &apitest.Checker{Keep: true}
	for w.Stream("stdout").Delivered < int64(out.Len()) || w.Stream("stderr").Delivered < int64(errs.Len()) {
		if _, err := w.Next(ctx, c); err != nil {
			t.Fatalf("before the process is answered: %v", err)
		}
	}
	if err := c.Write(ctx, websocket.MessageBinary, []byte("now\n")); err != nil {
		t.Fatal(err)
	}
	if err := w.Read(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got := string(w.Stream("stdout").Data); got != out.String()+"after now\n" {
		t.Errorf("stdout %q", got)
	}
	if got := string(w.Stream("stderr").Data); got != errs.String() {
		t.Errorf("stderr %q", got)
	}
}
