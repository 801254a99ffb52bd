package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// capturedTable is a table whose processes may be captured into a fresh
// directory, their readers taking from the log what the ring lost.
func capturedTable(t *testing.T, cfg TableConfig, opt capture.Options) (*Table, func(string) (Capturer, error)) {
	t.Helper()
	logs, err := capture.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logs.Close() })
	cfg.Logs = logs.OpenSub
	tb := NewTable(cfg)
	t.Cleanup(func() { tb.Shutdown(context.Background()) })
	begin := func(id string) (Capturer, error) {
		d, err := logs.Sub(id)
		if err != nil {
			return nil, err
		}
		w, err := capture.Begin(d, uuid.Must(uuid.NewV7()).String(), opt)
		if err != nil {
			d.Close()
			return nil, err
		}
		go func() { <-w.Done(); d.Close() }()
		return w, nil
	}
	return tb, begin
}

// lines is the output of the script lines makes: n numbered lines on
// stdout, and every tenth one on stderr too.
func lines(n int) (script string, stdout, stderr string) {
	var o, e strings.Builder
	for i := range n {
		fmt.Fprintf(&o, "line %d of a build that prints one short line at a time\n", i)
		if i%10 == 0 {
			fmt.Fprintf(&e, "warning %d\n", i)
		}
	}
	script = fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "line $i of a build that prints one short line at a time"; `+
		`[ $((i %% 10)) -eq 0 ] && echo "warning $i" >&2; i=$((i+1)); done; exit 0`, n)
	return script, o.String(), e.String()
}

func attach(t *testing.T, tb *Table, id string, from ring.Offsets) *Attachment {
	t.Helper()
	a, err := tb.Attach(id, from, AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// TestWrappedRingIsFilledFromTheLog: a captured process prints 200,000
// short lines, 11 MiB, through a 1 MiB ring nobody reads; a reader from
// the start gets every byte, from the log and then the ring, with no gap,
// the streams interleaved as in the log; and so does one that resumes in
// the middle of the lines.
func TestWrappedRingIsFilledFromTheLog(t *testing.T) {
	t.Parallel()
	tb, begin := capturedTable(t, TableConfig{}, capture.Options{MaxSize: 64 << 20})
	script, stdout, stderr := lines(200000)
	id := runDrained(t, tb, Spec{Argv: []string{"sh", "-c", script}, Begin: begin})
	st, err := tb.Status(id)
	if err != nil || st.First[ring.Stdout] == 0 {
		t.Fatalf("status %+v, %v: the ring did not wrap", st, err)
	}
	tr := read(t, attach(t, tb, id, ring.Offsets{}), ring.Offsets{})
	if tr.lost != (ring.Offsets{}) || string(tr.data[ring.Stdout]) != stdout || string(tr.data[ring.Stderr]) != stderr {
		t.Fatalf("lost %v; stdout %d bytes of %d, stderr %d of %d, equal: %v %v", tr.lost, len(tr.data[ring.Stdout]), len(stdout),
			len(tr.data[ring.Stderr]), len(stderr), string(tr.data[ring.Stdout]) == stdout, string(tr.data[ring.Stderr]) == stderr)
	}
	if tr.exit == nil || *tr.exit != (Exit{}) {
		t.Fatalf("exit %v", tr.exit)
	}
	from := ring.Offsets{ring.Stdout: int64(len(stdout) / 3), ring.Stderr: int64(len(stderr) / 2)}
	tr = read(t, attach(t, tb, id, from), from)
	if tr.lost != (ring.Offsets{}) || string(tr.data[ring.Stdout]) != stdout[from[ring.Stdout]:] || string(tr.data[ring.Stderr]) != stderr[from[ring.Stderr]:] {
		t.Fatalf("resumed at %v: lost %v, %d and %d bytes", from, tr.lost, len(tr.data[ring.Stdout]), len(tr.data[ring.Stderr]))
	}
}

// TestTombstoneIsFilledFromTheLog: once a captured process is a tombstone,
// its ring gone, a late reader gets its whole output from the log.
func TestTombstoneIsFilledFromTheLog(t *testing.T) {
	t.Parallel()
	tb, begin := capturedTable(t, TableConfig{Grace: time.Millisecond}, capture.Options{})
	script, stdout, stderr := lines(3000)
	id := runDrained(t, tb, Spec{Argv: []string{"sh", "-c", script}, Begin: begin})
	ctx := ctxT(t)
	for {
		if _, err := tb.Process(id); errors.Is(err, ErrFinished) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("never a tombstone")
		case <-time.After(time.Millisecond):
		}
	}
	tr := read(t, attach(t, tb, id, ring.Offsets{}), ring.Offsets{})
	if tr.lost != (ring.Offsets{}) || string(tr.data[ring.Stdout]) != stdout || string(tr.data[ring.Stderr]) != stderr || tr.exit == nil {
		t.Fatalf("lost %v, stdout %d of %d bytes, stderr %d of %d, exit %v", tr.lost, len(tr.data[ring.Stdout]), len(stdout), len(tr.data[ring.Stderr]), len(stderr), tr.exit)
	}
}

// TestStalledReaderResumesFromTheLog: a reader of a running captured
// process stalls while the ring wraps; when it reads on, what it missed
// comes from the log, nothing lost, and then the live tail.
func TestStalledReaderResumesFromTheLog(t *testing.T) {
	t.Parallel()
	tb, begin := capturedTable(t, TableConfig{}, capture.Options{MaxSize: 64 << 20})
	id, err := tb.Start(Spec{Argv: []string{"sh", "-c", "head -c 8388608 /dev/zero | tr '\\0' x; echo; read line; echo after $line"},
		Stdin: StdinPipe, Begin: begin})
	if err != nil {
		t.Fatal(err)
	}
	a := attach(t, tb, id, ring.Offsets{})
	e, err := a.Next(ctxT(t))
	if err != nil || e.Kind != ring.Data {
		t.Fatalf("first event %+v, %v", e, err)
	}
	// The stalled reader holds one event while the 8 MiB go by.
	waitPumped(t, mustProcess(t, tb, id), ring.Stdout, 8<<20+1)
	if _, err := tb.Write(id, 0, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	tr := read(t, a, a.Position())
	got := append(bytes.Clone(e.Data), tr.data[ring.Stdout]...)
	want := strings.Repeat("x", 8<<20) + "\nafter go\n"
	if tr.lost != (ring.Offsets{}) || string(got) != want {
		t.Fatalf("lost %v, got %d bytes of %d, equal %v", tr.lost, len(got), len(want), string(got) == want)
	}
}

func mustProcess(t *testing.T, tb *Table, id string) *Process {
	t.Helper()
	p, err := tb.Process(id)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLostToBothIsAGapOfExactlyThat: bytes neither the ring nor the log
// holds (the log's queue dropped them, rotation removed them) are reported
// as gaps that count exactly them, at their offsets; the rest comes whole.
func TestLostToBothIsAGapOfExactlyThat(t *testing.T) {
	t.Parallel()
	t.Run("rotated away", func(t *testing.T) {
		// 4 files of 256 KiB keep about 700 KiB of payload of 11 MiB.
		tb, begin := capturedTable(t, TableConfig{}, capture.Options{MaxSize: 256 << 10, MaxFiles: 4})
		script, stdout, _ := lines(200000)
		id := runDrained(t, tb, Spec{Argv: []string{"sh", "-c", script}, Begin: begin, RingBytes: 64 << 10})
		tr := read(t, attach(t, tb, id, ring.Offsets{}), ring.Offsets{})
		lost, got := tr.lost[ring.Stdout], tr.data[ring.Stdout]
		if lost == 0 || lost+int64(len(got)) != int64(len(stdout)) || !strings.HasSuffix(stdout, string(got)) {
			t.Fatalf("lost %d, got %d bytes (the output's tail: %v) of %d", lost, len(got), strings.HasSuffix(stdout, string(got)), len(stdout))
		}
		// More than the ring: the log gave what it kept.
		if len(got) <= 64<<10 {
			t.Fatalf("got %d bytes, no more than the ring holds", len(got))
		}
	})
	t.Run("dropped by capture", func(t *testing.T) {
		// A queue too small for any chunk: capture drops it all.
		opt := capture.Options{QueueBytes: capture.MinQueueBytes}
		tb, begin := capturedTable(t, TableConfig{}, opt)
		id, err := tb.Start(Spec{Argv: []string{"sh", "-c", "head -c 4194304 /dev/zero | tr '\\0' y"}, Begin: begin, RingBytes: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		p := mustProcess(t, tb, id)
		<-p.Done()
		st := p.Status()
		dropped := st.Capture.Dropped[capture.LogStdout]
		if dropped == 0 {
			t.Fatal("capture dropped nothing")
		}
		tr := read(t, attach(t, tb, id, ring.Offsets{}), ring.Offsets{})
		got := tr.data[ring.Stdout]
		// The ring's 64 KiB, the rest a gap of exactly what neither kept.
		if tr.lost[ring.Stdout]+int64(len(got)) != 4<<20 || dropped != 4<<20 || len(got) != 64<<10 {
			t.Fatalf("lost %d, got %d of %d; capture dropped %d", tr.lost[ring.Stdout], len(got), 4<<20, dropped)
		}
		if strings.Trim(string(got), "y") != "" {
			t.Fatal("bytes that are not the output's")
		}
	})
}

// TestSlowReaderOfALiveProcessLosesNothing: a reader slower than the
// process, its ring small, falls behind again and again while the process
// runs; each time, what it missed comes from the log, read on from where
// the last gap's replay stopped, and it gets every byte.
func TestSlowReaderOfALiveProcessLosesNothing(t *testing.T) {
	t.Parallel()
	tb, begin := capturedTable(t, TableConfig{}, capture.Options{MaxSize: 64 << 20})
	script, stdout, stderr := lines(100000)
	id, err := tb.Start(Spec{Argv: []string{"sh", "-c", script}, Begin: begin, RingBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	a := attach(t, tb, id, ring.Offsets{})
	var events int
	ctx := ctxT(t)
	var out [ring.NumStreams][]byte
	var lost int64
	replays := 0
	for {
		e, err := a.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch e.Kind {
		case ring.Data:
			out[e.Stream] = append(out[e.Stream], e.Data...)
		case ring.Gap:
			lost += e.Lost()
		}
		if a.rep != nil && events%50 == 0 {
			replays++
		}
		if events++; events%20 == 0 {
			time.Sleep(time.Millisecond) // the reader's pace
		}
	}
	if lost != 0 || string(out[ring.Stdout]) != stdout || string(out[ring.Stderr]) != stderr {
		t.Fatalf("lost %d; stdout %d of %d bytes, stderr %d of %d", lost, len(out[ring.Stdout]), len(stdout), len(out[ring.Stderr]), len(stderr))
	}
	if replays == 0 {
		t.Fatal("the reader never fell behind the ring")
	}
}

// TestUnfinishedLineComesFromTheWriter: a captured process prints half a
// MiB without a newline through a 64 KiB ring and waits; a reader from the
// start gets all of it, the part the ring lost from what the log writer
// holds of the line, without the writer cutting the line into the log:
// the other stream's line that comes before its end does not stand
// between its records, for a reader that joins partial records.
func TestUnfinishedLineComesFromTheWriter(t *testing.T) {
	t.Parallel()
	tb, begin := capturedTable(t, TableConfig{}, capture.Options{MaxSize: 64 << 20})
	const size = 512 << 10
	id, err := tb.Start(Spec{Argv: []string{"sh", "-c", "echo before >&2; head -c 524288 /dev/zero | tr '\\0' x; " +
		"read a; echo warning >&2; read b; echo \" $b\""}, Stdin: StdinPipe, Begin: begin, RingBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	p := mustProcess(t, tb, id)
	waitPumped(t, p, ring.Stdout, size)
	a := attach(t, tb, id, ring.Offsets{})
	ctx := ctxT(t)
	var got [ring.NumStreams][]byte
	until := func(s ring.Stream, n int) {
		for len(got[s]) < n {
			e, err := a.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			switch e.Kind {
			case ring.Gap:
				t.Fatalf("a gap of %d bytes of %v at %d", e.Lost(), e.Stream, e.Offset)
			case ring.Data:
				got[e.Stream] = append(got[e.Stream], e.Data...)
			}
		}
	}
	until(ring.Stdout, size)
	if string(got[ring.Stdout]) != strings.Repeat("x", size) {
		t.Fatalf("got %d bytes, not the output's", len(got[ring.Stdout]))
	}
	// The other stream's line, in the log before the first line ends.
	if _, err := tb.Write(id, 0, []byte("go\n")); err != nil {
		t.Fatal(err)
	}
	until(ring.Stderr, len("before\nwarning\n"))
	dir, err := tb.cfg.Logs(id)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	for !slices.Contains(logLines(t, dir), "stderr:8") {
		select {
		case <-ctx.Done():
			t.Fatal("the stderr line never reached the log")
		case <-time.After(time.Millisecond):
		}
	}
	if _, err := tb.Write(id, 3, []byte("done\n")); err != nil {
		t.Fatal(err)
	}
	tr := read(t, a, a.Position())
	if tr.lost != (ring.Offsets{}) || string(tr.data[ring.Stdout]) != " done\n" || tr.exit == nil {
		t.Fatalf("after the line: lost %v, stdout %q, exit %v", tr.lost, tr.data[ring.Stdout], tr.exit)
	}
	<-p.Done()
	want := []string{"stderr:7", "stderr:8", fmt.Sprintf("stdout:%d", size+6)}
	if got := logLines(t, dir); !slices.Equal(got, want) {
		t.Fatalf("lines in the log %v, want %v", got, want)
	}
}

// TestLateLogWriterIsWaitedFor: a reader that needs the unfinished line
// the log writer holds waits for the writer however late it answers (not
// scheduled on a loaded machine, say), and gets every byte: bytes the
// writer holds are not lost, and are not to be reported lost. (The
// writer's own answer tells a stalled disk from a late writer.)
func TestLateLogWriterIsWaitedFor(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		logs, err := capture.OpenDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer logs.Close()
		d, err := logs.Sub("p")
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		w, err := capture.Begin(d, uuid.Must(uuid.NewV7()).String(), capture.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			w.Sink().Close()
			if err := w.Finish(t.Context()); err != nil {
				t.Error(err)
			}
		}()
		// Half a MiB without a newline through a 64 KiB ring, into the
		// writer's sink, as a pump hands it over.
		r := ring.New(ring.Config{Capacity: 64 << 10, Streams: []ring.Stream{ring.Stdout, ring.Stderr}})
		const size = 512 << 10
		for n := 0; n < size; {
			buf := r.Buffer(ring.Stdout)
			k := copy(buf, strings.Repeat("x", min(len(buf), size-n)))
			c := r.Commit(ring.Stdout, k, false)
			w.Sink().Push(c)
			c.Release()
			n += k
		}
		r.Flush()
		cur, err := r.Cursor(ring.Offsets{})
		if err != nil {
			t.Fatal(err)
		}
		a := &Attachment{cur: cur,
			log: func() (*capture.Dir, error) { return logs.OpenSub("p") },
			// The writer answers a minute late.
			caught: func(ctx context.Context) ([capture.NumLogStreams]capture.HeldLine, error) {
				select {
				case <-time.After(time.Minute):
				case <-ctx.Done():
					return [capture.NumLogStreams]capture.HeldLine{}, ctx.Err()
				}
				return w.Caught(ctx)
			}}
		defer a.Close()
		var got []byte
		for len(got) < size {
			e, err := a.Next(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			switch e.Kind {
			case ring.Gap:
				t.Fatalf("a gap of %d bytes of %v at %d", e.Lost(), e.Stream, e.Offset)
			case ring.Data:
				got = append(got, e.Data...)
			}
		}
		if string(got) != strings.Repeat("x", size) {
			t.Fatalf("got %d bytes, not the output's", len(got))
		}
	})
}

// logLines lists the lines in the log as stream:bytes, in the log's order,
// failing if a record of one stream stands between the partial records of
// a line of the other.
func logLines(t *testing.T, dir *capture.Dir) []string {
	t.Helper()
	r := capture.NewReader(dir, capture.ReadOptions{})
	defer r.Close()
	var lines []string
	var open *capture.LogStream
	n := 0
	for {
		e, err := r.Next(ctxT(t))
		if errors.Is(err, io.EOF) {
			return lines
		}
		if err != nil {
			t.Fatal(err)
		}
		if e.Stream == capture.LogMeta || e.Gap != 0 {
			continue
		}
		if open != nil && *open != e.Stream {
			t.Fatalf("a %v record %q stands among the partial records of a %v line", e.Stream, e.Content, *open)
		}
		n += len(e.Content)
		if e.Partial {
			open = &e.Stream
			continue
		}
		lines = append(lines, fmt.Sprintf("%v:%d", e.Stream, n+1))
		open, n = nil, 0
	}
}
