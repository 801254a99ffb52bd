package interop

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"

	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/stanza/entry"
	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/stanza/fileconsumer/attrs"
	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/stanza/operator"
	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/stanza/operator/parser/container"
	"github.com/open-telemetry/opentelemetry-collector-contrib/pkg/stanza/testutil"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// otelLine is one log record as OpenTelemetry's container parser makes it.
type otelLine struct {
	stream string
	body   string
	time   time.Time
}

// otelRead feeds the lines of files, in order, to OpenTelemetry's
// container parser (the filelog receiver's, which joins partial lines)
// and returns the records it makes.
func otelRead(t *testing.T, files ...string) []otelLine {
	t.Helper()
	cfg := container.NewConfigWithID("container")
	cfg.AddMetadataFromFilePath = false
	// The kiln stream's lines are not container log lines: the parser
	// passes them on unparsed, without a stream, and a pipeline that keeps
	// stdout and stderr drops them (below).
	cfg.OnError = "send_quiet"
	op, err := cfg.Build(componenttest.NewNopTelemetrySettings())
	if err != nil {
		t.Fatal(err)
	}
	out := testutil.NewFakeOutput(t)
	op.(*container.Parser).OutputOperators = []operator.Operator{out}
	var got []otelLine
	take := func(e *entry.Entry) {
		stream, _ := e.Attributes["log.iostream"].(string)
		if stream != "stdout" && stream != "stderr" {
			return
		}
		body, _ := e.Body.(string)
		got = append(got, otelLine{stream, body, e.Timestamp})
	}
	// The parser hands records over from goroutines of its own; its
	// output's channel is taken from meanwhile, so that none waits.
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case e := <-out.Received:
				take(e)
			case <-stop:
				return
			}
		}
	}()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			e := &entry.Entry{Body: sc.Text(), Attributes: map[string]any{attrs.LogFilePath: "/var/log/pods/ns_pod_uid/c/0.log"}}
			if err := op.Process(t.Context(), e); err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
		}
	}
	// Stop flushes what the parser holds of a partial line and returns
	// once every record is in the output's channel or taken.
	if err := op.Stop(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-done
	for len(out.Received) > 0 {
		take(<-out.Received)
	}
	return got
}

// lines splits a stream's output as a log shipper does: into lines
// without their newlines, the last one kept if unfinished.
func lines(b []byte) []string {
	s := strings.Split(string(b), "\n")
	if s[len(s)-1] == "" {
		s = s[:len(s)-1]
	}
	return s
}

// TestOpenTelemetryReadsEveryLine: OpenTelemetry's container parser, fed a
// captured log file by file, makes one record per line of the output, on
// its stream, dated when it was written, and nothing else on stdout or
// stderr: the log's own records are a stream of their own.
func TestOpenTelemetryReadsEveryLine(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
	}{
		{"stdout first", `for i in $(seq 1 300); do echo "out $i"; echo "err $i" >&2; done
head -c 40000 /dev/zero | tr '\0' L; echo
printf 'no newline at the end'`},
		{"stderr first", `echo "err first" >&2; for i in $(seq 1 300); do echo "out $i"; echo "err $i" >&2; done`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now().Add(-time.Minute)
			path, wantOut, wantErr := captured(t, capture.Options{MaxSize: 4 << 10, MaxFiles: 1000}, tc.script)
			files := append(archivesOf(t, path), path)
			got := otelRead(t, files...)
			var gotOut, gotErr []string
			for _, l := range got {
				if l.time.Before(began) || l.time.After(time.Now()) {
					t.Errorf("record %q dated %v", l.body, l.time)
				}
				switch l.stream {
				case "stdout":
					gotOut = append(gotOut, l.body)
				case "stderr":
					gotErr = append(gotErr, l.body)
				default:
					t.Errorf("record %q on stream %q", l.body, l.stream)
				}
			}
			if err := diff("stdout", []byte(strings.Join(gotOut, "\n")), []byte(strings.Join(lines(wantOut), "\n"))); err != nil {
				t.Error(err)
			}
			if err := diff("stderr", []byte(strings.Join(gotErr, "\n")), []byte(strings.Join(lines(wantErr), "\n"))); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestOpenTelemetryReadsALineAReaderCaughtUpWith: a reader that catches up
// with the log (as one does when the ring has dropped what it wants) while
// a line is unfinished, and the other stream's line before that line's
// end, leave OpenTelemetry's parser with each line whole on its stream:
// the unfinished line was not cut into the log for the reader.
func TestOpenTelemetryReadsALineAReaderCaughtUpWith(t *testing.T) {
	dir, w := begin(t, capture.Options{})
	p, err := process.Start("p", process.Spec{Argv: []string{"sh", "-c",
		`printf 'progress 50%%'; read a; echo "a warning" >&2; read b; echo " and done"`},
		Stdin: process.StdinPipe, Capture: w})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	a, err := p.Attach(ring.Offsets{}, process.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	next := func(s ring.Stream) {
		for {
			e, err := a.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if e.Kind == ring.Data && e.Stream == s {
				return
			}
		}
	}
	next(ring.Stdout)
	if _, err := w.Caught(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Write(0, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	next(ring.Stderr)
	if _, err := w.Caught(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Write(3, []byte("on\n")); err != nil {
		t.Fatal(err)
	}
	ended(t, p)
	got := otelRead(t, filepath.Join(dir, capture.ActiveName))
	want := []otelLine{{stream: "stderr", body: "a warning"}, {stream: "stdout", body: "progress 50% and done"}}
	if len(got) != len(want) {
		t.Fatalf("records %+v, want %+v", got, want)
	}
	for i := range got {
		if got[i].stream != want[i].stream || got[i].body != want[i].body {
			t.Fatalf("records %+v, want %+v", got, want)
		}
	}
}
