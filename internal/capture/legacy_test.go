package capture

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Logs of the previous format, which users still have on their disks:
// every file began with a 512-byte header, an empty partial line of stdout
// or stderr whose tags held the metadata (P:kiln:{...}:::), rewritten in
// place when the run ended; drop records were such lines too.

// legacyHeaderSize is the size of a previous-format file's header.
const legacyHeaderSize = 512

// appendTagged appends a metadata record of the previous format on stream
// on, padded with empty tags to size bytes when size is set.
func appendTagged(dst, ts []byte, on LogStream, m Meta, size int) []byte {
	start := len(dst)
	dst = append(dst, ts...)
	dst = append(dst, ' ')
	dst = append(dst, logStreamNames[on]...)
	dst = append(dst, ' ')
	dst = append(dst, metaTag...)
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	dst = append(dst, b...)
	if size > 0 {
		for range size - 2 - (len(dst) - start) {
			dst = append(dst, ':')
		}
	}
	return append(dst, " \n"...)
}

// TestReadsLogsOfThePreviousFormat reads testdata/header512, a log the
// previous format's writer made: a run that rotated eight times (4 KiB
// files), lost 11459 bytes of stdout to a full queue, wrote a line longer
// than a record, bytes that are not UTF-8 and a last line without its
// newline; then a short lossless run. Every byte comes back at its stream
// offset, and each run has its state.
func TestReadsLogsOfThePreviousFormat(t *testing.T) {
	t.Parallel()
	d, err := OpenDir("testdata/header512")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l := readLog(t, d)
	// The streams as the process wrote them; 11459 of the x's were lost.
	var out, errs []byte
	errs = append(errs, "err first\n"...)
	for i := 1; i <= 20; i++ {
		out = fmt.Appendf(out, "out %d\n", i)
	}
	out = append(out, bytes.Repeat([]byte("x"), 40000)...)
	out = append(out, "after the drop\n"...)
	out = append(out, bytes.Repeat([]byte("L"), MaxContent+100)...)
	out = append(out, '\n')
	errs = append(errs, "caf\xc3\xa9 \xff\xfe\r\n"...)
	for i := 21; i <= 120; i++ {
		out = fmt.Appendf(out, "out %d\n", i)
		errs = fmt.Appendf(errs, "err %d\n", i)
	}
	out = append(out, "no newline at the end"...)
	const lost = 11459
	type runState struct {
		ID      string
		State   RunState
		Dropped [NumLogStreams]int64
	}
	var got []runState
	for _, r := range l.Runs {
		got = append(got, runState{r.ID, r.State, r.Dropped})
	}
	want := []runState{
		{"0190b0a4-7d2e-7a91-8c55-0e6f2ab41d90", Lossy, [NumLogStreams]int64{lost, 0}},
		{"0190b0a4-7d2e-7a91-8c55-0e6f2ab41d91", Lossless, [NumLogStreams]int64{}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("runs (-want +got):\n%s", diff)
	}
	if l.Stats.Corrupt != 0 || l.Stats.Torn != 0 || l.Stats.Bytes != 60516 {
		t.Errorf("stats %+v", l.Stats)
	}
	// Each record holds the bytes its stream had at its offset; the
	// first run's records cover the streams but for the loss.
	var n [NumLogStreams]int64
	second := false
	for _, e := range l.Entries {
		if e.Gap != 0 {
			t.Fatalf("a gap of %d", e.Gap)
		}
		if e.Stream == LogMeta {
			continue
		}
		p := e.Payload()
		if string(p) == "second run\n" {
			second = true
			if e.Offset != 0 {
				t.Errorf("the second run's line at offset %d", e.Offset)
			}
			continue
		}
		stream := out
		if e.Stream == LogStderr {
			stream = errs
		}
		if e.Offset < 0 || e.Offset+int64(len(p)) > int64(len(stream)) || !bytes.Equal(stream[e.Offset:e.Offset+int64(len(p))], p) {
			t.Fatalf("%v record at offset %d: %q is not what the stream had there", e.Stream, e.Offset, clip(p))
		}
		n[e.Stream] += int64(len(p))
	}
	if !second || n[LogStdout]+lost != int64(len(out)) || n[LogStderr] != int64(len(errs)) {
		t.Errorf("records hold %v bytes, the streams %d (less %d lost) and %d", n, len(out), lost, len(errs))
	}
}

// TestClassificationOfPreviousFormatHeaders: the runs of files whose
// 512-byte headers say where each began and ended, as the previous format
// had them (rewritten in place at the end).
func TestClassificationOfPreviousFormatHeaders(t *testing.T) {
	t.Parallel()
	const a = "0190b0a4-7d2e-7a91-8c55-0e6f2ab41d90"
	ts := []byte("2026-11-29T10:00:00.000000000Z")
	ended := time.Date(2026, 11, 29, 10, 0, 1, 0, time.UTC)
	data := string(ts) + " stdout F hello\n"
	drop := string(appendTagged(nil, ts, LogStdout, Meta{Event: eventDrop, Stdout: 5}, 0))
	// file makes a file: its header (ending, when end is set, with the
	// size the lines make, plus extra) and its lines.
	file := func(began bool, end *Dropped, extra int64, lines ...string) []byte {
		body := strings.Join(lines, "")
		h := Meta{Event: eventFile, Seq: 1, Run: a, Began: began, At: &Positions{}}
		if end != nil {
			h.Ended, h.Dropped, h.Size = &ended, end, legacyHeaderSize+int64(len(body))+extra
		}
		return append(appendTagged(nil, ts, LogStdout, h, legacyHeaderSize), body...)
	}
	none := &Dropped{}
	cases := []struct {
		name string
		log  []byte
		want []string
	}{
		{"lossless", file(true, none, 0, data), []string{"lossless"}},
		{"lossless, nothing written", file(true, none, 0), []string{"lossless"}},
		{"lossy", file(true, &Dropped{Stdout: 5, Stderr: 2}, 0, drop, data), []string{"lossy"}},
		{"interrupted", file(true, nil, 0, data), []string{"interrupted"}},
		{"retention loss", file(false, none, 0, data), []string{"retention-loss"}},
		{"unknown: began elsewhere, not ended", file(false, nil, 0, data), []string{"unknown"}},
		{"cut after its end", file(true, none, 10, data), []string{"corrupted"}},
		{"written to after its end", file(true, none, -int64(len(data)), data), []string{"corrupted"}},
		{"drops beyond the end's", file(true, &Dropped{Stdout: 4}, 0, drop, data), []string{"corrupted"}},
		{"a header inside the file", file(true, none, 0, data, string(file(true, none, 0))), []string{"corrupted"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, path := testDir(t)
			if err := os.WriteFile(filepath.Join(path, ActiveName), tc.log, 0o600); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, states(readLog(t, d).Runs)); diff != "" {
				t.Errorf("states (-want +got):\n%s", diff)
			}
		})
	}
}
