package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestMissingControllers: on a pure cgroup v2 host, limits need the
// controllers kilnd's group is given; those it is not are named, so kilnd
// refuses to start saying what to delegate instead of failing on a
// missing file.
func TestMissingControllers(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte("cpuset cpu io pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ want, missing []string }{
		{nil, nil},
		{[]string{"pids", "cpu"}, nil},
		{[]string{"memory", "pids"}, []string{"memory"}},
		{[]string{"memory", "hugetlb"}, []string{"memory", "hugetlb"}},
	} {
		if got := missingControllers(dir, c.want); !slices.Equal(got, c.missing) {
			t.Errorf("missingControllers(%v) = %v, want %v", c.want, got, c.missing)
		}
	}
	if got := missingControllers(filepath.Join(dir, "gone"), []string{"pids"}); !slices.Equal(got, []string{"pids"}) {
		t.Errorf("no cgroup.controllers: missing %v, want [pids]", got)
	}
}
