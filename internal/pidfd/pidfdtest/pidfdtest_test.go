package pidfdtest_test

import (
	"os/exec"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/internal/pidfd/pidfdtest"
)

// TestWatch: a running process has not exited, now or within a while; a
// killed one has, before it is reaped (a zombie) and after.
func TestWatch(t *testing.T) {
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := pidfdtest.Watch(t, cmd.Process.Pid)
	if p.Exited(0) || p.Exited(50*time.Millisecond) {
		t.Fatal("a running process has exited")
	}
	p.Kill()
	if !p.Exited(time.Minute) || !p.Exited(0) {
		t.Fatal("a killed process, not yet reaped, runs on")
	}
	cmd.Wait()
	if !p.Exited(0) {
		t.Error("a reaped process runs on")
	}
}
