package files

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
)

// TestWatchTreeTellsEachChangeOnce runs the helper's side of a watch on a
// socket pair and makes changes in the tree: each is told once, as the
// event the API documents; a directory made while the watch runs is
// watched too, and a file made in it before its watch came is told as
// created once, never twice, whichever of the two saw it.
func TestWatchTreeTellsEachChangeOnce(t *testing.T) {
	dir := t.TempDir()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "watch")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	helper, agent := conn(pair[0]), conn(pair[1])
	done := make(chan error, 1)
	go func() { done <- watchTree(helper, dir) }()
	defer func() {
		agent.Close() // the agent goes: the helper's next write ends it
		os.WriteFile(filepath.Join(dir, "last"), nil, 0o644)
		if err := <-done; err != nil {
			t.Error(err)
		}
		helper.Close()
	}()
	r := bufio.NewReader(agent)
	agent.SetReadDeadline(time.Now().Add(30 * time.Second))
	var h header
	if line, err := r.ReadBytes('\n'); err != nil || json.Unmarshal(line, &h) != nil || h.Entry == nil || h.Entry.Type != api.FileDir {
		t.Fatalf("header %q (%v)", line, err)
	}
	// next reads events until want's has come, and fails on any that
	// repeats one already told.
	told := map[api.FileEvent]bool{}
	next := func(want api.FileEvent) {
		t.Helper()
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				t.Fatalf("waiting for %+v: %v", want, err)
			}
			var e api.FileEvent
			if err := json.Unmarshal(line, &e); err != nil {
				t.Fatalf("event %q: %v", line, err)
			}
			if told[e] && e.Op != api.FileWritten {
				t.Fatalf("told twice: %+v", e)
			}
			told[e] = true
			if e == want {
				return
			}
		}
	}
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	must(t, os.WriteFile(a, []byte("x"), 0o644))
	next(api.FileEvent{Op: api.FileCreated, Path: a})
	next(api.FileEvent{Op: api.FileWritten, Path: a})
	must(t, os.Rename(a, b))
	next(api.FileEvent{Op: api.FileRenamed, From: a, Path: b})
	// Moved out of the tree: a remove.
	must(t, os.Rename(b, filepath.Join(t.TempDir(), "b")))
	next(api.FileEvent{Op: api.FileRemoved, Path: b})
	sub := filepath.Join(dir, "sub")
	must(t, os.Mkdir(sub, 0o755))
	inner := filepath.Join(sub, "inner")
	must(t, os.WriteFile(inner, nil, 0o644))
	next(api.FileEvent{Op: api.FileCreated, Path: sub, Dir: true})
	next(api.FileEvent{Op: api.FileCreated, Path: inner})
	// Watched now: a write in it is told.
	must(t, os.WriteFile(inner, []byte("y"), 0o644))
	next(api.FileEvent{Op: api.FileWritten, Path: inner})
	must(t, os.Remove(inner))
	next(api.FileEvent{Op: api.FileRemoved, Path: inner})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestReadableOutlastsSignals polls an inotify instance with nothing to
// read while its thread is sent signal after signal (as the runtime's
// preemption does): each poll cut short is made again, and nothing is
// taken for an event.
func TestReadableOutlastsSignals(t *testing.T) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	tid := make(chan int)
	got := make(chan bool)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		got <- readable(fd, 300)
	}()
	thread := <-tid
	for sent := 0; ; sent++ {
		select {
		case r := <-got:
			if r {
				t.Fatalf("readable with no events, after %d signals", sent)
			}
			if sent == 0 {
				t.Log("no signal was sent while it polled")
			}
			return
		default:
			unix.Tgkill(os.Getpid(), thread, unix.SIGURG)
			time.Sleep(time.Millisecond)
		}
	}
}
