package sandbox_test

import (
	"bytes"
	"context"
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
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// box is a sandbox of either backend, with what a test knows of it.
type box struct {
	sandbox.Instance
	ID, Dir, Runtime string
	// Workspace is the host directory of its /workspace.
	Workspace string
}

// dialer is what run needs of a sandbox.
type dialer interface {
	Dial(context.Context) (net.Conn, error)
}

// runsc is the runsc binary the gVisor tests use: $KILN_TEST_RUNSC, or
// runsc in PATH.
func runsc() string {
	if p := os.Getenv("KILN_TEST_RUNSC"); p != "" {
		return p
	}
	p, _ := exec.LookPath("runsc")
	return p
}

// backend is the named backend running exe as the agent (os.Args[0],
// this test binary, when empty), or a skip saying why this host has none.
func backend(t *testing.T, runtime, exe string) sandbox.Backend {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sandboxes need root")
	}
	if exe == "" {
		exe = os.Args[0]
	}
	switch runtime {
	case sandbox.RuntimeGVisor:
		g := &sandbox.GVisor{Exe: exe, Runsc: runsc(), Root: filepath.Join(t.TempDir(), "runsc"), Ranges: sandbox.NewIDRanges()}
		if err := g.Check(); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI installs a runsc: %v", err)
			}
			t.Skipf("no gVisor here: %v", err)
		}
		t.Cleanup(g.Release)
		return g
	}
	return &sandbox.Namespaces{Exe: exe, Ranges: sandbox.NewIDRanges()}
}

// eachRuntime runs f as a subtest per backend.
func eachRuntime(t *testing.T, f func(t *testing.T, runtime string)) {
	for _, rt := range []string{sandbox.RuntimeNamespaces, sandbox.RuntimeGVisor} {
		t.Run(rt, func(t *testing.T) { f(t, rt) })
	}
}

// newBox creates a sandbox of runtime, destroyed when the test ends; its
// agent is o.Exe, or this test binary.
func newBox(t *testing.T, runtime string, o sandbox.Options) box {
	t.Helper()
	b := backend(t, runtime, o.Exe)
	o.ID = uuid.Must(uuid.NewV7()).String()
	o.Dir = filepath.Join(t.TempDir(), o.ID)
	if o.Env == nil {
		o.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root", "LANG=C.UTF-8"}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sb, err := b.Create(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Destroy(false); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	return box{Instance: sb, ID: o.ID, Dir: o.Dir, Runtime: runtime, Workspace: filepath.Join(o.Dir, sandbox.WorkspaceName)}
}

// staticKilnd builds kilnd linked statically, as an agent that needs
// nothing of the host's (in a gVisor sandbox with an image).
func staticKilnd(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "kilnd")
	cmd := exec.Command("go", "build", "-o", out, "github.com/sandkiln/sandkiln/cmd/kilnd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build a static kilnd: %v: %s", err, b)
	}
	return out
}

// TestFiles: the agent's files routes work in both backends, done by the
// sandbox's root: a file written through them belongs to it inside, and
// what its processes write reads back.
func TestFiles(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testFiles)
}

func testFiles(t *testing.T, runtime string) {
	sb := newBox(t, runtime, sandbox.Options{})
	c := &http.Client{Transport: sandbox.Transport(sb.Dial)}
	defer c.CloseIdleConnections()
	req, _ := http.NewRequest("PUT", "http://agent/files/workspace/in/put.txt?mode=0640", strings.NewReader("put through the API\n"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PUT: %d %s", resp.StatusCode, b)
	}
	if r := run(t, sb, "stat -c '%u %g %a' /workspace/in/put.txt; cat /workspace/in/put.txt; echo written inside > /workspace/in/mine.txt"); r.Stdout != "0 0 640\nput through the API\n" {
		t.Errorf("inside: %q %q", r.Stdout, r.Stderr)
	}
	resp, err = c.Get("http://agent/files/workspace/in/mine.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "written inside\n" {
		t.Errorf("GET: %d %q", resp.StatusCode, b)
	}
	resp, err = c.Get("http://agent/archive?path=/workspace/in")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte("in/mine.txt")) || !bytes.Contains(b, []byte("in/put.txt")) {
		t.Errorf("archive: %d %.200q", resp.StatusCode, b)
	}
	// On the host, the sandbox's root is the first uid of its range.
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(sb.Workspace, "in", "put.txt"), &st); err == nil && st.Uid == 0 {
		t.Errorf("the file is host root's")
	}
}
