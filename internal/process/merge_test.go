package process

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/sandkiln/sandkiln/internal/ring"
)

type span struct {
	stream ring.Stream
	offset int64
	seq    uint64
	data   []byte
}

// spans reads a whole attachment, each Data event as a span, with next.
func spans(t *testing.T, next func() (Event, error)) []span {
	t.Helper()
	var out []span
	for {
		e, err := next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.Kind == ring.Data {
			out = append(out, span{e.Stream, e.Offset, e.Seq, bytes.Clone(e.Data)})
		}
	}
}

// TestNextMergedJoinsOnlyWhatContinues: a reader that is behind gets the
// chunks of one stream that follow each other joined, up to the bound,
// with the first's offset and seq; the bytes, their order and the streams'
// interleaving are those Next gives.
func TestNextMergedJoinsOnlyWhatContinues(t *testing.T) {
	t.Parallel()
	// Many small writes: runs of stdout, a stderr line between runs.
	p := startT(t, sh(`for r in 1 2 3; do for i in $(seq 100); do printf '%0500d' $i; done; echo "run $r" >&2; done`))
	waitDone(t, p)
	plainA, err := p.Attach(ring.Offsets{}, AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer plainA.Close()
	plain := spans(t, func() (Event, error) { return plainA.Next(t.Context()) })

	const max = 16 << 10
	mergedA, err := p.Attach(ring.Offsets{}, AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer mergedA.Close()
	merged := spans(t, func() (Event, error) { return mergedA.NextMerged(t.Context(), max) })

	if len(merged) >= len(plain) {
		t.Fatalf("%d events merged into %d: nothing joined", len(plain), len(merged))
	}
	// Each merged span is a run of plain spans that continue each other.
	i := 0
	for _, m := range merged {
		var joined []byte
		first := i
		for i < len(plain) && len(joined) < len(m.data) {
			q := plain[i]
			if q.stream != m.stream || q.offset != m.offset+int64(len(joined)) || q.seq != m.seq+uint64(len(joined)) {
				t.Fatalf("merged span %+v joins plain span %d %+v, which does not continue it", m.stream, i, q)
			}
			joined = append(joined, q.data...)
			i++
		}
		if !bytes.Equal(joined, m.data) || plain[first].offset != m.offset || plain[first].seq != m.seq {
			t.Fatalf("merged span at %d/%d differs from plain spans %d..%d", m.offset, m.seq, first, i)
		}
		// Only a chunk that is larger by itself passes the bound.
		if len(m.data) > max && i-first > 1 {
			t.Errorf("%d chunks joined into %d bytes, over the bound %d", i-first, len(m.data), max)
		}
	}
	if i != len(plain) {
		t.Fatalf("merged spans cover %d of %d plain ones", i, len(plain))
	}
	// The streams take turns where they did: merging never crosses one.
	if a, b := turns(plain), turns(merged); a != b || a < 1 {
		t.Errorf("the streams take turns %d times merged, %d plain", b, a)
	}
}

func turns(ss []span) int {
	n := 0
	for j := 1; j < len(ss); j++ {
		if ss[j].stream != ss[j-1].stream {
			n++
		}
	}
	return n
}
