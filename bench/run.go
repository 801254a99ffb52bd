package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"
)

// results is everything one run measured; a section that did not run is nil.
type results struct {
	machine    machine
	started    time.Time
	elapsed    time.Duration
	steal      string // the share of the CPU the host took for other guests meanwhile
	throughput *throughputResult
	capture    *captureResult
	lossless   *losslessResult
	kilnd      *kilndResult
	files      *filesResult
	ports      *portsResult
	attach     *attachResult
	sdk        *sdkResult
	tombstones *tombstoneResult
	running    *runningResult
	compare    *compareResult
	start      *compareResult // the start section: compare's sandbox starts alone
	scale      *scaleResult
	snapshot   *snapshotResult
	memfork    *memforkResult
	pause      *pauseResult
	cluster    *clusterResult
}

// run runs the benchmark's sections that cfg selects and writes the
// report. Long because it is the sections in the order the report has
// them, each a call and its result.
func run(ctx context.Context, cfg config) (err error) {
	if cfg.cpuprofile != "" {
		f, err := os.Create(cfg.cpuprofile)
		if err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("cpuprofile %s: %w", cfg.cpuprofile, err)
		}
		defer func() {
			pprof.StopCPUProfile()
			if cerr := f.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("cpuprofile: %w", cerr)
			}
		}()
	}
	res := results{machine: probeMachine(), started: time.Now()}
	cpu := readCPUTimes()
	if cfg.has("throughput") {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find this binary to re-execute as the child: %w", err)
		}
		if res.throughput, err = measureThroughput(ctx, cfg, exe); err != nil {
			return fmt.Errorf("throughput: %w", err)
		}
	}
	if cfg.has("capture") {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find this binary to re-execute as the child: %w", err)
		}
		if res.capture, err = measureCapture(ctx, cfg, exe); err != nil {
			return fmt.Errorf("capture: %w", err)
		}
	}
	if cfg.has("lossless") {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find this binary to re-execute as the child: %w", err)
		}
		if res.lossless, err = measureLossless(ctx, cfg, exe); err != nil {
			return fmt.Errorf("lossless: %w", err)
		}
	}
	if cfg.has("kilnd") {
		var err error
		if res.kilnd, err = measureKilnd(ctx, cfg); err != nil {
			return fmt.Errorf("kilnd: %w", err)
		}
	}
	if cfg.has("attach") {
		var err error
		if res.attach, err = measureAttach(ctx, cfg); err != nil {
			return fmt.Errorf("attach: %w", err)
		}
	}
	if cfg.has("sdk") {
		var err error
		if res.sdk, err = measureSDK(ctx, cfg); err != nil {
			return fmt.Errorf("sdk: %w", err)
		}
	}
	if cfg.has("files") {
		var err error
		if res.files, err = measureFiles(ctx, cfg); err != nil {
			return fmt.Errorf("files: %w", err)
		}
	}
	if cfg.has("ports") {
		var err error
		if res.ports, err = measurePorts(ctx, cfg); err != nil {
			return fmt.Errorf("ports: %w", err)
		}
	}
	if cfg.has("tombstone") {
		r, err := measureTombstones(ctx, cfg)
		if err != nil {
			return fmt.Errorf("tombstone memory: %w", err)
		}
		res.tombstones = &r
	}
	if cfg.has("running") {
		r, err := measureRunning(ctx, cfg)
		if err != nil {
			return fmt.Errorf("running-process memory: %w", err)
		}
		res.running = &r
	}
	if cfg.has("scale") {
		var err error
		if res.scale, err = measureScale(ctx, cfg); err != nil {
			return fmt.Errorf("scale: %w", err)
		}
	}
	if cfg.has("start") {
		var err error
		if res.start, err = measureStart(ctx, cfg); err != nil {
			return fmt.Errorf("sandbox start: %w", err)
		}
	}
	if cfg.has("snapshot") {
		var err error
		if res.snapshot, err = measureSnapshots(ctx, cfg); err != nil {
			return fmt.Errorf("snapshots: %w", err)
		}
	}
	if cfg.has("memfork") {
		var err error
		if res.memfork, err = measureMemfork(ctx, cfg); err != nil {
			return fmt.Errorf("memory fork: %w", err)
		}
	}
	if cfg.has("pause") {
		var err error
		if res.pause, err = measurePause(ctx, cfg); err != nil {
			return fmt.Errorf("pause: %w", err)
		}
	}
	if cfg.has("cluster") {
		var err error
		if res.cluster, err = measureCluster(ctx, cfg); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	if cfg.has("compare") {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find this binary to re-execute as the child: %w", err)
		}
		if res.compare, err = measureCompare(ctx, cfg, exe); err != nil {
			return fmt.Errorf("compare: %w", err)
		}
	}
	res.elapsed = time.Since(res.started)
	res.steal = stealText(cpu, readCPUTimes())

	// The comparison, the scale, the snapshot, the memory fork, the pause
	// and the cluster sections have reports of their own; the engine's has
	// the rest.
	reports := map[string]string{}
	if res.pause != nil {
		reports["pause"] = renderPause(cfg, res)
	}
	if res.scale != nil {
		reports["scale"] = renderScale(cfg, res)
	}
	if res.compare != nil {
		reports["compare"] = renderCompare(cfg, res)
	}
	if res.cluster != nil {
		reports["cluster"] = renderCluster(cfg, res)
	}
	if res.snapshot != nil {
		reports["snapshot"] = renderSnapshot(cfg, res)
	}
	if res.memfork != nil {
		reports["memfork"] = renderMemfork(cfg, res)
	}
	if res.throughput != nil || res.capture != nil || res.lossless != nil || res.kilnd != nil || res.attach != nil || res.sdk != nil || res.files != nil || res.ports != nil || res.tombstones != nil || res.running != nil || res.start != nil {
		reports["engine"] = renderReport(cfg, res)
	}
	for _, name := range []string{"engine", "scale", "snapshot", "memfork", "compare", "pause", "cluster"} {
		text, ok := reports[name]
		if !ok {
			continue
		}
		if _, err := fmt.Fprint(cfg.stdout, text); err != nil {
			return err
		}
		if cfg.out == "" {
			continue
		}
		path := filepath.Join(cfg.out, res.started.Format("2006-01-02")+"-"+name+".md")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		fmt.Fprintf(cfg.progress, "report written to %s\n", path)
	}
	return nil
}
