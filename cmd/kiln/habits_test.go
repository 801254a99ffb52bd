package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
)

// kilnExe runs kiln as its own process (this test binary, as kiln), with
// env added to the test's environment: what a person at a shell runs.
func kilnExe(t *testing.T, state string, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"--state-dir", state}, args...)...)
	cmd.Env = append(append(os.Environ(), asCLIEnv+"=1"), env...)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("kiln %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errs.String()
}

// kilnOK is kilnExe for a command that must succeed: its output.
func kilnOK(t *testing.T, state string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		code, out, errs := kilnExe(t, state, nil, args...)
		if code != 0 {
			t.Fatalf("kiln %v: %d %q %q", args, code, out, errs)
		}
		return out
	}
}

// TestDockerHabits holds kiln to what a Docker user types: the command's
// flags after the sandbox are the command's; -e NAME passes kiln's own,
// --env-file reads NAME=VALUE lines; errors carry one prefix; run -d
// detaches and kiln logs SANDBOX shows its command; kiln ls lists the
// running ones, -a all, -q ids, --filter and --format choose and shape.
func TestDockerHabits(t *testing.T) {
	state := kilnd(t)
	ok := kilnOK(t, state)
	web := strings.TrimSpace(ok("sandbox", "create", "--name", "web", "-l", "team=front", "--label", "tier=1"))

	if out := ok("exec", "web", "ls", "-la", "/"); !strings.Contains(out, "total") || !strings.Contains(out, "..") {
		t.Errorf("kiln exec web ls -la /: %q", out)
	}
	if out := ok("exec", "web", "--", "sh", "-c", "echo $0", "x"); out != "x\n" {
		t.Errorf("kiln exec web -- sh -c: %q", out)
	}
	if out := ok("exec", "-w", "/tmp", "-u", "65534", "web", "sh", "-c", "pwd; id -u"); out != "/tmp\n65534\n" {
		t.Errorf("-w /tmp -u 65534: %q", out)
	}

	envFile := filepath.Join(t.TempDir(), "env")
	os.WriteFile(envFile, []byte("# a comment\nA=1\n\nB=two words\nFROM_KILN\n"), 0o644)
	code, out, errs := kilnExe(t, state, []string{"FROM_KILN=passed", "UNSET_HERE="}, "exec", "--env-file", envFile, "-e", "C=3", "-e", "NOT_IN_KILN", "web",
		"sh", "-c", `echo "$A|$B|$C|$FROM_KILN|${NOT_IN_KILN-unset}"`)
	if code != 0 || out != "1|two words|3|passed|unset\n" {
		t.Errorf("--env-file and -e NAME: %d %q %q", code, out, errs)
	}

	code, _, errs = kilnExe(t, state, nil, "exec", "nosuch", "true")
	if code != 125 || errs != "kiln: not found: no sandbox \"nosuch\"\n" {
		t.Errorf("an unknown sandbox: %d %q", code, errs)
	}
	code, _, errs = kilnExe(t, state, nil, "exec", "web", "no-such-command")
	if code != 127 || strings.Count(errs, "kiln") != 1 || strings.Contains(errs, "kilnd:") {
		t.Errorf("an unknown command: %d %q", code, errs)
	}

	job := strings.TrimSpace(ok("run", "-d", "--name", "job", "-l", "team=back", "--", "sh", "-c", "echo one; echo two >&2; exit 3"))
	if !api.IsSandboxID(job) {
		t.Fatalf("run -d printed %q", job)
	}
	code, out, errs = kilnExe(t, state, nil, "logs", "-f", "job")
	if code != 3 || out != "one\n" || errs != "two\n" {
		t.Errorf("kiln logs -f job: %d %q %q", code, out, errs)
	}
	if code, _, errs := kilnExe(t, state, nil, "run", "-d", "--rm", "--", "true"); code != 125 || !strings.Contains(errs, "-d with --rm") {
		t.Errorf("run -d --rm: %d %q", code, errs)
	}

	other := strings.TrimSpace(ok("sandbox", "create"))
	ok("sandbox", "rm", other)
	short := api.ShortID
	if out := ok("ls", "-q"); out != short(web)+"\n"+short(job)+"\n" {
		t.Errorf("ls -q: %q, want web and job", out)
	}
	if out := ok("ls", "-a", "-q", "--no-trunc"); out != web+"\n"+job+"\n"+other+"\n" {
		t.Errorf("ls -a -q: %q, want the deleted one too", out)
	}
	if out := ok("ls", "-q", "--filter", "label=team=front"); out != short(web)+"\n" {
		t.Errorf("--filter label=team=front: %q", out)
	}
	if out := ok("ls", "-a", "-f", "status=deleted", "--format", "{{.ID}} {{.State}}"); out != other+" deleted\n" {
		t.Errorf("--filter status=deleted: %q", out)
	}
	if out := ok("ls", "--format", `{{.Name}}:{{index .Labels "team"}}`); out != "web:front\njob:back\n" {
		t.Errorf("--format with labels: %q", out)
	}
	if out := ok("ls", "--format", "json", "-f", "name=web"); !strings.HasPrefix(out, `{"id":"`+web+`"`) || strings.Count(out, "\n") != 1 {
		t.Errorf("--format json: %q", out)
	}
	if out := ok("ls", "--format", "yaml", "-f", "name=web"); !strings.Contains(out, "  memory_bytes: 1073741824\n") || !strings.Contains(out, "    team: front\n") {
		t.Errorf("--format yaml: %q", out)
	}
	// The short id names the sandbox, as any 4 or more of its first
	// characters do; fewer name nothing.
	if out := ok("exec", short(web), "hostname"); out != "web\n" {
		t.Errorf("exec by short id: %q", out)
	}
	if out := ok("exec", web[:4], "hostname"); out != "web\n" {
		t.Errorf("exec by 4 characters: %q", out)
	}
	if code, _, errs := kilnExe(t, state, nil, "exec", web[:3], "hostname"); code != 125 || !strings.Contains(errs, "no sandbox") {
		t.Errorf("exec by 3 characters: %d %q", code, errs)
	}
	if out := ok("sandbox", "ls", "-o", "wide"); !strings.Contains(out, "team=front,tier=1") || !strings.Contains(out, web) {
		t.Errorf("ls -o wide shows no labels: %q", out)
	}
	// A process's id is random from its first character: ps shows its
	// first 8, which (as any 4 or more) name it to every process command.
	pid := strings.TrimSpace(ok("sandbox", "exec-stream", "web", "--", "sh", "-c", "echo from-pid; exit 4"))
	// The shortest prefix of 4 or more no other process of web shares
	// (ids are random: two of a few may share 4 characters).
	var procs []api.Process
	if err := json.Unmarshal([]byte(ok("ps", "web", "--json")), &procs); err != nil {
		t.Fatal(err)
	}
	prefix := pid[:4]
	for _, p := range procs {
		for p.ID != pid && strings.HasPrefix(p.ID, prefix) {
			prefix = pid[:len(prefix)+1]
		}
	}
	if code, _, errs := kilnExe(t, state, nil, "wait", "web", prefix); code != 4 {
		t.Errorf("kiln wait web %s: %d %q", prefix, code, errs)
	}
	if out := ok("ps", "web"); !strings.Contains(out, "\n"+api.ShortProcessID(pid)+" ") || strings.Contains(out, pid) {
		t.Errorf("kiln ps shows %s as its short id %s? %q", pid, api.ShortProcessID(pid), out)
	}
	if out := ok("logs", "web", api.ShortProcessID(pid)); out != "from-pid\n" {
		t.Errorf("kiln logs web SHORT: %q", out)
	}
	if code, _, errs := kilnExe(t, state, nil, "logs", "web", pid[:3]); code != 125 || !strings.Contains(errs, "not found") {
		t.Errorf("kiln logs by 3 characters: %d %q", code, errs)
	}
	for _, bad := range [][]string{
		{"ls", "--filter", "colour=red"},
		{"ls", "--filter", "label"},
		{"ls", "--format", "{{.Nope"},
		{"sandbox", "create", "-l", "=x"},
	} {
		if code, _, errs := kilnExe(t, state, nil, bad...); code != 125 || !strings.Contains(errs, "See 'kiln") {
			t.Errorf("kiln %v: %d %q, want a usage error", bad, code, errs)
		}
	}
}

// TestEventsCommand: kiln events --no-follow prints each sandbox's
// creation and deletion with its number, short id and name; --after takes
// up after one; --json gives objects; -f sandbox= keeps one sandbox's,
// -f node= outside a cluster none.
func TestEventsCommand(t *testing.T) {
	state := kilnd(t)
	ok := kilnOK(t, state)
	web := strings.TrimSpace(ok("sandbox", "create", "--name", "web"))
	ok("sandbox", "rm", "web")
	other := strings.TrimSpace(ok("sandbox", "create"))
	lines := strings.Split(strings.TrimSpace(ok("events", "--no-follow")), "\n")
	if len(lines) != 3 || !strings.HasSuffix(lines[0], "  1  sandbox.created  "+api.ShortID(web)+" (web)") ||
		!strings.HasSuffix(lines[1], "  2  sandbox.deleted  "+api.ShortID(web)+" (web): deleted") ||
		!strings.HasSuffix(lines[2], "  3  sandbox.created  "+api.ShortID(other)) {
		t.Errorf("kiln events --no-follow:\n%s", strings.Join(lines, "\n"))
	}
	if out := ok("--json", "events", "--no-follow", "--after", "2"); !strings.HasPrefix(out, `{"seq":3,`) || strings.Count(out, "\n") != 1 {
		t.Errorf("--json --after 2: %q", out)
	}
	if out := ok("events", "--no-follow", "-f", "sandbox="+api.ShortID(other)); strings.Count(out, "\n") != 1 || !strings.Contains(out, "sandbox.created") {
		t.Errorf("-f sandbox=: %q", out)
	}
	if out := ok("events", "--no-follow", "-f", "node=n1"); out != "" {
		t.Errorf("-f node= outside a cluster: %q, want nothing", out)
	}
	if code, _, errs := kilnExe(t, state, nil, "events", "-f", "colour=red"); code != 125 || !strings.Contains(errs, "node=NODE") {
		t.Errorf("a bad filter: %d %q", code, errs)
	}
}
