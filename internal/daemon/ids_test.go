package daemon

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// TestShortIDsWithAThousandSandboxes: among 1,000 sandboxes (and one
// made before ids were random, a UUIDv7), each is found by its short id
// and by its name; a prefix of fewer than 4 characters finds none; one
// that two share is refused naming both; and a list, a page at a time, is
// in the order they were made, each once, whatever their ids' order.
func TestShortIDsWithAThousandSandboxes(t *testing.T) {
	d := &Daemon{sandboxes: map[string]*entry{}, names: map[string]string{}, events: newEvents()}
	began := time.Now()
	var made []record
	old := record{ID: uuid.Must(uuid.NewV7()).String(), State: StateStopped, CreatedAt: began.Add(-time.Hour)}
	made = append(made, old)
	for i := range 1000 {
		rec := record{ID: newID(), State: StateStopped, CreatedAt: began.Add(time.Duration(i) * time.Millisecond)}
		if i%10 == 0 {
			rec.Name = "sb-" + strings.Repeat("x", i%7) + api.ShortID(rec.ID)[:6]
			d.names[rec.Name] = rec.ID
		}
		made = append(made, rec)
	}
	for _, rec := range made {
		d.add(&entry{rec: rec})
	}

	for _, rec := range made {
		e, err := d.lookup(api.ShortID(rec.ID))
		if err != nil || e.rec.ID != rec.ID {
			t.Fatalf("short id %s: %v", api.ShortID(rec.ID), err)
		}
		if rec.Name != "" {
			if e, err := d.lookup(rec.Name); err != nil || e.rec.ID != rec.ID {
				t.Fatalf("name %s: %v", rec.Name, err)
			}
		}
	}
	if api.ShortID(old.ID) != old.ID {
		t.Errorf("a UUID's short id %q, want it whole", api.ShortID(old.ID))
	}

	// Two ids that begin alike: their common prefix is refused, naming both.
	a, b := made[1].ID, made[2].ID
	common := 0
	for common < len(a) && a[common] == b[common] {
		common++
	}
	twin := record{ID: a[:6] + b[6:], State: StateStopped, CreatedAt: began.Add(time.Hour), Name: "twin"}
	d.add(&entry{rec: twin})
	_, err := d.lookup(a[:5])
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), api.ShortID(a)) || !strings.Contains(err.Error(), api.ShortID(twin.ID)+" twin") {
		t.Errorf("a prefix two share: %v", err)
	}
	if _, err := d.lookup(a[:3]); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a prefix of 3: %v, want not found", err)
	}

	// Pages of 64: each sandbox once, in the order they were made.
	made = append(made, twin)
	var seen []string
	next := ""
	for {
		page, cursor, err := d.Select(Selection{Limit: 64, After: next})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range page {
			seen = append(seen, s.ID)
		}
		if cursor == "" {
			break
		}
		next = cursor
	}
	if len(seen) != len(made) {
		t.Fatalf("pages held %d sandboxes, want %d", len(seen), len(made))
	}
	for i, rec := range made {
		if seen[i] != rec.ID {
			t.Fatalf("sandbox %d of the pages is %s, want %s (made %v)", i, seen[i], rec.ID, rec.CreatedAt)
		}
	}
	if _, _, err := d.Select(Selection{After: "nonsense"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a cursor kilnd did not give: %v", err)
	}
}
