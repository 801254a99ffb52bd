package daemon

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/image"
	"github.com/sandkiln/sandkiln/internal/reply"
)

// imagesDir is the image store's directory in the state directory.
const imagesDir = "oci"

// MaxImportBytes bounds the tar of POST /images/import.
const MaxImportBytes = 64 << 30

func (d *Daemon) listImages(w http.ResponseWriter, r *http.Request) {
	list := d.images.List()
	out := make([]api.Image, 0, len(list))
	for _, img := range list {
		out = append(out, apiImage(img))
	}
	reply.JSON(w, http.StatusOK, out)
}

func (d *Daemon) getImage(w http.ResponseWriter, r *http.Request) {
	img, err := d.images.Get(r.PathValue("name"))
	if err != nil {
		reply.Error(w, err)
		return
	}
	reply.JSON(w, http.StatusOK, apiImage(img))
}

func (d *Daemon) removeImage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	removed, err := d.images.Remove(name, d.imageInUse)
	if err != nil {
		reply.Error(w, err)
		return
	}
	_, err = d.images.Get(removed.ID)
	out := api.ImageRemoval{ID: removed.ID, Untagged: removed.Names, Deleted: errdefs.ClassOf(err) == errdefs.ErrNotFound}
	if out.Untagged == nil {
		out.Untagged = []string{}
	}
	d.log.Info("image removed", "name", name, "id", removed.ID, "deleted", out.Deleted)
	reply.JSON(w, http.StatusOK, out)
}

// imageInUse says whether a sandbox not deleted was made from image id
// (a stopped one is started from it again), or one is being made from it.
// The store calls it under its lock: it takes d.mu, and nothing holding
// d.mu calls the store.
func (d *Daemon) imageInUse(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.imageLeases[id] > 0 {
		return true
	}
	for _, e := range d.sandboxes {
		if e.rec.ImageID == id && e.rec.State != StateDeleted {
			return true
		}
	}
	return d.snapshotImageInUse(id)
}

// leaseImage keeps image id from removal while a sandbox is made from it;
// the function returned ends the lease (the sandbox's record holds it
// from then on).
func (d *Daemon) leaseImage(id string) func() {
	d.mu.Lock()
	if d.imageLeases == nil {
		d.imageLeases = map[string]int{}
	}
	d.imageLeases[id]++
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		if d.imageLeases[id]--; d.imageLeases[id] == 0 {
			delete(d.imageLeases, id)
		}
		d.mu.Unlock()
	}
}

func (d *Daemon) pullImage(w http.ResponseWriter, r *http.Request) {
	var req api.PullImage
	if err := decodeBody(w, r, &req); err != nil {
		reply.Error(w, err)
		return
	}
	if req.Ref == "" {
		reply.Error(w, errdefs.New(errdefs.ErrInvalidArgument, "ref is required (an image reference, such as busybox:latest)"))
		return
	}
	d.streamImages(w, "pull", func(progress func(image.Progress)) ([]image.Image, error) {
		img, err := d.images.Pull(r.Context(), req.Ref, progress)
		if err != nil {
			return nil, err
		}
		d.log.Info("image pulled", "ref", req.Ref, "id", img.ID)
		return []image.Image{img}, nil
	})
}

func (d *Daemon) importImage(w http.ResponseWriter, r *http.Request) {
	body := http.MaxBytesReader(w, r.Body, MaxImportBytes)
	d.streamImages(w, "import", func(progress func(image.Progress)) ([]image.Image, error) {
		imgs, err := d.images.Import(r.Context(), body, progress)
		if err != nil {
			return nil, err
		}
		for _, img := range imgs {
			d.log.Info("image imported", "names", strings.Join(img.Names, " "), "id", img.ID)
		}
		return imgs, nil
	})
}

// streamImages answers a pull or an import with NDJSON lines
// (api.ImageProgress) as run reports them, and a last line "done" with
// the images or "error". The answer's status is held back until a layer's
// first line, so that what fails before any (a bad reference, a missing
// tag, an unreachable registry) is answered with its own status. A failure
// of the image store itself is told as storeFailure tells it.
func (d *Daemon) streamImages(w http.ResponseWriter, op string, run func(progress func(image.Progress)) ([]image.Image, error)) {
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	// mu orders the lines of layers reported concurrently.
	var mu sync.Mutex
	started := false
	start := func() {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
	}
	imgs, err := run(func(p image.Progress) {
		if p.Status == image.StatusResolving || p.Status == image.StatusDone {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		start()
		enc.Encode(api.ImageProgress{Status: p.Status, Layer: p.Layer, Bytes: p.Bytes, Total: p.Total})
		rc.Flush()
	})
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		err = d.storeFailure(op, err)
		if !started {
			reply.Error(w, err)
			return
		}
		code, _ := reply.Code(err)
		enc.Encode(api.ImageProgress{Status: api.ImageError, Error: &api.ErrorBody{Code: code, Message: err.Error()}})
		return
	}
	start()
	out := api.ImageProgress{Status: api.ImageDone}
	for _, img := range imgs {
		out.Images = append(out.Images, apiImage(img))
	}
	enc.Encode(out)
}

// storeFailure is what a client is told of an image operation's failure:
// err itself when it is the request's or the registry's, and when it is
// the store's own (its filesystem failed or is full: class internal or
// no space), a message of its class alone, the cause, which names the
// store's paths, logged.
func (d *Daemon) storeFailure(op string, err error) error {
	switch errdefs.ClassOf(err) {
	case errdefs.ErrNoSpace:
		d.log.Error("image "+op, "err", err)
		return errdefs.Opaque(errdefs.ErrNoSpace, "image "+op+": no space left in kilnd's image store", err)
	case errdefs.ErrInternal:
		d.log.Error("image "+op, "err", err)
		return errdefs.Opaque(errdefs.ErrInternal, "image "+op+": the image store failed (kilnd's log says why)", err)
	}
	return err
}

// apiImage is img on the wire: its names and layers lists, if empty ones
// (an image of no layer has none), never null.
func apiImage(img image.Image) api.Image {
	if img.Names == nil {
		img.Names = []string{}
	}
	if img.Layers == nil {
		img.Layers = []string{}
	}
	return img
}

// imageRoot finds a create's image and holds it for the create: its
// layers, top first, and the lease to end once the sandbox is recorded.
func (d *Daemon) imageRoot(ref string) (image.Image, []string, func(), error) {
	img, err := d.images.Get(ref)
	if err != nil {
		if errdefs.ClassOf(err) == errdefs.ErrNotFound {
			err = fmt.Errorf("%w (pull it first: kiln image pull %s)", err, ref)
		}
		return image.Image{}, nil, nil, err
	}
	release := d.leaseImage(img.ID)
	// Got after the lease: a removal before it leaves no layers, and
	// says so here.
	layers, err := d.images.LayerDirs(img)
	if err != nil {
		release()
		return image.Image{}, nil, nil, fmt.Errorf("%w: image %s: %w", errdefs.ErrNotFound, ref, err)
	}
	return img, layers, release, nil
}
