// Package mcp is sandkiln's Model Context Protocol server: sandboxes, commands, processes paged by offsets, files and previews as tools a model calls, made through the Go SDK.
package mcp

import (
	"context"
	"fmt"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/version"
)

// Bounds on what one call gives a model, so that its context is never
// flooded: each result that carries output says which bound applied.
const (
	// DefaultOutputBytes and MaxOutputBytes bound the output one
	// process_output or exec result carries, and a file_read's content.
	DefaultOutputBytes = 16 << 10
	MaxOutputBytes     = 64 << 10
	// MinOutputBytes is the least a call may ask for: room for a few
	// lines and for any UTF-8 character.
	MinOutputBytes = 256
	// MaxEntries bounds a file_list or sandbox_list result.
	MaxEntries = 500
	// LogBytes is how much of a captured log a resource holds: its last
	// bytes.
	LogBytes = 64 << 10
)

// Server is sandkiln's MCP server. Every tool call is made through one
// client of kilnd; the server keeps no state of its own between calls (a
// process's output is read from the offsets the model gives back), so
// the same server serves any number of sessions, over stdio or HTTP.
type Server struct {
	c *client.Client
	s *mcp.Server
}

// instructions tell a model how the tools fit together.
const instructions = `sandkiln runs commands in isolated Linux sandboxes. Create a sandbox with sandbox_create, ` +
	`then run short commands with exec (it waits for the exit) or start long ones with process_start and read ` +
	`their output with process_output, passing back the next_offsets each result gives: nothing is missed or ` +
	`repeated. Every result that carries output says how much it may carry. Delete sandboxes you no longer need ` +
	`with sandbox_delete; sandbox_stop ends a sandbox's processes and keeps its files, for sandbox_start.`

// New returns the server of sandkiln's tools and captured-log resources,
// calling kilnd through c.
func New(c *client.Client) *Server {
	s := &Server{c: c, s: mcp.NewServer(&mcp.Implementation{Name: "sandkiln", Title: "sandkiln sandboxes", Version: version.Get().Version},
		&mcp.ServerOptions{Instructions: instructions, Capabilities: &mcp.ServerCapabilities{}})}
	s.addSandboxTools()
	s.addProcessTools()
	s.addFileTools()
	s.addLogs()
	return s
}

// Run serves one session on t, such as &mcp.StdioTransport{}, until the
// client goes or ctx ends.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	if err := s.s.Run(ctx, t); err != nil && ctx.Err() == nil {
		return fmt.Errorf("mcp: %w", err)
	}
	return nil
}

// Connect serves a session on t in the background, for a test holding
// the other end: the session ends when that end closes.
func (s *Server) Connect(ctx context.Context, t mcp.Transport) (*mcp.ServerSession, error) {
	return s.s.Connect(ctx, t, nil)
}

// Handler serves the streamable HTTP transport. It is stateless: each
// request is answered on its own, in JSON, with no session kept between
// requests (nothing to time out or leak); a GET for a stream of the
// server's own messages is refused (405), as the transport allows.
//
// It checks neither the token nor the Host: the caller puts it behind
// its own checks (kilnd's token, its --allow-host and --allow-origin),
// one set of rules for every route.
func (s *Server) Handler() http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.s }, &mcp.StreamableHTTPOptions{
		Stateless:                  true,
		JSONResponse:               true,
		DisableLocalhostProtection: true,
	})
}
