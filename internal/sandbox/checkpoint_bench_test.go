package sandbox_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// forkMemory is what the forked process holds, touched: the issue's
// 256 MiB.
const forkMemory = 256 << 20

// readyScript holds mem bytes, touched, says so, and waits for its stdin
// to end.
const readyScript = `
import sys
held = bytearray(int(sys.argv[1]))
for i in range(0, len(held), 4096):
    held[i] = 1
print("ready", flush=True)
sys.stdin.read()
`

// BenchmarkGVisorMemoryFork: a memory fork of a gVisor sandbox whose
// Python process holds forkMemory, from the checkpoint to the fork's agent
// answering with the process in its list (kilnd), beside runsc's own
// checkpoint and restore of a plain bundle running the same process, run
// by hand (runsc). It reports the two halves apart, checkpoint-ms and
// restore-ms, and their sum, fork-ms. The sandboxes have no disk: copying
// one is the file system snapshot's cost, not the memory's. The image is
// written where the test's temporary directories are.
func BenchmarkGVisorMemoryFork(b *testing.B) {
	b.Run("kilnd", benchForkKilnd)
	b.Run("runsc", benchForkRunsc)
}

func benchForkKilnd(b *testing.B) {
	g := benchGVisor(b)
	o := benchOptions(b)
	parent, err := g.Create(b.Context(), o)
	if err != nil {
		b.Fatal(err)
	}
	defer parent.Destroy(false)
	pb := box{Instance: parent, ID: o.ID, Dir: o.Dir, Runtime: sandbox.RuntimeGVisor}
	pid := startCounter(b, pb, forkMemory)
	count(b, pb, pid) // its memory touched
	var save, restore time.Duration
	b.ResetTimer()
	for i := range b.N {
		dir := filepath.Join(b.TempDir(), fmt.Sprint("checkpoint-", i))
		start := time.Now()
		if err := parent.(sandbox.Checkpointer).Checkpoint(b.Context(), dir, nil); err != nil {
			b.Fatal(err)
		}
		saved := time.Now()
		fo := benchOptions(b)
		fo.RestoreFrom = dir
		fork, err := g.Create(b.Context(), fo)
		if err != nil {
			b.Fatal(err)
		}
		fb := box{Instance: fork, ID: fo.ID, Dir: fo.Dir, Runtime: sandbox.RuntimeGVisor}
		if st := status(b, fb, pid); st.State != "running" {
			b.Fatalf("the fork's process: %+v", st)
		}
		done := time.Now()
		save += saved.Sub(start)
		restore += done.Sub(saved)
		b.StopTimer()
		fork.Destroy(false)
		os.RemoveAll(dir)
		b.StartTimer()
	}
	reportFork(b, save, restore)
}

// benchForkRunsc is runsc by hand: a bundle of the host's system
// directories running the same process, checkpointed with the flags kilnd
// uses, restored into a new container of a copy of the bundle (detached:
// runsc returns once it runs).
func benchForkRunsc(b *testing.B) {
	g := benchGVisor(b)
	dir := b.TempDir()
	root := filepath.Join(dir, "runsc")
	b.Cleanup((&sandbox.GVisor{Root: root}).Release)
	bundle := func(name string) string {
		bdir := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Join(bdir, "rootfs"), 0o755); err != nil {
			b.Fatal(err)
		}
		spec := specs.Spec{
			Version: specs.Version,
			Process: &specs.Process{Args: []string{"python3", "-c", readyScript, fmt.Sprint(forkMemory)},
				Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/"},
			Root:   &specs.Root{Path: "/", Readonly: true},
			Mounts: []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}, {Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"}},
			Linux:  &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.NetworkNamespace}}},
		}
		j, _ := json.Marshal(spec)
		if err := os.WriteFile(filepath.Join(bdir, "config.json"), j, 0o600); err != nil {
			b.Fatal(err)
		}
		return bdir
	}
	runsc := func(args ...string) {
		b.Helper()
		all := append([]string{"--root", root, "--network", "none", "--ignore-cgroups", "--overlay2", "root:memory"}, args...)
		if out, err := exec.Command(g.Runsc, all...).CombinedOutput(); err != nil {
			b.Fatalf("runsc %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// Its stdin is a pipe kept open, so that it waits, once it has said
	// on its stdout that its memory is touched.
	pr, pw, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	defer pw.Close()
	cmd := exec.Command(g.Runsc, "--root", root, "--network", "none", "--ignore-cgroups", "--overlay2", "root:memory",
		"run", "--bundle", bundle("parent"), "parent")
	cmd.Stdin = pr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	pr.Close()
	defer func() {
		exec.Command(g.Runsc, "--root", root, "delete", "--force", "parent").Run()
		cmd.Wait()
	}()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		b.Fatalf("the process: %q %v", line, err)
	}
	var save, restore time.Duration
	b.ResetTimer()
	for i := range b.N {
		image := filepath.Join(dir, fmt.Sprint("image-", i))
		id := fmt.Sprint("fork-", i)
		start := time.Now()
		runsc("checkpoint", "--image-path", image, "--leave-running", "--compression", "none", "parent")
		saved := time.Now()
		runsc("restore", "--image-path", image, "--background", "--detach", "--bundle", bundle(id), id)
		done := time.Now()
		save += saved.Sub(start)
		restore += done.Sub(saved)
		b.StopTimer()
		runsc("delete", "--force", id)
		os.RemoveAll(image)
		b.StartTimer()
	}
	reportFork(b, save, restore)
}

// benchGVisor is the gVisor backend, or a skip.
func benchGVisor(b *testing.B) *sandbox.GVisor {
	if os.Geteuid() != 0 {
		b.Skip("sandboxes need root")
	}
	g := &sandbox.GVisor{Exe: os.Args[0], Runsc: runsc(), Root: filepath.Join(b.TempDir(), "runsc"), Ranges: sandbox.NewIDRanges()}
	if err := g.Check(); err != nil {
		b.Skipf("no gVisor here: %v", err)
	}
	b.Cleanup(g.Release)
	return g
}

// benchOptions are those of a sandbox with room for forkMemory.
func benchOptions(b *testing.B) sandbox.Options {
	id := uuid.Must(uuid.NewV7()).String()
	return sandbox.Options{ID: id, Dir: filepath.Join(b.TempDir(), id),
		Env:    []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root", "LANG=C.UTF-8"},
		Limits: sandbox.Limits{MemoryBytes: 1 << 30}}
}

// reportFork reports the mean checkpoint and restore times, and their sum.
func reportFork(b *testing.B, save, restore time.Duration) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(save), "checkpoint-ms")
	b.ReportMetric(ms(restore), "restore-ms")
	b.ReportMetric(ms(save+restore), "fork-ms")
}
