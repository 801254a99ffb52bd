package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
	"github.com/sandkiln/sandkiln/internal/daemon/daemontest"
)

// TestParseVolume: -v as docker run reads it, a relative source made
// absolute against kiln's working directory; what is not that shape is
// refused before kilnd is asked.
func TestParseVolume(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in   string
		want api.Mount
		bad  bool
	}{
		{in: "/srv/data:/data", want: api.Mount{Source: "/srv/data", Target: "/data"}},
		{in: "/srv/data:/data:ro", want: api.Mount{Source: "/srv/data", Target: "/data", ReadOnly: true}},
		{in: "/srv/data:/data:rw", want: api.Mount{Source: "/srv/data", Target: "/data"}},
		{in: "data:/data", want: api.Mount{Source: filepath.Join(wd, "data"), Target: "/data"}},
		{in: "./a/../data:/data", want: api.Mount{Source: filepath.Join(wd, "data"), Target: "/data"}},
		{in: "/srv/data", bad: true},
		{in: "/srv/data:/data:rx", bad: true},
		{in: ":/data", bad: true},
		{in: "/srv/data:", bad: true},
		{in: "/a:/b:ro:rw", bad: true},
	} {
		got, err := parseVolume(tc.in)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), tc.in) {
				t.Errorf("%q: %+v %v, want it refused, naming it", tc.in, got, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
		} else if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q (-want +got):\n%s", tc.in, diff)
		}
	}
}

// TestVolumes runs kiln itself, as a person at a shell does, against a
// kilnd that allows mounts below one directory: -v binds a relative
// source read-only and another writable, inspect shows them, run --rm
// reads and writes through them; a source outside is refused by kilnd
// (125, one prefix), and a kilnd that allows none says which flag would.
func TestVolumes(t *testing.T) {
	allowed := t.TempDir()
	for _, d := range []string{"src", "out"} {
		if err := os.Mkdir(filepath.Join(allowed, d), 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(allowed, d), 0o777)
	}
	if err := os.WriteFile(filepath.Join(allowed, "src", "main.c"), []byte("int main;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	k := daemontest.StartConfigT(t, daemon.Config{AllowMounts: []string{allowed}})
	t.Chdir(allowed)
	ok := kilnOK(t, k.State)

	id := strings.TrimSpace(ok("sandbox", "create", "-v", "src:/src:ro", "--volume", allowed+"/out:/workspace/out"))
	var info api.Sandbox
	if err := json.Unmarshal([]byte(ok("sandbox", "inspect", id)), &info); err != nil {
		t.Fatal(err)
	}
	want := []api.Mount{{Source: filepath.Join(allowed, "src"), Target: "/src", ReadOnly: true}, {Source: filepath.Join(allowed, "out"), Target: "/workspace/out"}}
	if diff := cmp.Diff(want, info.Mounts); diff != "" {
		t.Errorf("inspect's mounts (-want +got):\n%s", diff)
	}
	if out := ok("exec", id, "--", "sh", "-c", "cat /src/main.c; cp /src/main.c /workspace/out/copy.c; touch /src/x 2>&1 || true"); !strings.HasPrefix(out, "int main;\n") || !strings.Contains(out, "Read-only file system") {
		t.Errorf("through the mounts: %q", out)
	}
	if b, err := os.ReadFile(filepath.Join(allowed, "out", "copy.c")); err != nil || string(b) != "int main;\n" {
		t.Errorf("the host's copy: %q %v", b, err)
	}
	ok("stop", "-t", "0", id)
	ok("start", id)
	if out := ok("exec", id, "--", "cat", "/src/main.c"); out != "int main;\n" {
		t.Errorf("started again: %q", out)
	}
	if out := ok("run", "--rm", "-v", "./src:/src:ro", "--", "ls", "/src"); out != "main.c\n" {
		t.Errorf("run --rm -v: %q", out)
	}

	outside := t.TempDir()
	code, _, errs := kilnExe(t, k.State, nil, "run", "--rm", "-v", outside+":/data", "--", "true")
	if code != 125 || !strings.HasPrefix(errs, "kiln: ") || strings.Contains(errs, "kilnd:") || !strings.Contains(errs, "not below") || !strings.Contains(errs, outside) {
		t.Errorf("a source outside: %d %q", code, errs)
	}
	code, _, errs = kilnExe(t, k.State, nil, "sandbox", "create", "-v", "/a")
	if code != 125 || !strings.Contains(errs, "SOURCE:TARGET") {
		t.Errorf("-v without a target: %d %q", code, errs)
	}
	none := kilnd(t)
	code, _, errs = kilnExe(t, none, nil, "run", "--rm", "-v", allowed+":/data", "--", "true")
	if code != 125 || !strings.Contains(errs, "--allow-mount") {
		t.Errorf("a kilnd that allows no mounts: %d %q", code, errs)
	}
}
