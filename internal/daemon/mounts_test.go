package daemon_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestMountsRefusedWithoutAllowMount: a kilnd started without
// --allow-mount refuses every mount, saying so and naming the flag.
func TestMountsRefusedWithoutAllowMount(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	dir := t.TempDir()
	k.refuses("POST", "/sandboxes", api.CreateSandbox{Mounts: []api.Mount{{Source: dir, Target: "/data"}}},
		http.StatusForbidden, api.CodeForbidden, "allows none", "--allow-mount")
	if ids := k.ids(); len(ids) != 0 {
		t.Errorf("sandboxes made: %v", ids)
	}
}

// mountsHost is a host directory tree for mounts: allowed (kilnd's
// --allow-mount) holds data (a file, hello), rw (writable by others, a
// file of root's in it) and links, one to data and one out of allowed;
// outside holds a secret.
type mountsHost struct{ allowed, outside string }

func newMountsHost(t *testing.T) mountsHost {
	t.Helper()
	base := t.TempDir()
	h := mountsHost{allowed: filepath.Join(base, "allowed"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{h.outside, filepath.Join(h.allowed, "data"), filepath.Join(h.allowed, "rw"), filepath.Join(h.allowed, "gone")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Writable by the sandbox's users, which are, to the kernel, "others"
	// of root's directories: data too, so that only its mount being
	// read-only keeps them from writing there.
	for _, d := range []string{"rw", "data"} {
		if err := os.Chmod(filepath.Join(h.allowed, d), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	for path, content := range map[string]string{
		filepath.Join(h.allowed, "data", "hello"): "hi\n", filepath.Join(h.outside, "secret"): "secret\n",
		filepath.Join(h.allowed, "file"): "not a directory\n", filepath.Join(h.allowed, "rw", "roots"): "root's\n",
	} {
		if err := os.WriteFile(path, []byte(content), 0o666); err != nil {
			t.Fatal(err)
		}
		os.Chmod(path, 0o666)
	}
	if err := os.Symlink(h.outside, filepath.Join(h.allowed, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("data", filepath.Join(h.allowed, "in")); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestMountRefusals: every mount that is not an absolute, clean path of
// a directory below the allowed one (a link out of it, a "..", a file),
// or whose target is not the sandbox's to give, is refused with 400
// naming the field, and nothing is made.
func TestMountRefusals(t *testing.T) {
	t.Parallel()
	h := newMountsHost(t)
	k := startConfig(t, daemon.Config{AllowMounts: []string{h.allowed}})
	defer k.cleanup()
	data := filepath.Join(h.allowed, "data")
	many := make([]api.Mount, api.MaxMounts+1)
	for i := range many {
		many[i] = api.Mount{Source: data, Target: fmt.Sprintf("/m%d", i)}
	}
	for _, tc := range []struct {
		name   string
		mounts []api.Mount
		image  bool // the request names an image (unknown: refused later)
		says   []string
	}{
		{"outside", []api.Mount{{Source: h.outside, Target: "/data"}}, false, []string{"mounts[0].source", h.outside, "not below"}},
		{"a link out", []api.Mount{{Source: filepath.Join(h.allowed, "out"), Target: "/data"}}, false, []string{"mounts[0].source", "not below"}},
		{"below a link out", []api.Mount{{Source: filepath.Join(h.allowed, "out") + "/.", Target: "/data"}}, false, []string{"mounts[0].source", "clean"}},
		{"..", []api.Mount{{Source: h.allowed + "/../outside", Target: "/data"}}, false, []string{"mounts[0].source", "clean"}},
		{"relative", []api.Mount{{Source: "allowed/data", Target: "/data"}}, false, []string{"mounts[0].source", "absolute"}},
		{"none", []api.Mount{{Target: "/data"}}, false, []string{"mounts[0].source", "absolute"}},
		{"missing", []api.Mount{{Source: filepath.Join(h.allowed, "nosuch"), Target: "/data"}}, false, []string{"mounts[0].source", "no such directory"}},
		{"a file", []api.Mount{{Source: filepath.Join(h.allowed, "file"), Target: "/data"}}, false, []string{"mounts[0].source", "not a directory"}},
		{"the root", []api.Mount{{Source: data, Target: "/"}}, false, []string{"mounts[0].target", "below /"}},
		{"a relative target", []api.Mount{{Source: data, Target: "data"}}, false, []string{"mounts[0].target", "absolute"}},
		{"an unclean target", []api.Mount{{Source: data, Target: "/data/"}}, false, []string{"mounts[0].target", "clean"}},
		{"proc", []api.Mount{{Source: data, Target: "/proc/sys"}}, false, []string{"mounts[0].target", "/proc"}},
		{"sys", []api.Mount{{Source: data, Target: "/sys"}}, false, []string{"mounts[0].target", "/sys"}},
		{"dev", []api.Mount{{Source: data, Target: "/dev/shm/x"}}, false, []string{"mounts[0].target", "/dev"}},
		{"the agent's", []api.Mount{{Source: data, Target: "/.kiln"}}, false, []string{"mounts[0].target", "/.kiln"}},
		{"tmp", []api.Mount{{Source: data, Target: "/tmp"}}, false, []string{"mounts[0].target", "own mounts"}},
		{"workspace", []api.Mount{{Source: data, Target: "/workspace"}}, false, []string{"mounts[0].target", "own mounts"}},
		{"the host's usr", []api.Mount{{Source: data, Target: "/usr/local/data"}}, false, []string{"mounts[0].target", "read-only from the host"}},
		{"the host's etc", []api.Mount{{Source: data, Target: "/etc"}}, false, []string{"mounts[0].target", "read-only from the host"}},
		{"twice", []api.Mount{{Source: data, Target: "/a"}, {Source: data, Target: "/a"}}, false, []string{"mounts[1].target", "mounts[0] has that target"}},
		{"nested", []api.Mount{{Source: data, Target: "/a/b"}, {Source: data, Target: "/a"}}, false, []string{"mounts[1].target", "apart"}},
		{"too many", many, false, []string{"mounts", "at most 16"}},
		{"proc in an image", []api.Mount{{Source: data, Target: "/proc"}}, true, []string{"mounts[0].target", "/proc"}},
	} {
		req := api.CreateSandbox{Mounts: tc.mounts}
		if tc.image {
			req.Image = "no-such-image"
		}
		t.Run(tc.name, func(t *testing.T) {
			k.t = t
			k.refuses("POST", "/sandboxes", req, http.StatusBadRequest, api.CodeInvalid, tc.says...)
		})
	}
	k.t = t
	if ids := k.ids(); len(ids) != 0 {
		t.Errorf("sandboxes made: %v", ids)
	}
	// In an image, /etc and /usr are the sandbox's own: only the image
	// is refused here, not the target.
	k.refuses("POST", "/sandboxes", api.CreateSandbox{Image: "no-such-image", Mounts: []api.Mount{{Source: data, Target: "/etc/app"}}},
		http.StatusNotFound, api.CodeNotFound, "no-such-image")
}

// TestMounts: in both runtimes, a read-only mount reads and refuses writes
// with EROFS, a writable one takes them and the host sees the file, owned
// by the sandbox's host user, never root, and a file of root's there can
// be written (its mode lets others) but not made setuid; only the mounted
// directory is seen; a link inside the allowed directory is followed. The
// sandbox's description shows its mounts; stopped and started, it has
// them again; one whose source went is refused its start, saying which.
func TestMounts(t *testing.T) {
	t.Parallel()
	h := newMountsHost(t)
	k := startConfig(t, daemon.Config{AllowMounts: []string{h.allowed}})
	defer k.cleanup()
	mounts := []api.Mount{
		{Source: filepath.Join(h.allowed, "data"), Target: "/data", ReadOnly: true},
		{Source: filepath.Join(h.allowed, "rw"), Target: "/workspace/out"},
		{Source: filepath.Join(h.allowed, "in"), Target: "/srv/in/deep", ReadOnly: true},
	}
	for _, runtime := range []string{sandbox.RuntimeNamespaces, sandbox.RuntimeGVisor} {
		t.Run(runtime, func(t *testing.T) {
			k.t = t
			code, b := k.do("POST", "/sandboxes", k.d.Token(), api.CreateSandbox{Runtime: runtime, Mounts: mounts})
			if code == http.StatusServiceUnavailable && runtime == sandbox.RuntimeGVisor && os.Getenv("CI") == "" {
				t.Skipf("no gVisor here: %s", b)
			}
			if code != http.StatusCreated {
				t.Fatalf("create: %d %s", code, b)
			}
			var created daemon.Info
			if err := json.Unmarshal(b, &created); err != nil {
				t.Fatal(err)
			}
			id := created.ID
			if diff := cmp.Diff(mounts, created.Mounts); diff != "" {
				t.Errorf("described mounts (-want +got):\n%s", diff)
			}
			check := func(when string) {
				t.Helper()
				if got := k.sh(t, id, "cat /data/hello /srv/in/deep/hello; ls -A /data"); got != "hi\nhi\nhello\n" {
					t.Errorf("%s: read: %q", when, got)
				}
				if got := k.sh(t, id, "touch /data/x 2>&1 || true; { echo w > /srv/in/deep/hello; } 2>&1 || true"); strings.Count(got, "Read-only file system") != 2 {
					t.Errorf("%s: writes to read-only mounts: %q, want EROFS twice", when, got)
				}
				// Nothing beside the directory: its parent is the sandbox's.
				if got := k.sh(t, id, "ls -A /data/..; test ! -e /data/../rw && test ! -e /data/../outside && echo apart"); strings.Contains(got, "secret") || !strings.HasSuffix(got, "apart\n") {
					t.Errorf("%s: beside /data: %q", when, got)
				}
			}
			check("created")
			file := "from-" + runtime
			k.sh(t, id, "echo written > /workspace/out/"+file)
			got, err := os.ReadFile(filepath.Join(h.allowed, "rw", file))
			if err != nil || string(got) != "written\n" {
				t.Errorf("the host reads %q %v", got, err)
			}
			if fi, err := os.Stat(filepath.Join(h.allowed, "rw", file)); err != nil || fi.Sys().(*syscall.Stat_t).Uid == 0 {
				t.Errorf("the file the sandbox wrote is root's on the host: %v", err)
			}
			if got := k.sh(t, id, "echo more >> /workspace/out/roots && chmod u+s /workspace/out/roots 2>&1 || echo refused"); !strings.HasSuffix(got, "refused\n") {
				t.Errorf("root's file made setuid from the sandbox: %q", got)
			}
			if fi, err := os.Stat(filepath.Join(h.allowed, "rw", "roots")); err != nil || fi.Mode()&os.ModeSetuid != 0 {
				t.Errorf("root's file on the host: %v %v", fi.Mode(), err)
			}

			k.change(t, "stop?timeout=0", id)
			_, started := k.change(t, "start", id)
			if diff := cmp.Diff(mounts, started.Mounts); diff != "" {
				t.Errorf("mounts once started again (-want +got):\n%s", diff)
			}
			check("started again")
			if got := k.sh(t, id, "cat /workspace/out/"+file); got != "written\n" {
				t.Errorf("started again: %q", got)
			}

			// A source gone: the sandbox does not start, and says which.
			gone := filepath.Join(h.allowed, "gone-"+runtime)
			if err := os.Mkdir(gone, 0o755); err != nil {
				t.Fatal(err)
			}
			var g daemon.Info
			k.json("POST", "/sandboxes", api.CreateSandbox{Runtime: runtime, Mounts: []api.Mount{{Source: gone, Target: "/g"}}}, &g)
			k.change(t, "stop?timeout=0", g.ID)
			if err := os.Remove(gone); err != nil {
				t.Fatal(err)
			}
			k.refuses("POST", "/sandboxes/"+g.ID+"/start", nil, http.StatusPreconditionFailed, api.CodePrecondition, "cannot be started", "mounts[0].source", gone, "no such directory")
			k.json("DELETE", "/sandboxes/"+g.ID, nil, nil)
			k.json("DELETE", "/sandboxes/"+id, nil, nil)
		})
	}
	k.t = t
}
