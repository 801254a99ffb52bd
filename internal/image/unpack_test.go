package image

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// Within one layer the later member wins, as tar has it, and a whiteout
// followed by a directory of the same name hides the lower one.
func TestUnpackWithinALayer(t *testing.T) {
	tests := []struct {
		name    string
		entries []entry
		want    map[string]fileWant
		opaque  []string
		class   *errdefs.Class
	}{
		{
			name:    "file replaces file",
			entries: []entry{{Name: "f", Body: "one"}, {Name: "f", Body: "two", Mode: 0o600}},
			want:    map[string]fileWant{".": {mode: os.ModeDir | 0o755}, "f": {mode: 0o600, body: "two"}},
		},
		{
			name:    "file replaces directory",
			entries: []entry{{Name: "d/", Type: tar.TypeDir}, {Name: "d/x", Body: "x"}, {Name: "d", Body: "file"}},
			want:    map[string]fileWant{".": {mode: os.ModeDir | 0o755}, "d": {mode: 0o644, body: "file"}},
		},
		{
			name:    "directory kept, its mode changed",
			entries: []entry{{Name: "d/x", Body: "x"}, {Name: "d/", Type: tar.TypeDir, Mode: 0o700}},
			want:    map[string]fileWant{".": {mode: os.ModeDir | 0o755}, "d": {mode: os.ModeDir | 0o700}, "d/x": {mode: 0o644, body: "x"}},
		},
		{
			name:    "whiteout then directory",
			entries: []entry{{Name: ".wh.d"}, {Name: "d/", Type: tar.TypeDir}, {Name: "d/x", Body: "x"}},
			want:    map[string]fileWant{".": {mode: os.ModeDir | 0o755}, "d": {mode: os.ModeDir | 0o755}, "d/x": {mode: 0o644, body: "x"}},
			opaque:  []string{"d"},
		},
		{
			name:    "whiteout then a member beneath it",
			entries: []entry{{Name: ".wh.d"}, {Name: "d/x", Body: "x"}},
			want:    map[string]fileWant{".": {mode: os.ModeDir | 0o755}, "d": {mode: os.ModeDir | 0o755}, "d/x": {mode: 0o644, body: "x"}},
			opaque:  []string{"d"},
		},
		{
			name:    "opaque root",
			entries: []entry{{Name: "./.wh..wh..opq"}, {Name: ".wh..wh.plnk/1.2"}},
			want:    map[string]fileWant{".": {mode: os.ModeDir | 0o755}},
			opaque:  []string{"."},
		},
		{
			name:    "root attributes",
			entries: []entry{{Name: "./", Type: tar.TypeDir, Mode: 0o700, UID: 3, GID: 4}},
			want:    map[string]fileWant{".": {mode: os.ModeDir | 0o700, uid: 3, gid: 4}},
		},
		{
			name:    "long name",
			entries: []entry{{Name: strings.Repeat("a/", 2048) + "f", Body: "x"}},
			class:   errdefs.ErrInvalidArgument,
		},
		{
			name:    "root as a file",
			entries: []entry{{Name: ".", Body: "x"}},
			class:   errdefs.ErrInvalidArgument,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := unpack(context.Background(), dir, bytes.NewReader(layerTar(t, tt.entries...)))
			if tt.class != nil {
				wantClass(t, err, tt.class)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkTree(t, dir, tt.want, false)
			for _, d := range tt.opaque {
				buf := make([]byte, 8)
				n, err := unix.Lgetxattr(filepath.Join(dir, d), "trusted.overlay.opaque", buf)
				if err != nil || string(buf[:n]) != "y" {
					t.Errorf("%s: opaque xattr %q, %v", d, buf[:n], err)
				}
			}
		})
	}
}

// Whatever the tar, unpacking writes nothing beside the layer's directory.
func FuzzUnpack(f *testing.F) {
	for _, entries := range [][]entry{
		{{Name: "a/b", Body: "x"}, {Name: "a/.wh.c"}, {Name: "a/.wh..wh..opq"}},
		{{Name: "s", Type: tar.TypeSymlink, Link: "../.."}, {Name: "h", Type: tar.TypeLink, Link: "s"}},
		{{Name: "d/", Type: tar.TypeDir}, {Name: "d", Body: "f"}, {Name: "d/x", Body: "x"}},
	} {
		f.Add(layerTar(f, entries...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dir := filepath.Join(base, "layer")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		unpack(context.Background(), dir, bytes.NewReader(data))
		entries, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 {
			t.Errorf("beside the layer: %v", entries)
		}
	})
}
