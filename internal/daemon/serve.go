// Serving: kilnd's listeners, their bounds, and who may call.

package daemon

import (
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// TCPAddr is the address the TCP listener listens on, once Serve has
// started it; empty without one.
func (d *Daemon) TCPAddr() string {
	ip, port := d.tcpAddr()
	if port == "" {
		return ""
	}
	return net.JoinHostPort(ip.String(), port)
}

// tcpAddr is the TCP listener's address and port, empty without one.
func (d *Daemon) tcpAddr() (net.IP, string) {
	a := d.tcp.Load()
	if a == nil {
		return nil, ""
	}
	return a.IP, strconv.Itoa(a.Port)
}

// Serve serves the API on the unix socket (no token: its mode keeps
// others out) and, when configured, on TCP with the bearer token, until
// ctx ends. Sandboxes keep running after it returns.
func (d *Daemon) Serve(ctx context.Context) error {
	sock := filepath.Join(d.cfg.StateDir, SocketName)
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		return fmt.Errorf("kilnd: another kilnd serves %s", sock)
	}
	if c := d.cfg.Cluster; c != nil && d.cluster == nil {
		if err := d.joinCluster(*c); err != nil {
			return fmt.Errorf("kilnd: %w", err)
		}
	}
	ul, tl, pl, err := d.listen(sock)
	if err != nil {
		return err
	}
	wrap := func(h http.Handler) http.Handler {
		if d.cfg.Wrap != nil {
			return d.cfg.Wrap(h)
		}
		return h
	}
	servers := []*http.Server{newServer(wrap(d.Handler(false)), d.cfg.ReadTimeout)}
	listeners := []net.Listener{ul}
	if tl != nil {
		servers = append(servers, newServer(wrap(d.Handler(true)), d.cfg.ReadTimeout))
		listeners = append(listeners, tl)
	}
	if pl != nil {
		servers = append(servers, newServer(wrap(d.PreviewHandler()), d.cfg.ReadTimeout))
		listeners = append(listeners, pl)
	}
	if d.cluster != nil && tl != nil {
		d.cluster.SetAPIURL("http://" + tl.Addr().String())
	}
	errs := make(chan error, len(servers))
	for i, s := range servers {
		go func() { errs <- s.Serve(limitListener(listeners[i], maxConns)) }()
	}
	d.mu.Lock()
	n := len(d.sandboxes)
	d.mu.Unlock()
	listen := "" // the address bound: a port 0 asked for is chosen now
	if tl != nil {
		listen = tl.Addr().String()
	}
	previews := "" // where previews are served, each on a host of its own
	if port := d.previewPort(); port != "" {
		previews = "http://ID." + d.previewDomain() + ":" + port + "/"
	}
	// Where TCP clients find the token (its value is never logged).
	d.log.Info("kilnd serving", "instance", d.cfg.Instance, "socket", sock, "listen", listen, "token", filepath.Join(d.cfg.StateDir, TokenName),
		"sandboxes", n, "previews", previews, "egress_range", d.cfg.EgressRange, "uids_from", d.uids.First())
	var serr error
	select {
	case <-ctx.Done():
	case serr = <-errs:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		s.Shutdown(sctx)
	}
	// Its sandboxes keep their disks; the spare ones go.
	if d.disks != nil {
		d.disks.Close()
	}
	if errors.Is(serr, http.ErrServerClosed) {
		serr = nil
	}
	return serr
}

// listen opens kilnd's listeners: TCP and the previews' own when they are
// configured, then the unix socket at sock (mode 0600), last, so that once
// the socket answers, all do. Between them, the sandboxes recovered are
// adopted again (readopt).
func (d *Daemon) listen(sock string) (ul, tl, pl net.Listener, err error) {
	defer func() {
		if err != nil {
			for _, l := range []net.Listener{ul, tl, pl} {
				if l != nil {
					l.Close()
				}
			}
			ul, tl, pl = nil, nil, nil
		}
	}()
	if d.cfg.Listen != "" {
		if tl, err = net.Listen("tcp", d.cfg.Listen); err != nil {
			return nil, nil, nil, fmt.Errorf("kilnd: %w", err)
		}
		d.tcp.Store(tl.Addr().(*net.TCPAddr))
	}
	if d.cfg.PreviewListen != "" {
		if pl, err = net.Listen("tcp", d.cfg.PreviewListen); err != nil {
			return nil, tl, nil, fmt.Errorf("kilnd: previews: %w", err)
		}
		d.previewTCP.Store(pl.Addr().(*net.TCPAddr))
	}
	d.readopt()
	os.Remove(sock)
	if ul, err = net.Listen("unix", sock); err == nil {
		err = os.Chmod(sock, 0o600)
	}
	if err != nil {
		return ul, tl, pl, fmt.Errorf("kilnd: %w", err)
	}
	return ul, tl, pl, nil
}

// limitListener accepts at most n connections at a time.
func limitListener(l net.Listener, n int) net.Listener {
	return &limited{Listener: l, slots: make(chan struct{}, n)}
}

type limited struct {
	net.Listener
	slots chan struct{}
}

func (l *limited) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &slotConn{Conn: c, free: func() { <-l.slots }}, nil
}

type slotConn struct {
	net.Conn
	once sync.Once
	free func()
}

// SyscallConn lets the WebSocket relay splice to the connection.
func (c *slotConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, errors.ErrUnsupported
}

// CloseWrite lets the HTTP server end an answer it gives before closing
// (headers too large, a malformed request) with a FIN: without it the
// client gets a reset instead of the answer.
func (c *slotConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}

// newServer bounds what a client can hold: a request's headers and body
// must arrive in time (read, a minute when zero), and an idle connection
// is closed.
func newServer(h http.Handler, read time.Duration) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       cmp.Or(read, time.Minute), // bodies are at most 1 MiB
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
}

// authorized checks a TCP request's token: the Authorization header, or
// a WebSocket subprotocol kiln.token.<token> for clients that cannot set
// headers.
// authorized is nil for a request with kilnd's token, and otherwise says
// whether a token was missing or was not kilnd's.
func (d *Daemon) authorized(r *http.Request) error {
	want := []byte(d.token)
	presented, found := "", false
	if t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		presented, found = strings.TrimSpace(t), true
	} else {
		for _, p := range offeredProtocols(r) {
			if t, ok := strings.CutPrefix(p, api.TokenProtocolPrefix); ok {
				presented, found = t, true
				break
			}
		}
	}
	cluster := []byte{}
	if t := d.clusterToken.Load(); t != nil {
		cluster = []byte(*t)
	}
	switch {
	case !found:
		return errdefs.New(errdefs.ErrUnauthenticated, "a bearer token is required (the token file in kilnd's state directory)")
	case subtle.ConstantTimeCompare([]byte(presented), want) != 1 && (len(cluster) == 0 || subtle.ConstantTimeCompare([]byte(presented), cluster) != 1):
		return errdefs.New(errdefs.ErrUnauthenticated, "the bearer token is not kilnd's (compare it with the token file in kilnd's state directory)")
	}
	return nil
}

func offeredProtocols(r *http.Request) []string {
	var out []string
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func isTokenProtocol(p string) bool { return strings.HasPrefix(p, api.TokenProtocolPrefix) }

// hostAllowed refuses a TCP request for a Host that is not kilnd's: a web
// page whose own name was made to resolve to kilnd's address (DNS
// rebinding) reaches kilnd with that name. kilnd's are localhost, the
// loopback addresses and the address it listens on, with its port, and
// those configured. (The names under localhost are the previews', by
// default: see previewHost.)
func (d *Daemon) hostAllowed(r *http.Request) bool {
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		host, port = r.Host, "80" // no port: the scheme's
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	for _, h := range d.cfg.AllowHosts {
		if h = strings.ToLower(h); h == host || h == net.JoinHostPort(host, port) {
			return true
		}
	}
	tcpIP, tcpPort := d.tcpAddr()
	if port != tcpPort {
		return false
	}
	if host == "localhost" {
		return true // RFC 6761: never resolved elsewhere
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || !tcpIP.IsUnspecified() && ip.Equal(tcpIP))
}

// originAllowed refuses requests a web page makes behind a user's back:
// a browser sends Origin, and only kilnd's own or a listed one may pass.
func (d *Daemon) originAllowed(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	if o == "http://"+r.Host || o == "https://"+r.Host {
		return true
	}
	return slices.Contains(d.cfg.AllowOrigins, o)
}
