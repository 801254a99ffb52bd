package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCPOnStdio: kiln mcp serves an MCP session on its stdin and stdout
// until the client closes them, and then exits 0.
func TestMCPOnStdio(t *testing.T) {
	state := kilnd(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	exited := make(chan int, 1)
	var errs strings.Builder
	go func() {
		code := run(ctx, []string{"--state-dir", state, "mcp"}, inR, outW, &errs)
		outW.Close()
		exited <- code
	}()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &sdk.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "sandbox_create", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("sandbox_create: %v %v", err, res)
	}
	id := res.StructuredContent.(map[string]any)["id"].(string)
	res, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "exec", Arguments: map[string]any{"sandbox": id, "command": "echo hello from $0"}})
	if err != nil || res.IsError || res.StructuredContent.(map[string]any)["stdout"] != "hello from /bin/sh\n" {
		t.Fatalf("exec: %v %+v", err, res)
	}
	cs.Close()
	if code := <-exited; code != 0 {
		t.Errorf("kiln mcp exited %d: %s", code, errs.String())
	}
}
