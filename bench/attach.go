package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
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
	relay, relayProc, block, drop time.Duration
	dropDelivered                 int64
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
	dialOpts := &websocket.DialOptions{HTTPClient: c.http, Subprotocols: []string{api.ProtocolV1}}
	for _, w := range attachWriters {
		res.cases = append(res.cases, attachCase{name: w.name})
	}
	// Reps interleaved: each one runs every writer, every way.
	for rep := range cfg.reps {
		for i, w := range attachWriters {
			argv := w.argv(size)
			var s attachSample
			if s.relay, err = socketRelay(ctx, argv, size, false); err != nil {
				return nil, fmt.Errorf("%s: relay: %w", w.name, err)
			}
			if s.relayProc, err = socketRelay(ctx, argv, size, true); err != nil {
				return nil, fmt.Errorf("%s: relay to a process: %w", w.name, err)
			}
			req := api.ExecRequest{Command: argv[0], Args: argv[1:], Flow: api.FlowBlock}
			var delivered, lost int64
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
			fmt.Fprintf(cfg.progress, "attach: rep %d/%d, %s: relay %v, to a process %v, flow block %v, drop %v (%.1f%% delivered)\n", rep+1, cfg.reps, w.name,
				s.relay.Round(time.Millisecond), s.relayProc.Round(time.Millisecond), s.block.Round(time.Millisecond), s.drop.Round(time.Millisecond), 100*float64(s.dropDelivered)/float64(size))
		}
	}
	return res, nil
}

// socketRelay runs argv on the host into a pipe, copies the pipe into a
// unix socket with a plain loop, and reads the socket's other end into
// nothing: in this process, or, with proc, in a process of its own (this
// binary again), as a daemon's client is; the time is Start to the
// reader's end of input.
func socketRelay(ctx context.Context, argv []string, want int64, proc bool) (time.Duration, error) {
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
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		inConn.Close()
		out.Close()
		return 0, err
	}
	got := make(chan int64, 1)
	start := time.Now()
	if proc {
		reader := exec.CommandContext(ctx, os.Args[0])
		reader.Env = append(os.Environ(), childEnv+"="+childRead)
		reader.Stdin = out
		var text strings.Builder
		reader.Stdout = &text
		if err := reader.Start(); err != nil {
			inConn.Close()
			out.Close()
			return 0, err
		}
		out.Close()
		go func() {
			if reader.Wait() != nil {
				got <- -1
				return
			}
			n, _ := strconv.ParseInt(strings.TrimSpace(text.String()), 10, 64)
			got <- n
		}()
	} else {
		outConn, err := net.FileConn(out)
		out.Close()
		if err != nil {
			inConn.Close()
			return 0, err
		}
		defer outConn.Close()
		go func() {
			n, _ := discard(outConn, make([]byte, 256<<10))
			got <- n
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
		"**Flow block** is the writer in a sandbox read by a kiln.v1 client through kilnd's unix socket and\n"+
		"the agent, holding the output (`?flow=block&ack=true`, acking every 256 KiB as the SDK does): every byte,\n"+
		"from the start request to the exit message. **Drop** is the same without the hold: the writer is never\n"+
		"slowed, and the client's figure is what it received per second. Frames carry up to 256 KiB: a watcher\n"+
		"that is behind gets the chunks that continue each other in one (a connection's first frames carry\n"+
		"16 KiB, doubling).\n\n", bytesText(r.size))
	if r.direct {
		b.WriteString("**This run's kiln.v1 client dialed the agent's socket directly (`-attach-direct`), past kilnd's relay.**\n\n")
	}
	b.WriteString("| writes | rep | relay GB/s | relay to a process GB/s | flow block GB/s | drop GB/s received | drop received of the whole |\n|---|---:|---:|---:|---:|---:|---:|\n")
	gbps := func(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }
	for _, c := range r.cases {
		for i, s := range c.samples {
			fmt.Fprintf(b, "| %s | %d | %.3f | %.3f | %.3f | %.3f | %.1f%% |\n", c.name, i+1, gbps(r.size, s.relay), gbps(r.size, s.relayProc), gbps(r.size, s.block),
				gbps(s.dropDelivered, s.drop), 100*float64(s.dropDelivered)/float64(r.size))
		}
	}
	b.WriteString("\n| writes | flow block / relay, of medians | paired | flow block / relay to a process, paired | drop received / relay, paired | target | result |\n|---|---:|---:|---:|---:|---|---|\n")
	for _, c := range r.cases {
		var relay, relayProc, block, drop []float64
		for _, s := range c.samples {
			relay = append(relay, gbps(r.size, s.relay))
			relayProc = append(relayProc, gbps(r.size, s.relayProc))
			block = append(block, gbps(r.size, s.block))
			drop = append(drop, gbps(s.dropDelivered, s.drop))
		}
		paired := pairedRatio(block, relay)
		fmt.Fprintf(b, "| %s | %.3f | %.3f | %.3f | %.3f | flow block ≥ %.1f× relay | %s |\n", c.name, median(block)/median(relay), paired,
			pairedRatio(block, relayProc), pairedRatio(drop, relay), targetAttach, verdict(paired >= targetAttach))
	}
	b.WriteString("\n")
}
