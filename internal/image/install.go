package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// source is an image to install, wherever it comes from.
type source struct {
	what   string // for messages: the reference, or the import's name
	names  []string
	digest string
	config []byte // the raw config blob, bounded by maxConfigBytes
	layers []blob // bottom first, one per diffID of the config
	// status is how its layers' progress is reported.
	status string
	// failed classes an error reading a blob, which the source knows the
	// meaning of (a registry gone is unavailable, a short tar invalid).
	failed func(error) error
}

// blob is a layer's stream as it is stored or sent: compressed or not.
type blob struct {
	size int64 // 0: unknown
	open func() (io.ReadCloser, error)
}

// install stores src's layers and records it. Its layers are pinned
// meanwhile, so a concurrent Remove does not collect one it shares with an
// image about to be recorded.
func (s *Store) install(ctx context.Context, src *source, progress func(Progress)) (Image, error) {
	img, diffIDs, err := s.describe(src)
	if err != nil {
		return Image{}, err
	}
	s.mu.Lock()
	for _, h := range diffIDs {
		s.pins[h]++
	}
	s.mu.Unlock()
	var trash []string
	defer func() { s.emptyTrash(trash) }()
	unpin := func() {
		for _, h := range diffIDs {
			if s.pins[h]--; s.pins[h] == 0 {
				delete(s.pins, h)
			}
		}
	}

	for i, b := range src.layers {
		if err := s.ensureLayer(ctx, src, img.Layers[i], b, progress); err != nil {
			s.mu.Lock()
			unpin()
			if layers, gone := s.collect(s.images, diffIDs); len(gone) > 0 && s.save(s.images, layers) == nil {
				trash = s.moveToTrash(gone)
			}
			s.mu.Unlock()
			return Image{}, err
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	defer unpin()
	seen := map[string]bool{}
	for _, h := range diffIDs {
		if !seen[h] {
			seen[h] = true
			img.Size += s.layers[h]
		}
	}
	img.Added = time.Now().UTC()
	images := maps.Clone(s.images)
	if old, ok := images[img.ID]; ok {
		img.Names = append(img.Names, old.Names...)
		if img.Digest == "" {
			img.Digest = old.Digest
		}
	}
	slices.Sort(img.Names)
	img.Names = slices.Compact(img.Names)
	// A name moves to the new image; the image it leaves keeps its other
	// names or, with none, stays by ID until removed (Pull cannot ask
	// whether a sandbox uses it).
	for _, n := range img.Names {
		if other, ok := s.names[n]; ok && other != img.ID {
			o := clone(images[other])
			o.Names = slices.DeleteFunc(o.Names, func(x string) bool { return x == n })
			images[other] = o
		}
	}
	images[img.ID] = img
	if err := s.save(images, s.layers); err != nil {
		return Image{}, err
	}
	report(progress, Progress{Status: StatusDone, Bytes: img.Size})
	return clone(img), nil
}

// describe checks src's config and returns the image it makes (without
// Size and Added) and the hex of its layers' diffIDs.
func (s *Store) describe(src *source) (Image, []string, error) {
	cfg, err := v1.ParseConfigFile(bytes.NewReader(src.config))
	if err != nil {
		return Image{}, nil, fmt.Errorf("%w: image: %s: config: %w", errdefs.ErrInvalidArgument, src.what, err)
	}
	diffIDs := cfg.RootFS.DiffIDs
	switch {
	case len(diffIDs) > maxLayers:
		return Image{}, nil, fmt.Errorf("%w: image: %s has %d layers, more than %d", errdefs.ErrTooLarge, src.what, len(diffIDs), maxLayers)
	case len(diffIDs) == 0:
		return Image{}, nil, fmt.Errorf("%w: image: %s has no layers", errdefs.ErrInvalidArgument, src.what)
	case len(diffIDs) != len(src.layers):
		return Image{}, nil, fmt.Errorf("%w: image: %s has %d layers and %d diff_ids", errdefs.ErrInvalidArgument, src.what, len(src.layers), len(diffIDs))
	}
	platform := s.platform
	if cfg.OS != "" || cfg.Architecture != "" {
		platform = v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
		if !platformMatches(platform, s.platform) {
			return Image{}, nil, fmt.Errorf("%w: image: %s is for %s, not %s", errdefs.ErrInvalidArgument, src.what, platformString(platform), platformString(s.platform))
		}
	}
	sum := sha256.Sum256(src.config)
	img := Image{
		ID:       "sha256:" + hex.EncodeToString(sum[:]),
		Names:    slices.Clone(src.names),
		Digest:   src.digest,
		Created:  cfg.Created.UTC(),
		Platform: platformString(platform),
		Config: Config{
			Env:        cfg.Config.Env,
			WorkingDir: cfg.Config.WorkingDir,
			User:       cfg.Config.User,
			Entrypoint: cfg.Config.Entrypoint,
			Cmd:        cfg.Config.Cmd,
		},
	}
	hexes := make([]string, len(diffIDs))
	for i, d := range diffIDs {
		// The hex names a directory: it must be exactly a sha256.
		if d.Algorithm != "sha256" || len(d.Hex) != 64 || strings.Trim(d.Hex, "0123456789abcdef") != "" {
			return Image{}, nil, fmt.Errorf("%w: image: %s: diff_id %q is not a sha256", errdefs.ErrInvalidArgument, src.what, d)
		}
		hexes[i] = d.Hex
		img.Layers = append(img.Layers, d.String())
	}
	return img, hexes, nil
}

// platformMatches says whether an image for p runs on want: same OS and
// architecture, and the variant, when both say one.
func platformMatches(p, want v1.Platform) bool {
	return p.OS == want.OS && p.Architecture == want.Architecture &&
		(p.Variant == "" || want.Variant == "" || p.Variant == want.Variant)
}

func report(progress func(Progress), p Progress) {
	if progress != nil {
		progress(p)
	}
}

// ensureLayer makes sure the layer diffID is unpacked, unpacking it from b
// unless it is stored or another install is unpacking it, which it waits
// for (and then, if that one failed, tries itself).
func (s *Store) ensureLayer(ctx context.Context, src *source, diffID string, b blob, progress func(Progress)) error {
	h := strings.TrimPrefix(diffID, "sha256:")
	for {
		s.mu.Lock()
		if _, ok := s.layers[h]; ok {
			s.mu.Unlock()
			report(progress, Progress{Layer: diffID, Status: StatusExists})
			return nil
		}
		if wait, ok := s.unpacking[h]; ok {
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		done := make(chan struct{})
		s.unpacking[h] = done
		s.mu.Unlock()

		size, err := s.unpackLayer(ctx, src, diffID, b, progress)
		s.mu.Lock()
		if err == nil {
			layers := maps.Clone(s.layers)
			layers[h] = size
			s.layers = layers
		}
		delete(s.unpacking, h)
		close(done)
		s.mu.Unlock()
		return err
	}
}

// unpackLayer unpacks b into a temporary directory, checks that its
// uncompressed stream has the digest diffID, and only then renames it into
// layers/. It returns the bytes of the layer's files.
func (s *Store) unpackLayer(ctx context.Context, src *source, diffID string, b blob, progress func(Progress)) (int64, error) {
	tmp, err := os.MkdirTemp(s.tmpDir(), "layer-")
	if err != nil {
		return 0, storeError(err, "layer %s", diffID)
	}
	defer os.RemoveAll(tmp) // nothing, once renamed
	if err := os.Chmod(tmp, 0o755); err != nil {
		return 0, storeError(err, "layer %s", diffID)
	}
	rc, err := b.open()
	if err != nil {
		return 0, src.failed(err)
	}
	defer rc.Close()
	counted := &progressReader{r: rc, p: Progress{Layer: diffID, Total: b.size, Status: src.status}, report: progress}
	layer, err := partial.CompressedToLayer(compressed{counted, b.size})
	if err != nil {
		return 0, storeError(err, "layer %s", diffID)
	}
	ur, err := layer.Uncompressed()
	if err != nil {
		if counted.err != nil {
			return 0, src.failed(counted.err)
		}
		return 0, fmt.Errorf("%w: image: layer %s: %w", errdefs.ErrInvalidArgument, diffID, err)
	}
	defer ur.Close()
	hash := sha256.New()
	stream := &countingReader{r: io.LimitReader(io.TeeReader(ur, hash), maxLayerBytes+1)}

	unpacked, err := unpack(ctx, tmp, stream)
	if err == nil {
		// The tar's end may be followed by padding, which is in the digest.
		_, err = io.Copy(io.Discard, stream)
	}
	switch {
	case counted.err != nil:
		return 0, src.failed(counted.err)
	case stream.n > maxLayerBytes:
		return 0, fmt.Errorf("%w: image: layer %s: uncompressed, more than %d bytes", errdefs.ErrTooLarge, diffID, int64(maxLayerBytes))
	case err != nil && errdefs.ClassOf(err) == nil && ctx.Err() == nil:
		return 0, fmt.Errorf("%w: image: layer %s: %w", errdefs.ErrInvalidArgument, diffID, err)
	case err != nil:
		return 0, err
	}
	if got := "sha256:" + hex.EncodeToString(hash.Sum(nil)); got != diffID {
		return 0, fmt.Errorf("%w: image: layer %s: its content's digest is %s", errdefs.ErrInvalidArgument, diffID, got)
	}
	io.Copy(io.Discard, counted) // the rest of the blob, for its own digest check and progress
	counted.flush()

	if err := syncfs(tmp); err != nil {
		return 0, storeError(err, "layer %s", diffID)
	}
	dst := s.layerDir(strings.TrimPrefix(diffID, "sha256:"))
	// A directory there is not recorded (else this would not run): a
	// leftover of a failed removal.
	if err := os.RemoveAll(dst); err != nil {
		return 0, storeError(err, "layer %s", diffID)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return 0, storeError(err, "layer %s", diffID)
	}
	if err := syncDir(s.layersDir()); err != nil {
		return 0, storeError(err, "layer %s", diffID)
	}
	return unpacked.size, nil
}

func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// compressed is a blob already open, as ggcr's partial wants it, to
// decompress it (gzip, zstd or none) as it reads.
type compressed struct {
	r    io.Reader
	size int64
}

func (c compressed) Digest() (v1.Hash, error) {
	return v1.Hash{}, errors.New("image: digest not known")
}
func (c compressed) Compressed() (io.ReadCloser, error)  { return io.NopCloser(c.r), nil }
func (c compressed) Size() (int64, error)                { return c.size, nil }
func (c compressed) MediaType() (types.MediaType, error) { return types.DockerLayer, nil }

// progressReader counts a blob's bytes, reports them at most once a MiB,
// and keeps the first error the blob's source gave.
type progressReader struct {
	r      io.Reader
	p      Progress
	last   int64
	report func(Progress)
	err    error
}

const progressEvery = 1 << 20

func (r *progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.Bytes += int64(n)
	if r.p.Bytes-r.last >= progressEvery {
		r.flush()
	}
	if err != nil && !errors.Is(err, io.EOF) && r.err == nil {
		r.err = err
	}
	return n, err
}

func (r *progressReader) flush() {
	r.last = r.p.Bytes
	report(r.report, r.p)
}

type countingReader struct {
	r io.Reader
	n int64
}

func (r *countingReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.n += int64(n)
	return n, err
}
