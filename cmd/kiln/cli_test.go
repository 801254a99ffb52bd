package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sandkiln/sandkiln/internal/image/imagetest"
	"github.com/sandkiln/sandkiln/internal/roles"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
)

func TestMain(m *testing.M) {
	roles.PlayIfReexecuted()
	daemontest.NoRaceExitSleep()
	// The terminal test runs this binary as kiln itself, under tmux.
	if os.Getenv(asCLIEnv) != "" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

const asCLIEnv = "KILN_TEST_AS_CLI"

// kilnd serves a fresh state directory for the test.
func kilnd(t *testing.T) string {
	t.Helper()
	return kilndOf(t).State
}

// kilndOf is kilnd, the daemon itself.
func kilndOf(t *testing.T) *daemontest.Kilnd {
	t.Helper()
	return daemontest.StartT(t, "")
}

// kiln runs the command line and returns its exit code and output.
func kiln(t *testing.T, state string, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errs bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	code := run(ctx, append([]string{"--state-dir", state}, args...), strings.NewReader(stdin), &out, &errs)
	return code, out.String(), errs.String()
}

func TestRunExitsWithTheProcessCode(t *testing.T) {
	state := kilnd(t)
	code, out, errs := kiln(t, state, "", "run", "--rm", "--", "sh", "-c", "echo hello; echo oops >&2; exit 7")
	if code != 7 || out != "hello\n" || errs != "oops\n" {
		t.Errorf("run: code %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, _ = kiln(t, state, "", "run", "--rm", "--", "sh", "-c", "kill -TERM $$")
	if code != 128+15 {
		t.Errorf("killed by TERM: code %d (%q)", code, out)
	}
}

func TestSandboxLifecycleAndLogs(t *testing.T) {
	state := kilnd(t)
	code, out, errs := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	if code != 0 || !api.IsSandboxID(sb) {
		t.Fatalf("create: %d %q %q", code, out, errs)
	}
	code, out, _ = kiln(t, state, "", "sandbox", "exec-stream", "--capture", sb, "--", "sh", "-c", "echo one; echo two >&2; exit 4")
	p := strings.TrimSpace(out)
	if code != 0 || len(p) != 36 {
		t.Fatalf("exec-stream: %d %q", code, out)
	}
	if code, out, errs := kiln(t, state, "", "logs", "-f", sb, p); code != 4 || out != "one\n" || errs != "two\n" {
		t.Errorf("logs -f: %d %q %q", code, out, errs)
	}
	if code, _, _ := kiln(t, state, "", "wait", sb, p); code != 4 {
		t.Errorf("wait: %d", code)
	}
	code, out, _ = kiln(t, state, "", "--json", "ps", sb)
	var procs []api.Process
	if code != 0 || json.Unmarshal([]byte(out), &procs) != nil || len(procs) != 1 || procs[0].ID != p {
		t.Errorf("ps --json: %d %q", code, out)
	}
	code, out, _ = kiln(t, state, "", "sandbox", "ls")
	if code != 0 || !strings.HasPrefix(out, "ID ") || !strings.Contains(out, api.ShortID(sb)) || !strings.Contains(out, "running") {
		t.Errorf("ls: %d %q", code, out)
	}
	if code, out, _ := kiln(t, state, "", "exec", sb, "--", "sh", "-c", "cat; exit 5"); code != 5 || out != "" {
		t.Errorf("exec: %d %q", code, out)
	}
	// Once the sandbox is gone, logs come from the captured log.
	if code, _, errs := kiln(t, state, "", "sandbox", "rm", sb); code != 0 {
		t.Fatalf("rm: %d %q", code, errs)
	}
	if code, out, errs := kiln(t, state, "", "logs", "--stdout", sb, p); code != 0 || out != "one\n" || errs != "" {
		t.Errorf("logs after rm: %d %q %q", code, out, errs)
	}
	code, out, errs = kiln(t, state, "", "logs", "--timestamps", sb, p)
	stamp, text, _ := strings.Cut(strings.TrimSpace(out), " ")
	if _, err := time.Parse(time.RFC3339Nano, stamp); code != 0 || err != nil || text != "one" || !strings.Contains(errs, " two\n") {
		t.Errorf("logs --timestamps: %d %q %q", code, out, errs)
	}
}

func TestAttachWithStdin(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	_, out, _ = kiln(t, state, "", "sandbox", "exec-stream", "-i", sb, "--", "cat")
	p := strings.TrimSpace(out)
	if code, out, errs := kiln(t, state, "typed\nlines\n", "attach", "-i", sb, p); code != 0 || out != "typed\nlines\n" {
		t.Errorf("attach -i: %d %q %q", code, out, errs)
	}
}

func TestHelpAndErrors(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"run", "--help"}, {"logs", "--help"}, {"sandbox", "create", "--help"}} {
		var out, errs bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(""), &out, &errs); code != 0 || !strings.Contains(out.String(), "Usage:") {
			t.Errorf("%v: %d %q", args, code, errs.String())
		}
	}
	// The exit codes of errors: TestExitCodes.
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, strings.NewReader(""), &out, &errs); code != 0 || !strings.Contains(out.String(), "127  the command was not found") {
		t.Errorf("kiln --help does not say the exit codes: %d %q", code, out.String())
	}
}

// TestShellInATerminal drives kiln shell in a real terminal (tmux): the
// sandbox's shell gets the window's size and follows its changes, runs
// what is typed, and its exit code is kiln's.
func TestShellInATerminal(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	tm := newTmux(t, state, "shell", sb)
	tm.screen("#")
	tm.keys("echo $((6*7)); stty size", "Enter")
	tm.screen("42")
	tm.screen("30 100")
	tm.run("resize-window", "-x", "120", "-y", "40")
	// The new size reaches the sandbox's terminal by a request of its
	// own, beside what is typed: asked again until it is there.
	for try := 0; ; try++ {
		tm.keys("clear; stty size", "Enter")
		got, ok := tm.shows("40 120", 2*time.Second)
		if ok {
			break
		}
		if try == 10 {
			t.Fatalf("the sandbox's terminal never took the window's new size:\n%q", got)
		}
	}
	tm.keys("exit 3", "Enter")
	if rc := tm.exit(); rc != "3" {
		t.Errorf("kiln shell exited %s, want 3", rc)
	}
}

// TestDetachKeys: kiln shell starts bash where the sandbox has it; in a
// real terminal, ctrl-p ctrl-q leaves kiln shell with
// 0 and the shell running, unharmed; kiln attach -i comes back to it, in
// raw mode (the sandbox's terminal echoes, not this one), and its exit
// code is kiln's. A lone ctrl-p is sent on to the process.
func TestDetachKeys(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	// Without a command, the shell is bash where the sandbox has it (a
	// default sandbox shares this host's /usr); sh has no BASH_VERSINFO.
	tm := newTmux(t, state, "shell", sb)
	tm.screen("#")
	tm.keys("echo bash-is-$((1+1))-${BASH_VERSINFO[0]}", "Enter")
	tm.screen("bash-is-2-")
	tm.keys("exit 0", "Enter")
	if rc := tm.exit(); rc != "0" {
		t.Fatalf("kiln shell exited %s, want 0", rc)
	}
	// The rest with sh, whose prompt is "# ".
	tm = newTmux(t, state, "shell", sb, "--", "sh", "-l")
	tm.screen("#")
	tm.keys("echo marker-$((40+2))", "Enter")
	tm.screen("marker-42")
	tm.keys("C-p", "C-q")
	if rc := tm.exit(); rc != "0" {
		t.Fatalf("detached kiln shell exited %s, want 0", rc)
	}
	tm.screen("kiln: detached; the process runs on")
	_, ps, _ := kiln(t, state, "", "ps", sb)
	var pid string
	for line := range strings.Lines(ps) {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "running" && strings.Contains(line, "sh -l") {
			pid = f[0]
		}
	}
	if pid == "" {
		t.Fatalf("the shell is not running after the detach:\n%s", ps)
	}
	tm = newTmux(t, state, "attach", "-i", sb, pid)
	tm.screen("marker-42") // the output from the beginning
	// ctrl-p then x: not the sequence, so both go to the shell, whose
	// line editor takes ctrl-p as "previous line" or ignores it.
	tm.keys("C-p", "x")
	// Raw mode: Ctrl-C goes to the shell as a byte, not to kiln as SIGINT:
	// the sandbox's terminal echoes it, and the shell, interrupted, gives
	// a new prompt (typing on before it would race the shell's discarding
	// of what it had read).
	tm.keys("C-c")
	tm.screen("^C\n#")
	tm.keys("echo still-$((2+3))", "Enter")
	tm.screen("still-5")
	tm.keys("exit 5", "Enter")
	if rc := tm.exit(); rc != "5" {
		t.Errorf("kiln attach exited %s, want the shell's 5", rc)
	}
}

// tmuxSession is kiln run in a real terminal: a tmux window of 100x30.
type tmuxSession struct {
	t            *testing.T
	sock, rcFile string
}

// newTmux runs kiln with args in a new tmux session, keeping its exit code.
func newTmux(t *testing.T, state string, args ...string) *tmuxSession {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("needs tmux")
	}
	dir := t.TempDir()
	tm := &tmuxSession{t: t, sock: filepath.Join(dir, "tmux.sock"), rcFile: filepath.Join(dir, "rc")}
	line := fmt.Sprintf("%s=1 %s --state-dir %s %s; echo $? > %s; sleep 30", asCLIEnv, os.Args[0], state, strings.Join(args, " "), tm.rcFile)
	tm.run("new-session", "-d", "-x", "100", "-y", "30", "sh", "-c", line)
	t.Cleanup(func() { exec.Command("tmux", "-S", tm.sock, "kill-server").Run() })
	return tm
}

func (tm *tmuxSession) run(args ...string) string {
	tm.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", tm.sock}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %v: %v %s", args, err, out)
	}
	return string(out)
}

func (tm *tmuxSession) keys(keys ...string) {
	tm.t.Helper()
	tm.run(append([]string{"send-keys"}, keys...)...)
}

// screen waits for the window to show want.
func (tm *tmuxSession) screen(want string) {
	tm.t.Helper()
	if got, ok := tm.shows(want, 20*time.Second); !ok {
		tm.t.Fatalf("the screen never showed %q:\n%q", want, got)
	}
}

// shows reports whether the window shows want within d, and what it
// showed last.
func (tm *tmuxSession) shows(want string, d time.Duration) (string, bool) {
	tm.t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := tm.run("capture-pane", "-p")
		if strings.Contains(got, want) {
			return got, true
		}
		if time.Now().After(deadline) {
			return got, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exit waits for kiln's exit code.
func (tm *tmuxSession) exit() string {
	tm.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if b, err := os.ReadFile(tm.rcFile); err == nil && strings.TrimSpace(string(b)) != "" {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			tm.t.Fatal("kiln did not exit")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestHelpGolden holds kiln's help texts to testdata/*.golden; after a
// deliberate change, refresh them with go test ./cmd/kiln -run Golden -update.
func TestHelpGolden(t *testing.T) {
	for name, args := range map[string][]string{
		"kiln":           {"--help"},
		"run":            {"run", "--help"},
		"logs":           {"logs", "--help"},
		"sandbox":        {"sandbox", "--help"},
		"sandbox-create": {"sandbox", "create", "--help"},
		"exec":           {"exec", "--help"},
		"shell":          {"shell", "--help"},
		"cp":             {"cp", "--help"},
		"port-forward":   {"port-forward", "--help"},
		"preview":        {"preview", "--help"},
		"watch":          {"watch", "--help"},
		"image":          {"image", "--help"},
		"image-pull":     {"image", "pull", "--help"},
		"stats":          {"stats", "--help"},
		"mcp":            {"mcp", "--help"},
		"stop":           {"stop", "--help"},
		"node":           {"node", "--help"},
		"node-ls":        {"node", "ls", "--help"},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errs bytes.Buffer
			t.Setenv(client.StateDirEnv, "")
			t.Setenv(client.AddrEnv, "")
			if code := run(context.Background(), args, strings.NewReader(""), &out, &errs); code != 0 {
				t.Fatalf("%v: exit %d, %s", args, code, errs.String())
			}
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to make it)", err)
			}
			if diff := cmp.Diff(string(want), out.String()); diff != "" {
				t.Errorf("%v (-golden +got):\n%s", args, diff)
			}
		})
	}
}

// TestTablesGolden holds the tables people read to testdata, with ids and
// times made stable.
func TestTablesGolden(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create", "--name", "golden", "--hostname", "golden-host")
	sb := strings.TrimSpace(out)
	_, out, _ = kiln(t, state, "", "sandbox", "exec-stream", sb, "--", "sh", "-c", "exit 3")
	p := strings.TrimSpace(out)
	kiln(t, state, "", "wait", sb, p)
	_, ls, _ := kiln(t, state, "", "sandbox", "ls")
	_, wide, _ := kiln(t, state, "", "sandbox", "ls", "-o", "wide")
	_, ps, _ := kiln(t, state, "", "ps", sb)
	stable := strings.NewReplacer(sb, "SANDBOX-ID", api.ShortID(sb), "SANDBOX-ID", p, "PROCESS-ID", api.ShortProcessID(p), "SHORT-PROCESS-ID")
	got := stable.Replace(ls + "\n" + wide + "\n" + ps)
	got = regexp.MustCompile(`\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\d\d:\d\d:\d\d`).ReplaceAllString(got, "TIME")
	path := filepath.Join("testdata", "tables.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to make it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("tables (-golden +got):\n%s", diff)
	}
}

// TestExecIsLossless: a foreground command's output reaches kiln's stdout
// byte for byte, however much faster the command writes than kiln reads;
// with -i, kiln's stdin reaches the command, and without, its stdin is
// closed.
func TestExecIsLossless(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	const size = 64 << 20
	code, out, errs := kiln(t, state, "", "exec", sb, "--", "sh", "-c", "head -c 67108864 /dev/urandom > /workspace/r && sha256sum < /workspace/r")
	want, _, _ := strings.Cut(out, " ")
	if code != 0 || len(want) != 64 {
		t.Fatalf("make the file: %d %q %q", code, out, errs)
	}
	for i := range 2 {
		code, out, errs := kiln(t, state, "", "exec", sb, "--", "cat", "/workspace/r")
		if got := fmt.Sprintf("%x", sha256.Sum256([]byte(out))); code != 0 || len(out) != size || got != want || errs != "" {
			t.Errorf("cat, run %d: exit %d, %d bytes of %d, sha256 %s, want %s; stderr %q", i, code, len(out), size, got, want, errs)
		}
	}
	if code, out, errs := kiln(t, state, "1\n2\n3\n4\n5\n", "exec", "-i", sb, "--", "wc", "-l"); code != 0 || strings.TrimSpace(out) != "5" {
		t.Errorf("exec -i wc -l: %d %q %q", code, out, errs)
	}
	if code, out, errs := kiln(t, state, "1\n2\n3\n", "exec", sb, "--", "wc", "-l"); code != 0 || strings.TrimSpace(out) != "0" {
		t.Errorf("exec without -i, stdin closed: %d %q %q", code, out, errs)
	}
	if code, out, _ := kiln(t, state, "in\n", "run", "--rm", "-i", "--", "cat"); code != 0 || out != "in\n" {
		t.Errorf("run -i cat: %d %q", code, out)
	}
}

// TestForegroundOutcome: what kiln exec says and exits with once the
// command has ended, for output complete or not.
func TestForegroundOutcome(t *testing.T) {
	seven := 7
	complete := client.Result{Exit: client.ExitOf(api.Exit{ExitCode: &seven}), OutputComplete: true,
		Streams: map[string]client.StreamCount{"stdout": {Bytes: 10, Ended: true}, "stderr": {Ended: true}}}
	cut := complete
	cut.OutputComplete = false
	cut.Streams = map[string]client.StreamCount{"stdout": {Bytes: 10, Lost: 4, Ended: true}, "stderr": {Ended: true}}
	drained := complete
	drained.Exit, drained.OutputComplete = client.ExitOf(api.Exit{ExitCode: &seven, OutputCut: api.OutputCutDrain}), false
	tests := []struct {
		name       string
		r          client.Result
		foreground bool
		json       bool
		code       int
		stderr     string
	}{
		{"complete", complete, true, false, 7, ""},
		{"incomplete", cut, true, false, exitIncomplete, "kiln: the output shown is incomplete\n"},
		{"incomplete, watched", cut, false, false, 7, "kiln: the output shown is incomplete\n"},
		{"cut after the exit", drained, true, false, exitIncomplete, "kiln: the output was cut: something the process left behind still held it open when the drain time after its exit ran out (--drain)\n" +
			"kiln: the output shown is incomplete\n"},
		{"incomplete, json", cut, true, true, exitIncomplete, "kiln: the output shown is incomplete\n" +
			`{"exit_code":7,"output_complete":false,"streams":{"stderr":{"bytes":0,"lost_bytes":0,"ended":true},"stdout":{"bytes":10,"lost_bytes":4,"ended":true}}}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var errs bytes.Buffer
			c := &cli{stderr: &errs, json: tc.json}
			err := c.outcome(tc.r, tc.foreground, "")
			code := 0
			var ee exitError
			if errors.As(err, &ee) {
				code = ee.code
			}
			if code != tc.code || errs.String() != tc.stderr {
				t.Errorf("exit %d, stderr %q; want %d, %q", code, errs.String(), tc.code, tc.stderr)
			}
		})
	}
}

// TestOutputLostAndCut: output lost before kiln read it ends kiln with
// 123, saying how many bytes of which stream, unless --overflow report,
// which says so on a line and goes on; output a command's leftovers held
// open past --drain is cut, and said to be.
func TestOutputLostAndCut(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	// Detached, it never waits for a reader: 3 MiB, three times what
	// kilnd keeps, written before anyone reads.
	_, out, _ = kiln(t, state, "", "sandbox", "exec-stream", sb, "--", "sh", "-c", "head -c 3145728 /dev/zero; exit 5")
	p := strings.TrimSpace(out)
	if code, _, errs := kiln(t, state, "", "wait", sb, p); code != 5 {
		t.Fatalf("wait: %d %q", code, errs)
	}
	lost := regexp.MustCompile(`^kiln: (\d+) bytes of stdout were lost before kiln read them .*--overflow report`)
	for _, cmd := range []string{"logs", "attach"} {
		code, out, errs := kiln(t, state, "", cmd, sb, p)
		m := lost.FindStringSubmatch(errs)
		if code != exitIncomplete || out != "" || m == nil {
			t.Errorf("%s: exit %d, %d bytes out, stderr %q; want 123 and how much was lost", cmd, code, len(out), errs)
			continue
		}
		code, out, errs = kiln(t, state, "", cmd, "--overflow", "report", sb, p)
		want := 0
		if cmd == "attach" {
			want = 5
		}
		gap := regexp.MustCompile(`kiln: ` + m[1] + ` bytes of stdout lost before offset ` + m[1] + `\n`)
		if n, _ := strconv.Atoi(m[1]); code != want || len(out)+n != 3<<20 || !gap.MatchString(errs) {
			t.Errorf("%s --overflow report: exit %d, %d bytes out, stderr %q", cmd, code, len(out), errs)
		}
	}
	code, _, errs := kiln(t, state, "", "--json", "logs", sb, p)
	var e struct {
		Error struct {
			Code     string `json:"code"`
			ExitCode int    `json:"exit_code"`
			Stream   string `json:"stream"`
			Lost     int64  `json:"lost_bytes"`
		} `json:"error"`
	}
	if code != exitIncomplete || json.Unmarshal([]byte(errs), &e) != nil || e.Error.Code != "output_capacity" || e.Error.Stream != "stdout" || e.Error.Lost <= 0 {
		t.Errorf("--json logs: %d %q", code, errs)
	}

	// What a command leaves behind writes after it exits: read, within
	// the drain time; past it, cut, and said to be.
	if code, out, errs := kiln(t, state, "", "exec", sb, "--", "sh", "-c", "(sleep 0.3; echo late) & echo early"); code != 0 || out != "early\nlate\n" || errs != "" {
		t.Errorf("exec with a late writer: %d %q %q", code, out, errs)
	}
	code, out, errs = kiln(t, state, "", "exec", "--drain", "200ms", sb, "--", "sh", "-c", "sleep 30 & echo started")
	if code != exitIncomplete || out != "started\n" || !strings.Contains(errs, "kiln: the output was cut") {
		t.Errorf("exec --drain 200ms: %d %q %q", code, out, errs)
	}
}

// TestLogsOfABuildThatOutranTheRing: kiln logs of a captured shell loop of
// 20,000 lines (more than a process's ring holds) prints every line: what
// the ring dropped comes from the captured log.
func TestLogsOfABuildThatOutranTheRing(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	loop := `i=0; while [ $i -lt 20000 ]; do echo "line $i of a build that prints one short line at a time"; i=$((i+1)); done`
	_, out, _ = kiln(t, state, "", "sandbox", "exec-stream", "--capture", sb, "--", "sh", "-c", loop)
	p := strings.TrimSpace(out)
	if code, _, errs := kiln(t, state, "", "wait", sb, p); code != 0 {
		t.Fatalf("wait: %d %q", code, errs)
	}
	var want strings.Builder
	for i := range 20000 {
		fmt.Fprintf(&want, "line %d of a build that prints one short line at a time\n", i)
	}
	for _, args := range [][]string{{"logs", sb, p}, {"logs", "-f", sb, p}, {"logs", "--stdout", sb, p}} {
		code, out, errs := kiln(t, state, "", args...)
		if code != 0 || out != want.String() || strings.Contains(errs, "lost") || strings.Contains(errs, "incomplete") {
			t.Errorf("%v: exit %d, %d bytes of %d, equal %v; stderr %q", args, code, len(out), want.Len(), out == want.String(), errs)
		}
	}
}

// TestForegroundResumesABrokenConnection: kiln exec whose connection to
// kilnd breaks again and again resumes each time from the last byte it
// wrote: the output comes whole, nothing repeated, with the command's
// exit code. One that cannot reconnect gives up with 123, never 0.
func TestForegroundResumesABrokenConnection(t *testing.T) {
	k := kilndOf(t)
	state := k.State
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	proxy := func(refuseAfter int64) string {
		p, err := k.Proxy(t.TempDir(), 1<<20, refuseAfter)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p.State
	}
	var want strings.Builder
	for i := 1; i <= 400000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	proxied := proxy(0)
	code, out, errs := kiln(t, proxied, "", "exec", sb, "--", "sh", "-c", "seq 1 400000; exit 3")
	if code != 3 || out != want.String() || strings.Count(errs, "resuming in") < 2 {
		t.Errorf("exec through cuts: exit %d, %d bytes of %d, equal %v; stderr %q", code, len(out), want.Len(), out == want.String(), errs)
	}

	resume = client.Resume{First: time.Millisecond, For: 50 * time.Millisecond}
	t.Cleanup(func() { resume = client.Resume{} })
	refusing := proxy(1)
	code, out, errs = kiln(t, refusing, "", "exec", sb, "--", "seq", "1", "400000")
	if code != exitIncomplete || len(out) >= want.Len()-len("400000\n") || !strings.Contains(errs, "gave up resuming") ||
		!strings.HasSuffix(errs, "kiln: the output shown is incomplete\n") {
		t.Errorf("exec that cannot reconnect: exit %d, %d bytes; stderr %q", code, len(out), errs)
	}
}

// TestCreateLimits: a limit not given is kilnd's default, 0 is none.
func TestCreateLimits(t *testing.T) {
	state := kilnd(t)
	for _, tc := range []struct {
		args []string
		want api.Limits
	}{
		{nil, daemon.DefaultLimits},
		{[]string{"--memory", "0", "--pids", "64"}, api.Limits{Pids: 64, CPUs: daemon.DefaultLimits.CPUs, DiskBytes: daemon.DefaultLimits.DiskBytes}},
		{[]string{"--memory", "64M", "--cpus", "0", "--disk", "0"}, api.Limits{MemoryBytes: 64 << 20, Pids: daemon.DefaultLimits.Pids}},
	} {
		code, out, errOut := kiln(t, state, "", append([]string{"--json", "sandbox", "create"}, tc.args...)...)
		var sb api.Sandbox
		if code != 0 || json.Unmarshal([]byte(out), &sb) != nil {
			t.Fatalf("create %v: exit %d, %q %q", tc.args, code, out, errOut)
		}
		if sb.Limits != tc.want {
			t.Errorf("create %v: limits %+v, want %+v", tc.args, sb.Limits, tc.want)
		}
	}
}

// TestOutOfMemorySaid: a command whose sandbox runs out of memory exits
// 137, and kiln says why: by default the sandbox ends with it (kiln may
// see the command's exit first, or the sandbox's end); created with
// --on-oom kill_process, the command alone is killed, and the sandbox
// runs on.
func TestOutOfMemorySaid(t *testing.T) {
	state := kilnd(t)
	for _, tc := range []struct {
		onOOM, says, after string
	}{
		{"", "the sandbox ran out of memory", `"state": "stopped"`},
		{"kill_process", "the process was killed out of memory", `"state": "running"`},
	} {
		args := []string{"sandbox", "create", "--memory", "32M"}
		if tc.onOOM != "" {
			args = append(args, "--on-oom", tc.onOOM)
		}
		_, out, _ := kiln(t, state, "", args...)
		sb := strings.TrimSpace(out)
		code, _, errOut := kiln(t, state, "", "exec", sb, "--", "dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", "count=64")
		if code != 137 || !strings.Contains(errOut, tc.says) {
			t.Errorf("on_oom %q: exit %d, stderr %q; want 137 and %q", tc.onOOM, code, errOut, tc.says)
		}
		// kilnd ends the sandbox as it learns of the kill, which the
		// command's exit may come before.
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, out, _ = kiln(t, state, "", "sandbox", "inspect", sb)
			if strings.Contains(out, tc.after) || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !strings.Contains(out, tc.after) {
			t.Errorf("on_oom %q: the sandbox after: %s", tc.onOOM, out)
		}
	}
}

// TestCopy copies a tree into a sandbox and back as docker cp does: into
// an existing directory under its own name, to a new path under that
// name, and as a tar on standard output and input.
func TestCopy(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	src := filepath.Join(t.TempDir(), "proj")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha\n"), 0o640)
	os.WriteFile(filepath.Join(src, "sub", "b.txt"), []byte("beta\n"), 0o644)
	os.Symlink("a.txt", filepath.Join(src, "link"))
	if code, _, errs := kiln(t, state, "", "cp", src, sb+":/workspace"); code != 0 || !strings.Contains(errs, "copied 11 B to") {
		t.Fatalf("cp in: %d %q", code, errs)
	}
	if code, _, errs := kiln(t, state, "", "--json", "cp", src, sb+":/workspace/renamed"); code != 0 || errs != `{"bytes":11,"to":"`+sb+`:/workspace/renamed"}`+"\n" {
		t.Fatalf("cp in, renamed, --json: %d %q", code, errs)
	}
	code, out, _ := kiln(t, state, "", "exec", sb, "--", "sh", "-c",
		"cd /workspace && stat -c '%n %u %a' proj/a.txt proj/sub/b.txt renamed/a.txt && readlink proj/link")
	if code != 0 || out != "proj/a.txt 0 640\nproj/sub/b.txt 0 644\nrenamed/a.txt 0 640\na.txt\n" {
		t.Errorf("inside: %d %q", code, out)
	}
	back := t.TempDir()
	if code, _, errs := kiln(t, state, "", "cp", sb+":/workspace/proj", back); code != 0 {
		t.Fatalf("cp out: %d %q", code, errs)
	}
	if b, err := os.ReadFile(filepath.Join(back, "proj", "sub", "b.txt")); err != nil || string(b) != "beta\n" {
		t.Errorf("copied back: %q %v", b, err)
	}
	if code, _, errs := kiln(t, state, "", "cp", sb+":/workspace/proj/a.txt", filepath.Join(back, "one.txt")); code != 0 {
		t.Fatalf("cp out a file: %d %q", code, errs)
	}
	if b, err := os.ReadFile(filepath.Join(back, "one.txt")); err != nil || string(b) != "alpha\n" {
		t.Errorf("a file copied back: %q %v", b, err)
	}
	// A tar on stdout, and one on stdin.
	code, tarball, _ := kiln(t, state, "", "cp", sb+":/workspace/proj/sub", "-")
	if code != 0 || !strings.Contains(tarball, "sub/b.txt") {
		t.Fatalf("cp to -: %d %.100q", code, tarball)
	}
	kiln(t, state, "", "exec", sb, "--", "mkdir", "/workspace/fromtar")
	if code, _, errs := kiln(t, state, tarball, "cp", "-", sb+":/workspace/fromtar"); code != 0 {
		t.Fatalf("cp from -: %d %q", code, errs)
	}
	if code, out, _ := kiln(t, state, "", "exec", sb, "--", "cat", "/workspace/fromtar/sub/b.txt"); code != 0 || out != "beta\n" {
		t.Errorf("extracted from stdin: %d %q", code, out)
	}
	// What a user gets wrong, said.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cp", sb + ":/nope", back}, "no such file"},
		{[]string{"cp", src, sb + ":relative"}, "absolute"},
		{[]string{"cp", src, back}, "SANDBOX:PATH"},
		{[]string{"cp", sb + ":/workspace/proj", filepath.Join(back, "one.txt")}, "cannot copy the directory"},
	} {
		if code, _, errs := kiln(t, state, "", tc.args...); code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: %d %q, want an error saying %q", tc.args, code, errs, tc.want)
		}
	}
}

// TestPortForward: a local port reaches a server inside the sandbox, one
// stream per connection, until kiln is interrupted; a preview URL is
// printed for the same port.
func TestPortForward(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	if code, _, errs := kiln(t, state, "", "sandbox", "exec-stream", sb, "--", "python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/etc"); code != 0 {
		t.Fatalf("server: %d %q", code, errs)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	local := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--state-dir", state, "port-forward", sb, fmt.Sprintf("%d:8000", local)}, strings.NewReader(""), &stdout, &stderr)
	}()
	deadline := time.Now().Add(15 * time.Second)
	var body []byte
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/hostname", local))
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("nothing through the forwarded port: %v (stderr %q)", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("port-forward exited %d: %q", code, stderr.String())
	}
	if !strings.HasPrefix(string(body), "kiln-") || !strings.Contains(stdout.String(), fmt.Sprintf("Forwarding from 127.0.0.1:%d -> 8000", local)) {
		t.Errorf("through the forward: %q; stdout %q", body, stdout.String())
	}
	if code, _, errs := kiln(t, state, "", "port-forward", sb, "70000"); code == 0 || !strings.Contains(errs, "1 to 65535") {
		t.Errorf("port 70000: %d %q", code, errs)
	}
}

// TestExtractLocalRefusesEscapes: an archive from a sandbox lands in what
// the copy makes and nowhere else beside it, whatever its entries say.
func TestExtractLocalRefusesEscapes(t *testing.T) {
	for name, hs := range map[string][]tar.Header{
		"a sibling of the top":           {{Name: "out/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: ".ssh/authorized_keys", Typeflag: tar.TypeReg, Mode: 0o600}},
		"the parent as a directory":      {{Name: "./", Typeflag: tar.TypeDir, Mode: 0o777}},
		"the top as a link to its place": {{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "."}, {Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644}},
		"a link out of the top":          {{Name: "out/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "out/l", Typeflag: tar.TypeSymlink, Linkname: "../victim"}},
		"an absolute link":               {{Name: "out/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "out/l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}},
		"a climb":                        {{Name: "out/../victim", Typeflag: tar.TypeReg, Mode: 0o644}},
	} {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			for _, h := range hs {
				tw.WriteHeader(&h)
			}
			tw.Close()
			parent := t.TempDir()
			os.Chmod(parent, 0o755)
			if _, err := extractLocal(parent, "out", "copy", tar.NewReader(&b)); err == nil {
				t.Errorf("extracted")
			}
			ents, _ := os.ReadDir(parent)
			for _, e := range ents {
				if e.Name() != "copy" {
					t.Errorf("%s landed beside the copy", e.Name())
				}
			}
			if fi, _ := os.Stat(parent); fi.Mode().Perm() != 0o755 {
				t.Errorf("the parent's mode became %v", fi.Mode().Perm())
			}
		})
	}
}

// TestImageCommands pulls, lists, runs, imports and removes images with
// kiln as a user would, from a registry on loopback.
func TestImageCommands(t *testing.T) {
	state := kilnd(t)
	reg := imagetest.StartRegistry(t)
	box := imagetest.Image(t, v1.Config{Env: []string{"PATH=/bin"}, Cmd: []string{"echo", "from the image"}}, imagetest.Busybox(t, "sh", "echo", "cat", "id"))
	ref := reg.Push(t, "box:1", box)
	code, out, errs := kiln(t, state, "", "image", "pull", ref)
	if code != 0 || !strings.HasPrefix(out, "sha256:") || !strings.Contains(errs, ": downloading\n") {
		t.Fatalf("image pull: %d %q %q", code, out, errs)
	}
	id := strings.TrimSpace(out)
	if code, out, _ := kiln(t, state, "", "image", "ls"); code != 0 || !strings.Contains(out, ref+"  ") || !strings.Contains(out, imageID(id)) {
		t.Errorf("image ls: %d %q", code, out)
	}
	if code, out, errs := kiln(t, state, "", "run", "--rm", "--image", ref, "--", "cat", "/etc/hostname"); code == 0 || !strings.Contains(errs, "No such file") {
		t.Errorf("run --image with a command of its own: %d %q %q", code, out, errs)
	}
	if code, out, errs := kiln(t, state, "", "run", "--rm", "--image", ref); code != 0 || out != "from the image\n" {
		t.Errorf("run --image, its own command: %d %q %q", code, out, errs)
	}
	if code, out, errs := kiln(t, state, "", "run", "--rm", "--image", ref, "-u", "1234:5678", "--", "sh", "-c", "echo $(id -u):$(id -g)"); code != 0 || out != "1234:5678\n" {
		t.Errorf("run --image -u: %d %q %q", code, out, errs)
	}
	// The file must be the image's: a bare busybox has no /etc at all.
	code, out, errs = kiln(t, state, "", "run", "--rm", "--image", ref, "--", "echo", "mine")
	if code != 0 || out != "mine\n" {
		t.Errorf("run --image: %d %q %q", code, out, errs)
	}
	tarPath := filepath.Join(t.TempDir(), "saved.tar")
	if err := os.WriteFile(tarPath, imagetest.Save(t, map[string]v1.Image{"example.test/saved:1": box}), 0o644); err != nil {
		t.Fatal(err)
	}
	// The same image: it has both names now.
	if code, out, errs := kiln(t, state, "", "image", "import", tarPath); code != 0 || out != ref+" example.test/saved:1\n" {
		t.Errorf("image import: %d %q %q", code, out, errs)
	}
	if code, out, errs := kiln(t, state, "", "image", "rm", ref); code != 0 || out != "Untagged: "+ref+"\n" {
		t.Errorf("image rm of one of two names: %d %q %q", code, out, errs)
	}
	if code, out, errs := kiln(t, state, "", "image", "rm", "example.test/saved:1"); code != 0 || out != "Untagged: example.test/saved:1\nDeleted: "+id+"\n" {
		t.Errorf("image rm of the last name: %d %q %q", code, out, errs)
	}
	if code, _, errs := kiln(t, state, "", "image", "inspect", ref); code == 0 || !strings.Contains(errs, "not found") {
		t.Errorf("inspect of a removed image: %d %q", code, errs)
	}
}

// TestParseBytes: sizes as docker run --memory reads them; what is not a
// size is refused whole (it used to be read as far as it went: "2x" as
// 2, "10abc" as 10, "1.5G" as 1 GiB).
func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"1048576": 1 << 20, "512m": 512 << 20, "512M": 512 << 20, "512MiB": 512 << 20, "512mb": 512 << 20,
		"1.5G": 3 << 29, "2g": 2 << 30, "64k": 64 << 10, "1T": 1 << 40,
	} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"2x", "10abc", "", "-1G", "0", "G", "1.5.5G", "1 0M"} {
		if got, err := parseBytes(in); err == nil {
			t.Errorf("%q: read as %d, want an error", in, got)
		} else if !strings.Contains(err.Error(), "want a byte count") {
			t.Errorf("%q: %v", in, err)
		}
	}
}

// TestSandboxNamesAndPrefixes: a sandbox created with --name is reached
// by that name and by a prefix of its id on every command, listed with
// it, and its hostname is the name; a name taken is refused, naming it.
func TestSandboxNamesAndPrefixes(t *testing.T) {
	state := kilnd(t)
	code, out, errs := kiln(t, state, "", "sandbox", "create", "--name", "web")
	id := strings.TrimSpace(out)
	if code != 0 || !api.IsSandboxID(id) {
		t.Fatalf("create --name web: %d %q %q", code, out, errs)
	}
	if code, out, _ := kiln(t, state, "", "exec", "web", "--", "cat", "/proc/sys/kernel/hostname"); code != 0 || out != "web\n" {
		t.Errorf("exec web hostname: %d %q", code, out)
	}
	code, out, _ = kiln(t, state, "", "--json", "sandbox", "inspect", id[:len(id)-4])
	var info api.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &info) != nil || info.ID != id || info.Name != "web" {
		t.Errorf("inspect by prefix: %d %q", code, out)
	}
	if code, _, errs := kiln(t, state, "", "sandbox", "create", "--name", "web"); code != exitKiln || !strings.Contains(errs, `sandbox name "web" is taken`) {
		t.Errorf("a second web: %d %q", code, errs)
	}
	if code, _, errs := kiln(t, state, "", "sandbox", "create", "--name", "Web"); code == 0 || !strings.Contains(errs, `sandbox name "Web"`) {
		t.Errorf("an upper-case name: %d %q", code, errs)
	}
	// -f, as docker rm -f: a running sandbox goes all the same.
	if code, _, errs := kiln(t, state, "", "sandbox", "rm", "-f", "web"); code != 0 {
		t.Fatalf("rm -f web: %d %q", code, errs)
	}
	if code, _, errs := kiln(t, state, "", "ps", "web"); code != exitKiln || !strings.Contains(errs, `no sandbox "web"`) {
		t.Errorf("ps web after rm: %d %q", code, errs)
	}
}
