package capture

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// metas are the log's metadata records, decoded, in order.
func metas(t *testing.T, l Log) []Meta {
	t.Helper()
	var out []Meta
	for _, e := range l.Entries {
		if e.Gap == 0 && e.Stream == LogMeta {
			m, err := parseMeta(e.Content, false)
			if err != nil {
				t.Fatalf("metadata %s: %v", e.Content, err)
			}
			out = append(out, m)
		}
	}
	return out
}

// contiguous checks that every record of the log stands at the offset its
// stream had reached, losses included, and returns each stream's bytes
// and where each ended.
func contiguous(t *testing.T, l Log) (out [NumLogStreams][]byte, at [NumLogStreams]int64) {
	t.Helper()
	for _, e := range l.Entries {
		switch {
		case e.Gap != 0:
			t.Fatalf("a gap of %d log bytes", e.Gap)
		case e.Stream == LogMeta:
			for s, n := range e.Lost {
				if n > 0 {
					if e.LostAt[s] != at[s] {
						t.Fatalf("a loss of %d bytes of %v at %d, where the stream stood at %d", n, LogStream(s), e.LostAt[s], at[s])
					}
					at[s] += n
				}
			}
		default:
			if e.Offset != at[e.Stream] {
				t.Fatalf("a record of %v at %d, where the stream stood at %d: %q", e.Stream, e.Offset, at[e.Stream], e.Content)
			}
			out[e.Stream] = append(out[e.Stream], e.Payload()...)
			at[e.Stream] += int64(e.PayloadLen())
		}
	}
	return out, at
}

// TestHoldThenContinue: a held writer told to continue in a new run ends
// the old run's records exactly where the streams stood at the hold (an
// unfinished line's bytes as a P record, the loss before it as a drop
// record), then begins a file of the new run whose begin names the old run
// and those offsets; the bytes pushed meanwhile follow in the new run. The
// log reads as one stream of bytes, at its offsets, across both runs; the
// old run reads complete up to the new one, the new one counts its own
// loss.
func TestHoldThenContinue(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	gate := make(chan struct{})
	// Room for one queued item of 16 bytes: a burst while the writer
	// waits at the gate loses its tail.
	w := begin(t, d, Options{QueueBytes: itemCost + 16, beforeLoop: func() { <-gate }})
	f := newFeeder(w)
	f.write(ring.Stdout, []byte("one\ntw"))
	f.write(ring.Stdout, []byte("lost before the hold\n")) // 21 bytes: no room
	f.write(ring.Stderr, []byte("e1\n"))                   // no room either
	at, held, err := w.Hold()
	if err != nil || !held {
		t.Fatalf("hold: %v, held %v", err, held)
	}
	if want := (ring.Offsets{ring.Stdout: 27, ring.Stderr: 3}); at != want {
		t.Fatalf("held at %v, want %v", at, want)
	}
	if _, _, err := w.Hold(); !errors.Is(err, ErrHeld) {
		t.Errorf("a second hold: %v", err)
	}
	old := w.Run()
	close(gate)
	roomFor(w)
	f.write(ring.Stdout, []byte("o\n"))
	run := newRunID()
	if err := w.Continue(ctxT(t), run); err != nil {
		t.Fatal(err)
	}
	if w.Run() != run {
		t.Errorf("the writer writes run %s, want %s", w.Run(), run)
	}
	roomFor(w)
	f.write(ring.Stdout, []byte("three\n"))
	res := f.end(t)
	if res.Dropped != [NumLogStreams]int64{21, 3} {
		t.Errorf("the writer counts %v lost, want the process's whole loss", res.Dropped)
	}

	l := readLog(t, d)
	out, end := contiguous(t, l)
	if got := string(out[LogStdout]); got != "one\ntwo\nthree\n" {
		t.Errorf("stdout %q", got)
	}
	if end != [NumLogStreams]int64{27 + 8, 3} {
		t.Errorf("the streams end at %v", end)
	}
	var events []string
	for _, m := range metas(t, l) {
		b, _ := json.Marshal(m)
		events = append(events, strings.NewReplacer(old, "OLD", run, "NEW").Replace(string(b)))
	}
	want := []string{
		`{"event":"file","seq":1,"run":"OLD","at":{"stdout":0,"stderr":0}}`,
		`{"event":"begin","run":"OLD"}`,
		`{"event":"drop","run":"OLD","stdout":21}`,
		`{"event":"drop","run":"OLD","stderr":3}`,
		`{"event":"file","seq":2,"offset":` + fmt.Sprint(fileSize(t, d, archiveName(1))) + `,"run":"NEW","at":{"stdout":27,"stderr":3}}`,
		`{"event":"begin","run":"NEW","parent":"OLD","at":{"stdout":27,"stderr":3}}`,
		`{"event":"end","run":"NEW","dropped":{"stdout":0,"stderr":0}}`,
	}
	if diff := cmp.Diff(want, events); diff != "" {
		t.Errorf("metadata (-want +got):\n%s", diff)
	}
	// The unfinished line's bytes end the old run as a P record.
	var shapes []string
	for _, e := range l.Entries {
		if e.Stream == LogStdout {
			shapes = append(shapes, fmt.Sprintf("%d %v %q", e.Offset, e.Partial, e.Content))
		}
	}
	if diff := cmp.Diff([]string{`0 false "one"`, `4 true "tw"`, `27 false "o"`, `29 false "three"`}, shapes); diff != "" {
		t.Errorf("stdout records (-want +got):\n%s", diff)
	}
	runs := []Run{
		{ID: old, State: Lossy, Dropped: [2]int64{21, 3}, Described: [2]int64{21, 3}, Bytes: [2]int64{6, 0}, ContinuedBy: run},
		{ID: run, State: Lossless, Parent: old, Bytes: [2]int64{8, 0}},
	}
	if diff := cmp.Diff(runs, l.Runs, cmpRuns); diff != "" {
		t.Errorf("runs (-want +got):\n%s", diff)
	}
}

// roomFor waits until w's queue holds nothing: the writer took it all.
func roomFor(w *Writer) {
	for _, used := w.Sink().Queued(); used > 0; _, used = w.Sink().Queued() {
		time.Sleep(time.Millisecond)
	}
}

// cmpRuns compares runs without their times.
var cmpRuns = cmp.Options{cmp.AllowUnexported(Run{}), cmp.FilterPath(func(p cmp.Path) bool {
	switch p.Last().String() {
	case ".Began", ".Ended", ".begun", ".ended":
		return true
	}
	return false
}, cmp.Ignore())}

func fileSize(t *testing.T, d *Dir, name string) int64 {
	t.Helper()
	st, err := d.stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size
}

// TestHoldThenRelease: a held writer released goes on in the same run, in
// the same file, as if it had never been held; what was pushed meanwhile
// follows.
func TestHoldThenRelease(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	w := begin(t, d, Options{})
	f := newFeeder(w)
	f.write(ring.Stdout, []byte("one\ntw"))
	if _, held, err := w.Hold(); err != nil || !held {
		t.Fatalf("hold: %v, held %v", err, held)
	}
	f.write(ring.Stdout, []byte("o\n"))
	f.write(ring.Stderr, []byte("e\n"))
	w.Release()
	if err := w.Continue(ctxT(t), newRunID()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("continue after the release: %v", err)
	}
	f.end(t)
	l := readLog(t, d)
	out, _ := contiguous(t, l)
	if string(out[LogStdout]) != "one\ntwo\n" || string(out[LogStderr]) != "e\n" {
		t.Errorf("streams %q", out)
	}
	if len(l.Runs) != 1 || l.Runs[0].State != Lossless || l.Runs[0].ID != w.Run() {
		t.Errorf("runs %+v", l.Runs)
	}
	if _, err := d.stat(archiveName(1)); err == nil {
		t.Error("a second file")
	}
}

// TestHoldRunsOut: a writer nobody tells how to go on waits HoldTimeout,
// then continues in a new run by itself (true whether its sandbox is the
// one that goes on or a copy); a Continue then is refused. A writer whose
// sink is closed is not held.
func TestHoldRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, _ := testDir(t)
		w, err := Begin(d, newRunID(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		old := w.Run()
		f := newFeeder(w)
		f.write(ring.Stdout, []byte("a\n"))
		if _, held, err := w.Hold(); err != nil || !held {
			t.Fatalf("hold: %v, held %v", err, held)
		}
		f.write(ring.Stdout, []byte("b\n"))
		time.Sleep(HoldTimeout - time.Second)
		synctest.Wait()
		if w.Run() != old {
			t.Fatal("the writer went on before its hold ran out")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if err := w.Continue(t.Context(), newRunID()); !errors.Is(err, ErrNotHeld) {
			t.Errorf("continue after the hold ran out: %v", err)
		}
		w.Sink().Close()
		if at, held, err := w.Hold(); held || err != nil || at[ring.Stdout] != 4 {
			t.Errorf("hold of a closed sink: at %v, held %v, %v", at, held, err)
		}
		if err := w.Finish(t.Context()); err != nil {
			t.Fatal(err)
		}
		l := readLog(t, d)
		out, _ := contiguous(t, l)
		if string(out[LogStdout]) != "a\nb\n" || len(l.Runs) != 2 || l.Runs[0].ID != old || l.Runs[0].ContinuedBy != w.Run() ||
			l.Runs[1].Parent != old || l.Runs[1].State != Lossless {
			t.Errorf("stdout %q, runs %+v", out[LogStdout], l.Runs)
		}
	})
}

// TestContinuationClassified: a begin that continues a run ends it only
// where its records end; one that says otherwise, or continues a run that
// ended, is corrupted; a parent whose records are gone is not checked.
func TestContinuationClassified(t *testing.T) {
	t.Parallel()
	const a, b = "0190b0a4-7d2e-7a91-8c55-0e6f2ab41d90", "0190b0a4-7d2e-7a91-8c55-0e6f2ab41d91"
	header := func(seq int, run string, out int) string {
		return fmt.Sprintf(`{"event":"file","seq":%d,"run":"%s","at":{"stdout":%d,"stderr":0}}`, seq, run, out)
	}
	cont := func(out int) string {
		return fmt.Sprintf(`{"event":"begin","run":"%s","parent":"%s","at":{"stdout":%d,"stderr":0}}`, b, a, out)
	}
	end := func(id string) string { return `{"event":"end","run":"` + id + `","dropped":{"stdout":0,"stderr":0}}` }
	cases := []struct {
		name  string
		files [][]string // each file's records after its header; "kiln F " is added to JSON
		heads []string
		want  []string
	}{
		{"continued where it stood", [][]string{{`{"event":"begin","run":"` + a + `"}`, "stdout F hello"}, {cont(6), "stdout F on", end(b)}},
			[]string{header(1, a, 0), header(2, b, 6)}, []string{"lossless", "lossless"}},
		{"continued elsewhere", [][]string{{`{"event":"begin","run":"` + a + `"}`, "stdout F hello"}, {cont(9), "stdout F on", end(b)}},
			[]string{header(1, a, 0), header(2, b, 9)}, []string{"interrupted", "corrupted"}},
		{"continued after its end", [][]string{{`{"event":"begin","run":"` + a + `"}`, "stdout F hello", end(a)}, {cont(6), end(b)}},
			[]string{header(1, a, 0), header(2, b, 6)}, []string{"lossless", "corrupted"}},
		{"parent gone", [][]string{{cont(6), "stdout F on", end(b)}},
			[]string{header(2, b, 6)}, []string{"lossless"}},
		{"begin with offsets and no parent", [][]string{{`{"event":"begin","run":"` + b + `","at":{"stdout":6,"stderr":0}}`, end(b)}},
			[]string{header(1, b, 0)}, []string{"corrupted"}},
		{"its own parent", [][]string{{`{"event":"begin","run":"` + b + `","parent":"` + b + `","at":{"stdout":6,"stderr":0}}`, end(b)}},
			[]string{header(1, b, 0)}, []string{"corrupted"}},
		{"a parent on an end", [][]string{{`{"event":"begin","run":"` + b + `"}`, `{"event":"end","run":"` + b + `","parent":"` + a + `","dropped":{"stdout":0,"stderr":0}}`}},
			[]string{header(1, b, 0)}, []string{"corrupted"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, path := testDir(t)
			for i, recs := range tc.files {
				lines := []string{"kiln F " + tc.heads[i]}
				for _, r := range recs {
					if strings.HasPrefix(r, "{") {
						r = "kiln F " + r
					}
					lines = append(lines, r)
				}
				var b []byte
				for _, l := range lines {
					b = append(b, "2026-11-29T10:00:01.000000000Z "+l+"\n"...)
				}
				name := ActiveName
				if i < len(tc.files)-1 {
					name = archiveName(int64(i + 1))
				}
				if err := os.WriteFile(filepath.Join(path, name), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(tc.want, states(readLog(t, d).Runs)); diff != "" {
				t.Errorf("states (-want +got):\n%s", diff)
			}
		})
	}
}
