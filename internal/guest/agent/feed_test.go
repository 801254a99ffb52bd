package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/process"
)

// feedLines reads GET /process-events?after= from the agent at url until
// n events have come (n < 0: until the answer ends).
func feedLines(t *testing.T, url, after string, n int) []api.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/process-events?after="+after, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []api.Event
	sc := bufio.NewScanner(resp.Body)
	for (n < 0 || len(out) < n) && sc.Scan() {
		var e api.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%v: %s", err, sc.Bytes())
		}
		out = append(out, e)
	}
	if n >= 0 && len(out) < n {
		t.Fatalf("%d events of %d: %v", len(out), n, sc.Err())
	}
	return out
}

// TestProcessFeed: the agent tells of each process as it starts and once
// it has finished, with its exit and bytes; a reader takes up after the
// last it read; once the agent ends its events, readers get what is held
// and an end.
func TestProcessFeed(t *testing.T) {
	t.Parallel()
	table := process.NewTable(process.TableConfig{})
	s := New(Config{Table: table, Dir: t.TempDir()})
	srv := serveAsTheAgent(s)
	defer srv.Close()
	defer table.Shutdown(context.Background())
	a := &agent{t: t, srv: srv, table: table}
	id := a.start(api.ExecRequest{Command: "sh", Args: []string{"-c", "printf abc; exit 2"}})
	evs := feedLines(t, srv.URL, "0", 2)
	if evs[0].Type != api.EventProcessStarted || evs[0].Seq != 1 || evs[0].Process.ID != id || evs[0].Process.Command != "sh" {
		t.Errorf("the start: %+v", evs[0])
	}
	p := evs[1].Process
	if evs[1].Type != api.EventProcessExited || evs[1].Seq != 2 || p.ID != id || p.ExitCode == nil || *p.ExitCode != 2 ||
		p.Streams["stdout"].TotalBytes != 3 || !p.Streams["stdout"].Ended {
		t.Errorf("the exit: %+v %+v", evs[1], p)
	}
	s.EndEvents(t.Context()) // returns: a reader has been sent every event
	if rest := feedLines(t, srv.URL, "1", -1); len(rest) != 1 || rest[0].Seq != 2 {
		t.Errorf("after 1, the feed ended: %+v", rest)
	}
	if rest := feedLines(t, srv.URL, "now", -1); len(rest) != 0 {
		t.Errorf("from now, the feed ended: %+v", rest)
	}
	if evs := clipArgs([]string{"a", string(make([]byte, maxEventArgs)), "b"}); len(evs) != 2 || evs[1] != "…" {
		t.Errorf("arguments past %d bytes: %q", maxEventArgs, evs)
	}
}
