package process

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// randomFile writes n random bytes to a file and returns its path and hash.
func randomFile(t *testing.T, n int) (string, [32]byte) {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	path := filepath.Join(t.TempDir(), "random")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, sha256.Sum256(b)
}

// TestFlowBlockSlowReaderGetsEverything: 64 MiB of random bytes through a
// 1 MiB ring to a holding reader that reads a MiB, then pauses: it gets
// every byte, in order, with no gap. A watcher beside it that does not
// hold, stalled until the end, does not slow it: the process finishes
// while the watcher has not read a byte, and the watcher is then told
// exactly what it lost.
func TestFlowBlockSlowReaderGetsEverything(t *testing.T) {
	t.Parallel()
	const n = 64 << 20
	path, sum := randomFile(t, n)
	p := startT(t, Spec{Argv: []string{"cat", path}, Flow: FlowBlock})
	stalled, err := p.Attach(ring.Offsets{}, AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	h, err := p.Attach(ring.Offsets{}, AttachOptions{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	got := sha256.New()
	var received, sinceRest int64
	sawHeld := false
	ctx := ctxT(t)
	for {
		e, err := h.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch e.Kind {
		case ring.Gap:
			t.Fatalf("the holding reader lost %d bytes at %d", e.Lost(), e.Offset)
		case ring.Data:
			if e.Stream != ring.Stdout || e.Offset != received {
				t.Fatalf("%v data at %d, expected stdout at %d", e.Stream, e.Offset, received)
			}
			got.Write(e.Data)
			received += int64(len(e.Data))
			if sinceRest += int64(len(e.Data)); sinceRest >= 1<<20 {
				sinceRest = 0
				time.Sleep(5 * time.Millisecond) // the reader's pause: the workload waits
				sawHeld = sawHeld || p.Status().Held
			}
		case ring.Exit:
			if e.Exit != (Exit{Code: 0}) {
				t.Fatalf("exit %v", e.Exit)
			}
		}
	}
	if received != n || [32]byte(got.Sum(nil)) != sum {
		t.Fatalf("received %d bytes of %d, the same bytes: %v", received, n, [32]byte(got.Sum(nil)) == sum)
	}
	if !sawHeld {
		t.Error("the process was never held back by its slow reader")
	}
	waitDone(t, p)
	// The watcher that stalled from the start did not hold the process:
	// it ran to its end without it.
	tr := read(t, stalled, ring.Offsets{})
	if int64(len(tr.data[ring.Stdout]))+tr.lost[ring.Stdout] != n || tr.lost[ring.Stdout] == 0 || tr.exit == nil {
		t.Fatalf("the stalled watcher: %d bytes + %d lost of %d, exit %v", len(tr.data[ring.Stdout]), tr.lost[ring.Stdout], n, tr.exit)
	}
}

// TestFlowBlockHoldsUntilTheReaderComes: output written before the holding
// reader attaches is kept for it, however much more than the ring it is.
func TestFlowBlockHoldsUntilTheReaderComes(t *testing.T) {
	t.Parallel()
	const n = 8 << 20
	p := startT(t, Spec{Argv: []string{"sh", "-c", "head -c " + strconv.Itoa(n) + " /dev/zero; echo done >&2"}, Flow: FlowBlock, RingBytes: 64 << 10})
	// Before anyone reads, the process fills the ring and waits.
	waitHeld(t, p)
	h, err := p.Attach(ring.Offsets{}, AttachOptions{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	tr := read(t, h, ring.Offsets{})
	if tr.lost != (ring.Offsets{}) || int64(len(tr.data[ring.Stdout])) != n || !bytes.Equal(tr.data[ring.Stderr], []byte("done\n")) {
		t.Fatalf("got %d stdout bytes, lost %v, stderr %q", len(tr.data[ring.Stdout]), tr.lost, tr.data[ring.Stderr])
	}
}

// TestFlowBlockReaderGoneRunsOnAfterGrace: a holding reader that goes away
// mid-stream holds the process for the grace period, not longer: then the
// output drops again, and the process runs to its normal end.
func TestFlowBlockReaderGoneRunsOnAfterGrace(t *testing.T) {
	t.Parallel()
	const n = 16 << 20
	p := startT(t, Spec{Argv: []string{"sh", "-c", "head -c " + strconv.Itoa(n) + " /dev/zero; exit 3"}, Flow: FlowBlock,
		FlowGrace: 3 * time.Second, RingBytes: 256 << 10})
	h, err := p.Attach(ring.Offsets{}, AttachOptions{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	for h.Position()[ring.Stdout] < 1<<20 {
		if _, err := h.Next(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()      // the client is gone, killed mid-stream
	waitHeld(t, p) // for the grace period
	ex, err := p.Wait(ctxT(t))
	if err != nil || ex != (Exit{Code: 3}) {
		t.Fatalf("exit %v, %v: want the process's own code 3", ex, err)
	}
	waitDone(t, p)
	late, _ := p.Attach(ring.Offsets{}, AttachOptions{})
	defer late.Close()
	tr := read(t, late, ring.Offsets{})
	if tr.totals[ring.Stdout] != n || tr.lost[ring.Stdout] == 0 {
		t.Fatalf("total %d, lost %d: want all %d written, the oldest dropped", tr.totals[ring.Stdout], tr.lost[ring.Stdout], n)
	}
}

// TestFlowDropRefusesAHold: a process started to drop keeps its promise to
// its workload: no reader may hold it back.
func TestFlowDropRefusesAHold(t *testing.T) {
	t.Parallel()
	p := startT(t, Spec{Argv: []string{"true"}})
	if _, err := p.Attach(ring.Offsets{}, AttachOptions{Hold: true}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("hold on a drop process: %v, want ErrInvalid", err)
	}
}

// TestKillFreesAHeldProcess: shutting a process down does not wait on its
// holding reader.
func TestKillFreesAHeldProcess(t *testing.T) {
	t.Parallel()
	p := startT(t, Spec{Argv: []string{"sh", "-c", "head -c 8388608 /dev/zero; sleep 1000"}, Flow: FlowBlock, RingBytes: 64 << 10})
	h, err := p.Attach(ring.Offsets{}, AttachOptions{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	waitHeld(t, p)
	if err := p.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// waitHeld waits until p's pumps wait for a holding reader; p must not
// finish first.
func waitHeld(t *testing.T, p *Process) {
	t.Helper()
	ctx := ctxT(t)
	for {
		st := p.Status()
		switch {
		case st.Held:
			return
		case st.State == Exited:
			t.Fatal("the process ran to its end without being held")
		}
		select {
		case <-ctx.Done():
			t.Fatal("the process is not held")
		case <-time.After(time.Millisecond):
		}
	}
}
