package files

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
)

// TestUploadReplaces: an upload puts the whole body in the target's
// place; a file replaced keeps its owner and group, and its permission
// unless ?mode= says another (setuid and setgid dropped); a new file
// belongs to the helper's user, 0644, its parents made; no temporary
// file stays.
func TestUploadReplaces(t *testing.T) {
	a := newAgent(t)
	for _, way := range ways {
		t.Run(way, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "conf")
			if err := os.WriteFile(p, []byte("old content, longer than the new"), 0o640); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, 1234, 2345); err != nil {
				t.Fatal(err)
			}
			put := func(route, body string) api.FileInfo {
				t.Helper()
				code, b := do(t, "PUT", a.url(way, route), strings.NewReader(body))
				var fi api.FileInfo
				if code != 200 || json.Unmarshal([]byte(b), &fi) != nil {
					t.Fatalf("PUT %s: %d %s", route, code, b)
				}
				return fi
			}
			fi := put("/files"+p, "new")
			if fi.Name != "conf" || fi.Size != 3 || fi.Mode != "0640" || fi.Type != api.FileRegular {
				t.Errorf("answered %+v", fi)
			}
			if b, _ := os.ReadFile(p); string(b) != "new" {
				t.Errorf("content %q", b)
			}
			if got := owner(t, p); got != "1234:2345 0640" {
				t.Errorf("replaced: %s, want its owner and mode kept", got)
			}
			put("/files"+p+"?mode=0600", "newer")
			if got := owner(t, p); got != "1234:2345 0600" {
				t.Errorf("replaced with ?mode=0600: %s", got)
			}
			if err := os.Chmod(p, 0o4755); err != nil {
				t.Fatal(err)
			}
			put("/files"+p, "newest")
			if got := owner(t, p); got != "1234:2345 0755" {
				t.Errorf("replaced a setuid file: %s, want setuid dropped", got)
			}
			deep := filepath.Join(dir, "new", "er", "file")
			put("/files"+deep, "made")
			if got := owner(t, deep) + " " + owner(t, filepath.Join(dir, "new")); got != "0:0 0644 0:0 0755" {
				t.Errorf("a new file and its parent: %s", got)
			}
			if diff := cmp.Diff([]string{"conf", "new"}, names(t, dir)); diff != "" {
				t.Errorf("left in the directory (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUploadRefuses: a target that is a symbolic link, a directory or a
// FIFO is refused, before anything is written: the link is not written
// through, and nothing is left.
func TestUploadRefuses(t *testing.T) {
	a := newAgent(t)
	for _, way := range ways {
		t.Run(way, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "target"), []byte("kept"), 0o644)
			os.Symlink("target", filepath.Join(dir, "link"))
			os.Mkdir(filepath.Join(dir, "sub"), 0o755)
			unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644)
			for _, tc := range []struct {
				route string
				want  int
				says  string
			}{
				{"/files" + dir + "/link", 412, "is a symbolic link"},
				{"/files" + dir + "/sub", 412, "is a directory"},
				{"/files" + dir + "/fifo", 400, "not a regular file"},
				{"/files" + dir + "/target?mode=0999", 400, "mode"},
				{"/files" + dir + "/target/under", 412, "not a directory"},
			} {
				code, b := do(t, "PUT", a.url(way, tc.route), strings.NewReader("new"))
				if code != tc.want || !strings.Contains(b, tc.says) {
					t.Errorf("PUT %s: %d %s, want %d saying %q", tc.route, code, b, tc.want, tc.says)
				}
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "target")); string(b) != "kept" {
				t.Errorf("the link's target holds %q", b)
			}
			if l, err := os.Readlink(filepath.Join(dir, "link")); err != nil || l != "target" {
				t.Errorf("the link: %q %v", l, err)
			}
			if diff := cmp.Diff([]string{"fifo", "link", "sub", "target"}, names(t, dir)); diff != "" {
				t.Errorf("left in the directory (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUploadCut: an upload whose connection is closed half way leaves
// the old content, and its temporary file is removed.
func TestUploadCut(t *testing.T) {
	a := newAgent(t)
	for _, way := range ways {
		t.Run(way, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "file")
			os.WriteFile(p, []byte("old"), 0o644)
			ev := watchDir(t, dir)
			c := rawPut(t, a.addr(way), "/files"+p, 1<<20, bytes.Repeat([]byte("x"), 512<<10))
			temp := ev.waitFor(t, unix.IN_CREATE, isTemp)
			ev.waitFor(t, unix.IN_MODIFY, func(n string) bool { return n == temp })
			c.Close()
			ev.waitFor(t, unix.IN_DELETE, func(n string) bool { return n == temp })
			if b, _ := os.ReadFile(p); string(b) != "old" {
				t.Errorf("after the cut: %.20q", b)
			}
			if diff := cmp.Diff([]string{"file"}, names(t, dir)); diff != "" {
				t.Errorf("left in the directory (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUploadShort: a body that ends before its Content-Length, or stops
// coming until the server's read timeout, is answered 400; the old
// content stays, and neither the temporary file nor a directory made for
// a new one does.
func TestUploadShort(t *testing.T) {
	a := newAgent(t)
	for _, way := range ways {
		t.Run(way, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "file")
			os.WriteFile(p, []byte("old"), 0o644)
			for _, tc := range []struct {
				name, target string
				stall        bool
				says         string
			}{
				{"ended", p, false, "the body broke off after 50 bytes (its connection ended before it did)"},
				{"stalled", p, true, "the body broke off after 50 bytes (it stopped coming"},
				{"ended, into new directories", filepath.Join(dir, "new", "er", "file"), false, "broke off"},
			} {
				c := rawPut(t, a.addr(way), "/files"+tc.target, 100, bytes.Repeat([]byte("y"), 50))
				if !tc.stall {
					c.CloseWrite()
				}
				code, b := readAnswer(t, c)
				if code != 400 || !strings.Contains(b, tc.says) {
					t.Errorf("%s: %d %s, want 400 saying %q", tc.name, code, b, tc.says)
				}
			}
			if b, _ := os.ReadFile(p); string(b) != "old" {
				t.Errorf("the file holds %.20q", b)
			}
			if diff := cmp.Diff([]string{"file"}, names(t, dir)); diff != "" {
				t.Errorf("left in the directory (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUploadNoSpace: an upload past what the disk holds is answered 507
// in the API's words, and leaves the old content and no temporary file.
func TestUploadNoSpace(t *testing.T) {
	a := newAgent(t)
	dir := mountSmall(t, 1<<20)
	p := filepath.Join(dir, "file")
	os.WriteFile(p, []byte("old"), 0o644)
	for _, way := range ways {
		t.Run(way, func(t *testing.T) {
			code, b := do(t, "PUT", a.url(way, "/files"+p), bytes.NewReader(make([]byte, 4<<20)))
			if code != 507 || !strings.Contains(b, `"code":"no_space"`) || !strings.Contains(b, "the sandbox's disk is full") || strings.Contains(b, "no space left on device") {
				t.Errorf("4 MiB on a 1 MiB disk: %d %s", code, b)
			}
			if b, _ := os.ReadFile(p); string(b) != "old" {
				t.Errorf("the file holds %.20q", b)
			}
			if diff := cmp.Diff([]string{"file"}, names(t, dir)); diff != "" {
				t.Errorf("left on the disk (-want +got):\n%s", diff)
			}
		})
	}
}
