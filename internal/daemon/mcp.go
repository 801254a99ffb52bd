package daemon

import (
	"net/http"

	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// serveMCP serves /mcp: the MCP server of Config.MCP, which answers each
// POST on its own (no session, nothing held between requests), so any
// other method is refused here in kilnd's own error shape.
func (d *Daemon) serveMCP(w http.ResponseWriter, r *http.Request) {
	switch {
	case d.cfg.MCP == nil:
		reply.Error(w, errdefs.New(errdefs.ErrNotFound, "this kilnd serves no MCP server at /mcp (run kiln mcp instead)"))
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		reply.Error(w, errdefs.New(errdefs.ErrMethodNotAllowed, "/mcp takes POST alone: its MCP server keeps no session to stream to"))
	default:
		d.cfg.MCP.ServeHTTP(w, r)
	}
}
