package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
)

// writeTree writes files (path → content) below dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStatsLayouts: the same figures come from a pure v2 group's files and
// from a hybrid host's v1 groups; what a layout does not keep is nil, not
// zero.
func TestStatsLayouts(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"v2/cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
		"v2/memory.current": "52428800\n",
		"v2/memory.peak":    "62914560\n",
		"v2/memory.max":     "67108864\n",
		"v2/memory.events":  "low 0\nhigh 0\nmax 7\noom 3\noom_kill 2\noom_group_kill 0\n",
		"v2/pids.current":   "4\n",
		"v2/pids.max":       "max\n",

		// A pure v2 host's: the limits on the procs leaf, the pids limit
		// on its threaded child.
		"pure/cpu.stat":                "usage_usec 500000\n",
		"pure/memory.current":          "99999999\n",
		"pure/pids.current":            "99\n",
		"pure/procs/memory.current":    "1048576\n",
		"pure/procs/memory.peak":       "2097152\n",
		"pure/procs/memory.max":        "16777216\n",
		"pure/procs/memory.events":     "oom_kill 1\n",
		"pure/procs/pids/pids.current": "5\n",
		"pure/procs/pids/pids.max":     "9\n",

		"unified/cpu.stat":                       "usage_usec 1250000\nuser_usec 1000000\nsystem_usec 250000\n",
		"memory/procs/memory.usage_in_bytes":     "10485760\n",
		"memory/procs/memory.max_usage_in_bytes": "20971520\n",
		"memory/procs/memory.limit_in_bytes":     "33554432\n",
		"memory/procs/memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n",
		"pids/procs/pids.current":                "3\n",
		"pids/procs/pids.max":                    "64\n",
	})
	p := func(n int64) *int64 { return &n }
	for _, c := range []struct {
		name string
		cg   Cgroups
		want Stats
	}{
		{"v2", Cgroups{V2: filepath.Join(root, "v2")}, Stats{
			CPUSeconds: 2.5, MemoryBytes: p(50 << 20), MemoryPeakBytes: p(60 << 20), MemoryLimitBytes: p(64 << 20),
			OOMKills: p(2), Pids: p(4),
		}},
		{"pure v2", Cgroups{V2: filepath.Join(root, "pure"), Leaves: true, PidsLeaf: true}, Stats{
			CPUSeconds: 0.5, MemoryBytes: p(1 << 20), MemoryPeakBytes: p(2 << 20), MemoryLimitBytes: p(16 << 20),
			OOMKills: p(1), Pids: p(5), PidsLimit: p(9 - spawnerTasks),
		}},
		{"hybrid", Cgroups{
			V2:          filepath.Join(root, "unified"),
			V1:          map[string]string{"memory": filepath.Join(root, "memory"), "pids": filepath.Join(root, "pids")},
			MemoryProcs: filepath.Join(root, "memory/procs"),
			Procs:       filepath.Join(root, "pids/procs"),
		}, Stats{
			CPUSeconds: 1.25, MemoryBytes: p(10 << 20), MemoryPeakBytes: p(20 << 20), MemoryLimitBytes: p(32 << 20),
			OOMKills: p(5), Pids: p(3), PidsLimit: p(64 - spawnerTasks),
		}},
		// Unlimited on a hybrid host: the v2 group keeps CPU time alone.
		{"hybrid unlimited", Cgroups{V2: filepath.Join(root, "unified")}, Stats{CPUSeconds: 1.25}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.cg.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("Stats (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := (&Cgroups{V2: filepath.Join(root, "gone")}).Stats(); err == nil {
		t.Error("Stats of a removed group: no error")
	}
}

// TestStatsThisHost reads the figures of real groups made as a sandbox's
// are, with every limit, on whatever layout this host has.
func TestStatsThisHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making cgroups needs root")
	}
	cg, err := newCgroups("kiln-stats-test-"+uuid.NewString(), Limits{MemoryBytes: 64 << 20, Pids: 32, CPUs: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cg.Destroy(); err != nil {
			t.Error(err)
		}
	}()
	s, err := cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.MemoryBytes == nil || s.MemoryPeakBytes == nil || s.OOMKills == nil || *s.OOMKills != 0 {
		t.Errorf("memory figures %v, %v, OOM kills %v", s.MemoryBytes, s.MemoryPeakBytes, s.OOMKills)
	}
	if s.MemoryLimitBytes == nil || *s.MemoryLimitBytes != 64<<20 {
		t.Errorf("memory limit %v, want %d", s.MemoryLimitBytes, 64<<20)
	}
	if s.Pids == nil || *s.Pids != 0 || s.PidsLimit == nil || *s.PidsLimit != 32 {
		t.Errorf("pids %v of %v, want 0 of 32", s.Pids, s.PidsLimit)
	}
	if s.CPUSeconds != 0 {
		t.Errorf("an empty group used %v s of CPU", s.CPUSeconds)
	}
}
