package client_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/forward"
)

// proxy stands between the SDK and a kilnd: the socket of a state
// directory of its own, whose requests it forwards to kilnd's socket,
// counting them and the bytes of their answers, and holding or cutting
// those a test asks it to. It is the SDK's network, on this machine's
// loopback of unix sockets.
type proxy struct {
	State  string
	l      net.Listener
	srv    *http.Server
	rp     *httputil.ReverseProxy
	tr     *http.Transport
	closed chan struct{}

	// mu guards seen and rules.
	mu    sync.Mutex
	seen  []request
	rules []*rule
}

// request is one request the proxy took, and the bytes kilnd answered it
// with (a WebSocket's too).
type request struct {
	method, path string
	answered     *atomic.Int64
}

// What a rule does to the requests it meets.
const (
	holdRequest = iota // forwarded once released
	cutAnswer          // forwarded, its answer read, then its connection closed unanswered
	cutRequest         // its connection closed without forwarding it
)

// rule is what the proxy does to the next requests of a method and path:
// times of them, or all (times < 0), until removed.
type rule struct {
	kind   int
	method string
	path   *regexp.Regexp
	times  int
	// requested is closed once a request met the rule; answered once
	// kilnd answered one (holdRequest, cutAnswer).
	requested, answered chan struct{}
	release             chan struct{}
	once, answerOnce    sync.Once
	releaseOnce         sync.Once
}

// Release lets a held request go on to kilnd.
func (r *rule) Release() { r.releaseOnce.Do(func() { close(r.release) }) }

type answeredKey struct{}

func newProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, daemon.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(upstream, daemon.SocketName)
	x := &proxy{State: dir, l: l, closed: make(chan struct{})}
	x.tr = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	x.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(&url.URL{Scheme: "http", Host: "kilnd"})
			r.Out.Host = r.In.Host
		},
		Transport:     x.tr,
		FlushInterval: -1,
		// A request its client gave up on, or a connection kilnd closed:
		// the test says what it expected of them.
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) },
		ModifyResponse: func(resp *http.Response) error {
			n, _ := resp.Request.Context().Value(answeredKey{}).(*atomic.Int64)
			if n == nil {
				return nil
			}
			if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
				resp.Body = countedConn{rwc, n}
			} else {
				resp.Body = countedBody{resp.Body, n}
			}
			return nil
		},
	}
	x.srv = &http.Server{Handler: x}
	go x.srv.Serve(l)
	t.Cleanup(x.Close)
	return x
}

type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

type countedConn struct {
	io.ReadWriteCloser
	n *atomic.Int64
}

func (c countedConn) Read(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Close stops serving. Connections handed on (WebSockets) end when kilnd
// or the client closes them.
func (x *proxy) Close() {
	select {
	case <-x.closed:
		return
	default:
	}
	close(x.closed)
	x.srv.Close()
	x.tr.CloseIdleConnections()
}

func (x *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := new(atomic.Int64)
	x.mu.Lock()
	x.seen = append(x.seen, request{r.Method, r.URL.Path, n})
	var ru *rule
	for _, c := range x.rules {
		if c.times != 0 && c.method == r.Method && c.path.MatchString(r.URL.Path) {
			ru = c
			if c.times > 0 {
				c.times--
			}
			break
		}
	}
	x.mu.Unlock()
	// As kilnd's own proxy does: kilnd answering the moment the last
	// byte is in must not race the server's draining of the body.
	r = forward.Body(r.WithContext(context.WithValue(r.Context(), answeredKey{}, n)))
	if ru == nil {
		x.rp.ServeHTTP(w, r)
		return
	}
	ru.once.Do(func() { close(ru.requested) })
	switch ru.kind {
	case holdRequest:
		defer ru.answerOnce.Do(func() { close(ru.answered) })
		select {
		case <-ru.release:
		case <-r.Context().Done():
			return
		case <-x.closed:
			return
		}
		x.rp.ServeHTTP(w, r)
	case cutAnswer:
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.URL.Scheme, out.URL.Host = "http", "kilnd"
		if resp, err := x.tr.RoundTrip(out); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		ru.answerOnce.Do(func() { close(ru.answered) })
		hangUp(w, r)
	case cutRequest:
		hangUp(w, r)
	}
}

// hangUp closes a request's connection without an answer.
func hangUp(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
	}
}

func (x *proxy) add(kind int, method, path string, times int) *rule {
	ru := &rule{kind: kind, method: method, path: regexp.MustCompile(path), times: times,
		requested: make(chan struct{}), answered: make(chan struct{}), release: make(chan struct{})}
	x.mu.Lock()
	x.rules = append(x.rules, ru)
	x.mu.Unlock()
	return ru
}

// hold holds the next request of method and path (a regular expression
// of the whole path) until its rule is released.
func (x *proxy) hold(method, path string) *rule { return x.add(holdRequest, method, path, 1) }

// cutAnswer forwards the next such request and loses its answer.
func (x *proxy) cutAnswer(method, path string) *rule { return x.add(cutAnswer, method, path, 1) }

// cutRequests cuts the next times such requests (all, if times < 0)
// before they reach kilnd, until the rule is removed.
func (x *proxy) cutRequests(method, path string, times int) *rule {
	return x.add(cutRequest, method, path, times)
}

// remove ends a rule.
func (x *proxy) remove(ru *rule) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ru.times = 0
}

// count is how many requests of method and path the proxy took.
func (x *proxy) count(method, path string) int {
	re := regexp.MustCompile(path)
	x.mu.Lock()
	defer x.mu.Unlock()
	n := 0
	for _, r := range x.seen {
		if r.method == method && re.MatchString(r.path) {
			n++
		}
	}
	return n
}

// answered is how many bytes kilnd answered requests of path with.
func (x *proxy) answered(path string) int64 {
	re := regexp.MustCompile(path)
	x.mu.Lock()
	defer x.mu.Unlock()
	var n int64
	for _, r := range x.seen {
		if re.MatchString(r.path) {
			n += r.answered.Load()
		}
	}
	return n
}
