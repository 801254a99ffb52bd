package daemon_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
)

// scrape reads kilnd's metrics.
func (k *kilnd) scrape() []byte {
	k.t.Helper()
	code, b := k.do("GET", "/metrics", k.d.Token(), nil)
	if code != http.StatusOK {
		k.t.Fatalf("metrics: %d %s", code, b)
	}
	return b
}

// sample finds the value of the series name whose labels include every
// pair of labels ("key=\"value\""), and whether there is one.
func sample(body []byte, name string, labels ...string) (float64, bool) {
	for line := range strings.Lines(string(body)) {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || !strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ") {
			continue
		}
		set, value := "", rest
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			set, value = rest[1:end], rest[end+1:]
		}
		have := strings.Split(set, ",")
		all := true
		for _, l := range labels {
			all = all && slices.Contains(have, l)
		}
		if !all {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err == nil {
			return v, true
		}
	}
	return 0, false
}

// awaitSample scrapes until the series is there with a value that ok
// accepts, bounded by faultDeadline, and returns the scrape.
func (k *kilnd) awaitSample(what string, ok func(float64) bool, name string, labels ...string) []byte {
	k.t.Helper()
	deadline := time.Now().Add(faultDeadline)
	for {
		body := k.scrape()
		if v, found := sample(body, name, labels...); found && ok(v) {
			return body
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("%s: not within %v; %s", what, faultDeadline, grepLines(body, name))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSandboxMetrics: while a sandbox holds 60 MB, a scrape shows its
// memory, CPU time and tasks; an out-of-memory kill in a limited sandbox
// counts; a watcher's WebSocket is counted while it is open; every label
// but sandbox is free of ids; and promtool finds nothing wrong.
func TestSandboxMetrics(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	var big, small api.Sandbox
	k.json("POST", "/sandboxes", api.CreateSandbox{}, &big)
	k.json("POST", "/sandboxes", api.CreateSandbox{Limits: api.LimitsRequest{MemoryBytes: new(int64(32 << 20))}, OnOOM: api.OnOOMKillProcess}, &small)
	bigLabel, smallLabel := `sandbox="`+big.ID+`"`, `sandbox="`+small.ID+`"`

	// tail keeps its input's last lines, here all of it, until the input ends: 60 MB, held while
	// the sleep keeps the pipe open.
	holder := k.faultStart(big.ID, api.ExecRequest{Command: "sh", Args: []string{"-c", "(head -c 60M /dev/zero; exec sleep 600) | tail >/dev/null"}})
	body := k.awaitSample("60 MB held", func(v float64) bool { return v > 55<<20 }, "kilnd_sandbox_memory_bytes", bigLabel)
	if v, ok := sample(body, "kilnd_sandbox_memory_peak_bytes", bigLabel); !ok || v < 55<<20 {
		t.Errorf("peak memory %v (%v), want at least 55 MiB", v, ok)
	}
	if v, ok := sample(body, "kilnd_sandbox_memory_limit_bytes", bigLabel); !ok || v != float64(big.Limits.MemoryBytes) {
		t.Errorf("memory limit %v (%v), want %d", v, ok, big.Limits.MemoryBytes)
	}
	if v, ok := sample(body, "kilnd_sandbox_cpu_seconds_total", bigLabel); !ok || v <= 0 {
		t.Errorf("cpu seconds %v (%v), want some", v, ok)
	}
	if v, ok := sample(body, "kilnd_sandbox_pids", bigLabel); !ok || v < 3 { // sh, sleep, tail
		t.Errorf("pids %v (%v), want at least 3", v, ok)
	}
	if v, ok := sample(body, "kilnd_sandbox_oom_kills_total", smallLabel); !ok || v != 0 {
		t.Errorf("OOM kills before any: %v (%v)", v, ok)
	}

	// More than the limit: the kernel kills tail.
	hog := k.faultStart(small.ID, api.ExecRequest{Command: "sh", Args: []string{"-c", "head -c 100M /dev/zero | tail >/dev/null"}})
	k.awaitSample("an OOM kill counted", func(v float64) bool { return v >= 1 }, "kilnd_sandbox_oom_kills_total", smallLabel)
	k.faultWait(small.ID, hog)

	// A watcher of the holder's output, counted while it is open.
	ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+k.addr+"/sandboxes/"+big.ID+"/exec-stream/"+holder+"/logs",
		&websocket.DialOptions{Subprotocols: []string{api.TokenProtocolPrefix + k.d.Token()}})
	if err != nil {
		t.Fatal(err)
	}
	body = k.scrape()
	for _, want := range []struct {
		name   string
		labels []string
	}{
		{"kilnd_api_request_duration_seconds_count", []string{`route="/sandboxes/{id}/exec-stream/"`, `method="GET"`, `code="101"`}},
		{"kilnd_relayed_websockets", []string{`kind="output"`}},
		{"kilnd_relayed_websockets_opened_total", []string{`kind="output"`}},
	} {
		if v, ok := sample(body, want.name, want.labels...); !ok || v != 1 {
			t.Errorf("with one watcher open, %s%v = %v (%v), want 1", want.name, want.labels, v, ok)
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
	k.awaitSample("the watcher gone", func(v float64) bool { return v == 0 }, "kilnd_relayed_websockets", `kind="output"`)

	k.json("GET", "/sandboxes/"+big.ID, nil, nil)
	k.do("BREW", "/sandboxes/"+big.ID, k.d.Token(), nil) // a method of a client's making
	k.do("GET", "/sandboxes/"+big.ID, "", nil)           // refused before routing: no token
	body = k.scrape()
	if v, ok := sample(body, "kilnd_api_request_duration_seconds_count", `route="none"`, `method="OTHER"`, `code="405"`); !ok || v != 1 {
		t.Errorf("a BREW answered %v times (%v): %s", v, ok, grepLines(body, `method="OTHER"`))
	}
	if v, ok := sample(body, "kilnd_api_request_duration_seconds_count", `route="none"`, `method="GET"`, `code="401"`); !ok || v != 1 {
		t.Errorf("a GET without a token answered %v times (%v)", v, ok)
	}
	if v, ok := sample(body, "kilnd_processes_started_total", `kind="exec_stream"`); !ok || v != 2 {
		t.Errorf("processes started %v (%v), want 2", v, ok)
	}
	if v, ok := sample(body, "kilnd_api_request_duration_seconds_count", `route="GET /sandboxes/{id}"`, `method="GET"`, `code="200"`); !ok || v < 1 {
		t.Errorf("GET /sandboxes/{id} answered %v times (%v)", v, ok)
	}
	if !regexp.MustCompile(`(?m)^kilnd_build_info\{goversion="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`).Match(body) {
		t.Errorf("no build info: %s", grepLines(body, "kilnd_build_info"))
	}
	// No id in a label but sandbox's: routes are patterns, not paths.
	ids := []string{big.ID, small.ID, holder, hog}
	for line := range strings.Lines(string(body)) {
		line = strings.NewReplacer(bigLabel, "", smallLabel, "").Replace(line)
		for _, id := range ids {
			if strings.Contains(line, id) {
				t.Errorf("an id outside the sandbox label: %s", line)
			}
		}
	}
	k.json("DELETE", "/sandboxes/"+big.ID+"/exec-stream/"+holder, nil, nil)
	k.faultWait(big.ID, holder)
	promtoolCheck(t, body)

	// A stopped sandbox has no series.
	k.json("DELETE", "/sandboxes/"+small.ID, nil, nil)
	if _, ok := sample(k.scrape(), "kilnd_sandbox_cpu_seconds_total", smallLabel); ok {
		t.Error("a deleted sandbox still has series")
	}
}

// promtoolCheck holds a scrape to promtool's checks, its lint included.
// Without promtool the check is skipped, unless in CI.
func promtoolCheck(t *testing.T, body []byte) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is not installed (Debian's prometheus package)")
		}
		t.Log("promtool is not installed: the scrape is not checked")
		return
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestAgentCountsMetrics: what a sandbox's agent counts reaches the scrape
// and the stats answer: processes by how they ended, what a captured log
// kept, and what a watcher that came late was told it lost, exactly.
func TestAgentCountsMetrics(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	sb := k.sandbox()
	label := `sandbox="` + sb + `"`
	for _, req := range []api.ExecRequest{
		{Command: "sh", Args: []string{"-c", "head -c 5M /dev/urandom > /workspace/five; sync"}},
		{Command: "true"},
		{Command: "sh", Args: []string{"-c", "exit 3"}},
		{Command: "echo", Args: []string{"hello"}, Capture: true},
	} {
		k.faultWait(sb, k.faultStart(sb, req))
	}
	sleeper := k.faultStart(sb, api.ExecRequest{Command: "sleep", Args: []string{"600"}})
	k.json("DELETE", "/sandboxes/"+sb+"/exec-stream/"+sleeper, nil, nil)
	k.faultWait(sb, sleeper)
	// 16 MiB nobody reads: the ring keeps its last MiB; a reader after the
	// exit is told of the rest as a gap.
	const written = 16 << 20
	flood := k.faultStart(sb, api.ExecRequest{Command: "head", Args: []string{"-c", strconv.Itoa(written), "/dev/zero"}})
	k.faultWait(sb, flood)
	code, out := k.do("GET", "/sandboxes/"+sb+"/exec-stream/"+flood+"/logs", k.d.Token(), nil)
	got := int64(bytes.Count(out, []byte{0}))
	if code != 200 || got == 0 || got >= written {
		t.Fatalf("a late reader: %d, %d bytes of output", code, got)
	}

	body := k.awaitSample("six processes finished", func(v float64) bool { return v == 4 }, "kilnd_sandbox_processes_exited_total", label, `outcome="exit_zero"`)
	// The sandbox's own disk (kilnd's default quota), 5 MiB written on it.
	var info api.Sandbox
	k.json("GET", "/sandboxes/"+sb, nil, &info)
	quota := float64(info.Limits.DiskBytes)
	if v, ok := sample(body, "kilnd_sandbox_disk_size_bytes", label); !ok || v <= quota/2 || v > quota {
		t.Errorf("disk size %v (%v), want about the quota %v", v, ok, quota)
	}
	if v, ok := sample(body, "kilnd_sandbox_disk_used_bytes", label); !ok || v < 5<<20 {
		t.Errorf("disk used %v (%v), want at least the 5 MiB written", v, ok)
	}
	for _, want := range []struct {
		name   string
		labels []string
		v      float64
	}{
		{"kilnd_sandbox_processes_started_total", nil, 6},
		{"kilnd_sandbox_processes_exited_total", []string{`outcome="exit_nonzero"`}, 1},
		{"kilnd_sandbox_processes_exited_total", []string{`outcome="signal"`}, 1},
		{"kilnd_sandbox_capture_written_bytes_total", nil, float64(len("hello\n"))},
		{"kilnd_sandbox_capture_dropped_bytes_total", nil, 0},
		{"kilnd_sandbox_watchers_attached_total", nil, 1},
		{"kilnd_sandbox_watcher_gaps_total", nil, 1},
		{"kilnd_sandbox_watcher_lost_bytes_total", nil, float64(written - got)},
	} {
		if v, ok := sample(body, want.name, append([]string{label}, want.labels...)...); !ok || v != want.v {
			t.Errorf("%s%v = %v (%v), want %v", want.name, want.labels, v, ok, want.v)
		}
	}
	promtoolCheck(t, body)

	var st api.SandboxStats
	k.json("GET", "/sandboxes/"+sb+"/stats", nil, &st)
	want := api.AgentCounts{ProcessesStarted: 6, ExitedZero: 4, ExitedNonZero: 1, Signaled: 1, CaptureWrittenBytes: 6,
		WatchersAttached: 1, WatcherGaps: 1, WatcherLostBytes: written - got}
	if st.Counts == nil || st.Counts.DiskUsedBytes == nil || st.Counts.DiskSizeBytes == nil || *st.Counts.DiskUsedBytes < 5<<20 {
		t.Fatalf("stats counts %+v: no disk use, or less than was written", st.Counts)
	}
	st.Counts.DiskUsedBytes, st.Counts.DiskSizeBytes = nil, nil
	if *st.Counts != want {
		t.Errorf("stats counts %+v, want %+v", *st.Counts, want)
	}
}
