package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// The snapshot section's workspace and targets: a snapshot of a 1 GiB
// workspace (one 512 MiB file and 20,000 small ones) within 250 ms and a
// tenth of cp -a's time of the same tree on XFS, and a fork of ten
// sandboxes within a second.
const (
	snapshotBigMiB      = 512
	snapshotSmallFiles  = 20000
	snapshotSmallBytes  = 512 << 20 / snapshotSmallFiles
	snapshotRuns        = 5
	forkRuns            = 3
	forkCount           = 10
	targetSnapshot      = 250 * time.Millisecond
	targetSnapshotRatio = 0.1
	targetFork          = time.Second
)

// snapshotFS is the section's figures on one file system.
type snapshotFS struct {
	fs, copyWay      string
	snapshots, forks []time.Duration
	cpA, cpReflink   []time.Duration // the same tree, copied by cp
	reflinkSkipped   string
}

type snapshotResult struct {
	filesystems []snapshotFS
	skipped     string
}

// measureSnapshots makes, on an XFS and an ext4 file system of its own
// (loop devices), a kilnd whose state directory is there and a sandbox
// whose workspace holds the tree, and times its snapshots and forks; and,
// beside them on the same file system, cp -a and cp --reflink=always of
// the same tree.
func measureSnapshots(ctx context.Context, cfg config) (*snapshotResult, error) {
	res := &snapshotResult{}
	if os.Geteuid() != 0 {
		res.skipped = "snapshots need root (sandboxes, loop devices)"
		return res, nil
	}
	base, err := os.MkdirTemp(cfg.captureDir, "sandkiln-bench-snapshot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	for _, fs := range []string{"xfs", "ext4"} {
		if _, err := exec.LookPath("mkfs." + fs); err != nil {
			res.skipped += fmt.Sprintf("%s: no mkfs.%s; ", fs, fs)
			continue
		}
		r, err := snapshotsOn(ctx, cfg, filepath.Join(base, fs), fs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fs, err)
		}
		res.filesystems = append(res.filesystems, r)
	}
	return res, nil
}

// snapshotsOn is measureSnapshots on a file system of kind fs, made in dir.
func snapshotsOn(ctx context.Context, cfg config, dir, fs string) (r snapshotFS, err error) {
	r.fs = fs
	mnt, undo, err := loopFS(dir, fs)
	if err != nil {
		return r, err
	}
	defer undo()
	limits := daemon.DefaultLimits
	limits.DiskBytes = 4 << 30
	k, c, err := startKilndConfig(daemon.Config{StateDir: filepath.Join(mnt, "state"), DefaultLimits: &limits})
	if err != nil {
		return r, err
	}
	defer k.Stop()
	var sb daemon.Info
	if err := c.call(ctx, "POST", "/sandboxes", map[string]any{}, &sb); err != nil {
		return r, err
	}
	// Gone before kilnd stops: a sandbox outlives its kilnd, and would
	// hold its disk, and so the file system, after the section.
	defer c.call(context.WithoutCancel(ctx), "DELETE", "/sandboxes/"+sb.ID+"?remove_logs=true", nil, nil)
	fmt.Fprintf(cfg.progress, "snapshot: %s: writing the workspace (%d MiB, %d files)\n", fs, 2*snapshotBigMiB, snapshotSmallFiles+1)
	if err := shIn(ctx, c, sb.ID, treeCommand("/workspace")); err != nil {
		return r, err
	}
	for range snapshotRuns + 1 { // the first a warm-up
		start := time.Now()
		var snap api.Snapshot
		if err := c.call(ctx, "POST", "/sandboxes/"+sb.ID+"/snapshots", map[string]any{}, &snap); err != nil {
			return r, err
		}
		r.snapshots = append(r.snapshots, time.Since(start))
		r.copyWay = snap.Copy
		if err := c.call(ctx, "DELETE", "/snapshots/"+snap.ID, nil, nil); err != nil {
			return r, err
		}
	}
	r.snapshots = r.snapshots[1:]
	// Forks on XFS alone, whose target they have: on ext4 each copies the
	// whole workspace, ten at a time.
	runs := 0
	if fs == "xfs" {
		runs = forkRuns
	}
	for range runs {
		start := time.Now()
		var forked api.Forked
		if err := c.call(ctx, "POST", "/sandboxes/"+sb.ID+"/fork", api.ForkRequest{Count: forkCount}, &forked); err != nil {
			return r, err
		}
		r.forks = append(r.forks, time.Since(start))
		for _, f := range forked.Sandboxes {
			if err := c.call(ctx, "DELETE", "/sandboxes/"+f.ID+"?remove_logs=true", nil, nil); err != nil {
				return r, err
			}
		}
	}
	// The same tree, on the same file system, copied by cp.
	tree := filepath.Join(mnt, "tree")
	if out, err := exec.CommandContext(ctx, "sh", "-c", treeCommand(tree)).CombinedOutput(); err != nil {
		return r, fmt.Errorf("make the tree: %v: %s", err, out)
	}
	unix.Sync()
	for i := range snapshotRuns {
		dst := filepath.Join(mnt, fmt.Sprintf("cp-%d", i))
		d, err := timeCommand(ctx, "cp", "-a", tree, dst)
		if err != nil {
			return r, err
		}
		r.cpA = append(r.cpA, d)
		os.RemoveAll(dst)
		d, err = timeCommand(ctx, "cp", "-a", "--reflink=always", tree, dst)
		if err != nil {
			r.reflinkSkipped = fmt.Sprintf("cp --reflink=always: %v", err)
			continue
		}
		r.cpReflink = append(r.cpReflink, d)
		os.RemoveAll(dst)
	}
	return r, nil
}

// treeCommand makes the section's workspace under dir: one 512 MiB file
// and 20,000 small ones, of random bytes.
func treeCommand(dir string) string {
	return fmt.Sprintf(`set -e
mkdir -p %[1]s/small
head -c %[2]dM /dev/urandom > %[1]s/big
python3 - <<'EOF'
import os
for i in range(%[3]d):
    d = "%[1]s/small/%%03d" %% (i // 200)
    os.makedirs(d, exist_ok=True)
    with open("%%s/%%05d" %% (d, i), "wb") as f:
        f.write(os.urandom(%[4]d))
EOF`, dir, snapshotBigMiB, snapshotSmallFiles, snapshotSmallBytes)
}

// shIn runs script in sandbox id to its end; it must exit 0.
func shIn(ctx context.Context, c client, id, script string) error {
	var r api.ExecResult
	if err := c.call(ctx, "POST", "/sandboxes/"+id+"/exec", api.ExecRequest{Command: "sh", Args: []string{"-c", script}, TimeoutMS: 600000}, &r); err != nil {
		return err
	}
	if r.ExitCode == nil || *r.ExitCode != 0 {
		return fmt.Errorf("%q: %+v", script, r)
	}
	return nil
}

// timeCommand runs a command to its end, and says how long it took.
func timeCommand(ctx context.Context, name string, args ...string) (time.Duration, error) {
	start := time.Now()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s: %v: %s", strings.Join(append([]string{name}, args...), " "), err, strings.TrimSpace(string(out)))
	}
	return time.Since(start), nil
}

// loopFS makes a file system of kind fs in a sparse image in dir, mounts
// it through a loop device, and returns where; undo unmounts it.
func loopFS(dir, fs string) (string, func(), error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	img := filepath.Join(dir, fs+".img")
	f, err := os.Create(img)
	if err != nil {
		return "", nil, err
	}
	err = f.Truncate(64 << 30)
	f.Close()
	if err != nil {
		return "", nil, err
	}
	args := []string{"-q", img}
	if fs == "ext4" {
		args = []string{"-q", "-F", img}
	}
	if out, err := exec.Command("mkfs."+fs, args...).CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("mkfs.%s: %v: %s", fs, err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return "", nil, err
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("mount: %v: %s", err, out)
	}
	return mnt, func() { unix.Unmount(mnt, unix.MNT_DETACH) }, nil
}

func renderSnapshot(cfg config, res results) string {
	var b strings.Builder
	writeHeader(&b, cfg, res, "Snapshots")
	writeSnapshots(&b, res.snapshot)
	return b.String()
}

func writeSnapshots(b *strings.Builder, s *snapshotResult) {
	b.WriteString("## Snapshots and forks\n\n")
	if s.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s.\n\n", strings.TrimSuffix(s.skipped, "; "))
	}
	if len(s.filesystems) == 0 {
		return
	}
	fmt.Fprintf(b, "A kilnd in this process, its state directory on a file system of its own (a 64 GiB sparse image on a loop\n"+
		"device), has a sandbox whose workspace holds one %d MiB file and %d files of %d bytes (random bytes, %d MiB\n"+
		"in all); its snapshot is timed %d times (POST …/snapshots answered; each removed after), then a fork of %d\n"+
		"sandboxes %d times on XFS (POST …/fork answered: a snapshot, %d sandboxes made from it, the snapshot removed). Beside them,\n"+
		"on the same file system, the same tree made on the host and copied by `cp -a` and `cp -a --reflink=always`.\n\n",
		snapshotBigMiB, snapshotSmallFiles, snapshotSmallBytes, 2*snapshotBigMiB, snapshotRuns, forkCount, forkRuns, forkCount)
	b.WriteString("| file system | snapshot copy | snapshot p50 | snapshot max | cp -a p50 | cp --reflink=always p50 | snapshot over cp -a | fork ×10 p50 | fork ×10 max |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, f := range s.filesystems {
		reflink := "—"
		if len(f.cpReflink) > 0 {
			reflink = ms(pct(f.cpReflink, 50))
		}
		forkP50, forkMax := "—", "—"
		if len(f.forks) > 0 {
			forkP50, forkMax = ms(pct(f.forks, 50)), ms(pct(f.forks, 100))
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %.3f | %s | %s |\n", f.fs, f.copyWay, ms(pct(f.snapshots, 50)), ms(pct(f.snapshots, 100)),
			ms(pct(f.cpA, 50)), reflink, float64(pct(f.snapshots, 50))/float64(pct(f.cpA, 50)), forkP50, forkMax)
	}
	b.WriteString("\n| target (XFS) | figure | result |\n|---|---:|---|\n")
	for _, f := range s.filesystems {
		if f.fs != "xfs" {
			continue
		}
		p50 := pct(f.snapshots, 50)
		ratio := float64(p50) / float64(pct(f.cpA, 50))
		fmt.Fprintf(b, "| snapshot p50 ≤ %s | %s | %s |\n", ms(targetSnapshot), ms(p50), verdict(p50 <= targetSnapshot))
		fmt.Fprintf(b, "| snapshot p50 ≤ %.1f of cp -a's | %.3f | %s |\n", targetSnapshotRatio, ratio, verdict(ratio <= targetSnapshotRatio))
		fmt.Fprintf(b, "| fork ×%d p50 ≤ %s | %s | %s |\n", forkCount, ms(targetFork), ms(pct(f.forks, 50)), verdict(pct(f.forks, 50) <= targetFork))
		if f.reflinkSkipped != "" {
			fmt.Fprintf(b, "\n%s\n", f.reflinkSkipped)
		}
	}
	b.WriteString("\n")
}
