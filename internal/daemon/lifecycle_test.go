package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/apitest"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/image/imagetest"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// change POSTs a stop, start or restart (verb, with its query) of
// sandbox sb, and returns the status and, with 200, the sandbox.
func (k *kilnd) change(t *testing.T, verb, sb string) (int, daemon.Info) {
	t.Helper()
	code, b := k.do("POST", "/sandboxes/"+sb+"/"+verb, k.d.Token(), nil)
	var info daemon.Info
	switch {
	case code == http.StatusOK:
		if err := json.Unmarshal(b, &info); err != nil {
			t.Fatalf("%s %s: %v in %s", verb, sb, err, b)
		}
	case code == http.StatusNotModified:
		if len(b) != 0 {
			t.Errorf("%s %s: 304 with a body: %s", verb, sb, b)
		}
	default:
		t.Fatalf("%s %s: %d %s", verb, sb, code, b)
	}
	return code, info
}

// sh runs script in sandbox sb to its end and returns its stdout; it must
// exit 0.
func (k *kilnd) sh(t *testing.T, sb, script string) string {
	t.Helper()
	b, err := json.Marshal(api.ExecRequest{Command: "sh", Args: []string{"-c", script}, TimeoutMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	code, b := k.do("POST", "/sandboxes/"+sb+"/exec", k.d.Token(), string(b))
	var res api.ExecResult
	if code != http.StatusOK || json.Unmarshal(b, &res) != nil || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("%q in %s: %d %s", script, sb, code, b)
	}
	return res.Stdout
}

// eventTypes reads the events kilnd holds of sandbox sb, the types of
// those of the sandbox itself in order.
func (k *kilnd) eventTypes(t *testing.T, sb string) []string {
	t.Helper()
	s := k.events(t, "?follow=false&sandbox="+sb)
	defer s.close()
	var out []string
	for s.lines.Scan() {
		var e api.Event
		if err := json.Unmarshal(s.lines.Bytes(), &e); err != nil {
			t.Fatalf("%v in %s", err, s.lines.Bytes())
		}
		if strings.HasPrefix(e.Type, "sandbox.") { // its processes' have tests of their own
			out = append(out, e.Type)
		}
	}
	return out
}

// untilLines is a script that waits, bounded by the exec's timeout, until
// file has n lines (its writer, the init command, runs beside the exec),
// then prints it.
func untilLines(file string, n int) string {
	return fmt.Sprintf(`until [ "$(wc -l < %[1]s 2>/dev/null)" -ge %[2]d ] 2>/dev/null; do sleep 0.01; done; cat %[1]s`, file, n)
}

// TestStopStartKeepsFilesAndRunsInitAgain: a stopped sandbox keeps its
// files, on its disk, in its directory without one, and in an image's
// writable root, and its captured logs; exec is refused while it is
// stopped; started, it is the same sandbox (id, name, hostname, labels,
// limits) with a new agent, and its init command has run again. A stop of
// a stopped one and a start of a running one are 304. The events say
// created, stopped, started, in order.
func TestStopStartKeepsFilesAndRunsInitAgain(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	reg := imagetest.StartRegistry(t)
	ref := reg.Push(t, "tools/box:v1", imagetest.Image(t, v1.Config{Env: []string{"PATH=/bin"}},
		imagetest.Busybox(t, "sh", "cat", "echo", "sleep", "wc", "test", "[", "hostname")))
	if code, b := k.do("POST", "/images/pull", k.d.Token(), api.PullImage{Ref: ref}); code != http.StatusOK {
		t.Fatalf("pull: %d %s", code, b)
	}
	init := `{"command":"sh","args":["-c","echo boot >> /workspace/boots; echo boot; exec sleep 1000"]}`
	for _, tc := range []struct {
		name, runtime, create string
		// kept is a file written before the stop, outside /workspace
		// (in an image's writable root), if any.
		kept string
	}{
		{name: "disk", runtime: sandbox.RuntimeNamespaces, create: `"limits":{"disk_bytes":67108864}`},
		{name: "no disk", runtime: sandbox.RuntimeNamespaces, create: `"limits":{"disk_bytes":0}`},
		{name: "image", runtime: sandbox.RuntimeNamespaces, create: `"image":"` + ref + `","limits":{"disk_bytes":67108864}`, kept: "/kept"},
		{name: "gvisor disk", runtime: sandbox.RuntimeGVisor, create: `"limits":{"disk_bytes":67108864}`},
		{name: "gvisor no disk", runtime: sandbox.RuntimeGVisor, create: `"limits":{"disk_bytes":0}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := fmt.Sprintf(`{"name":"sb-%d","runtime":%q,"labels":{"team":"web"},"hostname":"box","init":%s,%s}`, time.Now().UnixNano(), tc.runtime, init, tc.create)
			code, b := k.do("POST", "/sandboxes", k.d.Token(), body)
			if code == http.StatusServiceUnavailable && tc.runtime == sandbox.RuntimeGVisor && os.Getenv("CI") == "" {
				t.Skipf("no gVisor here: %s", b)
			}
			var created daemon.Info
			if code != http.StatusCreated || json.Unmarshal(b, &created) != nil {
				t.Fatalf("create: %d %s", code, b)
			}
			id := created.ID
			if got := k.sh(t, id, untilLines("/workspace/boots", 1)); got != "boot\n" {
				t.Fatalf("the first boot: %q", got)
			}
			k.sh(t, id, "echo kept > /workspace/kept")
			if tc.kept != "" {
				k.sh(t, id, "echo kept > "+tc.kept)
			}

			_, stopped := k.change(t, "stop?timeout=5", id)
			if stopped.State != daemon.StateStopped || stopped.Reason != "stopped by request" || stopped.StoppedAt == nil || stopped.AgentPID != 0 {
				t.Errorf("stopped: %+v", stopped)
			}
			if code, _ := k.change(t, "stop", id); code != http.StatusNotModified {
				t.Errorf("a stop of a stopped sandbox: %d, want 304", code)
			}
			k.refuses("POST", "/sandboxes/"+id+"/exec", `{"command":"true"}`, http.StatusPreconditionFailed, api.CodePrecondition, "stopped", "stopped by request")
			if created.Image != "" {
				// It starts from its image: kept while it is stopped.
				k.refuses("DELETE", "/images/"+created.Image, nil, http.StatusPreconditionFailed, api.CodePrecondition, "in use")
			}

			_, started := k.change(t, "start", id)
			if started.State != daemon.StateRunning || started.AgentPID == 0 || started.AgentPID == created.AgentPID || started.Reason != "" || started.StoppedAt != nil || started.Exit != nil {
				t.Errorf("started: %+v, created %+v", started, created)
			}
			if started.ID != id || started.Name != created.Name || started.Hostname != "box" || started.Labels["team"] != "web" ||
				started.Limits != created.Limits || started.Runtime != tc.runtime || !started.CreatedAt.Equal(created.CreatedAt) || started.Image != created.Image {
				t.Errorf("started as another: %+v, created %+v", started, created)
			}
			if code, _ := k.change(t, "start", id); code != http.StatusNotModified {
				t.Errorf("a start of a running sandbox: %d, want 304", code)
			}
			if got := k.sh(t, id, "hostname; cat /workspace/kept"); got != "box\nkept\n" {
				t.Errorf("after the start: %q", got)
			}
			if tc.kept != "" {
				if got := k.sh(t, id, "cat "+tc.kept); got != "kept\n" {
					t.Errorf("%s after the start: %q", tc.kept, got)
				}
			}
			// The init command ran again, and each run's output is kept.
			if got := k.sh(t, id, untilLines("/workspace/boots", 2)); got != "boot\nboot\n" {
				t.Errorf("boots: %q", got)
			}
			var logs []daemon.CapturedLog
			k.json("GET", "/sandboxes/"+id+"/logs", nil, &logs)
			if len(logs) != 2 {
				t.Fatalf("captured logs: %+v", logs)
			}
			first := logs[0].Process
			if logs[1].Runs[0].ID < logs[0].Runs[0].ID {
				first = logs[1].Process // run ids are UUIDv7s: the older is the lesser
			}
			if code, b := k.do("GET", "/sandboxes/"+id+"/logs/"+first, k.d.Token(), nil); code != 200 || string(b) != "boot\n" {
				t.Errorf("the first init's log: %d %q", code, b)
			}
			if got, want := k.eventTypes(t, id), []string{api.EventCreated, api.EventStopped, api.EventStarted}; !equal(got, want) {
				t.Errorf("events %v, want %v", got, want)
			}
			// A restart of a running sandbox stops and starts it.
			if _, again := k.change(t, "restart?timeout=1", id); again.State != daemon.StateRunning || again.AgentPID == started.AgentPID {
				t.Errorf("restarted: %+v", again)
			}
			if got := k.sh(t, id, untilLines("/workspace/boots", 3)); got != "boot\nboot\nboot\n" {
				t.Errorf("boots after the restart: %q", got)
			}
			if got, want := k.eventTypes(t, id), []string{api.EventCreated, api.EventStopped, api.EventStarted, api.EventStopped, api.EventStarted}; !equal(got, want) {
				t.Errorf("events %v, want %v", got, want)
			}
			k.json("DELETE", "/sandboxes/"+id+"?remove_logs=true", nil, nil)
		})
	}
}

func equal(a, b []string) bool { return strings.Join(a, " ") == strings.Join(b, " ") }

// lastLine reports whether out's last line is line. Before it, sh may or
// may not say its sleep was terminated: the signal can find sh between
// two sleeps.
func lastLine(out, line string) bool {
	return out == line+"\n" || strings.HasSuffix(out, "\n"+line+"\n")
}

// TestStopSignalsThenKills: a stop sends SIGTERM to every process: one
// that exits on it ends the stop at once, long before its timeout; one
// that takes it and runs on is killed once the timeout has passed, not
// before. What their traps wrote is there after the start.
func TestStopSignalsThenKills(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	// A trap installed, then a file that says so; the stop is taken once
	// both are there.
	const exits = `trap 'echo term > /workspace/exits; exit 0' TERM; touch /workspace/exits-ready; while :; do sleep 0.1; done`
	const stays = `trap 'echo term > /workspace/stays' TERM; touch /workspace/stays-ready; while :; do sleep 0.1; done`
	ready := func(t *testing.T, sb string, names ...string) {
		t.Helper()
		for _, n := range names {
			k.sh(t, sb, fmt.Sprintf("until [ -e /workspace/%s-ready ]; do sleep 0.01; done", n))
		}
	}
	// watch watches process pid of sb, from before the stop, to its end:
	// the exit it is told is the one the stop caused.
	watch := func(t *testing.T, sb, pid string) <-chan string {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), faultDeadline)
		c, _, err := websocket.Dial(ctx, "ws://"+k.addr+"/sandboxes/"+sb+"/exec-stream/"+pid+"/logs",
			&websocket.DialOptions{Subprotocols: []string{api.TokenProtocolPrefix + k.d.Token()}})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		out := make(chan string, 1)
		go func() {
			defer cancel()
			defer c.CloseNow()
			got, err := apitest.ReadRaw(ctx, c)
			if err != nil {
				got += err.Error()
			}
			out <- got
		}()
		return out
	}

	t.Run("exits on TERM", func(t *testing.T) {
		sb := k.sandbox()
		pid := k.faultStart(sb, api.ExecRequest{Command: "sh", Args: []string{"-c", exits}})
		ready(t, sb, "exits")
		exited := watch(t, sb, pid)
		// A timeout of 10 minutes; an answer within one proves the stop
		// did not wait it out.
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+k.addr+"/sandboxes/"+sb+"/stop?timeout=600", nil)
		req.Header.Set("Authorization", "Bearer "+k.d.Token())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("a stop of a sandbox whose processes exit on SIGTERM: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stop: %d", resp.StatusCode)
		}
		if got := <-exited; !lastLine(got, "[process exited with code 0]") {
			t.Errorf("the process that exits on SIGTERM: %q", got)
		}
		k.change(t, "start", sb)
		if got := k.sh(t, sb, "cat /workspace/exits"); got != "term\n" {
			t.Errorf("its trap wrote %q", got)
		}
	})

	t.Run("runs on", func(t *testing.T) {
		sb := k.sandbox()
		pExits := k.faultStart(sb, api.ExecRequest{Command: "sh", Args: []string{"-c", exits}})
		pStays := k.faultStart(sb, api.ExecRequest{Command: "sh", Args: []string{"-c", stays}})
		ready(t, sb, "exits", "stays")
		exited, killed := watch(t, sb, pExits), watch(t, sb, pStays)
		const grace = 2 * time.Second
		began := time.Now()
		k.change(t, fmt.Sprintf("stop?timeout=%d", grace/time.Second), sb)
		if took := time.Since(began); took < grace {
			t.Errorf("the stop took %v: a process that runs on is killed only after the timeout, %v", took, grace)
		}
		if got := <-exited; !lastLine(got, "[process exited with code 0]") {
			t.Errorf("the process that exits on SIGTERM: %q", got)
		}
		if got := <-killed; !lastLine(got, "[process killed by signal KILL]") {
			t.Errorf("the process that runs on after SIGTERM: %q, want killed by SIGKILL", got)
		}
		k.change(t, "start", sb)
		if got := k.sh(t, sb, "cat /workspace/exits /workspace/stays"); got != "term\nterm\n" {
			t.Errorf("their traps wrote %q", got)
		}
	})
}

// TestStopStartRefusals: a stop's timeout out of its range, or a
// parameter neither takes, is refused 400 naming it and the range; a
// sandbox not there, or deleted, is 404.
func TestStopStartRefusals(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	for _, q := range []string{"timeout=-1", "timeout=601", "timeout=1.5", "timeout=ten", "timeout="} {
		k.refuses("POST", "/sandboxes/"+sb+"/stop?"+q, nil, 400, api.CodeInvalid, "timeout", "0 to 600")
		k.refuses("POST", "/sandboxes/"+sb+"/restart?"+q, nil, 400, api.CodeInvalid, "timeout", "0 to 600")
	}
	k.refuses("POST", "/sandboxes/"+sb+"/stop?t=5", nil, 400, api.CodeInvalid, `"t"`, "timeout")
	k.refuses("POST", "/sandboxes/"+sb+"/start?timeout=5", nil, 400, api.CodeInvalid, `"timeout"`)
	var info daemon.Info
	k.json("GET", "/sandboxes/"+sb, nil, &info)
	if info.State != daemon.StateRunning {
		t.Errorf("after refusals, the sandbox is %s", info.State)
	}
	for _, verb := range []string{"stop", "start", "restart"} {
		k.refuses("POST", "/sandboxes/nosuch/"+verb, nil, 404, api.CodeNotFound, "nosuch")
	}
	k.json("DELETE", "/sandboxes/"+sb, nil, nil)
	for _, verb := range []string{"stop", "start", "restart"} {
		k.refuses("POST", "/sandboxes/"+sb+"/"+verb, nil, 404, api.CodeNotFound)
	}
}

// TestStoppedStaysStoppedAcrossKilndRestart: a new kilnd finds a stopped
// sandbox stopped, for the same reason, and starts it, its files kept;
// the per-state gauges count it where it is.
func TestStoppedStaysStoppedAcrossKilndRestart(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	sb := k.sandbox()
	k.sh(t, sb, "echo kept > /workspace/kept")
	k.change(t, "stop?timeout=0", sb)
	body := k.scrape()
	for state, want := range map[string]float64{"running": 0, "stopped": 1} {
		if v, _ := sample(body, "kilnd_sandboxes", `state="`+state+`"`); v != want {
			t.Errorf("kilnd_sandboxes{state=%q} %v, want %v", state, v, want)
		}
	}
	k.stop()

	k2 := start(t, k.state)
	defer k2.cleanup()
	var info daemon.Info
	k2.json("GET", "/sandboxes/"+sb, nil, &info)
	if info.State != daemon.StateStopped || info.Reason != "stopped by request" {
		t.Errorf("after kilnd's restart: %+v", info)
	}
	k2.change(t, "start", sb)
	if got := k2.sh(t, sb, "cat /workspace/kept"); got != "kept\n" {
		t.Errorf("after the start: %q", got)
	}
	body = k2.scrape()
	for state, want := range map[string]float64{"running": 1, "stopped": 0} {
		if v, _ := sample(body, "kilnd_sandboxes", `state="`+state+`"`); v != want {
			t.Errorf("kilnd_sandboxes{state=%q} %v, want %v", state, v, want)
		}
	}
}

// TestStartInterruptedByKilndRestart: a start records the sandbox
// running before it makes the new instance; kilnd gone before that
// instance was recorded, the next kilnd finds no agent, stops the
// sandbox, and it starts again.
func TestStartInterruptedByKilndRestart(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	sb := k.sandbox()
	k.sh(t, sb, "echo kept > /workspace/kept")
	k.change(t, "stop?timeout=0", sb)
	k.stop()
	// What a start leaves when kilnd dies before the new agent runs: the
	// record running, the stopped instance's state in it.
	path := filepath.Join(k.state, "sandboxes", sb, "sandbox.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	rec["state"] = daemon.StateRunning
	delete(rec, "stopped_at")
	delete(rec, "reason")
	if b, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}

	k2 := start(t, k.state)
	defer k2.cleanup()
	var info daemon.Info
	k2.json("GET", "/sandboxes/"+sb, nil, &info)
	if info.State != daemon.StateStopped || !strings.Contains(info.Reason, "the agent was gone when kilnd started") {
		t.Errorf("after kilnd's restart: %+v", info)
	}
	k2.change(t, "start", sb)
	if got := k2.sh(t, sb, "cat /workspace/kept"); got != "kept\n" {
		t.Errorf("after the start: %q", got)
	}
}

// TestStartAfterTheInitEnded: a sandbox that stopped by itself, its init
// command having exited, starts again as a stopped one does, and its
// init command runs again on the files the first run left.
func TestStartAfterTheInitEnded(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	events := k.events(t, "?type="+api.EventStopped)
	defer events.close()
	var info daemon.Info
	k.json("POST", "/sandboxes", `{"init":{"command":"sh","args":["-c","echo run >> /workspace/runs; [ $(wc -l < /workspace/runs) -ge 2 ] && exec sleep 1000; exit 3"]}}`, &info)
	if e := events.next(t); e.Sandbox != info.ID || e.Exit == nil || e.Exit.ExitCode == nil || *e.Exit.ExitCode != 3 {
		t.Fatalf("stopped: %+v", e)
	}
	_, started := k.change(t, "start", info.ID)
	if started.State != daemon.StateRunning || started.Exit != nil {
		t.Errorf("started: %+v", started)
	}
	// The start answers once the agent does; the init command's line
	// may come a moment later, and then no other.
	if got := k.sh(t, info.ID, "until [ $(wc -l < /workspace/runs) -ge 2 ]; do sleep 0.01; done; cat /workspace/runs"); got != "run\nrun\n" {
		t.Errorf("runs: %q", got)
	}
}

// TestStartPastItsTTL: a stopped sandbox is not deleted by its ttl, and
// not started past it (its ttl counts from its creation), saying why.
func TestStartPastItsTTL(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	var info daemon.Info
	k.json("POST", "/sandboxes", `{"ttl_seconds":5}`, &info)
	k.change(t, "stop?timeout=0", info.ID)
	time.Sleep(time.Until(info.CreatedAt.Add(5 * time.Second)))
	k.refuses("POST", "/sandboxes/"+info.ID+"/start", nil, http.StatusPreconditionFailed, api.CodePrecondition, "ttl of 5s ended")
	k.json("GET", "/sandboxes/"+info.ID, nil, &info)
	if info.State != daemon.StateStopped {
		t.Errorf("past its ttl, stopped: %s", info.State)
	}
}

// TestDeleteCutsAStopShort: a delete during a stop's timeout kills what
// runs on at once; the stop answers that the sandbox was deleted.
func TestDeleteCutsAStopShort(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	// Without a disk the workspace is in its directory, where the test
	// sees the trap's file.
	var info daemon.Info
	k.json("POST", "/sandboxes", `{"limits":{"disk_bytes":0}}`, &info)
	sb := info.ID
	k.faultStart(sb, api.ExecRequest{Command: "sh", Args: []string{"-c", `trap 'echo term > /workspace/term' TERM; touch /workspace/ready; while :; do sleep 0.1; done`}})
	k.sh(t, sb, "until [ -e /workspace/ready ]; do sleep 0.01; done")
	stopped := make(chan int, 1)
	go func() {
		code, _ := k.do("POST", "/sandboxes/"+sb+"/stop?timeout=600", k.d.Token(), nil)
		stopped <- code
	}()
	// The trap has run: the stop's SIGTERM was sent, its timeout runs.
	term := filepath.Join(k.state, "sandboxes", sb, "workspace", "term")
	deadline := time.Now().Add(faultDeadline)
	for {
		if b, _ := os.ReadFile(term); string(b) == "term\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stop's SIGTERM did not come")
		}
		time.Sleep(10 * time.Millisecond)
	}
	k.json("DELETE", "/sandboxes/"+sb, nil, nil)
	select {
	case code := <-stopped:
		if code != http.StatusNotFound {
			t.Errorf("the stop cut short by a delete: %d, want 404", code)
		}
	case <-time.After(time.Minute):
		t.Fatal("the stop waited out its timeout despite the delete")
	}
	if got := k.eventTypes(t, sb); !equal(got, []string{api.EventCreated, api.EventDeleted}) {
		t.Errorf("events %v", got)
	}
}

// TestStartAfterOutOfMemory: a sandbox that ended out of memory (on_oom
// end_sandbox, the default) keeps its files, and starts again on them.
func TestStartAfterOutOfMemory(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	var info daemon.Info
	k.json("POST", "/sandboxes", fmt.Sprintf(`{"limits":{"memory_bytes":%d}}`, 128<<20), &info)
	events := k.events(t, "?type="+api.EventStopped+"&sandbox="+info.ID)
	defer events.close()
	k.sh(t, info.ID, "echo kept > /workspace/kept")
	// Answered with its process's kill, or the sandbox's end: either way
	// the event says how it ended.
	k.do("POST", "/sandboxes/"+info.ID+"/exec", k.d.Token(), api.ExecRequest{Command: "sh", Args: []string{"-c", memoryHogs[0].script}})
	if e := events.next(t); !strings.HasPrefix(e.Reason, "out of memory") {
		t.Fatalf("stopped: %+v", e)
	}
	_, started := k.change(t, "start", info.ID)
	if started.State != daemon.StateRunning || started.Reason != "" {
		t.Errorf("started: %+v", started)
	}
	if got := k.sh(t, info.ID, "cat /workspace/kept"); got != "kept\n" {
		t.Errorf("after the start: %q", got)
	}
}
