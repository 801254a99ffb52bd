package agent

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sandkiln/sandkiln/internal/handoff"
)

// TestUsage: GET /usage answers what the runtime's kernel counts, where
// the agent has a reader of it (in gVisor), and 404 where it has none (a
// namespace sandbox, whose host groups kilnd reads itself); a failed read
// is an error, never figures.
func TestUsage(t *testing.T) {
	want := handoff.GuestUsage{Pids: 7, MemoryBytes: 64 << 20}
	for _, c := range []struct {
		name  string
		usage func() (handoff.GuestUsage, error)
		code  int
	}{
		{"none", nil, http.StatusNotFound},
		{"read", func() (handoff.GuestUsage, error) { return want, nil }, http.StatusOK},
		{"failed", func() (handoff.GuestUsage, error) { return handoff.GuestUsage{}, errors.New("gone") }, http.StatusInternalServerError},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := New(Config{Usage: c.usage})
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, httptest.NewRequest("GET", handoff.UsagePath, nil))
			if rec.Code != c.code {
				t.Fatalf("GET %s: %d %s, want %d", handoff.UsagePath, rec.Code, rec.Body, c.code)
			}
			if c.code != http.StatusOK {
				return
			}
			var got handoff.GuestUsage
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
		})
	}
}
