package sandbox_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
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
