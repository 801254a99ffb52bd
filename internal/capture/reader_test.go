package capture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// numbered writes lines "<prefix><n>\n" padded to size bytes, n from
// first to last inclusive.
func numbered(f *feeder, s ring.Stream, prefix string, first, last, size int) {
	for i := first; i <= last; i++ {
		b := fmt.Appendf(nil, "%s%d ", prefix, i)
		b = append(b, bytes.Repeat([]byte{'.'}, max(0, size-len(b)-1))...)
		f.write(s, append(b, '\n'))
	}
}

// lineNumbers parses the numbers of numbered lines of a payload.
func lineNumbers(t *testing.T, payload []byte, prefix string) []int {
	t.Helper()
	var ns []int
	for line := range strings.Lines(string(payload)) {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			t.Fatalf("line %q lacks prefix %q", line, prefix)
		}
		num, _, _ := strings.Cut(rest, " ")
		n, err := strconv.Atoi(strings.TrimSpace(num))
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		ns = append(ns, n)
	}
	return ns
}

func seq(first, last int) []int {
	var s []int
	for i := first; i <= last; i++ {
		s = append(s, i)
	}
	return s
}

// logBytes is how many log bytes the writer has written in all: the
// active file's starting offset plus its size.
func logBytes(t *testing.T, d *Dir) int64 {
	t.Helper()
	f, err := d.open(ActiveName, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, size, err := readHeader(f)
	if err != nil {
		t.Fatal(err)
	}
	return h.Offset + size
}

func dirSize(t *testing.T, path string) (total int64, files int) {
	t.Helper()
	ents, err := os.ReadDir(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == ActiveName || strings.HasPrefix(e.Name(), ActiveName+".") {
			total += fi.Size()
			files++
		}
	}
	return total, files
}

func TestRotationBoundsDiskAndKeepsOrder(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	opt := Options{MaxSize: 4096, MaxFiles: 3}
	w := begin(t, d, opt)
	f := newFeeder(w)
	f.paced = true
	numbered(f, ring.Stdout, "n", 1, 2000, 100)
	f.end(t)
	total, files := dirSize(t, path)
	if files != 3 || total > opt.MaxSize*int64(opt.MaxFiles) {
		t.Errorf("%d files, %d bytes; want 3 files within %d bytes", files, total, opt.MaxSize*int64(opt.MaxFiles))
	}
	l := readLog(t, d)
	ns := lineNumbers(t, payload(l, LogStdout), "n")
	if len(ns) == 0 || ns[len(ns)-1] != 2000 || !slices.Equal(ns, seq(ns[0], 2000)) {
		t.Fatalf("lines %v…: want a contiguous tail ending at 2000", ns[:min(5, len(ns))])
	}
	if l.Stats.Before+l.Stats.Bytes != logBytes(t, d) {
		t.Errorf("before %d + read %d != written %d", l.Stats.Before, l.Stats.Bytes, logBytes(t, d))
	}
	// The run's begin was rotated away; its end survives.
	if len(l.Runs) != 1 || l.Runs[0].State != RetentionLoss || l.Runs[0].ID != w.Run() {
		t.Fatalf("runs %+v, want one retention-loss run", l.Runs)
	}
}

// TestRunsStayDistinctWhenRotationRemovesAnOldBegin: Seed, "Multiple runs
// and rotation removes an old begin: Runs remain distinct; reader reports
// retention loss rather than a false crash."
func TestRunsStayDistinctWhenRotationRemovesAnOldBegin(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	opt := Options{MaxSize: 4096, MaxFiles: 3}
	var ids []string
	for r := range 4 {
		w := begin(t, d, opt)
		f := newFeeder(w)
		f.paced = true
		numbered(f, ring.Stdout, fmt.Sprintf("r%d-", r), 1, 30, 100)
		f.end(t)
		ids = append(ids, w.Run())
	}
	l := readLog(t, d)
	var got []string
	for _, r := range l.Runs {
		got = append(got, r.ID[:8]+" "+r.State.String())
	}
	// 4 runs of ~4.2 KB, each in two files of its own, and 3 files kept:
	// the first two runs are gone, the third lost its begin.
	want := []string{ids[2][:8] + " retention-loss", ids[3][:8] + " lossless"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("runs (-want +got):\n%s", diff)
	}
}

// TestCutAtEveryOffset cuts a valid log at every byte: the reader never
// panics, returns a prefix of the whole log's records (nothing twice), and
// never reports the cut run as complete.
func TestCutAtEveryOffset(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	gate := make(chan struct{})
	// Room for the first three chunks, not the fourth.
	w := begin(t, d, Options{QueueBytes: 3*itemCost + 30, beforeLoop: func() { <-gate }})
	f := newFeeder(w)
	f.write(ring.Stdout, []byte("one\ntwo "))
	f.write(ring.Stderr, []byte("err\n"))
	f.write(ring.Stdout, []byte("three\ntail"))
	f.write(ring.Stdout, []byte("dropped: the queue is full\n"))
	close(gate)
	f.end(t)
	full, err := os.ReadFile(filepath.Join(path, ActiveName))
	if err != nil {
		t.Fatal(err)
	}
	whole := readLog(t, d)
	if len(whole.Runs) != 1 || whole.Runs[0].State != Lossy {
		t.Fatalf("the whole log's runs: %+v", whole.Runs)
	}
	cut, cutPath := testDir(t)
	for n := range len(full) {
		if err := os.WriteFile(filepath.Join(cutPath, ActiveName), full[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		l := readLog(t, cut)
		if len(l.Entries) > len(whole.Entries) {
			t.Fatalf("cut at %d: %d records, the whole log has %d", n, len(l.Entries), len(whole.Entries))
		}
		for i, e := range l.Entries {
			if diff := cmp.Diff(whole.Entries[i], e); diff != "" {
				t.Fatalf("cut at %d: record %d differs (-whole +cut):\n%s", n, i, diff)
			}
		}
		for _, r := range l.Runs {
			if r.State == Lossless || r.State == Lossy {
				t.Fatalf("cut at %d of %d: run reads as %v", n, len(full), r.State)
			}
		}
	}
}

// beginAndBeKilled runs the helper (this binary) that begins a run in a
// fresh directory, writes output if any, and kills itself; it returns the
// log it left.
func beginAndBeKilled(t *testing.T, output string) Log {
	t.Helper()
	_, path := testDir(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	if output != "" {
		cmd.Env = append(cmd.Env, helperOutputEnv+"="+output)
	}
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper: %v, want killed by SIGKILL", err)
	}
	d, err := OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	return readLog(t, d)
}

// TestBeginSyncedThenKilledBeforeStart: Seed, "Begin fsynced, VM killed
// before Start: begin exists without end; report interruption, not
// success." A process that synced begin and was killed before it could
// start anything leaves an interrupted run.
func TestBeginSyncedThenKilledBeforeStart(t *testing.T) {
	t.Parallel()
	l := beginAndBeKilled(t, "")
	if len(l.Runs) != 1 || l.Runs[0].State != Interrupted {
		t.Fatalf("runs %+v, want one interrupted", l.Runs)
	}
}

// TestKilledDuringCapture: Seed, "Writer failure or VM SIGKILL during
// capture: No end; reader reports incomplete capture." A writer killed
// mid-run leaves what it wrote,
// and the run reads as interrupted, never as complete.
func TestKilledDuringCapture(t *testing.T) {
	t.Parallel()
	l := beginAndBeKilled(t, "written before the kill\n")
	if got := string(payload(l, LogStdout)); got != "written before the kill\n" {
		t.Errorf("stdout %q", got)
	}
	if len(l.Runs) != 1 || l.Runs[0].State != Interrupted {
		t.Fatalf("runs %+v, want one interrupted", l.Runs)
	}
}

// helperEnv makes the test binary begin a run in the directory it names and
// kill itself; with helperOutputEnv, once that output is in the log.
const (
	helperEnv       = "SANDKILN_CAPTURE_BEGIN_AND_DIE"
	helperOutputEnv = "SANDKILN_CAPTURE_OUTPUT"
)

func beginAndDie(path string) {
	d, err := OpenDir(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out := os.Getenv(helperOutputEnv)
	w, err := Begin(d, newRunID(), Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if out != "" {
		newFeeder(w).write(ring.Stdout, []byte(out))
		// Die once the writer has written it: wait for it in the file.
		deadline := time.Now().Add(testTimeout)
		for {
			b, _ := os.ReadFile(filepath.Join(path, ActiveName))
			if bytes.Contains(b, []byte(out)) {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintln(os.Stderr, "the output never reached the log")
				os.Exit(3)
			}
			time.Sleep(time.Millisecond)
		}
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func TestTornTailOfAKilledWriterIsSetAside(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	w := begin(t, d, Options{})
	f := newFeeder(w)
	f.write(ring.Stdout, []byte("first run\n"))
	f.end(t)
	// A writer killed mid-record: a run begun, then a torn line.
	first := w.Run()
	w2 := begin(t, d, Options{})
	w2.Stop()
	active := filepath.Join(path, ActiveName)
	fh, err := os.OpenFile(active, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fh.WriteString("2026-01-01T00:00:0")
	fh.Close()
	w3 := begin(t, d, Options{})
	f3 := newFeeder(w3)
	f3.write(ring.Stdout, []byte("third run\n"))
	f3.end(t)
	l := readLog(t, d)
	want := []string{first + " lossless", w2.Run() + " interrupted", w3.Run() + " lossless"}
	var got []string
	for _, r := range l.Runs {
		got = append(got, r.ID+" "+r.State.String())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("runs (-want +got):\n%s", diff)
	}
	if l.Stats.Corrupt != 0 || l.Stats.Torn != 1 {
		t.Errorf("stats %+v, want one torn line and nothing corrupt", l.Stats)
	}
	// The torn line stays at the end of the second run's file, an archive
	// now, untouched: every run has files of its own.
	if b, err := os.ReadFile(filepath.Join(path, archiveName(2))); err != nil || !bytes.HasSuffix(b, []byte("2026-01-01T00:00:0")) {
		t.Errorf("archive 2 does not end with the torn line: %v", err)
	}
	if got := string(payload(l, LogStdout)); got != "first run\nthird run\n" {
		t.Errorf("stdout %q", got)
	}
}

func TestInterruptedRotationIsCleanedUp(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	w := begin(t, d, Options{})
	f := newFeeder(w)
	f.write(ring.Stdout, []byte("before\n"))
	f.end(t)
	// A rotation cut short after linking the active file as archive 1 and
	// writing the next file under its temporary name.
	if err := os.Link(filepath.Join(path, ActiveName), filepath.Join(path, archiveName(1))); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, tempName), []byte("half a header"), 0o600); err != nil {
		t.Fatal(err)
	}
	w2 := begin(t, d, Options{})
	f2 := newFeeder(w2)
	f2.write(ring.Stdout, []byte("after\n"))
	f2.end(t)
	if _, err := os.Stat(filepath.Join(path, tempName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file left: %v", err)
	}
	l := readLog(t, d)
	if got := string(payload(l, LogStdout)); got != "before\nafter\n" {
		t.Errorf("stdout %q: each record once, in order", got)
	}
	if s := states(l.Runs); !slices.Equal(s, []string{"lossless", "lossless"}) {
		t.Errorf("runs %v", s)
	}
	if l.Stats.Before != 0 || l.Stats.Missed != 0 {
		t.Errorf("stats %+v", l.Stats)
	}
}

// TestClassification: Seed, the table of "Run records and reader
// behavior" (begin + end with zero dropped: lossless; non-zero: lossy;
// begin without end: interrupted; end without begin: retention loss; no
// begin: unknown), and "Duplicate begin, duplicate end, end before begin,
// or invalid metadata JSON is reported as corrupted/unknown, never as
// successful capture."
func TestClassification(t *testing.T) {
	t.Parallel()
	const a, b = "0190b0a4-7d2e-7a91-8c55-0e6f2ab41d90", "0190b0a4-7d2e-7a91-8c55-0e6f2ab41d91"
	begin := func(id string) string { return `{"run":"` + id + `","event":"begin"}` }
	end := func(id string, out, errs int) string {
		return fmt.Sprintf(`{"run":"%s","event":"end","dropped":{"stdout":%d,"stderr":%d}}`, id, out, errs)
	}
	drop := func(id string, out int) string {
		return fmt.Sprintf(`{"run":"%s","event":"drop","stdout":%d}`, id, out)
	}
	const data = "stdout F hello"
	cases := []struct {
		name  string
		lines []string // records without timestamps; "kiln F " is added to JSON
		want  []string
	}{
		{"lossless", []string{begin(a), data, end(a, 0, 0)}, []string{"lossless"}},
		{"lossy", []string{begin(a), drop(a, 5), data, end(a, 5, 2)}, []string{"lossy"}},
		{"interrupted", []string{begin(a), data}, []string{"interrupted"}},
		{"retention loss", []string{data, end(a, 0, 0)}, []string{"retention-loss"}},
		{"retention loss, drop seen", []string{data, drop(a, 3), data, end(a, 3, 0)}, []string{"retention-loss"}},
		{"retention loss, drop first", []string{drop(a, 3), data, end(a, 3, 0)}, []string{"retention-loss"}},
		{"retention loss, end first", []string{end(a, 0, 0), begin(b), end(b, 0, 0)}, []string{"retention-loss", "lossless"}},
		{"unknown", []string{data, data}, []string{"unknown"}},
		{"unknown then a run", []string{data, begin(a), end(a, 0, 0)}, []string{"unknown", "lossless"}},
		{"two runs", []string{begin(a), end(a, 0, 0), begin(b), data, end(b, 0, 0)}, []string{"lossless", "lossless"}},
		{"crashed run then a run", []string{begin(a), data, begin(b), end(b, 0, 0)}, []string{"interrupted", "lossless"}},
		{"duplicate begin", []string{begin(a), begin(a), end(a, 0, 0)}, []string{"corrupted"}},
		{"duplicate end", []string{begin(a), end(a, 0, 0), end(a, 0, 0)}, []string{"corrupted"}},
		{"end before begin", []string{end(a, 0, 0), begin(a)}, []string{"corrupted"}},
		{"end of another run", []string{begin(a), end(b, 0, 0), end(a, 0, 0)}, []string{"lossless", "corrupted"}},
		{"end without begin mid-log", []string{begin(a), end(a, 0, 0), data, end(b, 0, 0)}, []string{"lossless", "unknown", "corrupted"}},
		{"drops beyond end", []string{begin(a), drop(a, 9), end(a, 5, 0)}, []string{"corrupted"}},
		{"drop outside its run", []string{begin(a), drop(b, 1), end(a, 1, 0)}, []string{"lossy", "corrupted"}},
		{"invalid JSON", []string{begin(a), `{"run":`, end(a, 0, 0)}, []string{"corrupted"}},
		{"unknown event", []string{begin(a), `{"run":"` + a + `","event":"pause"}`, end(a, 0, 0)}, []string{"corrupted"}},
		{"malformed run id", []string{`{"run":"A","event":"begin"}`, data}, []string{"corrupted"}},
		{"negative drop", []string{begin(a), `{"run":"` + a + `","event":"drop","stdout":-1}`, end(a, 0, 0)}, []string{"corrupted"}},
		{"end without totals", []string{begin(a), `{"run":"` + a + `","event":"end"}`}, []string{"corrupted"}},
		{"garbage line in a run", []string{begin(a), "not a record", end(a, 0, 0)}, []string{"corrupted"}},
		{"header inside a file", []string{begin(a), `{"event":"file","seq":7}`, end(a, 0, 0)}, []string{"corrupted"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, path := testDir(t)
			var log []byte
			log = append(log, "2026-11-29T10:00:00.000000000Z kiln F {\"event\":\"file\",\"seq\":1}\n"...)
			for _, l := range tc.lines {
				if strings.HasPrefix(l, "{") {
					l = "kiln F " + l
				}
				if l != "not a record" {
					l = "2026-11-29T10:00:01.000000000Z " + l
				}
				log = append(log, l+"\n"...)
			}
			if err := os.WriteFile(filepath.Join(path, ActiveName), log, 0o600); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, states(readLog(t, d).Runs)); diff != "" {
				t.Errorf("states (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFilter(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	gate := make(chan struct{})
	w := begin(t, d, Options{beforeLoop: func() { <-gate }})
	f := newFeeder(w)
	f.write(ring.Stdout, []byte("o1\no2\n"))
	f.write(ring.Stderr, []byte("e1\n"))
	f.write(ring.Stdout, append(bytes.Repeat([]byte{'L'}, MaxContent+1), '\n')) // one line, two records
	f.write(ring.Stderr, []byte("e2 unfinished"))
	close(gate)
	f.end(t)
	text := func(fl Filter) string {
		l, err := ReadLog(ctxT(t), d, fl)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, e := range l.Entries {
			if e.Stream == LogMeta {
				b.WriteString("[meta]")
				continue
			}
			p := e.Payload()
			if len(p) > 100 {
				p = append(p[:3:3], "…\n"...)
			}
			b.Write(p)
		}
		return b.String()
	}
	cases := []struct {
		f    Filter
		want string
	}{
		{Filter{Tail: -1}, "o1\no2\ne1\nLLL…\nL\ne2 unfinished"},
		{Filter{Stdout: true, Tail: -1}, "o1\no2\nLLL…\nL\n"},
		{Filter{Stderr: true, Tail: -1}, "e1\ne2 unfinished"},
		{Filter{Tail: 0}, ""},
		{Filter{Tail: 1}, "e2 unfinished"},
		{Filter{Tail: 2}, "LLL…\nL\ne2 unfinished"},
		{Filter{Stdout: true, Tail: 2}, "o2\nLLL…\nL\n"},
		{Filter{Tail: 100}, "o1\no2\ne1\nLLL…\nL\ne2 unfinished"},
		{Filter{Since: time.Now().Add(time.Hour), Tail: -1}, ""},
		{Filter{Until: time.Now().Add(-time.Hour), Tail: -1}, ""},
		{Filter{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour), Stderr: true, Tail: -1}, "e1\ne2 unfinished"},
		// The file's header, the run's begin, and its end.
		{All, "[meta][meta]o1\no2\ne1\nLLL…\nL\ne2 unfinished[meta]"},
	}
	for _, tc := range cases {
		if got := text(tc.f); got != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.f, got, tc.want)
		}
	}
}

// follow reads entries until the end record of run, or a failure.
func follow(t *testing.T, r *Reader, run string, each func(Entry)) {
	t.Helper()
	ctx := ctxT(t)
	for {
		e, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		each(e)
		if e.Gap == 0 && e.Stream == LogMeta {
			if m, err := parseMeta(e.Content, false); err == nil && m.Event == eventEnd && m.Run == run {
				return
			}
		}
	}
}

// TestFollowerKeepsUpAcrossRotation: a follower reading while the writer
// appends and rotates gets every record once, in order, with no gap.
func TestFollowerKeepsUpAcrossRotation(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	w := begin(t, d, Options{MaxSize: 2048, MaxFiles: 1000})
	r := NewReader(d, ReadOptions{Follow: true, Poll: time.Millisecond})
	defer r.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f := newFeeder(w)
		f.paced = true
		numbered(f, ring.Stdout, "n", 1, 3000, 80)
		f.w.Sink().Close()
	}()
	var out []byte
	follow(t, r, w.Run(), func(e Entry) {
		if e.Gap != 0 {
			t.Fatalf("gap of %d", e.Gap)
		}
		if e.Stream == LogStdout {
			out = append(out, e.Payload()...)
		}
	})
	<-done
	if ns := lineNumbers(t, out, "n"); !slices.Equal(ns, seq(1, 3000)) {
		t.Fatalf("got %d lines, want 1..3000 in order", len(ns))
	}
	if runs := r.Runs(); len(runs) != 1 || runs[0].State != Lossless || runs[0].Missed {
		t.Errorf("runs %+v", runs)
	}
}

// TestRotationOnEveryRecordWithASlowFollower: the writer rotates on every
// record and keeps two files while the follower is stalled; the follower
// then reports exactly the log bytes it missed.
func TestRotationOnEveryRecordWithASlowFollower(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	w := begin(t, d, Options{MaxSize: 1024, MaxFiles: 2})
	r := NewReader(d, ReadOptions{Follow: true, Poll: time.Millisecond})
	defer r.Close()
	ctx := ctxT(t)
	// The follower opens the first file and reads its header.
	if _, err := r.Next(ctx); err != nil {
		t.Fatal(err)
	}
	f := newFeeder(w)
	f.paced = true
	numbered(f, ring.Stdout, "n", 1, 200, 700) // one record per file
	f.end(t)
	var got []int
	var gaps []int64
	follow(t, r, w.Run(), func(e Entry) {
		if e.Gap != 0 {
			gaps = append(gaps, e.Gap)
		} else if e.Stream == LogStdout {
			got = append(got, lineNumbers(t, e.Payload(), "n")...)
		}
	})
	st := r.Stats()
	if len(gaps) != 1 || gaps[0] <= 0 || st.Missed != gaps[0] {
		t.Fatalf("gaps %v, stats %+v: want one gap of known size", gaps, st)
	}
	if st.Bytes+st.Missed != logBytes(t, d) {
		t.Errorf("read %d + missed %d != written %d", st.Bytes, st.Missed, logBytes(t, d))
	}
	// The file it held open is read to its end; what follows the gap is a
	// contiguous tail.
	if len(got) < 2 || got[0] != 1 || got[len(got)-1] != 200 || !slices.Equal(got[1:], seq(got[1], 200)) {
		t.Errorf("lines %v", got)
	}
	if runs := r.Runs(); len(runs) != 1 || !runs[0].Missed || runs[0].State != Lossless {
		t.Errorf("runs %+v: want the run lossless in the log and marked missed by this reader", runs)
	}
}

// TestFollowAcrossAPlainRename: Seed, "Follow mode must retry an ENOENT
// between rename steps." A rotation by rename (as other writers do)
// leaves a moment with no active file, and bytes appended to the old file
// after the rename; the follower waits out the first and drains the second
// before moving on.
func TestFollowAcrossAPlainRename(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	ts := "2026-11-29T10:00:00.000000000Z "
	active := filepath.Join(path, ActiveName)
	if err := os.WriteFile(active, []byte(ts+"kiln F {\"event\":\"file\",\"seq\":1}\n"+ts+"stdout F a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := NewReader(d, ReadOptions{Follow: true, Poll: time.Millisecond})
	defer r.Close()
	ctx := ctxT(t)
	next := func() string {
		t.Helper()
		e, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if e.Gap != 0 {
			return fmt.Sprintf("gap %d", e.Gap)
		}
		return string(e.Content)
	}
	next() // header
	if got := next(); got != "a" {
		t.Fatalf("got %q", got)
	}
	old, err := os.OpenFile(active, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := os.Rename(active, filepath.Join(path, archiveName(1))); err != nil {
		t.Fatal(err)
	}
	// Nothing is active now. The follower must wait, not fail or finish.
	ctxShort, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if _, err := r.Next(ctxShort); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with no active file: %v, want to keep waiting", err)
	}
	cancel()
	old.WriteString(ts + "stdout F b\n")
	if err := os.WriteFile(active, []byte(ts+"kiln F {\"event\":\"file\",\"seq\":2,\"offset\":999}\n"+ts+"stdout F c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"b", `{"event":"file","seq":2,"offset":999}`, "c"} {
		if got := next(); got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	if st := r.Stats(); st.Missed != 0 || st.MissedUnknown != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestReaderOfAnEmptyDirectory(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	r := NewReader(d, ReadOptions{})
	defer r.Close()
	if _, err := r.Next(ctxT(t)); !errors.Is(err, io.EOF) {
		t.Fatalf("got %v, want EOF", err)
	}
	if len(r.Runs()) != 0 {
		t.Fatalf("runs %v", r.Runs())
	}
}

func FuzzParseRecord(f *testing.F) {
	f.Add([]byte("2026-11-29T10:00:00.000000000Z stdout F hello"))
	f.Add([]byte("2026-11-29T10:00:00Z stderr P:x "))
	f.Add([]byte(`2026-11-29T10:00:00.1Z kiln F {"run":"0190b0a4-7d2e-7a91-8c55-0e6f2ab41d90","event":"end","dropped":{"stdout":1,"stderr":0}}`))
	f.Add([]byte(`2026-11-29T10:00:00.1Z kiln F {"event":"file","seq":3,"offset":99,"run":"0190b0a4-7d2e-7a91-8c55-0e6f2ab41d90","at":{"stdout":5,"stderr":0}}`))
	f.Add([]byte(`2026-11-29T10:00:00.1Z stderr P:kiln:{"event":"drop","stderr":4}:: `))
	f.Fuzz(func(t *testing.T, line []byte) {
		line = bytes.ReplaceAll(line, []byte{'\n'}, nil)
		r, tagged, err := parseLine(line)
		if err != nil {
			return
		}
		if r.Stream != LogMeta && len(r.Content) > MaxContent {
			t.Fatalf("content of %d bytes accepted", len(r.Content))
		}
		// What parses re-encodes to a record that parses the same.
		ts := appendTime(nil, r.Time)
		again, err := parseRecord(bytes.TrimSuffix(appendRecord(nil, ts, r.Stream, r.Partial, r.Content), []byte{'\n'}))
		if err != nil {
			t.Fatalf("re-encoded record does not parse: %v", err)
		}
		if !again.Time.Equal(r.Time) || again.Stream != r.Stream || again.Partial != r.Partial || !bytes.Equal(again.Content, r.Content) {
			t.Fatalf("round trip changed %+v into %+v", r, again)
		}
		if r.Stream == LogMeta {
			parseMeta(r.Content, tagged)
		}
	})
}

// FuzzReadLog reads arbitrary bytes as a log: never a panic, and what it
// returns is consistent.
func FuzzReadLog(f *testing.F) {
	ts := "2026-11-29T10:00:00.000000000Z "
	f.Add([]byte(ts + `kiln F {"event":"file","seq":1}` + "\n" + ts + `kiln F {"run":"0190b0a4-7d2e-7a91-8c55-0e6f2ab41d90","event":"begin"}` + "\n" + ts + "stdout P ab\n" + ts + "stdout F c\n"))
	f.Add([]byte("\n\n\x00garbage\n" + ts + "stderr F x"))
	const run = "0190b0a4-7d2e-7a91-8c55-0e6f2ab41d90"
	f.Add([]byte(ts + `kiln F {"event":"file","seq":1,"run":"` + run + `","at":{"stdout":0,"stderr":0}}` + "\n" +
		ts + `kiln F {"event":"begin","run":"` + run + `"}` + "\n" + ts + "stdout F a\n" +
		ts + `kiln F {"event":"drop","run":"` + run + `","stdout":3}` + "\n" + ts + "stdout P b\n" +
		ts + `kiln F {"event":"end","run":"` + run + `","dropped":{"stdout":3,"stderr":0}}` + "\n"))
	f.Add(append(appendTagged(nil, []byte(ts[:len(ts)-1]), LogStdout, Meta{Event: eventFile, Seq: 2, Run: run, At: &Positions{Stdout: 9}}, legacyHeaderSize),
		ts+"stdout F c\n"...))
	f.Fuzz(func(t *testing.T, log []byte) {
		d, path := testDir(t)
		if err := os.WriteFile(filepath.Join(path, ActiveName), log, 0o600); err != nil {
			t.Fatal(err)
		}
		l := readLog(t, d)
		var n int64
		for _, e := range l.Entries {
			if e.Gap != 0 {
				t.Fatal("a gap in a single file")
			}
		}
		for _, r := range l.Runs {
			if r.State < Lossless || r.State > Corrupted {
				t.Fatalf("state %v", r.State)
			}
			n += r.Bytes[0] + r.Bytes[1]
		}
		if n != int64(len(payload(l, LogStdout))+len(payload(l, LogStderr))) {
			t.Fatalf("runs count %d payload bytes, records hold %d", n, len(payload(l, LogStdout))+len(payload(l, LogStderr)))
		}
		if l.Stats.Bytes != int64(len(log)) {
			t.Fatalf("read %d of %d bytes", l.Stats.Bytes, len(log))
		}
	})
}

// TestReadThenFollow: a reader that reached the end of the log, with a
// line still being written, follows on from there without losing it.
func TestReadThenFollow(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	ts := "2026-11-29T10:00:00.000000000Z "
	active := filepath.Join(path, ActiveName)
	if err := os.WriteFile(active, []byte(ts+"kiln F {\"event\":\"file\",\"seq\":1}\n"+ts+"stdout F one\n"+ts+"stdout F tw"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := NewReader(d, ReadOptions{Poll: time.Millisecond})
	defer r.Close()
	ctx := ctxT(t)
	var got []string
	for {
		e, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(e.Content))
	}
	if st := r.Stats(); st.Torn != 1 {
		t.Errorf("at the end: %+v, want the cut line counted as torn", st)
	}
	f, err := os.OpenFile(active, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("o\n")
	f.Close()
	r.SetFollow(true)
	e, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, string(e.Content))
	if diff := cmp.Diff([]string{`{"event":"file","seq":1}`, "one", "two"}, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	if st := r.Stats(); st.Torn != 0 || st.Corrupt != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestRecordsKnowTheirStreamOffsets: whatever the queue dropped, the
// writer lost or rotation cut, every record the reader returns says where
// in its stream it stands, and holds the bytes the stream had there.
func TestRecordsKnowTheirStreamOffsets(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	gate := make(chan struct{})
	w := begin(t, d, Options{MaxSize: 4096, MaxFiles: 1000, QueueBytes: 4 << 10, beforeLoop: func() { <-gate }})
	f := newFeeder(w)
	var off ring.Offsets
	line := func(s ring.Stream, n int) {
		b := pattern(s, off[s], n)
		for i := range b {
			if b[i] == '\n' {
				b[i] = 'x'
			}
		}
		if n%3 != 0 {
			b[n-1] = '\n'
		}
		// The pattern with newlines where the lines end: what the record
		// at an offset holds is known from the offset alone, save the
		// newlines.
		f.write(s, b)
		off[s] += int64(n)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		if i == 300 {
			close(gate) // the first 300 lines overflow the queue
		}
		line(ring.Stream(rng.IntN(2)), 1+rng.IntN(200))
	}
	f.end(t)
	l := readLog(t, d)
	if len(l.Runs) != 1 || l.Runs[0].State != Lossy {
		t.Fatalf("runs %+v: want one lossy run", l.Runs)
	}
	var seen ring.Offsets
	for _, e := range l.Entries {
		if e.Gap != 0 || e.Stream == LogMeta {
			continue
		}
		s := ring.Stream(e.Stream)
		if e.Offset < seen[s] {
			t.Fatalf("%v record at offset %d, after offset %d", s, e.Offset, seen[s])
		}
		want := pattern(s, e.Offset, len(e.Content))
		for i, c := range e.Content {
			if c != want[i] && !(want[i] == '\n' && c == 'x') {
				t.Fatalf("%v record at offset %d: byte %d is %#x, the stream had %#x", s, e.Offset, i, c, want[i])
			}
		}
		seen[s] = e.Offset + int64(e.PayloadLen())
	}
	if seen[ring.Stdout] == 0 || seen[ring.Stderr] == 0 {
		t.Fatalf("read up to %v", seen)
	}
}
