package client_test

import (
	"archive/tar"
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/client"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
	"github.com/sandkiln/sandkiln/internal/image/imagetest"
)

// TestImages pulls an image of three layers from a registry on loopback,
// as a user would, and makes sandboxes from it: its layers stacked (a file
// removed by a layer above is gone), its config every process's defaults,
// the image kept while a sandbox runs from it; then imports one from a
// docker save tar.
func TestImages(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("kilnd needs root")
	}
	// A kilnd of its own: it restarts it.
	k, err := daemontest.Start(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if k != nil {
			if err := k.Close(); err != nil {
				t.Errorf("kilnd: %v", err)
			}
		}
	}()
	c, err := client.New(client.Options{StateDir: k.State})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	reg := imagetest.StartRegistry(t)
	base := imagetest.Busybox(t, "sh", "cat", "ls", "echo", "env", "pwd", "sleep", "id", "ln", "rm")
	mid := imagetest.Layer(t,
		imagetest.Entry{Name: "etc/", Type: tar.TypeDir},
		imagetest.Entry{Name: "etc/a", Body: "a\n"},
		imagetest.Entry{Name: "etc/b", Body: "b\n"},
		imagetest.Entry{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n"},
		imagetest.Entry{Name: "etc/group", Body: "root:x:0:\napp:x:1000:\nextra:x:2000:app\n"},
		imagetest.Entry{Name: "data/", Type: tar.TypeDir},
		imagetest.Entry{Name: "data/x", Body: "x\n"})
	top := imagetest.Layer(t,
		imagetest.Entry{Name: "etc/.wh.a"},
		imagetest.Entry{Name: "data/.wh..wh..opq"},
		imagetest.Entry{Name: "data/z", Body: "z\n"},
		imagetest.Entry{Name: "srv/app/", Type: tar.TypeDir})
	cfg := v1.Config{Env: []string{"PATH=/bin", "GREETING=hello"}, WorkingDir: "/srv/app", User: "app",
		Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"echo $GREETING from $(pwd)"}}
	ref := reg.Push(t, "tools/box:v1", imagetest.Image(t, cfg, base, mid, top))

	var statuses []string
	img, err := c.PullImage(ctx, ref, func(p api.ImageProgress) { statuses = append(statuses, p.Status) })
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 3 || !slices.Contains(img.Names, ref) || img.Config.WorkingDir != "/srv/app" {
		t.Fatalf("pulled %+v", img)
	}
	if !slices.Contains(statuses, "downloading") {
		t.Errorf("progress of a first pull: %v", statuses)
	}
	statuses = nil
	if _, err := c.PullImage(ctx, ref, func(p api.ImageProgress) { statuses = append(statuses, p.Status) }); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(statuses, "downloading") || !slices.Contains(statuses, "exists") {
		t.Errorf("progress of a second pull, its layers kept: %v", statuses)
	}
	if list, err := c.Images(ctx); err != nil || len(list) != 1 || list[0].ID != img.ID {
		t.Errorf("images: %+v, %v", list, err)
	}
	if got, err := c.Image(ctx, strings.TrimPrefix(img.ID, "sha256:")[:12]); err != nil || got.ID != img.ID {
		t.Errorf("image by its ID's prefix: %+v, %v", got, err)
	}

	sb, err := c.CreateSandbox(ctx, client.SandboxOptions{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	info := sb.Described
	if info.Image != ref || info.ImageID != img.ID {
		t.Errorf("sandbox from an image: image %q, id %q", info.Image, info.ImageID)
	}
	for _, tc := range []struct {
		name string
		o    client.ExecOptions
		want string
	}{
		{"the image's command, env and working directory", client.ExecOptions{}, "hello from /srv/app\n"},
		{"arguments to its entrypoint", client.ExecOptions{Args: []string{"echo bye"}}, "bye\n"},
		{"a command of its own", client.ExecOptions{Command: "pwd"}, "/srv/app\n"},
		{"the layers stacked", client.ExecOptions{Shell: "ls /etc /data; cat /etc/b"}, "/data:\nz\n\n/etc:\nb\ngroup\npasswd\nb\n"},
		{"the image's user, its groups and home", client.ExecOptions{Shell: "id -u; id -g; id -G; echo $HOME"}, "1000\n1000\n1000 2000\n/home/app\n"},
		{"a user of the request's", client.ExecOptions{Shell: "id -u; id -G", User: "root"}, "0\n0\n"},
		{"by number, in no file", client.ExecOptions{Shell: "id -u; id -g; id -G", User: "1234:5678"}, "1234\n5678\n5678\n"},
		{"the image's PATH", client.ExecOptions{Shell: "env | grep ^PATH="}, "PATH=/bin\n"},
	} {
		res, err := sb.Exec(ctx, tc.o)
		if err != nil || string(res.Stdout) != tc.want || res.Exit.Code() != 0 {
			t.Errorf("%s: %q %q %+v, %v; want %q", tc.name, res.Stdout, res.Stderr, res.Exit, err, tc.want)
		}
	}
	if _, err := sb.Exec(ctx, client.ExecOptions{Command: "id", User: "nobody-here"}); !client.IsInvalid(err) || !strings.Contains(err.Error(), "no such user") {
		t.Errorf("an unknown user: %v", err)
	}
	// The sandbox's own files, which its root may replace with a link to
	// what only the agent could read: refused, not followed.
	if _, err := sb.Exec(ctx, client.ExecOptions{Shell: "ln -sf /proc/1/environ /etc/group", User: "root"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, client.ExecOptions{Command: "id"}); !client.IsInvalid(err) || !strings.Contains(err.Error(), "/etc/group") {
		t.Errorf("/etc/group a link to the agent's environment: %v", err)
	}
	if _, err := sb.Exec(ctx, client.ExecOptions{Shell: "rm /etc/group", User: "root"}); err != nil {
		t.Fatal(err)
	}
	// A user other than root has no capabilities: root's files are not its.
	if res, err := sb.Exec(ctx, client.ExecOptions{Shell: "echo x > /etc/b"}); err != nil || res.Exit.Code() == 0 {
		t.Errorf("a user writing root's file: %+v, %v", res.Exit, err)
	}
	if _, err := c.RemoveImage(ctx, ref); !client.IsFailedPrecondition(err) {
		t.Errorf("removing an image a sandbox runs from: %v", err)
	}
	// A new kilnd adopts the sandbox, and keeps its image for it.
	err = k.Stop()
	state := k.State
	k = nil
	if err != nil {
		t.Fatal(err)
	}
	if k, err = daemontest.Start(state, ""); err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Exec(ctx, client.ExecOptions{}); err != nil || string(res.Stdout) != "hello from /srv/app\n" {
		t.Errorf("after a restart, the image's command: %q, %v", res.Stdout, err)
	}
	if _, err := c.RemoveImage(ctx, ref); !client.IsFailedPrecondition(err) {
		t.Errorf("after a restart, removing an image a sandbox runs from: %v", err)
	}
	if err := sb.Delete(ctx, true); err != nil {
		t.Fatal(err)
	}
	if rm, err := c.RemoveImage(ctx, ref); err != nil || !rm.Deleted || !slices.Equal(rm.Untagged, []string{ref}) {
		t.Errorf("removing it after: %+v, %v", rm, err)
	}
	if _, err := c.Image(ctx, ref); !client.IsNotFound(err) {
		t.Errorf("a removed image: %v", err)
	}
	if _, err := c.CreateSandbox(ctx, client.SandboxOptions{Image: ref}); !client.IsNotFound(err) || !strings.Contains(err.Error(), "kiln image pull") {
		t.Errorf("a sandbox from an image kilnd has not: %v", err)
	}
	if _, err := c.PullImage(ctx, reg.Host+"/tools/box:nope", nil); !client.IsNotFound(err) {
		t.Errorf("pulling a missing tag: %v", err)
	}

	// For a host without a registry: docker save's tar.
	saved := imagetest.Save(t, map[string]v1.Image{"example.test/saved:1": imagetest.Image(t, v1.Config{Cmd: []string{"/bin/echo", "saved"}}, base)})
	imported, err := c.ImportImage(ctx, bytes.NewReader(saved), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(imported) != 1 || !slices.Equal(imported[0].Names, []string{"example.test/saved:1"}) {
		t.Fatalf("imported %+v", imported)
	}
	sb, err = c.CreateSandbox(ctx, client.SandboxOptions{Image: "example.test/saved:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(ctx, true)
	if res, err := sb.Exec(ctx, client.ExecOptions{}); err != nil || string(res.Stdout) != "saved\n" {
		t.Errorf("a sandbox from an imported image: %q, %v", res.Stdout, err)
	}
	if _, err := c.ImportImage(ctx, strings.NewReader("not a tar"), nil); !client.IsInvalid(err) {
		t.Errorf("importing garbage: %v", err)
	}
}
