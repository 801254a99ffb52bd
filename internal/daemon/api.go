package daemon

import (
	"fmt"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/cors"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/decode"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/forward"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
	"github.com/sandkiln/sandkiln/internal/version"
)

// Route is one of kilnd's routes: a method (empty: any) and a pattern.
// Routes lists them all; the OpenAPI document must describe each, and a
// test holds the two together.
type Route struct {
	Method, Pattern string
	// Open routes need no token on TCP.
	Open bool
}

// Routes are kilnd's routes. The process routes are forwarded to the
// sandbox's agent.
var Routes = []Route{
	{"GET", "/{$}", true}, // the web console; it asks for the token itself
	{"GET", "/assets/{file}", true},
	{"GET", "/healthz", true},
	{"GET", "/readyz", true},
	{"GET", "/version", false},
	{"GET", "/openapi.yaml", true},
	{"GET", "/asyncapi.yaml", true},
	{"GET", "/metrics", false},
	{"GET", "/nodes", false},
	{"GET", "/nodes/{name}", false},
	{"POST", "/nodes/{name}/drain", false},
	{"DELETE", "/nodes/{name}/drain", false},
	{"POST", "/sandboxes", false},
	{"GET", "/sandboxes", false},
	{"GET", "/sandboxes/{id}", false},
	{"DELETE", "/sandboxes/{id}", false},
	{"POST", "/sandboxes/{id}/stop", false},
	{"POST", "/sandboxes/{id}/start", false},
	{"POST", "/sandboxes/{id}/restart", false},
	{"POST", "/sandboxes/{id}/snapshots", false},
	{"GET", "/sandboxes/{id}/snapshots", false},
	{"POST", "/sandboxes/{id}/rollback", false},
	{"POST", "/sandboxes/{id}/fork", false},
	{"GET", "/snapshots", false},
	{"GET", "/snapshots/{snapshot}", false},
	{"DELETE", "/snapshots/{snapshot}", false},
	{"GET", "/snapshots/{snapshot}/export", false},
	{"POST", "/snapshots/import", false},
	{"POST", "/sandboxes/{id}/pause", false},
	{"POST", "/sandboxes/{id}/resume", false},
	{"GET", "/sandboxes/{id}/stats", false},
	{"GET", "/sandboxes/{id}/logs", false},
	{"GET", "/sandboxes/{id}/logs/{pid}", false},
	{"", "/sandboxes/{id}/exec", false},
	{"", "/sandboxes/{id}/exec-stream", false},
	{"", "/sandboxes/{id}/exec-stream/", false},
	{"GET", "/sandboxes/{id}/exec-stream", false},
	{"GET", "/sandboxes/{id}/exec-stream/{pid}", false},
	{"", "/sandboxes/{id}/files/", false},
	{"", "/sandboxes/{id}/archive", false},
	{"", "/sandboxes/{id}/ports/", false},
	{"GET", "/sandboxes/{id}/tcp/{port}", false},
	{"GET", "/sandboxes/{id}/top", false},
	{"POST", "/sandboxes/{id}/previews", false},
	{"GET", "/sandboxes/{id}/previews", false},
	{"DELETE", "/sandboxes/{id}/previews/{preview}", false},
	{"GET", "/events", false},
	{"GET", "/images", false},
	{"POST", "/images/pull", false},
	{"POST", "/images/import", false},
	{"GET", "/images/{name...}", false},
	{"DELETE", "/images/{name...}", false},
	{"", "/mcp", false},
}

// Handler is kilnd's API. Over TCP (tcp set) every request but the open
// ones needs the token; on the unix socket the socket's mode keeps others
// out. A request naming a host under the previews' domain never reaches
// the API or the console: over TCP it is a preview's, unless previews
// have a listener of their own, and otherwise it is answered 404; and a
// preview's path is answered 404 on every other host.
//
// It is long because it is the route table: every route of the API in one
// place, as the OpenAPI document lists them.
func (d *Daemon) Handler(tcp bool) http.Handler {
	handlers := map[string]http.HandlerFunc{
		"GET /{$}":                   d.console.ServeIndex,
		"GET /assets/{file}":         d.console.ServeAsset,
		"GET /healthz":               d.healthz,
		"GET /readyz":                d.readyz,
		"GET /nodes":                 d.listNodes,
		"GET /nodes/{name}":          d.getNode,
		"POST /nodes/{name}/drain":   d.drainNode(true),
		"DELETE /nodes/{name}/drain": d.drainNode(false),
		"GET /openapi.yaml": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/yaml")
			w.Write(api.OpenAPI)
		},
		"GET /asyncapi.yaml": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/yaml")
			w.Write(api.AsyncAPI)
		},
		"GET /version": func(w http.ResponseWriter, r *http.Request) {
			reply.JSON(w, http.StatusOK, version.Get())
		},
		"GET /metrics":    d.metrics.handler.ServeHTTP,
		"POST /sandboxes": d.createHandler,
		"GET /sandboxes":  d.listHandler,
		"GET /sandboxes/{id}": func(w http.ResponseWriter, r *http.Request) {
			e, err := d.get(r.PathValue("id"))
			if err != nil {
				reply.Error(w, err)
				return
			}
			reply.JSON(w, http.StatusOK, d.infoOf(e))
		},
		"DELETE /sandboxes/{id}": func(w http.ResponseWriter, r *http.Request) {
			removeLogs, err := strconv.ParseBool(defaultString(r.URL.Query().Get("remove_logs"), "false"))
			if err != nil {
				reply.Error(w, fmt.Errorf("%w: remove_logs must be true or false", errdefs.ErrInvalidArgument))
				return
			}
			if err := d.Delete(r.PathValue("id"), removeLogs); err != nil {
				reply.Error(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		},
		"POST /sandboxes/{id}/stop":                 d.stopHandler,
		"POST /sandboxes/{id}/snapshots":            d.snapshotHandler,
		"GET /sandboxes/{id}/snapshots":             d.listSnapshotsHandler,
		"POST /sandboxes/{id}/rollback":             d.rollbackHandler,
		"POST /sandboxes/{id}/fork":                 d.forkHandler,
		"GET /snapshots":                            d.listSnapshotsHandler,
		"GET /snapshots/{snapshot}":                 d.getSnapshotHandler,
		"DELETE /snapshots/{snapshot}":              d.removeSnapshotHandler,
		"GET /snapshots/{snapshot}/export":          d.exportSnapshotHandler,
		"POST /snapshots/import":                    d.importSnapshotHandler,
		"GET /sandboxes/{id}/exec-stream":           d.listProcesses,
		"GET /sandboxes/{id}/exec-stream/{pid}":     d.getProcess,
		"POST /sandboxes/{id}/start":                d.startHandler,
		"POST /sandboxes/{id}/restart":              d.restartHandler,
		"POST /sandboxes/{id}/pause":                d.pauseHandler,
		"POST /sandboxes/{id}/resume":               d.resumeHandler,
		"GET /sandboxes/{id}/stats":                 d.statsHandler,
		"GET /sandboxes/{id}/logs":                  d.listLogs,
		"GET /sandboxes/{id}/logs/{pid}":            d.readLog,
		"/sandboxes/{id}/exec":                      d.forward,
		"/sandboxes/{id}/exec-stream":               d.forward,
		"/sandboxes/{id}/exec-stream/":              d.forward,
		"/sandboxes/{id}/files/":                    d.forward,
		"/sandboxes/{id}/archive":                   d.forward,
		"/sandboxes/{id}/ports/":                    d.forward,
		"GET /sandboxes/{id}/tcp/{port}":            d.forward,
		"GET /sandboxes/{id}/top":                   d.forward,
		"POST /sandboxes/{id}/previews":             d.createPreview(tcp),
		"GET /sandboxes/{id}/previews":              d.listPreviews,
		"DELETE /sandboxes/{id}/previews/{preview}": d.revokePreview,
		"GET /events":                               d.eventsHandler,
		"GET /images":                               d.listImages,
		"POST /images/pull":                         d.pullImage,
		"POST /images/import":                       d.importImage,
		"GET /images/{name...}":                     d.getImage,
		"DELETE /images/{name...}":                  d.removeImage,
		"/mcp":                                      d.serveMCP,
	}
	m := http.NewServeMux()
	open := map[string]bool{}
	for _, rt := range Routes {
		key := strings.TrimSpace(rt.Method + " " + rt.Pattern)
		m.Handle(key, route(handlers[key]))
		if rt.Open {
			open[key] = true
		}
	}
	guarded := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !d.originAllowed(r) {
			reply.Error(w, errdefs.New(errdefs.ErrPermissionDenied, "origin "+api.Clip(r.Header.Get("Origin"))+" is not allowed (see --allow-origin)"))
			return
		}
		// Before the token: an old preview URL is told where previews are.
		if strings.HasPrefix(r.URL.Path, previewPrefix) {
			reply.Error(w, errdefs.New(errdefs.ErrNotFound, "previews are served on hosts of their own, ID."+d.previewDomain()+", never on kilnd's"))
			return
		}
		if _, pattern := m.Handler(r); tcp && !open[pattern] {
			if err := d.authorized(r); err != nil {
				w.Header().Set("WWW-Authenticate", `Bearer realm="kilnd"`)
				reply.Error(w, err)
				return
			}
		}
		// Refused rather than redirected to the cleaned path: a client
		// that follows the redirect would reach another file than it named.
		// (An escaped dot or slash stays inside its segment, an id.)
		if p := r.URL.EscapedPath(); p != "/" && path.Clean(p) != strings.TrimSuffix(p, "/") {
			reply.Error(w, errdefs.New(errdefs.ErrInvalidArgument, fmt.Sprintf("path %s is not clean (no \"..\", \".\" or empty segment)", api.Clip(p))))
			return
		}
		// Set by kilnd alone, for the agent.
		r.Header.Del(api.PrefixHeader)
		if h, _ := m.Handler(r); isRoute(h) {
			if d.toOtherNode(w, r, tcp) {
				return
			}
			m.ServeHTTP(w, r) // which sets the path's values
			return
		}
		noRoute(w, r, m)
	})
	withCORS := d.cors().Handler(guarded)
	previews := d.previewHandler()
	return d.metrics.instrument(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ns := d.previewHost(r); ns {
			if tcp && d.cfg.PreviewListen == "" {
				previews.ServeHTTP(w, r)
			} else {
				notPreviewed(w, r)
			}
			return
		}
		if tcp && !d.hostAllowed(r) {
			reply.Error(w, errdefs.New(errdefs.ErrPermissionDenied, "host "+api.Clip(r.Host)+" is not one kilnd serves (see --allow-host)"))
			return
		}
		// Before Origin and CORS: the request is a preview's page's, and
		// its answer the preview's app's.
		if tcp && d.previewFromNode(w, r) {
			return
		}
		if appPath(r.URL.Path) {
			guarded.ServeHTTP(w, r)
			return
		}
		withCORS.ServeHTTP(w, r)
	}))
}

// route marks the handlers of kilnd's routes, to tell them from the
// ones a ServeMux makes itself when no route matches: its 404, its 405
// and its redirects to a path with a slash added.
type route http.HandlerFunc

func (h route) ServeHTTP(w http.ResponseWriter, r *http.Request) { h(w, r) }

func isRoute(h http.Handler) bool {
	_, ok := h.(route)
	return ok
}

// noRoute answers a request that no route takes: 405 with the methods
// the path has in Allow, as HTTP asks, or 404; in the API's error shape,
// and never a redirect (a client that follows one would call another
// route than it named).
func noRoute(w http.ResponseWriter, r *http.Request, m *http.ServeMux) {
	var allow []string
	for _, method := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"} {
		probe := *r
		probe.Method = method
		if h, _ := m.Handler(&probe); isRoute(h) {
			allow = append(allow, method)
		}
	}
	if len(allow) == 0 {
		reply.Error(w, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("no route %s %s", r.Method, api.Clip(r.URL.Path))))
		return
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	reply.Error(w, errdefs.New(errdefs.ErrMethodNotAllowed, fmt.Sprintf("%s %s: this path takes %s", r.Method, api.Clip(r.URL.Path), strings.Join(allow, ", "))))
}

// cors lets the pages of the origins kilnd allows (its own and
// --allow-origin's) call the API from a browser: a preflight is answered
// before authentication (it carries no token), and the answers to the
// calls themselves name the origin, never "*". Credentials are never
// allowed: the API takes a bearer token, set by the page, not cookies.
func (d *Daemon) cors() *cors.Cors {
	return cors.New(cors.Options{
		AllowOriginVaryRequestFunc: func(r *http.Request, origin string) (bool, []string) { return d.originAllowed(r), nil },
		AllowedMethods:             []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete},
		AllowedHeaders:             []string{"Authorization", "Content-Type", "Range"},
		ExposedHeaders:             []string{api.ErrorHeader, api.PathStatHeader, "Content-Range", "Accept-Ranges", "WWW-Authenticate"},
		MaxAge:                     600,
	})
}

// appPath says the path is a sandbox's app's (a port's proxy): its
// answers, and their CORS headers, are the app's to give.
func appPath(p string) bool {
	segs := strings.SplitN(p, "/", 5) // "", sandboxes, id, ports, rest
	return len(segs) == 5 && segs[1] == "sandboxes" && segs[3] == "ports"
}

func defaultString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (d *Daemon) createHandler(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if err := decodeBody(w, r, &req); err != nil {
		reply.Error(w, err)
		return
	}
	if d.placeCreate(w, r, &req) {
		return
	}
	req.Node, req.Constraints = "", nil
	claimed, err := d.claimClusterName(r.Context(), req.Name)
	if err != nil {
		reply.Error(w, err)
		return
	}
	info, err := d.Create(r.Context(), req)
	claimed(info.ID)
	if err != nil {
		reply.Error(w, err)
		return
	}
	w.Header().Set("Location", "/sandboxes/"+info.ID)
	reply.JSON(w, http.StatusCreated, info)
}

// decodeBody is the one request decoder (decode.Body), by the name
// kilnd's handlers call it.
var decodeBody = decode.Body

// forward sends a process call to the sandbox's agent.
func (d *Daemon) forward(w http.ResponseWriter, r *http.Request) {
	e, err := d.get(r.PathValue("id"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	d.mu.Lock()
	p, id, state, reason, op := e.proxy, e.rec.ID, e.rec.State, e.rec.Reason, e.op
	paused, agentPaused := e.paused(), e.agentPaused()
	e.inflight++
	e.lastUsed = time.Now()
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		e.inflight--
		e.lastUsed = time.Now()
		d.mu.Unlock()
	}()
	switch {
	case p == nil && op != nil && !op.stop:
		// Soon running: a client that retries gets there.
		reply.Error(w, fmt.Errorf("%w: sandbox %s is being started", errdefs.ErrUnavailable, id))
		return
	case p == nil && (state != StateRunning || op != nil):
		// For good (until a start): a client that retries would wait for
		// nothing.
		why := state + ": " + reason
		if state == StateRunning {
			why = "being stopped"
		}
		reply.Error(w, fmt.Errorf("%w: sandbox %s is %s", errdefs.ErrFailedPrecondition, id, why))
		return
	case p == nil:
		reply.Error(w, fmt.Errorf("%w: sandbox %s is being deleted", errdefs.ErrUnavailable, id))
		return
	}
	if paused {
		if err := pausedRefusal(r, id, agentPaused); err != nil {
			reply.Error(w, err)
			return
		}
	}
	// A port's proxy tells the agent where kilnd serves it, unless a
	// preview URL did.
	if p, _ := agentPath(r.URL); strings.HasPrefix(p, "/ports/") && r.Header.Get(api.PrefixHeader) == "" {
		r.Header.Set(api.PrefixHeader, portPrefix(r.URL))
	}
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		if !d.attachFilled(w, r, e) {
			d.relay(w, r, e)
		}
		return
	}
	if kind := startKind(r); kind != "" {
		ow := &observedWriter{ResponseWriter: w, observe: func(code int) {
			if code/100 == 2 {
				d.metrics.started.WithLabelValues(kind).Inc()
			}
		}}
		defer ow.done()
		w = ow
	}
	if d.handover(w, r, e) {
		return
	}
	p.ServeHTTP(w, forward.Body(watchUpload(r)))
}

// startKind says which kind of process start r is, or "" for another
// call.
func startKind(r *http.Request) string {
	if r.Method != http.MethodPost {
		return ""
	}
	switch r.Pattern {
	case "/sandboxes/{id}/exec":
		return startExec
	case "/sandboxes/{id}/exec-stream":
		return startExecStream
	}
	return ""
}

// relay serves a WebSocket by joining the client's connection to one to
// the agent: the request goes over (the token taken out), and once the
// agent has switched protocols, bytes flow both ways untouched; any other
// answer is an ordinary response (see readAnswer). Output, the heavy
// direction, is moved by the kernel (splice) and never copied through
// kilnd; an output watcher's agent takes the client's socket and writes
// to it itself (moveClient).
func (d *Daemon) relay(w http.ResponseWriter, r *http.Request, e *entry) {
	d.mu.Lock()
	sb, id, runtime := e.sb, e.rec.ID, runtimeOf(e.rec)
	d.mu.Unlock()
	agentConn, err := sb.Dial(r.Context())
	if err != nil {
		reply.Error(w, unreachable(id, err))
		return
	}
	defer agentConn.Close()
	out, echo := agentRequest(r, runtime)
	if err := out.Write(agentConn); err != nil {
		reply.Error(w, unreachable(id, err))
		return
	}
	sent, upgraded, moving, err := readAnswer(w, out, agentConn, echo)
	if err != nil {
		reply.Error(w, unreachable(id, err))
		return
	}
	if !upgraded {
		return // answered, and the connection is still the server's
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		reply.Error(w, fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err))
		return
	}
	defer conn.Close()
	d.join(r.Context(), conn, brw, agentConn, wsKind(out.URL.Path), sent, moving)
}

// agentRequest is the client's WebSocket request r as it goes to the
// agent of a sandbox of runtime: to the agent's path, without kilnd's
// token. echo is the protocol the answer must name for a client that
// offered the token protocol alone, or "".
func agentRequest(r *http.Request, runtime string) (out *http.Request, echo string) {
	out = r.Clone(r.Context())
	path, rawPath := agentPath(r.URL)
	out.URL = &url.URL{Path: path, RawPath: rawPath, RawQuery: r.URL.RawQuery}
	out.Host, out.RequestURI = "agent", ""
	stripCredentials(r, out.Header)
	// An output watcher of a sandbox whose agent shares kilnd's kernel is
	// offered its client's socket (see moveClient); another's goes
	// through kilnd.
	out.Header.Del(api.MoveHeader)
	if wsKind(path) == wsOutput && runtime == sandbox.RuntimeNamespaces && movableAddr(r) {
		out.Header.Set(api.MoveHeader, "1")
	}
	// A client that offers the token protocol alone (a browser's
	// WebSocket cannot set a header) speaks the default, kiln.raw; its
	// handshake fails unless the answer names a protocol it offered.
	if protos := offeredProtocols(r); len(protos) > 0 && !slices.ContainsFunc(protos, func(p string) bool { return !isTokenProtocol(p) }) {
		echo = protos[0]
	}
	return out, echo
}

// unreachable is the answer to a request kilnd could not take to sandbox
// id's agent, or whose answer it could not read: the cause kept, not
// shown (it names the agent's socket, a path of the host's).
func unreachable(id string, err error) error {
	return errdefs.Opaque(errdefs.ErrUnavailable, "sandbox "+id+": its agent cannot be reached", err)
}

// stripCredentials removes kilnd's token from headers bound for an agent:
// the Authorization header and a kiln.token.* WebSocket subprotocol.
func stripCredentials(in *http.Request, h http.Header) {
	h.Del("Authorization")
	if protos := offeredProtocols(in); len(protos) > 0 {
		h.Del("Sec-WebSocket-Protocol")
		if kept := slices.DeleteFunc(protos, isTokenProtocol); len(kept) > 0 {
			h.Set("Sec-WebSocket-Protocol", strings.Join(kept, ", "))
		}
	}
}
