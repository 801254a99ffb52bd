package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandkiln/sandkiln/api"
)

// benchImage names the image of three layers the kilnd section makes
// sandboxes from.
const benchImage = "bench.test/box:3-layers"

// importBenchImage imports an image of three layers into kilnd: the host's
// busybox with its applets, then two layers of small files (the second
// removing one of the first's), as a docker save tar. A host without
// busybox gets the reason instead.
// Long because it writes the tar's files one after another, as the
// image's layers hold them.
func importBenchImage(ctx context.Context, c client) (skipped string, err error) {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return "needs /bin/busybox (Debian's busybox-static) to build an image", nil
	}
	type member struct{ name, body, link string }
	layerOf := func(ms ...member) (v1.Layer, error) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, m := range ms {
			h := &tar.Header{Name: m.name, Mode: 0o755, Typeflag: tar.TypeReg, Size: int64(len(m.body))}
			switch {
			case strings.HasSuffix(m.name, "/"):
				h.Typeflag, h.Size = tar.TypeDir, 0
			case m.link != "":
				h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, m.link, 0
			}
			if err := tw.WriteHeader(h); err != nil {
				return nil, err
			}
			io.WriteString(tw, m.body)
		}
		if err := tw.Close(); err != nil {
			return nil, err
		}
		b := buf.Bytes()
		return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	}
	base := []member{{name: "bin/"}, {name: "bin/busybox", body: string(bb)}}
	for _, a := range []string{"sh", "true", "cat", "ls"} {
		base = append(base, member{name: "bin/" + a, link: "busybox"})
	}
	var layers []v1.Layer
	for _, ms := range [][]member{base,
		{{name: "etc/"}, {name: "etc/a", body: "a\n"}, {name: "etc/b", body: "b\n"}, {name: "srv/"}, {name: "srv/app.conf", body: "x=1\n"}},
		{{name: "etc/"}, {name: "etc/.wh.a"}, {name: "etc/c", body: "c\n"}},
	} {
		l, err := layerOf(ms...)
		if err != nil {
			return "", err
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return "", err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Env: []string{"PATH=/bin"}, Cmd: []string{"sh"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	ref, err := name.ParseReference(benchImage)
	if err != nil {
		return "", err
	}
	var saved bytes.Buffer
	if err := tarball.Write(ref, img, &saved); err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", "http://kilnd/images/import", &saved)
	if err != nil {
		return "", err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var last api.ImageProgress
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Status != api.ImageDone {
		return "", fmt.Errorf("import the benchmark's image: %d %s", resp.StatusCode, b)
	}
	return "", nil
}
