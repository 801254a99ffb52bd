package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"go.uber.org/goleak"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// entry is one member of a layer tar a test writes.
type entry struct {
	name     string
	typ      byte // tar.TypeReg unless set
	body     string
	mode     int64
	uid, gid int
	link     string
}

var testTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

func layerTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid, Linkname: e.link, ModTime: testTime, Format: tar.FormatPAX}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = 0o755
			}
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if hdr.Typeflag == tar.TypeChar {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layer is a layer of entries, gzipped as a registry serves it.
func layer(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	b := layerTar(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var testConfig = v1.Config{
	Env:        []string{"PATH=/bin", "A=b"},
	WorkingDir: "/srv/app",
	User:       "1000:1000",
	Entrypoint: []string{"/bin/sh", "-c"},
	Cmd:        []string{"echo hi"},
}

// newImage is an image of layers (bottom first) for this host.
func newImage(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: testTime}
	cf.Config = testConfig
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// testRegistry is a registry on loopback, and the transport tests reach it
// (and stores use) with.
type testRegistry struct {
	host string
	tr   *http.Transport
}

func newRegistry(t *testing.T) *testRegistry {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		srv.Close()
	})
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &testRegistry{host: u.Host, tr: tr}
}

// push writes img as repo:tag and returns its fully qualified name.
func (r *testRegistry) push(t *testing.T, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithTransport(r.tr)); err != nil {
		t.Fatal(err)
	}
	return ref.Name()
}

func (r *testRegistry) options() Options {
	return Options{Transport: r.tr, Keychain: authn.NewMultiKeychain()}
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
