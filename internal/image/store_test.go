package image

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// twoImages imports a (named example.com/a:v1 and a) and b (named b),
// which share their bottom layer.
func twoImages(t *testing.T, s *Store) (a, b Image) {
	t.Helper()
	shared := layer(t, entry{Name: "shared", Body: "s"})
	ia := newImage(t, shared, layer(t, entry{Name: "a", Body: "a"}))
	ib := newImage(t, shared, layer(t, entry{Name: "b", Body: "b"}))
	var buf bytes.Buffer
	err := tarball.MultiRefWrite(map[name.Reference]v1.Image{
		mustRef(t, "example.com/a:v1"): ia,
		mustRef(t, "a"):                ia,
		mustRef(t, "b"):                ib,
	}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(context.Background(), &buf, nil); err != nil {
		t.Fatal(err)
	}
	if a, err = s.Get(digestOf(t, ia.ConfigName)); err != nil {
		t.Fatal(err)
	}
	if b, err = s.Get(digestOf(t, ib.ConfigName)); err != nil {
		t.Fatal(err)
	}
	return a, b
}

func TestGet(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
	a, b := twoImages(t, s)
	hexA := strings.TrimPrefix(a.ID, "sha256:")
	tests := []struct {
		ref   string
		want  string // ID
		class *errdefs.Class
	}{
		{ref: "a", want: a.ID},
		{ref: "a:latest", want: a.ID},
		{ref: "docker.io/library/a:latest", want: a.ID},
		{ref: "index.docker.io/library/a", want: a.ID},
		{ref: "example.com/a:v1", want: a.ID},
		{ref: "b", want: b.ID},
		{ref: a.ID, want: a.ID},
		{ref: hexA, want: a.ID},
		{ref: hexA[:12], want: a.ID},
		{ref: "sha256:" + hexA[:12], want: a.ID},
		{ref: hexA[:11], class: errdefs.ErrNotFound},
		{ref: "example.com/a:v2", class: errdefs.ErrNotFound},
		{ref: "sha256:" + strings.Repeat("0", 64), class: errdefs.ErrNotFound},
		{ref: "Not A Reference", class: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.ref, func(t *testing.T) {
			got, err := s.Get(tt.ref)
			if tt.class != nil {
				wantClass(t, err, tt.class)
				return
			}
			if err != nil || got.ID != tt.want {
				t.Errorf("Get = %s, %v; want %s", got.ID, err, tt.want)
			}
		})
	}
}

func TestGetAmbiguousPrefix(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
	prefix := "0123456789ab"
	images := map[string]Image{}
	for _, last := range []string{"1", "2"} {
		id := "sha256:" + prefix + strings.Repeat("0", 51) + last
		images[id] = Image{ID: id}
	}
	s.mu.Lock()
	err := s.save(images, s.layers)
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(prefix)
	wantClass(t, err, errdefs.ErrInvalidArgument)
	if _, err := s.Get(prefix + strings.Repeat("0", 51) + "2"); err != nil {
		t.Errorf("the full ID: %v", err)
	}
}

func TestRemove(t *testing.T) {
	s := openStore(t, t.TempDir(), Options{})
	a, b := twoImages(t, s)
	layerExists := func(diffID string) bool {
		_, err := os.Stat(s.layerDir(strings.TrimPrefix(diffID, "sha256:")))
		return err == nil
	}
	inUse := func(id string) bool { return true }
	unused := func(id string) bool { return false }

	// A name of several: untagged, even in use.
	got, err := s.Remove("a", inUse)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"index.docker.io/library/a:latest"}, got.Names); diff != "" {
		t.Errorf("removed names (-want +got):\n%s", diff)
	}
	if _, err := s.Get("a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get of the removed name: %v", err)
	}
	if img, err := s.Get(a.ID); err != nil || len(img.Names) != 1 {
		t.Errorf("the image after untagging: %v, %v", img.Names, err)
	}

	// Its last name, in use: refused.
	_, err = s.Remove("example.com/a:v1", inUse)
	wantClass(t, err, errdefs.ErrFailedPrecondition)
	if _, err := s.Get(a.ID); err != nil {
		t.Errorf("the image after a refused removal: %v", err)
	}

	// Its last name, not in use: deleted, and the layer only it used.
	if _, err := s.Remove("example.com/a:v1", unused); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(a.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get of the removed image: %v", err)
	}
	if !layerExists(a.Layers[0]) || layerExists(a.Layers[1]) {
		t.Errorf("after removing a: shared layer there %v (want true), its own %v (want false)", layerExists(a.Layers[0]), layerExists(a.Layers[1]))
	}
	if _, err := s.LayerDirs(b); err != nil {
		t.Errorf("LayerDirs of b: %v", err)
	}

	// By ID: all names go, and every layer left.
	got, err = s.Remove(b.ID[:19], nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(b.Names, got.Names); diff != "" {
		t.Errorf("removed names (-want +got):\n%s", diff)
	}
	checkEmpty(t, s.layersDir(), s.tmpDir())
	if n := len(s.List()); n != 0 {
		t.Errorf("%d images left", n)
	}
	_, err = s.Remove("b", nil)
	wantClass(t, err, errdefs.ErrNotFound)
}

// A new Open of the directory finds the same images and removes what a
// crash would leave: temporary files and layers no image uses.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, Options{})
	twoImages(t, s)
	before := s.List()
	for _, p := range []string{"tmp/layer-123/x", "layers/" + strings.Repeat("e", 64) + "/x"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	s2 := openStore(t, dir, Options{})
	if diff := cmp.Diff(before, s2.List()); diff != "" {
		t.Errorf("List after reopening (-want +got):\n%s", diff)
	}
	for _, img := range s2.List() {
		if _, err := s2.LayerDirs(img); err != nil {
			t.Error(err)
		}
	}
	checkEmpty(t, filepath.Join(dir, "tmp"))
	if _, err := os.Stat(filepath.Join(dir, "layers", strings.Repeat("e", 64))); !os.IsNotExist(err) {
		t.Errorf("the unused layer is still there: %v", err)
	}
	fi, err := os.Stat(filepath.Join(dir, "images.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("images.json: %v, %v", fi, err)
	}
}

// A pull of a name another image has moves it; the image left without a
// name stays, by ID, until removed.
func TestRepullMovesName(t *testing.T) {
	reg := newRegistry(t)
	s := openStore(t, t.TempDir(), reg.options())
	ref := reg.push(t, "moving:v1", newImage(t, layer(t, entry{Name: "v", Body: "1"})))
	old, err := s.Pull(context.Background(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg.push(t, "moving:v1", newImage(t, layer(t, entry{Name: "v", Body: "2"})))
	cur, err := s.Pull(context.Background(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cur.ID == old.ID {
		t.Fatal("the second push made the same image")
	}
	if got, err := s.Get(ref); err != nil || got.ID != cur.ID {
		t.Errorf("Get(%s) = %s, %v; want the new image %s", ref, got.ID, err, cur.ID)
	}
	left, err := s.Get(old.ID)
	if err != nil || len(left.Names) != 0 {
		t.Errorf("the old image: names %v, %v; want it kept without names", left.Names, err)
	}
	if list := s.List(); len(list) != 2 || list[0].ID != cur.ID && !list[0].Added.Equal(list[1].Added) {
		t.Errorf("List order: %v", list)
	}
}
