package daemon_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// atLoopback is an HTTP client that connects to addr whatever host a
// URL names, and follows no redirect. A browser or curl resolves a
// preview's host, ID.localhost, to loopback itself; Go's resolver would
// ask DNS, and no test asks DNS anything.
func atLoopback(t *testing.T, addr string) *http.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
}

// previewAnswer is an answer as it came.
type previewAnswer struct {
	code     int
	body     string
	location string
}

// fetch makes a request with hc, Host being the URL's, and kilnd's token
// when token is set.
func fetch(t *testing.T, hc *http.Client, method, rawURL, token string) previewAnswer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, rawURL, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, rawURL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return previewAnswer{resp.StatusCode, string(b), resp.Header.Get("Location")}
}

// previewServer starts a web server on port 8000 of a new sandbox of k,
// serving /workspace, where page.html is; it returns the sandbox once the
// server answers through kilnd.
func previewServer(t *testing.T, k *kilnd) string {
	t.Helper()
	sb := k.sandbox()
	if code, body := k.raw("PUT", "/sandboxes/"+sb+"/files/workspace/page.html", []byte("the app's page\n")); code/100 != 2 {
		t.Fatalf("writing the page: %d %s", code, body)
	}
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Command: "python3", Args: []string{"-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/workspace"}}, &st)
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, _ := k.raw("GET", "/sandboxes/"+sb+"/ports/8000/page.html", nil)
		if code == 200 {
			return sb
		}
		if code != http.StatusBadGateway || time.Now().After(deadline) {
			t.Fatalf("the server in the sandbox: %d", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPreviewHosts: a preview URL has a host of its own, ID.localhost
// with kilnd's port, and so an origin of its own, another preview's
// another; on it the preview is served and nothing else (kilnd's API and
// console, another preview's token, the names under localhost that are
// no preview's: 404 or 401, never a redirect); and on kilnd's own hosts
// no preview is served, an old-style preview URL included.
func TestPreviewHosts(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	_, port, _ := net.SplitHostPort(k.addr)
	sb := previewServer(t, k)
	var a, b api.Preview
	k.json("POST", "/sandboxes/"+sb+"/previews", api.CreatePreview{Port: 8000}, &a)
	k.json("POST", "/sandboxes/"+sb+"/previews", api.CreatePreview{Port: 8000}, &b)
	form := regexp.MustCompile(`^http://([0-9a-f]{16})\.localhost:` + port + `/preview/([A-Za-z0-9_-]{43})/$`)
	hosts := map[string]string{}
	for _, p := range []api.Preview{a, b} {
		m := form.FindStringSubmatch(p.URL)
		if m == nil || m[1] != p.ID || m[2] != p.Token {
			t.Fatalf("preview URL %q (id %s): want http://ID.localhost:%s/preview/TOKEN/", p.URL, p.ID, port)
		}
		u, _ := url.Parse(p.URL)
		hosts[p.ID] = u.Host
	}
	hostA, hostB := hosts[a.ID], hosts[b.ID]
	origins := map[string]bool{"http://" + hostA: true, "http://" + hostB: true, "http://" + k.addr: true, "http://localhost:" + port: true}
	if len(origins) != 4 {
		t.Errorf("the previews' origins are not their own: %q and %q", hostA, hostB)
	}

	hc := atLoopback(t, k.addr)
	for _, p := range []api.Preview{a, b} {
		if r := fetch(t, hc, "GET", p.URL+"page.html", ""); r.code != 200 || r.body != "the app's page\n" {
			t.Errorf("preview %s: %d %q", p.ID, r.code, r.body)
		}
	}
	// A preview's token reaches it on its own host alone.
	if r := fetch(t, hc, "GET", "http://"+hostB+"/preview/"+a.Token+"/page.html", ""); r.code != http.StatusUnauthorized {
		t.Errorf("A's token on B's host: %d %q", r.code, r.body)
	}

	// On a preview's host, kilnd's API and console answer nothing, with
	// the token or without.
	before := len(k.d.List())
	for _, target := range []string{"/", "/healthz", "/openapi.yaml", "/version", "/metrics", "/sandboxes", "/sandboxes/" + sb,
		"/sandboxes/" + sb + "/ports/8000/page.html", "/sandboxes/" + sb + "/previews", "/assets/index.js", "/page.html"} {
		for _, token := range []string{"", k.d.Token()} {
			if r := fetch(t, hc, "GET", "http://"+hostA+target, token); r.code != http.StatusNotFound || r.location != "" || !strings.Contains(r.body, `"not_found"`) {
				t.Errorf("GET %s on a preview's host (token %v): %d %q %.200q", target, token != "", r.code, r.location, r.body)
			}
		}
	}
	for _, target := range []string{"/sandboxes", "/sandboxes/" + sb + "/exec", "/sandboxes/" + sb + "/previews"} {
		if r := fetch(t, hc, "POST", "http://"+hostA+target, k.d.Token()); r.code != http.StatusNotFound {
			t.Errorf("POST %s on a preview's host: %d %.200q", target, r.code, r.body)
		}
	}
	if n := len(k.d.List()); n != before {
		t.Errorf("%d sandboxes, %d before: one was made on a preview's host", n, before)
	}
	var list []api.Preview
	k.json("GET", "/sandboxes/"+sb+"/previews", nil, &list)
	if len(list) != 2 {
		t.Errorf("%d previews, want the two made through kilnd's host", len(list))
	}

	// Names under localhost that are no preview's, and a preview's name
	// with another port, serve nothing: not the preview, not the API (a
	// preview id's form of no preview's is told the token is not its).
	for _, host := range []string{"app.localhost:" + port, "x." + hostA, "0123456789abcdef.localhost:" + port,
		a.ID + ".localhost:1", a.ID + ".localhost", a.ID + "x.localhost:" + port} {
		for _, target := range []string{"/preview/" + a.Token + "/page.html", "/sandboxes", "/"} {
			u := "http://" + host + target
			if r := fetch(t, hc, "GET", u, k.d.Token()); r.code != http.StatusNotFound && r.code != http.StatusUnauthorized || r.location != "" || !strings.Contains(r.body, `"error"`) {
				t.Errorf("GET %s: %d %q %.200q", u, r.code, r.location, r.body)
			}
		}
	}
	// The preview is served whatever the case of its host, and with its
	// trailing dot.
	if r := fetch(t, hc, "GET", "http://"+strings.ToUpper(a.ID)+".LocalHost.:"+port+"/preview/"+a.Token+"/page.html", ""); r.code != 200 {
		t.Errorf("the preview's host in upper case: %d %q", r.code, r.body)
	}

	// On kilnd's own hosts no preview is served: 404, never a redirect.
	for _, host := range []string{k.addr, "localhost:" + port, "[::1]:" + port} {
		for _, target := range []string{"/preview/" + a.Token + "/page.html", "/preview/" + a.Token + "/", "/preview/" + a.Token} {
			for _, token := range []string{"", k.d.Token()} {
				if r := fetch(t, hc, "GET", "http://"+host+target, token); r.code != http.StatusNotFound || r.location != "" || strings.Contains(r.body, "the app's page") {
					t.Errorf("GET %s on %s (token %v): %d %q %.200q", target, host, token != "", r.code, r.location, r.body)
				}
			}
		}
	}
	// Nor on the unix socket, whatever Host a request names.
	sock := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", filepath.Join(k.state, daemon.SocketName))
	}}}
	defer sock.CloseIdleConnections()
	if r := fetch(t, sock, "GET", a.URL+"page.html", ""); r.code != http.StatusNotFound {
		t.Errorf("a preview through the unix socket: %d %q", r.code, r.body)
	}
	if r := fetch(t, sock, "GET", "http://"+hostA+"/sandboxes", ""); r.code != http.StatusNotFound {
		t.Errorf("the API through the unix socket, naming a preview's host: %d %.200q", r.code, r.body)
	}
	// Made through the unix socket, a preview's URL names kilnd's TCP port.
	resp, err := sock.Post("http://kilnd/sandboxes/"+sb+"/previews", "application/json", strings.NewReader(`{"port":8000}`))
	if err != nil {
		t.Fatal(err)
	}
	var c api.Preview
	err = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || err != nil || !form.MatchString(c.URL) {
		t.Errorf("a preview made through the unix socket: %d %+v %v", resp.StatusCode, c, err)
	} else if r := fetch(t, hc, "GET", c.URL+"page.html", ""); r.code != 200 {
		t.Errorf("the preview made through the unix socket: %d %q", r.code, r.body)
	}

	// Revoked, a preview's host serves nothing.
	k.json("DELETE", "/sandboxes/"+sb+"/previews/"+a.ID, nil, nil)
	if r := fetch(t, hc, "GET", a.URL+"page.html", ""); r.code != http.StatusUnauthorized {
		t.Errorf("a revoked preview: %d %q", r.code, r.body)
	}
	if r := fetch(t, hc, "GET", b.URL+"page.html", ""); r.code != 200 {
		t.Errorf("the other preview, after the first was revoked: %d %q", r.code, r.body)
	}
}

// TestPreviewListenAndDomain: kilnd --preview-domain --preview-listen
// serves each preview at ID.DOMAIN on the previews' own listener alone,
// the URL naming that listener's port; that listener serves nothing
// else, whatever the Host, and the API's serves no preview.
func TestPreviewListenAndDomain(t *testing.T) {
	t.Parallel()
	const domain = "previews.kiln.test"
	previewAddr := freeAddr(t)
	k := startConfig(t, daemon.Config{PreviewDomain: domain, PreviewListen: previewAddr, AllowHosts: []string{"kiln.test"}})
	defer k.cleanup()
	if got := k.d.PreviewAddr(); got != previewAddr {
		t.Fatalf("PreviewAddr %q, want %q", got, previewAddr)
	}
	_, port, _ := net.SplitHostPort(k.addr)
	_, pport, _ := net.SplitHostPort(previewAddr)
	sb := previewServer(t, k)
	var p api.Preview
	k.json("POST", "/sandboxes/"+sb+"/previews", api.CreatePreview{Port: 8000}, &p)
	host := p.ID + "." + domain + ":" + pport
	if want := "http://" + host + "/preview/" + p.Token + "/"; p.URL != want {
		t.Fatalf("preview URL %q, want %q", p.URL, want)
	}
	previews, api := atLoopback(t, previewAddr), atLoopback(t, k.addr)
	if r := fetch(t, previews, "GET", p.URL+"page.html", ""); r.code != 200 || r.body != "the app's page\n" {
		t.Errorf("the preview on its listener: %d %q", r.code, r.body)
	}
	// A domain of kilnd's own takes any port: a proxy in front may
	// listen on another.
	if r := fetch(t, previews, "GET", "http://"+p.ID+"."+domain+"/preview/"+p.Token+"/page.html", ""); r.code != 200 {
		t.Errorf("the preview's host without a port: %d %q", r.code, r.body)
	}
	// The API's listener serves no preview, and no API on a preview's host.
	for _, target := range []string{"/preview/" + p.Token + "/page.html", "/sandboxes"} {
		if r := fetch(t, api, "GET", "http://"+p.ID+"."+domain+":"+port+target, k.d.Token()); r.code != http.StatusNotFound {
			t.Errorf("GET %s on the API's listener with the preview's host: %d %.200q", target, r.code, r.body)
		}
	}
	// The previews' listener serves nothing else, whatever the Host.
	for _, h := range []string{previewAddr, "localhost:" + pport, "kiln.test", "evil.example", "x." + p.ID + "." + domain, p.ID + ".localhost:" + pport, domain} {
		for _, target := range []string{"/", "/healthz", "/sandboxes", "/preview/" + p.Token + "/page.html"} {
			if r := fetch(t, previews, "GET", "http://"+h+target, k.d.Token()); r.code != http.StatusNotFound || !strings.Contains(r.body, `"not_found"`) {
				t.Errorf("GET %s on the previews' listener as %s: %d %.200q", target, h, r.code, r.body)
			}
		}
	}
	// The API is where it was, on the names kilnd serves it at; the names
	// under localhost are neither the API's nor the previews' now.
	for h, want := range map[string]int{k.addr: 200, "kiln.test": 200, "localhost:" + port: 200, "app.localhost:" + port: 403, "evil.example:" + port: 403} {
		if r := fetch(t, api, "GET", "http://"+h+"/sandboxes", k.d.Token()); r.code != want {
			t.Errorf("GET /sandboxes as %s: %d, want %d", h, r.code, want)
		}
	}
}

// TestPortTakesEveryMethod: a port's app gets PUT, PATCH, DELETE and POST
// with their bodies, through kilnd and the agent, and its answer back
// whole, however soon after the last byte it comes.
func TestPortTakesEveryMethod(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	const app = `import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def echo(self):
        body = self.command.encode() + b" " + self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_PUT = do_PATCH = do_DELETE = echo
    def do_GET(self):
        self.send_response(204)
        self.end_headers()
http.server.ThreadingHTTPServer(("127.0.0.1", 8001), H).serve_forever()
`
	if code, body := k.raw("PUT", "/sandboxes/"+sb+"/files/workspace/echo.py", []byte(app)); code/100 != 2 {
		t.Fatalf("writing the app: %d %s", code, body)
	}
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Command: "python3", Args: []string{"/workspace/echo.py"}}, &st)
	for deadline := time.Now().Add(15 * time.Second); ; {
		code, _ := k.raw("GET", "/sandboxes/"+sb+"/ports/8001/", nil)
		if code == http.StatusNoContent {
			break
		}
		if code != http.StatusBadGateway || time.Now().After(deadline) {
			t.Fatalf("the app in the sandbox: %d", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
	body := strings.Repeat("a line of the body\n", 4000) // past the copy buffers
	for _, m := range []string{"PUT", "PATCH", "DELETE", "POST"} {
		if code, got := k.raw(m, "/sandboxes/"+sb+"/ports/8001/echo", []byte(body)); code != 200 || got != m+" "+body {
			t.Errorf("%s with a body of %d bytes: %d, %d bytes back", m, len(body), code, len(got))
		}
	}
}
