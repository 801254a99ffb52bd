package sandbox_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestClaimUIDs: each kilnd instance gets a window of host uids no other
// running one has, keeps it across its restarts, holds it while its
// sandboxes' groups are there though it has stopped, and gives it up
// otherwise; when every window is held, the next is refused.
func TestClaimUIDs(t *testing.T) {
	dir := t.TempDir()
	claim := func(instance string, want int) *sandbox.UIDRegistration {
		t.Helper()
		r, err := sandbox.ClaimUIDs(dir, instance, "/state/"+instance)
		if err != nil {
			t.Fatalf("claim %s: %v", instance, err)
		}
		if r.Window != want || r.First() != sandbox.DefaultUIDBase+want*sandbox.UIDWindow*sandbox.IDRange {
			t.Fatalf("claim %s: window %d from %d, want %d", instance, r.Window, r.First(), want)
		}
		return r
	}
	a := claim("a", 0)
	b := claim("b", 1)
	defer b.Close()
	a.Close()
	a = claim("a", 0) // restarted: its own
	a.Close()
	c := claim("c", 0) // a stopped with no sandbox: forgotten
	defer c.Close()
	if _, err := os.Stat(filepath.Join(dir, "a.json")); !os.IsNotExist(err) {
		t.Errorf("a's claim is left: %v", err)
	}
	// d stopped, a sandbox's group in its instance's group.
	groups := t.TempDir()
	if err := os.Mkdir(filepath.Join(groups, "kiln-sandbox"), 0o755); err != nil {
		t.Fatal(err)
	}
	held, _ := json.Marshal(sandbox.UIDClaim{Instance: "d", StateDir: "/state/d", Window: 2, Cgroup: groups})
	if err := os.WriteFile(filepath.Join(dir, "d.json"), held, 0o600); err != nil {
		t.Fatal(err)
	}
	claim("e", 3).Close()
	if err := os.Remove(filepath.Join(groups, "kiln-sandbox")); err != nil {
		t.Fatal(err)
	}
	claim("f", 2).Close() // d's sandbox gone: so is its hold
	var held15 []*sandbox.UIDRegistration
	for i := range 13 {
		held15 = append(held15, claim("g"+strconv.Itoa(i), i+2))
	}
	defer func() {
		for _, r := range held15 {
			r.Close()
		}
	}()
	if r, err := sandbox.ClaimUIDs(dir, "z", "/state/z"); err == nil || !strings.Contains(err.Error(), "no free window") {
		t.Errorf("a sixteenth kilnd: window %v, %v; want refused", r, err)
	}
}

// TestIDRangesWindow: the ranges of a kilnd's sandboxes stay in its
// window.
func TestIDRangesWindow(t *testing.T) {
	first := sandbox.DefaultUIDBase + 3*sandbox.UIDWindow*sandbox.IDRange
	r := sandbox.NewIDRangesFrom(first)
	for i := range sandbox.UIDWindow {
		base, err := r.Claim("sb" + strconv.Itoa(i))
		if err != nil || base != first+i*sandbox.IDRange {
			t.Fatalf("claim %d: %d, %v; want %d", i, base, err, first+i*sandbox.IDRange)
		}
	}
	if base, err := r.Claim("one-more"); err == nil {
		t.Fatalf("past the window: %d", base)
	}
	r.Release(first+5*sandbox.IDRange, "sb5")
	if base, err := r.Claim("again"); err != nil || base != first+5*sandbox.IDRange {
		t.Errorf("after a release: %d, %v", base, err)
	}
}
