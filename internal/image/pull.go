package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// Pull fetches ref from its registry, for the store's platform, and
// stores it under ref's fully qualified name, which leaves the image it
// named before (that one keeps its other names, or stays by ID).
func (s *Store) Pull(ctx context.Context, ref string, progress func(Progress)) (Image, error) {
	r, err := s.reference(ref)
	if err != nil {
		return Image{}, err
	}
	report(progress, Progress{Status: StatusResolving})
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(s.transport),
		remote.WithAuthFromKeychain(s.keychain),
		remote.WithPlatform(s.platform),
		remote.WithUserAgent("kilnd"),
	}
	failed := func(err error) error { return pullError(r.Name(), err) }
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return Image{}, failed(err)
	}
	img, err := s.pick(r.Name(), desc)
	if err != nil {
		return Image{}, failed(err)
	}
	src, err := remoteSource(r.Name(), img)
	if err != nil {
		return Image{}, failed(err)
	}
	src.names = []string{r.Name()}
	src.digest = desc.Digest.String()
	src.status = StatusDownloading
	src.failed = failed
	stored, err := s.install(ctx, src, progress)
	if err != nil {
		return Image{}, failed(err)
	}
	return stored, nil
}

// reference parses ref, letting ggcr use plain HTTP for a registry that
// may be reached so (the transport refuses it for any other).
func (s *Store) reference(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: image: reference %q: %w", errdefs.ErrInvalidArgument, ref, err)
	}
	if s.transport.plainAllowed(r.Context().RegistryStr()) {
		return name.ParseReference(ref, name.Insecure)
	}
	return r, nil
}

// pick returns the image desc is, or the one for the store's platform of
// the index it is.
func (s *Store) pick(ref string, desc *remote.Descriptor) (v1.Image, error) {
	switch {
	case desc.MediaType.IsImage():
		return desc.Image()
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, err
		}
		return s.pickFromIndex(ref, idx, 0)
	}
	return nil, fmt.Errorf("%w: image: %s is a %s, not an image", errdefs.ErrInvalidArgument, ref, desc.MediaType)
}

func (s *Store) pickFromIndex(ref string, idx v1.ImageIndex, depth int) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range m.Manifests {
		if d.Platform == nil || !platformMatches(*d.Platform, s.platform) {
			continue
		}
		switch {
		case d.MediaType.IsImage():
			return idx.Image(d.Digest)
		case d.MediaType.IsIndex() && depth < 2:
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			return s.pickFromIndex(ref, child, depth+1)
		}
	}
	return nil, fmt.Errorf("%w: image: %s has no image for %s", errdefs.ErrNotFound, ref, platformString(s.platform))
}

// remoteSource reads img's manifest and config, bounded, and describes its
// layers' blobs, not yet fetched.
func remoteSource(ref string, img v1.Image) (*source, error) {
	raw, err := img.RawManifest() // ggcr bounds it to 100 MiB
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: image: %s: manifest: %w", errdefs.ErrInvalidArgument, ref, err)
	}
	if err := checkManifest(ref, m); err != nil {
		return nil, err
	}
	config, err := img.RawConfigFile() // read up to m.Config.Size, checked
	if err != nil {
		return nil, err
	}
	src := &source{what: ref, config: config}
	for _, l := range m.Layers {
		layer, err := img.LayerByDigest(l.Digest)
		if err != nil {
			return nil, err
		}
		src.layers = append(src.layers, blob{size: l.Size, open: layer.Compressed})
	}
	return src, nil
}

// checkManifest refuses a manifest that is no container image (an
// artifact), or whose config or layer count is past the bounds.
func checkManifest(ref string, m *v1.Manifest) error {
	switch {
	case !m.Config.MediaType.IsConfig():
		return fmt.Errorf("%w: image: %s is not a container image: its config is a %q", errdefs.ErrInvalidArgument, ref, m.Config.MediaType)
	case m.Config.Size <= 0 || m.Config.Size > maxConfigBytes:
		return fmt.Errorf("%w: image: %s: config of %d bytes (at most %d)", errdefs.ErrTooLarge, ref, m.Config.Size, maxConfigBytes)
	case len(m.Layers) > maxLayers:
		return fmt.Errorf("%w: image: %s has %d layers, more than %d", errdefs.ErrTooLarge, ref, len(m.Layers), maxLayers)
	}
	for _, l := range m.Layers {
		if !l.MediaType.IsLayer() {
			return fmt.Errorf("%w: image: %s: layer %s is a %q, not a layer", errdefs.ErrInvalidArgument, ref, l.Digest, l.MediaType)
		}
	}
	return nil
}

// pullError classes an error of pulling ref: a registry's answer by its
// status, a failure to reach it as unavailable. One with a class keeps it.
func pullError(ref string, err error) error {
	if errdefs.ClassOf(err) != nil {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: image: pull %s: %w", errdefs.ErrUnavailable, ref, err)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return fmt.Errorf("%w: image: %s: %w", errdefs.ErrNotFound, ref, err)
			}
		}
		switch {
		case te.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%w: image: %s: %w", errdefs.ErrNotFound, ref, err)
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return fmt.Errorf("%w: image: %s: the registry refused access (does it exist? are credentials needed?): %w", errdefs.ErrPermissionDenied, ref, err)
		}
	}
	return fmt.Errorf("%w: image: pull %s: %w", errdefs.ErrUnavailable, ref, err)
}

// tlsOnly carries registry requests, refusing plain HTTP to any host not
// allowed it. ggcr by itself falls back to HTTP for RFC 1918 addresses,
// and a registry may redirect a blob or token request anywhere: every
// request, redirects included, passes here.
type tlsOnly struct {
	next http.RoundTripper
	// insecure holds the Insecure entries, lower case: a host (any port)
	// or a host:port.
	insecure map[string]bool
}

func newTLSOnly(next http.RoundTripper, insecure []string) (*tlsOnly, error) {
	if next == nil {
		next = http.DefaultTransport
	}
	t := &tlsOnly{next: next, insecure: map[string]bool{}}
	for _, h := range insecure {
		if _, err := name.NewRegistry(h, name.StrictValidation); err != nil || strings.Contains(h, "/") {
			return nil, fmt.Errorf("%w: image: insecure registry %q is not a host or host:port", errdefs.ErrInvalidArgument, h)
		}
		t.insecure[strings.ToLower(h)] = true
	}
	return t, nil
}

func (t *tlsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "https" || t.plainAllowed(req.URL.Host) {
		return t.next.RoundTrip(req)
	}
	if req.Body != nil {
		req.Body.Close()
	}
	return nil, fmt.Errorf("%w: image: registry %s is reached over TLS only (not loopback, not listed insecure)", errdefs.ErrPermissionDenied, req.URL.Host)
}

// plainAllowed says whether host (host or host:port) may be reached over
// plain HTTP: it is loopback or listed insecure.
func (t *tlsOnly) plainAllowed(host string) bool {
	host = strings.ToLower(host)
	if t.insecure[host] {
		return true
	}
	hostname := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		hostname = h
	}
	hostname = strings.TrimSuffix(strings.TrimPrefix(hostname, "["), "]")
	if t.insecure[hostname] {
		return true
	}
	if hostname == "localhost" {
		return true
	}
	ip := net.ParseIP(hostname)
	return ip != nil && ip.IsLoopback()
}
