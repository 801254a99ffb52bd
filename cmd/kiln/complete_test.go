package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/client"

	"github.com/sandkiln/sandkiln/api"
)

// bashCompletion is kiln's bash completion script, sourced in a real bash
// with kiln on its PATH (this test binary, as the terminal test runs it).
type bashCompletion struct {
	bash, script, path string
}

func newBashCompletion(t *testing.T) *bashCompletion {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wrapper := "#!/bin/sh\n" + asCLIEnv + "=1 exec '" + exe + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "kiln"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	code, script, errs := kiln(t, t.TempDir(), "", "completion", "bash")
	if code != 0 || !strings.Contains(script, "__complete") {
		t.Fatalf("kiln completion bash: %d %q", code, errs)
	}
	path := filepath.Join(dir, "kiln.bash")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	return &bashCompletion{bash: bash, script: path, path: dir + ":" + os.Getenv("PATH")}
}

// complete is what bash completes line with (the cursor at its end): the
// completion function that `complete -p kiln` names, called as readline
// calls it, with COMP_WORDS, COMP_CWORD, COMP_LINE and COMP_POINT set. It
// returns COMPREPLY's words, each without the description bash shows
// beside it when there are several, and what bash wrote to stderr but
// for compopt's complaint that it is called outside readline.
//
// Each completion must turn bash's default, file names, off: the
// script's debug log (BASH_COMP_DEBUG_FILE) says when it does.
func (b *bashCompletion) complete(t *testing.T, env []string, line string) ([]string, string) {
	t.Helper()
	// bash-completion's _get_comp_words_by_ref, which the script needs,
	// where it is installed; else the little of it the script uses: the
	// words as bash split them.
	const prog = `
for f in /usr/share/bash-completion/bash_completion /etc/bash_completion; do
	if [ -r "$f" ]; then . "$f"; break; fi
done
if ! declare -F _get_comp_words_by_ref >/dev/null; then
	_get_comp_words_by_ref() {
		cur=${COMP_WORDS[COMP_CWORD]}; prev=${COMP_WORDS[COMP_CWORD-1]}
		words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD
	}
fi
. "$KILN_BASH"
fn=$(complete -p kiln | sed -E 's/.* -F ([^ ]+) .*/\1/')
COMP_LINE=$LINE
COMP_POINT=${#COMP_LINE}
read -ra COMP_WORDS <<<"$COMP_LINE"
if [[ $COMP_LINE == *" " ]]; then COMP_WORDS+=(""); fi
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
"$fn" kiln "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
`
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.bash, "--norc", "--noprofile", "-c", prog)
	debug := filepath.Join(t.TempDir(), "debug")
	cmd.Env = append(os.Environ(), "PATH="+b.path, "KILN_BASH="+b.script, "LINE="+line, "BASH_COMP_DEBUG_FILE="+debug)
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash completing %q: %v\n%s", line, err, stderr.String())
	}
	if log, _ := os.ReadFile(debug); !strings.Contains(string(log), "Activating no file completion") {
		t.Errorf("%q: file names are not turned off; the script's log:\n%s", line, log)
	}
	var complaints []string
	for l := range strings.Lines(stderr.String()) {
		if !strings.Contains(l, "compopt: not currently executing completion function") {
			complaints = append(complaints, l)
		}
	}
	var words []string
	for l := range strings.Lines(string(out)) {
		if f := strings.Fields(l); len(f) > 0 {
			words = append(words, f[0])
		}
	}
	return words, strings.Join(complaints, "")
}

// completer completes a command line in a shell: the words offered, and
// what the shell wrote to stderr.
type completer interface {
	complete(t *testing.T, env []string, line string) ([]string, string)
}

// expectCompletion fails t unless c completes line, with env, to want
// (in any order) and writes nothing to stderr.
func expectCompletion(t *testing.T, c completer, env []string, line string, want ...string) {
	t.Helper()
	got, stderr := c.complete(t, env, line)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || stderr != "" {
		t.Errorf("%q completes to %q (stderr %q), want %q", line, got, stderr, want)
	}
}

// TestCompletionInBash: in bash, TAB after a command that takes a
// sandbox offers the ids and names kilnd has, after one that takes a
// process the sandbox's process ids, and nothing at all (no files, no
// error, no wait past a short timeout) when kilnd cannot be reached.
func TestCompletionInBash(t *testing.T) {
	b := newBashCompletion(t)
	state := kilnd(t)
	_, out, errs := kiln(t, state, "", "sandbox", "create", "--name", "web")
	web := strings.TrimSpace(out)
	if !api.IsSandboxID(web) {
		t.Fatalf("create --name web: %q %q", out, errs)
	}
	_, out, _ = kiln(t, state, "", "sandbox", "create")
	other := strings.TrimSpace(out)
	_, out, _ = kiln(t, state, "", "sandbox", "exec-stream", web, "--", "true")
	p := strings.TrimSpace(out)
	kilndEnv := []string{client.StateDirEnv + "=" + state, client.AddrEnv + "="}
	expect := func(env []string, line string, want ...string) {
		t.Helper()
		expectCompletion(t, b, env, line, want...)
	}
	expect(kilndEnv, "kiln logs ", web, "web", other)
	expect(kilndEnv, "kiln logs w", "web")
	expect(kilndEnv, "kiln sandbox rm web ", web, other)
	expect(kilndEnv, "kiln logs web ", p)
	expect(kilndEnv, "kiln kill "+web+" ", p)
	expect(kilndEnv, "kiln logs web "+p+" ")

	// Once its sandbox is removed, a captured process is still one kiln
	// logs shows, and completes; the sandbox itself no longer does.
	_, out, _ = kiln(t, state, "", "sandbox", "exec-stream", "--capture", other, "--", "true")
	q := strings.TrimSpace(out)
	kiln(t, state, "", "wait", other, q)
	if code, _, errs := kiln(t, state, "", "sandbox", "rm", other); code != 0 {
		t.Fatalf("rm: %d %q", code, errs)
	}
	expect(kilndEnv, "kiln logs "+other+" ", q)
	expect(kilndEnv, "kiln logs ", web, "web")

	// No kilnd on the socket: nothing, at once.
	expect([]string{client.StateDirEnv + "=" + t.TempDir(), client.AddrEnv + "="}, "kiln logs ")
	// A kilnd that takes the connection and never answers: nothing, once
	// the completion's own timeout ends the wait.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	expect([]string{client.AddrEnv + "=" + l.Addr().String(), client.TokenEnv + "=x"}, "kiln ps ")
}

// shellCompletion is kiln's completion script for fish or zsh, run in that
// shell with kiln on its PATH (this test binary, as newBashCompletion
// puts it there).
type shellCompletion struct {
	shell, script, path string
	prog                string // completes $LINE, printing one word a line
}

// The programs that complete $LINE. fish's own complete -C does what TAB
// does. zsh's completion widgets need a line editor, so the script's
// function is called as the completion system would call it, with words
// and CURRENT set, and zsh's _describe, which would show the candidates,
// replaced by one that prints them; _arguments, which the script calls
// only to offer file names, reports that it was called.
const (
	fishProg = `source $KILN_SCRIPT; complete -C "$LINE" | string split -f1 \t`
	zshProg  = `
compdef() { :; }
_describe() {
	while [[ $# -gt 0 && $1 != completions ]]; do shift; done
	local c
	for c in "${(@P)2}"; do print -r -- "${c%%:*}"; done
}
_arguments() { print -u2 "file names offered: $*"; }
source "$KILN_SCRIPT"
words=(${(z)LINE})
[[ $LINE == *" " ]] && words+=("")
CURRENT=${#words}
_kiln
`
)

func newShellCompletion(t *testing.T, shell string) *shellCompletion {
	t.Helper()
	path, err := exec.LookPath(shell)
	if err != nil {
		t.Skip("no " + shell)
	}
	b := newBashCompletion(t)
	code, script, errs := kiln(t, t.TempDir(), "", "completion", shell)
	if code != 0 || !strings.Contains(script, "__complete") {
		t.Fatalf("kiln completion %s: %d %q", shell, code, errs)
	}
	file := filepath.Join(t.TempDir(), "kiln."+shell)
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &shellCompletion{shell: path, script: file, path: b.path, prog: fishProg}
	if shell == "zsh" {
		c.prog = zshProg
	}
	return c
}

// complete is what the shell completes line with (the cursor at its end),
// and what it wrote to stderr.
func (c *shellCompletion) complete(t *testing.T, env []string, line string) ([]string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	args := []string{"--no-config", "-c", c.prog}
	if filepath.Base(c.shell) == "zsh" {
		args = []string{"-f", "-c", c.prog}
	}
	cmd := exec.CommandContext(ctx, c.shell, args...)
	cmd.Env = append(os.Environ(), "PATH="+c.path, "KILN_SCRIPT="+c.script, "LINE="+line)
	cmd.Env = append(cmd.Env, env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	// An exit status says only whether there were candidates; what went
	// wrong is on stderr.
	out, err := cmd.Output()
	if _, exited := err.(*exec.ExitError); err != nil && !exited {
		t.Fatalf("%s completing %q: %v", c.shell, line, err)
	}
	var words []string
	for l := range strings.Lines(string(out)) {
		if w := strings.TrimSpace(l); w != "" {
			words = append(words, w)
		}
	}
	return words, stderr.String()
}

// TestCompletionInFishAndZsh: fish and zsh complete what bash does (see
// TestCompletionInBash): sandboxes by id and name, a sandbox's processes,
// kiln's commands, no file names, and nothing when kilnd is not there.
func TestCompletionInFishAndZsh(t *testing.T) {
	state := kilnd(t)
	_, out, errs := kiln(t, state, "", "sandbox", "create", "--name", "web")
	web := strings.TrimSpace(out)
	if !api.IsSandboxID(web) {
		t.Fatalf("create --name web: %q %q", out, errs)
	}
	_, out, _ = kiln(t, state, "", "sandbox", "exec-stream", web, "--", "true")
	p := strings.TrimSpace(out)
	kilndEnv := []string{client.StateDirEnv + "=" + state, client.AddrEnv + "="}
	for _, shell := range []string{"fish", "zsh"} {
		t.Run(shell, func(t *testing.T) {
			c := newShellCompletion(t, shell)
			expect := func(env []string, line string, want ...string) {
				t.Helper()
				expectCompletion(t, c, env, line, want...)
			}
			expect(kilndEnv, "kiln logs ", web, "web")
			expect(kilndEnv, "kiln logs w", "web")
			expect(kilndEnv, "kiln logs web ", p)
			expect(kilndEnv, "kiln kill "+web+" ", p)
			expect(kilndEnv, "kiln sandbox rm web ", web)
			expect(kilndEnv, "kiln sa", "sandbox")
			expect([]string{client.StateDirEnv + "=" + t.TempDir(), client.AddrEnv + "="}, "kiln logs ")
		})
	}
}
