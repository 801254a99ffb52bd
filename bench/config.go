package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// config is one benchmark run's settings.
type config struct {
	size        int64  // bytes the child writes per throughput run
	captureSize int64  // bytes the child writes per capture run
	captureDir  string // where the capture cases write their logs
	wsSize      int64  // bytes of the kilnd WebSocket throughput runs
	ttySize     int64  // bytes the child writes per terminal run of the comparison
	kilndScale  int    // divides the kilnd section's run counts (tests use fewer)
	// losslessScale divides the lossless section's workloads and bursts
	// (tests use smaller ones).
	losslessScale int
	reps          int
	readers       []int // reader counts of the engine cases
	tombstones    int
	running       int
	scale         int // sandboxes the scale section creates
	scaleStep     int // and how many between its measurements
	// clusterPerNode are the sandboxes each node of the cluster section
	// holds while the whole cluster is listed; clusterAttach the bytes of
	// its attach runs; clusterBurst the bytes of the burst run with the
	// output export on and off; clusterReplay those of the process read
	// back from the cluster's copy once its node is lost; kilnd the
	// binary its nodes run (empty: one built for the run).
	clusterPerNode int
	clusterAttach  int64
	clusterBurst   int64
	clusterReplay  int64
	kilnd          string
	// clusterCases are the cluster section's cases to run, by key (nil:
	// all).
	clusterCases map[string]bool
	out          string // report directory; empty writes no file
	sections     map[string]bool
	cpuprofile   string
	// attachDirect has the attach section's kiln.v1 client dial the
	// agent's socket itself, past kilnd: what the kilnd hop costs.
	attachDirect bool
	cmdline      string    // as printed in the report
	stdout       io.Writer // the report
	progress     io.Writer // one line per measurement while it runs
}

// allSections run by default; the comparison runs only when asked for
// (`-only compare`): it needs tools of other projects and writes a report
// of its own.
var (
	allSections   = []string{"throughput", "capture", "lossless", "kilnd", "attach", "sdk", "files", "ports", "tombstone", "running", "scale", "start", "snapshot", "memfork", "pause", "cluster"}
	extraSections = []string{"compare"}
)

func (c config) has(section string) bool { return c.sections[section] }

func (c config) validate() error {
	switch {
	case c.size <= 0:
		return fmt.Errorf("size %d: must be positive", c.size)
	case c.wsSize < 64<<10:
		return fmt.Errorf("ws size %d: at least 64 KiB", c.wsSize)
	case c.ttySize <= 0:
		return fmt.Errorf("tty size %d: must be positive", c.ttySize)
	case c.captureSize <= 0:
		return fmt.Errorf("capture size %d: must be positive", c.captureSize)
	case c.reps < 1:
		return fmt.Errorf("reps %d: must be at least 1", c.reps)
	case c.tombstones < 1:
		return fmt.Errorf("tombstones %d: must be at least 1", c.tombstones)
	case c.running < 1:
		return fmt.Errorf("running %d: must be at least 1", c.running)
	case c.scale < 1 || c.scaleStep < 1:
		return fmt.Errorf("scale %d, step %d: must be at least 1", c.scale, c.scaleStep)
	case c.clusterPerNode < 1:
		return fmt.Errorf("cluster sandboxes %d: must be at least 1", c.clusterPerNode)
	}
	return nil
}

// parseSize reads a byte count such as 2G, 256M, 64KiB or 1048576. Every
// suffix is a power of 1024: the report prints the exact count beside it.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	if i := strings.IndexFunc(t, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		unit := strings.ToUpper(t[i:])
		unit = strings.TrimSuffix(strings.TrimSuffix(unit, "B"), "I")
		switch unit {
		case "":
		case "K":
			mult = 1 << 10
		case "M":
			mult = 1 << 20
		case "G":
			mult = 1 << 30
		case "T":
			mult = 1 << 40
		default:
			return 0, fmt.Errorf("size %q: unknown suffix %q (want K, M, G or T)", s, t[i:])
		}
		t = t[:i]
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want a positive byte count such as 2G or 256M", s)
	}
	return n * mult, nil
}

// parseCounts reads a comma-separated list of distinct positive counts, in
// ascending order; an empty list runs the engine without reader cases.
func parseCounts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("readers %q: %q is not a positive count", s, f)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// parseClusterCases reads a comma-separated list of the cluster
// section's cases; an empty one is all of them.
func parseClusterCases(s string) (map[string]bool, error) {
	var keys []string
	for _, cc := range clusterCases {
		keys = append(keys, cc.key)
	}
	out := map[string]bool{}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(keys, f) {
			return nil, fmt.Errorf("cluster cases %q: unknown case %q (want %s)", s, f, strings.Join(keys, ", "))
		}
		out[f] = true
	}
	if len(out) == 0 {
		for _, k := range keys {
			out[k] = true
		}
	}
	return out, nil
}

func parseSections(s string) (map[string]bool, error) {
	out := map[string]bool{}
	if strings.TrimSpace(s) == "" {
		for _, n := range allSections {
			out[n] = true
		}
		return out, nil
	}
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(allSections, f) && !slices.Contains(extraSections, f) {
			return nil, fmt.Errorf("only %q: unknown section %q (want %s)", s, f, strings.Join(append(allSections, extraSections...), ", "))
		}
		out[f] = true
	}
	return out, nil
}
