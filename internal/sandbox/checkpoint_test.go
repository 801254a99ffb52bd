package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// counterScript holds a counter, and mem bytes beside it, in a Python
// process's memory: each line on its stdin counts one, and it prints the
// count. It prints first the lines of prefix (its second argument, zero
// if none).
const counterScript = `
import sys
def prefixOf(n):
    return "".join("line %010d\n" % i for i in range(n))
held = bytearray(int(sys.argv[1]))
for i in range(0, len(held), 4096):
    held[i] = 1
if len(sys.argv) > 2:
    sys.stdout.write(prefixOf(int(sys.argv[2])))
    sys.stdout.flush()
n = 0
for line in sys.stdin:
    n += 1
    print(n, flush=True)
`

// TestGVisorMemoryFork: a gVisor sandbox saved while a Python process
// holds a counter goes on, and two new sandboxes restored from its image,
// each on a copy of its disk, go on from the same count: the process is
// in each one's list with its output at the same offsets (read from 0,
// the bytes before the checkpoint, then its own), it takes stdin where it
// stood, and a new process starts.
func TestGVisorMemoryFork(t *testing.T) {
	t.Parallel()
	g := backend(t, sandbox.RuntimeGVisor, "").(*sandbox.GVisor)
	disks := testDisks(t)
	parent := createFrom(t, g, disks, "", "")
	if err := os.WriteFile(filepath.Join(parent.Workspace, "before"), []byte("written before\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// More output than a process's ring holds (1 MiB): what is read from
	// offset 0 comes from the captured log first.
	const lines = 150_000
	pid := startCounter(t, parent, 16<<20, lines)
	for range 3 {
		count(t, parent, pid)
	}
	want := prefixOf(lines) + "1\n2\n3\n"

	dir := filepath.Join(t.TempDir(), "checkpoint")
	var images []string
	cp, ok := parent.Instance.(sandbox.Checkpointer)
	if !ok {
		t.Fatal("a gVisor sandbox is not a Checkpointer")
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err := cp.Checkpoint(ctx, dir, func() error {
		for i := range 2 {
			img, err := copyDisk(parent, disks, i)
			if err != nil {
				return err
			}
			images = append(images, img)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The sandbox saved goes on, its agent reached again.
	if got := count(t, parent, pid); got != "4" {
		t.Errorf("the saved sandbox counts %q after its checkpoint, want 4", got)
	}
	if got := output(t, parent, pid); got != want+"4\n" {
		t.Errorf("the saved sandbox's output: %s", diffAt(got, want+"4\n"))
	}
	for i, img := range images {
		fork := createFrom(t, g, disks, dir, img)
		if fork.ID == parent.ID || fork.Dir == parent.Dir {
			t.Fatal("the fork is the parent")
		}
		st := status(t, fork, pid)
		if st.State != "running" || st.Streams["stdout"].TotalBytes != int64(len(want)) {
			t.Errorf("fork %d: the counter restored: %+v", i, st)
		}
		if got := output(t, fork, pid); got != want {
			t.Errorf("fork %d: output up to the checkpoint: %s", i, diffAt(got, want))
		}
		for n := 4; n <= 5; n++ {
			if got := count(t, fork, pid); got != fmt.Sprint(n) {
				t.Errorf("fork %d counts %q, want %d", i, got, n)
			}
		}
		if got := output(t, fork, pid); got != want+"4\n5\n" {
			t.Errorf("fork %d: output: %s", i, diffAt(got, want+"4\n5\n"))
		}
		if r := run(t, fork, "cat /workspace/before; echo fork > /workspace/mine; hostname"); r.Stdout == "" || !strings.HasPrefix(r.Stdout, "written before\n") {
			t.Errorf("fork %d: a new process: %q %q", i, r.Stdout, r.Stderr)
		}
	}
	// Each fork has a disk of its own.
	if _, err := os.Stat(filepath.Join(parent.Workspace, "mine")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a fork wrote to its parent's workspace: %v", err)
	}
	if got := count(t, parent, pid); got != "5" {
		t.Errorf("the saved sandbox counts %q, want 5", got)
	}
}

// TestGVisorMemoryForkNetwork: a sandbox with a network restored from
// another's memory has its own network namespace's address, not the
// saved one's (runsc configures the restored network stack from the new
// namespace), and its processes go on, the saved sandbox gone by then.
func TestGVisorMemoryForkNetwork(t *testing.T) {
	t.Parallel()
	g := backend(t, sandbox.RuntimeGVisor, "").(*sandbox.GVisor)
	parent := createWith(t, g, nil, "", "", sandbox.Options{Network: linkIn(0)})
	pid := startCounter(t, parent, 1<<20)
	count(t, parent, pid)
	if got := sourceTo(t, parent, 0); got != "10.201.0.2" {
		t.Fatalf("the parent's address: %q", got)
	}
	dir := filepath.Join(t.TempDir(), "checkpoint")
	if err := parent.Instance.(sandbox.Checkpointer).Checkpoint(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	if got := sourceTo(t, parent, 0); got != "10.201.0.2" {
		t.Errorf("the parent's address after the checkpoint: %q", got)
	}
	// The checkpoint outlives its sandbox.
	if err := parent.Destroy(false); err != nil {
		t.Fatal(err)
	}
	fork := createWith(t, g, nil, dir, "", sandbox.Options{Network: linkIn(1)})
	if got := count(t, fork, pid); got != "2" {
		t.Errorf("the fork counts %q, want 2", got)
	}
	if got := sourceTo(t, fork, 1); got != "10.201.1.2" {
		t.Errorf("the fork's address: %q, want its own, 10.201.1.2", got)
	}
}

// linkIn connects a sandbox's network namespace to nothing but itself: a
// pair of links in it, one of them 10.201.n.2/24, enough for its address
// to show.
func linkIn(n int) func(string) error {
	return func(nsPath string) error {
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			return err
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			return err
		}
		defer h.Close()
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth1"}); err != nil {
			return err
		}
		for _, name := range []string{"eth1", "eth0"} {
			l, err := h.LinkByName(name)
			if err == nil && name == "eth0" {
				a, _ := netlink.ParseAddr(fmt.Sprintf("10.201.%d.2/24", n))
				err = h.AddrAdd(l, a)
			}
			if err == nil {
				err = h.LinkSetUp(l)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// sourceTo is the address sb's processes send from to 10.201.n.9.
func sourceTo(t *testing.T, sb box, n int) string {
	t.Helper()
	r := run(t, sb, fmt.Sprintf(`python3 -c "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('10.201.%d.9', 9)); print(s.getsockname()[0])"`, n))
	if code(r) != 0 {
		t.Fatalf("the sandbox's address: %q %q", r.Stdout, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

// TestNamespacesMemorySnapshot: a namespace sandbox refuses a memory
// snapshot with an error of a class the API answers with a 4xx.
func TestNamespacesMemorySnapshot(t *testing.T) {
	t.Parallel()
	sb := newBox(t, sandbox.RuntimeNamespaces, sandbox.Options{})
	cp, ok := sb.Instance.(sandbox.Checkpointer)
	if !ok {
		t.Fatal("a namespace sandbox is not a Checkpointer")
	}
	dir := filepath.Join(t.TempDir(), "checkpoint")
	err := cp.Checkpoint(t.Context(), dir, nil)
	if !errors.Is(err, sandbox.ErrNoMemorySnapshot) || errdefs.ClassOf(err) != errdefs.ErrFailedPrecondition {
		t.Fatalf("a namespace sandbox's memory snapshot: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused snapshot left %s: %v", dir, err)
	}
}

// testDisks makes sandbox disks in a directory of the test's, or skips.
func testDisks(t *testing.T) *sandbox.Disks {
	t.Helper()
	if err := sandbox.DisksAvailable(); err != nil {
		t.Skip(err)
	}
	disks, err := sandbox.NewDisks(t.TempDir(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(disks.Close)
	return disks
}

// createFrom creates a gVisor sandbox on a disk: a new one when image is
// empty, else a mount of image, restored from the checkpoint in restore.
func createFrom(t *testing.T, g *sandbox.GVisor, disks *sandbox.Disks, restore, image string) box {
	t.Helper()
	return createWith(t, g, disks, restore, image, sandbox.Options{})
}

// createWith is createFrom with options o (a sandbox without a disk when
// disks is nil).
func createWith(t *testing.T, g *sandbox.GVisor, disks *sandbox.Disks, restore, image string, o sandbox.Options) box {
	t.Helper()
	o.ID = uuid.Must(uuid.NewV7()).String()
	o.Dir = filepath.Join(t.TempDir(), o.ID)
	o.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root", "LANG=C.UTF-8"}
	o.Limits = sandbox.Limits{MemoryBytes: 512 << 20}
	o.RestoreFrom = restore
	workspace := filepath.Join(o.Dir, "disk", sandbox.WorkspaceName)
	switch {
	case disks == nil:
		workspace = filepath.Join(o.Dir, sandbox.WorkspaceName)
	case image == "":
		disk, err := disks.Take(64 << 20)
		if err != nil {
			t.Fatal(err)
		}
		o.Disk = disk.Mount
		t.Cleanup(func() { disks.Release(disk.Image) })
	default:
		m, err := disks.Mount(image)
		if err != nil {
			t.Fatal(err)
		}
		o.Disk = m
		t.Cleanup(func() { disks.Release(image) })
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sb, err := g.Create(ctx, o)
	if o.Disk != nil {
		o.Disk.Close() // the sandbox's now
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := os.Stat(o.Dir); err != nil {
			return // destroyed by the test
		}
		if err := sb.Destroy(false); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	return box{Instance: sb, ID: o.ID, Dir: o.Dir, Runtime: sandbox.RuntimeGVisor, Workspace: workspace}
}

// copyDisk copies sb's disk's image, its file system synced, into a new
// image of disks (numbered i): what a fork starts on.
func copyDisk(sb box, disks *sandbox.Disks, i int) (string, error) {
	mount := filepath.Join(sb.Dir, "disk")
	f, err := os.Open(mount)
	if err != nil {
		return "", err
	}
	err = unix.Syncfs(int(f.Fd()))
	f.Close()
	if err != nil {
		return "", err
	}
	src, err := diskImage(mount)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(filepath.Dir(src), fmt.Sprintf("fork-%s-%d.img", sb.ID, i))
	if out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput(); err != nil {
		return "", fmt.Errorf("copy the disk: %v: %s", err, out)
	}
	return dst, nil
}

// diskImage is the image behind the loop device mounted at mount.
func diskImage(mount string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(mount, &st); err != nil {
		return "", err
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// startCounter starts counterScript, holding mem bytes, printing
// prefixOf(lines[0]) first if given, captured, its stdin a pipe; it
// returns the process's id.
func startCounter(t testing.TB, sb box, mem int, lines ...int) string {
	t.Helper()
	args := []string{"-c", counterScript, fmt.Sprint(mem)}
	if len(lines) > 0 {
		args = append(args, fmt.Sprint(lines[0]))
	}
	body, _ := json.Marshal(api.ExecRequest{Command: "python3", Args: args, Stdin: "pipe", Capture: true})
	var started api.Started
	agentCall(t, sb, "POST", "/exec-stream", body, &started)
	return started.ID
}

// prefixOf is what counterScript prints first.
func prefixOf(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "line %010d\n", i)
	}
	return b.String()
}

// count writes a line to the counter's stdin and returns the number it
// prints.
func count(t testing.TB, sb box, pid string) string {
	t.Helper()
	before := status(t, sb, pid).Streams["stdout"].TotalBytes
	agentCall(t, sb, "POST", "/exec-stream/"+pid+"/stdin", []byte("\n"), nil)
	deadline := time.Now().Add(30 * time.Second)
	for status(t, sb, pid).Streams["stdout"].TotalBytes == before {
		if time.Now().After(deadline) {
			t.Fatalf("the counter did not count: %+v", status(t, sb, pid))
		}
		time.Sleep(10 * time.Millisecond)
	}
	out := output(t, sb, pid)
	if int64(len(out)) < before {
		t.Fatalf("output %q, shorter than %d bytes", out, before)
	}
	return strings.TrimSpace(out[before:])
}

// diffAt says where got, long, first differs from want.
func diffAt(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("%d bytes, want %d; from byte %d: %q, want %q", len(got), len(want), i, got[i:min(len(got), i+40)], want[i:min(len(want), i+40)])
}

// status is the process's status in sb.
func status(t testing.TB, sb box, pid string) api.Process {
	t.Helper()
	var p api.Process
	agentCall(t, sb, "GET", "/exec-stream/"+pid, nil, &p)
	return p
}

// output is the process's stdout from offset 0, as much as there is.
func output(t testing.TB, sb box, pid string) string {
	t.Helper()
	return string(agentCall(t, sb, "GET", "/exec-stream/"+pid+"/logs?follow=false&stdout=0", nil, nil))
}

// agentCall makes a request of sb's agent and decodes its answer into out
// (when not nil); it returns the body.
func agentCall(t testing.TB, sb box, method, path string, body []byte, out any) []byte {
	t.Helper()
	c := &http.Client{Transport: sandbox.Transport(sb.Dial), Timeout: 30 * time.Second}
	defer c.CloseIdleConnections()
	req, _ := http.NewRequest(method, "http://agent"+path, bytes.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return b
}

// TestGVisorAdoptListeningAgent: a gVisor sandbox recorded by a kilnd
// whose agents listened (its state says nothing of agent_dials) is
// dialled where its agent listens, and refuses a memory snapshot.
func TestGVisorAdoptListeningAgent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sock"), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "sock", sandbox.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	state, _ := json.Marshal(map[string]any{"id": "0190aaaa-0000-7000-8000-000000000001", "dir": dir, "pid": 0,
		"uid_base": sandbox.DefaultUIDBase, "container": "kiln-0190aaaa-0000-7000-8000-000000000001", "runsc_root": t.TempDir()})
	g := &sandbox.GVisor{Ranges: sandbox.NewIDRanges()}
	sb, err := g.Adopt(state)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c, err := sb.Dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sock", sandbox.SocketName)); err != nil {
		t.Errorf("the agent's socket: %v", err)
	}
	err = sb.(sandbox.Checkpointer).Checkpoint(t.Context(), filepath.Join(t.TempDir(), "checkpoint"), nil)
	if errdefs.ClassOf(err) != errdefs.ErrFailedPrecondition {
		t.Errorf("a memory snapshot of a listening agent's sandbox: %v", err)
	}
}
