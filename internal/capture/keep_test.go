package capture

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestKeep: output kept elsewhere becomes a run of its own: each piece at
// its offset, overlaps written once, every byte not kept before, between
// and after the pieces counted lost where it was, and the end with the
// exact loss. What it kept carries the time given.
func TestKeep(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	run := newRunID()
	at := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	res, err := Keep(d, run, at, []Piece{
		{Stream: LogStdout, Offset: 10, Data: []byte("abc\nde")},
		{Stream: LogStderr, Offset: 0, Data: []byte("err\n")},
		{Stream: LogStdout, Offset: 14, Data: []byte("def\n")},
	}, Positions{Stdout: 25, Stderr: 4})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Ended || res.Dropped != [NumLogStreams]int64{17, 0} {
		t.Errorf("result %+v, want ended with 17 bytes of stdout lost", res)
	}
	l := readLog(t, d)
	out, end := contiguous(t, l)
	if string(out[LogStdout]) != "abc\ndef\n" || string(out[LogStderr]) != "err\n" || end != [NumLogStreams]int64{25, 4} {
		t.Errorf("streams %q, ending at %v", out, end)
	}
	var recs []string
	for _, e := range l.Entries {
		kept := e.Stream != LogMeta || e.Lost != [NumLogStreams]int64{} // not the header, begin or end
		if kept && !e.Time.Equal(at) {
			t.Errorf("a record at %v: %q", e.Time, e.Content)
		}
		switch {
		case e.Stream == LogMeta && e.Lost != [NumLogStreams]int64{}:
			recs = append(recs, fmt.Sprintf("lost %d at %d", e.Lost[LogStdout], e.LostAt[LogStdout]))
		case e.Stream != LogMeta:
			recs = append(recs, fmt.Sprintf("%v %d %q", e.Stream, e.Offset, e.Payload()))
		}
	}
	want := []string{"lost 10 at 0", `stdout 10 "abc\n"`, `stderr 0 "err\n"`, `stdout 14 "def\n"`, "lost 7 at 18"}
	if diff := cmp.Diff(want, recs); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	if len(l.Runs) != 1 || l.Runs[0].ID != run || l.Runs[0].State != Lossy || l.Runs[0].Described != l.Runs[0].Dropped {
		t.Errorf("runs %+v", l.Runs)
	}
	if _, err := Keep(d, newRunID(), at, nil, Positions{}); err != nil {
		t.Errorf("a second run in the same directory: %v", err)
	}
}
