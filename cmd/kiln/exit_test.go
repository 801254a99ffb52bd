package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"

	"github.com/sandkiln/sandkiln/api"
)

// freeAddr is a loopback address nothing listens on, for a moment.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestExitCodes holds each way kiln can end to its exit code and to what it
// says: the process's own code, Docker's 125, 126 and 127, 130 for Ctrl-C,
// each decided by the error's kind, whatever its words.
func TestExitCodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	addr := freeAddr(t)
	k := daemontest.StartT(t, addr)
	state := k.State
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	if code, _, errs := kiln(t, state, "", "exec", sb, "--", "sh", "-c", "printf 'echo x' > /workspace/script; mkdir /workspace/dir"); code != 0 {
		t.Fatalf("set-up: %d %s", code, errs)
	}
	_, out, _ = kiln(t, state, "", "sandbox", "exec-stream", sb, "--", "true")
	done := strings.TrimSpace(out)
	kiln(t, state, "", "wait", sb, done)
	manyArgs := append([]string{"exec", sb, "--", "true"}, strings.Split(strings.Repeat("arg ", api.MaxArgs+1), " ")...)

	for _, tc := range []struct {
		name   string
		state  string // default: kilnd's
		env    map[string]string
		args   []string
		code   int
		stderr string // a part of what kiln says
	}{
		{name: "the process's code", args: []string{"exec", sb, "--", "sh", "-c", "exit 7"}, code: 7},
		{name: "a signal", args: []string{"exec", sb, "--", "sh", "-c", "kill -TERM $$"}, code: 128 + 15},
		{name: "the process exits 1", args: []string{"exec", sb, "--", "false"}, code: 1},
		{name: "no such path", args: []string{"exec", sb, "--", "/no/such/program"}, code: 127, stderr: "command not found"},
		{name: "not in PATH", args: []string{"exec", sb, "--", "no-such-command"}, code: 127, stderr: "command not found"},
		{name: "not executable", args: []string{"exec", sb, "--", "/workspace/script"}, code: 126, stderr: "not executable"},
		{name: "a directory", args: []string{"exec", sb, "--", "/workspace/dir"}, code: 126, stderr: "not executable"},
		{name: "not found, detached", args: []string{"sandbox", "exec-stream", sb, "--", "/no/such/program"}, code: 127},
		{name: "not found, run", args: []string{"run", "--rm", "--", "no-such-command"}, code: 127},
		{name: "no such sandbox", args: []string{"exec", "nope", "--", "true"}, code: 125, stderr: `no sandbox "nope"`},
		{name: "a refusal that names arguments", args: manyArgs, code: 125, stderr: "arguments"},
		{name: "no kilnd", state: t.TempDir(), args: []string{"sandbox", "ls"}, code: 125, stderr: "is kilnd running?"},
		{name: "nothing listens at --addr", env: map[string]string{"KILN_TOKEN": "x"}, args: []string{"--addr", freeAddr(t), "sandbox", "ls"}, code: 125, stderr: "is kilnd running?"},
		{name: "--addr without a token", state: t.TempDir(), args: []string{"--addr", addr, "sandbox", "ls"}, code: 125, stderr: "set $KILN_TOKEN"},
		{name: "a wrong token", state: t.TempDir(), env: map[string]string{"KILN_TOKEN": "wrong"}, args: []string{"--addr", addr, "sandbox", "ls"}, code: 125, stderr: "the bearer token is not kilnd's"},
		{name: "the token, over TCP", state: t.TempDir(), env: map[string]string{"KILN_TOKEN": k.Daemon.Token()}, args: []string{"--addr", "http://" + addr, "sandbox", "ls"}, code: 0},
		{name: "an unknown command", args: []string{"nosuch"}, code: 125, stderr: "See 'kiln --help'."},
		{name: "an unknown subcommand", args: []string{"sandbox", "nosuch"}, code: 125, stderr: "unknown command"},
		{name: "an unknown flag", args: []string{"exec", "--nosuch", sb, "--", "true"}, code: 125, stderr: "See 'kiln exec --help'."},
		{name: "missing arguments", args: []string{"exec"}, code: 125, stderr: "See 'kiln exec --help'."},
		{name: "a bad size", args: []string{"sandbox", "create", "--memory", "1.5x"}, code: 125, stderr: `size "1.5x"`},
		{name: "a bad output format", args: []string{"-o", "yaml", "sandbox", "ls"}, code: 125, stderr: "want table, wide or json"},
		{name: "-it without a terminal", args: []string{"exec", "-it", sb, "--", "sh"}, code: 125, stderr: "the input device is not a TTY"},
		{name: "a bad tail", args: []string{"logs", "--tail", "some", sb, done}, code: 125, stderr: "want a number of lines, or all"},
		{name: "a bad overflow", args: []string{"attach", "--overflow", "drop", sb, done}, code: 125, stderr: "--overflow \"drop\": want fail or report"},
		{name: "a drain past a minute", args: []string{"exec", "--drain", "2m", sb, "--", "true"}, code: 125, stderr: "--drain 2m0s"},
		{name: "kill of a process that exited", args: []string{"kill", sb, done}, code: 0, stderr: "has already exited"},
		{name: "logs of a process never there", args: []string{"logs", "--tail", "3", sb, "01a22779-5cfd-7451-9354-2e19949d5c7f"}, code: 125, stderr: "none running or recently ended has that id"},
		{name: "logs --tail of one not captured", args: []string{"logs", "--tail", "3", sb, done}, code: 125, stderr: "ran without --capture"},
		{name: "help", args: []string{"--help"}, code: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			st := state
			if tc.state != "" {
				st = tc.state
			}
			code, _, errs := kiln(t, st, "", tc.args...)
			if code != tc.code || !strings.Contains(errs, tc.stderr) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errs, tc.code, tc.stderr)
			}
			// One prefix, kiln's: kilnd's answers carry none, and the
			// SDK's ("kilnd: ") is not said again.
			if n := strings.Count(errs, "kiln: ") + strings.Count(errs, "kilnd: "); n > 1 {
				t.Errorf("stderr %q: %d prefixes, want at most one", errs, n)
			}
			if tc.name != "a wrong token" && strings.Contains(errs, "is kilnd running?") != strings.Contains(tc.stderr, "is kilnd running?") {
				t.Errorf("stderr %q: says is kilnd running? where it should not, or the reverse", errs)
			}
		})
	}

	// --json: errors too, as JSON on stderr.
	code, _, errs := kiln(t, state, "", "--json", "exec", "nope", "--", "true")
	var e struct {
		Error struct {
			Code     string `json:"code"`
			Message  string `json:"message"`
			ExitCode int    `json:"exit_code"`
		} `json:"error"`
	}
	if code != 125 || json.Unmarshal([]byte(errs), &e) != nil || e.Error.Code != "not_found" || e.Error.ExitCode != 125 || !strings.Contains(e.Error.Message, "nope") {
		t.Errorf("--json error: %d %q", code, errs)
	}
	// A refusal of kilnd's, its message with the SDK's prefix once.
	t.Setenv("KILN_TOKEN", "wrong")
	code, _, errs = kiln(t, t.TempDir(), "", "--json", "--addr", addr, "sandbox", "ls")
	if code != 125 || json.Unmarshal([]byte(errs), &e) != nil || e.Error.Code != "unauthenticated" ||
		!strings.HasPrefix(e.Error.Message, "kilnd: ") || strings.Count(e.Error.Message, "kilnd: ") != 1 {
		t.Errorf("--json refusal: %d %q", code, errs)
	}
	code, _, errs = kiln(t, state, "", "-o", "json", "nosuch")
	if code != 125 || json.Unmarshal([]byte(errs), &e) != nil || e.Error.Code != "usage" {
		t.Errorf("-o json usage error: %d %q", code, errs)
	}
}

// TestInterrupted: Ctrl-C ends kiln with 130 and no error of its own;
// the process runs on, and a foreground command says where it is.
func TestInterrupted(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	_, out, _ = kiln(t, state, "", "sandbox", "exec-stream", sb, "--", "sh", "-c", "echo started; sleep 600")
	p := strings.TrimSpace(out)
	interrupt := func(args ...string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		pr, pw := io.Pipe()
		var errs bytes.Buffer
		code := make(chan int, 1)
		go func() {
			code <- run(ctx, append([]string{"--state-dir", state}, args...), strings.NewReader(""), pw, &errs)
			pw.Close()
		}()
		line := make([]byte, len("started\n"))
		if _, err := io.ReadFull(pr, line); err != nil || string(line) != "started\n" {
			t.Fatalf("%v: %q %v", args, line, err)
		}
		cancel() // what Ctrl-C does: main's signal context ends
		go io.Copy(io.Discard, pr)
		select {
		case c := <-code:
			return c, errs.String()
		case <-time.After(30 * time.Second):
			t.Fatalf("%v did not end on Ctrl-C", args)
		}
		return 0, ""
	}
	if c, errs := interrupt("logs", "-f", sb, p); c != 130 || errs != "" {
		t.Errorf("logs -f interrupted: exit %d, stderr %q; want 130 and nothing", c, errs)
	}
	c, errs := interrupt("exec", sb, "--", "sh", "-c", "echo started; exec sleep 600")
	if c != 130 || !strings.Contains(errs, "kiln: interrupted; the process runs on: kiln attach "+sb+" ") {
		t.Errorf("exec interrupted: exit %d, stderr %q", c, errs)
	}
	if c, out, _ := kiln(t, state, "", "ps", sb); c != 0 || strings.Count(out, "running") != 2 {
		t.Errorf("the processes after Ctrl-C: %d %q", c, out)
	}
}

// TestExecOnATerminal: -t without -i runs the command on a terminal, its
// errors on the same terminal, with no input.
func TestExecOnATerminal(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	code, out, errs := kiln(t, state, "", "exec", "-t", sb, "--", "sh", "-c", "tty; echo to-stderr >&2; exit 4")
	if code != 4 || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "to-stderr\r\n") || errs != "" {
		t.Errorf("exec -t: %d %q %q", code, out, errs)
	}
}
