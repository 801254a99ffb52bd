package client_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/client"
)

// echoEnv makes this test binary, copied into a sandbox, an HTTP server
// on the address it names: /ws echoes WebSocket messages, /go redirects
// to /there.
const echoEnv = "KILN_TEST_ECHO_ADDR"

func serveEcho(addr string) {
	m := http.NewServeMux()
	m.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(r.Context())
			if err != nil {
				return
			}
			c.Write(r.Context(), typ, append([]byte("echo: "), b...))
		}
	})
	m.HandleFunc("/cookie", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", "a=1; Path=/; HttpOnly")
		w.Header().Add("Set-Cookie", "b=2")
		w.Header().Set("Service-Worker-Allowed", "/")
	})
	m.HandleFunc("/go", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/there?x=1", http.StatusFound)
	})
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s prefix=%s", r.Method, r.URL.RequestURI(), r.Header.Get("X-Forwarded-Prefix"))
	})
	http.ListenAndServe(addr, m)
}

// atLoopback dials a name under localhost at loopback, as browsers and
// curl resolve them (RFC 6761), and any other address as it is: Go's
// resolver would ask DNS for a preview's host.
func atLoopback(ctx context.Context, network, addr string) (net.Conn, error) {
	if host, port, err := net.SplitHostPort(addr); err == nil && strings.HasSuffix(host, ".localhost") {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// TestPorts: a server started inside is reached through kilnd, over HTTP
// (redirects rewritten, not followed), WebSocket and a forwarded TCP
// stream; a port nobody listens on says so; a preview URL, on a host of
// its own, reaches it without kilnd's token until it is revoked. It is
// the streaming seed's server workspace, run as a user would.
func TestPorts(t *testing.T) {
	t.Parallel()
	k := startKilndOn(t, "127.0.0.1:0")
	_, sb := clientOf(t, k.State)
	ctx := ctxT(t)
	addr := k.Daemon.TCPAddr()
	self, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	_, err = sb.WriteFile(ctx, "/workspace/server", self, 0o755)
	self.Close()
	if err != nil {
		t.Fatal(err)
	}
	p, err := sb.Start(ctx, client.StartOptions{Command: "/workspace/server", Env: map[string]string{echoEnv: "127.0.0.1:8000"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Terminate(context.Background())
	// Ready once it answers: nothing listens before it does.
	var resp *http.Response
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err = sb.PortRequest(ctx, "GET", 8000, "/hello?a=b", nil)
		if err == nil {
			break
		}
		if !client.IsBadGateway(err) || time.Now().After(deadline) {
			t.Fatalf("the server never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	prefix := "/sandboxes/" + sb.ID + "/ports/8000"
	if string(b) != "GET /hello?a=b prefix="+prefix {
		t.Errorf("through kilnd: %q", b)
	}
	// A redirect is the app's answer, passed on under kilnd's prefix.
	if resp, err = sb.PortRequest(ctx, "GET", 8000, "/go", nil); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != prefix+"/there?x=1" {
		t.Errorf("redirect: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if _, err := sb.PortRequest(ctx, "GET", 8001, "/", nil); !client.IsBadGateway(err) || !strings.Contains(err.Error(), "nothing listens on port 8001") {
		t.Errorf("a port nobody listens on: %v", err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: atLoopback}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer hc.CloseIdleConnections()

	// A WebSocket through the port's proxy.
	ws, _, err := websocket.Dial(ctx, "ws://"+addr+prefix+"/ws", &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + k.Daemon.Token()}}})
	if err != nil {
		t.Fatal(err)
	}
	ws.Write(ctx, websocket.MessageText, []byte("hi"))
	if _, msg, err := ws.Read(ctx); err != nil || string(msg) != "echo: hi" {
		t.Errorf("WebSocket: %q %v", msg, err)
	}
	ws.Close(websocket.StatusNormalClosure, "")

	// A TCP stream, as kiln port-forward carries each connection.
	conn, err := sb.DialPort(ctx, 8000)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /over-tcp HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	tr, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(tr.Body)
	conn.Close()
	if string(b) != "GET /over-tcp prefix=" {
		t.Errorf("over the TCP stream: %q", b)
	}
	if _, err := sb.DialPort(ctx, 8001); !client.IsBadGateway(err) {
		t.Errorf("a TCP stream to a port nobody listens on: %v", err)
	}

	// A preview: no token of kilnd's, its own in the path, on a host of
	// its own.
	pv, err := sb.Preview(ctx, 8000, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	host := pv.ID + ".localhost:" + port
	if want := "http://" + host + "/preview/" + pv.Token + "/"; pv.URL != want {
		t.Fatalf("preview URL %q, want %q", pv.URL, want)
	}
	get := func(url string) (int, string, string) {
		resp, err := hc.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header.Get("Location")
	}
	if code, body, _ := get(pv.URL + "page"); code != 200 || body != "GET /page prefix=/preview/"+pv.Token {
		t.Errorf("the preview: %d %q", code, body)
	}
	if code, _, loc := get(pv.URL + "go"); code != http.StatusFound || loc != "/preview/"+pv.Token+"/there?x=1" {
		t.Errorf("a redirect under the preview: %d %q", code, loc)
	}
	// An app's cookies and service workers stay under its preview's
	// prefix, on its own host.
	if resp, err := hc.Get(pv.URL + "cookie"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		want := []string{"a=1; Path=/preview/" + pv.Token + "/; HttpOnly", "b=2; Path=/preview/" + pv.Token + "/"}
		if got := resp.Header.Values("Set-Cookie"); strings.Join(got, "|") != strings.Join(want, "|") || resp.Header.Get("Service-Worker-Allowed") != "" {
			t.Errorf("cookies %q, Service-Worker-Allowed %q; want %q and none", got, resp.Header.Get("Service-Worker-Allowed"), want)
		}
	}
	// An escaped slash stays in its segment on the way to the app.
	if code, body, _ := get(pv.URL + "a%2Fb"); code != 200 || body != "GET /a%2Fb prefix=/preview/"+pv.Token {
		t.Errorf("an escaped slash: %d %q", code, body)
	}
	for name, tc := range map[string]struct {
		url  string
		want int
	}{
		"an unknown token":           {"http://" + host + "/preview/" + strings.Repeat("A", len(pv.Token)) + "/page", http.StatusUnauthorized},
		"kilnd's token as a preview": {"http://" + host + "/preview/" + k.Daemon.Token() + "/page", http.StatusUnauthorized},
		"no token":                   {"http://" + host + "/preview//page", http.StatusBadRequest},
		"kilnd's host":               {"http://" + addr + "/preview/" + pv.Token + "/page", http.StatusNotFound},
		"kilnd's API, on its host":   {"http://" + host + "/sandboxes", http.StatusNotFound},
	} {
		if code, body, _ := get(tc.url); code != tc.want {
			t.Errorf("%s: %d %q, want %d", name, code, body, tc.want)
		}
	}
	list, err := sb.Previews(ctx)
	if err != nil || len(list) != 1 || list[0].ID != pv.ID || list[0].Token != "" {
		t.Errorf("previews: %+v %v", list, err)
	}
	// A WebSocket through the preview, open when it is revoked: it ends.
	wsURL := "ws" + strings.TrimPrefix(pv.URL, "http") + "ws"
	ws, _, err = websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, b, err := ws.Read(ctx); err != nil || string(b) != "echo: hi" {
		t.Fatalf("a WebSocket through the preview: %q, %v", b, err)
	}
	if err := sb.RevokePreview(ctx, pv.ID); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	if _, b, err := ws.Read(rctx); err == nil || rctx.Err() != nil {
		t.Errorf("a WebSocket through a revoked preview still open: %q, %v", b, err)
	}
	rcancel()
	if code, _, _ := get(pv.URL + "page"); code != http.StatusUnauthorized {
		t.Errorf("a revoked preview: %d", code)
	}
	if _, err := sb.Preview(ctx, 70000, 0); !client.IsInvalid(err) {
		t.Errorf("a preview of port 70000: %v", err)
	}
}

// TestPortServerCloses: a server inside that answers and closes its end
// ends the connection normally, each of many times: the agent's close
// frame is out before the connection goes (it once was not, one time in a
// few hundred, and the client saw the end as a broken connection).
func TestPortServerCloses(t *testing.T) {
	t.Parallel()
	k := startKilndOn(t, "127.0.0.1:0")
	_, sb := clientOf(t, k.State)
	ctx := ctxT(t)
	const script = `
import socket
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 9000))
l.listen(16)
print("ready", flush=True)
while True:
    c, _ = l.accept()
    c.recv(16)
    c.sendall(b"bye\n")
    c.close()
`
	p, err := sb.Start(ctx, client.StartOptions{Command: "python3", Args: []string{"-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Terminate(context.Background())
	for ch, err := range p.Output(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(ch.Text, "ready") {
			break
		}
	}
	for i := range 1000 {
		c, err := sb.DialPort(ctx, 9000)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("hi\n")); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(b) != "bye\n" {
			t.Fatalf("connection %d: %q, %v; want bye and a normal end", i, b, err)
		}
	}
}
