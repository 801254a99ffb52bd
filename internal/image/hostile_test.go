package image

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// Hostile layers: each case's tar aims at a sentinel directory beside the
// store (a layer is unpacked in <base>/store/tmp/layer-…, three levels
// below <base>), and nothing may land there or anywhere outside the layer.
func TestHostileLayers(t *testing.T) {
	reg := newRegistry(t)
	tests := []struct {
		name string
		// entries are the layer's, given the sentinel's absolute path.
		entries func(sentinel string) []entry
		class   *errdefs.Class // nil: the pull succeeds
		member  string         // the member the error names
		want    map[string]fileWant
	}{
		{
			name:    "dot-dot",
			entries: func(string) []entry { return []entry{{Name: "../../../sentinel/x", Body: "bad"}} },
			class:   errdefs.ErrInvalidArgument, member: "../../../sentinel/x",
		},
		{
			name:    "dot-dot inside",
			entries: func(string) []entry { return []entry{{Name: "a/../../../../sentinel/x", Body: "bad"}} },
			class:   errdefs.ErrInvalidArgument, member: "a/../../../../sentinel/x",
		},
		{
			name:    "absolute",
			entries: func(s string) []entry { return []entry{{Name: s + "/x", Body: "bad"}} },
			class:   errdefs.ErrInvalidArgument, member: "/x",
		},
		{
			name: "through a symlink to /",
			entries: func(s string) []entry {
				return []entry{{Name: "a", Type: tar.TypeSymlink, Link: "/"}, {Name: "a" + s + "/x", Body: "bad"}}
			},
			class: errdefs.ErrInvalidArgument, member: "a" + "/",
		},
		{
			name: "through a symlink up",
			entries: func(string) []entry {
				return []entry{{Name: "a", Type: tar.TypeSymlink, Link: "../../.."}, {Name: "a/sentinel/x", Body: "bad"}}
			},
			class: errdefs.ErrInvalidArgument, member: "a/sentinel/x",
		},
		{
			name: "through a symlink inside",
			entries: func(string) []entry {
				return []entry{{Name: "b/", Type: tar.TypeDir}, {Name: "a", Type: tar.TypeSymlink, Link: "b"}, {Name: "a/x", Body: "bad"}}
			},
			class: errdefs.ErrInvalidArgument, member: "a/x",
		},
		{
			name: "beneath a file",
			entries: func(string) []entry {
				return []entry{{Name: "a", Body: "file"}, {Name: "a/x", Body: "bad"}}
			},
			class: errdefs.ErrInvalidArgument, member: "a/x",
		},
		{
			name:    "hard link up",
			entries: func(string) []entry { return []entry{{Name: "h", Type: tar.TypeLink, Link: "../../etc/passwd"}} },
			class:   errdefs.ErrInvalidArgument, member: "h",
		},
		{
			name:    "hard link to the sentinel",
			entries: func(s string) []entry { return []entry{{Name: "h", Type: tar.TypeLink, Link: s + "/file"}} },
			class:   errdefs.ErrInvalidArgument, member: "h",
		},
		{
			name: "hard link to an escaping symlink",
			entries: func(s string) []entry {
				return []entry{{Name: "s", Type: tar.TypeSymlink, Link: s + "/file"}, {Name: "h", Type: tar.TypeLink, Link: "s"}}
			},
			class: errdefs.ErrInvalidArgument, member: "h",
		},
		{
			name: "hard link to nothing",
			entries: func(string) []entry {
				return []entry{{Name: "h", Type: tar.TypeLink, Link: "later"}, {Name: "later", Body: "x"}}
			},
			class: errdefs.ErrInvalidArgument, member: "h",
		},
		{
			name:    "whiteout of dot-dot",
			entries: func(string) []entry { return []entry{{Name: "a/.wh..."}} },
			class:   errdefs.ErrInvalidArgument, member: "a/.wh...",
		},
		{
			name: "symlink replaced, not followed",
			entries: func(s string) []entry {
				return []entry{{Name: "a", Type: tar.TypeSymlink, Link: s}, {Name: "a/", Type: tar.TypeDir}, {Name: "a/x", Body: "ok"}}
			},
			want: map[string]fileWant{
				".":   {mode: os.ModeDir | 0o755},
				"a":   {mode: os.ModeDir | 0o755},
				"a/x": {mode: 0o644, body: "ok"},
			},
		},
		{
			name: "devices skipped",
			entries: func(string) []entry {
				return []entry{{Name: "dev/null", Type: tar.TypeChar}, {Name: "dev/sda", Type: tar.TypeBlock}, {Name: "f", Body: "f"}}
			},
			want: map[string]fileWant{
				".": {mode: os.ModeDir | 0o755},
				"f": {mode: 0o644, body: "f"},
			},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			sentinel := filepath.Join(base, "sentinel")
			if err := os.Mkdir(sentinel, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(sentinel, "file"), []byte("keep"), 0o644); err != nil {
				t.Fatal(err)
			}
			// Uncompressed, as a registry may serve a layer too.
			l := static.NewLayer(layerTar(t, tt.entries(sentinel)...), types.DockerUncompressedLayer)
			ref := reg.push(t, "hostile:"+string(rune('a'+i)), newImage(t, l))
			s := openStore(t, filepath.Join(base, "store"), reg.options())

			img, err := s.Pull(context.Background(), ref, nil)
			if tt.class != nil {
				wantClass(t, err, tt.class)
				if !strings.Contains(err.Error(), tt.member) {
					t.Errorf("error %q does not name the member %q", err, tt.member)
				}
				checkEmpty(t, s.tmpDir(), s.layersDir())
			} else {
				if err != nil {
					t.Fatal(err)
				}
				dirs, err := s.LayerDirs(img)
				if err != nil {
					t.Fatal(err)
				}
				checkTree(t, dirs[0], tt.want, true)
			}
			checkSentinel(t, base, sentinel)
		})
	}
}

// checkSentinel fails if anything in base but the store changed.
func checkSentinel(t *testing.T, base, sentinel string) {
	t.Helper()
	checkTree(t, sentinel, map[string]fileWant{
		".":    {mode: os.ModeDir | 0o755},
		"file": {mode: 0o644, body: "keep", links: 1},
	}, false)
	entries, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"sentinel", "store"}, names); diff != "" {
		t.Errorf("beside the store (-want +got):\n%s", diff)
	}
}

func checkEmpty(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 0 {
			t.Errorf("%s holds %v after a failed pull", d, entries)
		}
	}
}

func TestDiffIDMismatch(t *testing.T) {
	reg := newRegistry(t)
	img := newImage(t, layer(t, entry{Name: "f", Body: "real"}))
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	other, err := layer(t, entry{Name: "f", Body: "claimed"}).DiffID()
	if err != nil {
		t.Fatal(err)
	}
	cf.RootFS.DiffIDs = []v1.Hash{other}
	tampered, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.push(t, "tampered:v1", tampered)
	s := openStore(t, t.TempDir(), reg.options())
	_, err = s.Pull(context.Background(), ref, nil)
	wantClass(t, err, errdefs.ErrInvalidArgument)
	if !strings.Contains(err.Error(), other.String()) {
		t.Errorf("error %q does not name the layer %s", err, other)
	}
	checkEmpty(t, s.tmpDir(), s.layersDir())
}
