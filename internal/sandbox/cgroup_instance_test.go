package sandbox_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestInstanceCgroups: a sandbox's groups are made in its kilnd
// instance's, in every hierarchy, with its limits as before; a create cut
// short by a crash is ended there, and where a kilnd older than instances
// made its groups. The instance's groups go when its kilnd stops with no
// sandbox left in them.
func TestInstanceCgroups(t *testing.T) {
	t.Parallel()
	instance := "test-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:8]
	var parents []string
	t.Cleanup(func() {
		// After the sandbox's own cleanup, as kilnd stops.
		(&sandbox.Namespaces{Instance: instance}).Release()
		for _, p := range parents {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("the instance's group %s is left: %v", p, err)
				unix.Rmdir(p)
			}
		}
	})
	sb := newSandbox(t, sandbox.Options{Instance: instance, Limits: sandbox.Limits{Pids: 64, MemoryBytes: 64 << 20, CPUs: 0.5}})
	want := "kiln-" + instance
	parents = append(parents, filepath.Dir(sb.Cgroups.V2))
	for ctrl, dir := range sb.Cgroups.V1 {
		parents = append(parents, filepath.Dir(dir))
		if filepath.Base(filepath.Dir(dir)) != want {
			t.Errorf("%s group %s: not in %s", ctrl, dir, want)
		}
	}
	if filepath.Base(filepath.Dir(sb.Cgroups.V2)) != want || filepath.Base(sb.Cgroups.V2) != "kiln-"+sb.ID {
		t.Errorf("v2 group %s: want %s/kiln-%s", sb.Cgroups.V2, want, sb.ID)
	}
	if r := run(t, sb, "echo alive"); strings.TrimSpace(r.Stdout) != "alive" {
		t.Errorf("in the instance's group: %q %q", r.Stdout, r.Stderr)
	}

	id := uuid.Must(uuid.NewV7()).String()
	leftovers := []string{filepath.Join(parents[0], "kiln-"+id), filepath.Join(filepath.Dir(parents[0]), "kiln-"+id)}
	for _, dir := range leftovers {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := (&sandbox.Namespaces{Instance: instance}).EndLeftover(id, ""); err != nil {
		t.Error(err)
	}
	for _, dir := range leftovers {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("leftover group %s: %v", dir, err)
			unix.Rmdir(dir)
		}
	}
}
