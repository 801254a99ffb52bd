package client_test

import (
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// TestStopStartRestart: a stopped sandbox keeps its files and refuses
// processes; StartAgain runs it again, the same sandbox with a new agent;
// a stop of a stopped one and a start of a running one change nothing
// and describe it; Restart stops and starts; a timeout out of the range
// is refused before anything is sent.
func TestStopStartRestart(t *testing.T) {
	t.Parallel()
	_, sb := kilnd(t)
	ctx := ctxT(t)
	sh := func(script string) string {
		t.Helper()
		res, err := sb.Exec(ctx, client.ExecOptions{Shell: script})
		if err != nil || res.Exit.Code() != 0 {
			t.Fatalf("%q: %+v %v", script, res, err)
		}
		return string(res.Stdout)
	}
	sh("echo kept > /workspace/kept")
	now := time.Duration(0)
	stopped, err := sb.Stop(ctx, client.StopOptions{Timeout: &now})
	if err != nil || stopped.State != api.SandboxStopped || stopped.Reason != "stopped by request" || stopped.ID != sb.ID {
		t.Fatalf("stop: %+v %v", stopped, err)
	}
	if again, err := sb.Stop(ctx, client.StopOptions{}); err != nil || again.State != api.SandboxStopped || !again.StoppedAt.Equal(*stopped.StoppedAt) {
		t.Errorf("a stop of a stopped sandbox: %+v %v", again, err)
	}
	if _, err := sb.Exec(ctx, client.ExecOptions{Command: "true"}); !client.IsFailedPrecondition(err) {
		t.Errorf("exec in a stopped sandbox: %v", err)
	}
	started, err := sb.StartAgain(ctx)
	if err != nil || started.State != api.SandboxRunning || started.AgentPID == 0 || started.AgentPID == sb.Described.AgentPID {
		t.Fatalf("start: %+v %v", started, err)
	}
	if got := sh("cat /workspace/kept"); got != "kept\n" {
		t.Errorf("after the start: %q", got)
	}
	if again, err := sb.StartAgain(ctx); err != nil || again.AgentPID != started.AgentPID {
		t.Errorf("a start of a running sandbox: %+v %v", again, err)
	}
	second := time.Second
	restarted, err := sb.Restart(ctx, client.StopOptions{Timeout: &second})
	if err != nil || restarted.State != api.SandboxRunning || restarted.AgentPID == started.AgentPID {
		t.Errorf("restart: %+v %v", restarted, err)
	}
	if got := sh("cat /workspace/kept"); got != "kept\n" {
		t.Errorf("after the restart: %q", got)
	}
	for _, bad := range []time.Duration{-time.Second, 11 * time.Minute} {
		if _, err := sb.Stop(ctx, client.StopOptions{Timeout: &bad}); !client.IsInvalid(err) {
			t.Errorf("a timeout of %v: %v", bad, err)
		}
	}
	if info, err := sb.Info(ctx); err != nil || info.State != api.SandboxRunning {
		t.Errorf("after the refusals: %+v %v", info, err)
	}
}

// TestPauseResume: a paused sandbox is described paused and refuses a
// process, an error IsPaused reports; a pause of a paused one and a
// resume of a running one change nothing and describe it; resumed, it
// runs processes again; restarted while paused, it runs.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	_, sb := kilnd(t)
	ctx := ctxT(t)
	paused, err := sb.Pause(ctx)
	if err != nil || paused.State != api.SandboxPaused || paused.PausedAt == nil {
		t.Fatalf("pause: %+v %v", paused, err)
	}
	if again, err := sb.Pause(ctx); err != nil || again.State != api.SandboxPaused || !again.PausedAt.Equal(*paused.PausedAt) {
		t.Errorf("a pause of a paused sandbox: %+v %v", again, err)
	}
	if _, err := sb.Exec(ctx, client.ExecOptions{Command: "true"}); !client.IsPaused(err) {
		t.Errorf("exec in a paused sandbox: %v", err)
	}
	resumed, err := sb.Resume(ctx)
	if err != nil || resumed.State != api.SandboxRunning || resumed.PausedAt != nil {
		t.Fatalf("resume: %+v %v", resumed, err)
	}
	if again, err := sb.Resume(ctx); err != nil || again.State != api.SandboxRunning {
		t.Errorf("a resume of a running sandbox: %+v %v", again, err)
	}
	if res, err := sb.Exec(ctx, client.ExecOptions{Shell: "echo resumed"}); err != nil || string(res.Stdout) != "resumed\n" {
		t.Errorf("exec after the resume: %+v %v", res, err)
	}
	// Restarted while paused: resumed, stopped and started again.
	if _, err := sb.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	second := time.Second
	if restarted, err := sb.Restart(ctx, client.StopOptions{Timeout: &second}); err != nil || restarted.State != api.SandboxRunning || restarted.PausedAt != nil {
		t.Errorf("restart of a paused sandbox: %+v %v", restarted, err)
	}
}
