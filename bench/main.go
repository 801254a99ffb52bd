// Command bench measures the output engine beside plain baselines in one run,
// with repetitions interleaved, and prints a markdown report of the ratios
// against the engine's targets. The machine it runs on is shared and its
// absolute speed drifts between runs; ratios taken side by side hold.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sandkiln/sandkiln/internal/roles"
)

func main() {
	// The throughput cases re-execute this binary as the writing child.
	if isChild() {
		os.Exit(childMain())
	}
	// The kilnd cases re-execute this binary as each sandbox's agent.
	roles.PlayIfReexecuted()
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	size := fs.String("size", "2G", "bytes the child writes per throughput run (suffixes K, M, G, T: powers of 1024)")
	captureSize := fs.String("capture-size", "1G", "bytes the child writes per capture run")
	wsSize := fs.String("ws-size", "1G", "bytes written to a kiln.v1 WebSocket client per kilnd throughput run")
	ttySize := fs.String("tty-size", "64M", "bytes the child writes per terminal run of the comparison")
	captureDir := fs.String("capture-dir", os.TempDir(), "directory on the file system to capture to")
	reps := fs.Int("reps", 3, "repetitions of every throughput case, interleaved")
	readers := fs.String("readers", "1,8,64", "comma-separated reader counts for the engine cases")
	tombs := fs.Int("tombstones", 2000, "finished processes for the tombstone memory figure")
	running := fs.Int("running", 200, "idle running processes for the per-process memory figure")
	scale := fs.Int("scale", 1000, "sandboxes the scale section creates")
	scaleStep := fs.Int("scale-step", 100, "sandboxes between the scale section's measurements")
	clusterPerNode := fs.Int("cluster-sandboxes", 300, "sandboxes on each of the cluster section's 3 nodes while the whole cluster is listed")
	clusterAttach := fs.String("cluster-attach-size", "256M", "bytes a process writes per attach run of the cluster section")
	clusterBurst := fs.String("cluster-burst-size", "256M", "bytes of the cluster section's burst, run with the output export on and off")
	clusterReplay := fs.String("cluster-replay-size", "100M", "bytes of the process the cluster section reads back from JetStream once its node is lost")
	clusterOnly := fs.String("cluster-cases", "", "comma-separated cases of the cluster section to run: create, attach, list, export, kill, replay (default all)")
	kilnd := fs.String("kilnd", "", "the kilnd binary the cluster section's nodes run, such as ./kilnd (default: one built for the run)")
	out := fs.String("out", "", "also write the reports to DIR/<date>-engine.md (and -scale.md, -snapshot.md, -memfork.md, -compare.md, -pause.md, -cluster.md)")
	only := fs.String("only", "", "comma-separated sections to run: "+strings.Join(allSections, ", ")+" (default all), or "+strings.Join(extraSections, ", "))
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of this process to FILE")
	attachDirect := fs.Bool("attach-direct", false, "attach section: the kiln.v1 client dials the agent's socket, past kilnd (what the kilnd hop costs)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg := config{
		reps:           *reps,
		tombstones:     *tombs,
		running:        *running,
		scale:          *scale,
		scaleStep:      *scaleStep,
		clusterPerNode: *clusterPerNode,
		kilnd:          *kilnd,
		out:            *out,
		cpuprofile:     *cpuprofile,
		attachDirect:   *attachDirect,
		captureDir:     *captureDir,
		cmdline:        strings.Join(append([]string{filepath.Base(os.Args[0])}, args...), " "),
		stdout:         os.Stdout,
		progress:       os.Stderr,
	}
	var err error
	if cfg.size, err = parseSize(*size); err != nil {
		return config{}, err
	}
	if cfg.captureSize, err = parseSize(*captureSize); err != nil {
		return config{}, err
	}
	if cfg.ttySize, err = parseSize(*ttySize); err != nil {
		return config{}, err
	}
	if cfg.wsSize, err = parseSize(*wsSize); err != nil {
		return config{}, err
	}
	if cfg.clusterAttach, err = parseSize(*clusterAttach); err != nil {
		return config{}, err
	}
	if cfg.clusterBurst, err = parseSize(*clusterBurst); err != nil {
		return config{}, err
	}
	if cfg.clusterReplay, err = parseSize(*clusterReplay); err != nil {
		return config{}, err
	}
	if cfg.readers, err = parseCounts(*readers); err != nil {
		return config{}, err
	}
	if cfg.clusterCases, err = parseClusterCases(*clusterOnly); err != nil {
		return config{}, err
	}
	if cfg.sections, err = parseSections(*only); err != nil {
		return config{}, err
	}
	return cfg, cfg.validate()
}
