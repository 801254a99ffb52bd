package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/api"
)

// TestStopStartRestartCommands holds kiln stop, start and restart to
// docker's: each prints the sandboxes as they were named, a stopped
// sandbox is listed with -a only and refuses exec, its files stay, its
// processes get SIGTERM first; a sandbox not there is an error of its own
// while the others are done; --json gives the descriptions; -t out of its
// range is bad usage; the events say what happened, in order.
func TestStopStartRestartCommands(t *testing.T) {
	state := kilnd(t)
	ok := kilnOK(t, state)
	web := strings.TrimSpace(ok("sandbox", "create", "--name", "web"))
	ok("exec", "web", "sh", "-c", "echo kept > /workspace/kept")
	ok("sandbox", "exec-stream", "web", "--", "sh", "-c", `trap 'echo term > /workspace/term; exit 0' TERM; touch /workspace/ready; while :; do sleep 0.1; done`)
	ok("exec", "web", "sh", "-c", "until [ -e /workspace/ready ]; do sleep 0.01; done")

	if out := ok("stop", "-t", "30", "web"); out != "web\n" {
		t.Errorf("kiln stop web: %q", out)
	}
	if out := ok("ls", "-q"); out != "" {
		t.Errorf("kiln ls -q lists a stopped sandbox: %q", out)
	}
	if out := ok("ls", "-a", "--format", "{{.Name}} {{.State}} {{.Reason}}"); out != "web stopped stopped by request\n" {
		t.Errorf("kiln ls -a: %q", out)
	}
	if code, _, errs := kilnExe(t, state, nil, "exec", "web", "true"); code != 125 || !strings.Contains(errs, "stopped") {
		t.Errorf("kiln exec in a stopped sandbox: %d %q", code, errs)
	}
	if out := ok("stop", "web"); out != "web\n" {
		t.Errorf("kiln stop of a stopped sandbox: %q", out)
	}

	if out := ok("start", api.ShortID(web)); out != api.ShortID(web)+"\n" {
		t.Errorf("kiln start by short id: %q", out)
	}
	if out := ok("exec", "web", "cat", "/workspace/kept", "/workspace/term"); out != "kept\nterm\n" {
		t.Errorf("after the start: %q, want the file kept and the trap's SIGTERM", out)
	}
	if out := ok("start", "web"); out != "web\n" {
		t.Errorf("kiln start of a running sandbox: %q", out)
	}

	code, out, errs := kilnExe(t, state, nil, "restart", "-t", "1", "nosuch", "web")
	if code != 125 || out != "web\n" || !strings.Contains(errs, "nosuch") || strings.Count(errs, "kiln:") != 1 {
		t.Errorf("kiln restart nosuch web: %d %q %q", code, out, errs)
	}

	var stopped []api.Sandbox
	if err := json.Unmarshal([]byte(ok("--json", "sandbox", "stop", "-t", "0", "web")), &stopped); err != nil ||
		len(stopped) != 1 || stopped[0].ID != web || stopped[0].State != api.SandboxStopped {
		t.Errorf("kiln --json sandbox stop: %+v %v", stopped, err)
	}
	for _, bad := range [][]string{{"stop", "-t", "601", "web"}, {"restart", "-t", "-1", "web"}, {"stop"}, {"start"}} {
		if code, _, errs := kilnExe(t, state, nil, bad...); code != 125 || !strings.Contains(errs, "See 'kiln") {
			t.Errorf("kiln %v: %d %q, want a usage error", bad, code, errs)
		}
	}

	var types []string
	for line := range strings.Lines(ok("--json", "events", "--no-follow", "-f", "sandbox=web")) {
		var e api.Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("%v in %q", err, line)
		}
		if strings.HasPrefix(e.Type, "sandbox.") { // not its processes'
			types = append(types, e.Type)
		}
	}
	want := []string{api.EventCreated, api.EventStopped, api.EventStarted, api.EventStopped, api.EventStarted, api.EventStopped}
	if strings.Join(types, " ") != strings.Join(want, " ") {
		t.Errorf("events %v, want %v", types, want)
	}
}

// TestPauseResumeCommands holds kiln pause and resume (and unpause) to
// docker's pause and unpause: each prints the sandboxes as they were
// named; a paused sandbox is listed by kiln ls, shown paused, its running
// processes shown paused by kiln ps; exec is refused naming the state,
// and works again once it is resumed; --json gives the descriptions.
func TestPauseResumeCommands(t *testing.T) {
	state := kilnd(t)
	ok := kilnOK(t, state)
	web := strings.TrimSpace(ok("sandbox", "create", "--name", "web"))
	ok("sandbox", "exec-stream", "web", "--", "sleep", "1000")

	if out := ok("pause", "web"); out != "web\n" {
		t.Errorf("kiln pause web: %q", out)
	}
	if out := ok("ls", "--format", "{{.Name}} {{.State}}"); out != "web paused\n" {
		t.Errorf("kiln ls: %q", out)
	}
	if out := ok("ls", "-q", "-f", "status=running"); out != "" {
		t.Errorf("kiln ls -f status=running lists a paused sandbox: %q", out)
	}
	if out := ok("ps", "web"); !strings.Contains(out, " paused ") || strings.Contains(out, " running ") {
		t.Errorf("kiln ps of a paused sandbox:\n%s", out)
	}
	if code, _, errs := kilnExe(t, state, nil, "exec", "web", "true"); code != 125 || !strings.Contains(errs, "is paused") {
		t.Errorf("kiln exec in a paused sandbox: %d %q", code, errs)
	}
	if out := ok("pause", "web"); out != "web\n" {
		t.Errorf("kiln pause of a paused sandbox: %q", out)
	}
	if out := ok("unpause", api.ShortID(web)); out != api.ShortID(web)+"\n" {
		t.Errorf("kiln unpause by short id: %q", out)
	}
	if out := ok("exec", "web", "echo", "resumed"); out != "resumed\n" {
		t.Errorf("exec after the resume: %q", out)
	}
	var paused []api.Sandbox
	if err := json.Unmarshal([]byte(ok("--json", "sandbox", "pause", "web")), &paused); err != nil ||
		len(paused) != 1 || paused[0].ID != web || paused[0].State != api.SandboxPaused {
		t.Errorf("kiln --json sandbox pause: %+v %v", paused, err)
	}
	if out := ok("resume", "web"); out != "web\n" {
		t.Errorf("kiln resume web: %q", out)
	}
	if out := ok("ls", "--format", "{{.Name}} {{.State}}"); out != "web running\n" {
		t.Errorf("kiln ls after the resume: %q", out)
	}
}
