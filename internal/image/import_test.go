package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// imported is what a test checks of an imported image.
type imported struct {
	ID, Digest string
	Names      []string
	Layers     []string
}

func summarize(images []Image) []imported {
	var s []imported
	for _, img := range images {
		s = append(s, imported{img.ID, img.Digest, img.Names, img.Layers})
	}
	slices.SortFunc(s, func(a, b imported) int { return strings.Compare(a.ID, b.ID) })
	return s
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestImportDockerSave(t *testing.T) {
	shared := layer(t, entry{Name: "shared", Body: "s"})
	a := newImage(t, shared, layer(t, entry{Name: "a", Body: "a"}))
	b := newImage(t, shared, layer(t, entry{Name: "b", Body: "b"}))
	c := newImage(t, layer(t, entry{Name: "c", Body: "c"}))
	var buf bytes.Buffer
	err := tarball.MultiRefWrite(map[name.Reference]v1.Image{
		mustRef(t, "example.com/a:v1"):    a,
		mustRef(t, "a"):                   a,
		mustRef(t, "127.0.0.1:5000/b:v2"): b,
		// By digest: no RepoTags.
		mustRef(t, "example.com/c@"+digestOf(t, c.Digest)): c,
	}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t, t.TempDir(), Options{})
	var rec recorder
	got, err := s.Import(context.Background(), &buf, rec.add)
	if err != nil {
		t.Fatal(err)
	}
	want := summarize([]Image{
		{ID: digestOf(t, a.ConfigName), Names: []string{"example.com/a:v1", "index.docker.io/library/a:latest"}, Layers: diffIDs(t, a)},
		{ID: digestOf(t, b.ConfigName), Names: []string{"127.0.0.1:5000/b:v2"}, Layers: diffIDs(t, b)},
		{ID: digestOf(t, c.ConfigName), Layers: diffIDs(t, c)},
	})
	if diff := cmp.Diff(want, summarize(got)); diff != "" {
		t.Errorf("Import (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, summarize(s.List())); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
	sharedID := digestOf(t, shared.DiffID)
	if seen := rec.statuses(sharedID); !seen[StatusUnpacking] || !seen[StatusExists] {
		t.Errorf("statuses of the shared layer: %v, want unpacking then exists", seen)
	}
	for _, img := range got {
		dirs, err := s.LayerDirs(img)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dirs[len(dirs)-1], "shared")); len(dirs) == 2 && err != nil {
			t.Errorf("%v: bottom layer: %v", img.Names, err)
		}
	}
	if _, err := s.Get(digestOf(t, c.ConfigName)); err != nil {
		t.Errorf("the unnamed image by ID: %v", err)
	}
}

// ociTar writes an OCI image layout of a tar: three images by different
// annotations (or none) and an index of two platforms.
func ociTar(t *testing.T, a, b, c, host, foreign v1.Image) []byte {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(p.AppendImage(a, layout.WithAnnotations(map[string]string{annotationRefName: "example.com/oci:v1"})))
	must(p.AppendImage(b, layout.WithAnnotations(map[string]string{annotationContainerdName: "docker.io/library/ocib:v2", annotationRefName: "v2"})))
	must(p.AppendImage(c, layout.WithAnnotations(map[string]string{annotationRefName: "latest"})))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: foreign, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "s390x"}}},
		mutate.IndexAddendum{Add: host, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	must(p.AppendIndex(idx, layout.WithAnnotations(map[string]string{annotationRefName: "example.com/multi:v3"})))

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = "./" + rel
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	must(err)
	must(tw.Close())
	return buf.Bytes()
}

func TestImportOCILayout(t *testing.T) {
	a := newImage(t, layer(t, entry{Name: "a", Body: "a"}))
	b := newImage(t, layer(t, entry{Name: "b", Body: "b"}))
	c := newImage(t, layer(t, entry{Name: "c", Body: "c"}))
	host := newImage(t, layer(t, entry{Name: "host", Body: "h"}))
	foreign := newImage(t, layer(t, entry{Name: "foreign", Body: "f"}))
	cf, err := foreign.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = "s390x"
	if foreign, err = mutate.ConfigFile(foreign, cf); err != nil {
		t.Fatal(err)
	}
	body := ociTar(t, a, b, c, host, foreign)

	s := openStore(t, t.TempDir(), Options{})
	got, err := s.Import(context.Background(), bytes.NewReader(body), nil)
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: foreign, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "s390x"}}},
		mutate.IndexAddendum{Add: host, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	want := summarize([]Image{
		{ID: digestOf(t, a.ConfigName), Digest: digestOf(t, a.Digest), Names: []string{"example.com/oci:v1"}, Layers: diffIDs(t, a)},
		{ID: digestOf(t, b.ConfigName), Digest: digestOf(t, b.Digest), Names: []string{"index.docker.io/library/ocib:v2"}, Layers: diffIDs(t, b)},
		// A ref.name that is a tag alone names no repository.
		{ID: digestOf(t, c.ConfigName), Digest: digestOf(t, c.Digest), Layers: diffIDs(t, c)},
		// Of the index, only the host's platform; by the index's digest.
		{ID: digestOf(t, host.ConfigName), Digest: digestOf(t, idx.Digest), Names: []string{"example.com/multi:v3"}, Layers: diffIDs(t, host)},
	})
	if diff := cmp.Diff(want, summarize(got)); diff != "" {
		t.Errorf("Import (-want +got):\n%s", diff)
	}
}

func TestImportRefusesGarbage(t *testing.T) {
	tarOf := func(entries ...entry) string { return string(layerTar(t, entries...)) }
	tests := []struct {
		name, body string
		class      *errdefs.Class
	}{
		{"not a tar", strings.Repeat("garbage ", 200), errdefs.ErrInvalidArgument},
		{"empty", "", errdefs.ErrInvalidArgument},
		{"neither format", tarOf(entry{Name: "hello", Body: "x"}), errdefs.ErrInvalidArgument},
		{"bad manifest.json", tarOf(entry{Name: "manifest.json", Body: "{"}), errdefs.ErrInvalidArgument},
		{"missing config", tarOf(entry{Name: "manifest.json", Body: `[{"Config":"c.json","Layers":["l.tar"]}]`}), errdefs.ErrInvalidArgument},
		{"bad config", tarOf(entry{Name: "manifest.json", Body: `[{"Config":"c.json","Layers":["l.tar"]}]`}, entry{Name: "c.json", Body: "nope"}, entry{Name: "l.tar", Body: ""}), errdefs.ErrInvalidArgument},
		{"bad index.json", tarOf(entry{Name: "index.json", Body: `{"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:../../x"}]}`}), errdefs.ErrInvalidArgument},
		{"link loop", tarOf(entry{Name: "manifest.json", Type: tar.TypeSymlink, Link: "manifest.json"}), errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openStore(t, t.TempDir(), Options{})
			_, err := s.Import(context.Background(), strings.NewReader(tt.body), nil)
			wantClass(t, err, tt.class)
			if n := len(s.List()); n != 0 {
				t.Errorf("%d images stored", n)
			}
			checkEmpty(t, s.tmpDir(), s.layersDir())
		})
	}
}
