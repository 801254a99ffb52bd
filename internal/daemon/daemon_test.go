package daemon_test

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
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
	"github.com/sandkiln/sandkiln/internal/pidfd/pidfdtest"
	"github.com/sandkiln/sandkiln/internal/roles"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

func TestMain(m *testing.M) {
	roles.PlayIfReexecuted()
	daemontest.NoRaceExitSleep()
	// Most tests run side by side, each with a kilnd of its own: their
	// sandboxes' host users are kept apart.
	remove, err := daemontest.ShareUIDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if state := os.Getenv(daemonEnv); state != "" {
		os.Exit(serveForever(state, os.Getenv(daemonListenEnv)))
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if err := remove(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = max(code, 1)
		}
		os.Exit(code)
	}))
}

// daemonEnv makes the test binary a kilnd process serving the state
// directory it names, for tests that kill kilnd with SIGKILL.
const (
	daemonEnv       = "SANDKILN_TEST_KILND_STATE"
	daemonListenEnv = "SANDKILN_TEST_KILND_LISTEN"
)

func serveForever(state, listen string) int {
	exe, _ := os.Executable()
	claims, err := daemontest.ClaimsDir(state)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// gVisor's runtime too, where this host has runsc, as in-process
	// kilnds have it (daemontest).
	runsc, _ := exec.LookPath("runsc")
	d, err := daemon.New(daemon.Config{StateDir: state, Listen: listen, Exe: exe, Env: env, ClaimsDir: claims, Runsc: runsc})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Stopped by SIGTERM as kilnd is, closed as kilnd closes: what a
	// runtime shares between its sandboxes (runsc's mounts in the state
	// directory) is released.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err = d.Serve(ctx)
	d.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

var env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root", "LANG=C.UTF-8"}

// kilnd is a daemon serving on a free loopback port and its socket.
type kilnd struct {
	t     *testing.T
	d     *daemon.Daemon
	dk    *daemontest.Kilnd
	state string
	addr  string
	stop  func()
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// start runs a kilnd on state (a new one when empty).
func start(t *testing.T, state string) *kilnd {
	t.Helper()
	return startConfig(t, daemon.Config{StateDir: state})
}

// startConfig is start with more of kilnd's configuration; it chooses the
// state directory (unless set) and the TCP address.
func startConfig(t *testing.T, cfg daemon.Config) *kilnd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	k := &kilnd{t: t, state: cfg.StateDir, addr: freeAddr(t)}
	cfg.Listen = k.addr
	dk, err := daemontest.StartConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dk.LogOnFailure(t)
	k.d, k.dk = dk.Daemon, dk
	k.stop = func() {
		if err := dk.Stop(); err != nil {
			t.Errorf("kilnd: %v", err)
		}
	}
	return k
}

// cleanup deletes every sandbox and stops kilnd.
func (k *kilnd) cleanup() {
	for _, s := range k.d.List() {
		if err := k.d.Delete(s.ID, true); err != nil {
			k.t.Errorf("delete %s: %v", s.ID, err)
		}
	}
	k.stop()
}

func (k *kilnd) do(method, path, token string, body any) (int, []byte) {
	k.t.Helper()
	var rd io.Reader
	if s, ok := body.(string); ok {
		rd = strings.NewReader(s)
	} else if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+k.addr+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		k.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (k *kilnd) json(method, path string, body, out any) {
	k.t.Helper()
	code, b := k.do(method, path, k.d.Token(), body)
	if code >= 300 {
		k.t.Fatalf("%s %s: %d %s", method, path, code, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			k.t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
}

func (k *kilnd) sandbox() string {
	var info daemon.Info
	k.json("POST", "/sandboxes", map[string]any{}, &info)
	return info.ID
}

// logs reads a raw-shape watcher of a process to its close, the token in
// the WebSocket subprotocol.
func (k *kilnd) logs(sb, pid string, protocols ...string) string {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+k.addr+"/sandboxes/"+sb+"/exec-stream/"+pid+"/logs",
		&websocket.DialOptions{Subprotocols: append(protocols, api.TokenProtocolPrefix+k.d.Token())})
	if err != nil {
		k.t.Fatal(err)
	}
	defer c.CloseNow()
	out, err := apitest.ReadRaw(ctx, c)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

// server is kilnd's process API of sandbox sb over TCP, the token in the
// header and the WebSocket subprotocol, as the conformance scenarios
// reach it.
func (k *kilnd) server(sb string) apitest.Server {
	tok := k.d.Token()
	return apitest.Server{
		URL: "http://" + k.addr + "/sandboxes/" + sb,
		Do: func(r *http.Request) (*http.Response, error) {
			r.Header.Set("Authorization", "Bearer "+tok)
			return http.DefaultClient.Do(r)
		},
		Dial: func(ctx context.Context, url string, protocols []string) (*websocket.Conn, *http.Response, error) {
			if len(protocols) == 0 {
				// Offered alone, the token would be the protocol answered
				// (TestTokenProtocolAlone); a client offering none sends a
				// header.
				return websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}}})
			}
			return websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: slices.Concat(protocols, []string{api.TokenProtocolPrefix + tok})})
		},
	}
}

// TestConformance runs the kiln.v1 scenarios through kilnd, relayed to a
// sandbox's agent. The tombstone scenario waits out the agent's default
// grace, beside the others.
func TestConformance(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	apitest.Run(t, k.server(k.sandbox()))
}

// TestSeedCurlExample: the exec-stream document's example through kilnd
// over TCP, the token in the WebSocket subprotocol as a browser sends it.
func TestSeedCurlExample(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", `{"command":"sh","args":["-c","for i in 1 2 3; do echo line-$i; sleep 0.3; done"]}`, &st)
	mid := k.logs(sb, st.ID)
	after := k.logs(sb, st.ID)
	want := "line-1\nline-2\nline-3\n[process exited with code 0]\n"
	if mid != want || after != want {
		t.Errorf("first attach %q, second %q; want %q", mid, after, want)
	}
}

func TestAuthAndOrigin(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	// Each refusal says which it is: no token, or one that is not kilnd's.
	if code, body := k.do("GET", "/sandboxes", "", nil); code != 401 || !strings.Contains(string(body), "a bearer token is required") {
		t.Errorf("no token: %d %s", code, body)
	}
	if code, body := k.do("GET", "/sandboxes", "wrong", nil); code != 401 || !strings.Contains(string(body), "the bearer token is not kilnd's") {
		t.Errorf("wrong token: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", "http://"+k.addr+"/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+k.d.Token())
	req.Header.Set("Origin", "https://evil.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("foreign origin: %d", resp.StatusCode)
	}
	// The unix socket needs no token; its mode keeps others out.
	fi, err := os.Stat(filepath.Join(k.state, daemon.SocketName))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(k.state, daemon.TokenName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("token mode %v, %v", fi.Mode(), err)
	}
	c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", filepath.Join(k.state, daemon.SocketName))
	}}}
	resp, err = c.Get("http://kilnd/sandboxes")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("unix socket: %d", resp.StatusCode)
	}
}

// TestRestartWithoutLoss: kilnd goes away while a process streams; a new
// kilnd on the same state directory adopts the sandbox, and a watcher
// gets every byte and the real exit.
func TestRestartWithoutLoss(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	sb := k.sandbox()
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", `{"command":"sh","args":["-c","for i in 1 2 3 4 5; do echo tick-$i; sleep 0.1; done; exit 4"]}`, &st)
	k.stop()
	k2 := start(t, k.state)
	defer k2.cleanup()
	want := "tick-1\ntick-2\ntick-3\ntick-4\ntick-5\n[process exited with code 4]\n"
	if got := k2.logs(sb, st.ID); got != want {
		t.Errorf("after restart: %q, want %q", got, want)
	}
}

// TestSandboxCannotReachKilnd: from inside, kilnd's port is another
// network's, and its state directory does not exist.
func TestSandboxCannotReachKilnd(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	_, port, _ := net.SplitHostPort(k.addr)
	script := fmt.Sprintf(`python3 -c "import socket; socket.create_connection(('127.0.0.1', %s), timeout=2)" 2>/dev/null && echo reached-port; test -e %s && echo sees-state; exit 0`,
		port, filepath.Join(k.state, daemon.SocketName))
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c", script}}, &res)
	if res.Stdout != "" || res.ExitCode == nil {
		t.Errorf("from inside the sandbox: %q (stderr %q)", res.Stdout, res.Stderr)
	}
}

// TestDeleteKeepsCapturedLogs: deleting a sandbox stops its processes in
// order, so a captured run ends cleanly, and its log stays readable.
func TestDeleteKeepsCapturedLogs(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", `{"command":"sh","args":["-c","echo captured; exec sleep 1000"],"capture":true}`, &st)
	// Wait for the line to be in the engine before deleting.
	for {
		var p api.Process
		k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+st.ID, nil, &p)
		if p.Streams["stdout"].TotalBytes > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if code, b := k.do("DELETE", "/sandboxes/"+sb, k.d.Token(), nil); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	if code, _ := k.do("GET", "/sandboxes/"+sb, k.d.Token(), nil); code != 404 {
		t.Errorf("deleted sandbox: %d", code)
	}
	d, err := capture.OpenDir(filepath.Join(k.state, "sandboxes", sb, sandbox.LogsName, st.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l, err := capture.ReadLog(context.Background(), d, capture.Filter{Tail: -1})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Entries) != 1 || string(l.Entries[0].Payload()) != "captured\n" || len(l.Runs) != 1 || l.Runs[0].State != capture.Lossless {
		t.Errorf("log %+v, runs %+v", l.Entries, l.Runs)
	}
	// The API serves them after the delete, with the run's completeness.
	req, _ := http.NewRequest("GET", "http://"+k.addr+"/sandboxes/"+sb+"/logs/"+st.ID, nil)
	req.Header.Set("Authorization", "Bearer "+k.d.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "captured\n" || resp.Trailer.Get("Kiln-Complete") != "true" ||
		!strings.Contains(resp.Trailer.Get("Kiln-Runs"), `"state":"lossless"`) {
		t.Errorf("GET logs: %d %q, runs %s, complete %s", resp.StatusCode, body, resp.Trailer.Get("Kiln-Runs"), resp.Trailer.Get("Kiln-Complete"))
	}
	var list []daemon.CapturedLog
	k.json("GET", "/sandboxes/"+sb+"/logs", nil, &list)
	if len(list) != 1 || list[0].Process != st.ID || !list[0].Complete {
		t.Errorf("captured logs %+v", list)
	}
}

// TestCapturedLogsFilterAndFollow: stream filter, tail, and a follower
// that gets lines as they are captured.
func TestCapturedLogsFilterAndFollow(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", `{"command":"sh","args":["-c","echo e1 >&2; for i in 1 2 3; do echo o$i; sleep 0.2; done"],"capture":true}`, &st)
	get := func(query string) (int, string) {
		code, b := k.do("GET", "/sandboxes/"+sb+"/logs/"+st.ID+query, k.d.Token(), nil)
		return code, string(b)
	}
	// Following ends with the process, while it runs and after it ended,
	// from the agent and from the log alone.
	follow := func(query string) string {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+k.addr+"/sandboxes/"+sb+"/logs/"+st.ID+"?follow=1&stream=stdout"+query, nil)
		req.Header.Set("Authorization", "Bearer "+k.d.Token())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("follow: %v after %q", err, got)
		}
		return string(got)
	}
	if got := follow("&source=log"); got != "o1\no2\no3\n" {
		t.Errorf("followed %q", got)
	}
	var w api.Exit
	k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+st.ID+"/wait", nil, &w)
	for q, want := range map[string]string{"": "o1\no2\no3\n", "&source=log": "o1\no2\no3\n", "&tail=2": "o2\no3\n"} {
		if got := follow(q); got != want {
			t.Errorf("followed %s after the exit: %q, want %q", q, got, want)
		}
	}
	if code, body := get("?stream=stderr"); code != 200 || body != "e1\n" {
		t.Errorf("stderr: %d %q", code, body)
	}
	if code, body := get("?stream=stdout&tail=2"); code != 200 || body != "o2\no3\n" {
		t.Errorf("tail: %d %q", code, body)
	}
	for _, q := range []string{"?stream=both", "?tail=-1", "?since=yesterday", "?format=xml"} {
		if code, _ := get(q); code != 400 {
			t.Errorf("%s: %d, want 400", q, code)
		}
	}
	if code, _ := k.do("GET", "/sandboxes/"+sb+"/logs/01a22779-5cfd-7451-9354-2e19949d5c7f", k.d.Token(), nil); code != 404 {
		t.Errorf("unknown process: %d", code)
	}
}

func clip(b []byte) []byte {
	if len(b) > 200 {
		return b[:200]
	}
	return b
}

// TestInitCommandEndsTheSandbox: an init command's exit ends the sandbox,
// its exit code becomes the sandbox's, recorded durably, and its output
// is captured. A background child it leaves does not keep the sandbox.
func TestInitCommandEndsTheSandbox(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	var info daemon.Info
	k.json("POST", "/sandboxes", `{"init":{"command":"sh","args":["-c","sleep 1000 & echo booted; exit 5"]}}`, &info)
	for info.State == daemon.StateRunning {
		k.json("GET", "/sandboxes/"+info.ID, nil, &info)
		time.Sleep(5 * time.Millisecond)
	}
	if info.State != daemon.StateStopped || info.Exit == nil || info.Exit.ExitCode == nil || *info.Exit.ExitCode != 5 {
		t.Fatalf("sandbox %+v, want stopped with exit code 5", info)
	}
	var logs []daemon.CapturedLog
	k.json("GET", "/sandboxes/"+info.ID+"/logs", nil, &logs)
	if len(logs) != 1 || !logs[0].Complete {
		t.Fatalf("captured %+v", logs)
	}
	code, body := k.do("GET", "/sandboxes/"+info.ID+"/logs/"+logs[0].Process, k.d.Token(), nil)
	if code != 200 || string(body) != "booted\n" {
		t.Errorf("init output %d %q", code, body)
	}
	// A new kilnd finds it stopped with the same exit.
	k.stop()
	k2 := start(t, k.state)
	defer k2.cleanup()
	var again daemon.Info
	k2.json("GET", "/sandboxes/"+info.ID, nil, &again)
	if again.State != daemon.StateStopped || again.Exit == nil || *again.Exit.ExitCode != 5 {
		t.Errorf("after restart %+v", again)
	}
}

// TestIdleTimeout: a sandbox left alone past its idle timeout is deleted,
// its captured logs kept; one with an open watcher is not idle.
func TestIdleTimeout(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	var info daemon.Info
	k.json("POST", "/sandboxes", `{"idle_timeout_seconds":2}`, &info)
	var st api.Started
	k.json("POST", "/sandboxes/"+info.ID+"/exec-stream", `{"command":"sh","args":["-c","echo kept; sleep 5; echo watched"],"capture":true}`, &st)
	// Watching for 5 s keeps it in use past its 2 s timeout.
	if got := k.logs(info.ID, st.ID); !strings.HasSuffix(got, "watched\n[process exited with code 0]\n") {
		t.Fatalf("watched %q", got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _ := k.do("GET", "/sandboxes/"+info.ID, k.d.Token(), nil)
		if code == 404 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle sandbox was not deleted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	code, body := k.do("GET", "/sandboxes/"+info.ID+"/logs/"+st.ID, k.d.Token(), nil)
	if code != 200 || string(body) != "kept\nwatched\n" {
		t.Errorf("logs after the idle delete: %d %q", code, body)
	}
}

// TestOpenAPIMatchesRoutes holds the OpenAPI document against kilnd: every
// documented operation is served (by kilnd or the agent, not a "no route"
// answer), and every route kilnd has is documented.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	type op struct{ method, path string }
	var ops []op
	var paths []string
	own := map[string]bool{} // paths with servers of their own
	path := ""
	inPaths := false
	for line := range strings.Lines(string(api.OpenAPI)) {
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "paths:":
			inPaths = true
		case inPaths && len(line) > 0 && line[0] != ' ':
			inPaths = false
		case inPaths && strings.HasPrefix(line, "  /") && strings.HasSuffix(line, ":"):
			path = strings.TrimSuffix(strings.TrimSpace(line), ":")
			paths = append(paths, path)
		case inPaths && strings.HasPrefix(line, "    ") && !strings.HasPrefix(line, "     "):
			m := strings.TrimSuffix(strings.TrimSpace(line), ":")
			if m == "get" || m == "post" || m == "delete" || m == "put" {
				ops = append(ops, op{strings.ToUpper(m), path})
			}
			if m == "servers" {
				own[path] = true // not kilnd's API host: a preview's (TestPreviewHosts)
			}
		}
	}
	if len(ops) < 15 {
		t.Fatalf("found %d operations in the document", len(ops))
	}
	for _, o := range ops {
		p := strings.ReplaceAll(o.path, "{id}", sb)
		if o.path == "/events" {
			p += "?follow=false" // else it streams until the reader goes
		}
		p = strings.ReplaceAll(p, "{pid}", "01a22779-5cfd-7451-9354-2e19949d5c7f")
		if o.method == "DELETE" && o.path == "/sandboxes/{id}" {
			continue // would end the sandbox the rest uses; TestDeleteKeepsCapturedLogs covers it
		}
		if own[o.path] {
			continue
		}
		code, body := k.do(o.method, p, k.d.Token(), "{}")
		if code == 405 || strings.Contains(string(body), "no route") {
			t.Errorf("%s %s is documented but not served: %d %s", o.method, o.path, code, clip(body))
		}
	}
	for _, rt := range daemon.Routes {
		documented := false
		pattern := strings.ReplaceAll(strings.ReplaceAll(rt.Pattern, "...}", "}"), "{$}", "") // {name...} is a path's {name}; /{$} the root alone
		for _, p := range paths {
			if p == pattern || strings.HasSuffix(pattern, "/") && strings.HasPrefix(p, pattern) {
				documented = true
			}
		}
		if !documented {
			t.Errorf("route %s %s is not in the OpenAPI document", rt.Method, rt.Pattern)
		}
	}
	// Three run: the one made first, POST /sandboxes's and POST …/fork's.
	code, body := k.do("GET", "/metrics", k.d.Token(), nil)
	if code != 200 || !strings.Contains(string(body), `kilnd_sandboxes{state="running"} 3`) || !strings.Contains(string(body), "kilnd_api_request_duration_seconds_count") {
		t.Errorf("metrics: %d\n%s", code, grepLines(body, "kilnd_"))
	}
	for path, doc := range map[string][]byte{"/openapi.yaml": api.OpenAPI, "/asyncapi.yaml": api.AsyncAPI} {
		if code, body := k.do("GET", path, "", nil); code != 200 || !bytes.Equal(body, doc) {
			t.Errorf("%s without a token: %d, %d bytes, want api's %d", path, code, len(body), len(doc))
		}
	}
}

func grepLines(b []byte, sub string) string {
	var out []string
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "")
}

// external is a kilnd running as a process of its own.
func external(t *testing.T, state, addr string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), daemonEnv+"="+state, daemonListenEnv+"="+addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for {
		c, err := net.Dial("unix", filepath.Join(state, daemon.SocketName))
		if err == nil {
			c.Close()
			return cmd
		}
		time.Sleep(time.Millisecond)
	}
}

// TestKill9MidStream: kilnd killed with SIGKILL while a process streams
// and a watcher reads; a new kilnd adopts the sandbox and a watcher that
// resumes from the offsets it had gets the rest: nothing lost, nothing
// repeated, the real exit code.
func TestKill9MidStream(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	state, addr := t.TempDir(), freeAddr(t)
	first := external(t, state, addr)
	token, err := os.ReadFile(filepath.Join(state, daemon.TokenName))
	if err != nil {
		t.Fatal(err)
	}
	k := &kilnd{t: t, state: state, addr: addr}
	tok := strings.TrimSpace(string(token))
	call := func(method, path, body string, out any) {
		t.Helper()
		code, b := k.do(method, path, tok, body)
		if code >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, code, b)
		}
		if out != nil {
			json.Unmarshal(b, out)
		}
	}
	var info daemon.Info
	call("POST", "/sandboxes", "{}", &info)
	var st api.Started
	call("POST", "/sandboxes/"+info.ID+"/exec-stream", `{"command":"sh","args":["-c","i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo n$i; sleep 0.02; done; exit 9"]}`, &st)
	// Read the first lines through the first kilnd, as kiln.v1 frames.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := "ws://" + addr + "/sandboxes/" + info.ID + "/exec-stream/" + st.ID + "/logs"
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{api.ProtocolV1, api.TokenProtocolPrefix + tok}})
	if err != nil {
		t.Fatal(err)
	}
	// Forty short lines, far less than the ring: neither watcher may be
	// told of a loss, across the restart either.
	w := &apitest.Checker{Keep: true, NoGaps: true}
	for w.Stream("stdout").Delivered < 12 {
		if _, err := w.Next(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	first.Process.Kill()
	first.Wait()
	c.CloseNow()
	second := external(t, state, addr)
	defer func() {
		second.Process.Signal(syscall.SIGTERM)
		second.Wait()
	}()
	defer call("DELETE", "/sandboxes/"+info.ID+"?remove_logs=true", "", nil)
	from := w.Position()
	c, _, err = websocket.Dial(ctx, url+"?"+apitest.Query(from), &websocket.DialOptions{Subprotocols: []string{api.ProtocolV1, api.TokenProtocolPrefix + tok}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	after := &apitest.Checker{From: from, Keep: true, NoGaps: true}
	if err := after.Read(ctx, c); err != nil {
		t.Fatalf("after the restart, from %v: %v", from, err)
	}
	got := slices.Concat(w.Stream("stdout").Data, after.Stream("stdout").Data)
	exit := after.Exit
	var want strings.Builder
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&want, "n%d\n", i)
	}
	if string(got) != want.String() || exit.ExitCode == nil || *exit.ExitCode != 9 {
		t.Errorf("got %q and exit %v", got, exit)
	}
}

// TestManyStreamsManyWatchers: 100 concurrent exec-streams in one sandbox,
// each watched by 10 clients: every watcher gets every byte and the exit.
func TestManyStreamsManyWatchers(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	const streams, watchers = 100, 10
	ids := make([]string, streams)
	for i := range ids {
		var st api.Started
		k.json("POST", "/sandboxes/"+sb+"/exec-stream", fmt.Sprintf(`{"command":"sh","args":["-c","for j in 1 2 3 4 5; do echo s%d-$j; sleep 0.05; done"]}`, i), &st)
		ids[i] = st.ID
	}
	var wg sync.WaitGroup
	errs := make(chan error, streams*watchers)
	for i, id := range ids {
		want := ""
		for j := 1; j <= 5; j++ {
			want += fmt.Sprintf("s%d-%d\n", i, j)
		}
		want += "[process exited with code 0]\n"
		for range watchers {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				c, _, err := websocket.Dial(ctx, "ws://"+k.addr+"/sandboxes/"+sb+"/exec-stream/"+id+"/logs",
					&websocket.DialOptions{Subprotocols: []string{api.TokenProtocolPrefix + k.d.Token()}})
				if err != nil {
					errs <- err
					return
				}
				defer c.CloseNow()
				got, err := apitest.ReadRaw(ctx, c)
				if err != nil {
					errs <- fmt.Errorf("stream %d: %w", i, err)
					return
				}
				if got != want {
					errs <- fmt.Errorf("stream %d: got %q", i, got)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Errorf("%d of %d watchers failed", n, streams*watchers)
	}
}

// TestListAfterAgentDied: once a sandbox's agent is dead, the list says
// the sandbox stopped, whether or not kilnd's watcher of that agent has
// woken yet; the others stay running.
func TestListAfterAgentDied(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	var victim, other daemon.Info
	k.json("POST", "/sandboxes", "{}", &victim)
	k.json("POST", "/sandboxes", "{}", &other)
	listedAfterKill(t, k, victim, other)
}

// TestListAfterAdoptedAgentDied: so too for a sandbox a restarted kilnd
// adopted, whose agent it did not start.
func TestListAfterAdoptedAgentDied(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	var victim, other daemon.Info
	k.json("POST", "/sandboxes", "{}", &victim)
	k.json("POST", "/sandboxes", "{}", &other)
	k.stop()
	k2 := start(t, k.state)
	defer k2.cleanup()
	listedAfterKill(t, k2, victim, other)
}

// listedAfterKill kills victim's agent and, once it has exited, lists the
// sandboxes of k: victim stopped, other running.
func listedAfterKill(t *testing.T, k *kilnd, victim, other daemon.Info) {
	t.Helper()
	agent := pidfdtest.Watch(t, victim.AgentPID)
	if agent == nil {
		t.Fatalf("the agent of %s is gone before its kill", victim.ID)
	}
	agent.Kill()
	if !agent.Exited(time.Minute) {
		t.Fatalf("the agent of %s runs a minute after its kill", victim.ID)
	}
	var list []daemon.Info
	k.json("GET", "/sandboxes", nil, &list)
	states := map[string]string{}
	for _, s := range list {
		states[s.ID] = s.State
	}
	want := map[string]string{victim.ID: daemon.StateStopped, other.ID: daemon.StateRunning}
	if diff := cmp.Diff(want, states); diff != "" {
		t.Errorf("states listed (-want +got):\n%s", diff)
	}
}

// TestAgentKilled: a sandbox whose agent is killed is reported stopped with
// an unknown exit, its cgroups gone, what it captured readable and marked
// interrupted; kilnd and other sandboxes go on.
func TestAgentKilled(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	var victim, other daemon.Info
	k.json("POST", "/sandboxes", "{}", &victim)
	k.json("POST", "/sandboxes", "{}", &other)
	// A captured process runs in the victim, its first line in the log.
	pid := k.faultStart(victim.ID, api.ExecRequest{Command: "sh", Args: []string{"-c", "echo before; exec sleep 1000"}, Capture: true})
	faultAwait(t, "the first line in the captured log", func() bool {
		_, body, _ := k.faultCapturedLog(victim.ID, pid, "")
		return string(body) == "before\n"
	})
	// A follower of the log, served by the agent (its answer begins once
	// the agent is dialled), when the agent dies: its read ends with what
	// the log holds, and trailers that say the run was cut short.
	req, _ := http.NewRequest("GET", "http://"+k.addr+"/sandboxes/"+victim.ID+"/logs/"+pid+"?follow=true", nil)
	req.Header.Set("Authorization", "Bearer "+k.d.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := syscall.Kill(victim.AgentPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	var runs []api.Run
	json.Unmarshal([]byte(resp.Trailer.Get("Kiln-Runs")), &runs)
	if err != nil || resp.StatusCode != 200 || string(body) != "before\n" || len(runs) != 1 || runs[0].State != "interrupted" {
		t.Errorf("the follower of the killed sandbox's log: %d %q (%v), runs %+v; want its line and one interrupted run", resp.StatusCode, body, err, runs)
	}
	deadline := time.Now().Add(30 * time.Second)
	var info daemon.Info
	for {
		k.json("GET", "/sandboxes/"+victim.ID, nil, &info)
		if info.State == daemon.StateStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s", info.State)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if info.Exit != nil || !strings.Contains(info.Reason, "exit unknown") || strings.Count(info.Reason, "exit unknown") != 1 {
		t.Errorf("stopped sandbox %+v", info)
	}
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+other.ID+"/exec", api.ExecRequest{Command: "echo", Args: []string{"fine"}}, &res)
	if res.Stdout != "fine\n" {
		t.Errorf("the other sandbox: %+v", res)
	}
	// Refused for good, saying why: a client does not retry.
	if code, b := k.do("POST", "/sandboxes/"+victim.ID+"/exec", k.d.Token(), `{"command":"true"}`); code != http.StatusPreconditionFailed ||
		!strings.Contains(string(b), "is stopped: the agent exited") {
		t.Errorf("exec in the stopped sandbox: %d %s", code, b)
	}
	// What it captured stays readable, and says how it ended: cut short.
	if code, body, runs := k.faultCapturedLog(victim.ID, pid, ""); code != 200 || string(body) != "before\n" ||
		len(runs) != 1 || runs[0].State != "interrupted" {
		t.Errorf("the killed sandbox's captured log: %d %q, runs %+v; want its line and one interrupted run", code, body, runs)
	}
	for {
		matches, _ := filepath.Glob("/sys/fs/cgroup/unified/*/kiln-" + victim.ID)
		direct, _ := filepath.Glob("/sys/fs/cgroup/unified/kiln-" + victim.ID)
		if len(matches)+len(direct) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cgroups left: %v %v", matches, direct)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestUnrecordedSandboxIsEnded: a sandbox whose record was never written
// (kilnd died during the create) is ended by the next kilnd, not left
// running unreachable.
func TestUnrecordedSandboxIsEnded(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	var info daemon.Info
	k.json("POST", "/sandboxes", "{}", &info)
	agent := pidfdtest.Watch(t, info.AgentPID)
	k.stop()
	if err := os.Remove(filepath.Join(k.state, "sandboxes", info.ID, "sandbox.json")); err != nil {
		t.Fatal(err)
	}
	k2 := start(t, k.state)
	defer k2.cleanup()
	if _, err := os.Stat(filepath.Join(k.state, "sandboxes", info.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the unrecorded sandbox's directory is still there: %v", err)
	}
	// (A zombie until its parent, this test process, reaps it: exited.)
	if !agent.Exited(10 * time.Second) {
		t.Fatalf("the agent %d of the unrecorded sandbox still runs", info.AgentPID)
	}
}

// TestSandboxesHaveTheirOwnUsers: two sandboxes' roots are different host
// users, so neither can touch the other's files even given a path.
func TestSandboxesHaveTheirOwnUsers(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	owner := func() uint32 {
		var info daemon.Info
		k.json("POST", "/sandboxes", "{}", &info)
		var res api.ExecResult
		k.json("POST", "/sandboxes/"+info.ID+"/exec", api.ExecRequest{Command: "touch", Args: []string{"/workspace/mine"}}, &res)
		// Seen from the host through the agent's root, whether the
		// workspace is on the sandbox's disk or in its directory.
		fi, err := os.Stat(filepath.Join("/proc", strconv.Itoa(info.AgentPID), "root", "workspace", "mine"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Uid
	}
	a, b := owner(), owner()
	if a == b || a < 100000 || b < 100000 {
		t.Errorf("the sandboxes' roots are host users %d and %d", a, b)
	}
}

// TestCapturedLogReadsAsOneSequence: GET …/logs/{pid} of a captured
// process in a running sandbox gives its whole output, from the captured
// log where the process's ring dropped it, then from the ring, then live
// with follow; the log alone (source=log) holds the same, and nothing is
// lost.
func TestCapturedLogReadsAsOneSequence(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	var want strings.Builder
	for i := range 100000 {
		fmt.Fprintf(&want, "line %d of a build that prints one short line at a time\n", i)
	}
	loop := `i=0; while [ $i -lt 100000 ]; do echo "line $i of a build that prints one short line at a time"; i=$((i+1)); done`
	read := func(pid, query string) (string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+k.addr+"/sandboxes/"+sb+"/logs/"+pid+query, nil)
		req.Header.Set("Authorization", "Bearer "+k.d.Token())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET logs%s: %d %v", query, resp.StatusCode, err)
		}
		return string(b), resp.Trailer
	}
	// Still running, its 5.6 MB through a 1 MiB ring: read as it stands.
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Command: "sh", Args: []string{"-c", loop + "; exec sleep 1000"}, Capture: true}, &st)
	faultAwait(t, "the loop's whole output pumped", func() bool {
		var p api.Process
		k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+st.ID, nil, &p)
		return p.Streams["stdout"].TotalBytes == int64(want.Len())
	})
	if got, tr := read(st.ID, ""); got != want.String() || tr.Get("Kiln-Lost") != "{}" {
		t.Errorf("running: %d bytes of %d, equal %v, lost %s", len(got), want.Len(), got == want.String(), tr.Get("Kiln-Lost"))
	}
	// Followed from the start while it runs to its end.
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Command: "sh", Args: []string{"-c", loop}, Capture: true}, &st)
	if got, tr := read(st.ID, "?follow=true"); got != want.String() || tr.Get("Kiln-Lost") != "{}" || tr.Get("Kiln-Complete") != "true" {
		t.Errorf("followed: %d bytes of %d, equal %v, lost %s, complete %s", len(got), want.Len(), got == want.String(), tr.Get("Kiln-Lost"), tr.Get("Kiln-Complete"))
	}
	if got, _ := read(st.ID, "?source=log"); got != want.String() {
		t.Errorf("the log alone: %d bytes of %d", len(got), want.Len())
	}
}

// TestGVisorLifecycle: a sandbox of the gvisor runtime serves the same API
// as a namespace one: processes, their exits and captured logs, adoption
// by a restarted kilnd, and a delete that leaves nothing of it running or
// in runsc's state.
func TestGVisorLifecycle(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	var info daemon.Info
	code, b := k.do("POST", "/sandboxes", k.d.Token(), `{"runtime":"gvisor","limits":{"memory_bytes":536870912}}`)
	if code == http.StatusServiceUnavailable && os.Getenv("CI") == "" {
		k.cleanup()
		t.Skipf("no gVisor here: %s", b)
	}
	if code != http.StatusCreated && code != http.StatusOK || json.Unmarshal(b, &info) != nil {
		k.cleanup()
		t.Fatalf("create: %d %s", code, b)
	}
	if info.Runtime != "gvisor" || info.AgentPID == 0 {
		t.Fatalf("created %+v", info)
	}
	runsc := pidfdtest.Watch(t, info.AgentPID)
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+info.ID+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c", "uname -r; echo oops >&2; exit 3"}}, &res)
	if !strings.Contains(res.Stdout, "gvisor") || res.Stderr != "oops\n" || res.ExitCode == nil || *res.ExitCode != 3 {
		t.Errorf("exec in gVisor: %+v", res)
	}
	var st api.Started
	k.json("POST", "/sandboxes/"+info.ID+"/exec-stream", `{"command":"sh","args":["-c","for i in 1 2 3; do echo tick-$i; done; exit 4"],"capture":true}`, &st)
	k.stop()
	k2 := start(t, k.state)
	want := "tick-1\ntick-2\ntick-3\n[process exited with code 4]\n"
	if got := k2.logs(info.ID, st.ID); got != want {
		t.Errorf("after restart: %q, want %q", got, want)
	}
	var again daemon.Info
	k2.json("GET", "/sandboxes/"+info.ID, nil, &again)
	if again.State != daemon.StateRunning || again.Runtime != "gvisor" || again.AgentPID != info.AgentPID {
		t.Errorf("adopted %+v, created %+v", again, info)
	}
	if code, b := k2.do("DELETE", "/sandboxes/"+info.ID, k2.d.Token(), nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, b)
	}
	if !runsc.Exited(0) {
		t.Errorf("runsc %d still runs after the delete", info.AgentPID)
	}
	if _, err := os.Stat(filepath.Join(k.state, "runsc", "kiln-"+info.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("runsc's state of the container is left: %v", err)
	}
	// The captured log outlives it.
	req, _ := http.NewRequest("GET", "http://"+k2.addr+"/sandboxes/"+info.ID+"/logs/"+st.ID, nil)
	req.Header.Set("Authorization", "Bearer "+k2.d.Token())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "tick-1\ntick-2\ntick-3\n" || resp.Trailer.Get("Kiln-Complete") != "true" {
		t.Errorf("captured log after the delete: %q, complete %q", body, resp.Trailer.Get("Kiln-Complete"))
	}
	k2.cleanup()
}

// TestIdleTimeoutCountsRunningProcesses: a sandbox whose detached
// process runs on is in use, however long no one asks anything of it; once
// the process is gone it is idle, and deleted.
func TestIdleTimeoutCountsRunningProcesses(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	var info daemon.Info
	k.json("POST", "/sandboxes", `{"idle_timeout_seconds":2}`, &info)
	var st api.Started
	k.json("POST", "/sandboxes/"+info.ID+"/exec-stream", `{"command":"sleep","args":["600"]}`, &st)
	state := func() string {
		list, _, _ := k.d.Select(daemon.Selection{Deleted: true})
		for _, s := range list {
			if s.ID == info.ID {
				return s.State
			}
		}
		return "gone"
	}
	// Twice its timeout without a request: the janitor, which looks
	// every second, has looked and found the process running.
	time.Sleep(4 * time.Second)
	if s := state(); s != daemon.StateRunning {
		t.Fatalf("with its process running, the sandbox is %s", s)
	}
	k.json("DELETE", "/sandboxes/"+info.ID+"/exec-stream/"+st.ID, nil, nil)
	deadline := time.Now().Add(30 * time.Second)
	for state() != daemon.StateDeleted {
		if time.Now().After(deadline) {
			t.Fatalf("idle without its process, the sandbox is still %s", state())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTTL: a sandbox past its ttl is deleted, watched or not, saying why.
func TestTTL(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	var info daemon.Info
	// Its ttl counts from when the create began, and the process and its
	// watcher come after the create: 3 s leaves a loaded host time for
	// them.
	k.json("POST", "/sandboxes", `{"ttl_seconds":3,"idle_timeout_seconds":600}`, &info)
	if info.TTLSeconds != 3 {
		t.Errorf("ttl_seconds answered %d", info.TTLSeconds)
	}
	var st api.Started
	k.json("POST", "/sandboxes/"+info.ID+"/exec-stream", `{"command":"sleep","args":["600"]}`, &st)
	// A watcher until the sandbox ends: its logs end when the ttl does.
	k.logs(info.ID, st.ID)
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, _, _ := k.d.Select(daemon.Selection{State: daemon.StateDeleted, Deleted: true})
		var got daemon.Info
		if len(list) == 1 {
			got = list[0]
		}
		if got.ID == info.ID {
			if got.Reason != "its ttl of 3s ended" {
				t.Errorf("deleted, reason %q", got.Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("past its ttl the sandbox is %s", got.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	k.refuses("POST", "/sandboxes", `{"ttl_seconds":-1}`, 400, api.CodeInvalid, "ttl_seconds -1")
}
