package daemon

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/sandkiln/sandkiln/internal/files"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// uploadBody is the body of an upload (PUT …/files/… or …/archive)
// proxied to the agent, counted, and keeping the error it failed with:
// such a body that breaks off changes nothing in the sandbox (uploads and
// extractions are all or nothing), so the answer is the client's fault,
// not an outcome unknown. The proxy's transport reads it, maybe still
// when its error handler looks: hence the atomics.
type uploadBody struct {
	io.ReadCloser
	path string // in the sandbox, for messages
	n    atomic.Int64
	err  atomic.Pointer[error]
}

func (b *uploadBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	if err != nil && err != io.EOF {
		b.err.Store(&err)
	}
	return n, err
}

// uploadKey is the context key of a proxied request's uploadBody.
type uploadKey struct{}

// watchUpload returns r with its body wrapped, and in its context, when r
// is an upload (see uploadBody).
func watchUpload(r *http.Request) *http.Request {
	if r.Method != http.MethodPut || r.Body == nil || r.Body == http.NoBody {
		return r
	}
	b := &uploadBody{ReadCloser: r.Body}
	path, _ := agentPath(r.URL)
	if rest, ok := strings.CutPrefix(path, "/files/"); ok {
		b.path = "/" + rest
	} else if path == "/archive" {
		b.path = r.URL.Query().Get("path")
	} else {
		return r
	}
	r = r.WithContext(context.WithValue(r.Context(), uploadKey{}, b))
	r.Body = b
	return r
}

// brokenUpload is the answer to a proxied request r (the proxy's, in the
// client's request's context) when it is an upload whose body broke off,
// or nil.
func brokenUpload(r *http.Request) error {
	b, ok := r.Context().Value(uploadKey{}).(*uploadBody)
	if !ok || b.err.Load() == nil {
		return nil
	}
	return files.BrokeOff(b.path, b.n.Load(), *b.err.Load())
}

// handover serves a file's GET or PUT itself, with the file the agent
// hands over (files.Handover), so that its content goes between the
// client's connection and the file once, by sendfile for a GET, rather
// than through two proxies. It says false for a request it leaves to the
// proxy: any other, or one for a sandbox whose agent cannot hand a
// descriptor to the host (gVisor's is inside its kernel).
func (d *Daemon) handover(w http.ResponseWriter, r *http.Request, e *entry) bool {
	path, rawPath := agentPath(r.URL)
	rest, ok := strings.CutPrefix(path, "/files/")
	if !ok {
		return false
	}
	q := r.URL.Query()
	switch r.Method {
	case http.MethodPut:
	case http.MethodGet:
		if q.Has("watch") || q.Has("stat") || r.Header.Get("Upgrade") != "" {
			return false
		}
	default:
		return false
	}
	d.mu.Lock()
	sb, id, runtime := e.sb, e.rec.ID, runtimeOf(e.rec)
	d.mu.Unlock()
	if runtime != sandbox.RuntimeNamespaces || sb == nil {
		d.metrics.files.WithLabelValues(r.Method, "proxy").Inc()
		return false
	}
	conn, err := sb.Dial(r.Context())
	if err != nil {
		reply.Error(w, unreachable(id, err))
		return true
	}
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		conn.Close()
		d.metrics.files.WithLabelValues(r.Method, "proxy").Inc()
		return false
	}
	rawRest := ""
	if rawPath != "" {
		rawRest = strings.TrimPrefix(rawPath, "/files/")
	}
	h, resp, err := files.Handover(uc, r, rest, rawRest)
	if err != nil {
		reply.Error(w, unreachable(id, err))
		return true
	}
	if resp != nil {
		defer resp.Body.Close()
		for k, v := range resp.Header {
			if k != "Connection" && k != "Keep-Alive" {
				w.Header()[k] = v
			}
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
		return true
	}
	defer h.Close()
	d.metrics.files.WithLabelValues(r.Method, "handover").Inc()
	if r.Method == http.MethodGet {
		files.Serve(w, r, h.File(), h.Entry)
	} else {
		files.Write(w, r.Body, "/"+rest, h)
	}
	return true
}
