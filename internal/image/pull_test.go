package image

import (
	"archive/tar"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

func busyboxImage(t *testing.T) (layerEntries []entry) {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no busybox to build the image from: %v", err)
	}
	return []entry{
		{Name: "bin/", Type: tar.TypeDir},
		{Name: "bin/busybox", Body: string(bb), Mode: 0o755},
		{Name: "bin/sh", Type: tar.TypeSymlink, Link: "busybox", UID: 7, GID: 8},
		{Name: "etc/secret", Body: "s", Mode: 0o600, UID: 1000, GID: 1001},
		{Name: "usr/bin/su", Body: "su", Mode: 0o4755},
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
		{Name: "run/fifo", Type: tar.TypeFifo, Mode: 0o640},
		{Name: "bin/ls", Type: tar.TypeLink, Link: "bin/busybox"},
	}
}

func TestPull(t *testing.T) {
	reg := newRegistry(t)
	entries := busyboxImage(t)
	img := newImage(t, layer(t, entries...))
	ref := reg.push(t, "busybox:latest", img)
	s := openStore(t, t.TempDir(), reg.options())

	var rec recorder
	got, err := s.Pull(context.Background(), ref, rec.add)
	if err != nil {
		t.Fatal(err)
	}
	want := Image{
		ID:       digestOf(t, img.ConfigName),
		Names:    []string{reg.host + "/busybox:latest"},
		Digest:   digestOf(t, img.Digest),
		Layers:   diffIDs(t, img),
		Size:     int64(len(entries[1].Body)) + 1 + 2,
		Created:  testTime,
		Platform: "linux/" + runtime.GOARCH,
		Config: Config{
			Env:        testConfig.Env,
			WorkingDir: testConfig.WorkingDir,
			User:       testConfig.User,
			Entrypoint: testConfig.Entrypoint,
			Cmd:        testConfig.Cmd,
		},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Image{}, "Added")); diff != "" {
		t.Errorf("Pull (-want +got):\n%s", diff)
	}
	if got.Added.IsZero() {
		t.Error("Added is zero")
	}
	if first, last := rec.events[0], rec.events[len(rec.events)-1]; first.Status != StatusResolving || last.Status != StatusDone || last.Bytes != want.Size {
		t.Errorf("progress starts %+v and ends %+v", first, last)
	}
	if seen := rec.statuses(want.Layers[0]); !seen[StatusDownloading] || seen[StatusExists] {
		t.Errorf("statuses of the layer: %v, want downloading", seen)
	}

	dirs, err := s.LayerDirs(got)
	if err != nil || len(dirs) != 1 {
		t.Fatalf("LayerDirs = %v, %v", dirs, err)
	}
	checkTree(t, dirs[0], map[string]fileWant{
		".":           {mode: os.ModeDir | 0o755},
		"bin":         {mode: os.ModeDir | 0o755},
		"bin/busybox": {mode: 0o755, body: entries[1].Body, links: 2},
		"bin/ls":      {mode: 0o755, body: entries[1].Body, links: 2},
		"bin/sh":      {mode: os.ModeSymlink | 0o777, link: "busybox", uid: 7, gid: 8},
		"etc":         {mode: os.ModeDir | 0o755},
		"etc/secret":  {mode: 0o600, body: "s", uid: 1000, gid: 1001},
		"usr":         {mode: os.ModeDir | 0o755},
		"usr/bin":     {mode: os.ModeDir | 0o755},
		"usr/bin/su":  {mode: os.ModeSetuid | 0o755, body: "su"},
		"tmp":         {mode: os.ModeDir | os.ModeSticky | 0o777},
		"run":         {mode: os.ModeDir | 0o755},
		"run/fifo":    {mode: os.ModeNamedPipe | 0o640},
	}, true)

	// A second pull finds the layer stored.
	rec = recorder{}
	again, err := s.Pull(context.Background(), ref, rec.add)
	if err != nil {
		t.Fatal(err)
	}
	if seen := rec.statuses(want.Layers[0]); !seen[StatusExists] || seen[StatusDownloading] {
		t.Errorf("statuses of the layer on a re-pull: %v, want exists", seen)
	}
	if again.ID != got.ID || len(s.List()) != 1 {
		t.Errorf("re-pull made %s; the store lists %d images", again.ID, len(s.List()))
	}
}

type fileWant struct {
	mode     os.FileMode
	body     string
	link     string
	uid, gid int
	links    uint64
}

// checkTree compares the tree at dir with want, exactly: no file more.
// With times, each explicit member's mtime must be the tar's.
func checkTree(t *testing.T, dir string, want map[string]fileWant, times bool) {
	t.Helper()
	got := map[string]fileWant{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		st := fi.Sys().(*syscall.Stat_t)
		f := fileWant{mode: fi.Mode(), uid: int(st.Uid), gid: int(st.Gid)}
		if w, ok := want[rel]; ok && w.links != 0 {
			f.links = st.Nlink
		}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			f.body = string(b)
		case fi.Mode()&os.ModeSymlink != 0:
			f.link, _ = os.Readlink(p)
		}
		if times && (fi.Mode().IsDir() || fi.Mode()&os.ModeSymlink != 0 || fi.Mode().IsRegular()) {
			if !fi.ModTime().Equal(testTime) && rel != "." && !implicitDir(rel, want) {
				t.Errorf("%s: mtime %v, want %v", rel, fi.ModTime(), testTime)
			}
		}
		got[rel] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(fileWant{})); diff != "" {
		t.Errorf("tree %s (-want +got):\n%s", dir, diff)
	}
}

// implicitDir says whether the test's tar left dir implicit (no times).
func implicitDir(dir string, want map[string]fileWant) bool {
	return slices.Contains([]string{"etc", "usr", "usr/bin", "run", "data", "dev"}, dir) && want[dir].mode.IsDir()
}

func TestPullErrors(t *testing.T) {
	reg := newRegistry(t)
	reg.push(t, "there:v1", newImage(t, layer(t, entry{Name: "f", Body: "x"})))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	s := openStore(t, t.TempDir(), reg.options())
	tests := []struct {
		name, ref string
		class     *errdefs.Class
	}{
		{"missing tag", reg.host + "/there:v2", errdefs.ErrNotFound},
		{"missing repository", reg.host + "/nowhere:v1", errdefs.ErrNotFound},
		{"no registry", closed + "/there:v1", errdefs.ErrUnavailable},
		{"bad reference", "UPPER/case:v1", errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Pull(context.Background(), tt.ref, nil)
			wantClass(t, err, tt.class)
		})
	}
	if n := len(s.List()); n != 0 {
		t.Errorf("the store has %d images after failed pulls", n)
	}
}

// fakeTransport records the requests it is given and sends none.
type fakeTransport struct {
	mu      sync.Mutex
	schemes []string
}

func (f *fakeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	f.schemes = append(f.schemes, req.URL.Scheme+"://"+req.URL.Host)
	f.mu.Unlock()
	return nil, errors.New("not sent")
}

// A registry off loopback is reached over TLS only, RFC 1918 addresses
// included, unless listed insecure; no request leaves the test.
func TestPlainHTTPOnlyWhereAllowed(t *testing.T) {
	tests := []struct {
		name     string
		ref      string
		insecure []string
		want     []string
		// class is the pull's: one ggcr tried plain HTTP for, and that
		// was refused, is denied.
		class *errdefs.Class
	}{
		{"private address", "10.1.2.3:5000/x:1", nil, []string{"https://10.1.2.3:5000"}, errdefs.ErrPermissionDenied},
		{"private address listed", "10.1.2.3:5000/x:1", []string{"10.1.2.3:5000"}, []string{"https://10.1.2.3:5000", "http://10.1.2.3:5000"}, errdefs.ErrUnavailable},
		{"name", "registry.example/x:1", nil, []string{"https://registry.example"}, errdefs.ErrUnavailable},
		{"name listed without port", "registry.example:444/x:1", []string{"registry.example"}, []string{"https://registry.example:444", "http://registry.example:444"}, errdefs.ErrUnavailable},
		{"other port", "registry.example:444/x:1", []string{"registry.example:443"}, []string{"https://registry.example:444"}, errdefs.ErrUnavailable},
		{"loopback", "127.0.0.2:5000/x:1", nil, []string{"https://127.0.0.2:5000", "http://127.0.0.2:5000"}, errdefs.ErrUnavailable},
		{"localhost", "localhost:5000/x:1", nil, []string{"https://localhost:5000", "http://localhost:5000"}, errdefs.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := &fakeTransport{}
			s := openStore(t, t.TempDir(), Options{Transport: fake, Insecure: tt.insecure})
			_, err := s.Pull(context.Background(), tt.ref, nil)
			wantClass(t, err, tt.class)
			fake.mu.Lock()
			defer fake.mu.Unlock()
			slices.Sort(fake.schemes)
			want := slices.Sorted(slices.Values(tt.want))
			if diff := cmp.Diff(want, slices.Compact(fake.schemes)); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTLSOnlyRefusesRedirectToPlainHTTP(t *testing.T) {
	fake := &fakeTransport{}
	tr, err := newTLSOnly(fake, nil)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest("GET", "http://192.168.1.1/blob", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.RoundTrip(req); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("plain HTTP to 192.168.1.1: %v", err)
	}
	if len(fake.schemes) != 0 {
		t.Errorf("sent %v", fake.schemes)
	}
	if _, err := newTLSOnly(nil, []string{"https://x"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("insecure entry with a scheme: %v", err)
	}
}

// The overlay of a 3-layer image's LayerDirs shows whiteouts and opaque
// directories as OCI means them.
func TestOverlayOfWhiteouts(t *testing.T) {
	reg := newRegistry(t)
	img := newImage(t,
		layer(t, entry{Name: "etc/", Type: tar.TypeDir}, entry{Name: "etc/hostname", Body: "h"}, entry{Name: "data/w", Body: "w"}),
		layer(t, entry{Name: "etc/a", Body: "a"}, entry{Name: "etc/b", Body: "b"}, entry{Name: "data/x", Body: "x"}, entry{Name: "data/y", Body: "y"}),
		layer(t, entry{Name: "etc/.wh.a"}, entry{Name: "data/.wh..wh..opq"}, entry{Name: "data/z", Body: "z"}),
	)
	ref := reg.push(t, "layered:v1", img)
	s := openStore(t, t.TempDir(), reg.options())
	got, err := s.Pull(context.Background(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := s.LayerDirs(got)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != 3 || filepath.Base(dirs[0]) != got.Layers[2][len("sha256:"):] {
		t.Fatalf("LayerDirs = %v, want 3, top (%s) first", dirs, got.Layers[2])
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dirs[0], "etc/a"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout etc/a: %v, mode %o rdev %d", err, st.Mode, st.Rdev)
	}

	dst := t.TempDir()
	opts := "lowerdir=" + dirs[0] + ":" + dirs[1] + ":" + dirs[2]
	if err := unix.Mount("overlay", dst, "overlay", unix.MS_RDONLY, opts); err != nil {
		t.Skipf("cannot mount an overlay here: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dst, 0); err != nil {
			t.Error(err)
		}
	})
	list := func(d string) []string {
		entries, err := os.ReadDir(filepath.Join(dst, d))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	if diff := cmp.Diff([]string{"b", "hostname"}, list("etc")); diff != "" {
		t.Errorf("/etc (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"z"}, list("data")); diff != "" {
		t.Errorf("/data (-want +got):\n%s", diff)
	}
}

// Two pulls sharing a layer, at once, unpack it once and both succeed.
func TestConcurrentPullsShareLayers(t *testing.T) {
	reg := newRegistry(t)
	shared := layer(t, entry{Name: "shared/big", Body: string(make([]byte, 3<<20))})
	refA := reg.push(t, "a:v1", newImage(t, shared, layer(t, entry{Name: "a", Body: "a"})))
	refB := reg.push(t, "b:v1", newImage(t, shared, layer(t, entry{Name: "b", Body: "b"})))
	sharedID := digestOf(t, shared.DiffID)
	s := openStore(t, t.TempDir(), reg.options())

	var wg sync.WaitGroup
	recs := make([]recorder, 2)
	errs := make([]error, 2)
	images := make([]Image, 2)
	for i, ref := range []string{refA, refB} {
		wg.Go(func() { images[i], errs[i] = s.Pull(context.Background(), ref, recs[i].add) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
	}
	unpacked := 0
	for i := range recs {
		if recs[i].statuses(sharedID)[StatusDownloading] {
			unpacked++
		}
	}
	if unpacked != 1 {
		t.Errorf("the shared layer was unpacked by %d pulls, want 1", unpacked)
	}
	entries, err := os.ReadDir(s.layersDir())
	if err != nil || len(entries) != 3 {
		t.Errorf("layers/ has %d entries (%v), want 3", len(entries), err)
	}
	for _, img := range images {
		dirs, err := s.LayerDirs(img)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(dirs[1], "shared/big")); err != nil || len(b) != 3<<20 {
			t.Errorf("shared/big of %s: %d bytes, %v", img.Names, len(b), err)
		}
	}
}
