package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Stats are a sandbox's resource figures as its cgroups keep them. A
// figure this host's cgroups do not keep for the sandbox is nil: on a
// hybrid host a controller on v1 has a group of the sandbox's only when
// it is limited, and a pure v2 host keeps only what its parent delegates.
type Stats struct {
	// CPUSeconds is the CPU time the sandbox's every process, the agent
	// among them, has used.
	CPUSeconds float64
	// MemoryBytes and MemoryPeakBytes are its processes' memory now and
	// at most; MemoryLimitBytes is nil without a limit.
	MemoryBytes, MemoryPeakBytes, MemoryLimitBytes *int64
	// Pids counts its tasks; PidsLimit is nil without a limit.
	Pids, PidsLimit *int64
	// OOMKills counts the kernel's out-of-memory kills in it.
	OOMKills *int64
}

// Stats reads the sandbox's figures (see Cgroups.Stats).
func (s *Sandbox) Stats() (Stats, error) {
	if s.Cgroups == nil {
		return Stats{}, fmt.Errorf("sandbox: %s has no cgroups", s.ID)
	}
	return s.Cgroups.Stats()
}

// Stats reads the groups' figures from the files both layouts keep
// them in: each controller's from the v1 group that holds the sandbox's
// processes when there is one, from the v2 group otherwise. CPU time
// comes from the v2 group's cpu.stat, which the kernel keeps in every v2
// group, with or without the cpu controller. It fails only when that is
// gone: the sandbox has ended.
func (c *Cgroups) Stats() (Stats, error) {
	b, err := os.ReadFile(filepath.Join(c.V2, "cpu.stat"))
	if err != nil {
		return Stats{}, fmt.Errorf("sandbox: cgroup stats: %w", err)
	}
	s := Stats{CPUSeconds: float64(EventIn(b, "usage_usec")) / 1e6}
	if dir := c.MemoryProcs; dir != "" {
		s.MemoryBytes = readCount(dir, "memory.usage_in_bytes", "")
		s.MemoryPeakBytes = readCount(dir, "memory.max_usage_in_bytes", "")
		s.MemoryLimitBytes = readCount(dir, "memory.limit_in_bytes", "")
		s.OOMKills = readCount(dir, "memory.oom_control", "oom_kill")
	} else {
		s.MemoryBytes = readCount(c.V2, "memory.current", "")
		s.MemoryPeakBytes = readCount(c.V2, "memory.peak", "")
		s.MemoryLimitBytes = readCount(c.V2, "memory.max", "")
		s.OOMKills = readCount(c.V2, "memory.events", "oom_kill")
	}
	dir := c.V2
	if c.Procs != "" {
		dir = c.Procs
	}
	s.Pids, s.PidsLimit = readCount(dir, "pids.current", ""), readCount(dir, "pids.max", "")
	return s, nil
}

// readCount reads a number from a cgroup file: the whole file, or the
// line key of a flat keyed one. nil when the file is missing or says
// "max" (no limit).
func readCount(dir, file, key string) *int64 {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return nil
	}
	v := strings.TrimSpace(string(b))
	if key != "" {
		v = ""
		for line := range strings.Lines(string(b)) {
			if k, n, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == key {
				v = n
			}
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil
	}
	return &n
}
