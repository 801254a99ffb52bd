package sandbox_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestGVisorOutOfMemoryUnwatched: a gVisor sandbox that ran out of memory
// while nothing awaited it (kilnd restarting) is ended as a whole as soon
// as something does, and says why. Memory taken a little at a time has
// the host's killer pick the stub of the process taking it, so that the
// sandbox would otherwise run on without it.
func TestGVisorOutOfMemoryUnwatched(t *testing.T) {
	t.Parallel()
	sb := newBox(t, sandbox.RuntimeGVisor, sandbox.Options{Limits: sandbox.Limits{MemoryBytes: 64 << 20}})
	body, _ := json.Marshal(api.ExecRequest{Command: "python3", Args: []string{"-c", `
l = []
for i in range(64):
    l.append(bytearray(8 << 20))
`}})
	// Either its process alone was killed (and the agent answers), or
	// gVisor's kernel was (and nothing does).
	if code, b, ok := postExec(sb, body); ok {
		t.Logf("the hog alone ended: %d %s", code, b)
	}
	endedOutOfMemory(t, sb, agentEnded(sb))
}

// postExec posts an exec request (JSON) to sb's agent; ok is false when
// no answer came: the sandbox ended under it.
func postExec(sb box, body []byte) (code int, answer []byte, ok bool) {
	c := &http.Client{Transport: sandbox.Transport(sb.Dial)}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://agent/exec", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, nil, false
	}
	defer resp.Body.Close()
	answer, _ = io.ReadAll(resp.Body)
	return resp.StatusCode, answer, true
}

// agentEnded returns a channel closed once sb's agent has exited, or a
// minute has passed.
func agentEnded(sb box) <-chan struct{} {
	ended := make(chan struct{})
	go func() {
		stop := make(chan struct{})
		timer := time.AfterFunc(time.Minute, func() { close(stop) })
		defer timer.Stop()
		sb.AwaitExit(stop)
		close(ended)
	}()
	return ended
}

// endedOutOfMemory waits for ended (agentEnded's), and holds that sb no
// longer runs and says it ended out of memory.
func endedOutOfMemory(t *testing.T, sb box, ended <-chan struct{}) {
	t.Helper()
	<-ended
	if sb.Alive() {
		t.Fatal("the sandbox still runs")
	}
	if r := sb.ExitReason(); !strings.HasPrefix(r, "out of memory") {
		t.Errorf("exit reason %q, want out of memory", r)
	}
}

// TestOutOfMemoryEndsTheSandbox: a namespace sandbox made to end out of
// memory does, as a whole, and says why, whether the kernel's event came
// while kilnd watched or before it did (here: the hog is run, and killed,
// before anything awaits the sandbox). Its agent, outside the limit,
// outlives the kernel's kill and is ended by the watch.
func TestOutOfMemoryEndsTheSandbox(t *testing.T) {
	t.Parallel()
	for _, watched := range []bool{false, true} {
		t.Run(map[bool]string{false: "unwatched", true: "watched"}[watched], func(t *testing.T) {
			sb := newBox(t, sandbox.RuntimeNamespaces, sandbox.Options{Limits: sandbox.Limits{MemoryBytes: 64 << 20}, EndOnOOM: true})
			var ended <-chan struct{}
			if watched {
				ended = agentEnded(sb)
			}
			body, _ := json.Marshal(api.ExecRequest{Command: "python3", Args: []string{"-c", "b = bytearray(256 << 20); print(len(b))"}})
			if code, b, ok := postExec(sb, body); ok {
				var res api.ExecResult
				if code == http.StatusOK && (json.Unmarshal(b, &res) != nil || !res.OOMKilled) {
					t.Errorf("the hog's exit: %s", b)
				}
			}
			if !watched {
				ended = agentEnded(sb)
			}
			endedOutOfMemory(t, sb, ended)
		})
	}
}
