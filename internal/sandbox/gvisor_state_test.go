package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestRunscStateWithoutSocket: a state file whose control socket is gone
// is runsc's to handle (errNoFastPath), its lock given back, not a panic.
func TestRunscStateWithoutSocket(t *testing.T) {
	root := t.TempDir()
	base := filepath.Join(root, "c1_sandbox:s1.")
	state := `{"status":"running","sandbox":{"id":"s1","controlSocketPath":"` + filepath.Join(root, "gone.sock") + `"}}`
	if err := os.WriteFile(base+"state", []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(base+"lock", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s := &guestSandbox{Container: "c1", Root: root}
	for range 2 { // the second finds the lock given back
		if err := s.signalDirect(12); !errors.Is(err, errNoFastPath) {
			t.Fatalf("signal with no control socket: %v, want errNoFastPath", err)
		}
	}
}
