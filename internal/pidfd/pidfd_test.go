package pidfd

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWaitSaysHowItEnded(t *testing.T) {
	for _, c := range []struct {
		script, want string
	}{
		{"exit 0", "exit status 0"},
		{"exit 3", "exit status 3"},
		{"kill -KILL $$", "signal: killed"},
		{"kill -TERM $$", "signal: terminated"},
	} {
		cmd := exec.Command("sh", "-c", c.script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid // Take releases the Process
		ws, err := wait(cmd.Process)
		if err != nil {
			t.Fatalf("%q: %v", c.script, err)
		}
		if got := Describe(ws); got != c.want {
			t.Errorf("%q: %q, want %q", c.script, got, c.want)
		}
		// Reaped: the pid is no longer a child.
		if _, err := syscall.Wait4(pid, nil, syscall.WNOHANG, nil); err != syscall.ECHILD {
			t.Errorf("%q: after Wait, wait4 gave %v, want ECHILD", c.script, err)
		}
	}
}

// Many waits hold no thread each: the point of the package. With a
// blocking wait (os.Process.Wait) every one of them holds an OS thread,
// and the test fails.
func TestWaitsHoldNoThreads(t *testing.T) {
	const n = 64
	before := threads(t)
	var pids []int
	done := make(chan syscall.WaitStatus, n)
	for range n {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, cmd.Process.Pid) // Take releases the Process
		go func() {
			ws, err := wait(cmd.Process)
			if err != nil {
				t.Error(err)
			}
			done <- ws
		}()
	}
	// Every wait is under way once n goroutines in Wait are parked in
	// the poller (the runtime calls that state "IO wait") or blocked in
	// a system call (as a blocking wait is).
	deadline := time.Now().Add(30 * time.Second)
	for waiting() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d waits under way", waiting(), n)
		}
		runtime.Gosched()
	}
	if got := threads(t); got-before >= n/2 {
		t.Errorf("%d threads while %d processes are waited for, %d before", got, n, before)
	}
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for range n {
		if ws := <-done; !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Errorf("status %v, want killed", Describe(ws))
		}
	}
}

func TestAwaitStops(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	f, err := Open(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	close(stop)
	if Await(f, stop) {
		t.Error("Await says a running process exited")
	}
	if Exited(f) {
		t.Error("Exited says a running process exited")
	}
	cmd.Process.Kill()
	if !Await(f, nil) {
		t.Error("Await says a killed process did not exit")
	}
	// Exited says so at once, before the process is reaped.
	if !Exited(f) {
		t.Error("Exited says a killed process did not exit")
	}
	f.Close()
	if !Exited(f) {
		t.Error("Exited says the process of a closed pidfd did not exit")
	}
}

// wait takes p and waits for it.
func wait(p *os.Process) (syscall.WaitStatus, error) {
	pid := p.Pid
	f, err := Take(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if p.Pid != -1 {
		return 0, fmt.Errorf("Take left the process unreleased, pid %d", p.Pid)
	}
	return Wait(f, pid)
}

// threads is this process's thread count.
func threads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads in /proc/self/status")
	return 0
}

// waiting counts the goroutines in Wait that are parked in the poller or
// blocked in a system call.
func waiting() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		blocked := bytes.Contains(g, []byte("[IO wait")) || bytes.Contains(g, []byte("[syscall"))
		if blocked && bytes.Contains(g, []byte("pidfd.Wait(")) {
			n++
		}
	}
	return n
}
