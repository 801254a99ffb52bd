package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/handoff"
)

// The scale section's targets: a create at the largest count within
// twice its time at the first step, little memory per idle sandbox, and a
// restarted kilnd that takes back every sandbox quickly.
const (
	targetScaleCreateRatio = 2
	targetScaleSandboxMiB  = 3
	targetScaleAdopt       = 2 * time.Second
	scaleFirstStep         = 10 // the step the largest count's create is held to
	// kilnd's CPU is read over this long with no request, and then what
	// the sandboxes cost: longer than kilnd keeps an idle connection to an
	// agent (sandbox.Transport), which holds its buffers, and than a
	// sandbox's spawner outlasts its last process.
	scaleIdleWindow = handoff.DefaultSpawnerIdle + 2*time.Second
	scaleListCalls  = 20
)

// scaleStep is what the sandboxes cost once there are n of them.
type scaleStep struct {
	n int
	// The creates since the step before (POST /sandboxes answered), each
	// followed by an exec of `true`, which starts the sandbox's spawner; at
	// the first step, as many as at the others, those beyond n deleted.
	creates []time.Duration
	// The agents' proportional set size, and their spawners', summed, and
	// how many spawners still ran.
	agentPSS, spawnerPSS int64
	spawners             int
	// An exec of `true` in the first sandbox, idle (its spawner gone),
	// then at once again (it is back).
	wake, warm time.Duration
	kilndHeap  int64 // kilnd's (this process's) heap growth since before the first
	fds        int   // this process's descriptors, growth since before the first
	tasks      int   // the agents' and spawners' threads, each of which takes a pid
	goroutines int   // growth since before the first
	idleCPU    time.Duration
	idleWindow time.Duration
	list       []time.Duration // GET /sandboxes, every one listed
	// GET /sandboxes?label=group=3: the tenth of them in that group.
	labelList []time.Duration
}

// scaleGroups are the groups the scale section's sandboxes are labelled
// with, in turn (labels {"group": "0"} to {"group": "9"}).
const scaleGroups = 10

// scaleLabels are the labels of the scale section's i-th sandbox.
func scaleLabels(i int) map[string]any {
	return map[string]any{"labels": map[string]string{"group": strconv.Itoa(i % scaleGroups)}}
}

func (s scaleStep) perSandbox(v int64) int64 { return v / int64(s.n) }

func (s scaleStep) perSandboxMiB() float64 {
	return float64(s.agentPSS+s.spawnerPSS+max(0, s.kilndHeap)) / float64(s.n) / (1 << 20)
}

type scaleResult struct {
	steps []scaleStep
	// What bounds the count on this host: the kernel's pid_max (every
	// thread takes a pid) and the memory available before the first.
	pidMax, memAvailable int64
	nofile               uint64        // this process's descriptor limit
	adopt                time.Duration // a new kilnd on the same state: start to serving, every sandbox running
	adopted              int
	// Deleting them all, one after another through the API.
	deleteAll time.Duration
	skipped   string
}

// measureScale creates sandboxes up to cfg.scale, cfg.scaleStep at a
// time, and measures what they cost at each step; then restarts kilnd on
// the same state and deletes them all.
// Long because a benchmark reads best as its steps in the order they run.
func measureScale(ctx context.Context, cfg config) (*scaleResult, error) {
	res := &scaleResult{}
	if os.Geteuid() != 0 {
		res.skipped = "kilnd needs root"
		return res, nil
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil {
		res.nofile = lim.Cur
	}
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		res.pidMax, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	if v, ok := procField("/proc/meminfo", "MemAvailable"); ok {
		kb, _ := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
		res.memAvailable = kb << 10
	}
	state, err := os.MkdirTemp("", "sandkiln-bench-scale-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(state)
	// The agents and spawners are kilnd's own binary, as in production:
	// this one links the test dependencies (an OpenAPI validator among
	// them), whose initialisation each of its processes would carry.
	exe := filepath.Join(state, "kilnd")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", exe, "github.com/sandkiln/sandkiln/cmd/kilnd").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build kilnd for the agents: %v: %s", err, out)
	}
	kcfg := daemon.Config{StateDir: state, Exe: exe}
	k, c, err := startKilndConfig(kcfg)
	if err != nil {
		return nil, err
	}
	// Whatever happens, every sandbox goes: k is whichever kilnd runs.
	defer func() { k.Close() }()
	defer func() { c.http.CloseIdleConnections() }()

	// One sandbox made and deleted first, so one-time costs (the
	// backend's first set-up, the client's connection) are in the baseline.
	var warm daemon.Info
	if err := c.call(ctx, "POST", "/sandboxes", map[string]any{}, &warm); err != nil {
		return nil, err
	}
	if err := execTrue(ctx, c, warm.ID); err != nil {
		return nil, err
	}
	if err := c.call(ctx, "DELETE", "/sandboxes/"+warm.ID+"?remove_logs=true", nil, nil); err != nil {
		return nil, err
	}
	base := snapshot()
	baseFDs := countFDs()

	var ids []string
	var agents []int
	counts := scaleCounts(cfg.scale, cfg.scaleStep)
	for _, n := range counts {
		st := scaleStep{n: n}
		for len(ids) < n {
			start := time.Now()
			var info daemon.Info
			if err := c.call(ctx, "POST", "/sandboxes", scaleLabels(len(ids)), &info); err != nil {
				return nil, fmt.Errorf("sandbox %d: %w", len(ids)+1, err)
			}
			st.creates = append(st.creates, time.Since(start))
			ids, agents = append(ids, info.ID), append(agents, info.AgentPID)
			if err := execTrue(ctx, c, info.ID); err != nil {
				return nil, fmt.Errorf("sandbox %d: %w", len(ids), err)
			}
		}
		// At the first step, creates beside the few there: each made,
		// measured, and deleted, so that its p99 is of as many creates as
		// a later step's, not the slowest of a handful.
		for len(st.creates) < cfg.scaleStep && n == counts[0] {
			start := time.Now()
			var info daemon.Info
			if err := c.call(ctx, "POST", "/sandboxes", map[string]any{}, &info); err != nil {
				return nil, fmt.Errorf("a create at %d sandboxes: %w", n, err)
			}
			st.creates = append(st.creates, time.Since(start))
			if err := execTrue(ctx, c, info.ID); err != nil {
				return nil, err
			}
			if err := c.call(ctx, "DELETE", "/sandboxes/"+info.ID+"?remove_logs=true", nil, nil); err != nil {
				return nil, err
			}
		}
		c.http.CloseIdleConnections() // an idle kilnd: no connection held open by the client
		if st.idleCPU, st.idleWindow, err = idleCPU(ctx, scaleIdleWindow); err != nil {
			return nil, err
		}
		now := snapshot()
		st.kilndHeap, st.goroutines, st.fds = now.heap-base.heap, now.goroutines-base.goroutines, countFDs()-baseFDs
		for _, pid := range agents {
			a, err := pssOf(pid)
			if err != nil {
				return nil, fmt.Errorf("agent %d: %w", pid, err)
			}
			all, err := pssTree(pid)
			if err != nil {
				return nil, fmt.Errorf("agent %d: %w", pid, err)
			}
			st.agentPSS, st.spawnerPSS = st.agentPSS+a, st.spawnerPSS+all-a
			st.tasks += tasksTree(pid)
			if all > a {
				st.spawners++
			}
		}
		for _, d := range []*time.Duration{&st.wake, &st.warm} {
			start := time.Now()
			if err := execTrue(ctx, c, ids[0]); err != nil {
				return nil, err
			}
			*d = time.Since(start)
		}
		group := 0 // the sandboxes i < n with i%scaleGroups == 3
		for i := range n {
			if i%scaleGroups == 3 {
				group++
			}
		}
		for _, l := range []struct {
			path  string
			want  int
			times *[]time.Duration
		}{{"/sandboxes", n, &st.list}, {"/sandboxes?label=group=3", group, &st.labelList}} {
			for range scaleListCalls {
				start := time.Now()
				var list []daemon.Info
				if err := c.call(ctx, "GET", l.path, nil, &list); err != nil {
					return nil, err
				}
				*l.times = append(*l.times, time.Since(start))
				if len(list) != l.want {
					return nil, fmt.Errorf("GET %s listed %d sandboxes, want %d", l.path, len(list), l.want)
				}
			}
		}
		res.steps = append(res.steps, st)
		fmt.Fprintf(cfg.progress, "scale: %d sandboxes: create p50 %v p99 %v, %.2f MiB each, idle CPU %v in %v, list p50 %v, by label p50 %v, %d descriptors\n",
			n, pct(st.creates, 50), pct(st.creates, 99), st.perSandboxMiB(), st.idleCPU, st.idleWindow, pct(st.list, 50), pct(st.labelList, 50), st.fds)
	}

	// A restart: the sandboxes run on while no kilnd does; a new one on
	// the same state takes them back before it serves.
	if err := k.Stop(); err != nil {
		return nil, fmt.Errorf("stop kilnd: %w", err)
	}
	c.http.CloseIdleConnections()
	start := time.Now()
	if k, c, err = startKilndConfig(kcfg); err != nil {
		return nil, fmt.Errorf("restart kilnd: %w", err)
	}
	var list []daemon.Info
	if err := c.call(ctx, "GET", "/sandboxes", nil, &list); err != nil {
		return nil, err
	}
	res.adopt = time.Since(start)
	for _, info := range list {
		if info.State == daemon.StateRunning {
			res.adopted++
		}
	}
	fmt.Fprintf(cfg.progress, "scale: restart: %d of %d sandboxes running after %v\n", res.adopted, len(ids), res.adopt)
	if res.adopted != len(ids) {
		return nil, fmt.Errorf("restart: %d of %d sandboxes running", res.adopted, len(ids))
	}
	// Those adopted still answer.
	if err := execTrue(ctx, c, ids[len(ids)-1]); err != nil {
		return nil, fmt.Errorf("after the restart: %w", err)
	}

	start = time.Now()
	for _, id := range ids {
		if err := c.call(ctx, "DELETE", "/sandboxes/"+id+"?remove_logs=true", nil, nil); err != nil {
			return nil, err
		}
	}
	res.deleteAll = time.Since(start)
	fmt.Fprintf(cfg.progress, "scale: %d sandboxes deleted in %v\n", len(ids), res.deleteAll)
	return res, nil
}

// scaleCounts are the counts a run measures at: the first step, then
// every step up to n, and n.
func scaleCounts(n, step int) []int {
	counts := []int{min(n, scaleFirstStep)}
	for s := step; s <= n; s += step {
		if s > counts[len(counts)-1] {
			counts = append(counts, s)
		}
	}
	if counts[len(counts)-1] != n {
		counts = append(counts, n)
	}
	return counts
}

// idleCPU is the CPU time this process (kilnd, and the bench, which waits)
// spends over a window with no request, and the window's length.
func idleCPU(ctx context.Context, window time.Duration) (time.Duration, time.Duration, error) {
	before, err := selfCPU()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	t := time.NewTimer(window)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	after, err := selfCPU()
	return after - before, time.Since(start), err
}

// selfCPU is this process's user and system time.
func selfCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// tasksTree is the number of threads of a process and its descendants.
func tasksTree(pid int) int {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	n := len(tasks)
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			child, _ := strconv.Atoi(f)
			n += tasksTree(child)
		}
	}
	return n
}

// countFDs is the number of descriptors this process has open.
func countFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

func mib(n int64) string { return fmt.Sprintf("%.2f", float64(n)/(1<<20)) }

func renderScale(cfg config, res results) string {
	var b strings.Builder
	writeHeader(&b, cfg, res, "Scale")
	writeScale(&b, cfg, res.scale)
	return b.String()
}

func writeScale(b *strings.Builder, cfg config, s *scaleResult) {
	b.WriteString("## Sandboxes at scale\n\n")
	if s.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s.\n\n", s.skipped)
		return
	}
	fmt.Fprintf(b, "A kilnd in this process (its agents and spawners kilnd's own binary, built for the run), called over its unix socket, is given sandboxes one after another (each\n"+
		"answered, then an exec of `true` in it, which starts its spawner) to %d; at each step: the creates since the\n"+
		"step before (at the first, as many as a step's, each beyond it deleted after its exec, so that both p99s are of as many), the CPU time this process spent in %v with no request (kilnd is in it; the bench only waits),\n"+
		"then, every sandbox idle, what they cost (their agents' and spawners' proportional set size, and how many\n"+
		"spawners still run: one outlasts its sandbox's last process by %v; kilnd's heap, descriptors and goroutines,\n"+
		"growth since before the first), an exec of `true` in the first sandbox, idle, whose spawner starts again\n"+
		"(wake), and at once a second (warm), and %d calls of `GET /sandboxes`, then as many of `GET /sandboxes?label=group=3`\n"+
		"(each sandbox is labelled with one of %d groups in turn: a tenth of them listed).\n\n",
		cfg.scale, scaleIdleWindow, handoff.DefaultSpawnerIdle, scaleListCalls, scaleGroups)
	b.WriteString("| sandboxes | create p50 | create p99 | agent PSS MiB | spawner PSS MiB | spawners running | kilnd heap MiB | MiB per sandbox | kilnd idle CPU | exec wake | exec warm | list p50 | list p99 | by label p50 | by label p99 | descriptors per sandbox | goroutines per sandbox | threads per sandbox |\n" +
		"|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, st := range s.steps {
		fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %d | %s | %.2f | %.2f%% | %s | %s | %s | %s | %s | %s | %.2f | %.1f | %.1f |\n", st.n,
			ms(pct(st.creates, 50)), ms(pct(st.creates, 99)),
			mib(st.perSandbox(st.agentPSS)), mib(st.perSandbox(st.spawnerPSS)), st.spawners, mib(st.perSandbox(max(0, st.kilndHeap))),
			st.perSandboxMiB(), 100*st.idleCPU.Seconds()/st.idleWindow.Seconds(), ms(st.wake), ms(st.warm),
			ms(pct(st.list, 50)), ms(pct(st.list, 99)), ms(pct(st.labelList, 50)), ms(pct(st.labelList, 99)), float64(st.fds)/float64(st.n), float64(st.goroutines)/float64(st.n),
			float64(st.tasks)/float64(st.n))
	}
	b.WriteString("\nIdle CPU is a share of one core. Agent, spawner and kilnd heap are per sandbox.\n\n")
	first, last := s.steps[0], s.steps[len(s.steps)-1]
	ratio := float64(pct(last.creates, 99)) / float64(pct(first.creates, 99))
	b.WriteString("| figure | value | target | result |\n|---|---:|---|---|\n")
	fmt.Fprintf(b, "| create p99 at %d / at %d | %.2f | ≤ %d | %s |\n", last.n, first.n, ratio, targetScaleCreateRatio, verdict(ratio <= targetScaleCreateRatio))
	fmt.Fprintf(b, "| memory per idle sandbox at %d | %.2f MiB | < %d MiB | %s |\n", last.n, last.perSandboxMiB(), targetScaleSandboxMiB,
		verdict(last.perSandboxMiB() < targetScaleSandboxMiB))
	fmt.Fprintf(b, "| restart: a new kilnd on the same state, start to every one of %d sandboxes listed running | %s | < %v | %s |\n",
		s.adopted, ms(s.adopt), targetScaleAdopt, verdict(s.adopt < targetScaleAdopt))
	fmt.Fprintf(b, "| delete all %d, one after another | %s (%s each) | | |\n\n", last.n, ms(s.deleteAll), ms(s.deleteAll/time.Duration(last.n)))
	// The limit: whichever of pids, memory and descriptors runs out first.
	tasks, mem := float64(last.tasks)/float64(last.n), last.perSandboxMiB()*(1<<20)
	byPids, byMem := float64(s.pidMax)/tasks, float64(s.memAvailable)/mem
	byFDs := float64(s.nofile) / (float64(last.fds) / float64(last.n))
	bound := "pids"
	if byMem < byPids {
		bound = "memory"
	}
	if byFDs < min(byPids, byMem) {
		bound = "descriptors"
	}
	fmt.Fprintf(b, "What bounds the count on this host, at the figures of %d: pids, %.1f threads per sandbox (its agent's, and its\n"+
		"spawner's while it runs; each thread takes a pid) against the kernel's pid_max of %d, shared with the rest of the host, at most\n"+
		"%.0f sandboxes; memory, %s available before the first at %.2f MiB each, %.0f; kilnd's descriptors, a limit of %d at\n"+
		"%.2f each, %.0f. The first to run out: **%s**.\n\n",
		last.n, tasks, s.pidMax, byPids, bytesText(s.memAvailable), last.perSandboxMiB(), byMem, s.nofile,
		float64(last.fds)/float64(last.n), byFDs, bound)
}
