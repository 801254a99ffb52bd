package daemon_test

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
)

// lockedBuffer is a log's destination that a test reads while kilnd may
// still write.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSecondKilndOnTheStateDir: a second kilnd on a state directory in
// use is refused before it reads a record: it says nothing of the first
// one's sandboxes, which run on; once the first has stopped, a kilnd
// starts there.
func TestSecondKilndOnTheStateDir(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	sb := k.sandbox()
	var log lockedBuffer
	exe, _ := os.Executable()
	claims, err := daemontest.ClaimsDir(k.state)
	if err != nil {
		t.Fatal(err)
	}
	cfg := daemon.Config{StateDir: k.state, Exe: exe, Env: env, Log: slog.New(slog.NewTextHandler(&log, nil)), ClaimsDir: claims}
	if d, err := daemon.New(cfg); err == nil {
		d.Close()
		t.Fatal("a second kilnd started on a state directory in use")
	} else if !strings.Contains(err.Error(), "uses the state directory "+k.state) {
		t.Errorf("second kilnd: %v, want it to say another kilnd uses the state directory", err)
	}
	if strings.Contains(log.String(), sb) || strings.Contains(log.String(), "adopted") {
		t.Errorf("the refused kilnd spoke of the first one's sandboxes:\n%s", log.String())
	}
	var info daemon.Info
	k.json("GET", "/sandboxes/"+sb, nil, &info)
	if info.State != daemon.StateRunning {
		t.Errorf("the first kilnd's sandbox after the refusal: %s (%s)", info.State, info.Reason)
	}
	k.stop()
	d, err := daemon.New(cfg)
	if err != nil {
		t.Fatalf("after the first kilnd stopped: %v", err)
	}
	if !strings.Contains(log.String(), "sandbox adopted") || !strings.Contains(log.String(), sb) {
		t.Errorf("the next kilnd did not adopt the sandbox:\n%s", log.String())
	}
	if err := d.Delete(sb, true); err != nil {
		t.Error(err)
	}
	d.Close()
}

func TestDefaultInstance(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ dir, begins string }{
		{"/var/lib/sandkiln", "sandkiln-"},
		{"/srv/Kiln_State.2", "kiln-state-2-"},
		{"/srv/a-very-long-state-directory-name", "a-very-long-stat-"},
		{"/", "kilnd-"},
		{"/srv/---", "kilnd-"},
		{dir, filepath.Base(dir) + "-"},
	} {
		name := daemon.DefaultInstance(tc.dir)
		if !strings.HasPrefix(name, tc.begins) || len(name) != len(tc.begins)+6 {
			t.Errorf("DefaultInstance(%q) = %q, want %q and six hex digits", tc.dir, name, tc.begins)
		}
		if err := daemon.ValidateInstance(name); err != nil {
			t.Errorf("DefaultInstance(%q) = %q: %v", tc.dir, name, err)
		}
		if again := daemon.DefaultInstance(tc.dir + "/"); again != name {
			t.Errorf("DefaultInstance(%q/) = %q, not %q", tc.dir, again, name)
		}
	}
	if daemon.DefaultInstance("/a/sandkiln") == daemon.DefaultInstance("/b/sandkiln") {
		t.Error("two state directories of one name have one instance")
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if daemon.DefaultInstance(link) != daemon.DefaultInstance(dir) {
		t.Error("a state directory reached through a link has an instance of its own")
	}
}
