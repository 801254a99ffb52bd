// Package image keeps the OCI images kilnd's sandboxes start from: pulled from registries or imported from tars, each layer unpacked once by digest for overlayfs.
package image

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// Options set up a Store. The zero value reaches registries over TLS with
// the docker config file's credentials, for this host's platform.
type Options struct {
	// Insecure lists registries (host or host:port) reached over plain
	// HTTP. Registries on loopback addresses (127.0.0.0/8, ::1, localhost)
	// always are, as Docker treats them; every other one, RFC 1918
	// addresses included, is reached over TLS only.
	Insecure []string
	// Keychain finds registry credentials (default authn.DefaultKeychain:
	// the docker config file and the credential stores it names).
	Keychain authn.Keychain
	// Transport carries registry requests (default http.DefaultTransport).
	Transport http.RoundTripper
	// Platform is the one image of a multi-platform index that is pulled,
	// and the only one imported or pulled images may be for (default
	// linux/runtime.GOARCH).
	Platform *v1.Platform
}

// Config is what an image's config says of the processes started from
// it; Image is a stored image (see api.Image). A Store's answers are the
// caller's own copies.
type (
	Config = api.ImageConfig
	Image  = api.Image
)

func clone(img Image) Image {
	img.Names = slices.Clone(img.Names)
	img.Layers = slices.Clone(img.Layers)
	img.Config.Env = slices.Clone(img.Config.Env)
	img.Config.Entrypoint = slices.Clone(img.Config.Entrypoint)
	img.Config.Cmd = slices.Clone(img.Config.Cmd)
	return img
}

// Progress is one step of a Pull or an Import.
type Progress struct {
	// Layer is the diffID of the layer the step is about; empty for
	// "resolving" and "done".
	Layer string `json:"layer,omitempty"`
	// Bytes of the layer's blob read so far, of Total (0: unknown); for
	// "done", the image's size.
	Bytes int64 `json:"bytes,omitempty"`
	Total int64 `json:"total,omitempty"`
	// Status is one of the Status constants.
	Status string `json:"status"`
}

// The statuses of Progress. A layer is read and unpacked in one pass: a
// Pull reports it "downloading", an Import "unpacking"; a layer already
// stored is "exists".
const (
	StatusResolving   = "resolving"
	StatusDownloading = "downloading"
	StatusUnpacking   = "unpacking"
	StatusExists      = "exists"
	StatusDone        = "done"
)

// Bounds on what a registry or a tar may make the store do.
const (
	maxLayers      = 128
	maxEntries     = 1 << 20
	maxNameLen     = 4096
	maxLayerBytes  = 64 << 30
	maxConfigBytes = 8 << 20
	maxIndexBytes  = 8 << 20
)

// Store is a directory of images:
//
//	images.json        the images and layers (state), replaced atomically
//	layers/<hex>/      one unpacked layer per diffID, shared by images
//	tmp/               layers being unpacked, imports, removals; emptied by Open
//
// A layer directory appears (by rename) only complete and verified, and
// goes only once no recorded image uses it and no Pull or Import in
// progress is about to.
type Store struct {
	dir       string // absolute
	platform  v1.Platform
	keychain  authn.Keychain
	transport *tlsOnly

	// mu guards images, names, layers, pins and unpacking. images.json is
	// rewritten before mu is released whenever images changes; images and
	// layers are replaced, never changed in place, so a failed write
	// leaves them as they were.
	mu     sync.Mutex
	images map[string]Image  // by ID
	names  map[string]string // name → ID, derived from images
	layers map[string]int64  // layers on disk: hex of diffID → bytes
	// pins counts, by layer, the installs in progress that will record an
	// image using it: a pinned layer is not collected.
	pins map[string]int
	// unpacking holds a channel per layer being unpacked, closed when that
	// ends, well or not: one unpack of a layer at a time.
	unpacking map[string]chan struct{}
}

// state is images.json.
type state struct {
	Images []Image          `json:"images"`
	Layers map[string]int64 `json:"layers"`
}

// Open opens the store in dir, creating it (mode 0700) if missing, and
// removes what a crash left: temporary files and unused layers.
func Open(dir string, o Options) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: image: store %q: %w", errdefs.ErrInvalidArgument, dir, err)
	}
	s := &Store{
		dir:       abs,
		platform:  v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
		keychain:  o.Keychain,
		images:    map[string]Image{},
		layers:    map[string]int64{},
		pins:      map[string]int{},
		unpacking: map[string]chan struct{}{},
	}
	if o.Platform != nil {
		s.platform = *o.Platform
	}
	if s.platform.OS == "" || s.platform.Architecture == "" {
		return nil, fmt.Errorf("%w: image: platform %q needs an os and an architecture", errdefs.ErrInvalidArgument, platformString(s.platform))
	}
	if s.keychain == nil {
		s.keychain = authn.DefaultKeychain
	}
	if s.transport, err = newTLSOnly(o.Transport, o.Insecure); err != nil {
		return nil, err
	}
	for _, d := range []string{abs, s.layersDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, storeError(err, "store")
		}
	}
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		return nil, storeError(err, "store")
	}
	if err := os.Mkdir(s.tmpDir(), 0o700); err != nil {
		return nil, storeError(err, "store")
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) layersDir() string        { return filepath.Join(s.dir, "layers") }
func (s *Store) tmpDir() string           { return filepath.Join(s.dir, "tmp") }
func (s *Store) stateFile() string        { return filepath.Join(s.dir, "images.json") }
func (s *Store) layerDir(h string) string { return filepath.Join(s.layersDir(), h) }

// load reads images.json and reconciles it with layers/: a directory no
// image uses is removed (a crash came between its rename and the record
// of its image), and a layer without a directory is forgotten, so the
// next Pull of its image unpacks it again.
func (s *Store) load() error {
	var st state
	b, err := os.ReadFile(s.stateFile())
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return storeError(err, "store")
	default:
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("%w: image: store %s: %w", errdefs.ErrInternal, s.stateFile(), err)
		}
	}
	images := map[string]Image{}
	for _, img := range st.Images {
		images[img.ID] = img
	}
	used := usedLayers(images)
	entries, err := os.ReadDir(s.layersDir())
	if err != nil {
		return storeError(err, "store")
	}
	layers := map[string]int64{}
	for _, e := range entries {
		size, recorded := st.Layers[e.Name()]
		if !used[e.Name()] || !recorded {
			if err := os.RemoveAll(filepath.Join(s.layersDir(), e.Name())); err != nil {
				return storeError(err, "store")
			}
			continue
		}
		layers[e.Name()] = size
	}
	s.images, s.names, s.layers = images, namesOf(images), layers
	if !maps.Equal(layers, st.Layers) {
		return s.save(images, layers)
	}
	return nil
}

// save writes images.json for images and layers, then makes them the
// store's: on error nothing changed. The caller holds mu.
func (s *Store) save(images map[string]Image, layers map[string]int64) error {
	st := state{Images: slices.SortedFunc(maps.Values(images), func(a, b Image) int { return strings.Compare(a.ID, b.ID) }), Layers: layers}
	b, err := json.MarshalIndent(st, "", "\t")
	if err != nil {
		return storeError(err, "store")
	}
	if err := writeFileAtomic(s.stateFile(), s.tmpDir(), b); err != nil {
		return storeError(err, "store")
	}
	s.images, s.names, s.layers = images, namesOf(images), layers
	return nil
}

// writeFileAtomic replaces file with b: written to a temporary file in
// tmp (on the same filesystem), synced, renamed over file, and file's
// directory synced, so a crash leaves the old file or the new one.
func writeFileAtomic(file, tmp string, b []byte) error {
	f, err := os.CreateTemp(tmp, "state-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(f.Name(), file); err != nil {
		return err
	}
	return syncDir(filepath.Dir(file))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func namesOf(images map[string]Image) map[string]string {
	names := map[string]string{}
	for id, img := range images {
		for _, n := range img.Names {
			names[n] = id
		}
	}
	return names
}

// usedLayers returns the hex of every layer some image uses.
func usedLayers(images map[string]Image) map[string]bool {
	used := map[string]bool{}
	for _, img := range images {
		for _, l := range img.Layers {
			used[strings.TrimPrefix(l, "sha256:")] = true
		}
	}
	return used
}

// List returns every image, the most recently added first (ties by ID).
func (s *Store) List() []Image {
	s.mu.Lock()
	list := make([]Image, 0, len(s.images))
	for _, img := range s.images {
		list = append(list, clone(img))
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b Image) int {
		if c := b.Added.Compare(a.Added); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return list
}

// Get returns the image ref names: a full ID (with or without "sha256:"),
// a reference ("busybox" is index.docker.io/library/busybox:latest), or
// failing those a unique prefix of at least 12 hex digits of an ID.
func (s *Store) Get(ref string) (Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, _, err := s.lookupLocked(ref)
	if err != nil {
		return Image{}, err
	}
	return clone(s.images[id]), nil
}

// lookupLocked returns the ID of the image ref names, and whether ref was
// an ID rather than a name. The caller holds mu.
func (s *Store) lookupLocked(ref string) (id string, byID bool, err error) {
	hexPart := strings.TrimPrefix(ref, "sha256:")
	isHex := len(hexPart) > 0 && strings.Trim(hexPart, "0123456789abcdef") == ""
	if isHex && len(hexPart) == 64 {
		if _, ok := s.images["sha256:"+hexPart]; ok {
			return "sha256:" + hexPart, true, nil
		}
		return "", false, fmt.Errorf("%w: image: no image %q", errdefs.ErrNotFound, ref)
	}
	if n, err := canonicalName(ref); err == nil {
		if id, ok := s.names[n]; ok {
			return id, false, nil
		}
	} else if !isHex {
		return "", false, err
	}
	if isHex && len(hexPart) >= 12 {
		var found []string
		for id := range s.images {
			if strings.HasPrefix(id, "sha256:"+hexPart) {
				found = append(found, id)
			}
		}
		switch len(found) {
		case 1:
			return found[0], true, nil
		case 0:
		default:
			return "", false, fmt.Errorf("%w: image: ID prefix %q is ambiguous: %d images have it", errdefs.ErrInvalidArgument, ref, len(found))
		}
	}
	return "", false, fmt.Errorf("%w: image: no image %q", errdefs.ErrNotFound, ref)
}

// canonicalName returns the fully qualified form of the reference ref.
func canonicalName(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("%w: image: reference %q: %w", errdefs.ErrInvalidArgument, ref, err)
	}
	return r.Name(), nil
}

// Remove removes ref. A name is untagged, and the image deleted with it if
// that was its last; an ID deletes the image and all its names. A deleted
// image's layers that no other image uses go too. Deleting an image
// inUse says a sandbox uses is refused; inUse is called with the store's
// lock held, so it must not call the store.
//
// Remove returns the image as it was, but with Names holding only the
// names it removed; whether the image is gone Get of its ID tells (it is
// unless ref was one of several names).
func (s *Store) Remove(ref string, inUse func(id string) bool) (Image, error) {
	var trash []string
	defer func() { s.emptyTrash(trash) }()
	s.mu.Lock()
	defer s.mu.Unlock()
	id, byID, err := s.lookupLocked(ref)
	if err != nil {
		return Image{}, err
	}
	img := s.images[id]
	removed := img.Names
	if !byID {
		n, _ := canonicalName(ref)
		removed = []string{n}
	}
	images := maps.Clone(s.images)
	if rest := slices.DeleteFunc(slices.Clone(img.Names), func(n string) bool { return slices.Contains(removed, n) }); len(rest) > 0 {
		kept := clone(img)
		kept.Names = rest
		images[id] = kept
		if err := s.save(images, s.layers); err != nil {
			return Image{}, err
		}
		img.Names = removed
		return clone(img), nil
	}
	if inUse != nil && inUse(id) {
		return Image{}, fmt.Errorf("%w: image: image %s is in use by a sandbox", errdefs.ErrFailedPrecondition, ref)
	}
	delete(images, id)
	layers, gone := s.collect(images, hexes(img.Layers))
	if err := s.save(images, layers); err != nil {
		return Image{}, err
	}
	trash = s.moveToTrash(gone)
	img.Names = removed
	return clone(img), nil
}

func hexes(diffIDs []string) []string {
	h := make([]string, len(diffIDs))
	for i, d := range diffIDs {
		h[i] = strings.TrimPrefix(d, "sha256:")
	}
	return h
}

// collect returns layers without those of candidates that no image of
// images uses and no install has pinned, and which those are. The caller
// holds mu.
func (s *Store) collect(images map[string]Image, candidates []string) (map[string]int64, []string) {
	used := usedLayers(images)
	var gone []string
	for _, h := range candidates {
		if _, ok := s.layers[h]; ok && !used[h] && s.pins[h] == 0 && !slices.Contains(gone, h) {
			gone = append(gone, h)
		}
	}
	if len(gone) == 0 {
		return s.layers, nil
	}
	layers := maps.Clone(s.layers)
	for _, h := range gone {
		delete(layers, h)
	}
	return layers, gone
}

// moveToTrash renames the directories of layers out of layers/, quickly,
// under mu; emptyTrash removes them after. A directory that will not move
// stays, for Open to remove, as no recorded image uses it.
func (s *Store) moveToTrash(layers []string) []string {
	var trash []string
	for _, h := range layers {
		t := filepath.Join(s.tmpDir(), "trash-"+h+"-"+rand.Text())
		if os.Rename(s.layerDir(h), t) == nil {
			trash = append(trash, t)
		}
	}
	return trash
}

func (s *Store) emptyTrash(trash []string) {
	for _, t := range trash {
		os.RemoveAll(t)
	}
}

// LayerDirs returns the absolute directories of img's unpacked layers, top
// first, as overlayfs's lowerdir lists them. A layer an image has more than
// once is listed once, where it is topmost: the lower copies add nothing
// the top one does not.
func (s *Store) LayerDirs(img Image) ([]string, error) {
	s.mu.Lock()
	var dirs []string
	seen := map[string]bool{}
	for _, d := range slices.Backward(img.Layers) {
		h := strings.TrimPrefix(d, "sha256:")
		if _, ok := s.layers[h]; !ok {
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: image: layer %s of image %s is not stored", errdefs.ErrNotFound, d, img.ID)
		}
		if !seen[h] {
			seen[h] = true
			dirs = append(dirs, s.layerDir(h))
		}
	}
	s.mu.Unlock()
	for _, d := range dirs {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%w: image: layer %s of image %s is missing", errdefs.ErrNotFound, filepath.Base(d), img.ID)
		}
	}
	return dirs, nil
}

func platformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}
