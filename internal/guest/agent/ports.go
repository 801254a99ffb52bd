package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/forward"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// The agent is in the sandbox's network namespace: its 127.0.0.1 is the
// sandbox's, where a server started inside listens.

// portDialTimeout bounds the connection to a port inside.
const portDialTimeout = 10 * time.Second

// portTransport carries the proxied requests; it keeps idle connections
// to each port, as a browser would.
var portTransport = &http.Transport{
	DialContext:         (&net.Dialer{Timeout: portDialTimeout}).DialContext,
	MaxIdleConnsPerHost: 16,
	IdleConnTimeout:     90 * time.Second,
}

// port reads the {port} of a route: 1 to 65535.
func port(r *http.Request) (int, error) {
	p, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != r.PathValue("port") {
		return 0, fmt.Errorf("%w: port %.16q: want 1 to 65535", errdefs.ErrInvalidArgument, r.PathValue("port"))
	}
	return p, nil
}

// proxyPort serves /ports/{port}/{path...}: the request, to the server
// on that port inside the sandbox, as HTTP (a WebSocket too: the upgrade
// passes through). A redirect is passed on, its location rewritten under
// the prefix kilnd serves the port at (the Kiln-Prefix header), never
// followed.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request) {
	p, err := port(r)
	if err != nil {
		reply.Error(w, err)
		return
	}
	target := "127.0.0.1:" + strconv.Itoa(p)
	prefix := r.Header.Get(api.PrefixHeader)
	// The app's path as the client escaped it: a %2F stays in its segment.
	raw := r.URL.EscapedPath()
	raw = strings.TrimPrefix(strings.TrimPrefix(raw, "/ports/"+r.PathValue("port")), "/")
	rest, err := url.PathUnescape(raw)
	if err != nil {
		reply.Error(w, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err))
		return
	}
	rp := &httputil.ReverseProxy{
		Transport: portTransport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = &url.URL{Scheme: "http", Host: target, Path: "/" + rest, RawPath: "/" + raw, RawQuery: pr.In.URL.RawQuery}
			pr.Out.Host = target
			pr.Out.Header.Del(api.PrefixHeader)
			if prefix != "" {
				pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(api.ErrorHeader) // the app's answer is not one of kilnd's errors
			// Every sandbox's app shares kilnd's origin: none may claim
			// more of it than its prefix, with a service worker's scope
			// or a cookie's path.
			resp.Header.Del("Service-Worker-Allowed")
			if prefix != "" {
				rescopeCookies(resp.Header, prefix)
			}
			for _, h := range []string{"Location", "Content-Location"} {
				if loc := resp.Header.Get(h); loc != "" {
					resp.Header.Set(h, underPrefix(loc, prefix, p))
				}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, syscall.ECONNREFUSED) {
				reply.Error(w, errdefs.New(errdefs.ErrBadGateway, fmt.Sprintf("nothing listens on port %d in the sandbox (127.0.0.1:%d)", p, p)))
				return
			}
			if errors.Is(err, context.Canceled) {
				return // the client went
			}
			reply.Error(w, errdefs.New(errdefs.ErrBadGateway, fmt.Sprintf("port %d in the sandbox: %v", p, err)))
		},
		FlushInterval: -1, // streamed answers (server-sent events, logs) go out as they come
	}
	rp.ServeHTTP(w, forward.Body(r))
}

// underPrefix rewrites a location the app gave: a path on its own server,
// or a URL naming it as 127.0.0.1 or localhost with its port, becomes the
// same path under prefix. Any other location is left alone.
func underPrefix(loc, prefix string, port int) string {
	if prefix == "" {
		return loc
	}
	u, err := url.Parse(loc)
	if err != nil {
		return loc
	}
	switch {
	case u.Scheme == "" && u.Host == "" && strings.HasPrefix(u.Path, "/"):
	case (u.Scheme == "http" || u.Scheme == "https") && localHost(u.Host, port):
		u.Scheme, u.Host = "", ""
	default:
		return loc // relative, or another server: the browser resolves it
	}
	u.Path = strings.TrimSuffix(prefix, "/") + u.Path
	if u.RawPath != "" {
		u.RawPath = strings.TrimSuffix(prefix, "/") + u.RawPath
	}
	return u.String()
}

// rescopeCookies puts the app's cookies under prefix: a cookie for its
// "/" is one for prefix's, not for every sandbox's.
func rescopeCookies(h http.Header, prefix string) {
	cookies := h.Values("Set-Cookie")
	if len(cookies) == 0 {
		return
	}
	h.Del("Set-Cookie")
	for _, line := range cookies {
		parts := strings.Split(line, ";")
		scoped := false
		for i, p := range parts {
			k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
			if strings.EqualFold(k, "path") {
				if !strings.HasPrefix(v, "/") {
					v = "/"
				}
				parts[i] = " Path=" + strings.TrimSuffix(prefix, "/") + v
				scoped = true
			}
		}
		if !scoped {
			parts = append(parts, " Path="+strings.TrimSuffix(prefix, "/")+"/")
		}
		h.Add("Set-Cookie", strings.Join(parts, ";"))
	}
}

// localHost reports whether host (with its port) names the app's server.
func localHost(host string, port int) bool {
	h, p, err := net.SplitHostPort(host)
	if err != nil || p != strconv.Itoa(port) {
		return false
	}
	return h == "127.0.0.1" || h == "localhost" || h == "0.0.0.0" || h == "::1"
}

// forwardPort serves /tcp/{port}: a WebSocket whose binary messages are a
// TCP connection's bytes to the port inside, each way, as kubectl
// port-forward carries one.
func (s *Server) forwardPort(w http.ResponseWriter, r *http.Request) {
	p, err := port(r)
	if err != nil {
		reply.Error(w, err)
		return
	}
	// Dialled first: a port nobody listens on is a clear answer, not a
	// WebSocket that closes at once.
	var d net.Dialer
	ctx, cancel := context.WithTimeout(r.Context(), portDialTimeout)
	tcp, err := d.DialContext(ctx, "tcp", "127.0.0.1:"+strconv.Itoa(p))
	cancel()
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			reply.Error(w, errdefs.New(errdefs.ErrBadGateway, fmt.Sprintf("nothing listens on port %d in the sandbox (127.0.0.1:%d)", p, p)))
			return
		}
		reply.Error(w, errdefs.New(errdefs.ErrBadGateway, fmt.Sprintf("port %d in the sandbox: %v", p, err)))
		return
	}
	defer tcp.Close()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{api.ProtocolTCP}, InsecureSkipVerify: true})
	if err != nil {
		return // Accept has answered
	}
	defer c.CloseNow()
	ws := websocket.NetConn(r.Context(), c, websocket.MessageBinary)
	done := make(chan struct{})
	go func() {
		io.Copy(tcp, ws) // the client's bytes
		if cw, ok := tcp.(*net.TCPConn); ok {
			cw.CloseWrite()
		}
		close(done)
	}()
	io.Copy(ws, tcp) // the server's
	// The close handshake on the conn itself: ws.Close cancels its own
	// read first, which may drop the connection before the close frame is
	// out, and the client sees the server's close as a broken one.
	c.Close(websocket.StatusNormalClosure, "")
	tcp.Close()
	<-done
}
