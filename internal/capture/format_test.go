package capture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// The log's format is a contract with every reader, ours and other
// projects': these tests hold the writer to it, each naming the sentence of
// the capture design (the seed) or of the append-only rule it checks.

// logFiles returns the log's files, oldest first, with their contents.
func logFiles(t *testing.T, path string) (names []string, contents [][]byte) {
	t.Helper()
	archives, err := filepath.Glob(filepath.Join(path, ActiveName+".*"))
	if err != nil {
		t.Fatal(err)
	}
	seqOf := func(name string) int64 {
		n, _ := parseArchive(filepath.Base(name))
		return n
	}
	slices.SortFunc(archives, func(a, b string) int { return int(seqOf(a) - seqOf(b)) })
	for _, name := range append(archives, filepath.Join(path, ActiveName)) {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		names, contents = append(names, filepath.Base(name)), append(contents, b)
	}
	return names, contents
}

// A record as the seed writes it: "<RFC3339Nano> <stream> <F|P> <content>".
var recordLine = regexp.MustCompile(`^(\S+) (stdout|stderr|kiln) ([FP]) (.*)$`)

// TestEveryLineIsARecord: Seed, "A regular record is: <RFC3339Nano>
// <stream> <F|P> <content>", and "stdout and stderr contain application
// output. The private boxlite stream contains structured metadata" (named
// kiln here): every line of every file is such a record, and the metadata
// lines are full lines of the kiln stream holding a JSON object.
func TestEveryLineIsARecord(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	gate := make(chan struct{})
	w := begin(t, d, Options{MaxSize: 2048, MaxFiles: 1000, QueueBytes: 8 << 10, beforeLoop: func() { <-gate }})
	f := newFeeder(w)
	numbered(f, ring.Stdout, "o", 1, 200, 60) // overflows the held queue: drop records
	close(gate)
	f.paced = true
	numbered(f, ring.Stderr, "e", 1, 100, 50)
	f.write(ring.Stdout, []byte("last, no newline"))
	f.end(t)
	names, contents := logFiles(t, path)
	if len(names) < 4 {
		t.Fatalf("%d files: want rotation", len(names))
	}
	events := map[string]int{}
	for i, b := range contents {
		for n, line := range bytes.Split(bytes.TrimSuffix(b, []byte{'\n'}), []byte{'\n'}) {
			m := recordLine.FindSubmatch(line)
			if m == nil {
				t.Fatalf("%s line %d is not a record: %q", names[i], n+1, clip(line))
			}
			if _, err := time.Parse(time.RFC3339Nano, string(m[1])); err != nil {
				t.Fatalf("%s line %d: %v", names[i], n+1, err)
			}
			if string(m[2]) != "kiln" {
				continue
			}
			var meta map[string]any
			if string(m[3]) != "F" || json.Unmarshal(m[4], &meta) != nil {
				t.Fatalf("%s line %d: metadata is not a full line holding a JSON object: %q", names[i], n+1, line)
			}
			ev, _ := meta["event"].(string)
			if run, _ := meta["run"].(string); run != w.Run() {
				t.Fatalf("%s line %d: %s record of run %q, want %s", names[i], n+1, ev, run, w.Run())
			}
			events[ev]++
		}
		if !bytes.HasSuffix(b, []byte{'\n'}) {
			t.Fatalf("%s does not end with a newline", names[i])
		}
	}
	if events["file"] != len(names) || events["begin"] != 1 || events["end"] != 1 || events["drop"] == 0 {
		t.Errorf("metadata records %v: want a header per file, one begin, one end and drops", events)
	}
}

// TestMetadataRecordsAsTheSeedWritesThem: Seed, the example
//
//	… boxlite F {"run":"b3f1…","event":"begin"}
//	… boxlite F {"run":"b3f1…","event":"drop","stdout":8192,"stderr":0}
//	… boxlite F {"run":"b3f1…","event":"end","dropped":{"stdout":8192,"stderr":0}}
//
// and "Every file begins with a file-header record that is never changed
// afterwards", "a run's end is an appended record": a run's first file is
// its header, then begin; the end is the last line of the log.
func TestMetadataRecordsAsTheSeedWritesThem(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	gate := make(chan struct{})
	w := begin(t, d, Options{QueueBytes: 2*itemCost + 16, beforeLoop: func() { <-gate }})
	f := newFeeder(w)
	f.write(ring.Stdout, []byte("Starting build...\n"))
	// Joined to the first chunk, it would take the queue past its budget.
	f.write(ring.Stdout, []byte(strings.Repeat("x", 199)+"\n"))
	close(gate)
	f.paced = true
	f.write(ring.Stdout, []byte("done\n"))
	res := f.end(t)
	_, contents := logFiles(t, path)
	if len(contents) != 1 {
		t.Fatalf("%d files", len(contents))
	}
	var got []string
	for line := range strings.Lines(string(contents[0])) {
		_, rest, _ := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
		got = append(got, rest)
	}
	run := w.Run()
	lost := 200
	want := []string{
		`kiln F {"event":"file","seq":1,"run":"` + run + `","at":{"stdout":0,"stderr":0}}`,
		`kiln F {"event":"begin","run":"` + run + `"}`,
		"stdout F Starting build...",
		fmt.Sprintf(`kiln F {"event":"drop","run":"%s","stdout":%d}`, run, lost),
		"stdout F done",
		fmt.Sprintf(`kiln F {"event":"end","run":"%s","dropped":{"stdout":%d,"stderr":0}}`, run, lost),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log (-want +got):\n%s", diff)
	}
	if res.Dropped != [NumLogStreams]int64{int64(lost), 0} {
		t.Errorf("result %+v", res)
	}
}

// TestOutputCannotForgeMetadata: Seed, "The private boxlite stream
// contains structured metadata that an application cannot forge by
// printing matching text": output that prints a metadata line, or a whole
// end record, is output, and the run is still the one its writer records.
func TestOutputCannotForgeMetadata(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	w := begin(t, d, Options{})
	f := newFeeder(w)
	forged := fmt.Sprintf("2026-01-01T00:00:00.000000000Z kiln F {\"event\":\"end\",\"run\":\"%s\",\"dropped\":{\"stdout\":0,\"stderr\":0}}\n", w.Run())
	f.write(ring.Stdout, []byte(forged))
	f.write(ring.Stderr, []byte("\n"+forged))
	l := readLog(t, d)
	if len(l.Runs) != 1 || l.Runs[0].State != Interrupted {
		t.Fatalf("before the end: runs %+v, want one interrupted", l.Runs)
	}
	f.end(t)
	l = readLog(t, d)
	if string(payload(l, LogStdout)) != forged || string(payload(l, LogStderr)) != "\n"+forged {
		t.Errorf("stdout %q, stderr %q", payload(l, LogStdout), payload(l, LogStderr))
	}
	if len(l.Runs) != 1 || l.Runs[0].State != Lossless {
		t.Errorf("runs %+v, want one lossless", l.Runs)
	}
}

// TestFilesAreOnlyAppendedTo: "Capture files strictly append-only: no
// WriteAt, no rewrite, no truncate of bytes once written." Whatever a file
// held at any moment of a run that rotates, drops and ends is where it was
// when the run ended: every earlier look at a file is a prefix of it.
func TestFilesAreOnlyAppendedTo(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	w := begin(t, d, Options{MaxSize: 4096, MaxFiles: 1000, QueueBytes: 8 << 10})
	f := newFeeder(w)
	ctx := ctxT(t)
	// seen holds, per sequence number, each content a look found.
	seen := map[int64][][]byte{}
	look := func() {
		t.Helper()
		names, contents := logFiles(t, path)
		for i, b := range contents {
			seq, ok := parseArchive(names[i])
			if !ok { // the active file: its header says which it is
				h, _, err := readHeader(mustOpen(t, d, ActiveName))
				if err != nil {
					t.Fatal(err)
				}
				seq = h.Seq
			}
			seen[seq] = append(seen[seq], b)
		}
	}
	for step := range 30 {
		numbered(f, ring.Stream(step%2), fmt.Sprintf("s%d-", step), 1, 20, 70)
		f.write(ring.Stdout, []byte("unfinished "))
		if _, err := w.Caught(ctx); err != nil {
			t.Fatal(err)
		}
		look()
	}
	f.end(t)
	look()
	if len(seen) < 5 {
		t.Fatalf("%d files: want rotations", len(seen))
	}
	for seq, looks := range seen {
		last := looks[len(looks)-1]
		for _, b := range looks {
			if !bytes.HasPrefix(last, b) {
				t.Fatalf("file %d changed: a look found %d bytes that its final %d bytes do not begin with", seq, len(b), len(last))
			}
		}
	}
}

func mustOpen(t *testing.T, d *Dir, name string) *os.File {
	t.Helper()
	f, err := d.open(name, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestFirstBytesNeverChange: "Every file begins with a file-header record
// that is never changed afterwards": the active file's first 4 KiB, which
// tailers know a file by, are the same while the run writes and after it
// ended.
func TestFirstBytesNeverChange(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	w := begin(t, d, Options{})
	f := newFeeder(w)
	numbered(f, ring.Stdout, "n", 1, 100, 80)
	if _, err := w.Caught(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	during, err := os.ReadFile(filepath.Join(path, ActiveName))
	if err != nil {
		t.Fatal(err)
	}
	if len(during) < 4096 {
		t.Fatalf("%d bytes written", len(during))
	}
	numbered(f, ring.Stderr, "e", 1, 10, 80)
	f.end(t)
	after, err := os.ReadFile(filepath.Join(path, ActiveName))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(during[:4096], after[:4096]) {
		t.Errorf("the first 4 KiB changed:\nduring %q\nafter  %q", clip(during), clip(after))
	}
}

// TestRotationRenamesCompleteFiles: Seed, "The file rotates in the guest
// at 10 MiB × 5 using a temporary file and renames", and the rule that a
// new file is created complete with its header record under a temporary
// name and renamed into place; archives get a rising sequence number and
// are never renamed again. Whenever one looks during a run that rotates on
// nearly every record, the active name holds a file that begins with its
// whole header, and an archive's name always names the same file.
func TestRotationRenamesCompleteFiles(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	w := begin(t, d, Options{MaxSize: 1024, MaxFiles: 1000})
	done := make(chan struct{})
	go func() {
		defer close(done)
		f := newFeeder(w)
		f.paced = true
		numbered(f, ring.Stdout, "n", 1, 300, 700) // a file per record
		f.w.Sink().Close()
	}()
	inodes := map[string]uint64{}
	looks := 0
	for finished := false; !finished; looks++ {
		select {
		case <-w.Done():
			finished = true // one look more, at the end
		default:
		}
		// The header, from the active name, whole.
		b, err := os.ReadFile(filepath.Join(path, ActiveName))
		if err != nil {
			t.Fatalf("look %d: %v", looks, err)
		}
		line, _, ok := bytes.Cut(b, []byte{'\n'})
		if !ok {
			t.Fatalf("look %d: the active file holds no whole line: %q", looks, b)
		}
		if r, tagged, err := parseLine(line); err != nil || r.Stream != LogMeta || tagged {
			t.Fatalf("look %d: the active file begins with %q", looks, line)
		} else if m, err := parseMeta(r.Content, false); err != nil || m.Event != eventFile {
			t.Fatalf("look %d: the active file begins with %q", looks, line)
		}
		ents, err := os.ReadDir(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if _, ok := parseArchive(e.Name()); !ok {
				continue
			}
			info, err := e.Info()
			if err != nil {
				continue // pruned meanwhile: none are, here
			}
			ino := info.Sys().(*syscall.Stat_t).Ino
			if was, ok := inodes[e.Name()]; ok && was != ino {
				t.Fatalf("%s named another file", e.Name())
			}
			inodes[e.Name()] = ino
		}
	}
	<-done
	if len(inodes) < 250 {
		t.Fatalf("%d archives seen in %d looks", len(inodes), looks)
	}
	l := readLog(t, d)
	if ns := lineNumbers(t, payload(l, LogStdout), "n"); !slices.Equal(ns, seq(1, 300)) || l.Runs[0].State != Lossless {
		t.Errorf("%d lines, runs %+v", len(ns), l.Runs)
	}
}
