package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/api"
)

// TestStats: kiln stats --no-stream prints a sandbox's row with a CPU %
// from a busy loop, its memory against its limit, its tasks and no OOM
// kills; without names it shows every running sandbox and no other; with
// --json the same figures for scripts; a sandbox not there is an error.
func TestStats(t *testing.T) {
	state := kilnd(t)
	_, out, _ := kiln(t, state, "", "sandbox", "create")
	sb := strings.TrimSpace(out)
	_, out, _ = kiln(t, state, "", "sandbox", "create")
	gone := strings.TrimSpace(out)
	if code, _, errs := kiln(t, state, "", "sandbox", "rm", gone); code != 0 {
		t.Fatalf("rm: %d %s", code, errs)
	}
	if code, _, errs := kiln(t, state, "", "sandbox", "exec-stream", sb, "--", "sh", "-c", "while :; do :; done"); code != 0 {
		t.Fatalf("exec-stream: %d %s", code, errs)
	}

	code, out, errs := kiln(t, state, "", "stats", "--no-stream", sb)
	if code != 0 {
		t.Fatalf("stats: %d %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !regexp.MustCompile(`^SANDBOX +NAME +CPU % +MEM USAGE / LIMIT +MEM % +PIDS +OOM +DISK USAGE / SIZE$`).MatchString(lines[0]) {
		t.Fatalf("stats:\n%s", out)
	}
	row := regexp.MustCompile(`^` + api.ShortID(sb) + ` +- +(\d+\.\d\d)% +\d+(\.\d+)?[KM]iB / 1GiB +\d+\.\d\d% +(\d+) +0 +\d+(\.\d+)?[KMG]iB / \d+(\.\d+)?GiB$`).FindStringSubmatch(lines[1])
	if row == nil {
		t.Fatalf("row %q", lines[1])
	}
	// The loop is limited to one core (kilnd's default) and shares the
	// machine: some of it, at least.
	if cpu, _ := strconv.ParseFloat(row[1], 64); cpu < 10 || cpu > 110 {
		t.Errorf("a busy loop at %v%% CPU", cpu)
	}
	if pids, _ := strconv.Atoi(row[3]); pids < 1 {
		t.Errorf("%d tasks, want the loop's", pids)
	}

	code, out, errs = kiln(t, state, "", "stats", "--no-stream")
	if code != 0 || !strings.Contains(out, api.ShortID(sb)) || strings.Contains(out, api.ShortID(gone)) || strings.Count(out, "\n") != 2 {
		t.Errorf("stats of every running sandbox: %d %s\n%s", code, errs, out)
	}

	code, out, errs = kiln(t, state, "", "--json", "stats")
	var rows []statsRow
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil {
		t.Fatalf("stats --json: %d %v %s\n%s", code, err, errs, out)
	}
	if len(rows) != 1 || rows[0].Sandbox != sb || rows[0].CPUSeconds <= 0 || rows[0].CPUPercent <= 0 ||
		rows[0].MemoryLimitBytes == nil || *rows[0].MemoryLimitBytes != 1<<30 || rows[0].ReadAt.IsZero() {
		t.Errorf("stats --json: %s", out)
	}

	if code, _, errs := kiln(t, state, "", "stats", "--no-stream", gone); code == 0 || !strings.Contains(errs, "no sandbox") {
		t.Errorf("stats of a removed sandbox: %d %s", code, errs)
	}
}
