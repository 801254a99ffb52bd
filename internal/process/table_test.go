package process

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// runDrained starts a process in tb and waits until it has drained.
func runDrained(t *testing.T, tb *Table, spec Spec) string {
	t.Helper()
	id, err := tb.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tb.Process(id)
	if errors.Is(err, ErrFinished) {
		return id // already a tombstone, so drained
	}
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	return id
}

// Seed validation row: tombstone before and after eviction — terminal
// semantics retained, then not found.
func TestTombstoneBeforeAndAfterEviction(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		tb := NewTable(TableConfig{Grace: time.Second, TombstoneTTL: time.Minute, MaxTombstones: 2})
		defer tb.Shutdown(context.Background())
		id := runDrained(t, tb, sh("printf hello; printf oops >&2; exit 7"))

		// Within the grace period the ring is still there: a full replay.
		a, err := tb.Attach(id, ring.Offsets{}, AttachOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tr := read(t, a, ring.Offsets{})
		if string(tr.data[ring.Stdout]) != "hello" || tr.exit.Code != 7 {
			t.Fatalf("replay in grace: %q exit %v", tr.data[ring.Stdout], tr.exit)
		}
		time.Sleep(2 * time.Second) // the attachment is still open: no tombstone
		synctest.Wait()
		if live, tombs := tb.Counts(); live != 1 || tombs != 0 {
			t.Fatalf("with a reader attached: %d live, %d tombstones", live, tombs)
		}
		a.Close() // restarts the grace period
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		if live, tombs := tb.Counts(); live != 0 || tombs != 1 {
			t.Fatalf("after grace: %d live, %d tombstones", live, tombs)
		}

		// A tombstone: exact loss per stream, then the exit.
		a, err = tb.Attach(id, ring.Offsets{ring.Stdout: 2}, AttachOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tr = read(t, a, ring.Offsets{ring.Stdout: 2})
		a.Close()
		if tr.lost != [ring.NumStreams]int64{3, 4, 0} || tr.totals != [ring.NumStreams]int64{5, 4, 0} {
			t.Fatalf("tombstone lost %v totals %v", tr.lost, tr.totals)
		}
		if tr.exit == nil || tr.exit.Code != 7 {
			t.Fatalf("tombstone exit %v", tr.exit)
		}
		if ex, err := tb.Wait(context.Background(), id); err != nil || ex.Code != 7 {
			t.Fatalf("wait on tombstone: %v %v", ex, err)
		}
		if st, err := tb.Status(id); err != nil || st.State != Exited || st.Totals[ring.Stdout] != 5 {
			t.Fatalf("status of tombstone: %+v %v", st, err)
		}
		if _, err := tb.Write(id, 0, []byte("x")); !errors.Is(err, ErrFinished) {
			t.Fatalf("write to tombstone: %v", err)
		}
		if _, err := tb.Attach(id, ring.Offsets{ring.Stdout: 6}, AttachOptions{}); !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("attach past the total: %v", err)
		}

		// After the TTL: not found.
		time.Sleep(time.Minute + time.Second)
		if _, err := tb.Attach(id, ring.Offsets{}, AttachOptions{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("attach after eviction: %v", err)
		}
		if _, err := tb.Wait(context.Background(), id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("wait after eviction: %v", err)
		}
	})
}

func TestTombstonesBoundedByCount(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		tb := NewTable(TableConfig{Grace: time.Second, MaxTombstones: 2})
		defer tb.Shutdown(context.Background())
		var ids []string
		for range 3 {
			ids = append(ids, runDrained(t, tb, Spec{Argv: []string{"true"}}))
			time.Sleep(2 * time.Second)
			synctest.Wait()
		}
		if _, err := tb.Status(ids[0]); !errors.Is(err, ErrNotFound) {
			t.Fatalf("oldest tombstone: %v, want evicted", err)
		}
		for _, id := range ids[1:] {
			if _, err := tb.Status(id); err != nil {
				t.Fatalf("newer tombstone %s: %v", id, err)
			}
		}
	})
}

func TestBadIDs(t *testing.T) {
	t.Parallel()
	tb := NewTable(TableConfig{})
	defer tb.Shutdown(context.Background())
	for _, id := range []string{"", "../../etc/passwd", "0192e4a0-0000-7000-8000-00000000000g", "{0192e4a0-0000-7000-8000-000000000000}"} {
		if _, err := tb.Status(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("id %q: %v, want not found", id, err)
		}
	}
	if _, err := tb.Status("0192e4a0-0000-7000-8000-000000000000"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
}

// Seed validation row: 2,000 completed processes do not grow the number of
// open file descriptors.
func TestTwoThousandProcessesFlatFDs(t *testing.T) {
	// Not in parallel: it counts the test process's descriptors, which
	// every other test opens too.
	if testing.Short() {
		t.Skip("spawns 2,000 processes")
	}
	tb := NewTable(TableConfig{Grace: time.Nanosecond, MaxTombstones: 100})
	defer tb.Shutdown(context.Background())
	runDrained(t, tb, Spec{Argv: []string{"true"}, Stdin: StdinPipe}) // warm up the poller
	before := openFDs(t)
	for range 2000 {
		runDrained(t, tb, Spec{Argv: []string{"true"}, Stdin: StdinPipe})
	}
	if after := openFDs(t); after > before {
		t.Fatalf("open descriptors grew from %d to %d over 2,000 processes", before, after)
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestShutdownKillsLiveProcesses(t *testing.T) {
	t.Parallel()
	tb := NewTable(TableConfig{})
	id, err := tb.Start(Spec{Argv: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Shutdown(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if ex, err := tb.Wait(ctxT(t), id); err != nil || ex.Signal == 0 {
		t.Fatalf("after shutdown: %v %v", ex, err)
	}
	if _, err := tb.Start(Spec{Argv: []string{"true"}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("start after shutdown: %v", err)
	}
}

// TestResolveByPrefix: a process is named by any prefix of its id of four
// characters or more that no other process's id begins with; a prefix
// two share is refused naming both, and what names nothing, or is too
// short to, finds nothing.
func TestResolveByPrefix(t *testing.T) {
	t.Parallel()
	tb := NewTable(TableConfig{})
	defer tb.Shutdown(context.Background())
	id := runDrained(t, tb, Spec{Argv: []string{"true"}})
	if got, err := tb.Resolve(id[:4]); err != nil || got != id {
		t.Errorf("Resolve(%q) = %q, %v; want %s", id[:4], got, err, id)
	}
	if st, err := tb.Status(mustResolve(t, tb, id[:8])); err != nil || st.ID != id {
		t.Errorf("status by the short id: %+v %v", st, err)
	}
	// Two forged tombstones whose ids share "abcd".
	tb.mu.Lock()
	for _, s := range []string{"abcd0000-0000-4000-8000-000000000001", "abcd0000-0000-4000-8000-000000000002"} {
		u := uuid.MustParse(s)
		tb.tombs[u] = &tombstone{id: u}
	}
	tb.mu.Unlock()
	_, err := tb.Resolve("abcd")
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "abcd0000-0000-4000-8000-000000000001") || !strings.Contains(err.Error(), "abcd0000-0000-4000-8000-000000000002") {
		t.Errorf("a prefix two share: %v", err)
	}
	if got, err := tb.Resolve("abcd0000-0000-4000-8000-00000000000"); err == nil {
		t.Errorf("35 of 36 characters two share: %q", got)
	}
	if got, err := tb.Resolve("abcd0000-0000-4000-8000-0000000000"); err == nil {
		t.Errorf("a longer prefix two share: %q", got)
	}
	for _, ref := range []string{id[:3], "ffff-none"} {
		if got, err := tb.Resolve(ref); err != nil || got != ref {
			t.Errorf("Resolve(%q) = %q, %v; want it back as it is", ref, got, err)
		}
		if _, err := tb.Status(ref); !errors.Is(err, ErrNotFound) {
			t.Errorf("status of %q: %v, want not found", ref, err)
		}
	}
}

func mustResolve(t *testing.T, tb *Table, ref string) string {
	t.Helper()
	id, err := tb.Resolve(ref)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
