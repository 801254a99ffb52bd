package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// The capture benchmark's shapes: 16 KiB writes each ending in a newline,
// and 100-byte lines written 163 to a call.
var captureShapes = []shape{
	{name: "16 KiB chunks", write: 16 << 10, line: 16 << 10},
	{name: "100-byte lines", write: 16 << 10, line: 100},
}

// Capture cases.
const (
	caseFile       = "child > file"
	caseEngine     = "engine + capture"
	caseSupervisor = "supervisord"
	caseS6         = "s6-log"
	caseNoCapture  = "engine, no capture"
	caseFullDisk   = "engine + capture, full disk"
)

// Rotation used by every case that rotates: the writer's defaults.
const (
	rotateSize   = capture.DefaultMaxSize
	rotateFiles  = capture.DefaultMaxFiles
	fullDiskFS   = 1 << 20                         // the full disk's tmpfs
	fullDiskRoom = capture.DefaultReserve + 16<<10 // what it leaves free
)

type captureSample struct {
	elapsed   time.Duration // the case's time (see the report)
	workload  time.Duration // engine cases: Start until the exit was observed
	dropped   int64         // engine cases: bytes the log lacks, per the end record
	state     string        // engine cases: the run as read back; "none" without capture
	persisted int64         // bytes of the child's output in the log
	written   int64         // bytes the child wrote
}

type captureCase struct {
	name    string
	samples []captureSample
}

type captureShapeResult struct {
	shape
	bytes int64
	cases []*captureCase
}

type captureResult struct {
	size     int64
	reps     int
	dir      string // where logs were written
	fsType   string
	skipped  []string // cases not run, with why
	shapes   []*captureShapeResult
	fullDisk bool
}

func (r *captureShapeResult) get(name string) *captureCase {
	for _, c := range r.cases {
		if c.name == name {
			return c
		}
	}
	return nil
}

// measureCapture runs every capture case once at a small size, unmeasured,
// then reps times interleaved.
func measureCapture(ctx context.Context, cfg config, exe string) (*captureResult, error) {
	base, err := os.MkdirTemp(cfg.captureDir, "sandkiln-bench-capture-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	res := &captureResult{size: cfg.captureSize, reps: cfg.reps, dir: cfg.captureDir, fsType: fsType(base)}
	names := []string{caseFile, caseEngine}
	for _, tool := range []string{"supervisord", "s6-log"} {
		if _, err := exec.LookPath(tool); err != nil {
			res.skipped = append(res.skipped, fmt.Sprintf("%s: not installed (%v)", tool, err))
			continue
		}
		names = append(names, map[string]string{"supervisord": caseSupervisor, "s6-log": caseS6}[tool])
	}
	names = append(names, caseNoCapture)
	full := filepath.Join(base, "full")
	if err := mountFull(full); err != nil {
		res.skipped = append(res.skipped, fmt.Sprintf("%s: %v", caseFullDisk, err))
	} else {
		defer unix.Unmount(full, unix.MNT_DETACH)
		res.fullDisk = true
		names = append(names, caseFullDisk)
	}
	for _, sh := range captureShapes {
		r := &captureShapeResult{shape: sh, bytes: sh.bytes(cfg.captureSize)}
		for _, n := range names {
			r.cases = append(r.cases, &captureCase{name: n})
		}
		res.shapes = append(res.shapes, r)
	}
	runs := 0
	run := func(r *captureShapeResult, c *captureCase, size int64) (captureSample, error) {
		runs++
		work := filepath.Join(base, strconv.Itoa(runs))
		if c.name == caseFullDisk {
			work = filepath.Join(full, strconv.Itoa(runs))
		}
		if err := os.Mkdir(work, 0o700); err != nil {
			return captureSample{}, err
		}
		defer os.RemoveAll(work)
		s, err := runCapture(ctx, exe, c.name, r.shape, size, work)
		s.written = r.shape.bytes(size)
		return s, err
	}
	for _, r := range res.shapes {
		for _, c := range r.cases {
			if _, err := run(r, c, min(cfg.captureSize, warmMax)); err != nil {
				return nil, fmt.Errorf("warm-up of %q, %s: %w", c.name, r.name, err)
			}
		}
	}
	for rep := range cfg.reps {
		for _, r := range res.shapes {
			for _, c := range r.cases {
				s, err := run(r, c, cfg.captureSize)
				if err != nil {
					return nil, fmt.Errorf("rep %d of %q, %s: %w", rep+1, c.name, r.name, err)
				}
				c.samples = append(c.samples, s)
				fmt.Fprintf(cfg.progress, "rep %d/%d  %-14s %-28s %7.3f s  %6.3f GB/s persisted%s\n", rep+1, cfg.reps, r.name, c.name,
					s.elapsed.Seconds(), float64(s.persisted)/s.elapsed.Seconds()/1e9, captureNote(s))
			}
		}
	}
	return res, nil
}

func captureNote(s captureSample) string {
	if s.state == "" {
		return ""
	}
	return fmt.Sprintf("  exit observed %.3f s, run %s, dropped %d B", s.workload.Seconds(), s.state, s.dropped)
}

// mountFull mounts a small tmpfs and fills it, for the stalled writer.
func mountFull(path string) error {
	if err := os.Mkdir(path, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", path, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.Itoa(fullDiskFS)); err != nil {
		return fmt.Errorf("cannot mount a small tmpfs (needs root): %w", err)
	}
	// Leave room for what Begin needs (the reserve and two records) and
	// little more: the first writes of output fail.
	if err := os.WriteFile(filepath.Join(path, "filler"), make([]byte, fullDiskFS-fullDiskRoom), 0o600); err != nil {
		unix.Unmount(path, unix.MNT_DETACH)
		return fmt.Errorf("fill the tmpfs: %w", err)
	}
	return nil
}

func fsType(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "unknown"
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return fmt.Sprintf("0x%x", st.Type)
}

func runCapture(ctx context.Context, exe, name string, sh shape, size int64, work string) (captureSample, error) {
	switch name {
	case caseFile:
		return runToFile(ctx, exe, sh, size, work)
	case caseEngine, caseFullDisk:
		return runEngineCapture(ctx, exe, sh, size, work, true)
	case caseNoCapture:
		return runEngineCapture(ctx, exe, sh, size, work, false)
	case caseSupervisor:
		return runSupervisord(ctx, exe, sh, size, work)
	case caseS6:
		return runS6(ctx, exe, sh, size, work)
	}
	return captureSample{}, fmt.Errorf("unknown case %q", name)
}

// runToFile is the physical limit: the child's stdout is the file.
func runToFile(ctx context.Context, exe string, sh shape, size int64, work string) (captureSample, error) {
	f, err := os.Create(filepath.Join(work, "out"))
	if err != nil {
		return captureSample{}, err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = sh.environ(size, "")
	cmd.Stdout, cmd.Stderr = f, os.Stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return captureSample{}, fmt.Errorf("child: %w", err)
	}
	s := captureSample{elapsed: time.Since(start)}
	st, err := f.Stat()
	if err != nil {
		return s, err
	}
	if s.persisted = st.Size(); s.persisted != sh.bytes(size) {
		return s, fmt.Errorf("file holds %d bytes, child wrote %d", s.persisted, sh.bytes(size))
	}
	return s, nil
}

// runEngineCapture runs the child through the engine, with a capture writer
// (default rotation) or without; the time is Start until Done, which with
// capture includes the writer's end record.
func runEngineCapture(ctx context.Context, exe string, sh shape, size int64, work string, withCapture bool) (captureSample, error) {
	spec := process.Spec{Argv: []string{exe}, Env: sh.environ(size, "")}
	var dir *capture.Dir
	if withCapture {
		var err error
		if dir, err = capture.OpenDir(work); err != nil {
			return captureSample{}, err
		}
		defer dir.Close()
	}
	start := time.Now()
	if withCapture {
		w, err := capture.Begin(dir, uuid.Must(uuid.NewV7()).String(), capture.Options{})
		if err != nil {
			return captureSample{}, err
		}
		spec.Capture = w
	}
	p, err := process.Start("bench", spec)
	if err != nil {
		return captureSample{}, err
	}
	exit, err := p.Wait(ctx)
	if err != nil {
		return captureSample{}, err
	}
	workload := time.Since(start)
	select {
	case <-p.Done():
	case <-ctx.Done():
		return captureSample{}, ctx.Err()
	}
	s := captureSample{elapsed: time.Since(start), workload: workload, state: "none"}
	if exit != (process.Exit{}) {
		return s, fmt.Errorf("child ended with %v", exit)
	}
	st := p.Status()
	if st.Totals[ring.Stdout] != sh.bytes(size) {
		return s, fmt.Errorf("engine counted %d stdout bytes, child wrote %d", st.Totals[ring.Stdout], sh.bytes(size))
	}
	if !withCapture {
		return s, nil
	}
	if st.Capture == nil || !st.Capture.Ended {
		return s, fmt.Errorf("capture did not end: %+v", st.Capture)
	}
	s.dropped = st.Capture.Dropped[capture.LogStdout] + st.Capture.Dropped[capture.LogStderr]
	s.persisted = sh.bytes(size) - s.dropped
	l, err := capture.ReadLog(ctx, dir, capture.Filter{Tail: 0})
	if err != nil {
		return s, err
	}
	if len(l.Runs) != 1 {
		return s, fmt.Errorf("%d runs in the log, want 1", len(l.Runs))
	}
	s.state = l.Runs[0].State.String()
	return s, nil
}

// childStart reads the time the child stamped at its start.
func childStart(path string) (time.Time, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err
	}
	ns, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("child's start stamp %q: %w", b, err)
	}
	return time.Unix(0, ns), nil
}

// runS6 is `child | s6-log n5 s10485760 dir`: the time is the child's
// start until s6-log, at end of input, has written everything and exited.
func runS6(ctx context.Context, exe string, sh shape, size int64, work string) (captureSample, error) {
	logdir := filepath.Join(work, "log")
	r, w, err := os.Pipe()
	if err != nil {
		return captureSample{}, err
	}
	logger := exec.CommandContext(ctx, "s6-log", "n"+strconv.Itoa(rotateFiles), "s"+strconv.Itoa(rotateSize), logdir)
	logger.Stdin, logger.Stderr = r, os.Stderr
	child := exec.CommandContext(ctx, exe)
	stamp := filepath.Join(work, "stamp")
	child.Env = sh.environ(size, stamp)
	child.Stdout, child.Stderr = w, os.Stderr
	if err := logger.Start(); err != nil {
		r.Close()
		w.Close()
		return captureSample{}, fmt.Errorf("s6-log: %w", err)
	}
	r.Close()
	err = child.Run()
	w.Close()
	if lerr := logger.Wait(); err == nil && lerr != nil {
		err = fmt.Errorf("s6-log: %w", lerr)
	}
	end := time.Now()
	if err != nil {
		return captureSample{}, err
	}
	started, err := childStart(stamp)
	if err != nil {
		return captureSample{}, err
	}
	return captureSample{elapsed: end.Sub(started), persisted: sh.bytes(size)}, nil
}

// runSupervisord runs the child as a supervisord program with its stdout
// logged to a file. supervisord does not exit with its program, so the run
// ends when the log holds every byte; that needs one unrotated file, which
// spares supervisord the rotation the others do. The time is the child's
// start until then.
func runSupervisord(ctx context.Context, exe string, sh shape, size int64, work string) (captureSample, error) {
	stamp := filepath.Join(work, "stamp")
	out := filepath.Join(work, "out.log")
	var env []string
	for _, kv := range sh.environ(size, stamp) {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "SANDKILN_BENCH") && k != "GORACE" {
			continue
		}
		env = append(env, fmt.Sprintf("%s=%q", k, v))
	}
	conf := fmt.Sprintf(`[supervisord]
nodaemon=true
logfile=%[1]s/supervisord.log
pidfile=%[1]s/supervisord.pid
childlogdir=%[1]s

[program:bench]
command=%[2]s
environment=%[3]s
autostart=true
autorestart=false
startsecs=0
stdout_logfile=%[4]s
stdout_logfile_maxbytes=0
stderr_logfile=%[1]s/err.log
`, work, exe, strings.Join(env, ","), out)
	confPath := filepath.Join(work, "supervisord.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return captureSample{}, err
	}
	// supervisord's own messages go to its log file, read back on failure.
	cmd := exec.Command("supervisord", "-c", confPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return captureSample{}, fmt.Errorf("supervisord: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}()
	want := sh.bytes(size)
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return captureSample{}, ctx.Err()
		case err := <-exited:
			exited <- err // for the deferred wait
			msgs, _ := os.ReadFile(filepath.Join(work, "supervisord.log"))
			return captureSample{}, fmt.Errorf("supervisord exited before logging every byte: %v\n%s", err, msgs)
		case <-t.C:
		}
		fi, err := os.Stat(out)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return captureSample{}, err
		}
		if err == nil && fi.Size() >= want {
			end := time.Now()
			if fi.Size() != want {
				return captureSample{}, fmt.Errorf("supervisord logged %d bytes, child wrote %d", fi.Size(), want)
			}
			started, err := childStart(stamp)
			if err != nil {
				return captureSample{}, err
			}
			return captureSample{elapsed: end.Sub(started), persisted: fi.Size()}, nil
		}
	}
}
