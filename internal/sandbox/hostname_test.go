package sandbox_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/internal/sandbox"
)

// TestDefaultHostname: sandboxes made together get hostnames of their
// own (they were "kiln-" and the UUIDv7's time prefix, the same for every
// sandbox of one millisecond), twelve hex digits as Docker's.
func TestDefaultHostname(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		h := sandbox.DefaultHostname(uuid.Must(uuid.NewV7()).String())
		if len(h) != len("kiln-")+12 || seen[h] {
			t.Fatalf("hostname %q (repeated: %v)", h, seen[h])
		}
		seen[h] = true
	}
	if got := sandbox.DefaultHostname("01a2338f-1247-73e8-9968-fd6c64d81146"); got != "kiln-fd6c64d81146" {
		t.Errorf("got %q", got)
	}
}
