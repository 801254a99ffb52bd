package client_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
)

// The examples run against a kilnd this test binary starts (as root); a
// program would use client.New(client.Options{}) to reach the system's.
var example struct {
	once sync.Once
	k    *daemontest.Kilnd
}

func exampleClient() *client.Client {
	example.once.Do(func() {
		state, err := os.MkdirTemp("", "kiln-example-")
		if err != nil {
			panic(err)
		}
		if example.k, err = daemontest.Start(state, "127.0.0.1:0"); err != nil {
			panic(err)
		}
	})
	c, err := client.New(client.Options{StateDir: example.k.State})
	if err != nil {
		panic(err)
	}
	return c
}

// stopExampleKilnd stops the examples' kilnd, if they started one; its
// error says what went wrong, answers that did not match the OpenAPI
// document among them.
func stopExampleKilnd() error {
	if example.k == nil {
		return nil
	}
	defer os.RemoveAll(example.k.State)
	return example.k.Close()
}

// A build whose progress is shown as it happens, then its exit code.
func Example_buildWithProgress() {
	ctx := context.Background()
	c := exampleClient()
	defer c.Close()
	sb, err := c.CreateSandbox(ctx, client.SandboxOptions{})
	if err != nil {
		panic(err)
	}
	defer sb.Delete(ctx, true)

	p, err := sb.Start(ctx, client.StartOptions{Command: "sh", Args: []string{"-c",
		"for step in compile link test; do echo \"[$step] done\"; sleep 0.05; done; echo 'warning: 1 flaky test' >&2"}})
	if err != nil {
		panic(err)
	}
	defer p.Detach()
	for line, err := range client.ReadLines(p.Output(ctx), 16<<10) {
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %s\n", line.Stream, line.Text)
	}
	r, err := p.Wait(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Exit, "- output complete:", r.OutputComplete)
	// (Lines of stdout and stderr written close together may come in
	// either order: each pipe is read on its own.)
	//
	// Unordered output:
	// stdout: [compile] done
	// stdout: [link] done
	// stdout: [test] done
	// stderr: warning: 1 flaky test
	// process exited with code 0 - output complete: true
}

// A worker fed requests over stdin while its answers are read.
func Example_interactiveWorker() {
	ctx := context.Background()
	c := exampleClient()
	defer c.Close()
	sb, err := c.CreateSandbox(ctx, client.SandboxOptions{})
	if err != nil {
		panic(err)
	}
	defer sb.Delete(ctx, true)

	// A worker that answers each request line.
	p, err := sb.Start(ctx, client.StartOptions{Command: "sh", Args: []string{"-c",
		`while read -r req; do echo "handled $req"; done; echo "worker: end of input"`}, Stdin: true})
	if err != nil {
		panic(err)
	}
	defer p.Detach()
	for _, req := range []string{"first request", "second request"} {
		if err := p.Write(ctx, []byte(req+"\n")); err != nil {
			panic(err)
		}
	}
	if err := p.CloseStdin(ctx); err != nil {
		panic(err)
	}
	for line, err := range client.ReadLines(p.Output(ctx), 0) {
		if err != nil {
			panic(err)
		}
		fmt.Println(line.Text)
	}
	r, _ := p.Wait(ctx)
	fmt.Println(r.Exit)
	// Output:
	// handled first request
	// handled second request
	// worker: end of input
	// process exited with code 0
}

// A server whose logs are read until it says it is ready, reached from
// outside through a preview URL (ready once it answers, within 15 s),
// then stopped within a 10 s budget and its sandbox destroyed.
func Example_serverWorkspace() {
	ctx := context.Background()
	c := exampleClient()
	defer c.Close()
	sb, err := c.CreateSandbox(ctx, client.SandboxOptions{})
	if err != nil {
		panic(err)
	}
	defer sb.Delete(ctx, true)

	p, err := sb.Start(ctx, client.StartOptions{Command: "python3", Args: []string{"-u", "-c", `
import http.server, socketserver
srv = socketserver.TCPServer(("127.0.0.1", 8000), http.server.SimpleHTTPRequestHandler)
print("serving on port 8000")
srv.serve_forever()
`}})
	if err != nil {
		panic(err)
	}
	defer p.Detach()
	ready, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for line, err := range client.ReadLines(p.Output(ready), 0) {
		if err != nil {
			panic(err)
		}
		if strings.Contains(line.Text, "serving") {
			fmt.Println("log:", line.Text)
			break
		}
	}
	// A URL for a browser or a colleague: no kilnd token in it, and a host
	// of its own, ID.localhost. Browsers and curl take every name under
	// localhost for this machine; Go's resolver would ask DNS, so the
	// program dials loopback for them.
	preview, err := sb.Preview(ctx, 8000, time.Hour)
	if err != nil {
		panic(err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, port, err := net.SplitHostPort(addr); err == nil && strings.HasSuffix(host, ".localhost") {
			addr = net.JoinHostPort("127.0.0.1", port)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}}
	defer hc.CloseIdleConnections()
	for {
		resp, err := hc.Get(preview.URL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				fmt.Println("ready through the preview URL:", resp.Status)
				break
			}
		}
		select {
		case <-ready.Done():
			panic("not ready within 15 s")
		case <-time.After(50 * time.Millisecond):
		}
	}
	cleanup, done := context.WithTimeout(ctx, 10*time.Second)
	defer done()
	if _, err := p.Terminate(cleanup); err != nil {
		panic(err)
	}
	res, err := p.Wait(cleanup)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Exit)
	// Output:
	// log: serving on port 8000
	// ready through the preview URL: 200 OK
	// process killed by signal KILL
}
