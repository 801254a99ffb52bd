// Routing: each sandbox's calls forwarded to its agent.

package daemon

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// running makes e the entry of sb, a running instance of its sandbox:
// its proxy to the agent, its last use now, and its watcher. Called with
// d.mu held.
func (d *Daemon) running(e *entry, sb sandbox.Instance, replay bool) {
	e.sb, e.proxy, e.lastUsed = sb, d.proxyTo(e.rec.ID, sb), time.Now()
	d.watch(e, replay)
}

// proxyTo is the proxy to the agent of sb, an instance of sandbox id:
// /sandboxes/{id}/rest goes to the agent as /rest.
func (d *Daemon) proxyTo(id string, sb sandbox.Instance) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport: sandbox.Transport(sb.Dial),
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "agent"
			pr.Out.Host = "agent"
			pr.Out.URL.Path, pr.Out.URL.RawPath = agentPath(pr.In.URL)
			// The token never reaches the agent.
			stripCredentials(pr.In, pr.Out.Header)
		},
		FlushInterval: -1, // output goes out as it comes
		BufferPool:    proxyBuffers,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if err := brokenUpload(r); err != nil {
				reply.Error(w, err)
				return
			}
			if !sb.Alive() {
				reply.Error(w, errdefs.New(errdefs.ErrUnavailable, "sandbox "+id+" is not running"))
				return
			}
			// The request may have reached the agent: nobody can say
			// whether it took effect. (What the transport said of it
			// names the agent's socket, a path of the host's.)
			reply.Error(w, errdefs.Opaque(errdefs.ErrOutcomeUnknown, "sandbox "+id+": no answer from the agent", err))
		},
	}
}

// proxyBuffers are the forwarding proxies' copy buffers: a file read or
// a tar moves in fewer, larger writes than the default 32 KiB.
var proxyBuffers = &bufferPool{sync.Pool{New: func() any { return new([proxyBuffer]byte) }}}

const proxyBuffer = 256 << 10

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte { return b.p.Get().(*[proxyBuffer]byte)[:] }

func (b *bufferPool) Put(x []byte) {
	if len(x) == proxyBuffer {
		b.p.Put((*[proxyBuffer]byte)(x))
	}
}

// agentPath is a process call's path at the agent: what follows
// /sandboxes/{id}, as the client escaped it. An escaped slash or dot stays
// inside its segment, a process id the agent does not know, instead of
// becoming a separator or a dot-dot the agent would clean and redirect.
func agentPath(u *url.URL) (path, rawPath string) {
	rest := u.EscapedPath()
	for range 2 { // "sandboxes", then the id
		_, after, ok := strings.Cut(strings.TrimPrefix(rest, "/"), "/")
		if !ok {
			return "/", ""
		}
		rest = "/" + after
	}
	path, err := url.PathUnescape(rest)
	if err != nil { // not from a parsed URL
		return "/", ""
	}
	return path, rest
}
