package image

import (
	"errors"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/image/imagetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// entry is one member of a layer tar a test writes.
type entry = imagetest.Entry

var testTime = imagetest.ModTime

func layerTar(t testing.TB, entries ...entry) []byte { return imagetest.Tar(t, entries...) }

// layer is a layer of entries, gzipped as a registry serves it.
func layer(t *testing.T, entries ...entry) v1.Layer { return imagetest.Layer(t, entries...) }

var testConfig = v1.Config{
	Env:        []string{"PATH=/bin", "A=b"},
	WorkingDir: "/srv/app",
	User:       "1000:1000",
	Entrypoint: []string{"/bin/sh", "-c"},
	Cmd:        []string{"echo hi"},
}

// newImage is an image of layers (bottom first) for this host.
func newImage(t *testing.T, layers ...v1.Layer) v1.Image {
	return imagetest.Image(t, testConfig, layers...)
}

// testRegistry is a registry on loopback.
type testRegistry struct {
	*imagetest.Registry
	host string
}

func newRegistry(t *testing.T) *testRegistry {
	r := imagetest.StartRegistry(t)
	return &testRegistry{Registry: r, host: r.Host}
}

// push writes img as repo:tag and returns its fully qualified name.
func (r *testRegistry) push(t *testing.T, repoTag string, img v1.Image) string {
	return r.Push(t, repoTag, img)
}

func (r *testRegistry) options() Options {
	return Options{Transport: r.Transport(), Keychain: authn.NewMultiKeychain()}
}

func openStore(t *testing.T, dir string, o Options) *Store {
	t.Helper()
	s, err := Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// recorder collects progress.
type recorder struct{ events []Progress }

func (r *recorder) add(p Progress) { r.events = append(r.events, p) }

func (r *recorder) statuses(layer string) map[string]bool {
	seen := map[string]bool{}
	for _, e := range r.events {
		if e.Layer == layer {
			seen[e.Status] = true
		}
	}
	return seen
}

func wantClass(t *testing.T, err error, class *errdefs.Class) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("error %v: class %v, want %v", err, errdefs.ClassOf(err), class)
	}
}

func digestOf(t *testing.T, f func() (v1.Hash, error)) string {
	t.Helper()
	h, err := f()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

func diffIDs(t *testing.T, img v1.Image) []string {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range cf.RootFS.DiffIDs {
		ids = append(ids, d.String())
	}
	return ids
}
