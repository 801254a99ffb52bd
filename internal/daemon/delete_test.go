package daemon_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// deleteRecord reads sandbox id's record from the state directory, as a
// restarted kilnd would.
func (k *kilnd) deleteRecord(id string) (state string, cg *sandbox.Cgroups) {
	k.t.Helper()
	b, err := os.ReadFile(filepath.Join(k.state, "sandboxes", id, "sandbox.json"))
	if err != nil {
		k.t.Fatal(err)
	}
	var rec struct {
		State   string `json:"state"`
		Sandbox struct {
			Cgroups *sandbox.Cgroups `json:"cgroups"`
		} `json:"sandbox"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		k.t.Fatalf("record of %s: %v", id, err)
	}
	return rec.State, rec.Sandbox.Cgroups
}

// deleteShown fails the test if kilnd shows sandbox id: by its id, or in
// its list.
func (k *kilnd) deleteShown(id string) {
	k.t.Helper()
	if code, b := k.do("GET", "/sandboxes/"+id, k.d.Token(), nil); code != 404 {
		k.t.Errorf("GET the deleted sandbox: %d %s", code, b)
	}
	var list []api.Sandbox
	k.json("GET", "/sandboxes", nil, &list)
	if slices.ContainsFunc(list, func(s api.Sandbox) bool { return s.ID == id }) {
		k.t.Errorf("the deleted sandbox is listed: %+v", list)
	}
}

// TestDeleteUnfinished: a delete that fails half-way, its record not
// written for want of space in the state directory, is answered as done
// and the sandbox is never shown again, by this kilnd or by one started
// while the deletion is unfinished; once there is space, the deletion
// finishes by itself: the record says deleted, the captured logs stay.
func TestDeleteUnfinished(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	faultMount(t, k.faultSandboxes(), 4<<20)
	id := k.sandbox()
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+id+"/exec-stream", api.ExecRequest{Command: "echo", Args: []string{"kept"}, Capture: true}, &api.Started{})
	k.json("POST", "/sandboxes/"+id+"/exec", api.ExecRequest{Command: "true"}, &res)
	var logs []api.CapturedLog
	k.json("GET", "/sandboxes/"+id+"/logs", nil, &logs)
	if len(logs) != 1 {
		t.Fatalf("captured logs %+v", logs)
	}
	pid := logs[0].Process
	k.faultCaptureEnded(id, pid)

	// The state directory's sandboxes are full: no record can be written.
	filler := filepath.Join(k.faultSandboxes(), "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 8<<20)); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("filling the state directory: %v", err)
	}
	f.Close()

	if code, b := k.do("DELETE", "/sandboxes/"+id, k.d.Token(), nil); code != 204 {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	k.deleteShown(id)
	if k.d.Unfinished(id) == nil {
		t.Fatal("the deletion finished on a full state directory")
	}
	if state, _ := k.deleteRecord(id); state != api.SandboxRunning {
		t.Fatalf("the record says %q: the fault did not take", state)
	}

	// A kilnd started meanwhile finds the deletion by its marker.
	k.stop()
	k = start(t, k.state)
	defer k.cleanup()
	k.deleteShown(id)
	done := k.d.Unfinished(id)
	if done == nil {
		t.Fatal("the restarted kilnd has no unfinished deletion")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(faultDeadline):
		t.Fatal("the deletion did not finish once there was space")
	}
	if state, _ := k.deleteRecord(id); state != api.SandboxDeleted {
		t.Errorf("the record says %q, want deleted", state)
	}
	k.deleteShown(id)
	if code, b := k.do("GET", "/sandboxes/"+id+"/logs/"+pid, k.d.Token(), nil); code != 200 || string(b) != "kept\n" {
		t.Errorf("captured log after the delete: %d %q", code, b)
	}
	if ents, err := os.ReadDir(filepath.Join(k.state, "deleting")); err != nil || len(ents) != 0 {
		t.Errorf("markers left: %v %v", ents, err)
	}
}

// TestKeepDeleted: a deleted sandbox's captured logs stay for
// --keep-deleted, and then its record and directory are removed. The
// removal is seen as the kernel reports it (inotify), not slept for.
func TestKeepDeleted(t *testing.T) {
	t.Parallel()
	const keep = 4 * time.Second
	k := startConfig(t, daemon.Config{KeepDeleted: keep})
	defer k.cleanup()
	id := k.sandbox()
	var st api.Started
	k.json("POST", "/sandboxes/"+id+"/exec-stream", api.ExecRequest{Command: "echo", Args: []string{"kept"}, Capture: true}, &st)
	k.faultWait(id, st.ID)
	k.faultCaptureEnded(id, st.ID)

	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, k.faultSandboxes(), unix.IN_DELETE); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	if code, b := k.do("DELETE", "/sandboxes/"+id, k.d.Token(), nil); code != 204 {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	if code, b := k.do("GET", "/sandboxes/"+id+"/logs/"+st.ID, k.d.Token(), nil); code != 200 || string(b) != "kept\n" {
		t.Fatalf("captured log just after the delete: %d %q", code, b)
	}
	deleteAwaitRemoved(t, fd, id)
	if since := time.Since(deleted); since < keep {
		t.Errorf("removed %v after the delete, before --keep-deleted %v", since, keep)
	}
	if code, b := k.do("GET", "/sandboxes/"+id+"/logs/"+st.ID, k.d.Token(), nil); code != 404 {
		t.Errorf("captured log after --keep-deleted: %d %q", code, b)
	}
	if _, err := os.Stat(filepath.Join(k.faultSandboxes(), id)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sandbox's directory: %v", err)
	}
}

// deleteAwaitRemoved waits, bounded, for inotify descriptor fd, watching
// the sandboxes' directory, to report sandbox id's directory removed.
func deleteAwaitRemoved(t *testing.T, fd int, id string) {
	t.Helper()
	deadline := time.Now().Add(faultDeadline)
	buf := make([]byte, 64<<10)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("the directory of %s was not removed", id)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(left/time.Millisecond)+1); err != nil && err != unix.EINTR {
			t.Fatal(err)
		}
		n, err := unix.Read(fd, buf)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			// struct inotify_event: wd, mask, cookie, len, then the name.
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			size := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+size]), "\x00")
			if mask&unix.IN_ISDIR != 0 && name == id {
				return
			}
			off += unix.SizeofInotifyEvent + size
		}
	}
}

// TestForkBombDeleted: a sandbox whose processes fork as fast as they can,
// up to its pids limit, each leaving its process group, is deleted in
// under 2 s, and nothing of it is left in its cgroups (which exist no
// more: a group is removed only empty).
func TestForkBombDeleted(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	const limit = 256
	var info api.Sandbox
	k.json("POST", "/sandboxes", api.CreateSandbox{Limits: api.LimitsRequest{Pids: new(int64(limit))}}, &info)
	_, cg := k.deleteRecord(info.ID)
	if cg == nil || cg.V2 == "" {
		t.Fatalf("no cgroups recorded for %s", info.ID)
	}
	dirs := []string{cg.V2}
	for _, d := range cg.V1 {
		dirs = append(dirs, d)
	}
	// The group whose limit the sandbox's processes share: its
	// pids.events counts the forks the limit refused.
	limited := filepath.Join(cg.V2, "procs")
	if cg.Procs != "" {
		limited = cg.Procs
	}
	// Each of the bomb's processes starts two more, each in a session of
	// its own (out of its process group, which a kill of the group would
	// reach), and stays, holding the output open.
	bomb := `printf '%s\n' 'setsid sh /tmp/bomb & setsid sh /tmp/bomb & exec sleep 1000' >/tmp/bomb; exec sh /tmp/bomb`
	k.json("POST", "/sandboxes/"+info.ID+"/exec-stream", api.ExecRequest{Command: "sh", Args: []string{"-c", bomb}}, &api.Started{})
	// The bomb has filled its limit once the kernel refused it a fork.
	deadline := time.Now().Add(faultDeadline)
	for {
		b, err := os.ReadFile(filepath.Join(limited, "pids.events"))
		if err != nil {
			t.Fatal(err)
		}
		if max, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "max "); ok && max != "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fork bomb never reached its limit: pids.events %q", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var st api.SandboxStats
	k.json("GET", "/sandboxes/"+info.ID+"/stats", nil, &st)
	if st.Pids == nil || *st.Pids < limit/2 {
		t.Fatalf("the fork bomb runs %v tasks, want some hundreds", st.Pids)
	}
	began := time.Now()
	code, b := k.do("DELETE", "/sandboxes/"+info.ID, k.d.Token(), nil)
	took := time.Since(began)
	if code != 204 {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	t.Logf("deleted in %v", took)
	// About 0.3 s here, 1.4 s with a whole CI run beside it; about 6 s
	// without the freeze and kill of the sandbox's processes. The bound
	// is between, with room for a loaded machine.
	if took >= 4*time.Second {
		t.Errorf("the fork bomb's sandbox took %v to delete, want under 2 s (4 s on a loaded machine)", took)
	}
	if k.d.Unfinished(info.ID) != nil {
		t.Errorf("the deletion is unfinished")
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			t.Errorf("cgroup %s is still there (%v), its tasks %q", d, err, procs)
		}
	}
}
