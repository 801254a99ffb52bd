package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// eachRuntime runs f as a subtest per runtime.
func eachRuntime(t *testing.T, f func(t *testing.T, runtime string)) {
	for _, rt := range []string{sandbox.RuntimeNamespaces, sandbox.RuntimeGVisor} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			f(t, rt)
		})
	}
}

// create makes a sandbox of runtime with the create request's other
// fields (a JSON object's members, or ""), a gVisor one skipped where this
// host has no runsc (outside CI).
func (k *kilnd) create(t *testing.T, runtime, fields string) daemon.Info {
	t.Helper()
	body := fmt.Sprintf(`{"runtime":%q}`, runtime)
	if fields != "" {
		body = fmt.Sprintf(`{"runtime":%q,%s}`, runtime, fields)
	}
	if runtime == sandbox.RuntimeGVisor {
		return createGVisor(t, k, body)
	}
	var info daemon.Info
	k.json("POST", "/sandboxes", body, &info)
	return info
}

// cpuUse measures, through GET /stats, the CPU sandbox sb uses over a
// second: a measurement, whose interval is the point, not a wait for
// something to happen.
func cpuUse(t *testing.T, do func(method, path string, out any), sb string) time.Duration {
	t.Helper()
	var before, after api.SandboxStats
	do("GET", "/sandboxes/"+sb+"/stats", &before)
	<-time.After(time.Second)
	do("GET", "/sandboxes/"+sb+"/stats", &after)
	return time.Duration((after.CPUSeconds - before.CPUSeconds) * float64(time.Second))
}

// A busy loop on a shared machine gets less than a core: a tenth of a
// second's CPU in a second tells it from a paused sandbox, which uses
// less than a twenty-fifth: its agent's work (more in the second after
// a new kilnd adopts it, answering its reconnection and first requests),
// and gVisor's kernel's idle work. Its frozen processes use none.
const busyCPU, pausedCPU = 100 * time.Millisecond, 40 * time.Millisecond

// refusedPaused checks that a call to sandbox sb answers 409, code
// paused, naming the state.
func (k *kilnd) refusedPaused(t *testing.T, method, path, body string) {
	t.Helper()
	code, b := k.do(method, path, k.d.Token(), body)
	var e api.Error
	json.Unmarshal(b, &e)
	if code != http.StatusConflict || e.Error.Code != api.CodePaused || !strings.Contains(e.Error.Message, "is paused") {
		t.Errorf("%s %s while paused: %d %s", method, path, code, b)
	}
}

// TestPauseResume: a paused sandbox's busy process uses no CPU (its
// cgroup's count, through the API, over a second) and is shown paused;
// what needs the sandbox to run is refused, 409 naming the state, while
// its agent, on the namespace backend, still answers for its processes;
// resumed, the process uses CPU again and exec works. A pause of a paused
// sandbox and a resume of a running one are 304. The events say paused
// and resumed. A paused sandbox stops (resumed first), and is deleted.
func TestPauseResume(t *testing.T) { eachRuntime(t, testPauseResume) }

func testPauseResume(t *testing.T, runtime string) {
	k := start(t, "")
	defer k.cleanup()
	sb := k.create(t, runtime, `"name":"pausing"`).ID
	var busy api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", `{"command":"sh","args":["-c","while :; do :; done"],"stdin":"pipe"}`, &busy)
	do := func(method, path string, out any) { k.json(method, path, nil, out) }
	if got := cpuUse(t, do, sb); got < busyCPU {
		t.Fatalf("the busy loop used %v of CPU in a second before the pause", got)
	}

	code, info := k.change(t, "pause", sb)
	if code != http.StatusOK || info.State != api.SandboxPaused || info.PausedAt == nil {
		t.Fatalf("pause: %d %+v", code, info)
	}
	if code, _ := k.change(t, "pause", sb); code != http.StatusNotModified {
		t.Errorf("a pause of a paused sandbox: %d, want 304", code)
	}
	var got daemon.Info
	k.json("GET", "/sandboxes/pausing", nil, &got)
	if got.State != api.SandboxPaused || !got.PausedAt.Equal(*info.PausedAt) {
		t.Errorf("described: %s paused at %v, want paused at %v", got.State, got.PausedAt, info.PausedAt)
	}
	listed := func(state string) bool {
		var list []daemon.Info
		k.json("GET", "/sandboxes?state="+state, nil, &list)
		return slices.ContainsFunc(list, func(i daemon.Info) bool { return i.ID == sb })
	}
	if !listed(api.SandboxPaused) || listed(api.SandboxRunning) {
		t.Errorf("listed paused %v, running %v", listed(api.SandboxPaused), listed(api.SandboxRunning))
	}
	if got := cpuUse(t, do, sb); got > pausedCPU {
		t.Errorf("paused, the sandbox used %v of CPU in a second", got)
	}
	base := "/sandboxes/" + sb
	k.refusedPaused(t, "POST", base+"/exec", `{"command":"true"}`)
	k.refusedPaused(t, "POST", base+"/exec-stream", `{"command":"true"}`)
	k.refusedPaused(t, "POST", base+"/exec-stream/"+busy.ID+"/stdin", "more")
	k.refusedPaused(t, "PUT", base+"/files/workspace/new.txt", "content")
	k.refusedPaused(t, "GET", base+"/files/workspace", "")
	if runtime == sandbox.RuntimeNamespaces {
		// The agent runs on, and answers for its processes.
		var p api.Process
		k.json("GET", base+"/exec-stream/"+busy.ID, nil, &p)
		if p.State != api.StateRunning {
			t.Errorf("the busy loop, paused: %+v", p)
		}
	} else {
		k.refusedPaused(t, "GET", base+"/exec-stream/"+busy.ID, "")
	}

	code, info = k.change(t, "resume", sb)
	if code != http.StatusOK || info.State != api.SandboxRunning || info.PausedAt != nil {
		t.Fatalf("resume: %d %+v", code, info)
	}
	if code, _ := k.change(t, "resume", sb); code != http.StatusNotModified {
		t.Errorf("a resume of a running sandbox: %d, want 304", code)
	}
	if got := cpuUse(t, do, sb); got < busyCPU {
		t.Errorf("resumed, the busy loop used %v of CPU in a second", got)
	}
	if out := k.sh(t, sb, "echo resumed"); out != "resumed\n" {
		t.Errorf("exec after the resume: %q", out)
	}

	// Stopped while paused: resumed first, then stopped as ever.
	k.change(t, "pause", sb)
	if code, info := k.change(t, "stop", sb); code != http.StatusOK || info.State != api.SandboxStopped || info.PausedAt != nil {
		t.Errorf("stop of a paused sandbox: %d %+v", code, info)
	}
	if code, b := k.do("POST", base+"/pause", k.d.Token(), nil); code != http.StatusPreconditionFailed {
		t.Errorf("pause of a stopped sandbox: %d %s", code, b)
	}
	want := []string{api.EventCreated, api.EventPaused, api.EventResumed, api.EventPaused, api.EventStopped}
	if got := k.eventTypes(t, sb); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	// Deleted while paused: its processes killed where they are.
	k.change(t, "start", sb)
	k.change(t, "pause", sb)
	if code, b := k.do("DELETE", base, k.d.Token(), nil); code != http.StatusNoContent {
		t.Fatalf("delete of a paused sandbox: %d %s", code, b)
	}
	if code, _ := k.do("GET", base, k.d.Token(), nil); code != http.StatusNotFound {
		t.Errorf("a paused sandbox deleted: %d", code)
	}
}

// seqBytes is what seq 1 n writes.
func seqBytes(n int) []byte {
	var b []byte
	for i := 1; i <= n; i++ {
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, '\n')
	}
	return b
}

// burstLines is how many lines seq writes in 64 MiB, exactly.
const burstLines = 8527496

// pipeBytes is what a process's output pipe holds (the engine's).
const pipeBytes = 1 << 20

// TestPauseMidBurst: a sandbox paused while a process writes 64 MiB to a
// watcher that holds its output (flow=block) loses nothing: the watcher,
// attached throughout, gets every byte at its offset, with no gap, and the
// exit, once the sandbox is resumed. On the namespace backend it is sent,
// while the sandbox is paused, what the process wrote before the pause,
// and the process writes nothing more meanwhile.
func TestPauseMidBurst(t *testing.T) { eachRuntime(t, testPauseMidBurst) }

func testPauseMidBurst(t *testing.T, runtime string) {
	k := start(t, "")
	defer k.cleanup()
	sb := k.create(t, runtime, "").ID
	want := seqBytes(burstLines)
	if len(want) != 64<<20 {
		t.Fatalf("seq 1 %d writes %d bytes", burstLines, len(want))
	}
	var st api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Command: "seq", Args: []string{"1", strconv.Itoa(burstLines)}, Flow: api.FlowBlock}, &st)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+k.addr+"/sandboxes/"+sb+"/exec-stream/"+st.ID+"/logs?flow=block",
		&websocket.DialOptions{Subprotocols: []string{api.ProtocolV1, api.TokenProtocolPrefix + k.d.Token()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(-1)
	w := &apitest.Checker{NoGaps: true, Check: func(stream string, offset int64, data []byte) error {
		if stream != "stdout" || offset+int64(len(data)) > int64(len(want)) || !bytes.Equal(data, want[offset:offset+int64(len(data))]) {
			return fmt.Errorf("%d bytes of %s at %d are not seq's", len(data), stream, offset)
		}
		return nil
	}}
	next := func() {
		t.Helper()
		if _, err := w.Next(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for w.Stream("stdout").Delivered < 16<<20 {
		next()
	}
	k.change(t, "pause", sb)
	if runtime == sandbox.RuntimeNamespaces {
		// The agent runs on: the watcher is sent what the process wrote
		// before the pause, up to what its pipe held then (1 MiB), and
		// nothing more comes, however long it reads.
		var p api.Process
		k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+st.ID, nil, &p)
		atPause := p.Streams["stdout"].TotalBytes
		for written := int64(-1); written != p.Streams["stdout"].TotalBytes; {
			written = p.Streams["stdout"].TotalBytes
			for w.Stream("stdout").Delivered < written {
				next()
			}
			k.json("GET", "/sandboxes/"+sb+"/exec-stream/"+st.ID, nil, &p)
		}
		if got := p.Streams["stdout"].TotalBytes; p.State != api.StateRunning || got-atPause > pipeBytes || got >= int64(len(want)) {
			t.Fatalf("paused mid-burst: %s, %d bytes written, %d of them after the pause", p.State, got, got-atPause)
		}
	}
	k.change(t, "resume", sb)
	if err := w.Read(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got := w.Stream("stdout").Delivered; got != int64(len(want)) || w.Exit == nil || w.Exit.ExitCode == nil || *w.Exit.ExitCode != 0 {
		t.Errorf("the watcher got %d bytes of %d, exit %+v", got, len(want), w.Exit)
	}
}

// TestPausedAcrossKill9: kilnd killed with SIGKILL while a sandbox is
// paused; the next kilnd adopts it paused, its processes still frozen (no
// CPU used over a second, exec refused), and it resumes.
func TestPausedAcrossKill9(t *testing.T) { eachRuntime(t, testPausedAcrossKill9) }

func testPausedAcrossKill9(t *testing.T, runtime string) {
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	state, addr := t.TempDir(), freeAddr(t)
	first := external(t, state, addr)
	token, err := os.ReadFile(filepath.Join(state, daemon.TokenName))
	if err != nil {
		t.Fatal(err)
	}
	k := &kilnd{t: t, state: state, addr: addr}
	tok := strings.TrimSpace(string(token))
	call := func(method, path string, out any) {
		t.Helper()
		code, b := k.do(method, path, tok, nil)
		if code >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, code, b)
		}
		if out != nil {
			json.Unmarshal(b, out)
		}
	}
	code, b := k.do("POST", "/sandboxes", tok, fmt.Sprintf(`{"runtime":%q}`, runtime))
	if code == http.StatusServiceUnavailable && runtime == sandbox.RuntimeGVisor && os.Getenv("CI") == "" {
		first.Process.Kill()
		first.Wait()
		t.Skipf("no gVisor here: %s", b)
	}
	sb := idOf(t, code, b)
	var second *exec.Cmd
	defer func() {
		if second != nil {
			call("DELETE", "/sandboxes/"+sb+"?remove_logs=true", nil)
			second.Process.Signal(syscall.SIGTERM)
			second.Wait()
		}
	}()
	code, b = k.do("POST", "/sandboxes/"+sb+"/exec-stream", tok, `{"command":"sh","args":["-c","while :; do :; done"]}`)
	if code != http.StatusOK {
		t.Fatalf("start: %d %s", code, b)
	}
	call("POST", "/sandboxes/"+sb+"/pause", nil)
	first.Process.Kill()
	first.Wait()
	second = external(t, state, addr)

	var info daemon.Info
	call("GET", "/sandboxes/"+sb, &info)
	if info.State != api.SandboxPaused {
		t.Fatalf("adopted %s, want paused", info.State)
	}
	if got := cpuUse(t, call, sb); got > pausedCPU {
		t.Errorf("adopted paused, the sandbox used %v of CPU in a second", got)
	}
	code, b = k.do("POST", "/sandboxes/"+sb+"/exec", tok, `{"command":"true"}`)
	if code != http.StatusConflict {
		t.Errorf("exec in the adopted paused sandbox: %d %s", code, b)
	}
	call("POST", "/sandboxes/"+sb+"/resume", &info)
	if info.State != api.SandboxRunning {
		t.Errorf("resumed: %s", info.State)
	}
	if got := cpuUse(t, call, sb); got < busyCPU {
		t.Errorf("resumed after the adoption, the busy loop used %v of CPU in a second", got)
	}
}

// TestPausedIdleAndTTL: a paused sandbox's idle timeout does not count,
// and counts from its resume; its ttl counts. Told by kilnd's events: a
// sandbox made after the paused one, with the same idle timeout and not
// paused, is deleted idle, and one paused with a ttl is deleted for it,
// while the paused one is not; resumed, it is deleted idle in its turn.
func TestPausedIdleAndTTL(t *testing.T) {
	// (Timeouts of seconds: each create's next request must come before
	// its timeout, on a loaded machine too.)
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	var paused, ttl, control daemon.Info
	k.json("POST", "/sandboxes", `{"idle_timeout_seconds":2}`, &paused)
	k.change(t, "pause", paused.ID)
	k.json("POST", "/sandboxes", `{"ttl_seconds":4,"idle_timeout_seconds":600}`, &ttl)
	k.change(t, "pause", ttl.ID)
	k.json("POST", "/sandboxes", `{"idle_timeout_seconds":2}`, &control)
	events := k.events(t, "?type="+api.EventDeleted)
	defer events.close()
	deleted := func(until string) map[string]string {
		t.Helper()
		reasons := map[string]string{}
		for reasons[until] == "" {
			e := events.next(t)
			reasons[e.Sandbox] = e.Reason
		}
		return reasons
	}
	want := map[string]string{control.ID: "idle for 2s", ttl.ID: "its ttl of 4s ended"}
	got := deleted(control.ID)
	if got[ttl.ID] == "" {
		maps.Copy(got, deleted(ttl.ID))
	}
	if !maps.Equal(got, want) {
		t.Fatalf("deleted %v, want %v", got, want)
	}
	// It would have been deleted with the control, which was used last
	// after it (a delete decided is a delete the resume finds).
	if code, info := k.change(t, "resume", paused.ID); code != http.StatusOK || info.State != api.SandboxRunning {
		t.Fatalf("resume: %d %+v", code, info)
	}
	if got := deleted(paused.ID); got[paused.ID] != "idle for 2s" {
		t.Errorf("resumed, deleted %v", got)
	}
}
