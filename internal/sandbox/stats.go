package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/internal/handoff"
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
	s := Stats{CPUSeconds: float64(handoff.EventIn(b, "usage_usec")) / 1e6}
	if dir := c.MemoryProcs; dir != "" {
		s.MemoryBytes = readCount(dir, "memory.usage_in_bytes", "")
		s.MemoryPeakBytes = readCount(dir, "memory.max_usage_in_bytes", "")
		s.MemoryLimitBytes = readCount(dir, "memory.limit_in_bytes", "")
		s.OOMKills = readCount(dir, "memory.oom_control", "oom_kill")
	} else {
		// A pure v2 host's limits are on the procs leaf, which holds
		// the sandbox's processes without the agent, as v1's groups do.
		dir := c.V2
		if c.Leaves {
			dir = c.procsDir2()
		}
		s.MemoryBytes = readCount(dir, "memory.current", "")
		s.MemoryPeakBytes = readCount(dir, "memory.peak", "")
		s.MemoryLimitBytes = readCount(dir, "memory.max", "")
		s.OOMKills = readCount(dir, "memory.events", "oom_kill")
	}
	// The sandbox's pids limit, as it was asked for: the group's has
	// room for the spawner beside it.
	dir, spawner := c.V2, int64(0)
	switch {
	case c.Procs != "":
		dir, spawner = c.Procs, spawnerTasks
	case c.PidsLeaf:
		dir, spawner = c.pidsDir2(), spawnerTasks
	case c.Leaves:
		dir, spawner = c.procsDir2(), oldSpawnerTasks
	}
	s.Pids, s.PidsLimit = readCount(dir, "pids.current", ""), readCount(dir, "pids.max", "")
	if s.PidsLimit != nil {
		*s.PidsLimit -= spawner
	}
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

// usageTimeout bounds the question of a stats read to the agent.
const usageTimeout = 2 * time.Second

// Stats implements Instance. The host's groups hold the whole runtime,
// with room beyond the sandbox's limits for gVisor itself: the limits are
// given as the sandbox's (the room taken off), and its processes and
// their memory as gVisor's kernel counts them, which the agent reads for
// kilnd; nil when it does not answer. gVisor's kernel keeps no peak of
// memory: that figure is nil. CPU time and out-of-memory kills are the
// host's, of the whole runtime.
func (s *guestSandbox) Stats() (Stats, error) {
	st, err := s.Sandbox.Stats()
	if err != nil {
		return Stats{}, err
	}
	if st.MemoryLimitBytes != nil {
		*st.MemoryLimitBytes = max(*st.MemoryLimitBytes-gvisorMemory, 0)
	}
	if st.PidsLimit != nil {
		*st.PidsLimit = max(*st.PidsLimit-gvisorThreads, 0)
	}
	st.Pids, st.MemoryBytes, st.MemoryPeakBytes = nil, nil, nil
	if s.paused.Load() {
		return st, nil // its agent is paused with it, and cannot say
	}
	if u, err := s.usage(); err == nil {
		st.Pids, st.MemoryBytes = &u.Pids, &u.MemoryBytes
	}
	return st, nil
}

// usage asks the agent what gVisor's kernel counts of the sandbox's
// processes. The agent is the sandbox's: its answer is read within
// bounds, and is a figure to show, never one to act on.
func (s *guestSandbox) usage() (handoff.GuestUsage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), usageTimeout)
	defer cancel()
	t := Transport(s.Dial)
	t.DisableKeepAlives = true
	defer t.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://agent"+handoff.UsagePath, nil)
	if err != nil {
		return handoff.GuestUsage{}, err
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return handoff.GuestUsage{}, fmt.Errorf("sandbox: ask the agent its usage: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return handoff.GuestUsage{}, fmt.Errorf("sandbox: ask the agent its usage: %s", resp.Status)
	}
	var u handoff.GuestUsage
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&u); err != nil {
		return handoff.GuestUsage{}, fmt.Errorf("sandbox: the agent's usage: %w", err)
	}
	if u.Pids < 0 || u.MemoryBytes < 0 {
		return handoff.GuestUsage{}, fmt.Errorf("sandbox: the agent's usage: %+v", u)
	}
	return u, nil
}
