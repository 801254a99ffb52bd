package sandbox_test

import (
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/api"
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
	// A sandbox made before ids were random keeps its UUID's random end.
	if got := sandbox.DefaultHostname("01a2338f-1247-73e8-9968-fd6c64d81146"); got != "kiln-fd6c64d81146" {
		t.Errorf("got %q", got)
	}
	// Today's ids: the short id kiln shows and takes.
	id := "3f2a9c41d07b" + strings.Repeat("e", 52)
	if got := sandbox.DefaultHostname(id); got != "kiln-"+api.ShortID(id) || got != "kiln-3f2a9c41d07b" {
		t.Errorf("got %q for %s", got, id)
	}
}
