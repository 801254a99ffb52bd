package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/guest/agent"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// The attach matrix: one writer at three write sizes, read by a kiln.v1
// client through kilnd and the agent, beside the floor of any daemon that
// relays output to a socket client: the same writer on the host into a
// pipe, copied into a unix socket by a plain loop, read at the other end.
var attachWriters = []struct {
	name string
	argv func(size int64) []string
}{
	{"4 KiB writes (dd bs=4k)", func(n int64) []string {
		return []string{"dd", "if=/dev/zero", "bs=4k", "count=" + strconv.FormatInt(n/(4<<10), 10), "status=none"}
	}},
	{"8 KiB writes (head -c)", func(n int64) []string { return []string{"head", "-c", strconv.FormatInt(n, 10), "/dev/zero"} }},
	{"64 KiB writes (dd bs=64k)", func(n int64) []string {
		return []string{"dd", "if=/dev/zero", "bs=64k", "count=" + strconv.FormatInt(n/(64<<10), 10), "status=none"}
	}},
}

// targetAttach is what a kiln.v1 client holding the output must reach of
// the relay's pace, at every write size.
const targetAttach = 0.8

type attachSample struct {
	relay, relayProc, engine, hostAgent, block, drop time.Duration
	dropDelivered                                    int64
}

type attachCase struct {
	name    string
	samples []attachSample
}

type attachResult struct {
	size    int64
	direct  bool // the client dialed the agent, past kilnd
	cases   []attachCase
	skipped string
}

func measureAttach(ctx context.Context, cfg config) (*attachResult, error) {
	size := cfg.wsSize / 2 &^ (64<<10 - 1) // whole writes at every size
	res := &attachResult{size: size}
	if os.Geteuid() != 0 {
		res.skipped = "kilnd needs root"
		return res, nil
	}
	c, sb, done, err := kilndSandbox(ctx, "attach", "")
	if err != nil {
		return nil, err
	}
	defer done()
	if cfg.attachDirect {
		if c, err = agentClient(c, sb.ID); err != nil {
			return nil, err
		}
		res.direct = true
	}
	host, stopHost, err := startHostAgent(ctx)
	if err != nil {
		return nil, fmt.Errorf("agent on the host: %w", err)
	}
	defer stopHost()
	dialOpts := &websocket.DialOptions{HTTPClient: c.http, Subprotocols: []string{api.ProtocolV1}}
	for _, w := range attachWriters {
		res.cases = append(res.cases, attachCase{name: w.name})
	}
	// Reps interleaved: each one runs every writer, every way.
	for rep := range cfg.reps {
		for i, w := range attachWriters {
			argv := w.argv(size)
			var s attachSample
			if s.relay, err = socketRelay(ctx, argv, size, relayHere); err != nil {
				return nil, fmt.Errorf("%s: relay: %w", w.name, err)
			}
			if s.relayProc, err = socketRelay(ctx, argv, size, relayToProcess); err != nil {
				return nil, fmt.Errorf("%s: relay to a process: %w", w.name, err)
			}
			if s.engine, err = socketRelay(ctx, argv, size, engineToProcess); err != nil {
				return nil, fmt.Errorf("%s: engine to a process: %w", w.name, err)
			}
			req := api.ExecRequest{Command: argv[0], Args: argv[1:], Flow: api.FlowBlock}
			var delivered, lost int64
			if s.hostAgent, delivered, lost, err = wsRun(ctx, host, "", req, dialOpts, "?flow=block&ack=true"); err != nil {
				return nil, fmt.Errorf("%s: agent on the host: %w", w.name, err)
			}
			if delivered != size || lost != 0 {
				return nil, fmt.Errorf("%s: agent on the host delivered %d bytes and lost %d of %d", w.name, delivered, lost, size)
			}
			if s.block, delivered, lost, err = wsRun(ctx, c, sb.ID, req, dialOpts, "?flow=block&ack=true"); err != nil {
				return nil, fmt.Errorf("%s: flow block: %w", w.name, err)
			}
			if delivered != size || lost != 0 {
				return nil, fmt.Errorf("%s: flow block delivered %d bytes and lost %d of %d", w.name, delivered, lost, size)
			}
			req.Flow = ""
			if s.drop, s.dropDelivered, _, err = wsRun(ctx, c, sb.ID, req, dialOpts, ""); err != nil {
				return nil, fmt.Errorf("%s: drop: %w", w.name, err)
			}
			res.cases[i].samples = append(res.cases[i].samples, s)
			fmt.Fprintf(cfg.progress, "attach: rep %d/%d, %s: relay %v, to a process %v, engine %v, agent on the host %v, flow block %v, drop %v (%.1f%% delivered)\n", rep+1, cfg.reps, w.name,
				s.relay.Round(time.Millisecond), s.relayProc.Round(time.Millisecond), s.engine.Round(time.Millisecond), s.hostAgent.Round(time.Millisecond), s.block.Round(time.Millisecond), s.drop.Round(time.Millisecond), 100*float64(s.dropDelivered)/float64(size))
		}
	}
	return res, nil
}

// How socketRelay moves the writer's output into the socket, and where the
// socket's other end is read.
type relayHow int

const (
	relayHere       relayHow = iota // a plain loop; the reader in this process
	relayToProcess                  // a plain loop; the reader a process of its own
	engineToProcess                 // the output engine; the reader a process of its own
)

// socketRelay runs argv on the host into a pipe, copies the pipe into a
// unix socket, and reads the socket's other end into nothing: in this
// process, or in a process of its own (this binary again), as a daemon's
// client is. The copy is a plain loop, or with engineToProcess the output
// engine as the agent runs it, without the sandbox, HTTP or WebSocket: the
// process's pump into its ring, a holding attachment's merged events, each
// written as a kiln.v1 frame header and its data in one writev. The time
// is Start to the reader's end of input.
func socketRelay(ctx context.Context, argv []string, want int64, how relayHow) (time.Duration, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	in, out := os.NewFile(uintptr(fds[0]), "relay-in"), os.NewFile(uintptr(fds[1]), "relay-out")
	inConn, err := net.FileConn(in)
	in.Close()
	if err != nil {
		out.Close()
		return 0, err
	}
	if how == engineToProcess {
		return engineRelay(ctx, argv, want, inConn.(*net.UnixConn), out)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		inConn.Close()
		out.Close()
		return 0, err
	}
	var got <-chan int64
	start := time.Now()
	if how == relayToProcess {
		if got, err = readerProcess(ctx, out); err != nil {
			inConn.Close()
			return 0, err
		}
	} else {
		ch := make(chan int64, 1)
		got = ch
		outConn, err := net.FileConn(out)
		out.Close()
		if err != nil {
			inConn.Close()
			return 0, err
		}
		defer outConn.Close()
		go func() {
			n, _ := discard(outConn, make([]byte, 256<<10))
			ch <- n
		}()
	}
	if err := cmd.Start(); err != nil {
		inConn.Close()
		return 0, err
	}
	buf := make([]byte, 256<<10)
	for {
		n, rerr := pipe.Read(buf)
		if n > 0 {
			if _, werr := inConn.Write(buf[:n]); werr != nil {
				err = werr
				break
			}
		}
		if rerr != nil {
			break
		}
	}
	inConn.Close()
	n := <-got
	d := time.Since(start)
	if werr := cmd.Wait(); err == nil {
		err = werr
	}
	if err == nil && n != want {
		err = fmt.Errorf("read %d bytes, want %d", n, want)
	}
	return d, err
}

// readerProcess starts this binary as a reader of out to its end, which it
// closes here; the channel gets the count of bytes it read, or -1.
func readerProcess(ctx context.Context, out *os.File) (<-chan int64, error) {
	defer out.Close()
	reader := exec.CommandContext(ctx, os.Args[0])
	reader.Env = append(os.Environ(), childEnv+"="+childRead)
	reader.Stdin = out
	var text strings.Builder
	reader.Stdout = &text
	if err := reader.Start(); err != nil {
		return nil, err
	}
	got := make(chan int64, 1)
	go func() {
		if reader.Wait() != nil {
			got <- -1
			return
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(text.String()), 10, 64)
		got <- n
	}()
	return got, nil
}

// engineRelay is socketRelay's engineToProcess: argv's output through the
// engine into conn, read by a process from out.
func engineRelay(ctx context.Context, argv []string, want int64, conn *net.UnixConn, out *os.File) (time.Duration, error) {
	defer conn.Close()
	// As the agent runs it (this process does nothing else meanwhile).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(agent.Procs))
	start := time.Now()
	got, err := readerProcess(ctx, out)
	if err != nil {
		return 0, err
	}
	// A FlowBlock process starts held: nothing is dropped before the
	// attachment below takes the hold over.
	p, err := process.Start("attach", process.Spec{Argv: argv, Flow: process.FlowBlock})
	if err != nil {
		return 0, err
	}
	defer p.Kill(context.WithoutCancel(ctx))
	a, err := p.Attach(ring.Offsets{}, process.AttachOptions{Hold: true})
	if err != nil {
		return 0, err
	}
	defer a.Close()
	var frames int64
	var head []byte
	for {
		e, err := a.NextMerged(ctx, 256<<10)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
		switch e.Kind {
		case ring.Data:
			code := api.StreamStdout
			if e.Stream == ring.Stderr {
				code = api.StreamStderr
			}
			head = api.AppendFrame(head[:0], api.Frame{Stream: code, Offset: uint64(e.Offset), Seq: e.Seq})
			bufs := net.Buffers{head, e.Data}
			if _, err := bufs.WriteTo(conn); err != nil {
				return 0, err
			}
			frames++
		case ring.Gap:
			return 0, fmt.Errorf("the engine lost %d bytes of a held stream", e.Lost())
		case ring.Exit:
			if e.Exit != (process.Exit{}) {
				return 0, fmt.Errorf("writer ended with %v", e.Exit)
			}
		}
	}
	conn.CloseWrite()
	n := <-got
	d := time.Since(start)
	if want += frames * int64(len(head)); n != want {
		return 0, fmt.Errorf("read %d bytes, want %d (%d frames)", n, want, frames)
	}
	return d, nil
}

// childAgent is this binary serving the agent's process API on the host,
// outside any sandbox, on the unix socket $SANDKILN_BENCH_AGENT_SOCK, until
// its stdin ends. It says "ready" on stdout once it listens.
const (
	childAgent   = "agent"
	agentSockEnv = "SANDKILN_BENCH_AGENT_SOCK"
)

func agentChildMain() int {
	l, err := net.Listen("unix", os.Getenv(agentSockEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench agent child:", err)
		return 1
	}
	runtime.GOMAXPROCS(agent.Procs) // as the agent in a sandbox runs
	table := process.NewTable(process.TableConfig{})
	srv := &http.Server{}
	go agent.New(agent.Config{Table: table, Env: os.Environ()}).Serve(srv, l)
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	table.Shutdown(ctx)
	return 0
}

// startHostAgent starts the agent on the host (childAgent) and returns a
// client of it, whose requests and WebSockets go to the agent's own paths
// (wsRun with no sandbox), and what stops it.
func startHostAgent(ctx context.Context) (client, func(), error) {
	dir, err := os.MkdirTemp("", "sandkiln-bench-agent-")
	if err != nil {
		return client{}, nil, err
	}
	sock := filepath.Join(dir, "agent.sock")
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+childAgent, agentSockEnv+"="+sock)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err == nil {
		var stdout io.ReadCloser
		if stdout, err = cmd.StdoutPipe(); err == nil {
			if err = cmd.Start(); err == nil {
				line := make([]byte, len("ready\n"))
				if _, err = io.ReadFull(stdout, line); err == nil && string(line) != "ready\n" {
					err = fmt.Errorf("agent child said %q", line)
				}
			}
		}
	}
	stop := func() {
		stdin.Close()
		cmd.Wait()
		os.RemoveAll(dir)
	}
	if err != nil {
		if cmd.Process != nil {
			cmd.Process.Kill()
			stop()
		} else {
			os.RemoveAll(dir)
		}
		return client{}, nil, err
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", sock)
	}}}
	return client{http: hc, sock: sock, ws: hc}, func() { hc.CloseIdleConnections(); stop() }, nil
}

func writeAttach(b *strings.Builder, r *attachResult) {
	b.WriteString("## Attach at the socket's speed\n\n")
	if r.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s.\n\n", r.skipped)
		return
	}
	fmt.Fprintf(b, "One writer of %s at three write sizes. **Relay** is the floor of any daemon relaying output to a socket\n"+
		"client: the writer on the host into a pipe, copied into a unix socket by a plain loop, read at the other\n"+
		"end, in the same process. **Relay to a process** is the same with the reader a process of its own (this\n"+
		"binary again, reading 256 KiB at a time), as a daemon's client is: what that boundary alone costs.\n"+
		"**Engine to a process** is that, with the loop replaced by the output engine as the agent runs it, on\n"+
		"the host and without HTTP or WebSocket: the pump into the ring, a holding attachment's merged events,\n"+
		"each written as a kiln.v1 frame in one writev. It is what the engine's hand-off from the pump's\n"+
		"goroutine to the watcher's costs, by itself.\n"+
		"**Agent on the host** is the agent's process API run by this binary outside any sandbox, read by\n"+
		"a kiln.v1 client in this process straight from the agent's socket, holding the output as flow block\n"+
		"does: the engine with HTTP and WebSocket, without the sandbox and kilnd.\n"+
		"**Flow block** is the writer in a sandbox read by a kiln.v1 client through kilnd's unix socket and\n"+
		"the agent, holding the output (`?flow=block&ack=true`, acking every 256 KiB as the SDK does): every byte,\n"+
		"from the start request to the exit message. **Drop** is the same without the hold: the writer is never\n"+
		"slowed, and the client's figure is what it received per second. Frames carry up to 256 KiB: a watcher\n"+
		"that is behind gets the chunks that continue each other in one (a connection's first frames carry\n"+
		"16 KiB, doubling).\n\n", bytesText(r.size))
	if r.direct {
		b.WriteString("**This run's kiln.v1 client dialed the agent's socket directly (`-attach-direct`), past kilnd's relay.**\n\n")
	}
	b.WriteString("| writes | rep | relay GB/s | relay to a process GB/s | engine to a process GB/s | agent on the host GB/s | flow block GB/s | drop GB/s received | drop received of the whole |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	gbps := func(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }
	for _, c := range r.cases {
		for i, s := range c.samples {
			fmt.Fprintf(b, "| %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f%% |\n", c.name, i+1, gbps(r.size, s.relay), gbps(r.size, s.relayProc), gbps(r.size, s.engine), gbps(r.size, s.hostAgent), gbps(r.size, s.block),
				gbps(s.dropDelivered, s.drop), 100*float64(s.dropDelivered)/float64(r.size))
		}
	}
	b.WriteString("\n| writes | flow block / relay, of medians | paired | flow block / relay to a process, paired | engine to a process / relay to a process, paired | agent on the host / engine to a process, paired | flow block / agent on the host, paired | drop received / relay, paired | target | result |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, c := range r.cases {
		var relay, relayProc, engine, hostAgent, block, drop []float64
		for _, s := range c.samples {
			relay = append(relay, gbps(r.size, s.relay))
			relayProc = append(relayProc, gbps(r.size, s.relayProc))
			engine = append(engine, gbps(r.size, s.engine))
			hostAgent = append(hostAgent, gbps(r.size, s.hostAgent))
			block = append(block, gbps(r.size, s.block))
			drop = append(drop, gbps(s.dropDelivered, s.drop))
		}
		paired := pairedRatio(block, relay)
		fmt.Fprintf(b, "| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | flow block ≥ %.1f× relay | %s |\n", c.name, median(block)/median(relay), paired,
			pairedRatio(block, relayProc), pairedRatio(engine, relayProc), pairedRatio(hostAgent, engine), pairedRatio(block, hostAgent), pairedRatio(drop, relay), targetAttach, verdict(paired >= targetAttach))
	}
	b.WriteString("\n")
}
