package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// The memfork section: a memory fork of a gVisor sandbox whose process
// holds 256 MiB, through kilnd's API as a user asks for it, beside
// runsc's own checkpoint and restore of a plain bundle running the same
// process, by hand, the two interleaved rep by rep.

const (
	memforkBytes  = 256 << 20
	memforkLimit  = 512 << 20 // the sandbox's memory limit: the process and python
	memforkReps   = 5
	memforkWarmUp = 1
	// targetMemfork bounds the fork at p50: from the request until the
	// fork's copy of the process is listed running.
	targetMemfork = 3 * time.Second
)

// memforkScript holds argv[1] bytes, touched, says so, and waits: its
// pages are the checkpoint's to save.
const memforkScript = `
import sys, time
held = bytearray(int(sys.argv[1]))
for i in range(0, len(held), 4096):
    held[i] = 1
print("ready", flush=True)
while True:
    time.sleep(3600)
`

type memforkResult struct {
	// kilnd's forks, each from the request to the fork's process listed
	// running, and its parts, at the events' times: until the parent's
	// sandbox.snapshotted (its memory saved, its disk copied), then until
	// the fork's sandbox.created (its disk copied, restored, its agent
	// answering), and the rest (its processes' runs continued, the
	// snapshot removed, the process looked up).
	fork, snapshot, made, rest []time.Duration
	// runsc's by hand: checkpoint, restore, the two together.
	checkpoint, restore, hand []time.Duration
	imageBytes                int64 // the by-hand checkpoint's image, as allocated
	skipped                   string
}

func measureMemfork(ctx context.Context, cfg config) (*memforkResult, error) {
	res := &memforkResult{}
	if os.Geteuid() != 0 {
		res.skipped = "sandboxes need root"
		return res, nil
	}
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		res.skipped = "no runsc: " + err.Error()
		return res, nil
	}
	base, err := os.MkdirTemp(cfg.captureDir, "sandkiln-bench-memfork-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	k, c, err := startKilnd(filepath.Join(base, "kilnd"))
	if err != nil {
		return nil, err
	}
	defer k.Close()
	defer c.http.CloseIdleConnections()
	var parent daemon.Info
	if err := c.call(ctx, "POST", "/sandboxes", map[string]any{"runtime": sandbox.RuntimeGVisor, "limits": map[string]any{"memory_bytes": memforkLimit}}, &parent); err != nil {
		res.skipped = fmt.Sprintf("%s: %v", sandbox.RuntimeGVisor, err)
		return res, nil
	}
	var st api.Started
	if err := c.call(ctx, "POST", "/sandboxes/"+parent.ID+"/exec-stream", api.ExecRequest{Command: "python3",
		Args: []string{"-c", memforkScript, fmt.Sprint(memforkBytes)}}, &st); err != nil {
		return nil, err
	}
	if err := awaitReadyLine(ctx, c, parent.ID, st.ID); err != nil {
		return nil, err
	}
	hand, stop, err := runscByHand(ctx, runsc, filepath.Join(base, "runsc"))
	if err != nil {
		return nil, fmt.Errorf("by hand: %w", err)
	}
	defer stop()
	for i := range memforkWarmUp + memforkReps {
		fork, snapshot, made, err := kilndMemfork(ctx, c, parent.ID, st.ID)
		if err != nil {
			return nil, err
		}
		image := filepath.Join(base, fmt.Sprint("image-", i))
		save, restore, err := hand(image, fmt.Sprint("fork-", i))
		if err != nil {
			return nil, fmt.Errorf("by hand: %w", err)
		}
		if i == 0 {
			res.imageBytes = allocated(image)
		}
		os.RemoveAll(image)
		fmt.Fprintf(cfg.progress, "memfork: rep %d of %d (warm-ups %d): kilnd %s, by hand %s\n", i+1, memforkWarmUp+memforkReps, memforkWarmUp, ms(fork), ms(save+restore))
		if i < memforkWarmUp {
			continue
		}
		res.fork, res.snapshot, res.made = append(res.fork, fork), append(res.snapshot, snapshot), append(res.made, made)
		res.rest = append(res.rest, fork-snapshot-made)
		res.checkpoint, res.restore, res.hand = append(res.checkpoint, save), append(res.restore, restore), append(res.hand, save+restore)
	}
	return res, nil
}

// awaitReadyLine waits for process pid of sandbox id to have written
// "ready" on its stdout: its memory is touched.
func awaitReadyLine(ctx context.Context, c client, id, pid string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var p api.Process
		if err := c.call(ctx, "GET", "/sandboxes/"+id+"/exec-stream/"+pid, nil, &p); err != nil {
			return err
		}
		if p.State != api.StateRunning {
			return fmt.Errorf("the process in sandbox %s: %+v, want it running", id, p)
		}
		if p.Streams["stdout"].TotalBytes >= int64(len("ready\n")) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the process in sandbox %s did not say ready within 2 minutes", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var out bytes.Buffer
	if err := c.stream(ctx, "GET", "/sandboxes/"+id+"/exec-stream/"+pid+"/logs?follow=false&stdout=0", nil, &out); err != nil {
		return err
	}
	if out.String() != "ready\n" {
		return fmt.Errorf("the process in sandbox %s wrote %q, want ready", id, out.String())
	}
	return nil
}

// kilndMemfork forks sandbox id through kilnd, the fork's memory its, and
// times it until process pid is listed running in the fork; snapshot is
// the part until the parent's snapshot was taken, made the part from
// there until the fork was made (their events' times). The fork is
// deleted, untimed.
func kilndMemfork(ctx context.Context, c client, id, pid string) (fork, snapshot, made time.Duration, err error) {
	start := time.Now()
	var forked api.Forked
	if err := c.call(ctx, "POST", "/sandboxes/"+id+"/fork", api.ForkRequest{}, &forked); err != nil {
		return 0, 0, 0, err
	}
	if len(forked.Sandboxes) != 1 {
		return 0, 0, 0, fmt.Errorf("fork: %+v, want one sandbox", forked)
	}
	f := forked.Sandboxes[0].ID
	defer func() {
		err = errors.Join(err, c.call(context.WithoutCancel(ctx), "DELETE", "/sandboxes/"+f+"?remove_logs=true", nil, nil))
	}()
	var p api.Process
	if err := c.call(ctx, "GET", "/sandboxes/"+f+"/exec-stream/"+pid, nil, &p); err != nil {
		return 0, 0, 0, err
	}
	fork = time.Since(start)
	if p.State != api.StateRunning || p.ForkedFrom != nil {
		return 0, 0, 0, fmt.Errorf("the fork's process: %+v, want it running on", p)
	}
	snapshotted, err := lastEvent(ctx, c, id, api.EventSnapshotted)
	if err != nil {
		return 0, 0, 0, err
	}
	created, err := lastEvent(ctx, c, f, api.EventCreated)
	if err != nil {
		return 0, 0, 0, err
	}
	if snapshotted.Before(start) || created.Before(snapshotted) {
		return 0, 0, 0, fmt.Errorf("events of the fork at %v: snapshotted %v, created %v", start, snapshotted, created)
	}
	return fork, snapshotted.Sub(start), created.Sub(snapshotted), nil
}

// lastEvent is the time of the last event of type typ of sandbox id.
func lastEvent(ctx context.Context, c client, id, typ string) (time.Time, error) {
	var events bytes.Buffer
	if err := c.stream(ctx, "GET", "/events?sandbox="+id+"&type="+typ+"&follow=false", nil, &events); err != nil {
		return time.Time{}, err
	}
	var last api.Event
	for sc := bufio.NewScanner(&events); sc.Scan(); {
		if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
			return time.Time{}, fmt.Errorf("events: %w", err)
		}
	}
	if last.Type != typ {
		return time.Time{}, fmt.Errorf("no %s event of sandbox %s", typ, id)
	}
	return last.Time, nil
}

// runscByHand starts, under runsc alone, a container of the host's system
// directories running the same process, and waits for it to say ready.
// hand then checkpoints it with the flags kilnd uses (`runsc checkpoint
// --leave-running --compression none`) into image and restores the image
// into a new container, id, of a bundle of its own (`runsc restore
// --background --detach`: runsc returns once it runs), timing each; the
// new container is deleted, untimed. stop deletes every container made.
func runscByHand(ctx context.Context, runsc, dir string) (hand func(image, id string) (save, restore time.Duration, err error), stop func(), err error) {
	root := filepath.Join(dir, "runsc")
	global := []string{"--root", root, "--network", "none", "--ignore-cgroups", "--overlay2", "root:memory"}
	bundle := func(name string) (string, error) {
		bdir := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Join(bdir, "rootfs"), 0o755); err != nil {
			return "", err
		}
		spec := map[string]any{
			"ociVersion": "1.0.0",
			"process": map[string]any{"args": []string{"python3", "-c", memforkScript, fmt.Sprint(memforkBytes)},
				"env": []string{"PATH=/usr/bin:/bin"}, "cwd": "/"},
			"root": map[string]any{"path": "/", "readonly": true},
			"mounts": []map[string]any{{"destination": "/proc", "type": "proc", "source": "proc"},
				{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}},
			"linux": map[string]any{"namespaces": []map[string]string{{"type": "pid"}, {"type": "mount"}, {"type": "network"}}},
		}
		j, _ := json.Marshal(spec)
		return bdir, os.WriteFile(filepath.Join(bdir, "config.json"), j, 0o600)
	}
	// Its output into a file: a container restored detached holds the
	// stdout and stderr runsc had, and a pipe would not end.
	run := func(args ...string) error {
		out, err := os.CreateTemp(dir, "runsc-out-")
		if err != nil {
			return err
		}
		defer os.Remove(out.Name())
		defer out.Close()
		cmd := exec.CommandContext(ctx, runsc, append(global, args...)...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			b, _ := os.ReadFile(out.Name())
			return fmt.Errorf("runsc %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(b))
		}
		return nil
	}
	pb, err := bundle("parent")
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(runsc, append(global, "run", "--bundle", pb, "parent")...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	ids := []string{"parent"} // the containers made, for stop to delete
	stop = func() {
		for _, id := range ids {
			exec.Command(runsc, "--root", root, "delete", "--force", id).Run()
		}
		cmd.Wait()
		// runsc's network namespace of --network none, if it left one.
		(&sandbox.GVisor{Root: root}).Release()
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		stop()
		return nil, nil, fmt.Errorf("the process under runsc: %q %v", line, err)
	}
	go io.Copy(io.Discard, out)
	hand = func(image, id string) (save, restore time.Duration, err error) {
		b, err := bundle(id)
		if err != nil {
			return 0, 0, err
		}
		defer os.RemoveAll(b)
		ids = append(ids, id)
		t0 := time.Now()
		if err := run("checkpoint", "--image-path", image, "--leave-running", "--compression", "none", "parent"); err != nil {
			return 0, 0, err
		}
		t1 := time.Now()
		if err := run("restore", "--image-path", image, "--background", "--detach", "--bundle", b, id); err != nil {
			return 0, 0, err
		}
		t2 := time.Now()
		return t1.Sub(t0), t2.Sub(t1), run("delete", "--force", id)
	}
	return hand, stop, nil
}

// allocated is the disk space the files under dir take.
func allocated(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	return n
}

func renderMemfork(cfg config, res results) string {
	var b strings.Builder
	writeHeader(&b, cfg, res, "Memory fork")
	writeMemfork(&b, res.memfork)
	return b.String()
}

func writeMemfork(b *strings.Builder, m *memforkResult) {
	b.WriteString("## Memory fork of a gVisor sandbox\n\n")
	if m.skipped != "" {
		fmt.Fprintf(b, "Not measured: %s.\n\n", m.skipped)
		return
	}
	fmt.Fprintf(b, "A kilnd in this process, called over its unix socket, has a gVisor sandbox (memory limit %s) in which\n"+
		"a Python process holds %s, every page touched, says `ready` and waits. Each rep forks it once,\n"+
		"`POST /sandboxes/{id}/fork` (`{}`: a running gVisor sandbox's fork has its memory), timed from the request\n"+
		"until the fork's copy of the process is listed running (`GET …/exec-stream/{pid}`); the fork is then\n"+
		"deleted, untimed. Split at the times of the parent's `sandbox.snapshotted` event and the fork's\n"+
		"`sandbox.created`: the snapshot (its memory saved, its disk copied), the sandbox made from it (its disk\n"+
		"copied, restored, its agent answering), and the rest (its processes' captured runs continued, the\n"+
		"snapshot removed, the process looked up). After each, by hand: runsc alone runs the same process in a\n"+
		"plain bundle of the host's system directories, `runsc checkpoint --leave-running --compression none`\n"+
		"saves it (an image of %s), and `runsc restore --background --detach` starts a new container from\n"+
		"the image (runsc returns once it runs). %d reps after %d warm-up.\n\n",
		bytesText(memforkLimit), bytesText(memforkBytes), bytesText(m.imageBytes), memforkReps, memforkWarmUp)
	b.WriteString("| case | p50 | max | saved, p50 | restored, p50 | the rest, p50 |\n|---|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(b, "| kilnd: fork, the process running in it | %s | %s | %s | %s | %s |\n",
		ms(pct(m.fork, 50)), ms(pct(m.fork, 100)), ms(pct(m.snapshot, 50)), ms(pct(m.made, 50)), ms(pct(m.rest, 50)))
	fmt.Fprintf(b, "| runsc by hand: checkpoint + restore | %s | %s | %s | %s | |\n\n",
		ms(pct(m.hand, 50)), ms(pct(m.hand, 100)), ms(pct(m.checkpoint, 50)), ms(pct(m.restore, 50)))
	got := pct(m.fork, 50)
	b.WriteString("| target | figure | result |\n|---|---:|---|\n")
	fmt.Fprintf(b, "| memory fork of a %s process, p50 ≤ %s | %s | %s |\n", bytesText(memforkBytes), ms(targetMemfork), ms(got), verdict(got <= targetMemfork))
	fmt.Fprintf(b, "| kilnd / by hand, of p50s | %.2f | |\n\n", float64(got)/float64(pct(m.hand, 50)))
}
