package stdin

import (
	"bytes"
	"errors"
	"math"
	"math/big"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// FuzzPlan checks the offset decision against big-integer arithmetic and
// its invariants: a hole is never accepted, no byte is written twice, and
// the accepted count grows by exactly the new bytes.
func FuzzPlan(f *testing.F) {
	for _, s := range []struct {
		accepted, offset int64
		n                uint32
	}{
		{0, 0, 0}, {0, 0, 5}, {10, 0, 10}, {10, 5, 10}, {10, 10, 1}, {10, 11, 1}, {10, -1, 1},
		{10, 3, 0}, {math.MaxInt64, math.MaxInt64, 1}, {math.MaxInt64 - 5, math.MaxInt64 - 10, 100},
	} {
		f.Add(s.accepted, s.offset, s.n)
	}
	f.Fuzz(func(t *testing.T, accepted, offset int64, n uint32) {
		if accepted < 0 {
			t.Skip("accepted never goes below zero")
		}
		skip, err := plan(accepted, offset, int(n))

		end := new(big.Int).Add(big.NewInt(offset), big.NewInt(int64(n)))
		var wantErr error
		switch {
		case offset < 0:
			wantErr = ErrOffset
		case offset > accepted:
			wantErr = ErrHole
		case end.Cmp(big.NewInt(math.MaxInt64)) > 0:
			wantErr = ErrOffset
		}
		if wantErr != nil || err != nil {
			if !errors.Is(err, wantErr) || wantErr == nil {
				t.Fatalf("plan(%d, %d, %d) = %d, %v; want error %v", accepted, offset, n, skip, err, wantErr)
			}
			return
		}
		// Never a hole, never a byte twice: the new bytes p[skip:] start
		// exactly at accepted, unless there are none and all of p lies
		// below accepted.
		fresh := int64(n) - int64(skip)
		switch {
		case skip < 0 || fresh < 0:
			t.Fatalf("plan(%d, %d, %d): skip %d outside the write", accepted, offset, n, skip)
		case fresh > 0 && offset+int64(skip) != accepted:
			t.Fatalf("plan(%d, %d, %d): new bytes start at %d, want %d", accepted, offset, n, offset+int64(skip), accepted)
		case fresh == 0 && end.Cmp(big.NewInt(accepted)) > 0:
			t.Fatalf("plan(%d, %d, %d): bytes up to %v left unwritten", accepted, offset, n, end)
		}
		// The accepted count grows by exactly the new bytes, to the end of
		// the write or not at all.
		next := new(big.Int).Add(big.NewInt(accepted), big.NewInt(fresh))
		want := big.NewInt(accepted)
		if end.Cmp(want) > 0 {
			want = end
		}
		if next.Cmp(want) != 0 {
			t.Fatalf("plan(%d, %d, %d): accepted would become %v, want %v", accepted, offset, n, next, want)
		}
	})
}

// modelWrite is what a write must do, by the rules alone: the accepted
// count after it and the error it gets.
func modelWrite(accepted, offset int64, n int, closed bool) (int64, error) {
	switch {
	case n > MaxWrite:
		return accepted, ErrTooLarge
	case offset >= 0 && n > 0 && offset+int64(n) <= accepted:
		return accepted, nil // a retry
	case closed:
		return accepted, ErrClosed
	case offset < 0:
		return accepted, ErrOffset
	case offset > accepted:
		return accepted, ErrHole
	}
	return max(accepted, offset+int64(n)), nil
}

// input is the byte stream the model's client sends; writes are slices of
// it at their offsets.
var input = stream(0, 2<<20)

// checkQueueModel sends random writes, many of them retries, overlaps,
// holes and odd sizes, through a queue into a real pipe, and checks each
// result against modelWrite and that the child reads the model's stream
// exactly once, in order.
func checkQueueModel(t *rapid.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	q := New(w)
	got := startReader(r)
	// Runs when the check fails too: Stop closes the pipe, which ends the reader.
	defer got.wait()
	defer q.Stop()

	var accepted int64
	closed := false
	for range rapid.IntRange(0, 60).Draw(t, "writes") {
		var offset int64
		var n int
		switch rapid.IntRange(0, 7).Draw(t, "kind") {
		case 0, 1, 2: // new bytes
			offset, n = accepted, rapid.IntRange(1, 4096).Draw(t, "n")
		case 3: // a retry of accepted bytes
			offset = rapid.Int64Range(0, accepted).Draw(t, "offset")
			n = rapid.IntRange(0, int(min(accepted-offset, MaxWrite))).Draw(t, "n")
		case 4: // overlapping the end of the accepted bytes
			offset = rapid.Int64Range(max(0, accepted-4096), accepted).Draw(t, "offset")
			n = int(accepted-offset) + rapid.IntRange(1, 4096).Draw(t, "n")
		case 5: // a hole
			offset, n = accepted+rapid.Int64Range(1, 100).Draw(t, "gap"), rapid.IntRange(0, 100).Draw(t, "n")
		case 6: // odd ones
			odd := rapid.SampledFrom([][2]int64{{-1, 1}, {accepted, 0}, {accepted, MaxWrite + 1}}).Draw(t, "odd")
			offset, n = odd[0], int(odd[1])
		case 7:
			if err := q.Close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			closed = true
			continue
		}
		var p []byte
		if offset >= 0 {
			p = input[offset : offset+int64(n)]
		} else {
			p = make([]byte, n)
		}
		wantAccepted, wantErr := modelWrite(accepted, offset, n, closed)
		gotAccepted, err := q.Write(offset, p)
		if errors.Is(err, ErrFull) && wantErr == nil && wantAccepted > accepted {
			// The child is behind: retryable, and nothing changed.
			wantErr, wantAccepted = ErrFull, accepted
		}
		if !errors.Is(err, wantErr) || (wantErr == nil) != (err == nil) || gotAccepted != wantAccepted {
			t.Fatalf("write of %d bytes at %d (accepted %d, closed %v): %d, %v; want %d, %v",
				n, offset, accepted, closed, gotAccepted, err, wantAccepted, wantErr)
		}
		accepted = wantAccepted
	}
	if err := q.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	b := got.wait()
	if !bytes.Equal(b, input[:accepted]) {
		i := 0
		for i < min(len(b), int(accepted)) && b[i] == input[i] {
			i++
		}
		t.Fatalf("child read %d bytes, want %d; first difference at %d", len(b), accepted, i)
	}
	st := waitFor(q, func() bool { return q.eofSent })
	want := State{Accepted: accepted, Delivered: accepted, Closed: true, EOFSent: true}
	if diff := cmp.Diff(want, st, equateErrors); diff != "" {
		t.Fatalf("state (-want +got):\n%s", diff)
	}
}

func TestQueueModel(t *testing.T) { rapid.Check(t, checkQueueModel) }

func FuzzQueueModel(f *testing.F) { f.Fuzz(rapid.MakeFuzz(checkQueueModel)) }
