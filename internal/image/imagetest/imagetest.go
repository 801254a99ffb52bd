// Package imagetest makes OCI images in tests, from layers the test writes and the host's busybox, and serves them from a registry on loopback.
package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is a member of a layer.
type Entry struct {
	Name     string
	Type     byte // tar.TypeReg unless set
	Body     string
	Mode     int64 // 0644 (0755 for a directory) unless set
	UID, GID int
	Link     string
}

// ModTime is every member's modification time.
var ModTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// Tar is a layer's tar of entries (a character device is 1:3).
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Uid: e.UID, Gid: e.GID, Linkname: e.Link, ModTime: ModTime, Format: tar.FormatPAX}
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
			hdr.Size = int64(len(e.Body))
		}
		if hdr.Typeflag == tar.TypeChar {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.Body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Layer is a layer of entries, as a registry serves it.
func Layer(t testing.TB, entries ...Entry) v1.Layer {
	t.Helper()
	b := Tar(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Busybox is a layer with the host's /bin/busybox and its applets as
// links to it; the test is skipped on a host without it.
func Busybox(t testing.TB, applets ...string) v1.Layer {
	t.Helper()
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs /bin/busybox (Debian's busybox-static)")
	}
	entries := []Entry{{Name: "bin/", Type: tar.TypeDir}, {Name: "bin/busybox", Body: string(b), Mode: 0o755}}
	for _, a := range applets {
		entries = append(entries, Entry{Name: "bin/" + a, Type: tar.TypeSymlink, Link: "busybox"})
	}
	return Layer(t, entries...)
}

// Image is an image of layers (the bottom one first) for this host, with
// cfg as its config.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
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
	cf.Created = v1.Time{Time: ModTime}
	cf.Config = cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// Registry is a registry on a loopback address, for the test's life.
type Registry struct {
	// Host is its host:port.
	Host string
	tr   *http.Transport
}

// StartRegistry serves an empty registry.
func StartRegistry(t testing.TB) *Registry {
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
	return &Registry{Host: u.Host, tr: tr}
}

// Transport is what reaches it (and nothing else, kept idle with it).
func (r *Registry) Transport() http.RoundTripper { return r.tr }

// Push writes img as repoTag ("name:tag") and returns its reference.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.Host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithTransport(r.tr)); err != nil {
		t.Fatal(err)
	}
	return ref.Name()
}

// Save is the tar docker save writes of images, by their names.
func Save(t testing.TB, images map[string]v1.Image) []byte {
	t.Helper()
	refs := map[name.Reference]v1.Image{}
	for n, img := range images {
		ref, err := name.ParseReference(n)
		if err != nil {
			t.Fatal(err)
		}
		refs[ref] = img
	}
	var buf bytes.Buffer
	if err := tarball.MultiRefWrite(refs, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
