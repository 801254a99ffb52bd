package claims_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/claims"
)

// TestClaims: a claim written is listed and held until its file is
// closed; it stays, to be read at the next start, until removed; files
// that are not claims are left out.
func TestClaims(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress")
	d, err := claims.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := d.Write("a", map[string]string{"range": "10.200.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "notes.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	list := func() map[string]bool {
		t.Helper()
		all, err := d.List()
		if err != nil {
			t.Fatal(err)
		}
		held := map[string]bool{}
		for _, c := range all {
			var v map[string]string
			if err := json.Unmarshal(c.Data, &v); err != nil || v["range"] != "10.200.0.0/16" {
				t.Errorf("claim %s: %q, %v", c.Name, c.Data, err)
			}
			held[c.Name] = c.Held()
		}
		return held
	}
	if diff := cmp.Diff(map[string]bool{"a": true}, list()); diff != "" {
		t.Errorf("while its kilnd runs (-want +got):\n%s", diff)
	}
	f.Close()
	if diff := cmp.Diff(map[string]bool{"a": false}, list()); diff != "" {
		t.Errorf("after its kilnd stopped (-want +got):\n%s", diff)
	}
	all, _ := d.List()
	d.Remove(all[0])
	if diff := cmp.Diff(map[string]bool{}, list()); diff != "" {
		t.Errorf("after its removal (-want +got):\n%s", diff)
	}

	// One kilnd at a time: the directory's lock is held until Close.
	lock, err := os.Open(filepath.Join(path, ".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		t.Error("the claims are not locked while open")
	}
	d.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("the claims are locked after Close: %v", err)
	}
}
