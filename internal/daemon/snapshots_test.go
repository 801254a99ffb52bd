package daemon_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// stateOn mounts a new file system of kind (ext4, xfs) on a loop device
// for the test, and returns a directory on it for a kilnd's state.
func stateOn(t *testing.T, kind string) string {
	t.Helper()
	mkfs, err := exec.LookPath("mkfs." + kind)
	if err != nil {
		t.Skipf("no mkfs.%s (Debian's %s)", kind, map[string]string{"xfs": "xfsprogs", "ext4": "e2fsprogs"}[kind])
	}
	dir := t.TempDir()
	img := filepath.Join(dir, kind+".img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	// Room for the disks' images (sparse) and what the tests write.
	if err := f.Truncate(8 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	args := []string{"-q", img}
	if kind == "ext4" {
		args = []string{"-q", "-F", img}
	}
	if out, err := exec.Command(mkfs, args...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.%s: %v: %s", kind, err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o700)
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Skipf("mount a loop device: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return filepath.Join(mnt, "state")
}

// manifestScript prints, sorted, every entry under /workspace: its type,
// mode, owner, size, content's hash, link target, link count and
// extended attributes, one a line.
const manifestScript = `python3 - <<'EOF'
import hashlib, os, stat
for root, dirs, files in os.walk("/workspace"):
    dirs.sort()
    for name in sorted(dirs + files):
        p = os.path.join(root, name)
        st = os.lstat(p)
        what = ""
        if stat.S_ISREG(st.st_mode):
            what = hashlib.sha256(open(p, "rb").read()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            what = "-> " + os.readlink(p)
        xattrs = sorted((a, os.getxattr(p, a, follow_symlinks=False).hex()) for a in os.listxattr(p, follow_symlinks=False))
        print(p, oct(st.st_mode), st.st_uid, st.st_gid, st.st_size, st.st_nlink, what, xattrs)
EOF`

// treeScript makes a tree with each kind of thing a snapshot must keep.
const treeScript = `set -e
cd /workspace
mkdir -p src/deep/er && chmod 750 src/deep
printf 'hello\n' > src/a.txt && chmod 640 src/a.txt
head -c 300000 /dev/urandom > src/blob
ln -s a.txt src/link && ln src/a.txt src/hard
mkfifo src/fifo
touch src/owned && chown 1000:2000 src/owned
python3 -c 'import os; os.setxattr("src/a.txt", "user.kiln", b"kept")'
touch empty`

// snapshotOf takes a snapshot of sandbox sb, named name (if any).
func (k *kilnd) snapshotOf(t *testing.T, sb, name string) api.Snapshot {
	t.Helper()
	code, b := k.do("POST", "/sandboxes/"+sb+"/snapshots", k.d.Token(), api.SnapshotRequest{Name: name})
	var snap api.Snapshot
	if code != http.StatusCreated || json.Unmarshal(b, &snap) != nil {
		t.Fatalf("snapshot of %s: %d %s", sb, code, b)
	}
	return snap
}

// createFrom makes a sandbox from snapshot snap.
func (k *kilnd) createFrom(t *testing.T, snap string) string {
	t.Helper()
	code, b := k.do("POST", "/sandboxes", k.d.Token(), api.CreateSandbox{Snapshot: snap})
	var info api.Sandbox
	if code != http.StatusCreated || json.Unmarshal(b, &info) != nil {
		t.Fatalf("create from %s: %d %s", snap, code, b)
	}
	return info.ID
}

func TestSnapshotsOnXFS(t *testing.T)  { testSnapshots(t, "xfs", "reflink") }
func TestSnapshotsOnExt4(t *testing.T) { testSnapshots(t, "ext4", "copy") }

// testSnapshots takes a snapshot, changes the sandbox, rolls it back and
// compares the trees; forks five sandboxes that go their own ways; makes
// one from the snapshot; and checks the snapshot outlives its sandbox and
// kilnd's restart.
func testSnapshots(t *testing.T, fs, copyWay string) {
	state := stateOn(t, fs)
	limits := daemon.DefaultLimits
	limits.DiskBytes = 1 << 30
	k := startConfig(t, daemon.Config{StateDir: state, DefaultLimits: &limits})
	defer func() { k.cleanup() }()

	src := k.made(t, `{"name":"src"}`)
	k.sh(t, src, treeScript)
	before := k.sh(t, src, manifestScript)
	for _, want := range []string{"/workspace/src/owned 0o100644 1000 2000", "/workspace/src/a.txt 0o100640 0 0 6 2", "-> a.txt", "('user.kiln', '6b657074')", "/workspace/src/fifo 0o10644", "/workspace/src/deep 0o40750"} {
		if !strings.Contains(before, want) {
			t.Fatalf("the tree made lacks %q:\n%s", want, before)
		}
	}
	snap := k.snapshotOf(t, "src", "clean")
	if snap.Copy != copyWay || snap.Sandbox != src || snap.Name != "clean" || snap.SizeBytes <= 0 {
		t.Errorf("snapshot on %s: %+v, want copy %s of %s", fs, snap, copyWay, src)
	}

	// A bad step, then the rollback.
	k.sh(t, src, "rm -rf /workspace/src/deep /workspace/src/a.txt && echo bad > /workspace/src/blob && chmod 600 /workspace/empty && touch /workspace/new")
	if after := k.sh(t, src, manifestScript); after == before {
		t.Fatal("the change changed nothing")
	}
	code, b := k.do("POST", "/sandboxes/src/rollback", k.d.Token(), api.RollbackRequest{Snapshot: "clean"})
	if code != http.StatusOK {
		t.Fatalf("rollback: %d %s", code, b)
	}
	if got := k.sh(t, src, manifestScript); got != before {
		t.Errorf("after the rollback:\n%s\nwant, as when the snapshot was taken:\n%s", got, before)
	}
	// The processes of the snapshot are its history.
	code, b = k.do("GET", "/sandboxes/src/exec-stream", k.d.Token(), nil)
	var procs []api.Process
	if code != http.StatusOK || json.Unmarshal(b, &procs) != nil {
		t.Fatalf("processes: %d %s", code, b)
	}
	history := 0
	for _, p := range procs {
		if p.ForkedFrom != nil {
			history++
			if p.ForkedFrom.Snapshot != snap.ID || p.ForkedFrom.Sandbox != src || p.ForkedFrom.Offsets["stdout"] != p.Streams["stdout"].TotalBytes {
				t.Errorf("history %+v of snapshot %s", *p.ForkedFrom, snap.ID)
			}
		}
	}
	if history != len(snap.Processes) || history < 2 {
		t.Errorf("%d processes of its history listed, the snapshot has %d", history, len(snap.Processes))
	}

	// Five forks, each with the files, each its own from there.
	code, b = k.do("POST", "/sandboxes/src/fork", k.d.Token(), api.ForkRequest{Count: 5, Labels: map[string]string{"try": "yes"}})
	var forked api.Forked
	if code != http.StatusCreated || json.Unmarshal(b, &forked) != nil || len(forked.Sandboxes) != 5 {
		t.Fatalf("fork: %d %s", code, b)
	}
	for i, f := range forked.Sandboxes {
		if f.Labels["try"] != "yes" || f.Limits != k.info(t, src).Limits {
			t.Errorf("fork %d: labels %v, limits %+v", i, f.Labels, f.Limits)
		}
		if got := k.sh(t, f.ID, manifestScript); got != before {
			t.Errorf("fork %d:\n%s\nwant:\n%s", i, got, before)
		}
		k.sh(t, f.ID, fmt.Sprintf("echo %d > /workspace/who && echo fork%d >> /workspace/src/a.txt", i, i))
	}
	for i, f := range forked.Sandboxes {
		if got := k.sh(t, f.ID, "cat /workspace/who /workspace/src/a.txt"); got != fmt.Sprintf("%d\nhello\nfork%d\n", i, i) {
			t.Errorf("fork %d has %q", i, got)
		}
	}
	if got := k.sh(t, src, "cat /workspace/src/a.txt; ls /workspace"); got != "hello\nempty\nsrc\n" {
		t.Errorf("the sandbox forked has %q: a fork's writes reached it", got)
	}
	code, b = k.do("GET", "/snapshots", k.d.Token(), nil)
	var snaps []api.Snapshot
	if code != http.StatusOK || json.Unmarshal(b, &snaps) != nil || len(snaps) != 1 {
		t.Errorf("the snapshots after the fork: %d %s (want the one taken, the fork's own removed)", code, b)
	}

	// A sandbox made from the snapshot; the snapshot outlives its sandbox
	// and kilnd.
	if err := k.d.Delete(src, true); err != nil {
		t.Fatal(err)
	}
	k.stop()
	// A fork's snapshot, as a kilnd that stopped during the fork left it:
	// the next removes it, not the one taken.
	left := filepath.Join(state, "snapshots", strings.Repeat("f0", 32))
	if err := os.MkdirAll(filepath.Join(left, "logs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "snapshot.json"), []byte(`{"id":"`+filepath.Base(left)+`","transient":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	k = startConfig(t, daemon.Config{StateDir: state, DefaultLimits: &limits})
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a fork's snapshot left by the kilnd before: %v, want it removed", err)
	}
	from := k.createFrom(t, api.ShortID(snap.ID))
	if got := k.sh(t, from, manifestScript); got != before {
		t.Errorf("made from the snapshot after a restart:\n%s\nwant:\n%s", got, before)
	}
	if code, b := k.do("DELETE", "/snapshots/clean", k.d.Token(), nil); code != http.StatusNoContent {
		t.Errorf("remove the snapshot: %d %s", code, b)
	}
	if got := k.sh(t, from, "cat /workspace/src/a.txt"); got != "hello\n" {
		t.Errorf("a sandbox made from a removed snapshot has %q", got)
	}
	if code, _ := k.do("GET", "/snapshots/"+snap.ID, k.d.Token(), nil); code != http.StatusNotFound {
		t.Errorf("a removed snapshot: %d", code)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "snapshots")); len(ents) != 0 {
		t.Errorf("left in the snapshots' directory: %v", ents)
	}
}

// info describes sandbox sb.
func (k *kilnd) info(t *testing.T, sb string) api.Sandbox {
	t.Helper()
	code, b := k.do("GET", "/sandboxes/"+sb, k.d.Token(), nil)
	var info api.Sandbox
	if code != http.StatusOK || json.Unmarshal(b, &info) != nil {
		t.Fatalf("sandbox %s: %d %s", sb, code, b)
	}
	return info
}

// TestSnapshotWhileWriting takes snapshots while a process appends lines
// as fast as it can, a write each: in each, the file holds whole lines, in
// order, from the first (a write is in a snapshot whole, or not at all).
func TestSnapshotWhileWriting(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	sb := k.made(t, "{}")
	code, b := k.do("POST", "/sandboxes/"+sb+"/exec-stream", k.d.Token(),
		api.ExecRequest{Command: "python3", Args: []string{"-c", `import os
fd = os.open("/workspace/out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
i = 0
while True:
    os.write(fd, b"line %d\n" % i)
    i += 1`}})
	if code != http.StatusOK && code != http.StatusCreated {
		t.Fatalf("start the writer: %d %s", code, b)
	}
	k.sh(t, sb, "until [ -e /workspace/out ] && [ $(wc -l < /workspace/out) -ge 1000 ]; do :; done")
	for range 3 {
		snap := k.snapshotOf(t, sb, "")
		f := k.createFrom(t, snap.ID)
		// Checked in the sandbox: the file is larger than an exec's output.
		out := k.sh(t, f, `awk '$0 != "line " NR-1 { print "line " NR ": " $0; exit } END { print NR }' /workspace/out; tail -c 1 /workspace/out | od -An -c`)
		n, err := strconv.Atoi(strings.Fields(out)[0])
		if err != nil || n < 1000 || !strings.HasSuffix(out, "\\n\n") {
			t.Fatalf("the snapshot's file (lines, then its last byte): %q; want 1000 whole lines or more, in order", out)
		}
		k.d.Delete(f, true)
	}
}

// TestSnapshotRefusals: a sandbox without a disk of its own, kilnd's
// quota, a name taken, a snapshot of another sandbox to roll back to.
func TestSnapshotRefusals(t *testing.T) {
	k := startConfig(t, daemon.Config{SnapshotQuota: 64 << 10})
	defer k.cleanup()
	sb := k.made(t, "{}")
	nodisk := k.made(t, `{"limits":{"disk_bytes":0}}`)
	code, b := k.do("POST", "/sandboxes/"+nodisk+"/snapshots", k.d.Token(), nil)
	if code != http.StatusPreconditionFailed || !strings.Contains(string(b), "no disk of its own") {
		t.Errorf("a sandbox without a disk: %d %s", code, b)
	}
	k.sh(t, sb, "head -c 1000000 /dev/urandom > /workspace/big && sync")
	code, b = k.do("POST", "/sandboxes/"+sb+"/snapshots", k.d.Token(), nil)
	if code != http.StatusForbidden || !strings.Contains(string(b), "snapshot quota") || !strings.Contains(string(b), "--snapshot-quota") {
		t.Errorf("past the quota: %d %s", code, b)
	}
	if ents, _ := os.ReadDir(filepath.Join(k.state, "snapshots")); len(ents) != 0 {
		t.Errorf("a refused snapshot left %v", ents)
	}
	for _, c := range []struct{ body, want string }{
		{`{"name":"Not A Label"}`, "snapshot name"},
		{`{"nme":"x"}`, "unknown field"},
	} {
		if code, b := k.do("POST", "/sandboxes/"+sb+"/snapshots", k.d.Token(), c.body); code != http.StatusBadRequest || !strings.Contains(string(b), c.want) {
			t.Errorf("%s: %d %s", c.body, code, b)
		}
	}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/sandboxes/" + sb + "/rollback", `{"snapshot":"nosuch"}`},
		{"GET", "/snapshots/nosuch", ""},
		{"DELETE", "/snapshots/nosuch", ""},
		{"POST", "/sandboxes", `{"snapshot":"nosuch"}`},
	} {
		if code, b := k.do(c.method, c.path, k.d.Token(), c.body); code != http.StatusNotFound {
			t.Errorf("%s %s %s: %d %s", c.method, c.path, c.body, code, b)
		}
	}
	for _, body := range []string{`{"count":0}`, `{"count":65}`, `{"count":-1}`} {
		if body == `{"count":0}` {
			continue // the default, one
		}
		if code, b := k.do("POST", "/sandboxes/"+sb+"/fork", k.d.Token(), body); code != http.StatusBadRequest || !strings.Contains(string(b), "count") {
			t.Errorf("fork %s: %d %s", body, code, b)
		}
	}
}

// made makes a sandbox of the create request body and returns its id.
func (k *kilnd) made(t *testing.T, body string) string {
	t.Helper()
	var info daemon.Info
	k.json("POST", "/sandboxes", body, &info)
	return info.ID
}

// TestSnapshotExportImport moves a snapshot to another kilnd as a tar: a
// sandbox made from it there has the same tree, its owners shifted into
// that kilnd's range; tars not of an export are refused whole.
func TestSnapshotExportImport(t *testing.T) {
	from := start(t, "")
	defer from.cleanup()
	sb := from.made(t, "{}")
	from.sh(t, sb, treeScript)
	before := from.sh(t, sb, manifestScript)
	snap := from.snapshotOf(t, sb, "moving")
	code, tarball := from.do("GET", "/snapshots/moving/export", from.d.Token(), nil)
	if code != http.StatusOK {
		t.Fatalf("export: %d %s", code, tarball)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(tarball))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the export is not a whole tar: %v", err)
		}
		names = append(names, hdr.Name)
	}
	if len(names) < 3 || names[0] != "snapshot.json" || !strings.HasPrefix(names[1], "disk/") {
		t.Errorf("the export's entries: %v", names)
	}

	to := start(t, "")
	defer to.cleanup()
	code, b := to.do("POST", "/snapshots/import", to.d.Token(), string(tarball))
	var got api.Snapshot
	if code != http.StatusCreated || json.Unmarshal(b, &got) != nil || got.ID != snap.ID || got.Name != "moving" {
		t.Fatalf("import: %d %s", code, b)
	}
	if code, b := to.do("POST", "/snapshots/import", to.d.Token(), string(tarball)); code != http.StatusConflict {
		t.Errorf("the same import again: %d %s", code, b)
	}
	made := to.createFrom(t, "moving")
	if after := to.sh(t, made, manifestScript); after != before {
		t.Errorf("made from the imported snapshot:\n%s\nwant:\n%s", after, before)
	}

	// Tars that are not an export's, each refused with nothing kept.
	if code, _ := to.do("DELETE", "/snapshots/moving", to.d.Token(), nil); code != http.StatusNoContent {
		t.Fatalf("remove: %d", code)
	}
	tr = tar.NewReader(bytes.NewReader(tarball))
	tr.Next()
	record, _ := io.ReadAll(tr)
	entries := func(es ...[2]string) string {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range es {
			tw.WriteHeader(&tar.Header{Name: e[0], Mode: 0o600, Size: int64(len(e[1])), Typeflag: tar.TypeReg})
			tw.Write([]byte(e[1]))
		}
		tw.Close()
		return buf.String()
	}
	rec := string(record)
	for _, c := range []struct {
		name, body string
		code       int
	}{
		{"no record first", entries([2]string{"disk/0000000000000000", "x"}, [2]string{"snapshot.json", rec}), 400},
		{"a path out", entries([2]string{"snapshot.json", rec}, [2]string{"logs/../../etc/passwd", "x"}), 400},
		{"another entry", entries([2]string{"snapshot.json", rec}, [2]string{"bin/sh", "x"}), 400},
		{"runs out of order", entries([2]string{"snapshot.json", rec}, [2]string{"disk/0000000000001000", "x"}, [2]string{"disk/0000000000000000", "x"}), 400},
		{"a run past the disk", entries([2]string{"snapshot.json", rec}, [2]string{"disk/7fffffffffffff00", "x"}), 400},
		{"a record of another shape", entries([2]string{"snapshot.json", `{"id":"../x"}`}), 400},
		{"cut short", string(tarball[:len(tarball)/2]), 400},
	} {
		if code, b := to.do("POST", "/snapshots/import", to.d.Token(), c.body); code != c.code {
			t.Errorf("%s: %d %s, want %d", c.name, code, b, c.code)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(to.state, "snapshots")); len(ents) != 0 {
		t.Errorf("refused imports left %v", ents)
	}
	// A record naming the node it came from: a kilnd in no cluster
	// names none, as before.
	var claimed map[string]any
	json.Unmarshal(record, &claimed)
	claimed["node"], claimed["node_state"] = "elsewhere", "lost"
	named, _ := json.Marshal(claimed)
	code, b = to.do("POST", "/snapshots/import", to.d.Token(), entries([2]string{"snapshot.json", string(named)}))
	if code != http.StatusCreated || strings.Contains(string(b), `"node`) {
		t.Errorf("import of a record naming a node: %d %s", code, b)
	}
	for _, path := range []string{"/snapshots", "/snapshots/moving"} {
		if code, b := to.do("GET", path, to.d.Token(), nil); code != http.StatusOK || strings.Contains(string(b), `"node`) {
			t.Errorf("GET %s on a kilnd in no cluster: %d %s, want no node", path, code, b)
		}
	}
}

// TestMemoryFork forks a running gVisor sandbox whose process counts in
// memory: in each fork the process is listed running, its output up to
// the fork is the original's byte for byte at the same offsets, and it
// counts on from where it was. A namespace sandbox's memory snapshot is
// refused, saying why.
func TestMemoryFork(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	ns := k.made(t, "{}")
	code, b := k.do("POST", "/sandboxes/"+ns+"/snapshots", k.d.Token(), api.SnapshotRequest{Memory: true})
	if code != http.StatusPreconditionFailed || !strings.Contains(string(b), "CRIU") {
		t.Errorf("a namespace sandbox's memory snapshot: %d %s", code, b)
	}

	sb := createGVisor(t, k, `{"runtime":"gvisor","limits":{"memory_bytes":268435456}}`).ID
	var started api.Started
	k.json("POST", "/sandboxes/"+sb+"/exec-stream", api.ExecRequest{Command: "python3", Args: []string{"-u", "-c",
		"import time\ni = 0\nwhile True:\n    i += 1\n    print(i)\n    time.sleep(0.02)"}}, &started)
	output := func(sb string) string {
		t.Helper()
		code, b := k.do("GET", "/sandboxes/"+sb+"/exec-stream/"+started.ID+"/logs?follow=false&stdout=0", k.d.Token(), nil)
		if code != http.StatusOK {
			t.Fatalf("output in %s: %d %s", sb, code, b)
		}
		return string(b)
	}
	// Counting, before the fork.
	k.sh(t, sb, "true")
	for len(strings.Split(output(sb), "\n")) < 20 {
		k.sh(t, sb, "sleep 0.1")
	}
	var forked api.Forked
	k.json("POST", "/sandboxes/"+sb+"/fork", api.ForkRequest{Count: 2}, &forked)
	original := output(sb)
	for _, f := range forked.Sandboxes {
		var p api.Process
		k.json("GET", "/sandboxes/"+f.ID+"/exec-stream/"+started.ID, nil, &p)
		if p.State != api.StateRunning || p.ForkedFrom != nil {
			t.Errorf("fork %s: the process is %+v, want it running on", f.ID, p)
		}
		// It counts on: wait until it has written past where it was.
		at := p.Streams["stdout"].TotalBytes
		for int64(len(output(f.ID))) <= at+10 {
			k.sh(t, f.ID, "sleep 0.1")
		}
		out := output(f.ID)
		if at == 0 || len(original) < int(at) || out[:at] != original[:at] {
			t.Fatalf("fork %s's output to offset %d is not the original's", f.ID, at)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		for i, l := range lines {
			if l != strconv.Itoa(i+1) {
				t.Fatalf("fork %s: line %d is %q: the count did not go on where it was", f.ID, i+1, l)
			}
		}
	}
	if len(forked.Sandboxes) != 2 || forked.Sandboxes[0].Runtime != "gvisor" {
		t.Errorf("forked: %+v", forked)
	}
}

// TestFrozenDiskThawedOnAdoption: a kilnd that stops while a snapshot
// holds a sandbox's disk frozen leaves it frozen; the next one thaws it
// as it takes the sandbox back, and its processes write again.
func TestFrozenDiskThawedOnAdoption(t *testing.T) {
	k := start(t, "")
	sb := k.made(t, "{}")
	if err := k.d.FreezeDisk(sb); err != nil {
		t.Fatal(err)
	}
	k.stop()
	k = start(t, k.state)
	defer k.cleanup()
	// Bounded by the exec's timeout: a frozen disk would hold the write.
	k.sh(t, sb, "echo written > /workspace/after && cat /workspace/after")
}
