package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
)

// TestTop: kiln top lists what runs in the sandbox, the processes a
// process started too, with their parents, and the agent as PID 1; a
// stopped sandbox has none to list.
func TestTop(t *testing.T) {
	state := kilnd(t)
	ok := kilnOK(t, state)
	ok("sandbox", "create", "--name", "web")
	ok("sandbox", "exec-stream", "web", "--", "sh", "-c", "sleep 301 & sleep 302; wait")
	var procs []api.TopProcess
	// The shell starts its sleeps as it runs: until both are there.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		procs = nil
		if err := json.Unmarshal([]byte(ok("--json", "top", "web")), &procs); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range procs {
			if strings.HasPrefix(p.Command, "sleep 30") {
				n++
			}
		}
		if n == 2 {
			break
		}
	}
	byPID := map[int]api.TopProcess{}
	var shell api.TopProcess
	for _, p := range procs {
		byPID[p.PID] = p
		if strings.HasSuffix(p.Command, "sh -c sleep 301 & sleep 302; wait") {
			shell = p
		}
	}
	if byPID[1].PID != 1 {
		t.Errorf("no PID 1 (the agent) among %+v", procs)
	}
	if shell.PID == 0 || shell.UID != 0 || shell.RSSBytes <= 0 {
		t.Fatalf("the shell: %+v among %+v", shell, procs)
	}
	children := 0
	for _, p := range procs {
		if strings.HasPrefix(p.Command, "sleep 30") && p.PPID == shell.PID && (p.State == "S" || p.State == "R") {
			children++
		}
	}
	if children != 2 {
		t.Errorf("%d sleeps of the shell's, want 2: %+v", children, procs)
	}
	table := ok("top", "web")
	if !strings.HasPrefix(table, "PID ") || !strings.Contains(table, "sleep 302") {
		t.Errorf("kiln top web:\n%s", table)
	}
	ok("stop", "-t", "0", "web")
	if code, _, errs := kilnExe(t, state, nil, "top", "web"); code != 125 || !strings.Contains(errs, "stopped") {
		t.Errorf("kiln top of a stopped sandbox: %d %q", code, errs)
	}
}
