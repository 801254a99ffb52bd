package daemon_test

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
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
)

// Hostile input through kilnd's API over TCP: ids that try to leave their
// sandbox, bodies at and over the bounds, bytes that are not UTF-8, tokens
// that are almost right and origins that are not kilnd's. Each answer must
// be a clear refusal (its status and error code) or a faithful handling,
// never a 500 or a hang, nothing may happen on the way, and kilnd must
// serve as before afterwards.

// hostileDeadline bounds every request: one that takes longer is a hang.
const hostileDeadline = 2 * time.Minute

// hostileClient sends requests exactly as written: the target is neither
// cleaned nor escaped again, and redirects are not followed, so each answer
// is kilnd's own.
type hostileClient struct {
	t  *testing.T
	k  *kilnd
	hc *http.Client
}

func newHostileClient(t *testing.T, k *kilnd) *hostileClient {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &hostileClient{t: t, k: k, hc: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

// hostileReply is an answer as it came.
type hostileReply struct {
	code   int
	header http.Header
	body   []byte
}

// send makes one request; target is the request target (path and query)
// as sent on the wire.
func (c *hostileClient) send(method, target string, header http.Header, body string) hostileReply {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.t.Context(), hostileDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.k.addr+"/", strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.URL.Opaque, req.URL.RawQuery, _ = strings.Cut(target, "?")
	for name, vs := range header {
		req.Header[name] = vs
	}
	if h := header.Get("Host"); h != "" {
		req.Host = h // the header itself is not sent from Header
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %.200q: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %.200q: reading the answer: %v", method, target, err)
	}
	return hostileReply{code: resp.StatusCode, header: resp.Header, body: b}
}

// as sends with kilnd's token.
func (c *hostileClient) as(method, target, body string) hostileReply {
	c.t.Helper()
	return c.send(method, target, hostileBearer(c.k.d.Token()), body)
}

func hostileBearer(token string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token}}
}

// hostileRefused checks an answer is the error status with the API's
// error body, its code the one for the status, as valid UTF-8.
func hostileRefused(t *testing.T, what string, r hostileReply, status int) {
	t.Helper()
	want := map[int]string{400: api.CodeInvalid, 401: api.CodeUnauthorized, 403: api.CodeForbidden, 404: api.CodeNotFound, 413: api.CodeTooLarge}[status]
	hostileRefusedWith(t, what, r, status, want)
}

// hostileRefusedWith is hostileRefused with the error code to expect.
func hostileRefusedWith(t *testing.T, what string, r hostileReply, status int, want string) {
	t.Helper()
	var e api.Error
	if r.code != status || json.Unmarshal(r.body, &e) != nil || e.Error.Message == "" {
		t.Errorf("%s: %d %.300q, want %d with an error body", what, r.code, r.body, status)
		return
	}
	if e.Error.Code != want {
		t.Errorf("%s: error code %q, want %q", what, e.Error.Code, want)
	}
	if !utf8.Valid(r.body) || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
		t.Errorf("%s: body %.300q of type %q", what, r.body, r.header.Get("Content-Type"))
	}
	if status == 401 && r.header.Get("WWW-Authenticate") == "" {
		t.Errorf("%s: 401 without WWW-Authenticate", what)
	}
}

// hostileAlive checks kilnd still serves: its health, and a process run to
// its end in sb.
func (c *hostileClient) alive(sb string) {
	c.t.Helper()
	if r := c.send("GET", "/healthz", nil, ""); r.code != 200 {
		c.t.Fatalf("healthz: %d %s", r.code, r.body)
	}
	var res api.ExecResult
	c.k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "echo", Args: []string{"still serving"}}, &res)
	if res.Stdout != "still serving\n" || res.ExitCode == nil || *res.ExitCode != 0 {
		c.t.Fatalf("exec after the hostile requests: %+v", res)
	}
}

// processes lists sb's processes.
func (c *hostileClient) processes(sb string) []api.Process {
	c.t.Helper()
	var list []api.Process
	c.k.json("GET", "/sandboxes/"+sb+"/exec-stream", nil, &list)
	return list
}

// hostileDial opens a WebSocket to kilnd; on a refusal it returns the
// answer's status and body.
func (k *kilnd) hostileDial(target string, header http.Header, protocols ...string) (*websocket.Conn, hostileReply, error) {
	ctx, cancel := context.WithTimeout(k.t.Context(), hostileDeadline)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+k.addr+target, &websocket.DialOptions{HTTPHeader: header, Subprotocols: protocols})
	var r hostileReply
	if resp != nil {
		r.code, r.header = resp.StatusCode, resp.Header
		if resp.Body != nil {
			r.body, _ = io.ReadAll(resp.Body)
		}
	}
	return c, r, err
}

// hostileTranscript reads a raw-shape watcher to its close.
func hostileTranscript(t *testing.T, c *websocket.Conn) string {
	t.Helper()
	defer c.CloseNow()
	ctx, cancel := context.WithTimeout(t.Context(), hostileDeadline)
	defer cancel()
	got, err := apitest.ReadRaw(ctx, c)
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	return got
}

// TestHostileIDs: sandbox and process ids that try to reach another
// sandbox, another process or a file: every one is not found, and the
// process they aim at is untouched.
func TestHostileIDs(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	c := newHostileClient(t, k)
	a, b := k.sandbox(), k.sandbox()
	var st api.Started
	k.json("POST", "/sandboxes/"+a+"/exec-stream", `{"command":"cat","stdin":"pipe","capture":true}`, &st)
	p := st.ID
	long := strings.Repeat("a", 8<<10)
	inA, inB := "/sandboxes/"+a, "/sandboxes/"+b
	for _, tc := range []struct {
		name, method, target, body string
	}{
		{"dot-dot as the sandbox id", "GET", "/sandboxes/%2e%2e", ""},
		{"dot-dot out of /sandboxes", "GET", "/sandboxes/%2e%2e/sandboxes", ""},
		{"dot-dot into another sandbox", "POST", "/sandboxes/..%2F" + b + "/exec", `{"command":"true"}`},
		{"slash in the sandbox id", "GET", "/sandboxes/" + a + "%2Fexec-stream", ""},
		{"NUL as the sandbox id", "GET", "/sandboxes/%00", ""},
		{"NUL after the sandbox id", "GET", "/sandboxes/" + a + "%00/exec-stream", ""},
		{"long sandbox id", "GET", "/sandboxes/" + long, ""},
		{"bidi control before the sandbox id", "GET", "/sandboxes/%E2%80%AE" + a, ""},
		{"non-UTF-8 sandbox id", "GET", "/sandboxes/%FF%FE/exec-stream", ""},
		{"braced sandbox id", "GET", "/sandboxes/%7B" + a + "%7D", ""},
		{"braced sandbox id's logs", "GET", "/sandboxes/%7B" + a + "%7D/logs", ""},
		{"URN sandbox id", "GET", "/sandboxes/urn:uuid:" + a + "/exec-stream", ""},
		{"upper-case sandbox id", "GET", "/sandboxes/" + strings.ToUpper(a), ""},

		// An escaped slash or dot stays inside the process id on the way
		// to the agent; decoded, it made the agent clean the path and
		// redirect, or reach another route (…%2Fwait waited on p).
		{"dot-dot as the process id", "GET", inA + "/exec-stream/%2e%2e", ""},
		{"dot-dot into another sandbox's process", "GET", inA + "/exec-stream/..%2F..%2F..%2Fsandboxes%2F" + b + "%2Fexec-stream", ""},
		{"slash in the process id", "GET", inA + "/exec-stream/" + p + "%2Fwait", ""},
		{"slash in the process id, to kill", "DELETE", inA + "/exec-stream/" + p + "%2Fstdin", ""},
		{"NUL as the process id", "GET", inA + "/exec-stream/%00", ""},
		{"NUL after the process id", "POST", inA + "/exec-stream/" + p + "%00/signal", `{"signal":"KILL"}`},
		{"long process id", "GET", inA + "/exec-stream/" + long, ""},
		{"non-ASCII digit in the process id", "GET", inA + "/exec-stream/" + p[:35] + "%D9%A7", ""},
		{"braced process id", "POST", inA + "/exec-stream/%7B" + p + "%7D/stdin/close", ""},

		{"captured log: dot-dot", "GET", inA + "/logs/%2e%2e", ""},
		{"captured log: the token file", "GET", inA + "/logs/..%2F..%2F..%2Ftoken", ""},
		{"captured log: another sandbox's record", "GET", inA + "/logs/..%2F..%2F" + b + "%2Fsandbox.json", ""},
		{"captured log: NUL", "GET", inA + "/logs/%00", ""},
		{"captured log: braced id", "GET", inA + "/logs/%7B" + p + "%7D", ""},
		{"captured log: slashes around the id", "GET", inA + "/logs/%2F" + p + "%2F", ""},
		{"captured log: URN id", "GET", inA + "/logs/urn:uuid:" + p, ""},

		{"another sandbox's process: status", "GET", inB + "/exec-stream/" + p, ""},
		{"another sandbox's process: signal", "POST", inB + "/exec-stream/" + p + "/signal", `{"signal":"KILL"}`},
		{"another sandbox's process: stdin", "POST", inB + "/exec-stream/" + p + "/stdin?offset=0", "injected"},
		{"another sandbox's process: close stdin", "POST", inB + "/exec-stream/" + p + "/stdin/close", ""},
		{"another sandbox's process: resize", "POST", inB + "/exec-stream/" + p + "/resize", `{"cols":80,"rows":24}`},
		{"another sandbox's process: kill", "DELETE", inB + "/exec-stream/" + p, ""},
		{"another sandbox's process: wait", "GET", inB + "/exec-stream/" + p + "/wait", ""},
		{"another sandbox's process: output", "GET", inB + "/exec-stream/" + p + "/logs?follow=0", ""},
		{"another sandbox's process: captured log", "GET", inB + "/logs/" + p, ""},
	} {
		hostileRefused(t, tc.name, c.as(tc.method, tc.target, tc.body), 404)
	}
	if _, r, err := k.hostileDial(inB+"/exec-stream/"+p+"/logs?stdin=1", hostileBearer(k.d.Token())); err == nil || r.code != 404 {
		t.Errorf("watching another sandbox's process: %v, %d %s", err, r.code, r.body)
	}
	// Far past the header limit the HTTP server refuses the request itself.
	if r := c.as("GET", "/sandboxes/"+strings.Repeat("a", 100<<10), ""); r.code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 100 KiB sandbox id: %d %.200q", r.code, r.body)
	}

	var got api.Process
	k.json("GET", inA+"/exec-stream/"+p, nil, &got)
	if got.State != api.StateRunning || got.Stdin == nil || got.Stdin.Accepted != 0 || got.Stdin.Closed {
		t.Errorf("the process aimed at: %+v, stdin %+v", got, got.Stdin)
	}
	if n := len(c.processes(b)); n != 0 {
		t.Errorf("%d processes in the other sandbox", n)
	}
	if n := len(k.d.List()); n != 2 {
		t.Errorf("%d sandboxes, want 2", n)
	}
	c.alive(a)
}

// hostileArgvEnvSize is what api.ExecRequest.Check counts against
// MaxArgvEnv.
func hostileArgvEnvSize(r api.ExecRequest) int {
	n := len(r.Command) + 1 + len(r.Cwd) + 1
	for _, a := range r.Args {
		n += len(a) + 1
	}
	for k, v := range r.Env {
		n += len(k) + len(v) + 2
	}
	return n
}

// hostileAtBounds is an exec request at every bound at once: MaxArgs
// words, MaxEnv variables, MaxArgvEnv bytes. It prints its argument count
// and the number of its variables.
func hostileAtBounds() api.ExecRequest {
	r := api.ExecRequest{Command: "sh", Args: []string{"-c", `echo $#; env | grep -c ^HV`, "sh"}, Env: map[string]string{}}
	for len(r.Args) < api.MaxArgs-1 {
		r.Args = append(r.Args, "x")
	}
	for i := range api.MaxEnv {
		r.Env[fmt.Sprintf("HV%04d", i)] = strings.Repeat("v", 100)
	}
	r.Env["HV0000"] += strings.Repeat("v", api.MaxArgvEnv-hostileArgvEnvSize(r))
	return r
}

// TestHostileArgvEnv: requests over the bounds on words, variables, bytes
// of them and bytes of body are refused with 413 and start nothing; a
// request at every bound at once runs, its process given every word and
// variable.
func TestHostileArgvEnv(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	c := newHostileClient(t, k)
	sb := k.sandbox()
	at := hostileAtBounds()
	if n := hostileArgvEnvSize(at); n != api.MaxArgvEnv || 1+len(at.Args) != api.MaxArgs || len(at.Env) != api.MaxEnv {
		t.Fatalf("the request at the bounds has %d bytes, %d words, %d variables", n, 1+len(at.Args), len(at.Env))
	}
	oneByteOver := hostileAtBounds()
	oneByteOver.Args[3] += "x"
	manyVars := api.ExecRequest{Command: "true", Env: map[string]string{}}
	for i := range api.MaxEnv + 1 {
		manyVars.Env["V"+strconv.Itoa(i)] = ""
	}
	body := func(r api.ExecRequest) string {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name string
		req  string
	}{
		{"one word too many", body(api.ExecRequest{Command: "true", Args: make([]string, api.MaxArgs)})},
		{"one variable too many", body(manyVars)},
		{"one byte too many", body(oneByteOver)},
		{"a body over the limit", body(api.ExecRequest{Command: "echo", Args: []string{strings.Repeat("y", api.MaxBody)}})},
	} {
		for _, route := range []string{"/exec", "/exec-stream"} {
			hostileRefused(t, tc.name+" on "+route, c.as("POST", "/sandboxes/"+sb+route, tc.req), 413)
		}
	}
	// An init command over the bounds is a bad create request.
	hostileRefused(t, "an init command one byte over", c.as("POST", "/sandboxes", `{"init":`+body(oneByteOver)+`}`), 400)
	if n := len(k.d.List()); n != 1 {
		t.Errorf("%d sandboxes after refused creates, want 1", n)
	}
	if list := c.processes(sb); len(list) != 0 {
		t.Fatalf("refused requests started %d processes: %+v", len(list), list[0])
	}

	want := fmt.Sprintf("%d\n%d\n", api.MaxArgs-4, api.MaxEnv) // sh, -c, the script and $0 are not arguments
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+sb+"/exec", at, &res)
	if res.Stdout != want || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Errorf("exec at the bounds: %+v", res)
	}
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", at, &st)
	var exit api.Exit
	k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+st.ID+"/wait", nil, &exit)
	if r := c.as("GET", "/sandboxes/"+sb+"/exec-stream/"+st.ID+"/logs?follow=0", ""); r.code != 200 || string(r.body) != want+"[process exited with code 0]\n" {
		t.Errorf("exec-stream at the bounds: %d %q", r.code, r.body)
	}
	c.alive(sb)
}

// TestHostileNonUTF8: bytes that are not UTF-8 in every place a client can
// put them. In JSON they decode as U+FFFD, as JSON has it; stdin carries
// them exactly; in ids, query values and headers they are refused with the
// error they would get anyway, in a body that is valid UTF-8.
func TestHostileNonUTF8(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	c := newHostileClient(t, k)
	sb := k.sandbox()
	inSB := "/sandboxes/" + sb

	var res api.ExecResult
	if r := c.as("POST", inSB+"/exec", `{"command":"printf","args":["%s|","a`+"\xff"+`b","`+"\xc3"+`","\udcff"]}`); r.code != 200 || json.Unmarshal(r.body, &res) != nil {
		t.Errorf("non-UTF-8 arguments: %d %s", r.code, r.body)
	} else if res.Stdout != "a\uFFFDb|\uFFFD|\uFFFD|" {
		t.Errorf("non-UTF-8 arguments reached the process as %q", res.Stdout)
	}
	res = api.ExecResult{}
	if r := c.as("POST", inSB+"/exec", `{"command":"env","env":{"K`+"\xff"+`":"v`+"\xfe"+`"}}`); r.code != 200 || json.Unmarshal(r.body, &res) != nil {
		t.Errorf("a non-UTF-8 variable: %d %s", r.code, r.body)
	} else if !strings.Contains("\n"+res.Stdout, "\nK\uFFFD=v\uFFFD\n") {
		t.Errorf("a non-UTF-8 variable reached the process as %q", res.Stdout)
	}
	// Read as U+FFFD U+FFFD, a name no program has.
	hostileRefusedWith(t, "a non-UTF-8 command", c.as("POST", inSB+"/exec-stream", `{"command":"`+"\xff\xfe"+`"}`), 400, api.CodeCommandNotFound)
	hostileRefused(t, "a non-UTF-8 working directory, not there", c.as("POST", inSB+"/exec-stream", `{"command":"true","cwd":"/`+"\xff"+`"}`), 404)
	hostileRefused(t, "a non-UTF-8 hostname", c.as("POST", "/sandboxes", `{"hostname":"`+"\xff"+`"}`), 400)

	// Stdin is bytes: they reach the process and come back exactly.
	var st api.Started
	k.json("POST", inSB+"/exec-stream", `{"command":"cat","stdin":"pipe","capture":true}`, &st)
	raw := "\xff\xfe\x00\x80\xc3("
	if r := c.as("POST", inSB+"/exec-stream/"+st.ID+"/stdin?offset=0", raw); r.code != 200 || string(r.body) != `{"accepted":6}`+"\n" {
		t.Errorf("non-UTF-8 stdin: %d %s", r.code, r.body)
	}
	k.json("POST", inSB+"/exec-stream/"+st.ID+"/stdin/close", nil, nil)
	var exit api.Exit
	k.json("GET", inSB+"/exec-stream/"+st.ID+"/wait", nil, &exit)
	k.faultCaptureEnded(sb, st.ID) // the exit comes before the capture's end
	if r := c.as("GET", inSB+"/exec-stream/"+st.ID+"/logs?follow=0", ""); r.code != 200 || string(r.body) != raw+"[process exited with code 0]\n" {
		t.Errorf("non-UTF-8 stdin came back as %d %q", r.code, r.body)
	}
	if r := c.as("GET", inSB+"/logs/"+st.ID, ""); r.code != 200 || string(r.body) != raw {
		t.Errorf("non-UTF-8 stdin captured as %d %q", r.code, r.body)
	}
	if r := c.as("GET", inSB+"/logs/"+st.ID+"?format=json", ""); r.code != 200 {
		t.Errorf("captured log as JSON: %d %s", r.code, r.body)
	} else if got, err := hostileRecords(r.body); err != nil || got != raw {
		t.Errorf("non-UTF-8 output as JSON records: %q, %v in %s", got, err, r.body)
	}

	for _, target := range []string{
		"/exec-stream/" + st.ID + "/logs?stdout=%FF",
		"/exec-stream/" + st.ID + "/logs?stderr=1%C3",
		"/exec-stream/" + st.ID + "/logs?follow=%FF",
		"/exec-stream/" + st.ID + "/logs?stdin=%C3%28",
		"/logs/" + st.ID + "?stream=%FF",
		"/logs/" + st.ID + "?tail=%FF",
		"/logs/" + st.ID + "?since=%FF",
		"/logs/" + st.ID + "?until=1%FFm",
		"/logs/" + st.ID + "?format=%FE",
		"/logs/" + st.ID + "?follow=%FF",
	} {
		hostileRefused(t, "GET "+target, c.as("GET", inSB+target, ""), 400)
	}
	hostileRefused(t, "a non-UTF-8 stdin offset", c.as("POST", inSB+"/exec-stream/"+st.ID+"/stdin?offset=%FF", "x"), 400)
	hostileRefused(t, "a non-UTF-8 remove_logs", c.as("DELETE", inSB+"?remove_logs=%FF", ""), 400)

	// Header values.
	h := hostileBearer(k.d.Token())
	h.Set("X-Unknown", "\xff\xfe")
	if r := c.send("POST", inSB+"/exec", h, `{"command":"true"}`); r.code != 200 {
		t.Errorf("a non-UTF-8 header beside the request: %d %s", r.code, r.body)
	}
	h = hostileBearer(k.d.Token())
	h.Set("Origin", "http://\xff\xfe")
	hostileRefused(t, "a non-UTF-8 origin", c.send("GET", "/sandboxes", h, ""), 403)
	hostileRefused(t, "a non-UTF-8 token", c.send("GET", "/sandboxes", hostileBearer(k.d.Token()[:63]+"\xff"), ""), 401)
	var done api.Started
	k.json("POST", inSB+"/exec-stream", `{"command":"echo","args":["watched"]}`, &done)
	k.json("GET", inSB+"/exec-stream/"+done.ID+"/wait", nil, &exit)
	ws, r, err := k.hostileDial(inSB+"/exec-stream/"+done.ID+"/logs", nil, "kiln.\xff", api.TokenProtocolPrefix+k.d.Token())
	if err != nil {
		t.Fatalf("a non-UTF-8 subprotocol beside the token: %v, %d %s", err, r.code, r.body)
	}
	if ws.Subprotocol() != "" {
		t.Errorf("subprotocol %q chosen", ws.Subprotocol())
	}
	if got := hostileTranscript(t, ws); got != "watched\n[process exited with code 0]\n" {
		t.Errorf("watched %q", got)
	}
	if n := len(k.d.List()); n != 1 {
		t.Errorf("%d sandboxes, want 1", n)
	}
	c.alive(sb)
}

// hostileRecords joins the content of NDJSON log records, checking that
// what is not UTF-8 comes in base64.
func hostileRecords(b []byte) (string, error) {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	var out strings.Builder
	for dec.More() {
		var rec api.LogRecord
		if err := dec.Decode(&rec); err != nil {
			return "", err
		}
		if rec.Base64 == "" {
			out.WriteString(rec.Text)
			continue
		}
		data, err := base64.StdEncoding.DecodeString(rec.Base64)
		if err != nil || utf8.Valid(data) || rec.Text != "" {
			return "", fmt.Errorf("record %+v", rec)
		}
		out.Write(data)
	}
	return out.String(), nil
}

// TestHostileTokens: over TCP, every route but the open ones wants the
// exact token, in the Authorization header or the kiln.token.* WebSocket
// subprotocol. Tokens one byte short or long, differing in their last byte,
// in another scheme or another place are refused, and nothing they asked
// for happens.
func TestHostileTokens(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	c := newHostileClient(t, k)
	sb := k.sandbox()
	tok := k.d.Token()
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", `{"command":"echo","args":["secret"],"capture":true}`, &st)
	var exit api.Exit
	k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+st.ID+"/wait", nil, &exit)
	last := tok[len(tok)-1]
	flipped := tok[:len(tok)-1] + string(rune(last^1))
	wrong := map[string]http.Header{
		"no header":              nil,
		"an empty bearer":        {"Authorization": {"Bearer "}},
		"one byte short":         hostileBearer(tok[:len(tok)-1]),
		"one byte long":          hostileBearer(tok + "0"),
		"the last byte differs":  hostileBearer(flipped),
		"the first byte differs": hostileBearer(string(rune(tok[0]^1)) + tok[1:]),
		"twice":                  hostileBearer(tok + tok),
		"no scheme":              {"Authorization": {tok}},
		"basic":                  {"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("kiln:"+tok))}},
		"as a cookie":            {"Cookie": {"token=" + tok}},
		"a wrong header beside the right subprotocol": {"Authorization": {"Bearer " + flipped}, "Sec-WebSocket-Protocol": {api.TokenProtocolPrefix + tok}},
		"a wrong subprotocol":                         {"Sec-WebSocket-Protocol": {"kiln.v1, " + api.TokenProtocolPrefix + flipped}},
	}
	pwned := filepath.Join(k.state, "sandboxes", sb, "workspace", "pwned")
	for name, h := range wrong {
		for _, req := range []struct{ method, target, body string }{
			{"POST", "/sandboxes", "{}"},
			{"POST", "/sandboxes/" + sb + "/exec", `{"command":"touch","args":["/workspace/pwned"]}`},
			{"POST", "/sandboxes/" + sb + "/exec-stream", `{"command":"touch","args":["/workspace/pwned"]}`},
			{"GET", "/sandboxes/" + sb + "/exec-stream/" + st.ID + "/logs?follow=0", ""},
			{"GET", "/sandboxes/" + sb + "/logs/" + st.ID + "?token=" + tok, ""},
			{"DELETE", "/sandboxes/" + sb, ""},
			{"GET", "/metrics", ""},
			{"GET", "/healthz/../sandboxes", ""},
			{"GET", "/healthz%2F..%2Fsandboxes", ""},
		} {
			hostileRefused(t, name+": "+req.method+" "+req.target, c.send(req.method, req.target, h, req.body), 401)
		}
	}
	for name, protocols := range map[string][]string{
		"no token":              {api.ProtocolV1},
		"an empty token":        {api.ProtocolV1, api.TokenProtocolPrefix},
		"one byte short":        {api.TokenProtocolPrefix + tok[:len(tok)-1]},
		"one byte long":         {api.TokenProtocolPrefix + tok + "0"},
		"the last byte differs": {api.TokenProtocolPrefix + flipped},
		"another case":          {strings.ToUpper(api.TokenProtocolPrefix) + tok},
		"the wrong one first":   {api.TokenProtocolPrefix + flipped, api.TokenProtocolPrefix + tok},
	} {
		_, r, err := k.hostileDial("/sandboxes/"+sb+"/exec-stream/"+st.ID+"/logs", nil, protocols...)
		if err == nil {
			t.Errorf("WebSocket with %s: accepted", name)
			continue
		}
		hostileRefused(t, "WebSocket with "+name, r, 401)
	}
	if _, err := os.Stat(pwned); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused exec ran: %v", err)
	}
	if n := len(c.processes(sb)); n != 1 {
		t.Errorf("%d processes, want the one started with the token", n)
	}
	if n := len(k.d.List()); n != 1 {
		t.Errorf("%d sandboxes, want 1", n)
	}
	// The right token, in either place, still works.
	ws, r, err := k.hostileDial("/sandboxes/"+sb+"/exec-stream/"+st.ID+"/logs", nil, api.TokenProtocolPrefix+tok)
	if err != nil {
		t.Fatalf("WebSocket with the token: %v, %d %s", err, r.code, r.body)
	}
	if got := hostileTranscript(t, ws); got != "secret\n[process exited with code 0]\n" {
		t.Errorf("watched %q", got)
	}
	c.alive(sb)
}

// TestHostileHost: a page whose name was made to resolve to kilnd's
// address (DNS rebinding) cannot reach any route, the open ones included:
// a Host that is not kilnd's is refused before the token is looked at.
// kilnd's own names with its port are served; the names under localhost
// are the previews', where the API answers nothing.
func TestHostileHost(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	c := newHostileClient(t, k)
	_, port, _ := strings.Cut(k.addr, ":")
	for _, host := range []string{"evil.example", "evil.example:" + port, "localhost.evil.example:" + port,
		"127.0.0.1.nip.io:" + port, "localhost", "localhost:1", "127.0.0.1:1", "[::1]:1", "0.0.0.0:" + port} {
		h := hostileBearer(k.d.Token())
		h.Set("Host", host)
		for _, path := range []string{"/healthz", "/openapi.yaml", "/sandboxes"} {
			hostileRefused(t, host+": GET "+path, c.send("GET", path, h, ""), 403)
		}
		hostileRefused(t, host+": create", c.send("POST", "/sandboxes", h, "{}"), 403)
	}
	if n := len(k.d.List()); n != 0 {
		t.Errorf("%d sandboxes made through foreign hosts", n)
	}
	for _, host := range []string{k.addr, "localhost:" + port, "LocalHost:" + port, "[::1]:" + port} {
		h := hostileBearer(k.d.Token())
		h.Set("Host", host)
		if r := c.send("GET", "/sandboxes", h, ""); r.code != 200 {
			t.Errorf("%s: %d %s", host, r.code, r.body)
		}
	}
	for _, host := range []string{"app.localhost:" + port, "0123456789abcdef.localhost:" + port} {
		h := hostileBearer(k.d.Token())
		h.Set("Host", host)
		hostileRefused(t, host+": GET /sandboxes", c.send("GET", "/sandboxes", h, ""), 404)
		hostileRefused(t, host+": create", c.send("POST", "/sandboxes", h, "{}"), 404)
	}
	if n := len(k.d.List()); n != 0 {
		t.Errorf("%d sandboxes made through previews' hosts", n)
	}
}

// TestHostileOrigin: a browser page elsewhere cannot use kilnd, even with
// the token: requests and WebSockets from a foreign origin are refused
// before anything happens, kilnd's own origin is served.
func TestHostileOrigin(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	c := newHostileClient(t, k)
	sb := k.sandbox()
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", `{"command":"cat","stdin":"pipe"}`, &st)
	_, port, _ := strings.Cut(k.addr, ":")
	foreign := []string{"https://evil.example", "null", "http://" + k.addr + ".evil.example", "http://" + k.addr + "/",
		"https://" + k.addr + "@evil.example", "http://localhost:" + port, "http://127.0.0.1:1", "file://", "HTTP://" + k.addr}
	for _, origin := range foreign {
		h := hostileBearer(k.d.Token())
		h.Set("Origin", origin)
		hostileRefused(t, origin+": create", c.send("POST", "/sandboxes", h, "{}"), 403)
		hostileRefused(t, origin+": exec", c.send("POST", "/sandboxes/"+sb+"/exec", h, `{"command":"touch","args":["/workspace/pwned"]}`), 403)
		hostileRefused(t, origin+": stdin", c.send("POST", "/sandboxes/"+sb+"/exec-stream/"+st.ID+"/stdin", h, "injected"), 403)
		ws := http.Header{"Origin": {origin}}
		if _, r, err := k.hostileDial("/sandboxes/"+sb+"/exec-stream/"+st.ID+"/logs?stdin=1", ws, api.TokenProtocolPrefix+k.d.Token()); err == nil {
			t.Errorf("%s: WebSocket accepted", origin)
		} else {
			hostileRefused(t, origin+": WebSocket", r, 403)
		}
	}
	var p api.Process
	k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+st.ID, nil, &p)
	if p.Stdin == nil || p.Stdin.Accepted != 0 {
		t.Errorf("stdin written from a foreign origin: %+v", p.Stdin)
	}
	if _, err := os.Stat(filepath.Join(k.state, "sandboxes", sb, "workspace", "pwned")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an exec from a foreign origin ran: %v", err)
	}
	if n := len(k.d.List()); n != 1 {
		t.Errorf("%d sandboxes, want 1", n)
	}
	// kilnd's own origin is served, over HTTP and WebSocket.
	own := "http://" + k.addr
	h := hostileBearer(k.d.Token())
	h.Set("Origin", own)
	if r := c.send("POST", "/sandboxes/"+sb+"/exec-stream/"+st.ID+"/stdin", h, "mine\n"); r.code != 200 {
		t.Errorf("own origin: %d %s", r.code, r.body)
	}
	ws, r, err := k.hostileDial("/sandboxes/"+sb+"/exec-stream/"+st.ID+"/logs?stdin=1", http.Header{"Origin": {own}}, api.ProtocolV1, api.TokenProtocolPrefix+k.d.Token())
	if err != nil {
		t.Fatalf("own origin: WebSocket %v, %d %s", err, r.code, r.body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), hostileDeadline)
	defer cancel()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"stdin_close"}`)); err != nil {
		t.Fatal(err)
	}
	w := &apitest.Checker{Keep: true}
	if err := w.Read(ctx, ws); err != nil {
		t.Fatalf("own origin: watch: %v", err)
	}
	ws.CloseNow()
	got := w.Stream("stdout").Data
	if string(got) != "mine\n" {
		t.Errorf("own origin: output %q", got)
	}
	c.alive(sb)
}

// TestHostileLogQueries: captured-log filters at the edges of their
// ranges. A tail larger than any log keeps it whole (it used to overflow
// and make every line cost a copy of all before it); counts past int and
// negative durations are refused.
func TestHostileLogQueries(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	c := newHostileClient(t, k)
	sb := k.sandbox()
	const lines = 20000
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", fmt.Sprintf(`{"command":"seq","args":["%d"],"capture":true}`, lines), &st)
	var exit api.Exit
	k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+st.ID+"/wait", nil, &exit)
	k.faultCaptureEnded(sb, st.ID) // the exit comes before the capture's end
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	logs := "/sandboxes/" + sb + "/logs/" + st.ID
	for _, q := range []string{"?tail=9223372036854775807", "?tail=4611686018427387904", "?tail=4611686018427387903",
		"?since=2562047h", "?until=9999-12-31T23:59:59Z", "?tail=20000&stream=stdout"} {
		if r := c.as("GET", logs+q, ""); r.code != 200 || string(r.body) != want.String() {
			t.Errorf("%s: %d, %d bytes, want the %d of the whole log", q, r.code, len(r.body), want.Len())
		}
	}
	for q, body := range map[string]string{"?tail=0": "", "?tail=2": fmt.Sprintf("%d\n%d\n", lines-1, lines), "?stream=stderr": "",
		"?since=9999-12-31T23:59:59Z": "", "?until=0001-01-02T00:00:00Z": ""} {
		if r := c.as("GET", logs+q, ""); r.code != 200 || string(r.body) != body {
			t.Errorf("%s: %d %.100q, want %q", q, r.code, r.body, body)
		}
	}
	for _, q := range []string{"?tail=9223372036854775808", "?tail=-9223372036854775808", "?since=-1s", "?until=-2562047h",
		"?since=2562048h", "?since=10000-01-01T00:00:00Z", "?stream=kiln", "?follow=2"} {
		hostileRefused(t, q, c.as("GET", logs+q, ""), 400)
	}
	c.alive(sb)
}

// TestHostileBodies: JSON bodies that are not one object of known fields,
// to kilnd (create) and through it to the agent (exec): each is refused
// with 400 and creates or starts nothing.
func TestHostileBodies(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	c := newHostileClient(t, k)
	sb := k.sandbox()
	deep := strings.Repeat("[", 20000) + strings.Repeat("]", 20000)
	for _, tc := range []struct{ name, create, exec string }{
		{"a second object", `{"hostname":"one"} {"hostname":"two"}`, `{"command":"true"} {"command":"false"}`},
		{"data after the object", `{}x`, `{"command":"true"}x`},
		{"an array", `[]`, `[{"command":"true"}]`},
		{"a string", `"{}"`, `"{\"command\":\"true\"}"`},
		{"a number out of range", `{"limits":{"cpus":1e400}}`, `{"command":"true","timeout_ms":1e400}`},
		{"a fraction for a count", `{"idle_timeout_seconds":1.5}`, `{"command":"true","tty":{"cols":80.5,"rows":24}}`},
		{"a field of the wrong type", `{"limits":"big"}`, `{"command":["true"]}`},
		{"a field name one space off", `{"hostname":"a","Hostname ":"b"}`, `{"command":"true","Command ":"x"}`},
		{"nesting past the decoder's depth", `{"init":{"command":"true","args":` + deep + `}}`, `{"command":"true","args":` + deep + `}`},
		{"a NUL byte outside strings", "{\x00}", "{\"command\":\"true\"\x00}"},
	} {
		hostileRefused(t, "create with "+tc.name, c.as("POST", "/sandboxes", tc.create), 400)
		hostileRefused(t, "exec with "+tc.name, c.as("POST", "/sandboxes/"+sb+"/exec", tc.exec), 400)
		hostileRefused(t, "exec-stream with "+tc.name, c.as("POST", "/sandboxes/"+sb+"/exec-stream", tc.exec), 400)
	}
	if n := len(k.d.List()); n != 1 {
		t.Errorf("%d sandboxes, want 1", n)
	}
	if list := c.processes(sb); len(list) != 0 {
		t.Errorf("refused bodies started %d processes", len(list))
	}
	c.alive(sb)
}

// TestHostileFromInside: sandboxed code, root inside its sandbox, tries
// every way out to kilnd: its port, its socket and state directory by
// path, the agent's API socket and capture directory through the agent's
// descriptors, the agent itself with ptrace, the host's processes in
// /proc, and the cgroups that would let it kill or free itself. Each probe
// says BLOCKED and why, or REACHED; a probe that says neither is broken,
// and fails too.
func TestHostileFromInside(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	c := newHostileClient(t, k)
	sb := k.sandbox()
	_, port, _ := strings.Cut(k.addr, ":")
	// probe runs Python that raises OSError when blocked.
	probe := func(code string) string {
		return "import errno, os, socket, ctypes\ntry:\n" +
			"    " + strings.ReplaceAll(code, "\n", "\n    ") + "\n    print('REACHED')\n" +
			"except OSError as e:\n    print('BLOCKED', errno.errorcode.get(e.errno, e.errno))\n"
	}
	unixConnect := func(path string) string {
		return fmt.Sprintf("s = socket.socket(socket.AF_UNIX)\ns.connect(%q)", path)
	}
	self := strconv.Itoa(os.Getpid())
	cases := []struct{ name, code string }{
		{"kilnd's port", fmt.Sprintf("socket.create_connection(('127.0.0.1', %s), timeout=2)", port)},
		{"kilnd's socket by path", unixConnect(filepath.Join(k.state, "kilnd.sock"))},
		{"kilnd's state directory", fmt.Sprintf("os.listdir(%q)", k.state)},
		{"the agent's API socket", "os.listdir('/proc/1/fd')"},
		{"the agent's listener by descriptor", unixConnect("/proc/1/fd/3")},
		{"the capture directory by descriptor", "os.listdir('/proc/1/fd/4')"},
		{"the agent's root", "os.listdir('/proc/1/root/')[0:0] or open('/proc/1/mem', 'rb').read(1)"},
		{"ptrace of the agent", "libc = ctypes.CDLL(None, use_errno=True)\n" +
			"if libc.ptrace(16, 1, 0, 0) != 0:\n    raise OSError(ctypes.get_errno(), 'ptrace')"},
		{"the test process (kilnd) in /proc", fmt.Sprintf("b = open('/proc/%s/cmdline', 'rb').read()\n"+
			"if b'daemon.test' not in b:\n    raise OSError(errno.ESRCH, 'another process')", self)},
		{"the cgroup file system", "open('/sys/fs/cgroup/cgroup.procs', 'w').write('1')"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var res api.ExecResult
			k.json("POST", "/sandboxes/"+sb+"/exec", api.ExecRequest{Command: "python3", Args: []string{"-c", probe(tc.code)}}, &res)
			out := strings.TrimSpace(res.Stdout)
			t.Log(out)
			if !strings.HasPrefix(out, "BLOCKED ") {
				t.Errorf("%s: stdout %q, stderr %q: want BLOCKED", tc.name, out, res.Stderr)
			}
		})
	}
	c.alive(sb)
}
