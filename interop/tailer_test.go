package interop

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/stanza/fileconsumer"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// tally counts what a tailer emitted of a numbered capture: each
// application line by its number, and the kiln stream's records by their
// text, so that reading anything twice shows.
type tally struct {
	mu       sync.Mutex
	lines    []uint8 // times each line number was seen
	distinct int
	dups     int
	meta     map[string]int
	other    []string
	ended    bool
	changed  chan struct{} // closed and replaced on every emit
}

var numberedLine = regexp.MustCompile(`^\S+ stdout F line (\d+) `)

func (c *tally) emit(_ context.Context, tokens [][]byte, _ map[string]any, _ int64, _ []int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, tok := range tokens {
		if m := numberedLine.FindSubmatch(tok); m != nil {
			n, err := strconv.Atoi(string(m[1]))
			if err != nil || n >= len(c.lines) {
				c.other = append(c.other, string(tok))
				continue
			}
			if c.lines[n]++; c.lines[n] == 1 {
				c.distinct++
			} else {
				c.dups++
			}
			continue
		}
		if bytes.Contains(tok, []byte(" kiln F ")) {
			c.meta[string(tok)]++
			c.ended = c.ended || bytes.Contains(tok, []byte(`"event":"end"`))
			continue
		}
		c.other = append(c.other, string(tok))
	}
	close(c.changed)
	c.changed = make(chan struct{})
	return nil
}

// TestOpenTelemetryTailsARotatingLogOnce: OpenTelemetry's file consumer
// (the engine of the collector's filelog receiver) polls a capture
// directory while a writer writes 700,000 numbered lines into files that
// rotate every MiB, and emits every line exactly once, every file's
// header once: a file is known by its first bytes (its fingerprint), and
// no file's first bytes ever change. When a header was rewritten at the
// end of a run, a tailer took the file for a new one and read it again.
func TestOpenTelemetryTailsARotatingLogOnce(t *testing.T) {
	const lines = 700_000
	// A queue that holds the whole output: nothing is dropped whatever
	// the scheduling, so every line must reach the log.
	dir, w := begin(t, capture.Options{MaxSize: 1 << 20, MaxFiles: 1000, QueueBytes: 256 << 20})
	c := &tally{lines: make([]uint8, lines), meta: map[string]int{}, changed: make(chan struct{})}
	cfg := fileconsumer.NewConfig()
	cfg.Include = []string{filepath.Join(dir, capture.ActiveName+"*")}
	cfg.StartAt = "beginning"
	cfg.PollInterval = 10 * time.Millisecond
	// A line is flushed without its newline only after this long without
	// more: the writer never leaves one so, but the race detector can stall
	// it longer than the default half second.
	cfg.FlushPeriod = time.Minute
	m, err := cfg.Build(componenttest.NewNopTelemetrySettings(), c.emit)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(nil); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			if err := m.Stop(); err != nil {
				t.Error(err)
			}
		}
	}
	defer stop()

	// The writer writes while the consumer polls.
	r := ring.New(ring.Config{Streams: []ring.Stream{ring.Stdout}})
	var b []byte
	for i := range lines {
		b = fmt.Appendf(b, "line %07d of seven hundred thousand\n", i)
		if len(b) >= 32<<10 || i == lines-1 {
			for rest := b; len(rest) > 0; {
				n := copy(r.Buffer(ring.Stdout), rest)
				ch := r.Commit(ring.Stdout, n, false)
				w.Sink().Push(ch)
				ch.Release()
				rest = rest[n:]
			}
			b = b[:0]
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	// await waits until the consumer has emitted every line, and the
	// run's end if ended is set.
	await := func(what string, ended bool) {
		t.Helper()
		for {
			c.mu.Lock()
			done, changed := c.distinct == lines && (c.ended || !ended), c.changed
			c.mu.Unlock()
			if done {
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				c.mu.Lock()
				t.Fatalf("%s: the consumer emitted %d of %d lines, end %t", what, c.distinct, lines, c.ended)
			}
		}
	}
	// Every line is in the log, and the consumer has emitted it, before
	// the run ends: a writer that changed a file at the end (a rewritten
	// header) would make the consumer read that file again.
	if _, err := w.Caught(ctx); err != nil {
		t.Fatal(err)
	}
	await("before the end", false)
	w.Sink().Close()
	if err := w.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if res := w.Result(); !res.Ended || res.Dropped != [capture.NumLogStreams]int64{} {
		t.Fatalf("capture %+v: want ended with nothing dropped", res)
	}
	archives, err := filepath.Glob(filepath.Join(dir, capture.ActiveName+".*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(archives) < 3 {
		t.Fatalf("%d rotations, want at least 3", len(archives))
	}
	await("after the end", true)
	// Some polls more: anything the consumer would read twice, it reads
	// now. (A window to look in, not a wait for an event.)
	time.Sleep(20 * cfg.PollInterval)
	stop()

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dups != 0 || len(c.other) != 0 {
		t.Errorf("%d lines emitted more than once; %d tokens that are neither output nor metadata (first: %.80q)", c.dups, len(c.other), append(c.other, "")[0])
	}
	var headers, twice int
	for tok, n := range c.meta {
		if bytes.Contains([]byte(tok), []byte(`"event":"file"`)) {
			headers++
		}
		if n != 1 {
			twice++
		}
	}
	if files := len(archives) + 1; headers != files || twice != 0 {
		t.Errorf("%d headers emitted for %d files, %d metadata records more than once", headers, files, twice)
	}
	t.Logf("%d distinct lines, %d files, %d metadata records", c.distinct, len(archives)+1, len(c.meta))
}

// CRI expressions of log shippers, copied as data: each is how that
// shipper recognises a container log line, with its time, stream, tag and
// content.
var shipperExpressions = []struct {
	name         string
	re           *regexp.Regexp
	tag, content string // the groups of the P/F tag and of the content
}{
	// fluent-bit's built-in multiline parser "cri", the one its tail input
	// uses for container logs (FLB_ML_CRI_REGEX in
	// src/multiline/flb_ml_parser_cri.c).
	{"fluent-bit multiline cri", regexp.MustCompile(`^(?<time>.+?) (?<stream>stdout|stderr) (?<_p>F|P) (?<log>.*)$`), "_p", "log"},
	// fluent-bit's parser "cri" as its documentation gives it for
	// Kubernetes (parsers.conf).
	{"fluent-bit cri parser", regexp.MustCompile(`^(?<time>[^ ]+) (?<stream>stdout|stderr) (?<logtag>[^ ]*) (?<log>.*)$`), "logtag", "log"},
	// Vector's kubernetes_logs source (CRI_REGEX_PATTERN in
	// src/sources/kubernetes_logs/parser/cri.rs), less its (?-u) flag,
	// which Go's syntax has no use for: Go's expressions match a byte that
	// is not UTF-8 as one character, so '.' takes binary content too.
	{"vector cri", regexp.MustCompile(`^(?P<timestamp>.*) (?P<stream>(stdout|stderr)) (?P<multiline_tag>(P|F)) (?P<message>.*)(?P<new_line_tag>\n?)$`), "multiline_tag", "message"},
}

// TestShipperExpressionsParseEveryLine: every stdout and stderr line of a
// capture (short lines, a line longer than a record, bytes that are not
// UTF-8, CR, and a last line without its newline; across rotation) is a
// line fluent-bit's and Vector's CRI expressions parse, with its stream and
// its content byte for byte; the kiln stream's lines are lines none of
// them takes for output.
func TestShipperExpressionsParseEveryLine(t *testing.T) {
	script := `for i in $(seq 1 300); do echo "out $i"; echo "err $i" >&2; done
head -c 40000 /dev/zero | tr '\0' L; echo
printf 'caf\303\251 \377\376 \r\n'
printf 'no newline at the end'`
	path, wantOut, wantErr := captured(t, capture.Options{MaxSize: 8 << 10, MaxFiles: 1000}, script)
	files := append(archivesOf(t, path), path)
	if len(files) < 4 {
		t.Fatalf("%d files: want rotation", len(files))
	}
	for _, sh := range shipperExpressions {
		t.Run(sh.name, func(t *testing.T) {
			var out, errs []byte
			meta := 0
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				for line := range bytes.Lines(b) {
					line = bytes.TrimSuffix(line, []byte{'\n'})
					if bytes.Contains(line[:min(len(line), 40)], []byte(" kiln F ")) {
						meta++
						if sh.re.Match(line) {
							t.Fatalf("a metadata line parsed as output: %q", line)
						}
						continue
					}
					m := sh.re.FindSubmatchIndex(line)
					if m == nil {
						t.Fatalf("%s: a line it does not parse: %q", filepath.Base(f), line)
					}
					group := func(name string) []byte {
						i := sh.re.SubexpIndex(name)
						return line[m[2*i]:m[2*i+1]]
					}
					content, stream := group(sh.content), group("stream")
					switch string(group(sh.tag)) {
					case "F":
						content = append(content[:len(content):len(content)], '\n')
					case "P":
					default:
						t.Fatalf("tag %q in %q", group(sh.tag), line)
					}
					switch string(stream) {
					case "stdout":
						out = append(out, content...)
					case "stderr":
						errs = append(errs, content...)
					default:
						t.Fatalf("stream %q", stream)
					}
				}
			}
			if meta == 0 {
				t.Fatal("no metadata lines")
			}
			for _, err := range []error{diff("stdout", out, wantOut), diff("stderr", errs, wantErr)} {
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
}
