package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// agentListTimeout bounds a question to an agent (how many processes it
// runs, what it has counted): a stats answer or a scrape does without the
// figures rather than wait on them.
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
	if e.agentPaused() {
		p = nil // it would answer after the resume
	}
	d.mu.Unlock()
	if state != StateRunning || sb == nil {
		return api.SandboxStats{}, fmt.Errorf("%w: sandbox %s is %s: %s", errdefs.ErrFailedPrecondition, id, state, reason)
	}
	st, err := sb.Stats()
	if err != nil {
		// Its cgroups went with it between the look and the read.
		return api.SandboxStats{}, errdefs.Opaque(errdefs.ErrFailedPrecondition, "sandbox "+id+" has ended", err)
	}
	out := wireStats(st)
	out.ReadAt = time.Now().UTC()
	if p != nil {
		out.Processes = agentProcesses(ctx, p.Transport)
		out.Counts = agentCounts(ctx, p.Transport)
	}
	return out, nil
}

// maxAgentAnswer bounds what kilnd reads of an agent's answer to its own
// questions: the agent is inside the sandbox, and answers as it likes.
const maxAgentAnswer = 4 << 20

// agentCounts asks the agent behind t what it has counted; nil when it
// does not answer.
func agentCounts(ctx context.Context, t http.RoundTripper) *api.AgentCounts {
	var c api.AgentCounts
	if askAgent(ctx, t, "/counts", &c) != nil {
		return nil
	}
	return &c
}

// askAgent GETs path of the agent behind t into out, within
// agentListTimeout and maxAgentAnswer.
func askAgent(ctx context.Context, t http.RoundTripper, path string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, agentListTimeout)
	defer cancel()
	return agentJSON(ctx, t, "GET", path, out)
}

// agentJSON sends a request without a body to the agent behind t, and
// decodes its answer, within maxAgentAnswer, into out (unless out is nil
// or the answer has no content). An answer of 404 is errdefs.ErrNotFound.
func agentJSON(ctx context.Context, t http.RoundTripper, method, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, nil)
	if err != nil {
		return err
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNoContent:
		return nil
	case http.StatusNotFound:
		return fmt.Errorf("%w: agent: %s %s", errdefs.ErrNotFound, method, path)
	default:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("agent: %s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(msg))
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(io.LimitReader(resp.Body, maxAgentAnswer)).Decode(out)
}

func wireStats(s sandbox.Stats) api.SandboxStats {
	return api.SandboxStats{CPUSeconds: s.CPUSeconds, MemoryBytes: s.MemoryBytes, MemoryPeakBytes: s.MemoryPeakBytes,
		MemoryLimitBytes: s.MemoryLimitBytes, Pids: s.Pids, PidsLimit: s.PidsLimit, OOMKills: s.OOMKills}
}

// agentProcesses counts the processes the agent behind t runs now; nil
// when it does not answer.
func agentProcesses(ctx context.Context, t http.RoundTripper) *int {
	var procs []api.Process
	if askAgent(ctx, t, "/exec-stream", &procs) != nil {
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
