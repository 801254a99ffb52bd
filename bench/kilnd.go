package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
)

// The kilnd section's run counts (config.kilndScale divides them) and
// targets.
const (
	kilndCreates         = 30
	kilndExecs           = 200
	kilndFirstBytes      = 50
	kilndIdle            = 10
	targetExecP50        = 5 * time.Millisecond
	targetWSRatio        = 0.5
	targetIdleSandboxMiB = 10
	targetCreateP50      = 10 * time.Millisecond
	targetImageCreateP50 = 15 * time.Millisecond
	// gVisor sandboxes boot a kernel each: fewer of them.
	gvisorCreates = 10
	gvisorExecs   = 50
	gvisorIdle    = 3
)

type kilndResult struct {
	creates    []time.Duration
	firstExecs []time.Duration // the first exec of `true`, right after its sandbox's create
	// The same, of sandboxes made from an image of three layers (none,
	// and why, if this host cannot build it).
	imageCreates, imageFirstExecs []time.Duration
	imageSkipped                  string
	execs                         []time.Duration
	firstBytes                    []time.Duration
	gvisor                        gvisorFigures
	wsBytes                       int64
	wsReps                        []wsSample
	idle                          idleMemory
	filter                        filterCost
	skipped                       string
}

type wsSample struct {
	raw, ws   time.Duration
	delivered int64 // bytes the WebSocket client received (the rest was reported as gaps)
	// The same dd started with flow block, read by a client holding its
	// output (flow=block, acking as the SDK does): its time, and what it
	// received and was told was lost.
	block          time.Duration
	blockDelivered int64
	blockLost      int64
}

// gvisorFigures are the same figures for sandboxes of the gvisor runtime.
type gvisorFigures struct {
	creates, firstExecs, execs []time.Duration
	idle                       idleMemory
	skipped                    string // why there are none
}

type idleMemory struct {
	n             int
	agentPSS      int64 // summed over the agents and their spawners
	kilndHeap     int64 // kilnd's heap growth
	perSandboxMiB float64
}

// client talks to an in-process kilnd over its unix socket.
type client struct {
	http *http.Client
	sock string
	// ws, when set, is an agent's socket, which wsRun dials its
	// WebSocket to instead of kilnd (see agentClient).
	ws *http.Client
}

func (c client) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://kilnd"+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// measureKilnd runs a kilnd in this process (its agents are this binary
// re-executed) and measures it through its API.
// Long because a benchmark reads best as its steps in the order they run.
func measureKilnd(ctx context.Context, cfg config) (*kilndResult, error) {
	res := &kilndResult{wsBytes: cfg.wsSize}
	scale := max(1, cfg.kilndScale)
	creates, execs, firstBytes, idle := kilndCreates/scale, kilndExecs/scale, kilndFirstBytes/scale, max(1, kilndIdle/scale)
	if os.Geteuid() != 0 {
		res.skipped = "kilnd needs root"
		return res, nil
	}
	state, err := os.MkdirTemp("", "sandkiln-bench-kilnd-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(state)
	k, c, err := startKilnd(state)
	if err != nil {
		return nil, err
	}
	defer k.Close()
	defer c.http.CloseIdleConnections()

	// Create to ready: the API answers once the agent does.
	if res.creates, res.firstExecs, err = createCycles(ctx, c, creates, map[string]any{}); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.progress, "kilnd: create to ready, %d sandboxes: p50 %v\n", len(res.creates), pct(res.creates, 50))
	if res.imageSkipped, err = importBenchImage(ctx, c); err != nil {
		return nil, err
	}
	if res.imageSkipped == "" {
		if res.imageCreates, res.imageFirstExecs, err = createCycles(ctx, c, creates, map[string]any{"image": benchImage}); err != nil {
			return nil, err
		}
		fmt.Fprintf(cfg.progress, "kilnd: create to ready from an image of 3 layers, %d sandboxes: p50 %v\n", len(res.imageCreates), pct(res.imageCreates, 50))
	}

	var sb daemon.Info
	if err := c.call(ctx, "POST", "/sandboxes", map[string]any{}, &sb); err != nil {
		return nil, err
	}
	if res.execs, err = execTrues(ctx, c, sb.ID, execs); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.progress, "kilnd: exec of true, %d runs: p50 %v\n", len(res.execs), pct(res.execs, 50))

	wsURL := func(pid string) string {
		return "ws://kilnd/sandboxes/" + sb.ID + "/exec-stream/" + pid + "/logs"
	}
	dialOpts := &websocket.DialOptions{HTTPClient: c.http, Subprotocols: []string{api.ProtocolV1}}
	for i := range firstBytes + 5 {
		start := time.Now()
		var st api.Started
		if err := c.call(ctx, "POST", "/sandboxes/"+sb.ID+"/exec-stream", api.ExecRequest{Command: "echo", Args: []string{"x"}}, &st); err != nil {
			return nil, err
		}
		conn, _, err := websocket.Dial(ctx, wsURL(st.ID), dialOpts)
		if err != nil {
			return nil, err
		}
		for {
			typ, _, err := conn.Read(ctx)
			if err != nil {
				conn.CloseNow()
				return nil, fmt.Errorf("first byte: %w", err)
			}
			if typ == websocket.MessageBinary {
				break
			}
		}
		if i >= 5 {
			res.firstBytes = append(res.firstBytes, time.Since(start))
		}
		conn.CloseNow()
	}
	fmt.Fprintf(cfg.progress, "kilnd: exec-stream start to first byte, %d runs: p50 %v\n", len(res.firstBytes), pct(res.firstBytes, 50))

	// Throughput: the same dd writes cfg.wsSize bytes into a pipe read by
	// a plain loop on the host, and inside the sandbox to a kiln.v1 client.
	count := cfg.wsSize / (64 << 10)
	dd := []string{"if=/dev/zero", "bs=64k", "count=" + strconv.FormatInt(count, 10), "status=none"}
	for rep := range cfg.reps {
		var s wsSample
		if s.raw, err = rawDD(ctx, dd, count<<16); err != nil {
			return nil, err
		}
		if s.ws, s.delivered, _, err = wsRun(ctx, c, sb.ID, api.ExecRequest{Command: "dd", Args: dd}, dialOpts, ""); err != nil {
			return nil, err
		}
		if s.block, s.blockDelivered, s.blockLost, err = wsRun(ctx, c, sb.ID, api.ExecRequest{Command: "dd", Args: dd, Flow: api.FlowBlock}, dialOpts,
			"?flow=block&ack=true"); err != nil {
			return nil, err
		}
		res.wsReps = append(res.wsReps, s)
		fmt.Fprintf(cfg.progress, "kilnd: rep %d/%d: raw pipe %v, kiln.v1 client %v (%.1f%% delivered), flow block %v (%.1f%% delivered, %d lost)\n", rep+1, cfg.reps,
			s.raw.Round(time.Millisecond), s.ws.Round(time.Millisecond), 100*float64(s.delivered)/float64(count<<16),
			s.block.Round(time.Millisecond), 100*float64(s.blockDelivered)/float64(count<<16), s.blockLost)
	}

	// Memory per idle sandbox: the agents' and spawners' proportional set size, and
	// kilnd's heap growth, over a few more sandboxes.
	if res.idle, _, err = idleSandboxes(ctx, c, idle, map[string]any{}); err != nil {
		return nil, err
	}
	if res.gvisor, err = measureGVisor(ctx, cfg, c, scale); err != nil {
		return nil, err
	}
	if res.filter, err = measureFilter(ctx, 5); err != nil {
		return nil, err
	}
	return res, nil
}

// createCycles creates n sandboxes of body one after another (after one
// unmeasured), each followed at once by an exec of `true` and its delete,
// and returns the creates' times and the first execs'.
func createCycles(ctx context.Context, c client, n int, body map[string]any) (creates, firsts []time.Duration, err error) {
	for i := range n + 1 {
		start := time.Now()
		var info daemon.Info
		if err := c.call(ctx, "POST", "/sandboxes", body, &info); err != nil {
			return nil, nil, err
		}
		created := time.Now()
		err := execTrue(ctx, c, info.ID)
		if err == nil && i > 0 {
			creates, firsts = append(creates, created.Sub(start)), append(firsts, time.Since(created))
		}
		if derr := c.call(ctx, "DELETE", "/sandboxes/"+info.ID+"?remove_logs=true", nil, nil); err == nil {
			err = derr
		}
		if err != nil {
			return nil, nil, err
		}
	}
	return creates, firsts, nil
}

// execTrues runs `true` in sandbox id n times (after five unmeasured) and
// returns each exec's time.
func execTrues(ctx context.Context, c client, id string, n int) ([]time.Duration, error) {
	var ds []time.Duration
	for i := range n + 5 {
		start := time.Now()
		if err := execTrue(ctx, c, id); err != nil {
			return nil, err
		}
		if i >= 5 {
			ds = append(ds, time.Since(start))
		}
	}
	return ds, nil
}

// execTrue runs `true` in sandbox id through the batch exec call.
func execTrue(ctx context.Context, c client, id string) error {
	var r api.ExecResult
	if err := c.call(ctx, "POST", "/sandboxes/"+id+"/exec", api.ExecRequest{Command: "true"}, &r); err != nil {
		return err
	}
	if r.ExitCode == nil || *r.ExitCode != 0 {
		return fmt.Errorf("exec true: %+v", r)
	}
	return nil
}

// measureGVisor takes the create, exec and idle figures of gvisor
// sandboxes, if this kilnd has the runtime; a host without it is told in
// the result, not an error.
func measureGVisor(ctx context.Context, cfg config, c client, scale int) (gvisorFigures, error) {
	var g gvisorFigures
	body := map[string]any{"runtime": "gvisor"}
	var probe daemon.Info
	if err := c.call(ctx, "POST", "/sandboxes", body, &probe); err != nil {
		if strings.Contains(err.Error(), "not available on this host") {
			g.skipped = err.Error()
			return g, nil
		}
		return g, fmt.Errorf("gvisor: %w", err)
	}
	if err := c.call(ctx, "DELETE", "/sandboxes/"+probe.ID+"?remove_logs=true", nil, nil); err != nil {
		return g, err
	}
	var err error
	if g.creates, g.firstExecs, err = createCycles(ctx, c, max(1, gvisorCreates/scale), body); err != nil {
		return g, fmt.Errorf("gvisor: %w", err)
	}
	fmt.Fprintf(cfg.progress, "kilnd: gvisor create to ready, %d sandboxes: p50 %v\n", len(g.creates), pct(g.creates, 50))
	var sb daemon.Info
	if err := c.call(ctx, "POST", "/sandboxes", body, &sb); err != nil {
		return g, err
	}
	defer c.call(ctx, "DELETE", "/sandboxes/"+sb.ID+"?remove_logs=true", nil, nil)
	if g.execs, err = execTrues(ctx, c, sb.ID, max(1, gvisorExecs/scale)); err != nil {
		return g, fmt.Errorf("gvisor: %w", err)
	}
	fmt.Fprintf(cfg.progress, "kilnd: gvisor exec of true, %d runs: p50 %v\n", len(g.execs), pct(g.execs, 50))
	var ids []string
	g.idle, ids, err = idleSandboxes(ctx, c, max(1, gvisorIdle/scale), body)
	for _, id := range ids {
		if derr := c.call(ctx, "DELETE", "/sandboxes/"+id+"?remove_logs=true", nil, nil); err == nil {
			err = derr
		}
	}
	return g, err
}

// wsRun starts req in sandbox sb and reads its output with a kiln.v1
// client through kilnd, from the start request to the exit message,
// streaming each frame through as a client that writes the output
// somewhere would; nothing is kept. query (flow=block&ack=true) makes it
// hold the output, acking every 256 KiB it takes, as the SDK does. It
// returns the time, the bytes received and the bytes reported lost.
func wsRun(ctx context.Context, c client, sb string, req api.ExecRequest, opts *websocket.DialOptions, query string) (time.Duration, int64, int64, error) {
	start := time.Now()
	var st api.Started
	base := "/sandboxes/" + sb // kilnd's; with no sandbox, c is an agent's client
	if sb == "" {
		base = ""
	}
	if err := c.call(ctx, "POST", base+"/exec-stream", req, &st); err != nil {
		return 0, 0, 0, err
	}
	url := "ws://kilnd/sandboxes/" + sb + "/exec-stream/" + st.ID + "/logs" + query
	if c.ws != nil {
		o := *opts
		o.HTTPClient = c.ws
		opts = &o
		url = "ws://agent/exec-stream/" + st.ID + "/logs" + query
	}
	conn, _, err := websocket.Dial(ctx, url, opts)
	if err != nil {
		return 0, 0, 0, err
	}
	defer conn.CloseNow()
	var took func(delivered, lost int64) error
	if strings.Contains(query, "ack=true") {
		took = acker(ctx, conn)
	}
	delivered, lost, err := readV1(ctx, conn, took)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("ws throughput: %w", err)
	}
	return time.Since(start), delivered, lost, nil
}

// acker acks what a reader of conn's stdout takes, every 256 KiB, as the
// SDK does: readV1's took.
func acker(ctx context.Context, conn *websocket.Conn) func(delivered, lost int64) error {
	acked := int64(0)
	return func(delivered, lost int64) error {
		if delivered-acked < 256<<10 {
			return nil
		}
		acked = delivered
		ack, _ := json.Marshal(api.ClientMessage{Type: api.TypeAck, Offsets: map[string]int64{"stdout": delivered + lost}})
		return conn.Write(ctx, websocket.MessageText, ack)
	}
}

// readV1 reads a kiln.v1 stream to its exit message, streaming each
// frame through as a client that writes the output somewhere would;
// nothing is kept. took, if set, is called after each binary frame with
// the bytes received so far and those reported lost. It returns them at
// the exit.
func readV1(ctx context.Context, conn *websocket.Conn, took func(delivered, lost int64) error) (delivered, lost int64, err error) {
	conn.SetReadLimit(-1)
	head, buf := make([]byte, api.FrameHeader), make([]byte, 256<<10)
	for {
		typ, r, err := conn.Reader(ctx)
		if err != nil {
			return 0, 0, err
		}
		if typ == websocket.MessageBinary {
			if _, err := io.ReadFull(r, head); err != nil {
				return 0, 0, fmt.Errorf("frame header: %w", err)
			}
			n, err := discard(r, buf)
			if err != nil {
				return 0, 0, err
			}
			delivered += n
			if took != nil {
				if err := took(delivered, lost); err != nil {
					return 0, 0, fmt.Errorf("ack: %w", err)
				}
			}
			continue
		}
		data, err := io.ReadAll(r)
		if err != nil {
			return 0, 0, err
		}
		var m struct {
			Type      string `json:"type"`
			LostBytes int64  `json:"lost_bytes"`
		}
		json.Unmarshal(data, &m)
		switch m.Type {
		case api.TypeGap:
			lost += m.LostBytes
		case api.TypeExit:
			return delivered, lost, nil
		}
	}
}

// rawDD runs dd on the host into a pipe read by a plain loop.
func rawDD(ctx context.Context, args []string, want int64) (time.Duration, error) {
	d, err := drainCommand(exec.CommandContext(ctx, "dd", args...), want)
	if err != nil {
		err = fmt.Errorf("raw dd: %w", err)
	}
	return d, err
}

// drainCommand runs cmd with its stdout into a pipe read by a plain loop
// into nothing, and checks it wrote want bytes; the time is Start to Wait.
func drainCommand(cmd *exec.Cmd, want int64) (time.Duration, error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	n, err := discard(out, make([]byte, 256<<10))
	if werr := cmd.Wait(); err == nil {
		err = werr
	}
	if err == nil && n != want {
		err = fmt.Errorf("read %d bytes, want %d", n, want)
	}
	return time.Since(start), err
}

// discard reads r to its end into buf, a read at a time, and counts the
// bytes. (io.CopyBuffer to io.Discard never uses buf: io.Discard reads
// from r itself, 8 KiB at a time, which would make every reader the
// bench times one of small reads.)
func discard(r io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		m, err := r.Read(buf)
		n += int64(m)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// kilndSandbox runs a kilnd of its own in this process (on TCP too when
// listen is set) on a fresh state directory, with one sandbox; done
// deletes the sandbox and stops kilnd.
func kilndSandbox(ctx context.Context, name, listen string) (c client, sb daemon.Info, done func(), err error) {
	state, err := os.MkdirTemp("", "sandkiln-bench-"+name+"-")
	if err != nil {
		return client{}, sb, nil, err
	}
	k, c, err := startKilndOn(state, listen)
	if err != nil {
		os.RemoveAll(state)
		return client{}, sb, nil, err
	}
	stop := func() {
		c.http.CloseIdleConnections()
		k.Close()
		os.RemoveAll(state)
	}
	if err := c.call(ctx, "POST", "/sandboxes", map[string]any{}, &sb); err != nil {
		stop()
		return client{}, sb, nil, err
	}
	return c, sb, func() {
		c.call(context.WithoutCancel(ctx), "DELETE", "/sandboxes/"+sb.ID+"?remove_logs=true", nil, nil)
		stop()
	}, nil
}

// startKilnd runs a kilnd in this process on state, and a client of its
// unix socket.
func startKilnd(state string) (*daemontest.Kilnd, client, error) {
	return startKilndOn(state, "")
}

// startKilndOn is startKilnd with a TCP listener on listen too.
func startKilndOn(state, listen string) (*daemontest.Kilnd, client, error) {
	return startKilndConfig(daemon.Config{StateDir: state, Listen: listen})
}

// startKilndConfig is startKilnd with more of kilnd's configuration.
func startKilndConfig(cfg daemon.Config) (*daemontest.Kilnd, client, error) {
	k, err := daemontest.StartConfig(cfg)
	if err != nil {
		return nil, client{}, err
	}
	return k, unixClient(filepath.Join(cfg.StateDir, daemon.SocketName)), nil
}

// unixClient calls the kilnd whose API socket is sock.
func unixClient(sock string) client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", sock)
	}, MaxIdleConnsPerHost: 4}
	return client{http: &http.Client{Transport: tr}, sock: sock}
}

// idleSandboxes creates n sandboxes, runs `true` in each, and measures
// what they cost idle: the
// agents' proportional set size, and kilnd's heap growth. It leaves them
// running and returns their ids.
func idleSandboxes(ctx context.Context, c client, n int, body map[string]any) (idleMemory, []string, error) {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var ids []string
	for range n {
		var info daemon.Info
		if err := c.call(ctx, "POST", "/sandboxes", body, &info); err != nil {
			return idleMemory{}, ids, err
		}
		ids = append(ids, info.ID)
		// Idle after it ran something: its spawner is up.
		if err := execTrue(ctx, c, info.ID); err != nil {
			return idleMemory{}, ids, err
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	m := idleMemory{n: n, kilndHeap: int64(after.HeapAlloc) - int64(before.HeapAlloc)}
	for _, id := range ids {
		var info daemon.Info
		if err := c.call(ctx, "GET", "/sandboxes/"+id, nil, &info); err != nil {
			return m, ids, err
		}
		pss, err := pssTree(info.AgentPID)
		if err != nil {
			return m, ids, err
		}
		m.agentPSS += pss
	}
	m.perSandboxMiB = float64(m.agentPSS+max(0, m.kilndHeap)) / float64(n) / (1 << 20)
	return m, ids, nil
}

// pssTree is the proportional set size of a process and its descendants
// (an idle sandbox's agent and its spawner).
func pssTree(pid int) (int64, error) {
	total, err := pssOf(pid)
	if err != nil {
		return 0, err
	}
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			child, _ := strconv.Atoi(f)
			if n, err := pssTree(child); err == nil {
				total += n
			}
		}
	}
	return total, nil
}

// pssOf reads a process's proportional set size.
func pssOf(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no Pss in smaps_rollup")
}

// pct is the p-th percentile (nearest rank).
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

// writeKilnd writes kilnd's section of the report. Long because it is
// the section's tables, row after row, as the report shows them.
func writeKilnd(b *strings.Builder, k *kilndResult) {
	b.WriteString("## kilnd\n\n")
	if k.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s.\n\n", k.skipped)
		return
	}
	b.WriteString("A kilnd in this process, called over its unix socket; sandboxes are the namespace backend with\n" +
		"the host's /usr and /etc, their agents this binary re-executed. Latencies are per operation,\n" +
		"after a few unmeasured ones.\n\n")
	b.WriteString("| figure | p50 | p99 | runs | target | result |\n|---|---:|---:|---:|---|---|\n")
	fmt.Fprintf(b, "| sandbox create to ready (POST /sandboxes answered) | %s | %s | %d | p50 ≤ %s | %s |\n", ms(pct(k.creates, 50)), ms(pct(k.creates, 99)), len(k.creates),
		ms(targetCreateP50), verdict(pct(k.creates, 50) <= targetCreateP50))
	fmt.Fprintf(b, "| its first exec of `true`, at once | %s | %s | %d | | |\n", ms(pct(k.firstExecs, 50)), ms(pct(k.firstExecs, 99)), len(k.firstExecs))
	if k.imageSkipped == "" {
		fmt.Fprintf(b, "| sandbox create to ready from an image of 3 layers (`{\"image\": …}`, pulled) | %s | %s | %d | p50 ≤ %s | %s |\n",
			ms(pct(k.imageCreates, 50)), ms(pct(k.imageCreates, 99)), len(k.imageCreates), ms(targetImageCreateP50), verdict(pct(k.imageCreates, 50) <= targetImageCreateP50))
		fmt.Fprintf(b, "| its first exec of `true`, at once | %s | %s | %d | | |\n", ms(pct(k.imageFirstExecs, 50)), ms(pct(k.imageFirstExecs, 99)), len(k.imageFirstExecs))
	}
	fmt.Fprintf(b, "| batch exec of `true` (POST …/exec) | %s | %s | %d | p50 < %s | %s |\n", ms(pct(k.execs, 50)), ms(pct(k.execs, 99)), len(k.execs),
		ms(targetExecP50), verdict(pct(k.execs, 50) < targetExecP50))
	fmt.Fprintf(b, "| exec-stream start to first byte at a kiln.v1 client | %s | %s | %d | | |\n", ms(pct(k.firstBytes, 50)), ms(pct(k.firstBytes, 99)), len(k.firstBytes))
	if g := k.gvisor; g.skipped == "" {
		fmt.Fprintf(b, "| gvisor: sandbox create to ready | %s | %s | %d | | |\n", ms(pct(g.creates, 50)), ms(pct(g.creates, 99)), len(g.creates))
		fmt.Fprintf(b, "| gvisor: its first exec of `true`, at once | %s | %s | %d | | |\n", ms(pct(g.firstExecs, 50)), ms(pct(g.firstExecs, 99)), len(g.firstExecs))
		fmt.Fprintf(b, "| gvisor: batch exec of `true` | %s | %s | %d | | |\n", ms(pct(g.execs, 50)), ms(pct(g.execs, 99)), len(g.execs))
	}
	b.WriteString("\n")
	b.WriteString("A sandbox answers once its agent does; its spawner, which starts every process, starts meanwhile, and\n" +
		"the first exec waits for it. On a host whose memory, pids and cpu controllers are on cgroup v1 (this one),\n" +
		"the spawner's move into the sandbox's v1 groups waits for an RCU grace period, a few milliseconds when\n" +
		"the host is idle, less when it is busy; on a pure v2 host, processes are born in their group.\n\n")
	if k.imageSkipped != "" {
		fmt.Fprintf(b, "Sandboxes from an image not measured: %s.\n\n", k.imageSkipped)
	} else {
		b.WriteString("A sandbox from an image stacks its layers (each id-mapped into the sandbox's range) under its writable\n" +
			"overlay, instead of binding the host's system directories: nothing is copied per sandbox.\n\n")
	}
	if g := k.gvisor; g.skipped != "" {
		fmt.Fprintf(b, "gvisor sandboxes not measured: %s.\n\n", g.skipped)
	} else {
		fmt.Fprintf(b, "gvisor sandboxes run runsc with the same agent as their init: each boots gVisor's kernel, so its create\n"+
			"includes runsc's own start (`make compare` puts it beside a plain `runsc run`). Memory per idle gvisor\n"+
			"sandbox, over %d: runsc's processes with the agent inside, and kilnd's heap growth, **%.2f MiB**.\n\n",
			g.idle.n, g.idle.perSandboxMiB)
	}
	f := k.filter
	fmt.Fprintf(b, "Every sandboxed process runs under the seccomp filter. Its own cost per system call (median of 5\n"+
		"runs of %d calls each way, the same thread with the filter and without): `getppid`, allowed whatever\n"+
		"its arguments, which the kernel answers from its cache without running the filter, %d ns → %d ns;\n"+
		"`personality(0xffffffff)`, allowed by its argument's value, so the filter runs, %d ns → %d ns.\n\n",
		syscallRuns, f.plain[0].Nanoseconds(), f.filtered[0].Nanoseconds(), f.plain[1].Nanoseconds(), f.filtered[1].Nanoseconds())
	fmt.Fprintf(b, "Throughput: `dd bs=64k` writes %s; **raw pipe** is dd on the host into a pipe read by a plain\n"+
		"loop (Start to Wait); **kiln.v1 client** is the same dd in the sandbox, started through the API and read\n"+
		"by a WebSocket client through kilnd and the agent, from the start request to the exit message. dd is\n"+
		"never slowed down by the client: what the client could not keep up with is reported to it as gaps, so\n"+
		"its figure is the bytes it received per second.\n\n", bytesText(k.wsBytes))
	b.WriteString("**Flow block** is the same dd started with `\"flow\": \"block\"` and read by a client holding its output\n" +
		"(`?flow=block&ack=true`, acking every 256 KiB as the SDK does): dd waits for the client instead of the\n" +
		"client losing bytes, so its figure is the pace of a foreground command's output, all of it.\n\n")
	b.WriteString("| rep | raw pipe GB/s | kiln.v1 client GB/s received | received of the whole | flow block GB/s | received of the whole | lost |\n|---|---:|---:|---:|---:|---:|---:|\n")
	var raws, wss, blocks []float64
	for i, s := range k.wsReps {
		r, w, bl := float64(k.wsBytes)/s.raw.Seconds()/1e9, float64(s.delivered)/s.ws.Seconds()/1e9, float64(s.blockDelivered)/s.block.Seconds()/1e9
		raws, wss, blocks = append(raws, r), append(wss, w), append(blocks, bl)
		fmt.Fprintf(b, "| %d | %.3f | %.3f | %.1f%% | %.3f | %.1f%% | %d |\n", i+1, r, w, 100*float64(s.delivered)/float64(k.wsBytes),
			bl, 100*float64(s.blockDelivered)/float64(k.wsBytes), s.blockLost)
	}
	ratio := median(wss) / median(raws)
	fmt.Fprintf(b, "\n| ratio | of medians | paired | target | result |\n|---|---:|---:|---|---|\n")
	fmt.Fprintf(b, "| kiln.v1 client / raw pipe | %.3f | %.3f | ≥ %.2f | %s |\n", ratio, pairedRatio(wss, raws), targetWSRatio, verdict(ratio >= targetWSRatio))
	fmt.Fprintf(b, "| flow block / raw pipe | %.3f | %.3f | | |\n", median(blocks)/median(raws), pairedRatio(blocks, raws))
	fmt.Fprintf(b, "| flow block / drop (the kiln.v1 client) | %.3f | %.3f | | |\n\n", median(blocks)/median(wss), pairedRatio(blocks, wss))
	lossless := true
	for _, s := range k.wsReps {
		lossless = lossless && s.blockLost == 0 && s.blockDelivered == k.wsBytes
	}
	fmt.Fprintf(b, "Flow block delivered every byte in every rep: %s.\n\n", verdict(lossless))
	fmt.Fprintf(b, "Memory per idle sandbox, over %d sandboxes: agents' and spawners' proportional set size %s each, kilnd's heap\n"+
		"growth %s each: **%.2f MiB** per sandbox (target < %d MiB: %s).\n\n",
		k.idle.n, bytesText(k.idle.agentPSS/int64(k.idle.n)), bytesText(max(0, k.idle.kilndHeap)/int64(k.idle.n)),
		k.idle.perSandboxMiB, targetIdleSandboxMiB, verdict(k.idle.perSandboxMiB < targetIdleSandboxMiB))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// agentClient is c with its WebSockets dialed to sandbox sb's agent
// socket directly, past kilnd's relay (the agent's paths have no
// /sandboxes/{id} prefix). The socket is where kilnd keeps it, in its
// state directory beside its own socket.
func agentClient(c client, sb string) (client, error) {
	sock := filepath.Join(filepath.Dir(c.sock), "sandboxes", sb, "agent.sock")
	if _, err := os.Stat(sock); err != nil {
		return c, fmt.Errorf("agent socket: %w", err)
	}
	c.ws = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", sock)
	}}}
	return c, nil
}
