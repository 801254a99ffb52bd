package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The engine's targets.
const (
	targetThroughputRatio = 0.85 // engine without reader over raw, at least
	targetReaderSlowdown  = 1.25 // workload time with 64 readers over none, at most
	targetReaderCount     = 64
	targetTombstoneBytes  = 512 // heap per tombstone, under
)

func renderReport(cfg config, res results) string {
	var b strings.Builder
	writeHeader(&b, cfg, res, "Benchmark")
	if res.throughput != nil {
		writeThroughput(&b, res.throughput)
	}
	if res.capture != nil {
		writeCapture(&b, res.capture)
	}
	if res.lossless != nil {
		writeLossless(&b, res.lossless)
	}
	if res.kilnd != nil {
		writeKilnd(&b, res.kilnd)
	}
	if res.files != nil {
		writeFiles(&b, res.files)
	}
	if res.attach != nil {
		writeAttach(&b, res.attach)
	}
	if res.sdk != nil {
		writeSDK(&b, res.sdk)
	}
	if res.ports != nil {
		writePorts(&b, res.ports)
	}
	if res.tombstones != nil || res.running != nil {
		writeMemory(&b, res.tombstones, res.running)
	}
	if res.start != nil {
		b.WriteString("## Sandbox start\n\n")
		if len(res.start.skipped) > 0 {
			fmt.Fprintf(&b, "Not run: %s.\n\n", strings.Join(res.start.skipped, "; "))
		}
		writeStarts(&b, res.start)
	}
	return b.String()
}

func renderCompare(cfg config, res results) string {
	var b strings.Builder
	writeHeader(&b, cfg, res, "Comparison")
	writeCompare(&b, res.compare)
	return b.String()
}

// writeHeader names the run: the date, the machine, the command.
func writeHeader(b *strings.Builder, cfg config, res results, title string) {
	m := res.machine
	fmt.Fprintf(b, "# %s, %s\n\n", title, res.started.Format("2006-01-02"))
	fmt.Fprintf(b, "| | |\n|---|---|\n")
	fmt.Fprintf(b, "| date | %s (took %s) |\n", res.started.Format("2006-01-02 15:04:05 MST"), res.elapsed.Round(time.Second))
	fmt.Fprintf(b, "| CPU | %s, %d cores (GOMAXPROCS %d) |\n", m.cpu, m.cores, m.gomaxprocs)
	fmt.Fprintf(b, "| CPU stolen by the host | %s of the CPU time during the run (a virtual machine's steal, from /proc/stat) |\n", res.steal)
	fmt.Fprintf(b, "| memory | %s |\n", m.memory)
	fmt.Fprintf(b, "| kernel | %s |\n", m.kernel)
	fmt.Fprintf(b, "| Go | %s |\n", m.goVersion)
	fmt.Fprintf(b, "| command | `%s` |\n", cfg.cmdline)
	if title == "Scale" {
		fmt.Fprintf(b, "| settings | %d sandboxes, measured every %d |\n\n", cfg.scale, cfg.scaleStep)
	} else if title == "Cluster" {
		fmt.Fprintf(b, "| settings | %d nodes, %d sandboxes each listed, %d creates each way, attach %s, burst %s, replay %s, %d %s |\n\n",
			clusterNodes, cfg.clusterPerNode, clusterCreates/max(1, cfg.kilndScale), bytesText(cfg.clusterAttach), bytesText(cfg.clusterBurst),
			bytesText(cfg.clusterReplay), cfg.reps, plural(cfg.reps, "rep"))
	} else if title == "Memory fork" {
		fmt.Fprintf(b, "| settings | a process of %s, %d forks each way after %d warm-up |\n\n", bytesText(memforkBytes), memforkReps, memforkWarmUp)
	} else if title == "Pause" {
		fmt.Fprintf(b, "| settings | %d pauses and resumes per runtime, after %d warm-ups |\n\n", pauseReps, pauseWarmUp)
	} else if res.compare != nil && title == "Comparison" {
		fmt.Fprintf(b, "| settings | capture size %s, terminal size %s, %d %s, %d tombstones |\n\n",
			bytesText(cfg.captureSize), bytesText(cfg.ttySize), cfg.reps, plural(cfg.reps, "rep"), cfg.tombstones)
	} else {
		fmt.Fprintf(b, "| settings | size %s, capture size %s, %d %s, readers %s, %d tombstones, %d running |\n\n",
			bytesText(cfg.size), bytesText(cfg.captureSize), cfg.reps, plural(cfg.reps, "rep"), countsText(cfg.readers), cfg.tombstones, cfg.running)
	}
	b.WriteString("The machine is shared: absolute figures drift between runs, so every baseline runs in the same\n" +
		"process as the engine with the repetitions interleaved, and the ratios are what to compare.\n\n")
}

func writeThroughput(b *strings.Builder, t *throughputResult) {
	fmt.Fprintf(b, "## Throughput\n\n")
	fmt.Fprintf(b, "A child (this binary re-executed) writes %s to its stdout in 64 KiB writes from one buffer and\n"+
		"exits 0. Every run starts a fresh child. After one unmeasured warm-up run of each case at %s,\n"+
		"each of the %d %s runs the cases in this order: %s.\n"+
		"Throughput is size / workload time, in GB/s (1e9 bytes/s).\n\n",
		bytesText(t.size), bytesText(t.warm), t.reps, plural(t.reps, "rep"), caseNames(t.cases))
	raw, rawBig := t.cases[0], t.cases[1]
	fmt.Fprintf(b, "- **raw**: os/exec, the child's stdout on a pipe of the default size (%s, read back with\n"+
		"  F_GETPIPE_SZ), a plain loop reading 256 KiB at a time into nothing until EOF; time from Start\n"+
		"  until Wait returned.\n", bytesText(int64(raw.samples[0].pipeSize)))
	fmt.Fprintf(b, "- **raw, 1 MiB pipe**: the same with the read end raised by F_SETPIPE_SZ (read back: %s),\n"+
		"  as the engine does: the best plain loop.\n", bytesText(int64(rawBig.samples[0].pipeSize)))
	fmt.Fprintf(b, "- **engine**: process.Start, time until Done (exit observed, pumps drained). The engine raises\n"+
		"  its pipes to 1 MiB with F_SETPIPE_SZ where the system allows (pipe-max-size here: %s).\n", t.pipeMax)
	fmt.Fprintf(b, "- **engine, N readers**: N attachments opened right after Start, each following to EOF in its\n"+
		"  own goroutine. The workload time is still Start until Done; \"readers done\" is Start until the\n"+
		"  last reader's EOF. Every reader was checked to account for every stdout byte exactly once, as\n"+
		"  delivered or reported lost.\n\n")

	b.WriteString("| case | median GB/s | min–max GB/s | median workload | readers done (median) | delivered per reader, min–max |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|\n")
	for _, c := range t.cases {
		thr := c.gbps(t.size)
		readersDone, delivered := "", ""
		if c.readers > 0 {
			lo, hi := 1.0, 0.0
			var done []float64
			for _, s := range c.samples {
				lo, hi = min(lo, s.minFrac), max(hi, s.maxFrac)
				done = append(done, s.readersDone.Seconds())
			}
			readersDone = fmt.Sprintf("%.3f s", median(done))
			delivered = fmt.Sprintf("%.1f%% – %.1f%%", 100*lo, 100*hi)
		}
		fmt.Fprintf(b, "| %s | %.3f | %.3f – %.3f | %.3f s | %s | %s |\n",
			c.name, median(thr), slices.Min(thr), slices.Max(thr), median(c.seconds()), readersDone, delivered)
	}

	b.WriteString("\n### Ratios\n\n")
	b.WriteString("\"of medians\" divides the cases' medians; \"paired\" is the median over reps of the ratio within\n" +
		"each rep, whose runs shared the machine's conditions.\n\n")
	b.WriteString("| ratio | of medians | paired | target | result |\n|---|---:|---:|---|---|\n")
	eng := t.cases[2]
	for _, base := range []caseResult{raw, rawBig} {
		target := fmt.Sprintf("≥ %.2f", targetThroughputRatio)
		if base.pipe != 0 {
			target += " (stricter baseline, information)"
		}
		ofMedians := median(eng.gbps(t.size)) / median(base.gbps(t.size))
		fmt.Fprintf(b, "| throughput, %s / %s | %.3f | %.3f | %s | %s |\n", eng.name, base.name,
			ofMedians, pairedRatio(eng.gbps(t.size), base.gbps(t.size)), target, verdict(ofMedians >= targetThroughputRatio))
	}
	for _, c := range t.cases[3:] {
		ofMedians := median(c.seconds()) / median(eng.seconds())
		target, result := "information", ""
		if c.readers == targetReaderCount {
			target, result = fmt.Sprintf("≤ %.2f", targetReaderSlowdown), verdict(ofMedians <= targetReaderSlowdown)
		}
		fmt.Fprintf(b, "| workload time, %s / no reader | %.3f | %.3f | %s | %s |\n",
			strings.TrimPrefix(c.name, "engine, "), ofMedians, pairedRatio(c.seconds(), eng.seconds()), target, result)
	}
	if !slices.ContainsFunc(t.cases, func(c caseResult) bool { return c.readers == targetReaderCount }) {
		fmt.Fprintf(b, "\nThe %d-reader target was not measured: -readers did not include %d.\n", targetReaderCount, targetReaderCount)
	}

	b.WriteString("\n### Every run (GB/s)\n\n| rep |")
	for _, c := range t.cases {
		fmt.Fprintf(b, " %s |", c.name)
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(t.cases)) + "\n")
	for rep := range t.reps {
		fmt.Fprintf(b, "| %d |", rep+1)
		for _, c := range t.cases {
			fmt.Fprintf(b, " %.3f |", c.samples[rep].gbps(t.size))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

func writeMemory(b *strings.Builder, tomb *tombstoneResult, run *runningResult) {
	b.WriteString("## Memory\n\n")
	b.WriteString("Go heap of this process (HeapAlloc after two collections) before and after, divided by the\n" +
		"count; each baseline already includes one warm-up process of the same kind. The children's own\n" +
		"memory and the kernel's pipe buffers are not counted.\n\n")
	b.WriteString("| figure | value | target | result |\n|---|---:|---|---|\n")
	if tomb != nil {
		fmt.Fprintf(b, "| heap per tombstone (%d runs of `true`, grace 1 ms) | %.0f B | < %d B | %s |\n",
			tomb.n, tomb.perTombstone(), targetTombstoneBytes, verdict(tomb.perTombstone() < targetTombstoneBytes))
	}
	if run != nil {
		fmt.Fprintf(b, "| heap per idle running process (%d of `sleep 1000`, stdin pipe) | %.0f B | | |\n", run.m, run.per(run.heap))
		fmt.Fprintf(b, "| · its idle ring: the ring and a first 4 KiB block per stream (measured apart) | %d B | | |\n", run.ring)
		fmt.Fprintf(b, "| · beyond the ring: process, files, stdin queue, goroutines | %.0f B | | |\n", run.per(run.heap)-float64(run.ring))
		fmt.Fprintf(b, "| output retained by the ring per process (all it wrote) | %.0f B | | |\n", run.per(run.output))
		fmt.Fprintf(b, "| goroutine stacks per process (StackInuse): %.1f goroutines | %.0f B | | |\n",
			run.per(int64(run.goroutines)), run.per(run.stack))
		fmt.Fprintf(b, "| OS threads per process | %.2f | | |\n", run.per(int64(run.threads)))
	}
	b.WriteString("\n")
}

func (c caseResult) gbps(size int64) []float64 {
	out := make([]float64, len(c.samples))
	for i, s := range c.samples {
		out[i] = s.gbps(size)
	}
	return out
}

func (c caseResult) seconds() []float64 {
	out := make([]float64, len(c.samples))
	for i, s := range c.samples {
		out[i] = s.workload.Seconds()
	}
	return out
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// pairedRatio is the median of a[i]/b[i]: each pair ran in the same rep.
func pairedRatio(a, b []float64) float64 {
	r := make([]float64, len(a))
	for i := range a {
		r[i] = a[i] / b[i]
	}
	return median(r)
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

func caseNames(cs []caseResult) string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.name
	}
	return strings.Join(names, "; ")
}

func countsText(ns []int) string {
	if len(ns) == 0 {
		return "none"
	}
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

// bytesText prints a byte count in the largest binary unit that divides it,
// or with two decimals.
func bytesText(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d %s", int64(v), units[i])
	}
	return fmt.Sprintf("%.2f %s (%d B)", v, units[i], n)
}

// The capture targets.
const (
	targetCaptureChunks   = 0.8  // engine + capture over child > file, 16 KiB chunks, at least
	targetCaptureLines    = 1.5  // engine + capture over the faster of supervisord and s6-log, 100-byte lines, at least
	targetStalledSlowdown = 1.10 // workload with a full disk over no capture, at most
)

// writeCapture writes the capture section of the report. Long because it
// is the section's table, row after row, as the report shows it.
func writeCapture(b *strings.Builder, c *captureResult) {
	b.WriteString("## Capture to disk\n\n")
	fmt.Fprintf(b, "The child writes %s per run in two shapes: %s (each write a 16 KiB line ending in a newline) and\n"+
		"%s (163 lines of 100 bytes per write). Logs go to %s (%s). After one unmeasured warm-up run of\n"+
		"each case at %s, each of the %d %s runs every case of both shapes in turn.\n\n",
		bytesText(c.size), captureShapes[0].name, captureShapes[1].name, c.dir, c.fsType, bytesText(min(c.size, warmMax)), c.reps, plural(c.reps, "rep"))
	b.WriteString("- **child > file**: the child's stdout is a regular file; time from Start until Wait returned. The\n" +
		"  physical limit of capture to this disk. It keeps the whole output in one file, where capture\n" +
		"  keeps 50 MiB and deletes the rest: the kernel's dirty-page throttling can slow it and not\n" +
		"  capture, so a ratio above 1 reads as \"at the speed of the disk\", not faster than it.\n" +
		"- **engine + capture**: process.Start with a capture writer (CRI records, begin synced before the\n" +
		"  start, rotation at 10 MiB × 5); time from Begin until Done, which includes the end record written\n" +
		"  and synced. \"run\" is the run's state read back from the log; \"dropped\" is the end record's count.\n" +
		"- **supervisord**: the child as a supervisord program, stdout to one log file; time from the\n" +
		"  child's own start stamp until the file holds every byte (polled every 2 ms). It is spared\n" +
		"  rotation, which that way of knowing it is done needs.\n" +
		"- **s6-log**: `child | s6-log n5 s10485760 DIR`; time from the child's start stamp until s6-log has\n" +
		"  exited at end of input.\n" +
		"- **engine, no capture** and **engine + capture, full disk**: the workload's time, Start until the\n" +
		"  exit was observed, without capture and with the log on a tmpfs with no room beyond the writer's\n" +
		"  reserve, so every write of output fails and is counted as dropped.\n\n")
	for _, s := range c.skipped {
		fmt.Fprintf(b, "Not run: %s.\n\n", s)
	}
	for _, r := range c.shapes {
		fmt.Fprintf(b, "### %s (%s)\n\n", r.name, bytesText(r.bytes))
		b.WriteString("| case | persisted GB/s (median) | min–max | median time | exit observed (median) | in the log | run, dropped |\n|---|---:|---:|---:|---:|---:|---|\n")
		for _, cc := range r.cases {
			thr := cc.persistedGBps()
			observed, runs, kept := "", "", ""
			if cc.samples[0].state != "" {
				var w []float64
				var notes []string
				for _, s := range cc.samples {
					w = append(w, s.workload.Seconds())
					note := s.state
					if s.state != "none" {
						note += ", " + bytesText(s.dropped)
					}
					notes = append(notes, note)
				}
				observed = fmt.Sprintf("%.3f s", median(w))
				runs = strings.Join(slices.Compact(notes), "; ")
			}
			if cc.samples[0].state != "none" {
				lo := slices.MinFunc(cc.samples, func(a, b captureSample) int { return int(a.persisted - b.persisted) }).persisted
				kept = fmt.Sprintf("%.1f%%", 100*float64(lo)/float64(r.bytes))
				if cc.samples[0].state != "" {
					kept = "≥ " + kept
				}
			}
			fmt.Fprintf(b, "| %s | %.3f | %.3f – %.3f | %.3f s | %s | %s | %s |\n", cc.name, median(thr), slices.Min(thr), slices.Max(thr),
				median(cc.seconds()), observed, kept, runs)
		}
		b.WriteString("\n")
	}
	b.WriteString("### Ratios\n\n\"persisted GB/s\" is the child's bytes that reached the log per second of the case's time: for the\n" +
		"cases that slow the child down to their own pace (a file, supervisord, s6-log) that is all of them; the engine\n" +
		"never slows the child, so what its writer cannot keep up with is dropped and counted, and its figure\n" +
		"is what the writer persisted while the child ran at full speed on the same two cores.\n\n")
	b.WriteString("| ratio | of medians | paired | target | result |\n|---|---:|---:|---|---|\n")
	chunks, lines := c.shapes[0], c.shapes[1]
	ratio := func(a, b *captureCase) (float64, float64) {
		return median(a.persistedGBps()) / median(b.persistedGBps()), pairedRatio(a.persistedGBps(), b.persistedGBps())
	}
	eng, file := chunks.get(caseEngine), chunks.get(caseFile)
	r, p := ratio(eng, file)
	fmt.Fprintf(b, "| %s: engine + capture / child > file | %.3f | %.3f | ≥ %.2f | %s |\n", chunks.name, r, p, targetCaptureChunks, verdict(r >= targetCaptureChunks))
	r, p = ratio(lines.get(caseEngine), lines.get(caseFile))
	fmt.Fprintf(b, "| %s: engine + capture / child > file | %.3f | %.3f | information | |\n", lines.name, r, p)
	var best *captureCase
	for _, n := range []string{caseSupervisor, caseS6} {
		if cc := lines.get(n); cc != nil && (best == nil || median(cc.persistedGBps()) > median(best.persistedGBps())) {
			best = cc
		}
	}
	if best != nil {
		r, p := ratio(lines.get(caseEngine), best)
		fmt.Fprintf(b, "| %s: engine + capture / %s (the faster) | %.3f | %.3f | ≥ %.2f | %s |\n", lines.name, best.name,
			r, p, targetCaptureLines, verdict(r >= targetCaptureLines))
	} else {
		fmt.Fprintf(b, "| %s: engine + capture / supervisord, s6-log | | | ≥ %.2f | not measured: neither is installed |\n", lines.name, targetCaptureLines)
	}
	if c.fullDisk {
		for _, r := range c.shapes {
			full, none := r.get(caseFullDisk), r.get(caseNoCapture)
			fw, nw := full.workloads(), none.workloads()
			ratio := median(fw) / median(nw)
			fmt.Fprintf(b, "| %s: workload time, full disk / no capture | %.3f | %.3f | ≤ %.2f | %s |\n", r.name,
				ratio, pairedRatio(fw, nw), targetStalledSlowdown, verdict(ratio <= targetStalledSlowdown))
		}
	}
	b.WriteString("\n")
}

// persistedGBps is, per sample, the child's bytes in the log per second;
// without capture, the bytes the child wrote.
func (c *captureCase) persistedGBps() []float64 {
	out := make([]float64, len(c.samples))
	for i, s := range c.samples {
		n := s.persisted
		if s.state == "none" {
			n = s.written
		}
		out[i] = float64(n) / s.elapsed.Seconds() / 1e9
	}
	return out
}

func (c *captureCase) seconds() []float64 {
	out := make([]float64, len(c.samples))
	for i, s := range c.samples {
		out[i] = s.elapsed.Seconds()
	}
	return out
}

func (c *captureCase) workloads() []float64 {
	out := make([]float64, len(c.samples))
	for i, s := range c.samples {
		out[i] = s.workload.Seconds()
	}
	return out
}
