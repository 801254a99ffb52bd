package client_test

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
)

// inside runs sh -c script in the sandbox and returns its output.
func inside(t *testing.T, sb *client.Sandbox, script string) string {
	t.Helper()
	r, err := sb.Exec(ctxT(t), client.ExecOptions{Command: "sh", Args: []string{"-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Exit.Code() != 0 {
		t.Fatalf("%q: %+v, stderr %q", script, r.Exit, r.Stderr)
	}
	return string(r.Stdout)
}

// TestFiles writes, reads, lists, moves and removes files in a sandbox
// as a user of the SDK would, and checks each from inside with the
// sandbox's own tools: what the API writes is the sandbox's root's.
func TestFiles(t *testing.T) {
	t.Parallel()
	k := startKilnd(t)
	_, sb := clientOf(t, k.State)
	ctx := ctxT(t)
	content := make([]byte, 3<<20+17)
	rand.Read(content)
	fi, err := sb.WriteFile(ctx, "/workspace/deep/er/blob.bin", bytes.NewReader(content), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != int64(len(content)) || fi.Mode != "0600" || fi.Type != api.FileRegular || fi.Name != "blob.bin" {
		t.Errorf("written: %+v", fi)
	}
	// Owned by the sandbox's root, with the mode asked; its parents made.
	if got := inside(t, sb, "stat -c '%u %g %a %s' /workspace/deep/er/blob.bin; stat -c '%u %a' /workspace/deep"); got != "0 0 600 3145745\n0 755\n" {
		t.Errorf("inside: %q", got)
	}
	rc, err := sb.ReadFile(ctx, "/workspace/deep/er/blob.bin")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, content) {
		t.Errorf("read %d bytes, not the %d written", len(got), len(content))
	}
	rc, err = sb.ReadFileRange(ctx, "/workspace/deep/er/blob.bin", 1<<20, 100)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, content[1<<20:1<<20+100]) {
		t.Errorf("range: %d bytes, not bytes 1 MiB to +100", len(got))
	}
	// What the sandbox writes, the API reads.
	inside(t, sb, "printf 'from inside' > /workspace/deep/note; ln -s note /workspace/deep/link; mkdir /workspace/deep/sub")
	list, err := sb.ReadDir(ctx, "/workspace/deep")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range list {
		names = append(names, e.Name+":"+e.Type+":"+e.Link)
	}
	if strings.Join(names, " ") != "er:dir: link:symlink:note note:file: sub:dir:" {
		t.Errorf("listing: %v", names)
	}
	if st, err := sb.Stat(ctx, "/workspace/deep/link"); err != nil || st.Type != api.FileSymlink || st.Link != "note" {
		t.Errorf("stat of the link: %+v, %v", st, err)
	}
	if _, err := sb.Mkdir(ctx, "/workspace/made/two", 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Move(ctx, "/workspace/deep/note", "/workspace/made/two/note"); err != nil {
		t.Fatal(err)
	}
	if got := inside(t, sb, "cat /workspace/made/two/note; stat -c %a /workspace/made/two"); got != "from inside700\n" {
		t.Errorf("after mkdir and move: %q", got)
	}
	// A directory is not removed without recursive; then it is.
	if err := sb.Remove(ctx, "/workspace/deep", false); !client.IsFailedPrecondition(err) {
		t.Errorf("removing a full directory: %v", err)
	}
	if err := sb.Remove(ctx, "/workspace/deep", true); err != nil {
		t.Fatal(err)
	}
	if got := inside(t, sb, "test -e /workspace/deep || echo gone"); got != "gone\n" {
		t.Errorf("after remove: %q", got)
	}
	// Errors a user meets, as the API's classes.
	if _, err := sb.ReadFile(ctx, "/workspace/nope"); !client.IsNotFound(err) {
		t.Errorf("a missing file: %v", err)
	}
	if _, err := sb.WriteFile(ctx, "/usr/bin/planted", strings.NewReader("x"), 0); !client.IsPermissionDenied(err) {
		t.Errorf("writing to the read-only /usr: %v", err)
	}
	if _, err := sb.WriteFile(ctx, "relative", strings.NewReader("x"), 0); err == nil {
		t.Error("a relative path was taken")
	}
}

// TestArchive copies a tree into a sandbox and back as tar, as docker cp
// does, and refuses archives whose members would land outside the
// directory they are extracted into.
func TestArchive(t *testing.T) {
	t.Parallel()
	k := startKilnd(t)
	_, sb := clientOf(t, k.State)
	ctx := ctxT(t)
	in := tarOf(t, []tar.Header{
		{Name: "proj/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "proj/main.go", Typeflag: tar.TypeReg, Mode: 0o644, Size: 12},
		{Name: "proj/run.sh", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 12}, // setuid dropped
		{Name: "proj/latest", Typeflag: tar.TypeSymlink, Linkname: "main.go"},
	})
	if err := sb.Extract(ctx, "/workspace", bytes.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if got := inside(t, sb, "cd /workspace/proj && stat -c '%n %u %a' main.go run.sh && readlink latest && cat latest"); got != "main.go 0 644\nrun.sh 0 755\nmain.go\npackage main" {
		t.Errorf("extracted: %q", got)
	}
	rc, top, err := sb.Archive(ctx, "/workspace/proj")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		names = append(names, h.Name)
	}
	rc.Close()
	if top.Type != api.FileDir || strings.Join(names, " ") != "proj/ proj/latest proj/main.go proj/run.sh" {
		t.Errorf("archive of %+v: %v", top, names)
	}
	for _, tc := range []struct {
		name string
		h    tar.Header
		is   func(error) bool
	}{
		{"an absolute name", tar.Header{Name: "/tmp/abs", Typeflag: tar.TypeReg, Mode: 0o644, Size: 12}, client.IsPermissionDenied},
		{"a name with ..", tar.Header{Name: "a/../../escaped", Typeflag: tar.TypeReg, Mode: 0o644, Size: 12}, client.IsPermissionDenied},
		{"a link out", tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}, client.IsPermissionDenied},
		{"an absolute link", tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, client.IsPermissionDenied},
		{"a hard link out", tar.Header{Name: "hard", Typeflag: tar.TypeLink, Linkname: "../etc/passwd"}, client.IsPermissionDenied},
		// Not a file, a directory or a link: not extracted at all.
		{"a device node", tar.Header{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}, client.IsInvalid},
	} {
		// After a file that is fine, which is not extracted either.
		fine := tar.Header{Name: "fine.go", Typeflag: tar.TypeReg, Mode: 0o644, Size: 12}
		err := sb.Extract(ctx, "/workspace/proj", bytes.NewReader(tarOf(t, []tar.Header{fine, tc.h})))
		if !tc.is(err) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if got := inside(t, sb, "ls -A /workspace/proj; ls -A /tmp; test -e /workspace/escaped || echo none"); got != "latest\nmain.go\nrun.sh\nnone\n" {
		t.Errorf("after the refused archives: %q", got)
	}
}

// tarOf writes a tar of hs, each regular file holding "package main"
// (cut to its size).
func tarOf(t *testing.T, hs []tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hs {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("package main")[:h.Size])
		}
	}
	tw.Close()
	return b.Bytes()
}

// TestWatchFiles: what the sandbox's processes do under a directory comes
// as numbered events, in order; a watcher that comes back from the last
// number it saw gets what followed and nothing twice; one that comes back
// after more than the watch holds is told exactly how many it missed.
func TestWatchFiles(t *testing.T) {
	t.Parallel()
	k := startKilnd(t)
	_, sb := clientOf(t, k.State)
	ctx := ctxT(t)
	inside(t, sb, "mkdir -p /workspace/w")
	w, err := sb.WatchFiles(ctx, "/workspace/w", client.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inside(t, sb, "cd /workspace/w && mkdir sub && echo a > sub/f && mv sub/f sub/g && rm sub/g")
	want := []string{"create /workspace/w/sub dir", "create /workspace/w/sub/f", "write /workspace/w/sub/f",
		"rename /workspace/w/sub/f→/workspace/w/sub/g", "remove /workspace/w/sub/g"}
	var got []string
	var last uint64
	for len(got) < len(want) {
		e, err := w.Next()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		if e.Type != "event" || e.Seq != last+1 {
			t.Fatalf("after %v: %+v", got, e)
		}
		last = e.Seq
		s := e.Op + " "
		if e.From != "" {
			s += e.From + "→"
		}
		s += e.Path
		if e.Dir {
			s += " dir"
		}
		got = append(got, s)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	w.Close()
	// Away for a few events: resumed from the last seen, nothing twice.
	inside(t, sb, "echo b > /workspace/w/two")
	w, err = sb.WatchFiles(ctx, "/workspace/w", client.WatchOptions{ID: w.ID, After: last})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := w.Next(); err != nil || e.Type != "event" || e.Seq != last+1 || e.Op != api.FileCreated || e.Path != "/workspace/w/two" {
		t.Errorf("resumed: %+v %v, want event %d creating two", e, err, last+1)
	}
	last++
	w.Close()
	// Away for more than the watch holds: a gap, counted. (Back once the
	// watch has all 5000, as its hello says.)
	inside(t, sb, "cd /workspace/w && for i in $(seq 5000); do : > f$i; done")
	deadline := time.Now().Add(30 * time.Second)
	for {
		w, err = sb.WatchFiles(ctx, "/workspace/w", client.WatchOptions{ID: w.ID, After: last})
		if err != nil {
			t.Fatal(err)
		}
		if w.Seq >= last+5000 || time.Now().After(deadline) {
			break
		}
		w.Close()
		time.Sleep(20 * time.Millisecond)
	}
	defer w.Close()
	e, err := w.Next()
	if err != nil || e.Type != "gap" || e.Lost == 0 {
		t.Fatalf("after 5000 creates away: %+v %v, want a gap", e, err)
	}
	next, err := w.Next()
	if err != nil || next.Type != "event" || next.Seq != e.Seq+1 || e.Seq != last+e.Lost {
		t.Errorf("gap %+v then %+v (%v): want the gap to count exactly what it skipped", e, next, err)
	}
}
