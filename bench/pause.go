package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// The pause section: a pause and a resume of a running sandbox through
// kilnd's API, per runtime, beside the same done by hand on the host (the
// sandbox's cgroup frozen and thawed, runsc pause and resume), the two
// interleaved.

const (
	pauseReps   = 50
	pauseWarmUp = 3
	// targetPauseResume bounds a pause and a resume together, at p50.
	targetPauseResume = 10 * time.Millisecond
	// pauseWorkload runs in the sandbox throughout: a process that writes
	// and sleeps, as a sandbox at work does, with its spawner beside it.
	pauseWorkload = "while :; do echo tick; sleep 0.01; done"
)

type pauseResult struct {
	runtimes []pauseRuntime
	skipped  []string
}

// pauseRuntime is one runtime's figures: kilnd's pause and resume, each
// call's and the two together, and the host's by hand (hand), the two
// together.
type pauseRuntime struct {
	name, handNote          string
	pause, resume, together []time.Duration
	hand                    []time.Duration
}

func measurePause(ctx context.Context, cfg config) (*pauseResult, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("sandboxes need root")
	}
	base, err := os.MkdirTemp(cfg.captureDir, "sandkiln-bench-pause-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	state := filepath.Join(base, "kilnd")
	k, c, err := startKilnd(state)
	if err != nil {
		return nil, err
	}
	defer k.Close()
	defer c.http.CloseIdleConnections()
	res := &pauseResult{}
	for _, rt := range []string{sandbox.RuntimeNamespaces, sandbox.RuntimeGVisor} {
		var info daemon.Info
		if err := c.call(ctx, "POST", "/sandboxes", map[string]any{"runtime": rt}, &info); err != nil {
			if rt == sandbox.RuntimeGVisor {
				res.skipped = append(res.skipped, fmt.Sprintf("%s: %v", rt, err))
				continue
			}
			return nil, err
		}
		r, err := pauseCycles(ctx, cfg, c, state, info.ID, rt)
		// The sandbox goes whatever the cycles did.
		err = errors.Join(err, c.call(ctx, "DELETE", "/sandboxes/"+info.ID+"?remove_logs=true", nil, nil))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rt, err)
		}
		res.runtimes = append(res.runtimes, r)
	}
	return res, nil
}

// pauseCycles starts the workload in sandbox id, then pauses and resumes
// it through kilnd, and by hand, one after the other, pauseReps times
// each after pauseWarmUp.
func pauseCycles(ctx context.Context, cfg config, c client, state, id, runtime string) (pauseRuntime, error) {
	r := pauseRuntime{name: runtime}
	var st api.Started
	if err := c.call(ctx, "POST", "/sandboxes/"+id+"/exec-stream", api.ExecRequest{Command: "sh", Args: []string{"-c", pauseWorkload}}, &st); err != nil {
		return r, err
	}
	hand, note, err := byHand(state, id, runtime)
	if err != nil {
		return r, err
	}
	r.handNote = note
	for i := range pauseWarmUp + pauseReps {
		t0 := time.Now()
		if err := c.call(ctx, "POST", "/sandboxes/"+id+"/pause", nil, nil); err != nil {
			return r, err
		}
		t1 := time.Now()
		if err := c.call(ctx, "POST", "/sandboxes/"+id+"/resume", nil, nil); err != nil {
			return r, err
		}
		t2 := time.Now()
		h, err := hand()
		if err != nil {
			return r, fmt.Errorf("by hand: %w", err)
		}
		if i < pauseWarmUp {
			continue
		}
		r.pause, r.resume, r.together = append(r.pause, t1.Sub(t0)), append(r.resume, t2.Sub(t1)), append(r.together, t2.Sub(t0))
		r.hand = append(r.hand, h)
		if (i+1)%10 == 0 {
			fmt.Fprintf(cfg.progress, "pause %s: %d of %d\n", runtime, i+1-pauseWarmUp, pauseReps)
		}
	}
	return r, nil
}

// byHand returns what pauses and resumes sandbox id on the host, as
// kilnd's backend does but without kilnd, and times it: its procs cgroup
// frozen (awaited in cgroup.events) and thawed, or runsc pause and resume
// of its container. note says which.
func byHand(state, id, runtime string) (func() (time.Duration, error), string, error) {
	b, err := os.ReadFile(filepath.Join(state, "sandboxes", id, "sandbox.json"))
	if err != nil {
		return nil, "", err
	}
	var rec struct {
		Sandbox struct {
			Cgroups struct {
				V2 string `json:"v2"`
			} `json:"cgroups"`
			Container string `json:"container"`
			Root      string `json:"runsc_root"`
		} `json:"sandbox"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, "", err
	}
	s := rec.Sandbox
	if runtime == sandbox.RuntimeGVisor {
		runsc, err := exec.LookPath("runsc")
		if err != nil {
			return nil, "", err
		}
		run := func(verb string) error {
			if out, err := exec.Command(runsc, "--root", s.Root, verb, s.Container).CombinedOutput(); err != nil {
				return fmt.Errorf("runsc %s: %w: %s", verb, err, out)
			}
			return nil
		}
		return func() (time.Duration, error) {
			t0 := time.Now()
			err := errors.Join(run("pause"), run("resume"))
			return time.Since(t0), err
		}, "`runsc pause`, then `runsc resume`, of its container", nil
	}
	procs := &sandbox.Cgroups{V2: s.Cgroups.V2, ProcsLeaf: true}
	if _, err := os.Stat(filepath.Join(s.Cgroups.V2, "procs")); err != nil {
		return nil, "", err
	}
	return func() (time.Duration, error) {
		t0 := time.Now()
		err := procs.Freeze(10 * time.Second)
		if err == nil {
			err = procs.Thaw()
		}
		return time.Since(t0), err
	}, "its procs cgroup: `cgroup.freeze` 1, `frozen 1` awaited in `cgroup.events`, then 0", nil
}

func renderPause(cfg config, res results) string {
	var b strings.Builder
	writeHeader(&b, cfg, res, "Pause")
	writePause(&b, res.pause)
	return b.String()
}

func writePause(b *strings.Builder, p *pauseResult) {
	b.WriteString("## Pause and resume\n\n")
	fmt.Fprintf(b, "A kilnd in this process, called over its unix socket; in a sandbox of each runtime `sh -c '%s'` runs\n"+
		"throughout. %d pauses, each followed by a resume (`POST /sandboxes/{id}/pause`, then `…/resume`), after %d warm-ups,\n"+
		"each call timed from its request to its answer; after each, the same by hand on the host, without kilnd.\n\n",
		pauseWorkload, pauseReps, pauseWarmUp)
	b.WriteString("| runtime | pause p50 | pause p99 | resume p50 | resume p99 | pause + resume p50 | pause + resume p99 | by hand p50 | by hand p99 | by hand |\n" +
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range p.runtimes {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.name,
			ms(pct(r.pause, 50)), ms(pct(r.pause, 99)), ms(pct(r.resume, 50)), ms(pct(r.resume, 99)),
			ms(pct(r.together, 50)), ms(pct(r.together, 99)), ms(pct(r.hand, 50)), ms(pct(r.hand, 99)), r.handNote)
	}
	b.WriteString("\n| target | figure | result |\n|---|---:|---|\n")
	for _, r := range p.runtimes {
		got := pct(r.together, 50)
		fmt.Fprintf(b, "| %s: pause + resume, p50 ≤ %s | %s | %s |\n", r.name, ms(targetPauseResume), ms(got), verdict(got <= targetPauseResume))
	}
	b.WriteString("\nkilnd pauses and resumes a gVisor sandbox as `runsc pause` and `runsc resume` do, without running\n" +
		"them: one call to the sandbox's control server under runsc's lock of the container, and its status\n" +
		"written into runsc's state file. The by-hand column is runsc's two runs, most of which is runsc starting.\n\n")
	for _, s := range p.skipped {
		fmt.Fprintf(b, "Not measured: %s.\n\n", s)
	}
}
