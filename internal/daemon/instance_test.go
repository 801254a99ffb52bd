package daemon_test

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/sandkiln/sandkiln/internal/daemon"
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
	k := start(t, "")
	sb := k.sandbox()
	var log lockedBuffer
	exe, _ := os.Executable()
	cfg := daemon.Config{StateDir: k.state, Exe: exe, Env: env, Log: slog.New(slog.NewTextHandler(&log, nil))}
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
