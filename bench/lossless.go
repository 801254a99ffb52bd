package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

type workload struct {
	name string
	argv []string
}

// losslessWorkloads are the workloads of an ordinary build, which capture
// must keep whole: a shell printing a line per write, a listing of a tree,
// a program flushing every line. scale divides their sizes (tests use a
// small one).
func losslessWorkloads(scale int) []workload {
	n := func(lines int) int { return lines / scale }
	tree := "/usr"
	if scale > 1 {
		tree = "/usr/share/doc"
	}
	return []workload{
		{fmt.Sprintf("shell loop, %d lines", n(20000)), []string{"sh", "-c", shellLines(n(20000))}},
		{fmt.Sprintf("shell loop, %d lines", n(1000000)), []string{"sh", "-c", shellLines(n(1000000))}},
		{"find " + tree + " -ls", []string{"find", tree, "-ls"}},
		{fmt.Sprintf("python, %d lines, print(flush=True)", n(200000)), []string{"python3", "-c",
			fmt.Sprintf("for i in range(%d): print(f'line {i} of a build that prints one short line at a time', flush=True)", n(200000))}},
	}
}

func shellLines(n int) string {
	return fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "line $i of a build that prints one short line at a time"; i=$((i+1)); done`, n)
}

// burstSizes are the bursts of short lines, written as fast as the child
// writes, that the capture queue is to absorb: up to most, doubling.
func burstSizes(most int64) []int64 {
	var out []int64
	for s := int64(4 << 20); s <= most; s *= 2 {
		out = append(out, s)
	}
	if len(out) == 0 {
		out = append(out, most)
	}
	return out
}

// burstShape is a build's output arriving all at once: lines of 60 bytes
// in 64 KiB writes, as from a pipe that was flushed.
var burstShape = shape{name: "60 B lines in 64 KiB writes", write: 64 << 10, line: 60}

type losslessSample struct {
	bytes   int64
	dropped int64
	elapsed time.Duration
}

type losslessResult struct {
	queue     int64
	reps      int
	workloads []workload
	sizes     []int64
	cases     [][]losslessSample // per workload, per rep
	bursts    [][]losslessSample // per burst size, per rep
	absorbed  int64              // the largest burst lossless in every rep
	skipped   []string
}

// measureLossless runs each workload through the engine with capture, the
// other core kept busy by a second process, and the bursts.
func measureLossless(ctx context.Context, cfg config, exe string) (*losslessResult, error) {
	res := &losslessResult{queue: capture.DefaultQueueBytes, reps: cfg.reps,
		workloads: losslessWorkloads(max(1, cfg.losslessScale)), sizes: burstSizes(256 << 20 / int64(max(1, cfg.losslessScale)))}
	base, err := os.MkdirTemp(cfg.captureDir, "sandkiln-bench-lossless-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	hog := exec.Command("sh", "-c", "while :; do :; done")
	if err := hog.Start(); err != nil {
		return nil, fmt.Errorf("the CPU-bound neighbour: %w", err)
	}
	defer func() { hog.Process.Kill(); hog.Wait() }()
	res.cases = make([][]losslessSample, len(res.workloads))
	res.bursts = make([][]losslessSample, len(res.sizes))
	for rep := range cfg.reps {
		for i, wl := range res.workloads {
			if _, err := exec.LookPath(wl.argv[0]); err != nil {
				if rep == 0 {
					res.skipped = append(res.skipped, fmt.Sprintf("%s: %v", wl.name, err))
				}
				continue
			}
			s, err := captureRun(ctx, base, process.Spec{Argv: wl.argv})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", wl.name, err)
			}
			res.cases[i] = append(res.cases[i], s)
			fmt.Fprintf(cfg.progress, "lossless: rep %d/%d  %-42s %8s in %6.2f s, %d dropped\n", rep+1, cfg.reps, wl.name,
				bytesText(s.bytes), s.elapsed.Seconds(), s.dropped)
		}
		for i, size := range res.sizes {
			s, err := captureRun(ctx, base, process.Spec{Argv: []string{exe}, Env: burstShape.environ(size, "")})
			if err != nil {
				return nil, fmt.Errorf("burst of %s: %w", bytesText(size), err)
			}
			res.bursts[i] = append(res.bursts[i], s)
			fmt.Fprintf(cfg.progress, "lossless: rep %d/%d  burst of %-9s in %6.2f s, %d dropped\n", rep+1, cfg.reps, bytesText(size), s.elapsed.Seconds(), s.dropped)
		}
	}
	for i, size := range res.sizes {
		lossless := len(res.bursts[i]) > 0
		for _, s := range res.bursts[i] {
			lossless = lossless && s.dropped == 0
		}
		if !lossless {
			break
		}
		res.absorbed = size
	}
	return res, nil
}

// captureRun runs spec with capture to a fresh directory under base and
// returns what the run's end says it lost.
func captureRun(ctx context.Context, base string, spec process.Spec) (losslessSample, error) {
	work, err := os.MkdirTemp(base, "run-")
	if err != nil {
		return losslessSample{}, err
	}
	defer os.RemoveAll(work)
	dir, err := capture.OpenDir(work)
	if err != nil {
		return losslessSample{}, err
	}
	defer dir.Close()
	w, err := capture.Begin(dir, uuid.Must(uuid.NewV7()).String(), capture.Options{})
	if err != nil {
		return losslessSample{}, err
	}
	spec.Capture = w
	start := time.Now()
	p, err := process.Start("bench", spec)
	if err != nil {
		return losslessSample{}, err
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		p.Kill(context.Background())
		return losslessSample{}, ctx.Err()
	}
	st := p.Status()
	if st.Exit == nil || *st.Exit != (process.Exit{}) {
		return losslessSample{}, fmt.Errorf("ended with %v", st.Exit)
	}
	if st.Capture == nil || !st.Capture.Ended {
		return losslessSample{}, fmt.Errorf("capture did not end: %+v", st.Capture)
	}
	return losslessSample{
		bytes:   st.Totals[ring.Stdout] + st.Totals[ring.Stderr],
		dropped: st.Capture.Dropped[capture.LogStdout] + st.Capture.Dropped[capture.LogStderr],
		elapsed: time.Since(start),
	}, nil
}

func writeLossless(b *strings.Builder, r *losslessResult) {
	b.WriteString("## Capture of ordinary work\n\n")
	fmt.Fprintf(b, "Each workload runs through the engine with capture (the default 8 MiB queue, 10 MiB × 5 files),\n"+
		"while a second process keeps the other core busy (`while :; do :; done`). Dropped is what the run's\n"+
		"end says the log lost, over %d reps. Target: zero bytes dropped.\n\n", r.reps)
	b.WriteString("| workload | output | time (median) | bytes dropped (every rep) | result |\n|---|---:|---:|---|---|\n")
	for i, wl := range r.workloads {
		ss := r.cases[i]
		if len(ss) == 0 {
			fmt.Fprintf(b, "| %s | | | not run | |\n", wl.name)
			continue
		}
		var drops []string
		var times []float64
		zero := true
		for _, s := range ss {
			drops = append(drops, fmt.Sprint(s.dropped))
			times = append(times, s.elapsed.Seconds())
			zero = zero && s.dropped == 0
		}
		fmt.Fprintf(b, "| %s | %s | %.2f s | %s | %s |\n", wl.name, bytesText(ss[0].bytes), median(times), strings.Join(drops, ", "), verdict(zero))
	}
	for _, s := range r.skipped {
		fmt.Fprintf(b, "\nNot run: %s.\n", s)
	}
	fmt.Fprintf(b, "\nBursts: %s, %s at a time as fast as the child writes them, beside the same busy\n"+
		"core. Capture keeps up with a burst as long as it fits the queue with what the writer persists\n"+
		"meanwhile; beyond, it drops and counts.\n\n", burstShape.name, "the whole burst")
	b.WriteString("| burst | time (median) | written GB/s (median) | bytes dropped (every rep) |\n|---:|---:|---:|---|\n")
	for i, size := range r.sizes {
		var drops []string
		var times, rates []float64
		for _, s := range r.bursts[i] {
			drops = append(drops, fmt.Sprint(s.dropped))
			times = append(times, s.elapsed.Seconds())
			rates = append(rates, float64(s.bytes)/s.elapsed.Seconds()/1e9)
		}
		fmt.Fprintf(b, "| %s | %.3f s | %.3f | %s |\n", bytesText(size), median(times), median(rates), strings.Join(drops, ", "))
	}
	if r.absorbed > 0 {
		fmt.Fprintf(b, "\n**Burst absorbed without loss in every rep: %s** of short lines (queue %s).\n\n", bytesText(r.absorbed), bytesText(r.queue))
	} else {
		fmt.Fprintf(b, "\n**No burst size was absorbed without loss in every rep** (queue %s).\n\n", bytesText(r.queue))
	}
}
