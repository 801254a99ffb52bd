package daemon

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/files"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

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
		reply.Error(w, fmt.Errorf("%w: sandbox %s: agent: %v", errdefs.ErrUnavailable, id, err))
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
		reply.Error(w, fmt.Errorf("%w: sandbox %s: agent: %v", errdefs.ErrUnavailable, id, err))
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
