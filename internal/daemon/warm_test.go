package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/pidfd/pidfdtest"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// awaitMadeAhead waits until k holds n sandboxes made ahead for the
// namespaces runtime.
func (k *kilnd) awaitMadeAhead(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), faultDeadline)
	defer cancel()
	if err := k.d.AwaitMadeAhead(ctx, sandbox.RuntimeNamespaces, n); err != nil {
		t.Fatalf("%d sandboxes made ahead: %v", n, err)
	}
}

// metric is the value of the sample of metrics named name, as text.
func (k *kilnd) metric(t *testing.T, name string) string {
	t.Helper()
	code, b := k.do("GET", "/metrics", k.d.Token(), nil)
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, b)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			return v
		}
	}
	t.Fatalf("no %s in the metrics", name)
	return ""
}

// TestMadeAhead: a create of the everyday shape takes a sandbox made
// ahead, which until then no list, event or lookup showed; it is the
// caller's as if made for it (its labels and ttl, its creation time, a
// hostname made of its id, a process run in it); a create of another
// shape (a name, a mount) makes its own; kilnd ends those it still holds as it
// closes.
func TestMadeAhead(t *testing.T) {
	shared := t.TempDir()
	k := startConfig(t, daemon.Config{Warm: map[string]int{sandbox.RuntimeNamespaces: 1}, AllowMounts: []string{shared}})
	stopped := false
	defer func() {
		if !stopped {
			k.cleanup()
		}
	}()
	events := k.events(t, "")
	defer events.close()
	k.awaitMadeAhead(t, 1)
	var made map[string]int
	for id, pid := range k.d.MadeAhead(sandbox.RuntimeNamespaces) {
		made = map[string]int{id: pid}
	}
	var list []daemon.Info
	k.json("GET", "/sandboxes?all=true", nil, &list)
	if len(list) != 0 {
		t.Fatalf("a sandbox made ahead is listed: %+v", list)
	}
	for id := range made {
		if code, b := k.do("GET", "/sandboxes/"+id, k.d.Token(), nil); code != http.StatusNotFound {
			t.Fatalf("a sandbox made ahead is found by its id: %d %s", code, b)
		}
	}

	before := time.Now().UTC()
	var info daemon.Info
	k.json("POST", "/sandboxes", map[string]any{"labels": map[string]string{"team": "a"}, "ttl_seconds": 600}, &info)
	if _, ok := made[info.ID]; !ok {
		t.Fatalf("the create made %s, not the sandbox made ahead (%v)", info.ID, made)
	}
	if got := k.metric(t, "kilnd_sandbox_creates_made_ahead_total"); got != "1" {
		t.Errorf("creates made ahead: %s, want 1", got)
	}
	if info.CreatedAt.Before(before) || info.Labels["team"] != "a" || info.TTLSeconds != 600 || info.State != api.SandboxRunning {
		t.Errorf("the sandbox taken is not the create's: %+v (asked at %v)", info, before)
	}
	if info.Hostname != sandbox.DefaultHostname(info.ID) {
		t.Errorf("hostname %q, want %q", info.Hostname, sandbox.DefaultHostname(info.ID))
	}
	if got := strings.TrimSpace(k.sh(t, info.ID, "hostname; echo in it")); got != info.Hostname+"\nin it" {
		t.Errorf("in the sandbox: %q", got)
	}
	// Its creation is the first event: the making told nothing.
	if e := events.next(t); e.Type != api.EventCreated || e.Sandbox != info.ID {
		t.Errorf("first event %+v, want %s created", e, info.ID)
	}
	// Its record is on disk, as a create made for it writes it.
	if _, err := os.Stat(filepath.Join(k.state, "sandboxes", info.ID, "sandbox.json")); err != nil {
		t.Errorf("no record: %v", err)
	}

	// One made ahead is there, and is not taken.
	k.awaitMadeAhead(t, 1)
	var named daemon.Info
	k.json("POST", "/sandboxes", map[string]any{"name": "web"}, &named)
	if got := k.metric(t, "kilnd_sandbox_creates_made_ahead_total"); got != "1" {
		t.Errorf("a named create took a sandbox made ahead (creates made ahead: %s)", got)
	}
	if got := strings.TrimSpace(k.sh(t, named.ID, "hostname")); got != "web" {
		t.Errorf("named sandbox's hostname %q", got)
	}
	// Nor does one with a host directory: the sandbox made ahead has none.
	k.awaitMadeAhead(t, 1)
	var mounted daemon.Info
	k.json("POST", "/sandboxes", map[string]any{"mounts": []api.Mount{{Source: shared, Target: "/shared"}}}, &mounted)
	if got := k.metric(t, "kilnd_sandbox_creates_made_ahead_total"); got != "1" {
		t.Errorf("a create with mounts took a sandbox made ahead (creates made ahead: %s)", got)
	}
	if got := strings.TrimSpace(k.sh(t, mounted.ID, "test -d /shared && echo mounted")); got != "mounted" {
		t.Errorf("mounts: %q", got)
	}

	// kilnd ends the one made behind the one taken as it closes.
	left := k.d.MadeAhead(sandbox.RuntimeNamespaces)
	agents := map[string]*pidfdtest.Process{}
	for id, pid := range left {
		agents[id] = pidfdtest.Watch(t, pid)
	}
	k.cleanup()
	stopped = true
	for id, pid := range left {
		if _, err := os.Stat(filepath.Join(k.state, "sandboxes", id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the directory of %s, made ahead, is left: %v", id, err)
		}
		if !agents[id].Exited(0) {
			t.Errorf("the agent of %s, made ahead, runs on (pid %d)", id, pid)
		}
	}
}

// TestMadeAheadAgentGone: a sandbox made ahead whose agent ended while it
// waited (killed on the host) is never handed out; the create gets one
// that runs.
func TestMadeAheadAgentGone(t *testing.T) {
	k := startConfig(t, daemon.Config{Warm: map[string]int{sandbox.RuntimeNamespaces: 1}})
	defer k.cleanup()
	k.awaitMadeAhead(t, 1)
	var victim string
	for id, pid := range k.d.MadeAhead(sandbox.RuntimeNamespaces) {
		victim = id
		agent := pidfdtest.Watch(t, pid)
		if agent == nil {
			t.Fatalf("the agent of %s is gone before its kill", id)
		}
		agent.Kill()
		if !agent.Exited(time.Minute) {
			t.Fatalf("the agent of %s runs a minute after its kill", id)
		}
	}
	var info daemon.Info
	k.json("POST", "/sandboxes", map[string]any{}, &info)
	if info.ID == victim {
		t.Fatalf("the create was given %s, whose agent was killed", victim)
	}
	if got := strings.TrimSpace(k.sh(t, info.ID, "echo alive")); got != "alive" {
		t.Errorf("in the sandbox: %q", got)
	}
}
