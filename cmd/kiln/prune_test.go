package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// kilnIn is kilnExe with stdin: what a person answers kiln.
func kilnIn(t *testing.T, state, stdin string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"--state-dir", state}, args...)...)
	cmd.Env = append(os.Environ(), asCLIEnv+"=1")
	var out, errs bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &out, &errs
	cmd.Run()
	return cmd.ProcessState.ExitCode(), out.String(), errs.String()
}

// TestPrune: kiln prune deletes the stopped sandboxes, those --filter
// chooses, once the question is answered yes (or with -f), and leaves the
// running ones; no, or no answer, deletes nothing.
func TestPrune(t *testing.T) {
	state := kilnd(t)
	ok := kilnOK(t, state)
	running := strings.TrimSpace(ok("sandbox", "create", "--name", "up"))
	ci := strings.TrimSpace(ok("sandbox", "create", "--name", "ci", "-l", "ci=true"))
	other := strings.TrimSpace(ok("sandbox", "create", "--name", "other"))
	ok("stop", "-t", "0", "ci", "other")

	for _, answer := range []string{"n\n", ""} {
		if code, out, errs := kilnIn(t, state, answer, "prune"); code != 0 || out != "" || !strings.Contains(errs, "[y/N]") || !strings.Contains(errs, "nothing deleted") {
			t.Errorf("prune answered %q: %d %q %q", answer, code, out, errs)
		}
	}
	if out := ok("ls", "-a", "-q", "--no-trunc", "-f", "status=stopped"); out != ci+"\n"+other+"\n" {
		t.Fatalf("stopped after two noes: %q", out)
	}
	if out := ok("prune", "-f", "--filter", "label=ci=true"); out != ci+"\n" {
		t.Errorf("prune -f --filter label=ci=true: %q", out)
	}
	if code, out, errs := kilnIn(t, state, "y\n", "sandbox", "prune", "--logs"); code != 0 || out != other+"\n" || !strings.Contains(errs, "1 stopped sandboxes deleted") {
		t.Errorf("sandbox prune answered y: %d %q %q", code, out, errs)
	}
	// ci's record and captured logs stay for --keep-deleted; other's went
	// with --logs.
	if out := ok("ls", "-a", "-q", "--no-trunc", "-f", "status=deleted"); out != ci+"\n" {
		t.Errorf("deleted and kept: %q", out)
	}
	if out := ok("ls", "-q", "--no-trunc"); out != running+"\n" {
		t.Errorf("still running: %q", out)
	}
	if code, _, errs := kilnIn(t, state, "", "prune", "-f", "--filter", "status=running"); code != 125 || !strings.Contains(errs, "stopped sandboxes only") {
		t.Errorf("prune --filter status=running: %d %q", code, errs)
	}
}
