// Package client is the Go SDK for kilnd: sandboxes, and processes whose output, input and exit are reported as they are known, never guessed.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
)

// Where kilnd is found when Options leave it open: the state directory of
// $KILN_STATE_DIR, or DefaultStateDir.
const (
	DefaultStateDir = "/var/lib/sandkiln"
	DefaultAddr     = "127.0.0.1:7777"
	StateDirEnv     = "KILN_STATE_DIR"
	AddrEnv         = "KILN_ADDR"
	TokenEnv        = "KILN_TOKEN"
)

// Options say how to reach kilnd. The zero value uses the unix socket in
// the default state directory.
type Options struct {
	// StateDir is kilnd's state directory: its socket and token are there.
	StateDir string
	// Addr, when set, is kilnd's TCP address (host:port, tcp://host:port
	// or http://host:port); the token is then required: Token,
	// $KILN_TOKEN, or the token file in StateDir. unix:///path names a
	// socket instead.
	Addr  string
	Token string
	// Timeout bounds each control request (not waits or output streams);
	// default 30 s.
	Timeout time.Duration
}

// Client talks to one kilnd. It is safe for concurrent use.
type Client struct {
	base    string // http://host
	hc      *http.Client
	stream  *http.Client // no timeout: waits and output streams
	token   string
	timeout time.Duration

	// mu guards handles: the process handles made through this client and
	// not let go yet, which Close lets go.
	mu      sync.Mutex
	handles map[*Process]struct{}
}

// New makes a client. It does not contact kilnd.
func New(o Options) (*Client, error) {
	if o.StateDir == "" {
		o.StateDir = os.Getenv(StateDirEnv)
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.Addr == "" {
		o.Addr = os.Getenv(AddrEnv)
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	c := &Client{timeout: o.Timeout}
	addr, sock, err := parseAddr(o.Addr)
	if err != nil {
		return nil, err
	}
	if addr == "" && sock == "" {
		sock = filepath.Join(o.StateDir, "kilnd.sock")
	}
	var tr *http.Transport
	if sock != "" {
		tr = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
		c.base = "http://kilnd"
	} else {
		tr = &http.Transport{}
		c.base = "http://" + addr
		c.token = o.Token
		if c.token == "" {
			c.token = os.Getenv(TokenEnv)
		}
		if c.token == "" {
			b, err := os.ReadFile(filepath.Join(o.StateDir, "token"))
			if err != nil {
				return nil, fmt.Errorf("%w %s: give Options.Token, set $%s, or a StateDir holding kilnd's token file (%w)", ErrNoToken, addr, TokenEnv, err)
			}
			c.token = strings.TrimSpace(string(b))
		}
	}
	tr.MaxIdleConnsPerHost = 16
	tr.IdleConnTimeout = time.Minute
	// kilnd never redirects; an app behind a port's proxy may, and its
	// redirect is the caller's to see.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.hc = &http.Client{Transport: tr, CheckRedirect: noRedirect}
	c.stream = &http.Client{Transport: tr, CheckRedirect: noRedirect}
	return c, nil
}

// parseAddr reads where kilnd is, in the forms DOCKER_HOST is written
// in: host:port, tcp://host:port or http://host:port (TCP, with the
// token), or unix:///path (a socket, without). Empty is neither.
func parseAddr(s string) (addr, sock string, err error) {
	bad := func(why string) error {
		return fmt.Errorf("client: address %q: %s; want host:port, tcp://host:port, http://host:port or unix:///path", s, why)
	}
	switch scheme, rest, found := strings.Cut(s, "://"); {
	case s == "":
		return "", "", nil
	case !found:
		addr = s
	case scheme == "unix":
		if !filepath.IsAbs(rest) {
			return "", "", bad("a socket's path must be absolute")
		}
		return "", rest, nil
	case scheme == "tcp" || scheme == "http":
		addr = strings.TrimSuffix(rest, "/")
	case scheme == "https":
		return "", "", bad("kilnd serves plain HTTP (put a TLS proxy in front of it, or use its unix socket)")
	default:
		return "", "", bad("unknown scheme " + strconv.Quote(scheme))
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" || strings.ContainsAny(addr, "/?#@") {
		return "", "", bad("not a host and port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "", bad("port " + strconv.Quote(port))
	}
	return addr, "", nil
}

// Close lets go of every process handle made through this client, as
// Detach does: their connections close, their calls still in progress
// fail with ErrDetached, and their processes no longer wait for them.
// kilnd, its sandboxes and their processes are left as they are. Then it
// closes idle connections. The client can still be used after.
func (c *Client) Close() error {
	c.mu.Lock()
	handles := c.handles
	c.handles = nil
	c.mu.Unlock()
	var wg sync.WaitGroup
	for p := range handles {
		wg.Go(func() { p.letGo(true) })
	}
	wg.Wait()
	c.hc.CloseIdleConnections()
	return nil
}

// adopt and forget keep the handles Close lets go.
func (c *Client) adopt(p *Process) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.handles == nil {
		c.handles = map[*Process]struct{}{}
	}
	c.handles[p] = struct{}{}
}

func (c *Client) forget(p *Process) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.handles, p)
}

// letGoSandbox lets go of the handles of the sandbox id: deleted, its
// processes are gone, and their handles refuse what comes after.
func (c *Client) letGoSandbox(id string) {
	c.mu.Lock()
	var gone []*Process
	for p := range c.handles {
		if p.s.ID == id || p.s.Described.ID == id {
			gone = append(gone, p)
		}
	}
	c.mu.Unlock()
	for _, p := range gone {
		p.letGo(false)
	}
}

// request is one HTTP call. sent reports whether the request may have
// reached kilnd: a failure after that is an unknown outcome.
func (c *Client) request(ctx context.Context, hc *http.Client, method, path string, query url.Values, body io.Reader, ctype string) (*http.Response, bool, error) {
	return c.requestWith(ctx, hc, method, path, query, body, ctype, nil)
}

// requestWith is request with more headers.
func (c *Client) requestWith(ctx context.Context, hc *http.Client, method, path string, query url.Values, body io.Reader, ctype string, header map[string]string) (*http.Response, bool, error) {
	return c.requestAs(ctx, hc, method, path, query, body, ctype, header, func(resp *http.Response) bool { return resp.StatusCode >= 300 })
}

// requestAs is requestWith, isError saying which answers are errors.
func (c *Client) requestAs(ctx context.Context, hc *http.Client, method, path string, query url.Values, body io.Reader, ctype string, header map[string]string, isError func(*http.Response) bool) (*http.Response, bool, error) {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, false, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	// A regular file's length from where it is read on: sent with it,
	// rather than in chunks, its content goes by sendfile.
	if f, ok := body.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			if at, err := f.Seek(0, io.SeekCurrent); err == nil && at <= fi.Size() {
				req.ContentLength = fi.Size() - at
			}
		}
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	var sent atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { sent.Store(true) }}))
	resp, err := hc.Do(req)
	if err != nil {
		return nil, sent.Load(), err
	}
	if isError(resp) {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, true, answerError(resp, b, method, path)
	}
	return resp, true, nil
}

// maxErrorBody is the most of an error's answer read.
const maxErrorBody = 64 << 10

// answerError is the error of kilnd's answer resp, whose body is b: its
// code and message, or, for an answer that is not kilnd's error, its
// status.
func answerError(resp *http.Response, b []byte, method, path string) *Error {
	var e api.Error
	if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
		return &Error{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
	}
	return &Error{Status: resp.StatusCode, Code: api.CodeInternal, Message: fmt.Sprintf("%s %s: %s", method, path, resp.Status)}
}

// call makes a control request (bounded by the client's timeout) and
// decodes the JSON answer into out. A failure after the request may have
// been sent is ErrOutcomeUnknown when the request was not idempotent.
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any, idempotent bool) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return c.callLong(ctx, method, path, query, in, out, idempotent)
}

// callLong is call bounded by ctx alone: for a request whose answer takes
// as long as the work it asks for (copying workspaces).
func (c *Client) callLong(ctx context.Context, method, path string, query url.Values, in, out any, idempotent bool) error {
	var body io.Reader
	ctype := ""
	switch b := in.(type) {
	case nil:
	case []byte:
		body, ctype = bytes.NewReader(b), "application/octet-stream"
	default:
		j, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ctype = bytes.NewReader(j), "application/json"
	}
	resp, sent, err := c.request(ctx, c.hc, method, path, query, body, ctype)
	if err != nil {
		return failed(ctx, method, path, sent, idempotent, err)
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if !idempotent {
			return fmt.Errorf("%w: %s %s: reading the answer: %w", ErrOutcomeUnknown, method, path, err)
		}
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	return nil
}

// failed is the error of a control request that got no answer, or an
// error: ErrOutcomeUnknown when it was not idempotent and may have taken
// effect, ErrUnavailable when kilnd could not be reached (and ctx had not
// ended), else err as it is.
func failed(ctx context.Context, method, path string, sent, idempotent bool, err error) error {
	var e *Error
	answered := errors.As(err, &e)
	switch {
	case !idempotent && ((!answered && sent) || (answered && e.Code == api.CodeUnknown)):
		return fmt.Errorf("%w: %s %s: %w", ErrOutcomeUnknown, method, path, err)
	case !answered && ctx.Err() == nil:
		// No answer, and none lost that mattered: the connection
		// failed, or broke before the answer.
		return fmt.Errorf("%w: %s %s: %w", ErrUnavailable, method, path, err)
	}
	return err
}

// Sandbox is a handle on a sandbox.
type Sandbox struct {
	c *Client
	// ID is the sandbox's id; in a handle from Handle, what it was given.
	ID string
	// Described is what kilnd said of the sandbox when the handle was made:
	// as created (CreateSandbox) or found (Sandbox); empty from Handle.
	// Info asks again.
	Described api.Sandbox
}

// SandboxOptions describe a sandbox to create.
type SandboxOptions = api.CreateSandbox

// CreateSandbox creates a sandbox and returns once it is ready. If the
// answer is lost, the error is ErrOutcomeUnknown: list the sandboxes
// before creating another.
func (c *Client) CreateSandbox(ctx context.Context, o SandboxOptions) (*Sandbox, error) {
	var info api.Sandbox
	if err := c.call(ctx, "POST", "/sandboxes", nil, o, &info, false); err != nil {
		return nil, err
	}
	return &Sandbox{c: c, ID: info.ID, Described: info}, nil
}

// Sandbox returns a handle on a sandbox, checking that it exists: ref is
// its id, its name, or a prefix of its id no other sandbox's has (one
// that two share is an IsInvalid error). The handle holds the full id,
// so it keeps to that sandbox after its name passes to another.
func (c *Client) Sandbox(ctx context.Context, ref string) (*Sandbox, error) {
	info, err := c.Handle(ref).Info(ctx)
	if err != nil {
		return nil, err
	}
	return &Sandbox{c: c, ID: info.ID, Described: info}, nil
}

// Handle returns a handle on the sandbox ref (an id, a name or a unique
// prefix of an id, as Sandbox takes) without asking kilnd whether it
// exists (the first call through it will). Each call finds the sandbox
// ref stands for then.
func (c *Client) Handle(ref string) *Sandbox { return &Sandbox{c: c, ID: ref} }

// Sandboxes lists the sandboxes not deleted.
func (c *Client) Sandboxes(ctx context.Context) ([]api.Sandbox, error) {
	var out []api.Sandbox
	return out, c.call(ctx, "GET", "/sandboxes", nil, nil, &out, true)
}

// SandboxFilter chooses sandboxes for SandboxesWhere: each field left
// empty chooses all.
type SandboxFilter struct {
	// Labels must each match: "KEY" (the sandbox has the label) or
	// "KEY=VALUE".
	Labels                      []string
	Name, State, Image, Runtime string
	// Node, in a cluster, chooses the sandboxes of the node of that name
	// (api.Sandbox.Node); a kilnd in no cluster has none on any.
	Node string
	// All takes the deleted sandboxes whose records kilnd keeps in too.
	All bool
}

// SandboxesWhere lists the sandboxes f chooses, oldest first.
func (c *Client) SandboxesWhere(ctx context.Context, f SandboxFilter) ([]api.Sandbox, error) {
	q := url.Values{}
	for k, v := range map[string]string{"name": f.Name, "state": f.State, "image": f.Image, "runtime": f.Runtime, "node": f.Node} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.All {
		q.Set("all", "true")
	}
	if len(f.Labels) > 0 {
		q["label"] = f.Labels
	}
	var out []api.Sandbox
	return out, c.call(ctx, "GET", "/sandboxes", q, nil, &out, true)
}

// Health says kilnd answers: nil when it does.
func (c *Client) Health(ctx context.Context) error {
	return c.call(ctx, "GET", "/healthz", nil, nil, nil, true)
}

// ServerVersion is the build of the kilnd answering.
func (c *Client) ServerVersion(ctx context.Context) (api.Version, error) {
	var v api.Version
	return v, c.call(ctx, "GET", "/version", nil, nil, &v, true)
}

// Info describes the sandbox now.
func (s *Sandbox) Info(ctx context.Context) (api.Sandbox, error) {
	var info api.Sandbox
	return info, s.c.call(ctx, "GET", "/sandboxes/"+url.PathEscape(s.ID), nil, nil, &info, true)
}

// Stats reads the running sandbox's CPU, memory and pids figures from its
// cgroups. A stopped sandbox's answer is an error IsFailedPrecondition
// reports.
func (s *Sandbox) Stats(ctx context.Context) (api.SandboxStats, error) {
	var st api.SandboxStats
	return st, s.c.call(ctx, "GET", s.path("/stats"), nil, nil, &st, true)
}

// Top lists every process running in the sandbox now, as docker top
// does a container's: those the API started and those they started, by
// pid as the sandbox sees it. A sandbox that does not run is
// FAILED_PRECONDITION.
func (s *Sandbox) Top(ctx context.Context) ([]api.TopProcess, error) {
	var out []api.TopProcess
	return out, s.c.call(ctx, "GET", s.path("/top"), nil, nil, &out, true)
}

// Delete kills everything in the sandbox and removes it; its captured
// logs stay unless removeLogs. The process handles of the sandbox made
// through this client (through a Sandbox of the same id) are let go
// first: their calls in progress fail with ErrDetached, as their later
// ones do. A ctx ended already does nothing.
func (s *Sandbox) Delete(ctx context.Context, removeLogs bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.c.letGoSandbox(s.ID)
	q := url.Values{}
	if removeLogs {
		q.Set("remove_logs", "true")
	}
	return s.c.call(ctx, "DELETE", "/sandboxes/"+url.PathEscape(s.ID), q, nil, nil, true)
}

func (s *Sandbox) path(rest string) string { return "/sandboxes/" + url.PathEscape(s.ID) + rest }

// Processes lists the sandbox's processes, running and finished.
func (s *Sandbox) Processes(ctx context.Context) ([]api.Process, error) {
	var out []api.Process
	return out, s.c.call(ctx, "GET", s.path("/exec-stream"), nil, nil, &out, true)
}

// CapturedLogs lists the sandbox's captured logs and their runs.
func (s *Sandbox) CapturedLogs(ctx context.Context) ([]api.CapturedLog, error) {
	var out []api.CapturedLog
	return out, s.c.call(ctx, "GET", s.path("/logs"), nil, nil, &out, true)
}

// NoLines is LogOptions.Tail for none of the lines kept: with Follow,
// only what the process writes next.
const NoLines = -1

// LogOptions select a captured log's output; the zero value is all of it.
type LogOptions struct {
	Stream string // "stdout", "stderr" or "" for both
	// Tail, when positive, keeps the last N lines; zero (unset) keeps them
	// all, and NoLines none (to follow only what comes next).
	Tail         int
	Since, Until time.Time
	Follow       bool
	// Records asks for NDJSON api.LogRecord values (with each record's
	// time) instead of the output as it was written.
	Records bool
}

// CapturedLog reads a process's captured output as it was written (what
// remains of it after rotation). Read it to the end, then Runs says what
// the log holds of each run; with Follow it goes on until the process has
// ended and the log says so (or ctx ends). The caller closes it.
func (s *Sandbox) CapturedLog(ctx context.Context, pid string, o LogOptions) (*CapturedOutput, error) {
	q := url.Values{}
	if o.Stream != "" {
		q.Set("stream", o.Stream)
	}
	switch {
	case o.Tail > 0:
		q.Set("tail", strconv.Itoa(o.Tail))
	case o.Tail < 0:
		q.Set("tail", "0")
	}
	if !o.Since.IsZero() {
		q.Set("since", o.Since.Format(time.RFC3339Nano))
	}
	if !o.Until.IsZero() {
		q.Set("until", o.Until.Format(time.RFC3339Nano))
	}
	if o.Follow {
		q.Set("follow", "true")
	}
	if o.Records {
		q.Set("format", "json")
	}
	resp, _, err := s.c.request(ctx, s.c.stream, "GET", s.path("/logs/"+url.PathEscape(pid)), q, nil, "")
	if err != nil {
		return nil, err
	}
	return &CapturedOutput{ReadCloser: resp.Body, resp: resp}, nil
}

// CapturedOutput is a captured log being read.
type CapturedOutput struct {
	io.ReadCloser
	resp *http.Response
}

// Runs is what the log holds of each run, known once the output was read
// to its end; nil before, or if the read did not finish.
func (o *CapturedOutput) Runs() []api.Run {
	var runs []api.Run
	if t := o.resp.Trailer.Get("Kiln-Runs"); t != "" {
		json.Unmarshal([]byte(t), &runs)
	}
	return runs
}

// dial opens a WebSocket of protocol to kilnd's path.
func (c *Client) dial(ctx context.Context, path string, q url.Values, protocol string) (*websocket.Conn, error) {
	u := "ws" + c.base[len("http"):] + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	protos := []string{protocol}
	if c.token != "" {
		protos = append(protos, api.TokenProtocolPrefix+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.stream, Subprotocols: protos})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			var e api.Error
			if resp.Body != nil {
				json.NewDecoder(resp.Body).Decode(&e)
			}
			if e.Error.Code != "" {
				return nil, &Error{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
			}
		}
		return nil, err
	}
	return conn, nil
}
