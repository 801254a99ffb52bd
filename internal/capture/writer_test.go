package capture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/ring"
)

const testTimeout = 60 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func newRunID() string { return uuid.Must(uuid.NewV7()).String() }

// testDir makes an empty capture directory.
func testDir(t *testing.T) (*Dir, string) {
	t.Helper()
	path := t.TempDir()
	d, err := OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, path
}

// feeder plays a process's pumps for a writer: bytes go through a real
// ring into the writer's sink, as the engine sends them. A paced feeder
// waits for room in the queue before each push, so nothing is dropped.
type feeder struct {
	r     *ring.Ring
	w     *Writer
	paced bool
}

func newFeeder(w *Writer, streams ...ring.Stream) *feeder {
	if len(streams) == 0 {
		streams = []ring.Stream{ring.Stdout, ring.Stderr}
	}
	return &feeder{r: ring.New(ring.Config{Capacity: 1 << 20, Streams: streams}), w: w}
}

// write pushes data as one or more chunks (as many as the ring's blocks
// need), and reports how many bytes the sink dropped meanwhile.
func (f *feeder) write(s ring.Stream, data []byte) {
	for len(data) > 0 {
		buf := f.r.Buffer(s)
		n := copy(buf, data)
		c := f.r.Commit(s, n, false)
		for f.paced {
			if _, used := f.w.sink.Queued(); used+int64(n)+2*itemCost <= f.w.sink.Budget() {
				break
			}
			runtime.Gosched()
		}
		f.w.Sink().Push(c)
		c.Release()
		data = data[n:]
	}
}

// end closes the sink, as the process does once its pumps have joined,
// and waits for the writer.
func (f *feeder) end(t *testing.T) Result {
	t.Helper()
	f.w.Sink().Close()
	if err := f.w.Finish(ctxT(t)); err != nil {
		t.Fatalf("finish: %v", err)
	}
	return f.w.Result()
}

func begin(t *testing.T, d *Dir, opt Options) *Writer {
	t.Helper()
	w, err := Begin(d, newRunID(), opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Sink().Close() // a no-op when the test closed it
		w.Stop()
		<-w.Done()
	})
	return w
}

func readLog(t *testing.T, d *Dir) Log {
	t.Helper()
	l, err := ReadLog(ctxT(t), d, All)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// payload rebuilds a stream's bytes from a log's records.
func payload(l Log, s LogStream) []byte {
	var b []byte
	for _, e := range l.Entries {
		if e.Gap == 0 && e.Stream == s {
			b = append(b, e.Payload()...)
		}
	}
	return b
}

func states(runs []Run) []string {
	var s []string
	for _, r := range runs {
		s = append(s, r.State.String())
	}
	return s
}

func TestShortRunBeginOutputLosslessEnd(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	w := begin(t, d, Options{})
	f := newFeeder(w)
	f.write(ring.Stdout, []byte("Starting build...\n"))
	f.write(ring.Stderr, []byte("warning: x\n"))
	f.write(ring.Stdout, []byte("done\n"))
	res := f.end(t)
	if !res.Ended || res.Err != nil || res.Dropped != [2]int64{} {
		t.Fatalf("result %+v, want ended without loss", res)
	}
	l := readLog(t, d)
	if got := string(payload(l, LogStdout)); got != "Starting build...\ndone\n" {
		t.Errorf("stdout %q", got)
	}
	if got := string(payload(l, LogStderr)); got != "warning: x\n" {
		t.Errorf("stderr %q", got)
	}
	if len(l.Runs) != 1 || l.Runs[0].State != Lossless || l.Runs[0].ID != w.Run() {
		t.Fatalf("runs %+v, want one lossless run %s", l.Runs, w.Run())
	}
	// Seed: "A matching begin and end, plus zero end.dropped, are
	// required for lossless completion." The file's header comes first,
	// then begin, the output, and the end, appended.
	var events []string
	for _, e := range l.Entries {
		if e.Stream == LogMeta {
			m, err := parseMeta(e.Content, false)
			if err != nil {
				t.Fatal(err)
			}
			events = append(events, fmt.Sprintf("%s %s", m.Event, m.Run))
		}
	}
	if diff := cmp.Diff([]string{"file " + w.Run(), "begin " + w.Run(), "end " + w.Run()}, events); diff != "" {
		t.Errorf("metadata events (-want +got):\n%s", diff)
	}
}

// record is a record's shape, for the framing table.
type record struct {
	Stream  LogStream
	Partial bool
	Len     int
}

func shapes(l Log) []record {
	var rs []record
	for _, e := range l.Entries {
		if e.Gap == 0 && e.Stream != LogMeta {
			rs = append(rs, record{e.Stream, e.Partial, len(e.Content)})
		}
	}
	return rs
}

// TestFraming: Seed, "The writer never converts payload with
// from_utf8_lossy. Content is framed at 16 KiB, with P fragments followed
// by F for a newline-terminated line. A final line without a newline
// remains a trailing P; readers do not add a newline for it."
func TestFraming(t *testing.T) {
	t.Parallel()
	const M = MaxContent
	line := func(n int) []byte { return append(bytes.Repeat([]byte{'a'}, n), '\n') }
	cases := []struct {
		name   string
		chunks [][]byte
		want   []record
	}{
		{"no trailing newline", [][]byte{[]byte("a\nbc")}, []record{{0, false, 1}, {0, true, 2}}},
		{"empty lines", [][]byte{[]byte("\n\n")}, []record{{0, false, 0}, {0, false, 0}}},
		{"below the limit", [][]byte{line(M - 1)}, []record{{0, false, M - 1}}},
		{"at the limit", [][]byte{line(M)}, []record{{0, false, M}}},
		{"above the limit", [][]byte{line(M + 1)}, []record{{0, true, M}, {0, false, 1}}},
		{"twice the limit", [][]byte{line(2 * M)}, []record{{0, true, M}, {0, false, M}}},
		{"at the limit, no newline", [][]byte{bytes.Repeat([]byte{'a'}, M)}, []record{{0, true, M}}},
		{"above the limit, no newline", [][]byte{bytes.Repeat([]byte{'a'}, M+5)}, []record{{0, true, M}, {0, true, 5}}},
		{"line split across chunks", [][]byte{[]byte("hel"), []byte("lo\n")}, []record{{0, false, 5}}},
		{"long line split across chunks", [][]byte{bytes.Repeat([]byte{'a'}, M-3), append(bytes.Repeat([]byte{'b'}, 10), '\n')},
			[]record{{0, true, M}, {0, false, 7}}},
		{"CRLF kept", [][]byte{[]byte("dos\r\n")}, []record{{0, false, 4}}},
		{"NUL and invalid UTF-8", [][]byte{[]byte("a\x00b\xff\xfe\n")}, []record{{0, false, 5}}},
		{"UTF-8 split across chunks", [][]byte{[]byte("caf\xc3"), []byte("\xa9\n")}, []record{{0, false, 5}}},
		{"lone CR", [][]byte{[]byte("50%\r75%\r")}, []record{{0, true, 8}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := testDir(t)
			gate := make(chan struct{})
			w := begin(t, d, Options{beforeLoop: func() { <-gate }})
			f := newFeeder(w)
			var want []byte
			for _, c := range tc.chunks {
				f.write(ring.Stdout, c)
				want = append(want, c...)
			}
			close(gate)
			f.end(t)
			l := readLog(t, d)
			if got := payload(l, LogStdout); !bytes.Equal(got, want) {
				t.Errorf("payload %q, want %q", clip(got), clip(want))
			}
			// The chunks were all queued before the writer took the first,
			// so they are framed as one batch: a line is cut only where the
			// format says.
			if diff := cmp.Diff(tc.want, shapes(l)); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			if len(l.Runs) != 1 || l.Runs[0].State != Lossless {
				t.Errorf("runs %+v", l.Runs)
			}
		})
	}
}

// TestQueueOverflowEndCountsTheWholeRun: Seed, "Capture channel overflow:
// end.dropped equals full-run loss, not only the final pending delta", and
// "The writer reads total_dropped from shared Arc<AtomicU64> values when it
// writes end."
func TestQueueOverflowEndCountsTheWholeRun(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	gate := make(chan struct{})
	// Room for one item of four lines.
	w := begin(t, d, Options{QueueBytes: itemCost + 4*int64(len("line 0\n")), beforeLoop: func() { <-gate }})
	f := newFeeder(w)
	// The writer is held: four lines fit, the rest are dropped.
	for i := range 10 {
		f.write(ring.Stdout, fmt.Appendf(nil, "line %d\n", i))
	}
	close(gate)
	res := f.end(t)
	want := w.Sink().Dropped()[ring.Stdout]
	if want == 0 {
		t.Fatal("nothing was dropped; the test did not overflow the queue")
	}
	if res.Dropped[LogStdout] != want {
		t.Errorf("end dropped %d, sink counted %d", res.Dropped[LogStdout], want)
	}
	l := readLog(t, d)
	if len(l.Runs) != 1 || l.Runs[0].State != Lossy || l.Runs[0].Dropped[LogStdout] != want {
		t.Fatalf("runs %+v, want one lossy run with %d stdout bytes dropped", l.Runs, want)
	}
	if got := int64(len(payload(l, LogStdout))); got+want != int64(len("line 0\n")*10) {
		t.Errorf("persisted %d + dropped %d != written %d", got, want, len("line 0\n")*10)
	}
}

// TestStuckWriterDropsExactly: while the writer cannot write, pushing never
// waits, and what the end record reports dropped is exactly what was
// written and not persisted.
func TestStuckWriterDropsExactly(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	stuck := make(chan struct{})
	first := true
	w := begin(t, d, Options{QueueBytes: 4 << 10, beforeWrite: func() {
		if first { // begin's own write goes through
			first = false
			return
		}
		<-stuck
	}})
	f := newFeeder(w)
	written := 0
	for i := range 5000 {
		b := fmt.Appendf(nil, "%06d %s\n", i, strings.Repeat("x", i%300))
		f.write(ring.Stdout, b)
		f.write(ring.Stderr, b[:len(b)/2])
		written += len(b) + len(b)/2
	}
	close(stuck)
	res := f.end(t)
	l := readLog(t, d)
	persisted := len(payload(l, LogStdout)) + len(payload(l, LogStderr))
	dropped := res.Dropped[LogStdout] + res.Dropped[LogStderr]
	if dropped == 0 {
		t.Fatal("nothing dropped: the writer was not stuck")
	}
	if int64(written)-int64(persisted) != dropped {
		t.Errorf("written %d - persisted %d = %d, end says %d dropped", written, persisted, written-persisted, dropped)
	}
	if len(l.Runs) != 1 || l.Runs[0].State != Lossy || l.Runs[0].Dropped != res.Dropped {
		t.Fatalf("runs %+v", l.Runs)
	}
}

// TestWriterStoppedLeavesNoEnd: a writer that cannot finish in time is
// stopped; it writes nothing afterwards and the run reads as interrupted.
func TestWriterStoppedLeavesNoEnd(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	stuck := make(chan struct{})
	inWrite := make(chan struct{}, 1)
	first := true
	w := begin(t, d, Options{beforeWrite: func() {
		if first {
			first = false
			return
		}
		inWrite <- struct{}{}
		<-stuck
	}})
	f := newFeeder(w)
	f.write(ring.Stdout, []byte("some output\n"))
	<-inWrite
	w.Sink().Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := w.Finish(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("finish: %v, want ErrStopped", err)
	}
	before, err := os.ReadFile(filepath.Join(path, ActiveName))
	if err != nil {
		t.Fatal(err)
	}
	close(stuck)
	<-w.Done()
	after, err := os.ReadFile(filepath.Join(path, ActiveName))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("the log changed after Finish returned:\n%s", after[len(before):])
	}
	if res := w.Result(); res.Ended || !errors.Is(res.Err, ErrStopped) {
		t.Errorf("result %+v, want not ended, ErrStopped", res)
	}
	l := readLog(t, d)
	if len(l.Runs) != 1 || l.Runs[0].State != Interrupted {
		t.Fatalf("runs %v, want one interrupted", states(l.Runs))
	}
}

// TestStartRefused: Seed, "Invalid run UUID, symlinked log path, or
// read-only share: Init fails before Start and does not write an unsafe
// target", and "opens the final file with O_NOFOLLOW".
func TestStartRefused(t *testing.T) {
	t.Parallel()
	t.Run("invalid run id", func(t *testing.T) {
		d, path := testDir(t)
		for _, id := range []string{"", "x", uuid.Nil.String(), strings.ToUpper(newRunID()), "{" + newRunID() + "}", "urn:uuid:" + newRunID(), newRunID() + "\n"} {
			if _, err := Begin(d, id, Options{}); err == nil {
				t.Errorf("run id %q accepted", id)
			}
		}
		if ents, _ := os.ReadDir(path); len(ents) != 0 {
			t.Errorf("refused starts left %v", ents)
		}
	})
	t.Run("symlinked log", func(t *testing.T) {
		d, path := testDir(t)
		target := filepath.Join(t.TempDir(), "elsewhere")
		if err := os.WriteFile(target, []byte("precious\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(path, ActiveName)); err != nil {
			t.Fatal(err)
		}
		if _, err := Begin(d, newRunID(), Options{}); err == nil {
			t.Fatal("began through a symlinked log")
		}
		if b, _ := os.ReadFile(target); string(b) != "precious\n" {
			t.Errorf("the link's target was written: %q", b)
		}
	})
	t.Run("symlinked directory", func(t *testing.T) {
		real := t.TempDir()
		link := filepath.Join(t.TempDir(), "logs")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		if d, err := OpenDir(link); err == nil {
			d.Close()
			t.Fatal("opened a symlinked directory")
		}
	})
	t.Run("fifo as log", func(t *testing.T) {
		d, path := testDir(t)
		if err := unix.Mkfifo(filepath.Join(path, ActiveName), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Begin(d, newRunID(), Options{}); err == nil {
			t.Fatal("began on a FIFO")
		}
	})
	t.Run("read-only directory", func(t *testing.T) {
		path := readOnlyDir(t)
		d, err := OpenDir(path)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if _, err := Begin(d, newRunID(), Options{}); err == nil {
			t.Fatal("began in a read-only directory")
		}
	})
}

// readOnlyDir returns a directory nobody may write: a read-only tmpfs when
// running as root (root writes through mode bits), else mode 0555.
func readOnlyDir(t *testing.T) string {
	t.Helper()
	path := t.TempDir()
	if os.Geteuid() != 0 {
		if err := os.Chmod(path, 0o555); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(path, 0o755) })
		return path
	}
	if err := unix.Mount("tmpfs", path, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "size=64k"); err != nil {
		t.Skipf("cannot mount a read-only tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(path, unix.MNT_DETACH) })
	return path
}

// smallFS returns a tmpfs of size bytes (root only).
func smallFS(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	path := t.TempDir()
	if err := unix.Mount("tmpfs", path, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(path, unix.MNT_DETACH) })
	return path
}

// TestFullDiskEndIsExactAndLossy: the file system fills up mid-run. The
// writer keeps taking chunks, counts what it cannot persist, and the end
// record (written into the space it reserved) says exactly how much.
func TestFullDiskEndIsExactAndLossy(t *testing.T) {
	t.Parallel()
	path := smallFS(t, 256<<10)
	d, err := OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	w := begin(t, d, Options{MaxSize: 1 << 20})
	f := newFeeder(w)
	written := 0
	for i := range 20000 {
		b := fmt.Appendf(nil, "%06d %s\n", i, strings.Repeat("y", 60))
		f.write(ring.Stdout, b)
		written += len(b)
	}
	w.Sink().Close()
	<-w.Done()
	res := w.Result()
	if !res.Ended {
		t.Fatalf("no end record: %+v", res)
	}
	if res.Err == nil || !errors.Is(res.Err, unix.ENOSPC) {
		t.Errorf("writer error %v, want ENOSPC", res.Err)
	}
	l := readLog(t, d)
	persisted := len(payload(l, LogStdout))
	if persisted == 0 || persisted >= written {
		t.Fatalf("persisted %d of %d: the disk did not fill", persisted, written)
	}
	if int64(written-persisted) != res.Dropped[LogStdout] {
		t.Errorf("written %d - persisted %d = %d, end says %d", written, persisted, written-persisted, res.Dropped[LogStdout])
	}
	if len(l.Runs) != 1 || l.Runs[0].State != Lossy || l.Runs[0].Dropped != res.Dropped {
		t.Fatalf("runs %+v", l.Runs)
	}
	// A write the disk cut short may leave part of a record at the end of
	// a file: the writer goes on in a new file, never writing over it, so
	// that line is the last of its file, torn, and nothing is corrupt.
	if l.Stats.Corrupt != 0 || l.Stats.Torn > 1 {
		t.Errorf("the full disk left broken lines: %+v", l.Stats)
	}
	// The lines after the loss stand at their own offsets: line n at n
	// lines of 68 bytes.
	for _, e := range l.Entries {
		if e.Stream != LogStdout {
			continue
		}
		var n int64
		if _, err := fmt.Sscanf(string(e.Content), "%06d", &n); err != nil || e.Offset != n*68 {
			t.Fatalf("record %q at offset %d, want %d", clip(e.Content), e.Offset, n*68)
		}
	}
}

// TestFailedRotationRecovers: a rotation that fails after linking the
// archive (here the next file cannot be created) leaves the writer able
// to rotate once the cause is gone, and every byte is in the log or
// counted.
func TestFailedRotationRecovers(t *testing.T) {
	t.Parallel()
	d, path := testDir(t)
	opt := Options{MaxSize: 4096, MaxFiles: 3, retry: time.Millisecond}
	w := begin(t, d, opt)
	blocker := filepath.Join(path, tempName)
	if err := os.Mkdir(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	f := newFeeder(w)
	f.paced = true
	written, i := 0, 0
	line := func() {
		b := fmt.Appendf(nil, "%05d %s\n", i, strings.Repeat("r", 90))
		f.write(ring.Stdout, b)
		written += len(b)
		i++
	}
	for w.Result().Err == nil {
		line()
	}
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	// Lines go on until the writer has retried and rotated past the
	// files kept: the lines it took while it still failed are lost.
	for range 400 {
		line()
	}
	for n := 0; n < 1e6; n++ {
		// Names only: the writer prunes files meanwhile.
		if names, _ := filepath.Glob(filepath.Join(path, ActiveName+"*")); len(names) == opt.MaxFiles {
			break
		}
		line()
	}
	for range 100 {
		line()
	}
	w.Sink().Close()
	<-w.Done()
	res := w.Result()
	if !res.Ended || !errors.Is(res.Err, unix.EEXIST) {
		t.Fatalf("result %+v, want ended after the rotation's EEXIST", res)
	}
	_, files := dirSize(t, path)
	if files != opt.MaxFiles {
		t.Errorf("%d files, want %d: rotation did not resume", files, opt.MaxFiles)
	}
	l := readLog(t, d)
	persisted := int64(len(payload(l, LogStdout)))
	if l.Stats.Before == 0 {
		t.Fatal("nothing was rotated away")
	}
	// What was rotated away is neither persisted here nor dropped: count
	// the rest. Every line still in the log is whole and in order.
	ns := lineNumbers(t, payload(l, LogStdout), "")
	if !slices.IsSorted(ns) || ns[len(ns)-1] != i-1 {
		t.Errorf("lines %v… %v", ns[:3], ns[len(ns)-3:])
	}
	if res.Dropped[LogStdout] == 0 || persisted == 0 {
		t.Errorf("dropped %d, persisted %d", res.Dropped[LogStdout], persisted)
	}
	if l.Stats.Corrupt != 0 || l.Stats.Torn != 0 {
		t.Errorf("stats %+v", l.Stats)
	}
}

// TestUnfinishedLineWaitsForItsNewline: a line without its newline yet is
// held, as a container runtime holds it, so that a record of the other
// stream never follows a partial one; a reader that waits for the log to
// hold everything (Caught) is given a copy of it, at its offset, instead.
func TestUnfinishedLineWaitsForItsNewline(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	w := begin(t, d, Options{})
	f := newFeeder(w)
	f.write(ring.Stdout, []byte("progress 50%"))
	f.write(ring.Stderr, []byte("a warning\n"))
	ctx := ctxT(t)
	for len(payload(readLog(t, d), LogStderr)) == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the stderr line never reached the log")
		case <-time.After(time.Millisecond):
		}
	}
	if got := payload(readLog(t, d), LogStdout); len(got) != 0 {
		t.Fatalf("the unfinished line was written: %q", got)
	}
	held, err := w.Caught(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := payload(readLog(t, d), LogStdout); len(got) != 0 {
		t.Fatalf("after Caught, the unfinished line was written: %q", got)
	}
	if h := held[LogStdout]; h.Offset != 0 || string(h.Data) != "progress 50%" || len(held[LogStderr].Data) != 0 {
		t.Fatalf("Caught gave the held lines %+v", held)
	}
	f.write(ring.Stdout, []byte(" at 75%"))
	f.write(ring.Stderr, []byte("and its "))
	if held, err = w.Caught(ctx); err != nil {
		t.Fatal(err)
	}
	if h := held[LogStdout]; h.Offset != 0 || string(h.Data) != "progress 50% at 75%" {
		t.Fatalf("Caught gave stdout's held line %+v", h)
	}
	if h := held[LogStderr]; h.Offset != int64(len("a warning\n")) || string(h.Data) != "and its " {
		t.Fatalf("Caught gave stderr's held line %+v", h)
	}
	f.write(ring.Stderr, []byte("end\n"))
	f.write(ring.Stdout, []byte(" done\n"))
	f.end(t)
	l := readLog(t, d)
	if got := string(payload(l, LogStdout)); got != "progress 50% at 75% done\n" || len(l.Runs) != 1 || l.Runs[0].State != Lossless {
		t.Fatalf("stdout %q, runs %+v", got, l.Runs)
	}
}

// TestCaughtWaitsForALateWriter: a reader in Caught waits for a writer
// that is late without being stuck in its file system (its goroutine not
// run for a minute, as on a machine too loaded to schedule it), and is
// given what it holds: the bytes of a late writer are not lost, and no
// reader may be told they were.
func TestCaughtWaitsForALateWriter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, _ := testDir(t)
		gate := make(chan struct{})
		w := begin(t, d, Options{beforeLoop: func() { <-gate }})
		f := newFeeder(w)
		f.write(ring.Stdout, []byte("progress 50%"))
		go func() {
			time.Sleep(time.Minute)
			close(gate)
		}()
		start := time.Now()
		held, err := w.Caught(t.Context())
		if err != nil {
			t.Fatalf("Caught gave up on a late writer after %v: %v", time.Since(start), err)
		}
		if waited := time.Since(start); waited != time.Minute {
			t.Fatalf("Caught returned after %v, the writer came after a minute", waited)
		}
		if h := held[LogStdout]; h.Offset != 0 || string(h.Data) != "progress 50%" {
			t.Fatalf("Caught gave stdout's held line %+v", h)
		}
		f.end(t)
	})
}

// TestCaughtWaitsThroughSlowWrites: writes that each take a while, and
// together longer than a stall, are a slow disk, not a stalled one: a
// reader in Caught waits for all of them.
func TestCaughtWaitsThroughSlowWrites(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, _ := testDir(t)
		gate := make(chan struct{})
		var slow atomic.Bool
		var writes atomic.Int32
		w := begin(t, d, Options{
			beforeLoop: func() { <-gate },
			beforeWrite: func() {
				if slow.Load() {
					writes.Add(1)
					time.Sleep(stallAfter * 3 / 5)
				}
			}})
		slow.Store(true)
		f := newFeeder(w)
		line := append(bytes.Repeat([]byte{'x'}, 1023), '\n')
		for range 1024 {
			f.write(ring.Stdout, line)
		}
		close(gate)
		start := time.Now()
		if _, err := w.Caught(t.Context()); err != nil {
			t.Fatalf("Caught gave up after %v and %d writes: %v", time.Since(start), writes.Load(), err)
		}
		if waited := time.Since(start); waited <= stallAfter || writes.Load() < 3 {
			t.Fatalf("Caught returned after %v and %d writes: the test wants slow writes that take longer than a stall", waited, writes.Load())
		}
		f.end(t)
		if got := len(payload(readLog(t, d), LogStdout)); got != 1024*len(line) {
			t.Fatalf("the log holds %d bytes of stdout, want %d", got, 1024*len(line))
		}
	})
}

// TestCaughtGivesUpOnAStalledDisk: a writer inside one write for
// stallAfter has a disk that does not answer; a reader in Caught is told
// so then (and reports a gap rather than no answer), and the writer goes
// on once the disk answers.
func TestCaughtGivesUpOnAStalledDisk(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		d, _ := testDir(t)
		stall := make(chan struct{})
		answer := sync.OnceFunc(func() { close(stall) })
		defer answer() // the writer is not left inside its write
		var stalling atomic.Bool
		w := begin(t, d, Options{beforeWrite: func() {
			if stalling.Load() {
				<-stall
			}
		}})
		stalling.Store(true)
		f := newFeeder(w)
		f.write(ring.Stdout, []byte("a line\n"))
		synctest.Wait() // the writer is inside its write
		time.Sleep(time.Second)
		start := time.Now()
		_, err := w.Caught(t.Context())
		if !errors.Is(err, ErrStalled) {
			t.Fatalf("Caught: %v, want ErrStalled", err)
		}
		if waited := time.Since(start); waited != stallAfter-time.Second {
			t.Fatalf("Caught gave up after %v, %v into the write", waited, waited+time.Second)
		}
		answer()
		f.end(t)
		if got := string(payload(readLog(t, d), LogStdout)); got != "a line\n" {
			t.Fatalf("stdout in the log %q", got)
		}
	})
}

// TestLongLineRecordsStayTogether: a line longer than a record, arriving
// in pieces with the other stream's lines between them, is written as its
// partial records one after the other once it ends, the other stream's
// lines before it: no reader that joins partial records joins the wrong
// ones.
func TestLongLineRecordsStayTogether(t *testing.T) {
	t.Parallel()
	d, _ := testDir(t)
	gate := make(chan struct{})
	w := begin(t, d, Options{beforeLoop: func() { <-gate }})
	f := newFeeder(w)
	long := bytes.Repeat([]byte{'L'}, 40000)
	f.write(ring.Stdout, long[:10000])
	f.write(ring.Stderr, []byte("err 1\n"))
	f.write(ring.Stdout, long[10000:30000])
	f.write(ring.Stderr, []byte("err 2\n"))
	f.write(ring.Stdout, append(long[30000:], '\n'))
	close(gate)
	f.end(t)
	want := []record{{LogStderr, false, 5}, {LogStderr, false, 5}, {LogStdout, true, MaxContent}, {LogStdout, true, MaxContent}, {LogStdout, false, 40000 - 2*MaxContent}}
	if diff := cmp.Diff(want, shapes(readLog(t, d))); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
}
