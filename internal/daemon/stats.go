package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// agentListTimeout bounds the question to an agent how many processes it
// runs: a stats answer does without the count rather than wait on it.
const agentListTimeout = 2 * time.Second

// Stats reads a running sandbox's figures from its cgroups, and asks its
// agent how many processes it runs.
func (d *Daemon) Stats(ctx context.Context, id string) (api.SandboxStats, error) {
	e, err := d.get(id)
	if err != nil {
		return api.SandboxStats{}, err
	}
	d.mu.Lock()
	sb, p, state, reason := e.sb, e.proxy, e.rec.State, e.rec.Reason
	d.mu.Unlock()
	if state != StateRunning || sb == nil {
		return api.SandboxStats{}, fmt.Errorf("%w: sandbox %s is %s: %s", errdefs.ErrFailedPrecondition, id, state, reason)
	}
	st, err := sb.Stats()
	if err != nil {
		// Its cgroups went with it between the look and the read.
		return api.SandboxStats{}, fmt.Errorf("%w: sandbox %s: %v", errdefs.ErrFailedPrecondition, id, err)
	}
	out := wireStats(st)
	out.ReadAt = time.Now().UTC()
	if p != nil {
		out.Processes = agentProcesses(ctx, p.Transport)
	}
	return out, nil
}

func wireStats(s sandbox.Stats) api.SandboxStats {
	return api.SandboxStats{CPUSeconds: s.CPUSeconds, MemoryBytes: s.MemoryBytes, MemoryPeakBytes: s.MemoryPeakBytes,
		MemoryLimitBytes: s.MemoryLimitBytes, Pids: s.Pids, PidsLimit: s.PidsLimit, OOMKills: s.OOMKills}
}

// agentProcesses counts the processes the agent behind t runs now; nil
// when it does not answer.
func agentProcesses(ctx context.Context, t http.RoundTripper) *int {
	ctx, cancel := context.WithTimeout(ctx, agentListTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://agent/exec-stream", nil)
	if err != nil {
		return nil
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var procs []api.Process
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&procs) != nil {
		return nil
	}
	n := 0
	for _, p := range procs {
		if p.State == api.StateRunning {
			n++
		}
	}
	return &n
}

func (d *Daemon) statsHandler(w http.ResponseWriter, r *http.Request) {
	st, err := d.Stats(r.Context(), r.PathValue("id"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	reply.JSON(w, http.StatusOK, st)
}
