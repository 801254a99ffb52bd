package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// The annotations an OCI layout's index names its images by: containerd's
// (and Docker's) with a full reference, and the spec's, which may be a
// tag alone.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// Import stores the images of a tar: one `docker save` writes (its
// manifest.json names them by RepoTags) or an OCI image layout (its
// index.json by annotation). An image without a name is stored by ID.
// The tar is spooled to the store's directory first, as its members come
// in no useful order.
func (s *Store) Import(ctx context.Context, r io.Reader, progress func(Progress)) ([]Image, error) {
	f, err := os.CreateTemp(s.tmpDir(), "import-")
	if err != nil {
		return nil, storeError(err, "import")
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := io.Copy(f, r); err != nil {
		var maxErr *http.MaxBytesError
		var spool *fs.PathError // the spool's write: a body's read is no file's
		switch {
		case errors.As(err, &maxErr):
			return nil, fmt.Errorf("%w: image: import: %w", errdefs.ErrTooLarge, err)
		case errors.As(err, &spool):
			return nil, storeError(err, "import: spooling the tar")
		}
		return nil, fmt.Errorf("%w: image: import: reading the tar: %w", errdefs.ErrInvalidArgument, err)
	}
	a, err := indexArchive(f)
	if err != nil {
		return nil, err
	}
	var srcs []*source
	switch {
	case a.has("manifest.json"):
		srcs, err = a.dockerSources()
	case a.has("index.json"):
		srcs, err = a.ociSources(s.platform)
	default:
		err = fmt.Errorf("%w: image: import: the tar has neither manifest.json (docker save) nor index.json (OCI layout)", errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, err
	}
	var images []Image
	for _, src := range srcs {
		src.status = StatusUnpacking
		src.failed = func(err error) error {
			return fmt.Errorf("%w: image: import %s: %w", errdefs.ErrInvalidArgument, src.what, err)
		}
		img, err := s.install(ctx, src, progress)
		if err != nil {
			return images, err
		}
		images = append(images, img)
	}
	return images, nil
}

// archive is a spooled tar, its regular files found by name.
type archive struct {
	f       *os.File
	members map[string]member
}

type member struct {
	off, size int64
	link      string // a symlink's or hard link's target, cleaned
}

// indexArchive finds the members of the tar f. Their names are only keys
// here, never paths written to.
func indexArchive(f *os.File) (*archive, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, storeError(err, "import")
	}
	a := &archive{f: f, members: map[string]member{}}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: image: import: not a tar: %w", errdefs.ErrInvalidArgument, err)
		}
		if len(a.members) >= maxEntries {
			return nil, fmt.Errorf("%w: image: import: more than %d members", errdefs.ErrTooLarge, maxEntries)
		}
		n := path.Clean("/" + hdr.Name)[1:]
		switch hdr.Typeflag {
		case tar.TypeReg:
			// tar.Reader reads nothing ahead: f is at the member's data.
			off, err := f.Seek(0, io.SeekCurrent)
			if err != nil {
				return nil, storeError(err, "import")
			}
			a.members[n] = member{off: off, size: hdr.Size}
		case tar.TypeSymlink:
			a.members[n] = member{link: path.Clean("/" + path.Join(path.Dir(n), hdr.Linkname))[1:]}
		case tar.TypeLink:
			a.members[n] = member{link: path.Clean("/" + hdr.Linkname)[1:]}
		}
	}
	return a, nil
}

func (a *archive) has(n string) bool { _, ok := a.members[n]; return ok }

// find returns the regular file n names, following links.
func (a *archive) find(n string) (member, error) {
	for range 16 {
		m, ok := a.members[n]
		if !ok {
			return member{}, fmt.Errorf("%w: image: import: the tar has no file %q", errdefs.ErrInvalidArgument, n)
		}
		if m.link == "" {
			return m, nil
		}
		n = m.link
	}
	return member{}, fmt.Errorf("%w: image: import: too many links at %q", errdefs.ErrInvalidArgument, n)
}

func (a *archive) blob(n string) (blob, error) {
	m, err := a.find(n)
	if err != nil {
		return blob{}, err
	}
	return blob{size: m.size, open: func() (io.ReadCloser, error) {
		return io.NopCloser(io.NewSectionReader(a.f, m.off, m.size)), nil
	}}, nil
}

func (a *archive) read(n string, limit int64) ([]byte, error) {
	m, err := a.find(n)
	if err != nil {
		return nil, err
	}
	if m.size > limit {
		return nil, fmt.Errorf("%w: image: import: %s has %d bytes, more than %d", errdefs.ErrTooLarge, n, m.size, limit)
	}
	b := make([]byte, m.size)
	if _, err := a.f.ReadAt(b, m.off); err != nil {
		return nil, storeError(err, "import: %s", n)
	}
	return b, nil
}

// dockerSources reads a `docker save` manifest.json.
func (a *archive) dockerSources() ([]*source, error) {
	b, err := a.read("manifest.json", maxIndexBytes)
	if err != nil {
		return nil, err
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(b, &manifest); err != nil {
		return nil, fmt.Errorf("%w: image: import: manifest.json: %w", errdefs.ErrInvalidArgument, err)
	}
	var srcs []*source
	for i, m := range manifest {
		src := &source{what: fmt.Sprintf("manifest.json image %d", i)}
		if len(m.Layers) > maxLayers {
			return nil, fmt.Errorf("%w: image: import: %s has %d layers, more than %d", errdefs.ErrTooLarge, src.what, len(m.Layers), maxLayers)
		}
		for _, t := range m.RepoTags {
			tag, err := name.NewTag(t)
			if err != nil {
				return nil, fmt.Errorf("%w: image: import: tag %q: %w", errdefs.ErrInvalidArgument, t, err)
			}
			src.names = append(src.names, tag.Name())
		}
		if len(src.names) > 0 {
			src.what = src.names[0]
		}
		if src.config, err = a.read(m.Config, maxConfigBytes); err != nil {
			return nil, err
		}
		for _, l := range m.Layers {
			b, err := a.blob(l)
			if err != nil {
				return nil, err
			}
			src.layers = append(src.layers, b)
		}
		srcs = append(srcs, src)
	}
	return srcs, nil
}

// ociSources reads an OCI layout's index.json: each image it lists (for
// an index, its image for platform) with the names its annotations give.
// An image for another platform is skipped.
func (a *archive) ociSources(platform v1.Platform) ([]*source, error) {
	b, err := a.read("index.json", maxIndexBytes)
	if err != nil {
		return nil, err
	}
	index, err := v1.ParseIndexManifest(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%w: image: import: index.json: %w", errdefs.ErrInvalidArgument, err)
	}
	var srcs []*source
	for _, d := range index.Manifests {
		if d.Platform != nil && !platformMatches(*d.Platform, platform) {
			continue
		}
		src, err := a.ociSource(d, platform, 0)
		if err != nil {
			return nil, err
		}
		if src == nil {
			continue // not an image
		}
		src.digest = d.Digest.String()
		if n, ok := ociName(d.Annotations); ok {
			src.names = []string{n}
			src.what = n
		}
		srcs = append(srcs, src)
	}
	if len(srcs) == 0 {
		return nil, fmt.Errorf("%w: image: import: index.json lists no image for %s", errdefs.ErrInvalidArgument, platformString(platform))
	}
	return srcs, nil
}

// ociName returns the reference an index.json entry's annotations name: a
// ref.name that is a tag alone ("latest") names no repository, so none.
func ociName(annotations map[string]string) (string, bool) {
	n := annotations[annotationContainerdName]
	if n == "" {
		n = annotations[annotationRefName]
		if !strings.ContainsAny(n, ":/@") {
			return "", false
		}
	}
	r, err := name.ParseReference(n)
	if err != nil {
		return "", false
	}
	return r.Name(), true
}

func (a *archive) ociBlob(d v1.Hash, limit int64) ([]byte, error) {
	if err := checkHash(d); err != nil {
		return nil, err
	}
	b, err := a.read("blobs/sha256/"+d.Hex, limit)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != d.Hex {
		return nil, fmt.Errorf("%w: image: import: blob %s has another digest", errdefs.ErrInvalidArgument, d)
	}
	return b, nil
}

func checkHash(d v1.Hash) error {
	if d.Algorithm != "sha256" || len(d.Hex) != 64 || strings.Trim(d.Hex, "0123456789abcdef") != "" {
		return fmt.Errorf("%w: image: import: digest %q is not a sha256", errdefs.ErrInvalidArgument, d)
	}
	return nil
}

// ociSource returns the image d describes, or nil if it is no image.
func (a *archive) ociSource(d v1.Descriptor, platform v1.Platform, depth int) (*source, error) {
	switch {
	case d.MediaType.IsIndex() && depth < 2:
		b, err := a.ociBlob(d.Digest, maxIndexBytes)
		if err != nil {
			return nil, err
		}
		index, err := v1.ParseIndexManifest(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("%w: image: import: index %s: %w", errdefs.ErrInvalidArgument, d.Digest, err)
		}
		for _, c := range index.Manifests {
			if c.Platform != nil && platformMatches(*c.Platform, platform) {
				return a.ociSource(c, platform, depth+1)
			}
		}
		return nil, nil
	case !d.MediaType.IsImage():
		return nil, nil
	}
	b, err := a.ociBlob(d.Digest, maxIndexBytes)
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%w: image: import: manifest %s: %w", errdefs.ErrInvalidArgument, d.Digest, err)
	}
	what := "manifest " + d.Digest.String()
	if err := checkManifest(what, m); err != nil {
		return nil, err
	}
	src := &source{what: what}
	if src.config, err = a.ociBlob(m.Config.Digest, maxConfigBytes); err != nil {
		return nil, err
	}
	for _, l := range m.Layers {
		if err := checkHash(l.Digest); err != nil {
			return nil, err
		}
		b, err := a.blob("blobs/sha256/" + l.Digest.Hex)
		if err != nil {
			return nil, err
		}
		src.layers = append(src.layers, b)
	}
	return src, nil
}
