package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/sandkiln/sandkiln/api"
)

// Images lists the images kilnd has, the newest first.
func (c *Client) Images(ctx context.Context) ([]api.Image, error) {
	var out []api.Image
	return out, c.call(ctx, "GET", "/images", nil, nil, &out, true)
}

// Image describes an image: by name ("busybox" is
// index.docker.io/library/busybox:latest), ID, or an ID's unique prefix.
func (c *Client) Image(ctx context.Context, name string) (api.Image, error) {
	var out api.Image
	return out, c.call(ctx, "GET", imagePath(name), nil, nil, &out, true)
}

// RemoveImage removes an image's name, and the image with its last one
// (refused, failed precondition, while a sandbox runs from it).
func (c *Client) RemoveImage(ctx context.Context, name string) (api.ImageRemoval, error) {
	var out api.ImageRemoval
	return out, c.call(ctx, "DELETE", imagePath(name), nil, nil, &out, false)
}

// PullImage pulls an image from its registry, calling progress (if set)
// with each layer's progress as kilnd reports it, and returns it once it
// is kept.
func (c *Client) PullImage(ctx context.Context, ref string, progress func(api.ImageProgress)) (api.Image, error) {
	body, err := json.Marshal(api.PullImage{Ref: ref})
	if err != nil {
		return api.Image{}, err
	}
	imgs, err := c.images(ctx, "/images/pull", bytes.NewReader(body), "application/json", progress)
	if err != nil {
		return api.Image{}, err
	}
	if len(imgs) != 1 {
		return api.Image{}, fmt.Errorf("client: pull %s: %d images in the answer", ref, len(imgs))
	}
	return imgs[0], nil
}

// ImportImage imports the images of a tar, as docker save or an OCI image
// layout writes it, for a host without a registry.
func (c *Client) ImportImage(ctx context.Context, tar io.Reader, progress func(api.ImageProgress)) ([]api.Image, error) {
	return c.images(ctx, "/images/import", tar, "application/x-tar", progress)
}

// maxProgressLine bounds a line of a pull's or an import's answer (the
// last one lists the images).
const maxProgressLine = 4 << 20

// images makes a pull or an import and reads its NDJSON answer.
func (c *Client) images(ctx context.Context, path string, body io.Reader, ctype string, progress func(api.ImageProgress)) ([]api.Image, error) {
	resp, _, err := c.request(ctx, c.stream, "POST", path, nil, body, ctype)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxProgressLine)
	for sc.Scan() {
		var p api.ImageProgress
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return nil, fmt.Errorf("client: POST %s: a line of the answer: %w", path, err)
		}
		switch p.Status {
		case api.ImageDone:
			return p.Images, nil
		case api.ImageError:
			if p.Error == nil {
				return nil, &Error{Status: http.StatusOK, Code: api.CodeInternal, Message: "an error without a body"}
			}
			return nil, &Error{Status: http.StatusOK, Code: p.Error.Code, Message: p.Error.Message}
		}
		if progress != nil {
			progress(p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("client: POST %s: %w", path, err)
	}
	return nil, fmt.Errorf("client: POST %s: the answer ended before it was done", path)
}

// imagePath is the route of an image's name, whose slashes stay.
func imagePath(name string) string {
	segs := strings.Split(name, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return "/images/" + strings.Join(segs, "/")
}
