package client_test

import (
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// TestStats reads a running sandbox's figures, with the process it runs
// counted, and is refused for a stopped sandbox and an unknown one.
func TestStats(t *testing.T) {
	t.Parallel()
	c, sb := clientOf(t, startKilnd(t).State)
	p, err := sb.Start(ctxT(t), client.StartOptions{Command: "sleep", Args: []string{"600"}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sb.Stats(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	info, err := sb.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Processes == nil || *st.Processes != 1 {
		t.Errorf("processes %v, want 1 (the sleep)", st.Processes)
	}
	if st.Pids == nil || *st.Pids < 1 {
		t.Errorf("pids %v, want the sleep at least", st.Pids)
	}
	if st.MemoryBytes == nil || *st.MemoryBytes <= 0 || st.MemoryLimitBytes == nil || *st.MemoryLimitBytes != info.Limits.MemoryBytes {
		t.Errorf("memory %v of %v, want some of %d", st.MemoryBytes, st.MemoryLimitBytes, info.Limits.MemoryBytes)
	}
	if st.PidsLimit == nil || *st.PidsLimit != info.Limits.Pids {
		t.Errorf("pids limit %v, want %d", st.PidsLimit, info.Limits.Pids)
	}
	if st.CPUSeconds <= 0 || st.OOMKills == nil || *st.OOMKills != 0 {
		t.Errorf("cpu seconds %v, OOM kills %v", st.CPUSeconds, st.OOMKills)
	}
	if time.Since(st.ReadAt) > time.Minute || st.ReadAt.After(time.Now()) {
		t.Errorf("read at %v", st.ReadAt)
	}
	if _, err := p.Terminate(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	// A sandbox whose init command ended has stopped.
	stopped, err := c.CreateSandbox(ctxT(t), client.SandboxOptions{Init: &api.ExecRequest{Command: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		info, err := stopped.Info(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if info.State == api.SandboxStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox of a finished init is %s", info.State)
		}
	}
	if _, err := stopped.Stats(ctxT(t)); !client.IsFailedPrecondition(err) {
		t.Errorf("stats of a stopped sandbox: %v, want failed precondition", err)
	}
	if _, err := c.Handle("no-such-sandbox").Stats(ctxT(t)); !client.IsNotFound(err) {
		t.Errorf("stats of an unknown sandbox: %v, want not found", err)
	}
}
