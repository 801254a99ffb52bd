package outexport_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/natstest"
	"github.com/sandkiln/sandkiln/internal/outexport"
)

// kilndSource is the Source kilnd will be, here through a real kilnd's
// own API: a process's output is its GET …/exec-stream/{pid}/logs, which
// kilnd relays from the sandbox's agent, in kiln.v1 and flow=drop (the
// default).
type kilndSource struct{ hc *http.Client }

func (k kilndSource) Open(ctx context.Context, sandbox, process string, from outexport.Offsets) (outexport.Conn, error) {
	q := url.Values{}
	for s, off := range from {
		q.Set(s, strconv.FormatInt(off, 10))
	}
	c, resp, err := websocket.Dial(ctx, "ws://kilnd/sandboxes/"+url.PathEscape(sandbox)+"/exec-stream/"+url.PathEscape(process)+"/logs?"+q.Encode(),
		&websocket.DialOptions{HTTPClient: k.hc, Subprotocols: []string{api.ProtocolV1}})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		}
		return nil, err
	}
	c.SetReadLimit(api.FrameHeader + 1<<20)
	return c, nil
}

// testKilnd is a kilnd of the test's and an HTTP client of its socket.
type testKilnd struct {
	hc *http.Client
}

func startKilnd(t *testing.T) *testKilnd {
	t.Helper()
	k := daemontest.StartT(t, "")
	sock := filepath.Join(k.State, daemon.SocketName)
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &testKilnd{hc: &http.Client{Transport: tr}}
}

// call sends a JSON request to kilnd and decodes its JSON answer.
func (k *testKilnd) call(ctx context.Context, t *testing.T, method, path string, in, out any) {
	t.Helper()
	var body bytes.Buffer
	if in != nil {
		json.NewEncoder(&body).Encode(in)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://kilnd"+path, &body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := k.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e api.Error
		json.NewDecoder(resp.Body).Decode(&e)
		t.Fatalf("%s %s: %s: %+v", method, path, resp.Status, e.Error)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
}

// sandbox creates a sandbox whose captured logs hold 256 MiB.
func (k *testKilnd) sandbox(ctx context.Context, t *testing.T) string {
	t.Helper()
	var sb api.Sandbox
	k.call(ctx, t, "POST", "/sandboxes", api.CreateSandbox{Logs: &api.LogRotation{MaxSizeBytes: 128 << 20, MaxFiles: 2}}, &sb)
	return sb.ID
}

// start starts sh -c script in sandbox sbx and describes the process.
func (k *testKilnd) start(ctx context.Context, t *testing.T, sbx, script string, capture bool) api.Process {
	t.Helper()
	var st api.Started
	k.call(ctx, t, "POST", "/sandboxes/"+sbx+"/exec-stream", api.ExecRequest{Command: "sh", Args: []string{"-c", script}, Capture: capture}, &st)
	return k.process(ctx, t, sbx, st.ID)
}

func (k *testKilnd) process(ctx context.Context, t *testing.T, sbx, pid string) api.Process {
	t.Helper()
	var p api.Process
	k.call(ctx, t, "GET", "/sandboxes/"+sbx+"/exec-stream/"+pid, nil, &p)
	return p
}

// startPiped starts sh -c script with a stdin pipe.
func (k *testKilnd) startPiped(ctx context.Context, t *testing.T, sbx, script string) api.Process {
	t.Helper()
	var st api.Started
	k.call(ctx, t, "POST", "/sandboxes/"+sbx+"/exec-stream", api.ExecRequest{Command: "sh", Args: []string{"-c", script}, Stdin: api.StdinPipe}, &st)
	return k.process(ctx, t, sbx, st.ID)
}

// stdin writes data to a process's stdin, or closes it (nil).
func (k *testKilnd) stdin(ctx context.Context, t *testing.T, sbx, pid string, data []byte) {
	t.Helper()
	path := "http://kilnd/sandboxes/" + sbx + "/exec-stream/" + pid + "/stdin"
	if data == nil {
		path += "/close"
	}
	req, err := http.NewRequestWithContext(ctx, "POST", path, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := k.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		t.Fatalf("POST %s: %s", path, resp.Status)
	}
}

// seqOutput is what seq 1 n writes, cut at size bytes (0: all).
func seqOutput(n, size int) []byte {
	var b []byte
	for i := 1; i <= n && (size == 0 || len(b) < size); i++ {
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, '\n')
	}
	if size > 0 && len(b) > size {
		b = b[:size]
	}
	return b
}

// wideScript writes size bytes of 100-byte lines, each a number with
// zeros before it: lines long enough that the captured log's records
// (a timestamp and tags each) hold them in not much more room.
func wideScript(size int) string {
	return fmt.Sprintf("seq -f '%%099.0f' 1 %d | head -c %d", size/100+1, size)
}

// wideOutput is what wideScript writes.
func wideOutput(size int) []byte {
	var b []byte
	for i := 1; len(b) < size; i++ {
		b = fmt.Appendf(b, "%099.0f\n", float64(i))
	}
	return b[:size]
}

// A shell loop of short lines on stdout and stderr, exported as it runs
// from a real kilnd, reads back from JetStream equal to what it wrote,
// from the start and from offsets, with its exit code.
func TestKilndShortLines(t *testing.T) {
	ctx := outexport.CtxT(t, 3*time.Minute)
	k := startKilnd(t)
	srv := natstest.Server(t)
	_, js := outexport.Connect(t, srv.ClientURL())
	x := outexport.StartExporter(t, outexport.Config{Node: outexport.Node, Conn: js.Conn(), Source: kilndSource{k.hc}})
	sbx := k.sandbox(ctx, t)
	const n = 20000
	p := k.start(ctx, t, sbx, fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done; exit 3`, n), false)
	if err := x.Follow(sbx, p); err != nil {
		t.Fatal(err)
	}
	var out, errs []byte
	for i := 1; i <= n; i++ {
		out = fmt.Appendf(out, "out %d\n", i)
		errs = fmt.Appendf(errs, "err %d\n", i)
	}
	want := map[string][]byte{"stdout": out, "stderr": errs}
	got := outexport.ReadBack(ctx, t, js, outexport.Node, sbx, p.ID, outexport.ReadOptions{Follow: true}, want)
	outexport.CheckWhole(t, got, want, 3)
	if l := outexport.LostOf(got)["stdout"] + outexport.LostOf(got)["stderr"]; l != 0 {
		t.Errorf("%d bytes lost of %d, less than the ring holds", l, len(out)+len(errs))
	}
	outexport.CheckChain(t, outexport.SubjectMessages(ctx, t, js, outexport.Node, sbx, p.ID))
	for _, from := range []outexport.Offsets{{"stdout": 7}, {"stdout": int64(len(out)) / 2, "stderr": int64(len(errs)) / 3}} {
		got := outexport.ReadBack(ctx, t, js, outexport.Node, sbx, p.ID, outexport.ReadOptions{From: from}, want)
		outexport.CheckWhole(t, got, want, 3)
	}
	t.Logf("stats %+v", x.Stats())
}

// A 64 MiB burst, exported while the process writes it, reads back equal
// to what it wrote: the exporter falls behind the ring, and the agent
// gives it what the ring let go from the captured log. What neither held
// any more when the exporter came for it (the agent's gaps: bytes the
// capture dropped, or still queued for the log when the ring let them
// go) is recorded, exactly, and nothing else is missing.
func TestKilndBurst64MiB(t *testing.T) {
	const size = 64 << 20
	ctx := outexport.CtxT(t, 8*time.Minute)
	k := startKilnd(t)
	srv := natstest.Server(t)
	_, js := outexport.Connect(t, srv.ClientURL())
	x := outexport.StartExporter(t, outexport.Config{Node: outexport.Node, Conn: js.Conn(), Source: kilndSource{k.hc}})
	sbx := k.sandbox(ctx, t)
	want := map[string][]byte{"stdout": wideOutput(size), "stderr": nil}
	began := time.Now()
	p := k.start(ctx, t, sbx, wideScript(size), true)
	x.Follow(sbx, p)
	got := outexport.ReadBack(ctx, t, js, outexport.Node, sbx, p.ID, outexport.ReadOptions{Follow: true}, want)
	exported := time.Since(began)
	outexport.CheckWhole(t, got, want, 0)
	p = k.process(ctx, t, sbx, p.ID)
	dropped := p.Streams["stdout"].CaptureDropped
	outexport.CheckRecordedLoss(t, got, outexport.CheckChain(t, outexport.SubjectMessages(ctx, t, js, outexport.Node, sbx, p.ID)))
	began = time.Now()
	got = outexport.ReadBack(ctx, t, js, outexport.Node, sbx, p.ID, outexport.ReadOptions{}, want)
	replayed := time.Since(began)
	outexport.CheckWhole(t, got, want, 0)
	st := x.Stats()
	t.Logf("64 MiB: exported in %v (%.0f MB/s, from the process's start to its end record read back), replayed in %v (%.0f MB/s); %d messages, %d bytes lost, capture dropped %d",
		exported.Round(time.Millisecond), size/exported.Seconds()/1e6, replayed.Round(time.Millisecond), size/replayed.Seconds()/1e6, st.Messages, st.Lost, dropped)
}

// An exporter stopped (its context cancelled) in the middle of a burst
// and another started in its place resume from the subject's last
// message: every byte once, no hole but the exact gaps the agent
// reported, and the subject one chain.
func TestKilndExporterRestartMidBurst(t *testing.T) {
	const size = 16 << 20
	ctx := outexport.CtxT(t, 5*time.Minute)
	k := startKilnd(t)
	srv := natstest.Server(t)
	_, js := outexport.Connect(t, srv.ClientURL())
	a := outexport.StartExporter(t, outexport.Config{Node: outexport.Node, Conn: js.Conn(), Source: kilndSource{k.hc}})
	sbx := k.sandbox(ctx, t)
	want := map[string][]byte{"stdout": wideOutput(size), "stderr": nil}
	p := k.start(ctx, t, sbx, wideScript(size), true)
	a.Follow(sbx, p)
	outexport.WaitExported(ctx, t, js, outexport.Node, sbx, p.ID, want, map[string]int64{"stdout": 2 << 20})
	a.Close()
	b := outexport.StartExporter(t, outexport.Config{Node: outexport.Node, Conn: js.Conn(), Source: kilndSource{k.hc}})
	b.Follow(sbx, p)
	got := outexport.ReadBack(ctx, t, js, outexport.Node, sbx, p.ID, outexport.ReadOptions{Follow: true}, want)
	outexport.CheckWhole(t, got, want, 0)
	ms := outexport.SubjectMessages(ctx, t, js, outexport.Node, sbx, p.ID)
	outexport.CheckRecordedLoss(t, got, outexport.CheckChain(t, ms))
	writers := map[string]int{}
	for _, m := range ms {
		writers[outexport.WriterOf(m)]++
	}
	if len(writers) != 2 || writers[outexport.ExporterWriter(a)] == 0 || writers[outexport.ExporterWriter(b)] == 0 {
		t.Errorf("messages by writer %v; a %s, b %s", writers, outexport.ExporterWriter(a), outexport.ExporterWriter(b))
	}
	if a.Stats().Fenced+b.Stats().Fenced != 0 {
		t.Errorf("fenced: a %+v, b %+v", a.Stats(), b.Stats())
	}
}

// checkRecordedLoss checks that what a reader lost is what the exporter
// recorded (its gap records, each with a cause): JetStream lost nothing.

// NATS stopped while a process of a real kilnd writes, then started
// again: the export catches up from the ring (and its own read-ahead) or
// records exactly what the ring let go meanwhile.
func TestKilndNATSDownMidRun(t *testing.T) {
	for _, tc := range []struct {
		name  string
		while int // seq's count while NATS is down
	}{
		{"caught up from the ring", 20000}, // 128 KiB
		{"ring evicted", 600000},           // 4.2 MB: more than the ring and the read-ahead
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := outexport.CtxT(t, 3*time.Minute)
			k := startKilnd(t)
			c := natstest.Cluster(t, 1)
			_, js := outexport.Connect(t, c.URLs()...)
			x := outexport.StartExporter(t, outexport.Config{Node: outexport.Node, Conn: js.Conn(), Source: kilndSource{k.hc}})
			sbx := k.sandbox(ctx, t)
			// Each line of input is a count; the process writes seq of it.
			p := k.startPiped(ctx, t, sbx, `while read n; do seq "$n"; done; exit 4`)
			x.Follow(sbx, p)
			out := seqOutput(1000, 0)
			k.stdin(ctx, t, sbx, p.ID, []byte("1000\n"))
			outexport.WaitExported(ctx, t, js, outexport.Node, sbx, p.ID, map[string][]byte{"stdout": out}, map[string]int64{"stdout": int64(len(out))})
			c.Stop(0)
			before := int64(len(out))
			k.stdin(ctx, t, sbx, p.ID, fmt.Appendf(nil, "%d\n", tc.while))
			out = append(out, seqOutput(tc.while, 0)...)
			// The process has written it all once its output says so.
			waitAgent(ctx, t, k, sbx, p.ID, before, int64(len(out)))
			c.Restart(0)
			k.stdin(ctx, t, sbx, p.ID, []byte("10\n"))
			k.stdin(ctx, t, sbx, p.ID, nil)
			out = append(out, seqOutput(10, 0)...)
			want := map[string][]byte{"stdout": out, "stderr": nil}
			got := outexport.ReadBack(ctx, t, js, outexport.Node, sbx, p.ID, outexport.ReadOptions{Follow: true}, want)
			outexport.CheckWhole(t, got, want, 4)
			outexport.CheckRecordedLoss(t, got, outexport.CheckChain(t, outexport.SubjectMessages(ctx, t, js, outexport.Node, sbx, p.ID)))
			if tc.while == 20000 && outexport.LostOf(got)["stdout"] != 0 {
				t.Errorf("%d bytes lost; the ring held them", outexport.LostOf(got)["stdout"])
			}
			if tc.while == 600000 && outexport.LostOf(got)["stdout"] == 0 {
				t.Error("nothing lost: the test proves nothing")
			}
			state := "lossless"
			if outexport.LostOf(got)["stdout"] != 0 {
				state = "lossy"
			}
			outexport.CheckLogs(ctx, t, js, outexport.Node, sbx, p.ID, state, got)
			t.Logf("lost %d of %d; stats %+v", outexport.LostOf(got)["stdout"], len(out), x.Stats())
		})
	}
}

// waitAgent waits until the process's stdout has total bytes, reading it
// from kilnd itself from offset from, which it has already written (an
// offset past what is written is refused, 416).
func waitAgent(ctx context.Context, t *testing.T, k *testKilnd, sbx, pid string, from, total int64) {
	t.Helper()
	c, err := kilndSource{k.hc}.Open(ctx, sbx, pid, outexport.Offsets{"stdout": from})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for %d bytes: %v", total, err)
		}
		if typ != websocket.MessageBinary {
			continue
		}
		f, err := api.ParseFrame(data)
		if err != nil {
			t.Fatal(err)
		}
		if f.Stream == api.StreamStdout && int64(f.Offset)+int64(len(f.Data)) >= total {
			return
		}
	}
}
