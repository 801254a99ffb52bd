package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// The ports section: an HTTP server in a sandbox (this binary, in its
// child's server mode), reached directly in the sandbox's network
// namespace, through kilnd's port proxy, and through a preview URL.
const (
	portsRequests   = 2000
	targetPortAdded = time.Millisecond
	childHTTP       = "http"
	httpAddrEnv     = "SANDKILN_BENCH_HTTP_ADDR"
	portsAppPort    = 8000
)

type portsResult struct {
	direct, proxied, preview []time.Duration
	skipped                  string
}

// httpChildMain serves a fixed small answer on $SANDKILN_BENCH_HTTP_ADDR.
func httpChildMain() int {
	body := []byte(strings.Repeat("x", 512))
	err := http.ListenAndServe(os.Getenv(httpAddrEnv), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(body)
	}))
	fmt.Fprintln(os.Stderr, "bench http child:", err)
	return 1
}

// measurePorts times GET requests to the app, one at a time, the three
// ways interleaved.
// Long because a benchmark reads best as its steps in the order they run.
func measurePorts(ctx context.Context, cfg config) (*portsResult, error) {
	res := &portsResult{}
	if os.Geteuid() != 0 {
		res.skipped = "kilnd needs root"
		return res, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c, sb, done, err := kilndSandbox(ctx, "ports", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer done()
	f, err := os.Open(exe)
	if err != nil {
		return nil, err
	}
	err = c.stream(ctx, "PUT", "/sandboxes/"+sb.ID+"/files/workspace/app?mode=0755", f, nil)
	f.Close()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(portsAppPort)
	var st api.Started
	if err := c.call(ctx, "POST", "/sandboxes/"+sb.ID+"/exec-stream", api.ExecRequest{Command: "/workspace/app",
		Env: map[string]string{childEnv: childHTTP, httpAddrEnv: addr}}, &st); err != nil {
		return nil, err
	}
	proxied := "http://kilnd/sandboxes/" + sb.ID + "/ports/" + strconv.Itoa(portsAppPort) + "/"
	deadline := time.Now().Add(15 * time.Second)
	for c.stream(ctx, "GET", strings.TrimPrefix(proxied, "http://kilnd"), nil, nil) != nil {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the app in the sandbox never answered")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var pv api.Preview
	if err := c.call(ctx, "POST", "/sandboxes/"+sb.ID+"/previews", api.CreatePreview{Port: portsAppPort}, &pv); err != nil {
		return nil, err
	}
	var info daemon.Info
	if err := c.call(ctx, "GET", "/sandboxes/"+sb.ID, nil, &info); err != nil {
		return nil, err
	}
	netns := fmt.Sprintf("/proc/%d/ns/net", info.AgentPID)
	direct := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dialIn(netns, addr)
	}, MaxIdleConnsPerHost: 1}}
	defer direct.CloseIdleConnections()
	// A preview's host, ID.localhost, is this machine's, as a browser
	// takes it; Go's resolver would ask DNS.
	browser := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, port, err := net.SplitHostPort(addr); err == nil && strings.HasSuffix(host, ".localhost") {
			addr = net.JoinHostPort("127.0.0.1", port)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}, MaxIdleConnsPerHost: 1}}
	defer browser.CloseIdleConnections()
	get := func(hc *http.Client, url string) (time.Duration, error) {
		start := time.Now()
		resp, err := hc.Get(url)
		if err != nil {
			return 0, err
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || n != 512 {
			return 0, fmt.Errorf("GET %s: %d, %d bytes", url, resp.StatusCode, n)
		}
		return time.Since(start), nil
	}
	n := max(10, portsRequests/max(1, cfg.kilndScale))
	for i := range n + 20 { // the first 20 warm the connections up
		d, err := get(direct, "http://"+addr+"/")
		if err != nil {
			return nil, fmt.Errorf("direct: %w", err)
		}
		p, err := get(c.http, proxied)
		if err != nil {
			return nil, fmt.Errorf("through kilnd: %w", err)
		}
		v, err := get(browser, pv.URL)
		if err != nil {
			return nil, fmt.Errorf("preview: %w", err)
		}
		if i >= 20 {
			res.direct, res.proxied, res.preview = append(res.direct, d), append(res.proxied, p), append(res.preview, v)
		}
	}
	fmt.Fprintf(cfg.progress, "ports: %d requests each: direct p50 %v, through kilnd %v, preview %v\n", n, pct(res.direct, 50), pct(res.proxied, 50), pct(res.preview, 50))
	return res, nil
}

// dialIn connects to addr from inside the network namespace at netns, on
// a thread of its own that never leaves it (it ends with its goroutine).
func dialIn(netns, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread is discarded
		fd, err := unix.Open(netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		c, err := net.Dial("tcp", addr)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

func writePorts(b *strings.Builder, p *portsResult) {
	b.WriteString("## A server in a sandbox, through kilnd\n\n")
	if p.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s.\n\n", p.skipped)
		return
	}
	fmt.Fprintf(b, "A Go HTTP server in a sandbox answers GET with 512 bytes; one request at a time, on kept-alive\n"+
		"connections, %d each way, interleaved: **direct** from a thread inside the sandbox's network namespace,\n"+
		"**through kilnd** (`…/ports/%d/` over kilnd's unix socket, the agent dialling the app), and a\n"+
		"**preview URL** over kilnd's TCP listener, as a browser would.\n\n", len(p.direct), portsAppPort)
	b.WriteString("| way | p50 | p99 | requests/s (one at a time) |\n|---|---:|---:|---:|\n")
	for _, row := range []struct {
		name string
		ds   []time.Duration
	}{{"direct", p.direct}, {"through kilnd", p.proxied}, {"preview URL", p.preview}} {
		var total time.Duration
		for _, d := range row.ds {
			total += d
		}
		fmt.Fprintf(b, "| %s | %s | %s | %.0f |\n", row.name, ms(pct(row.ds, 50)), ms(pct(row.ds, 99)), float64(len(row.ds))/total.Seconds())
	}
	added := pct(p.proxied, 50) - pct(p.direct, 50)
	fmt.Fprintf(b, "\nAdded by kilnd's proxy, p50: %s (target ≤ %s: %s); by a preview URL: %s.\n\n",
		ms(added), ms(targetPortAdded), verdict(added <= targetPortAdded), ms(pct(p.preview, 50)-pct(p.direct, 50)))
}
