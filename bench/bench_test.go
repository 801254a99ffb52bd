package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// runSection runs the benchmark as cfg says, bounded against a hang (not
// a figure: on a loaded machine even a tiny run takes minutes), its
// report printed to a buffer and written to a directory of t's own. It
// checks that the report holds every one of want and was written whole
// as the one file, named for its report (-name.md), and returns it.
func runSection(t *testing.T, cfg config, name string, want ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cfg.out, cfg.stdout, cfg.progress = t.TempDir(), &out, io.Discard
	if testing.Verbose() {
		cfg.progress = os.Stderr
	}
	if err := run(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	report := out.String()
	for _, w := range want {
		if !strings.Contains(report, w) {
			t.Errorf("report lacks %q:\n%s", w, report)
		}
	}
	files, err := filepath.Glob(filepath.Join(cfg.out, "*.md"))
	if err != nil || len(files) != 1 || !strings.HasSuffix(files[0], "-"+name+".md") {
		t.Fatalf("report files in -out: %v, %v; want one, -%s.md", files, err, name)
	}
	if written, err := os.ReadFile(files[0]); err != nil || string(written) != report {
		t.Errorf("written report differs from the printed one (read error %v)", err)
	}
	return report
}

// needRoot skips t where it does not run as root, which kilnd needs.
func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
}

// TestRun runs the engine's sections at a tiny size, so they keep
// compiling and working; their figures mean nothing at this size.
func TestRun(t *testing.T) {
	runSection(t, config{
		size:        8 << 20,
		captureSize: 8 << 20,
		captureDir:  t.TempDir(),
		wsSize:      8 << 20,
		ttySize:     1 << 20,
		kilndScale:  10,
		reps:        1,
		readers:     []int{1, 8, 64},
		// A hundredth of each workload, bursts to 2 MiB.
		losslessScale: 100,
		tombstones:    20,
		running:       10,
		sections:      map[string]bool{"throughput": true, "capture": true, "lossless": true, "kilnd": true, "attach": true, "files": true, "ports": true, "tombstone": true, "running": true},
		cmdline:       "bench -size 8M -reps 1",
	}, "engine",
		"| raw | ", "| raw, 1 MiB pipe | ", "| engine, no reader | ", "| engine, 64 readers | ",
		"throughput, engine, no reader / raw |", "workload time, 64 readers / no reader |",
		"| child > file | ", "| engine + capture | ", "| engine, no capture | ",
		"16 KiB chunks: engine + capture / child > file |",
		"batch exec of `true`", "kiln.v1 client / raw pipe |", "Memory per idle sandbox",
		"heap per tombstone", "heap per idle running process", "goroutine stacks per process",
		"## Capture of ordinary work", "| shell loop, 200 lines |", "| burst | ",
		"| flow block / raw pipe |", "Flow block delivered every byte in every rep: ",
		"| upload, one file |", "| download, a tree |", "Added by kilnd's proxy, p50: ",
		"## Attach at the socket's speed", "| 8 KiB writes (head -c) | 1 |", "flow block ≥ 0.8× relay |",
		"| CPU stolen by the host | ", "agent on the host / engine to a process, paired |",
	)
}

// TestScale runs the scale section to 20 sandboxes, measured every 10,
// with a restart of kilnd between the last step and the deletes.
func TestScale(t *testing.T) {
	needRoot(t)
	runSection(t, config{
		scale:     20,
		scaleStep: 10,
		sections:  map[string]bool{"scale": true},
		cmdline:   "bench -only scale -scale 20 -scale-step 10",
	}, "scale",
		"# Scale, ", "| 10 | ", "| 20 | ", "| create p99 at 20 / at 10 |", "| memory per idle sandbox at 20 |",
		"every one of 20 sandboxes listed running |", "| delete all 20, one after another |",
	)
}

// TestPause runs the pause section, which writes a report of its own.
func TestPause(t *testing.T) {
	needRoot(t)
	runSection(t, config{
		captureDir: t.TempDir(),
		sections:   map[string]bool{"pause": true},
		cmdline:    "bench -only pause",
	}, "pause", "# Pause, ", "| namespaces | ", "| namespaces: pause + resume, p50 ≤ 10.00 ms | ")
}

// TestMemfork runs the memory fork section, which writes a report of its
// own: kilnd's forks and runsc's by hand, or, without runsc, the reason.
func TestMemfork(t *testing.T) {
	needRoot(t)
	want := []string{"# Memory fork, ", "| kilnd: fork, the process running in it | ", "| runsc by hand: checkpoint + restore | ",
		"| memory fork of a 256 MiB process, p50 ≤ 3000.00 ms | ", "| kilnd / by hand, of p50s | "}
	if _, err := exec.LookPath("runsc"); err != nil {
		want = []string{"# Memory fork, ", "Not measured: no runsc: "}
	}
	runSection(t, config{
		captureDir: t.TempDir(),
		sections:   map[string]bool{"memfork": true},
		cmdline:    "bench -only memfork",
	}, "memfork", want...)
}

// TestCluster runs the cluster section small: three kilnds (built for
// the run) in a cluster, 3 creates each way, a 4 MiB attach, 5 sandboxes
// a node listed, a 4 MiB burst with the export on and off (a fourth
// kilnd), a node killed during a stream of lines and during a flood
// (started again after each), a 4 MiB process read back from JetStream
// once its node is killed and lost, and every kilnd stopped, its
// sandboxes deleted (the killed one started again for it).
func TestCluster(t *testing.T) {
	needRoot(t)
	runSection(t, config{
		kilndScale:     10,
		reps:           1,
		clusterPerNode: 5,
		clusterAttach:  4 << 20,
		clusterBurst:   4 << 20,
		clusterReplay:  4 << 20,
		sections:       map[string]bool{"cluster": true},
		cmdline:        "bench -only cluster -cluster-sandboxes 5 -cluster-attach-size 4M -cluster-burst-size 4M -cluster-replay-size 4M -reps 1",
	}, "cluster",
		"# Cluster, ", "| n2, the owner | ", "| n1, forwarded | ", "| create through a non-owner − through the owner, p50 | ",
		"| attach throughput, through a non-owner / through the owner, of medians | ", "| n3 | ",
		"| GET /sandboxes of 3 nodes × 5, p50 through the slowest node (",
		"| burst rate, export on / off, nobody reading, of medians | ", "| burst rate, export on / off, a kiln.v1 client holding it, of medians | ",
		"| rep 1, nobody reading | ", "| rep 1, a client holding it | ",
		"| rep | nobody reading: on, the nodes' CPU | busy | off, solo's CPU | the idle nodes' | busy |", "The node's stream, KILN_OUT_n2, as NATS described it:\nR3, leader ",
		"| a node killed during lines: bytes produced before the kill and in no copy | ",
		"| a node killed during flood: bytes produced before the kill and in no copy | ",
		"| replay of a lost node's 4 MiB process from JetStream through another node, median, MB/s | ",
	)
}

func TestScaleCounts(t *testing.T) {
	for _, tc := range []struct {
		n, step int
		want    []int
	}{
		{1000, 100, []int{10, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000}},
		{20, 10, []int{10, 20}},
		{25, 10, []int{10, 20, 25}},
		{5, 10, []int{5}},
		{30, 5, []int{10, 15, 20, 25, 30}},
	} {
		if diff := cmp.Diff(tc.want, scaleCounts(tc.n, tc.step)); diff != "" {
			t.Errorf("scaleCounts(%d, %d) (-want +got):\n%s", tc.n, tc.step, diff)
		}
	}
}

// TestCompare runs the comparison at a tiny size with whichever of the
// other tools are installed; those missing are named in the report.
func TestCompare(t *testing.T) {
	needRoot(t)
	report := runSection(t, config{
		captureSize: 4 << 20,
		ttySize:     256 << 10,
		captureDir:  t.TempDir(),
		kilndScale:  10,
		reps:        1,
		tombstones:  20,
		sections:    map[string]bool{"compare": true},
		cmdline:     "bench -only compare",
	}, "compare",
		"# Comparison, ", "| **sandkiln** | ", "| child > file | ", "| child \\| reader | ", "| **sandkiln, terminal** | ",
		"64 watchers of one child", "| child \\| tee, 64 pipes | ", "Sandbox start", "| sandkiln | ",
		"Memory per idle sandbox", "B** of heap each",
	)
	for _, tool := range []string{"supervisord", "s6-log", "dtach", "tmux", "runc", "runsc"} {
		if _, err := exec.LookPath(tool); err != nil {
			if !strings.Contains(report, "Not run: "+tool+": not installed") {
				t.Errorf("%s is missing and the report does not say so", tool)
			}
		} else if !strings.Contains(report, "| "+tool) && !strings.Contains(report, "| **"+tool) {
			t.Errorf("%s is installed and has no row in the report:\n%s", tool, report)
		} else if tool == "dtach" && !strings.Contains(report, "The engine on a terminal over dtach: ") {
			t.Errorf("dtach is installed and the report holds the terminal to no target:\n%s", report)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"2G": 2 << 30, "256M": 256 << 20, "64k": 64 << 10, "8MiB": 8 << 20, "1GB": 1 << 30, "1000": 1000,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1G", "2X", "G", "1.5G", "99999999999T"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"-size", "64M", "-reps", "2", "-readers", "8,1,8", "-only", "tombstone"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.size != 64<<20 || cfg.reps != 2 || len(cfg.readers) != 2 || cfg.readers[0] != 1 || !cfg.has("tombstone") || cfg.has("throughput") {
		t.Errorf("parsed %+v", cfg)
	}
	if cfg.clusterPerNode != 300 || cfg.clusterAttach != 256<<20 || cfg.clusterBurst != 256<<20 || cfg.clusterReplay != 100<<20 || cfg.kilnd != "" {
		t.Errorf("cluster section's defaults: %d sandboxes a node, attach %d, burst %d, replay %d, kilnd %q",
			cfg.clusterPerNode, cfg.clusterAttach, cfg.clusterBurst, cfg.clusterReplay, cfg.kilnd)
	}
	if len(cfg.clusterCases) != len(clusterCases) {
		t.Errorf("cluster cases by default: %v, want all %d", cfg.clusterCases, len(clusterCases))
	}
	if cfg, err := parseFlags([]string{"-cluster-cases", "export, replay"}); err != nil || len(cfg.clusterCases) != 2 || !cfg.clusterCases["export"] || !cfg.clusterCases["replay"] {
		t.Errorf("-cluster-cases export, replay: %v, %v", cfg.clusterCases, err)
	}
	for _, args := range [][]string{{"-only", "speed"}, {"-readers", "0"}, {"-reps", "0"}, {"extra"}, {"-cluster-sandboxes", "0"}, {"-cluster-attach-size", "1.5G"}, {"-cluster-cases", "export,burst"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) succeeded, want an error", args)
		}
	}
}

// The steal share is what the hypervisor took of all the CPU time between
// two readings of /proc/stat, which this machine has.
func TestSteal(t *testing.T) {
	if got := stealText(cpuTimes{total: 1000, steal: 10, ok: true}, cpuTimes{total: 1400, steal: 102, ok: true}); got != "23%" {
		t.Errorf("steal %s, want 23%%", got)
	}
	if got := stealText(cpuTimes{}, cpuTimes{total: 5, ok: true}); got != "unknown" {
		t.Errorf("steal from nothing: %s", got)
	}
	if c := readCPUTimes(); !c.ok || c.total <= 0 || c.steal < 0 || c.steal > c.total {
		t.Errorf("/proc/stat read as %+v", c)
	}
}
