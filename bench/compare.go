package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// The comparison puts sandkiln beside what a user would otherwise reach
// for on one machine, on the same input in the same run.
const (
	compareWatchers = 64
	compareStarts   = 20 // sandbox starts per runtime
	// compareWarm is kilnd's sandboxes made ahead per runtime (its
	// default for namespaces, kilnd --warm; gVisor's asked for as much).
	compareWarm = 2
	compareIdle = 5 // idle sandboxes per runtime
)

// Comparison cases.
const (
	casePipe      = "child | reader"
	caseSandkiln  = "sandkiln"
	caseTee       = "child | tee, 64 pipes"
	caseDtach     = "dtach -N"
	caseTmux      = "tmux new-session -d"
	caseRunc      = "runc run"
	caseRunsc     = "runsc run"
	caseGVisor    = "sandkiln, gvisor"
	caseOwn       = "sandkiln, not made ahead"
	caseGVisorOwn = "sandkiln, gvisor, not made ahead"
	caseKilnRun   = "kiln run --rm"
	caseKilnRunG  = "kiln run --rm --runtime gvisor"
	caseTerminal  = "sandkiln, terminal"
)

// The terminal shape: 16 KiB lines through a pseudo-terminal, where the
// terminal, not the tool, sets the pace.
var terminalShape = shape{name: "16 KiB lines on a terminal", write: 16 << 10, line: 16 << 10}

// terminalRepsEach is how many runs of each terminal case a rep makes;
// targetTerminal is the engine's terminal throughput over dtach's it is
// held to.
const (
	terminalRepsEach = 3
	targetTerminal   = 1.0
)

type timedCase struct {
	name string
	note string
	secs []float64
	kept []int64 // throughput cases: bytes of the child's output kept or delivered
	// creates are a start case's creates alone (POST /sandboxes to its
	// answer), where it makes them through the API.
	creates []float64
}

// gbps is the median rate of bytes kept.
func (c *timedCase) gbps() float64 {
	var r []float64
	for i, s := range c.secs {
		r = append(r, float64(c.kept[i])/s/1e9)
	}
	return median(r)
}

type compareShape struct {
	shape
	bytes int64
	cases []*timedCase
}

type compareResult struct {
	size, ttySize int64
	reps          int
	dir, fsType   string
	skipped       []string
	shapes        []*compareShape // capture shapes and the terminal
	fanout        []*timedCase    // 64 watchers
	starts        []*timedCase    // create + exec true + remove, seconds per start
	startRuns     int             // measured starts per runtime
	idle          []idleCase
	tombstone     float64 // heap bytes per tombstone
}

type idleCase struct {
	name  string
	bytes float64 // per idle sandbox
	note  string
}

func (s *compareShape) add(name, note string) *timedCase {
	c := &timedCase{name: name, note: note}
	s.cases = append(s.cases, c)
	return c
}

// measureCompare runs every case of the comparison, reps times
// interleaved after an unmeasured small warm-up.
// Long because a benchmark reads best as its steps in the order they run,
// each case measured between the same two clock reads.
func measureCompare(ctx context.Context, cfg config, exe string) (*compareResult, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the comparison needs root (sandboxes, runc, runsc)")
	}
	base, err := os.MkdirTemp(cfg.captureDir, "sandkiln-bench-compare-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	res := &compareResult{size: cfg.captureSize, ttySize: cfg.ttySize, reps: cfg.reps, dir: cfg.captureDir, fsType: fsType(base)}
	have := res.have
	hasSupervisord, hasS6, hasDtach, hasTmux, hasRunc, hasRunsc := have("supervisord"), have("s6-log"), have("dtach"), have("tmux"), have("runc"), have("runsc")

	// Throughput: the capture shapes to a log, and the terminal shape.
	runs := 0
	work := func() (string, error) {
		runs++
		dir := filepath.Join(base, strconv.Itoa(runs))
		return dir, os.Mkdir(dir, 0o700)
	}
	// A runner returns the case's time and the bytes it kept; every tool
	// but sandkiln keeps all or fails.
	type runner func(ctx context.Context, sh shape, size int64, dir string) (time.Duration, error)
	kept := int64(-1)
	capture := func(name string) runner {
		return func(ctx context.Context, sh shape, size int64, dir string) (time.Duration, error) {
			s, err := runCapture(ctx, exe, name, sh, size, dir)
			kept = s.persisted
			return s.elapsed, err
		}
	}
	runners := map[string]runner{
		caseFile: capture(caseFile),
		casePipe: func(ctx context.Context, sh shape, size int64, _ string) (time.Duration, error) {
			return runPipe(ctx, exe, sh, size)
		},
		caseSupervisor: capture(caseSupervisor),
		caseS6:         capture(caseS6),
		caseSandkiln:   capture(caseEngine),
		caseDtach: func(ctx context.Context, sh shape, size int64, dir string) (time.Duration, error) {
			return runDtach(ctx, exe, sh, size, dir)
		},
		caseTmux: func(ctx context.Context, sh shape, size int64, dir string) (time.Duration, error) {
			return runTmux(ctx, exe, sh, size, dir)
		},
		caseTerminal: func(ctx context.Context, sh shape, size int64, _ string) (time.Duration, error) {
			return runTerminal(ctx, exe, sh, size)
		},
	}
	for _, sh := range captureShapes {
		s := &compareShape{shape: sh, bytes: sh.bytes(res.size)}
		s.add(caseFile, "the physical limit: the child's stdout is the file")
		s.add(casePipe, "drained, nothing kept")
		if hasSupervisord {
			s.add(caseSupervisor, "to a file, rotation off (it slows the child to its pace)")
		}
		if hasS6 {
			s.add(caseS6, "to a rotated directory, 10 MiB × 5")
		}
		s.add(caseSandkiln, "engine + durable capture, rotation 10 MiB × 5, never slows the child")
		res.shapes = append(res.shapes, s)
	}
	tty := &compareShape{shape: terminalShape, bytes: terminalShape.bytes(res.ttySize)}
	if hasDtach {
		tty.add(caseDtach, "detached session, no scrollback, output drained")
	}
	if hasTmux {
		tty.add(caseTmux, "detached session, 2000 lines of history, terminal emulation")
	}
	tty.add(caseTerminal, "engine on a terminal, no capture: 1 MiB of replayable output")
	res.shapes = append(res.shapes, tty)

	sizeOf := func(s *compareShape) int64 {
		if s == tty {
			return res.ttySize
		}
		return res.size
	}
	once := func(s *compareShape, c *timedCase, size int64) (time.Duration, error) {
		dir, err := work()
		if err != nil {
			return 0, err
		}
		defer os.RemoveAll(dir)
		runtime.GC()
		kept = -1
		d, err := runners[c.name](ctx, s.shape, size, dir)
		if kept < 0 {
			kept = s.shape.bytes(size)
		}
		return d, err
	}
	for _, s := range res.shapes {
		for _, c := range s.cases {
			if _, err := once(s, c, min(sizeOf(s), warmMax)); err != nil {
				return nil, fmt.Errorf("warm-up of %q, %s: %w", c.name, s.name, err)
			}
		}
	}
	for rep := range cfg.reps {
		for _, s := range res.shapes {
			// The terminal's runs are short and swing with the machine's
			// load: more of them, still interleaved.
			times := 1
			if s == tty {
				times = terminalRepsEach
			}
			for range times {
				for _, c := range s.cases {
					d, err := once(s, c, sizeOf(s))
					if err != nil {
						return nil, fmt.Errorf("rep %d of %q, %s: %w", rep+1, c.name, s.name, err)
					}
					c.secs, c.kept = append(c.secs, d.Seconds()), append(c.kept, kept)
					fmt.Fprintf(cfg.progress, "compare: rep %d/%d  %-26s %-22s %7.3f s  %6.3f GB/s kept\n", rep+1, cfg.reps, s.name, c.name,
						d.Seconds(), float64(kept)/d.Seconds()/1e9)
				}
			}
		}
	}

	// 64 watchers of one child: sandkiln's readers never slow it; tee's
	// pipes do, each reader as fast as it can.
	pipe := &timedCase{name: casePipe, note: "one reader: the reference"}
	tee := &timedCase{name: caseTee, note: "each pipe drained by its own reader"}
	eng := &timedCase{name: caseSandkiln}
	res.fanout = []*timedCase{pipe, tee, eng}
	buf := make([]byte, 256<<10)
	least := 1.0 // the least a sandkiln watcher received, of the whole
	for rep := range cfg.reps {
		runtime.GC()
		s, err := runRaw(ctx, exe, res.size, 0, buf)
		if err != nil {
			return nil, fmt.Errorf("fan-out, pipe: %w", err)
		}
		pipe.secs = append(pipe.secs, s.workload.Seconds())
		runtime.GC()
		d, err := runTee(ctx, exe, res.size, compareWatchers)
		if err != nil {
			return nil, fmt.Errorf("fan-out, tee: %w", err)
		}
		tee.secs = append(tee.secs, d.Seconds())
		runtime.GC()
		s, err = runEngine(ctx, exe, res.size, compareWatchers)
		if err != nil {
			return nil, fmt.Errorf("fan-out, sandkiln: %w", err)
		}
		eng.secs = append(eng.secs, s.workload.Seconds())
		least = min(least, s.minFrac)
		fmt.Fprintf(cfg.progress, "compare: rep %d/%d  %d watchers: pipe %.3f s, tee %.3f s, sandkiln %.3f s\n", rep+1, cfg.reps,
			compareWatchers, pipe.secs[rep], tee.secs[rep], eng.secs[rep])
	}
	eng.note = fmt.Sprintf("%d attached readers following the ring; each received at least %.1f%% of the output, the rest reported as gaps", compareWatchers, 100*least)

	// Sandbox start, and memory per idle sandbox.
	if err := compareSandboxes(ctx, cfg, res, base, hasRunc, hasRunsc, true); err != nil {
		return nil, err
	}
	t, err := measureTombstones(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("tombstones: %w", err)
	}
	res.tombstone = t.perTombstone()
	return res, nil
}

// runPipe is the child's stdout into a pipe drained by a plain loop.
func runPipe(ctx context.Context, exe string, sh shape, size int64) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = sh.environ(size, "")
	cmd.Stderr = os.Stderr
	return drainCommand(cmd, sh.bytes(size))
}

// runTee is `child | tee /dev/fd/3 … /dev/fd/N`, every pipe drained by a
// loop of its own; the time is the child's start until tee is done.
func runTee(ctx context.Context, exe string, size int64, n int) (time.Duration, error) {
	child := exec.CommandContext(ctx, exe)
	child.Env = childEnviron(size)
	child.Stderr = os.Stderr
	tee := exec.CommandContext(ctx, "tee")
	tee.Stderr = os.Stderr
	var readers []*os.File
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	for i := range n {
		r, w, err := os.Pipe()
		if err != nil {
			return 0, err
		}
		readers = append(readers, r)
		tee.ExtraFiles = append(tee.ExtraFiles, w)
		tee.Args = append(tee.Args, "/dev/fd/"+strconv.Itoa(3+i))
	}
	closeWriters := func() {
		for _, w := range tee.ExtraFiles {
			w.Close()
		}
	}
	var err error
	if tee.Stdin, err = child.StdoutPipe(); err != nil {
		closeWriters()
		return 0, err
	}
	// tee's own stdout is one more copy nobody reads: send it nowhere.
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		closeWriters()
		return 0, err
	}
	defer devnull.Close()
	tee.Stdout = devnull
	got := make(chan int64, n)
	for _, r := range readers {
		go func() {
			m, _ := discard(r, make([]byte, 256<<10))
			got <- m
		}()
	}
	start := time.Now()
	if err := child.Start(); err != nil {
		closeWriters()
		return 0, err
	}
	err = tee.Start()
	closeWriters()
	if err != nil {
		child.Process.Kill()
		child.Wait()
		return 0, err
	}
	cerr, terr := child.Wait(), tee.Wait()
	d := time.Since(start)
	for range n {
		if m := <-got; m != size && cerr == nil && terr == nil {
			terr = fmt.Errorf("a tee reader got %d bytes, child wrote %d", m, size)
		}
	}
	return d, errors.Join(cerr, terr)
}

// childCommand is the child as a command line for tools that take one.
func childCommand(exe string, sh shape, size int64) []string {
	return []string{"env", childEnv + "=" + childWrite, bytesEnv + "=" + strconv.FormatInt(sh.bytes(size), 10),
		writeEnv + "=" + strconv.Itoa(sh.write), lineEnv + "=" + strconv.Itoa(sh.line), exe}
}

// runDtach runs the child in a dtach session nobody attaches to; dtach -N
// stays in the foreground until the child exits.
func runDtach(ctx context.Context, exe string, sh shape, size int64, dir string) (time.Duration, error) {
	args := append([]string{"-N", filepath.Join(dir, "dtach.sock"), "-E", "-r", "none"}, childCommand(exe, sh, size)...)
	cmd := exec.CommandContext(ctx, "dtach", args...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	// dtach's master ends with status 1 when its terminal reports the
	// program gone (EIO): its normal end, when it says nothing.
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1 && len(out) == 0) {
		return 0, fmt.Errorf("dtach: %v: %s", err, out)
	}
	return d, nil
}

// runTmux runs the child in a detached tmux session on a server of its
// own and waits until the child has exited.
func runTmux(ctx context.Context, exe string, sh shape, size int64, dir string) (time.Duration, error) {
	sock := filepath.Join(dir, "tmux.sock")
	tmux := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "tmux", append([]string{"-S", sock, "-f", os.DevNull}, args...)...)
	}
	line := strings.Join(childCommand(exe, sh, size), " ") + "; tmux -S " + sock + " wait-for -S done"
	start := time.Now()
	if out, err := tmux("new-session", "-d", "-x", "80", "-y", "24", line).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("tmux new-session: %v: %s", err, out)
	}
	defer tmux("kill-server").Run()
	if out, err := tmux("wait-for", "done").CombinedOutput(); err != nil {
		return 0, fmt.Errorf("tmux wait-for: %v: %s", err, out)
	}
	return time.Since(start), nil
}

// runTerminal runs the child through the engine on a terminal, with no
// reader; the time is Start until the output has drained.
func runTerminal(ctx context.Context, exe string, sh shape, size int64) (time.Duration, error) {
	start := time.Now()
	p, err := process.Start("bench", process.Spec{Argv: []string{exe}, Env: sh.environ(size, ""), Terminal: &process.WindowSize{Cols: 80, Rows: 24}})
	if err != nil {
		return 0, err
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		cancelRun(p, new(sync.WaitGroup))
		return 0, ctx.Err()
	}
	d := time.Since(start)
	exit, err := p.Wait(ctx)
	if err != nil {
		return 0, err
	}
	if exit != (process.Exit{}) {
		return 0, fmt.Errorf("child ended with %v", exit)
	}
	// The terminal turns each newline into CR LF.
	if got, want := p.Status().Totals[ring.PTY], sh.bytes(size)+sh.bytes(size)/int64(sh.line); got != want {
		return 0, fmt.Errorf("engine counted %d terminal bytes, want %d", got, want)
	}
	return d, nil
}

// compareSandboxes measures a sandbox's start (create, exec true, remove)
// and its memory while idle, in sandkiln and in the OCI runtimes.
// Long because a benchmark reads best as its steps in the order they run,
// the same steps for each runtime side by side.
func compareSandboxes(ctx context.Context, cfg config, res *compareResult, base string, hasRunc, hasRunsc, idleToo bool) error {
	k, c, err := startKilndConfig(daemon.Config{StateDir: filepath.Join(base, "kilnd"),
		Warm: map[string]int{sandbox.RuntimeNamespaces: compareWarm, sandbox.RuntimeGVisor: compareWarm}})
	if err != nil {
		return err
	}
	defer k.Close()
	defer c.http.CloseIdleConnections()
	kilnBin, err := buildKiln(ctx)
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Dir(kilnBin))
	kilnRun := func(args ...string) error {
		cmd := exec.CommandContext(ctx, kilnBin, append(append([]string{"run", "--rm"}, args...), "--", "true")...)
		cmd.Env = append(os.Environ(), "KILN_ADDR=unix://"+c.sock)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kiln run: %w: %s", err, out)
		}
		return nil
	}

	kiln := &timedCase{name: caseSandkiln, note: "POST /sandboxes `{}`, POST …/exec `true`, DELETE, over kilnd's socket: the create takes a sandbox made ahead"}
	res.starts = append(res.starts, kiln)
	// startKiln's creates are counted to tc (on the timed reps).
	startKiln := func(body map[string]any, tc *timedCase, i int) error {
		var info daemon.Info
		t0 := time.Now()
		if err := c.call(ctx, "POST", "/sandboxes", body, &info); err != nil {
			return err
		}
		if tc != nil && i >= 2 {
			tc.creates = append(tc.creates, time.Since(t0).Seconds())
		}
		var r api.ExecResult
		err := c.call(ctx, "POST", "/sandboxes/"+info.ID+"/exec", api.ExecRequest{Command: "true"}, &r)
		if err == nil && (r.ExitCode == nil || *r.ExitCode != 0) {
			err = fmt.Errorf("exec true: %+v", r)
		}
		// The sandbox goes whatever the exec did: one left behind would run
		// on after the bench.
		return errors.Join(err, c.call(ctx, "DELETE", "/sandboxes/"+info.ID+"?remove_logs=true", nil, nil))
	}
	type runtimeCase struct {
		c     *timedCase
		start func(i int) error
	}
	own := &timedCase{name: caseOwn, note: "the same with `{\"hostname\": \"own\"}`, a create not of the shape made ahead: its agent starts for it"}
	run := &timedCase{name: caseKilnRun, note: "`kiln run --rm -- true` end to end (kiln's own start, create, exec, output, exit, remove), over kilnd's socket"}
	res.starts = append(res.starts, own, run)
	cases := []runtimeCase{
		{kiln, func(i int) error { return startKiln(map[string]any{}, kiln, i) }},
		{own, func(i int) error { return startKiln(map[string]any{"hostname": "own"}, own, i) }},
		{run, func(int) error { return kilnRun() }},
	}
	gvisor := map[string]any{"runtime": "gvisor"}
	hasGVisor := hasRunsc && startKiln(gvisor, nil, 0) == nil
	if hasGVisor {
		tc := &timedCase{name: caseGVisor, note: "the same, `{\"runtime\": \"gvisor\"}`: runsc (" + runscPlatform + ") under kilnd"}
		tcOwn := &timedCase{name: caseGVisorOwn, note: "the same with `{\"runtime\": \"gvisor\", \"hostname\": \"own\"}`"}
		tcRun := &timedCase{name: caseKilnRunG, note: "`kiln run --rm --runtime gvisor -- true` end to end"}
		res.starts = append(res.starts, tc, tcOwn, tcRun)
		cases = append(cases,
			runtimeCase{tc, func(i int) error { return startKiln(gvisor, tc, i) }},
			runtimeCase{tcOwn, func(i int) error { return startKiln(map[string]any{"runtime": "gvisor", "hostname": "own"}, tcOwn, i) }},
			runtimeCase{tcRun, func(int) error { return kilnRun("--runtime", "gvisor") }})
	} else if hasRunsc {
		res.skipped = append(res.skipped, "sandkiln, gvisor: kilnd --runtimes has no gvisor (runsc too old?)")
	}
	var bundle string
	if hasRunc || hasRunsc {
		if bundle, err = ociBundle(base); err != nil {
			res.skipped = append(res.skipped, fmt.Sprintf("runc, runsc: no bundle: %v", err))
			hasRunc, hasRunsc = false, false
		}
	}
	if hasRunc {
		tc := &timedCase{name: caseRunc, note: "busybox bundle, `/bin/true`, no network namespace setup beyond the spec's"}
		res.starts = append(res.starts, tc)
		root := filepath.Join(base, "runc")
		cases = append(cases, runtimeCase{tc, func(i int) error {
			return ociRun(ctx, "runc", []string{"--root", root}, bundle, "bench-"+strconv.Itoa(i))
		}})
	}
	if hasRunsc {
		tc := &timedCase{name: caseRunsc, note: "same bundle; --network=none --ignore-cgroups --platform=" + runscPlatform}
		res.starts = append(res.starts, tc)
		root := filepath.Join(base, "runsc")
		defer unmountNullNetNS(root)
		cases = append(cases, runtimeCase{tc, func(i int) error {
			return ociRun(ctx, "runsc", runscFlags(root), bundle, "bench-"+strconv.Itoa(i))
		}})
	}
	res.startRuns = max(1, compareStarts/max(1, cfg.kilndScale))
	for i := range res.startRuns + 2 {
		for _, rc := range cases {
			// What kilnd does after an answer (a delete finished, a
			// sandbox made ahead again) is done before anything is
			// timed, kilnd's cases and the others alike.
			sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err := k.Daemon.Settle(sctx)
			cancel()
			if err != nil {
				return fmt.Errorf("settle kilnd before %s: %w", rc.c.name, err)
			}
			awaitIdle(ctx)
			start := time.Now()
			if err := rc.start(i); err != nil {
				return fmt.Errorf("%s: %w", rc.c.name, err)
			}
			if i >= 2 { // two warm-ups
				rc.c.secs = append(rc.c.secs, time.Since(start).Seconds())
			}
		}
	}
	for _, rc := range cases {
		fmt.Fprintf(cfg.progress, "compare: sandbox start, %s: p50 %.2f ms\n", rc.c.name, 1e3*median(rc.c.secs))
	}

	if !idleToo {
		return nil
	}
	// Idle: sandkiln's agents and kilnd's heap growth; an OCI container
	// running `sleep` with everything its runtime leaves behind.
	idle := func(body map[string]any) (idleMemory, error) {
		m, ids, err := idleSandboxes(ctx, c, compareIdle, body)
		for _, id := range ids {
			if derr := c.call(ctx, "DELETE", "/sandboxes/"+id+"?remove_logs=true", nil, nil); err == nil {
				err = derr
			}
		}
		return m, err
	}
	m, err := idle(map[string]any{})
	if err != nil {
		return err
	}
	res.idle = append(res.idle, idleCase{name: caseSandkiln, bytes: m.perSandboxMiB * (1 << 20), note: "the agent's and its spawner's PSS and kilnd's heap growth"})
	if hasGVisor {
		m, err := idle(gvisor)
		if err != nil {
			return err
		}
		res.idle = append(res.idle, idleCase{name: caseGVisor, bytes: m.perSandboxMiB * (1 << 20), note: "runsc, its sentry and gofer with the agent inside, and kilnd's heap growth"})
	}
	if hasRunc {
		b, err := ociIdle(ctx, "runc", []string{"--root", filepath.Join(base, "runc-idle")}, bundle)
		if err != nil {
			return fmt.Errorf("runc idle: %w", err)
		}
		res.idle = append(res.idle, idleCase{name: caseRunc, bytes: b, note: "the container's `sleep` (runc itself exits; no shim counted)"})
	}
	if hasRunsc {
		defer unmountNullNetNS(filepath.Join(base, "runsc-idle"))
		b, err := ociIdle(ctx, "runsc", runscFlags(filepath.Join(base, "runsc-idle")), bundle)
		if err != nil {
			return fmt.Errorf("runsc idle: %w", err)
		}
		res.idle = append(res.idle, idleCase{name: caseRunsc, bytes: b, note: "the sandbox, gofer and `sleep` (every process of that runsc root)"})
	}
	return nil
}

// runscPlatform is kilnd's default: the runsc that kilnd runs has it.
const runscPlatform = "systrap"

func runscFlags(root string) []string {
	return []string{"--root", root, "--network=none", "--ignore-cgroups", "--platform=" + runscPlatform}
}

// unmountNullNetNS removes what runsc leaves mounted in its root (its
// empty network namespace), so that the root can be removed.
func unmountNullNetNS(root string) {
	for unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH) == nil {
	}
}

// ociBundle makes an OCI bundle of busybox running /bin/true.
func ociBundle(base string) (string, error) {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return "", err
	}
	dir := filepath.Join(base, "bundle")
	bin := filepath.Join(dir, "rootfs", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(bin, "busybox"), b, 0o755); err != nil {
		return "", err
	}
	for _, applet := range []string{"sh", "true", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(bin, applet)); err != nil {
			return "", err
		}
	}
	if out, err := exec.Command("runc", "spec", "--bundle", dir).CombinedOutput(); err != nil {
		return "", fmt.Errorf("runc spec: %v: %s", err, out)
	}
	return dir, setBundleArgs(dir, []string{"/bin/true"})
}

func setBundleArgs(dir string, args []string) error {
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return err
	}
	proc, _ := spec["process"].(map[string]any)
	if proc == nil {
		return errors.New("config.json: no process")
	}
	proc["terminal"] = false
	proc["args"] = args
	spec["root"] = map[string]any{"path": "rootfs", "readonly": true}
	if b, err = json.Marshal(spec); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func ociRun(ctx context.Context, runtimeBin string, global []string, bundle, id string) error {
	args := append(append([]string{}, global...), "run", "--bundle", bundle, id)
	if out, err := exec.CommandContext(ctx, runtimeBin, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", runtimeBin, strings.Join(args, " "), err, out)
	}
	return nil
}

// ociIdle runs compareIdle detached containers of `sleep` and sums the PSS
// of every process whose command line names the runtime's root.
func ociIdle(ctx context.Context, runtimeBin string, global []string, bundle string) (float64, error) {
	root := global[1]
	idle := filepath.Join(filepath.Dir(bundle), "bundle-"+filepath.Base(root))
	if err := os.CopyFS(idle, os.DirFS(bundle)); err != nil {
		return 0, err
	}
	// CopyFS does not copy symlinks: the applets again.
	for _, applet := range []string{"sh", "true", "sleep"} {
		os.Remove(filepath.Join(idle, "rootfs", "bin", applet))
		if err := os.Symlink("busybox", filepath.Join(idle, "rootfs", "bin", applet)); err != nil {
			return 0, err
		}
	}
	if err := setBundleArgs(idle, []string{"/bin/sleep", "1000"}); err != nil {
		return 0, err
	}
	var ids []string
	defer func() {
		for _, id := range ids {
			exec.Command(runtimeBin, append(append([]string{}, global...), "delete", "--force", id)...).Run()
		}
	}()
	for i := range compareIdle {
		id := "idle-" + strconv.Itoa(i)
		args := append(append([]string{}, global...), "run", "--detach", "--bundle", idle, id)
		// The container keeps the standard descriptors it is given: a
		// file for errors, not a pipe that would never close.
		errs, err := os.CreateTemp("", "sandkiln-bench-oci-")
		if err != nil {
			return 0, err
		}
		os.Remove(errs.Name())
		cmd := exec.CommandContext(ctx, runtimeBin, args...)
		cmd.Stderr = errs
		err = cmd.Run()
		if err != nil {
			errs.Seek(0, io.SeekStart)
			msg, _ := io.ReadAll(io.LimitReader(errs, 4<<10))
			errs.Close()
			return 0, fmt.Errorf("%s %s: %v: %s", runtimeBin, strings.Join(args, " "), err, msg)
		}
		errs.Close()
		ids = append(ids, id)
	}
	inits, err := containerPIDs(runtimeBin, global, ids)
	if err != nil {
		return 0, err
	}
	var total int64
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	counted := 0
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(cmdline), root) && !inits[pid] {
			continue
		}
		if n, err := pssOf(pid); err == nil {
			total += n
			counted++
		}
	}
	if counted == 0 {
		return 0, errors.New("no process of the idle containers found")
	}
	return float64(total) / compareIdle, nil
}

// containerPIDs are the containers' init processes (runc's do not name
// the root on their command line).
func containerPIDs(runtimeBin string, global, ids []string) (map[int]bool, error) {
	pids := map[int]bool{}
	for _, id := range ids {
		out, err := exec.Command(runtimeBin, append(append([]string{}, global...), "state", id)...).Output()
		if err != nil {
			return nil, fmt.Errorf("%s state %s: %w", runtimeBin, id, err)
		}
		var st struct {
			Pid int `json:"pid"`
		}
		if err := json.Unmarshal(out, &st); err != nil {
			return nil, fmt.Errorf("%s state %s: %w", runtimeBin, id, err)
		}
		pids[st.Pid] = true
	}
	return pids, nil
}

func writeCompare(b *strings.Builder, r *compareResult) {
	b.WriteString("## sandkiln beside the alternatives\n\n")
	fmt.Fprintf(b, "Every case runs the same child (this binary re-executed, writing from one preallocated buffer) in\n"+
		"the same run, %d %s interleaved after one unmeasured warm-up of each. Logs go to %s (%s).\n"+
		"Figures are medians; a ratio is the alternative's figure over sandkiln's.\n\n", r.reps, plural(r.reps, "rep"), r.dir, r.fsType)
	for _, s := range r.skipped {
		fmt.Fprintf(b, "Not run: %s.\n\n", s)
	}
	for _, s := range r.shapes {
		fmt.Fprintf(b, "### %s (%s)\n\n", s.name, bytesText(s.bytes))
		ref := s.find(caseSandkiln)
		if ref == nil {
			ref = s.find(caseTerminal)
		}
		b.WriteString("| tool | GB/s kept | kept | time | rate over sandkiln's | how |\n|---|---:|---:|---:|---:|---|\n")
		for _, c := range s.cases {
			name := cell(c.name)
			if c == ref {
				name = "**" + name + "**"
			}
			fmt.Fprintf(b, "| %s | %.3f | %s | %.3f s | %.2f | %s |\n", name, c.gbps(), c.keptText(s.bytes), median(c.secs), c.gbps()/ref.gbps(), c.note)
		}
		b.WriteString("\n")
		if dtach := s.find(caseDtach); dtach != nil && s.find(caseTerminal) != nil {
			writeTerminalTarget(b, s.find(caseTerminal), dtach)
		}
	}
	if len(r.fanout) > 0 {
		fmt.Fprintf(b, "### %d watchers of one child (%s)\n\n", compareWatchers, bytesText(r.size))
		b.WriteString("The time is the child's start until it has exited and its output is drained: what the watchers\n" +
			"cost the workload. tee waits for its slowest pipe, so the child runs at the pace of the slowest\n" +
			"watcher; sandkiln's watchers follow a ring and never hold the child back.\n\n")
		ref := r.fanout[len(r.fanout)-1]
		b.WriteString("| case | time | time over sandkiln's | how |\n|---|---:|---:|---|\n")
		for _, c := range r.fanout {
			fmt.Fprintf(b, "| %s | %.3f s | %.2f | %s |\n", cell(c.name), median(c.secs), median(c.secs)/median(ref.secs), c.note)
		}
		b.WriteString("\n")
	}
	writeStarts(b, r)
	if len(r.idle) > 0 {
		fmt.Fprintf(b, "### Memory per idle sandbox (%d each; proportional set size)\n\n", compareIdle)
		b.WriteString("| runtime | per sandbox | over sandkiln's | what is counted |\n|---|---:|---:|---|\n")
		for _, c := range r.idle {
			fmt.Fprintf(b, "| %s | %.2f MiB | %.2f | %s |\n", c.name, c.bytes/(1<<20), c.bytes/r.idle[0].bytes, c.note)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(b, "### Memory per finished process\n\nsandkiln keeps a tombstone per finished process (exit, totals, losses): **%.0f B** of heap each.\n"+
		"None of the alternatives keeps a record of a finished run to compare: supervisord keeps one state per\n"+
		"program, tmux and dtach end the session with the command, runc and runsc delete the container.\n\n", r.tombstone)
}

func durations(secs []float64) []time.Duration {
	ds := make([]time.Duration, len(secs))
	for i, s := range secs {
		ds[i] = time.Duration(s * float64(time.Second))
	}
	return ds
}

// cell makes a name safe in a markdown table.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// keptText is the share of the output kept, the lowest of the reps.
func (c *timedCase) keptText(total int64) string {
	least := total
	for _, k := range c.kept {
		least = min(least, k)
	}
	return fmt.Sprintf("%.1f%%", 100*float64(least)/float64(total))
}

func (s *compareShape) find(name string) *timedCase {
	for _, c := range s.cases {
		if c.name == name {
			return c
		}
	}
	return nil
}

// writeTerminalTarget holds the engine's terminal throughput to dtach's:
// of medians, and run by run (each engine run over the dtach run just
// before it).
func writeTerminalTarget(b *strings.Builder, eng, dtach *timedCase) {
	var paired []float64
	for i := range min(len(eng.secs), len(dtach.secs)) {
		paired = append(paired, dtach.secs[i]/eng.secs[i])
	}
	ratio := median(dtach.secs) / median(eng.secs)
	fmt.Fprintf(b, "The engine on a terminal over dtach: %.2f of medians; run by run %.2f to %.2f, median %.2f (%d runs).\n"+
		"Target ≥ %.1f: **%s**. Both read the same kernel path (the terminal's line discipline hands the reader at\n"+
		"most 4 KiB at a time, each read a wake-up), which sets the pace; the ratio swings with the machine's load.\n\n",
		ratio, slices.Min(paired), slices.Max(paired), median(paired), len(paired), targetTerminal, verdict(ratio >= targetTerminal))
}

// Targets of a sandbox's start: the create alone, when it takes a sandbox
// made ahead, and kiln run end to end beside the OCI runtimes' own run.
const (
	targetCreate = 10 * time.Millisecond
	targetRunc   = 0.6
	targetRunsc  = 1.2
)

// writeStartTargets holds the start cases to their targets.
func writeStartTargets(b *strings.Builder, r *compareResult) {
	find := func(name string) *timedCase {
		for _, c := range r.starts {
			if c.name == name {
				return c
			}
		}
		return nil
	}
	result := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "MISS"
	}
	b.WriteString("| target | figure | result |\n|---|---:|---|\n")
	for _, name := range []string{caseSandkiln, caseOwn, caseGVisor, caseGVisorOwn} {
		if c := find(name); c != nil && len(c.creates) > 0 {
			p50 := pct(durations(c.creates), 50)
			fmt.Fprintf(b, "| %s: create to an agent that answers, p50 ≤ %s | %s (p99 %s) | %s |\n", name, ms(targetCreate), ms(p50), ms(pct(durations(c.creates), 99)), result(p50 <= targetCreate))
		}
	}
	for _, t := range []struct {
		kiln, other string
		target      float64
	}{{caseKilnRun, caseRunc, targetRunc}, {caseKilnRunG, caseRunsc, targetRunsc}} {
		k, o := find(t.kiln), find(t.other)
		if k == nil || o == nil {
			continue
		}
		ratio := float64(pct(durations(k.secs), 50)) / float64(pct(durations(o.secs), 50))
		fmt.Fprintf(b, "| %s over %s, p50 ≤ %.1f | %.2f | %s |\n", t.kiln, t.other, t.target, ratio, result(ratio <= t.target))
	}
	b.WriteString("\n")
}

// writeStarts writes the sandbox starts, held to their targets.
func writeStarts(b *strings.Builder, r *compareResult) {
	if len(r.starts) == 0 {
		return
	}
	fmt.Fprintf(b, "### Sandbox start: create, run `true`, remove (%d each, after 2 warm-ups)\n\n", r.startRuns)
	fmt.Fprintf(b, "kilnd makes %d sandboxes ahead per runtime (`kilnd --warm namespaces=2 --warm gvisor=2`; the first is its default). Before each case is timed, kilnd\n"+
		"has made ahead again what the case before took, and the host's CPUs have been idle for 50 ms (at most 5 s\n"+
		"are waited for), so that no case pays for another's.\n\n", compareWarm)
	ref := pct(durations(r.starts[0].secs), 50)
	b.WriteString("| runtime | p50 | p99 | p50 over sandkiln's | how |\n|---|---:|---:|---:|---|\n")
	for _, c := range r.starts {
		ds := durations(c.secs)
		fmt.Fprintf(b, "| %s | %s | %s | %.2f | %s |\n", c.name, ms(pct(ds, 50)), ms(pct(ds, 99)), float64(pct(ds, 50))/float64(ref), c.note)
	}
	b.WriteString("\n")
	writeStartTargets(b, r)
}

// measureStart is the start section: compare's sandbox starts alone.
func measureStart(ctx context.Context, cfg config) (*compareResult, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("sandbox starts need root (sandboxes, runc, runsc)")
	}
	base, err := os.MkdirTemp(cfg.captureDir, "sandkiln-bench-start-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	res := &compareResult{}
	hasRunc, hasRunsc := res.have("runc"), res.have("runsc")
	return res, compareSandboxes(ctx, cfg, res, base, hasRunc, hasRunsc, false)
}

// have reports whether tool is installed; one that is not is named among
// what the report did not run.
func (r *compareResult) have(tool string) bool {
	if _, err := exec.LookPath(tool); err != nil {
		r.skipped = append(r.skipped, fmt.Sprintf("%s: not installed", tool))
		return false
	}
	return true
}
