package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestPause: a paused sandbox's busy process uses no CPU, measured in its
// cgroup over a second, and uses it again once resumed; pausing or
// resuming twice changes nothing; a paused sandbox is destroyed (the
// test's cleanup) as a running one is.
func TestPause(t *testing.T) {
	t.Parallel()
	eachRuntime(t, testPause)
}

func testPause(t *testing.T, runtime string) {
	sb := newBox(t, runtime, sandbox.Options{})
	startDetached(t, sb, "while :; do :; done")
	// What the sandbox's cgroup counts over an interval of the clock: a
	// measurement, whose interval is the point, not a wait for something.
	const interval = time.Second
	used := func() time.Duration {
		t.Helper()
		before, err := sb.Stats()
		if err != nil {
			t.Fatal(err)
		}
		<-time.After(interval)
		after, err := sb.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration((after.CPUSeconds - before.CPUSeconds) * float64(time.Second))
	}
	// A busy loop on a shared machine gets less than a core: a tenth of
	// the interval tells it from an idle sandbox.
	const busy, idle = interval / 10, interval / 50
	if got := used(); got < busy {
		t.Fatalf("the busy loop used %v of CPU in %v before the pause", got, interval)
	}
	for range 2 {
		if err := sb.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	if s, ok := sb.Instance.(*sandbox.Sandbox); ok && !s.Cgroups.Frozen() {
		t.Errorf("paused, the procs group is not frozen")
	}
	if got := used(); got > idle {
		t.Errorf("paused, the sandbox used %v of CPU in %v", got, interval)
	}
	for range 2 {
		if err := sb.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	if got := used(); got < busy {
		t.Errorf("resumed, the busy loop used %v of CPU in %v", got, interval)
	}
	if err := sb.Pause(); err != nil {
		t.Fatal(err)
	}
}

// startDetached starts sh -c script in the sandbox, detached, and returns
// its process id.
func startDetached(t *testing.T, sb dialer, script string) string {
	t.Helper()
	body, _ := json.Marshal(api.ExecRequest{Command: "sh", Args: []string{"-c", script}})
	c := &http.Client{Transport: sandbox.Transport(sb.Dial)}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://agent/exec-stream", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var p api.Process
	if resp.StatusCode/100 != 2 || json.Unmarshal(b, &p) != nil || p.ID == "" {
		t.Fatalf("start %q: status %d: %s", script, resp.StatusCode, b)
	}
	return p.ID
}

// TestPauseGVisorDirect: kilnd pauses and resumes a gVisor sandbox with
// the installed runsc itself, not through a run of runsc, and leaves
// runsc's record of the container as runsc's own pause and resume would:
// runsc state says paused, then running; runsc resumes a sandbox kilnd
// paused, kilnd one runsc paused; a checkpoint (runsc pause, checkpoint,
// resume, kill for the agent's reconnection) works after, and the destroy
// (runsc kill and delete) at the test's end.
func TestPauseGVisorDirect(t *testing.T) {
	t.Parallel()
	sb := newBox(t, sandbox.RuntimeGVisor, sandbox.Options{})
	var rec struct {
		Container string `json:"container"`
		Root      string `json:"runsc_root"`
	}
	if err := json.Unmarshal(sb.State(), &rec); err != nil || rec.Container == "" || rec.Root == "" {
		t.Fatalf("the sandbox's state: %v: %s", err, sb.State())
	}
	run := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(runsc(), append([]string{"--root", rec.Root}, append(args, rec.Container)...)...).Output()
		if err != nil {
			t.Fatalf("runsc %s: %v", args[0], err)
		}
		return out
	}
	expect := func(want string) {
		t.Helper()
		var st struct {
			Status string `json:"status"`
		}
		if out := run("state"); json.Unmarshal(out, &st) != nil || st.Status != want {
			t.Fatalf("runsc state: %s, want status %q", out, want)
		}
	}
	step := func(name string, f func() error) {
		t.Helper()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	startDetached(t, sb, "while :; do echo tick; sleep 0.01; done")

	step("pause", sb.Pause)
	expect("paused")
	step("pause again", sb.Pause)
	expect("paused")
	step("resume", sb.Resume)
	expect("running")
	step("resume again", sb.Resume)
	expect("running")
	startDetached(t, sb, "true")

	step("pause", sb.Pause)
	run("resume")
	expect("running")
	startDetached(t, sb, "true")
	run("pause")
	expect("paused")
	step("resume after runsc's pause", sb.Resume)
	expect("running")
	startDetached(t, sb, "true")
	if n := sandbox.RunscPauses(sb.Instance); n != 0 {
		t.Errorf("runsc made %d of the pauses and resumes: kilnd's own way was not taken", n)
	}

	step("pause", sb.Pause)
	step("resume", sb.Resume)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	step("checkpoint", func() error {
		return sb.Instance.(sandbox.Checkpointer).Checkpoint(ctx, filepath.Join(t.TempDir(), "checkpoint"), nil)
	})
	expect("running")
}
