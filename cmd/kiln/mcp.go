package main

import (
	"io"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/mcp"
)

func (c *cli) mcpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve sandkiln's tools to an MCP client (Claude, an IDE's agent) on stdin and stdout",
		Long: `Runs a Model Context Protocol server on stdin and stdout, for an MCP client to start: its tools create
sandboxes, run commands (exec), start processes and page through their output by offsets
(process_start, process_output), write their stdin, signal them, read, write and list files, and
make preview URLs; processes' captured logs are its resources. Every result that carries output
says how much it may carry. kilnd serves the same server over HTTP at /mcp, behind its token.

An MCP client's configuration:
  {"mcpServers": {"sandkiln": {"command": "kiln", "args": ["mcp"]}}}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.withClient(func(cl *client.Client) error {
				t := &sdk.IOTransport{Reader: io.NopCloser(c.stdin), Writer: nopWriteCloser{c.stdout}}
				return mcp.New(cl).Run(cmd.Context(), t)
			})
		},
	}
}

// nopWriteCloser leaves stdout open when the session ends: kiln's, not
// the session's, to close.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
