package capture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// Options configure a Writer. The zero value means the defaults.
type Options struct {
	// MaxSize is the size at which the active file is rotated
	// (default 10 MiB). A file exceeds it only by holding a single record
	// larger than MaxSize, or by its run's end record.
	MaxSize int64
	// MaxFiles is how many files are kept, the active one included
	// (default 5, at least 2). Disk use per process is bounded by
	// MaxSize × MaxFiles.
	MaxFiles int
	// QueueBytes bounds the output queued between the pumps and the
	// writer (default 8 MiB, at least MinQueueBytes): a burst up to this
	// size is captured whole however briefly the writer falls behind.
	// It is a ceiling, not an allocation.
	QueueBytes int64
	// Reserve is disk space set aside beside the log so that the run's last
	// records still fit when the file system fills up (default 64 KiB).
	Reserve int64

	// beforeWrite, when set, runs before each write to the log file, and
	// beforeLoop before the writer takes its first item; tests use them to
	// stall the writer.
	beforeWrite func()
	beforeLoop  func()
	retry       time.Duration // retryEvery, for tests
}

// Defaults for Options.
const (
	DefaultMaxSize    = 10 << 20
	DefaultMaxFiles   = 5
	DefaultQueueBytes = 8 << 20
	DefaultReserve    = 64 << 10
)

func (o Options) withDefaults() (Options, error) {
	if o.MaxSize == 0 {
		o.MaxSize = DefaultMaxSize
	}
	if o.MaxFiles == 0 {
		o.MaxFiles = DefaultMaxFiles
	}
	if o.QueueBytes == 0 {
		o.QueueBytes = DefaultQueueBytes
	}
	if o.Reserve == 0 {
		o.Reserve = DefaultReserve
	}
	switch {
	case o.MaxSize < 1024:
		return o, fmt.Errorf("capture: max file size %d, want at least 1 KiB", o.MaxSize)
	case o.MaxFiles < 2:
		return o, fmt.Errorf("capture: max files %d, want at least 2 (the active file and one archive)", o.MaxFiles)
	case o.QueueBytes < MinQueueBytes:
		return o, fmt.Errorf("capture: queue of %d bytes, want at least %d", o.QueueBytes, MinQueueBytes)
	case o.Reserve < 4096:
		return o, fmt.Errorf("capture: reserve of %d bytes, want at least 4 KiB", o.Reserve)
	}
	return o, nil
}

// maxHeldLine bounds what the writer holds of a line whose newline has not
// come: up to it, a long line's records are all written when it ends, one
// after the other, with no record of the other stream between them.
const maxHeldLine = 1 << 20

// batchSize is how many encoded bytes the writer gathers before a write.
const batchSize = 256 << 10

// retryEvery is how often a writer whose file system failed checks
// whether space has come back.
const retryEvery = time.Second

// ErrStopped reports a writer stopped before it could finish its run.
var ErrStopped = errdefs.New(errdefs.ErrFailedPrecondition, "capture: writer stopped before the end of the run")

// stallAfter is how long the writer may stay inside one call to the file
// system before a reader waiting in Caught gives up on it: the disk does
// not answer (a hung mount, a failing device), and the reader is better
// served a gap, exactly counted, than no answer. A writer that is only
// late (waiting for a CPU on a loaded machine, working through a burst)
// is waited for, however long: what it holds is not lost, and a reader
// must not be told it was.
const stallAfter = 5 * time.Second

// ErrStalled reports that Caught gave up on a writer stuck in one call to
// the file system for stallAfter.
var ErrStalled = errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("capture: the log's file system has not answered the writer for %v", stallAfter))

// Writer writes one process's captured output to the CRI log of its
// directory. It receives chunks only through its Sink, from the process's
// pumps, and is the only writer of the directory.
//
// A run begins with Begin, which starts a new file with its header and
// the run's begin record and makes it durable before it returns: start
// the process only after that. The process's owner closes the Sink once
// every pump has returned; the writer then writes what is queued and the
// trailing fragments, appends the end record with the run's exact loss,
// and finishes. Finish waits for that, bounded, and on timeout stops the
// writer, leaving the run without its end: "interrupted".
//
// Every file is only ever appended to: a byte once written is never
// written again, cut or moved (a rename moves a name, not bytes). A file
// begins with its header, complete before the file gets its name, so a
// tailer that knows a file by its first bytes knows it for good.
//
// A process whose memory is about to be saved (a memory snapshot) has its
// writer held (Hold) at where its output stands: what comes after waits
// in the queue until the owner says how the run goes on. In the sandbox
// that goes on, it goes on (Release); in each one restored from the
// snapshot, the writer is a copy, and the owner has it continue in a new
// run (Continue), whose begin names the run and where it stood; a writer
// nobody tells within HoldTimeout continues so by itself.
type Writer struct {
	dir  *Dir
	opt  Options
	sink *Sink
	done chan struct{}
	// stopping is closed by Stop: a writer held gives up waiting.
	stopping chan struct{}
	stopOnce sync.Once

	// run is the run being written, and parent the one it continues, if
	// any; only the writer goroutine changes them, under mu.
	run, parent string
	// base is, per stream, what the sink and the writer had lost before
	// the run began: a run that continues another counts its own loss.
	base [NumLogStreams]int64

	// Owned by the writer goroutine (and by Begin before it starts).
	out      []byte
	outBytes [NumLogStreams]int64     // payload bytes in out, per stream
	outDrops [NumLogStreams]int64     // bytes the drop records in out describe
	ts       []byte                   // the records' timestamp
	stamped  int64                    // ts in Unix nanoseconds
	hdr      [NumLogStreams][2][]byte // record headers with ts: F, then P
	size     int64                    // bytes in the active file
	headLen  int64                    // of which its header (and begin record)
	seq      int64                    // the active file's sequence number
	offset   int64                    // log bytes in every file before the active one
	archives []int64                  // the archives' sequence numbers, rising
	partial  [NumLogStreams][]byte
	// torn says a failed write left part of a record at the end of the
	// active file: the writer writes nothing more to it, and the next
	// record goes to a new file, so that the torn line stays a file's last.
	torn bool
	// pos is where each stream stands in what the files hold: its payload
	// bytes and the bytes drop records describe. A header records it, so
	// a reader knows every record's stream offset.
	pos [NumLogStreams]int64
	// lost counts the bytes the writer failed to persist; unsaid, the
	// bytes lost (by the queue or the writer) that no drop record has
	// described yet. A stream's next record waits for its drop record.
	lost     [NumLogStreams]int64
	unsaid   [NumLogStreams]int64
	failed   bool // the file system failed; data is counted, not written
	retryAt  time.Time
	reserved bool // the reserve file holds its space

	// epoch is when Begin made the writer. inFS is when the call to the
	// file system the writer is in began, in nanoseconds since epoch plus
	// one; 0 when it is in none. Caught gives up on a writer stuck in one.
	epoch time.Time
	inFS  atomic.Int64

	mu        sync.Mutex // guards f, stopped, result, heldLines, holding and the run's id
	f         *os.File
	stopped   bool
	result    Result
	heldLines [NumLogStreams]HeldLine // for Caught: what partial held at its flush
	holding   *hold                   // the writer's hold, until its owner ends it
}

// Result is what a finished (or stopped) writer reports.
type Result struct {
	// Ended is set once the end record was written and synced.
	Ended bool
	// Dropped is, per log stream, every byte of the process's output that
	// is not in the log: lost in the queue or by a failed write (the end
	// record of a run that continues another counts the run's own). Final
	// once Ended.
	Dropped [NumLogStreams]int64
	// Err is the first error the writer met, if any.
	Err error
}

// logStream maps an engine stream to its stream in the log.
func logStream(s ring.Stream) LogStream {
	if s == ring.Stderr {
		return LogStderr
	}
	return LogStdout
}

// Begin starts a run in dir: it sets the active file of an earlier run
// aside as an archive (cleaning up after an interrupted rotation), makes
// a new active file (never through a symbolic link) that holds its header
// naming run and the run's begin record, syncs it, and only then returns a
// writer whose goroutine is waiting on its sink. Any failure fails Begin,
// and nothing is started.
func Begin(dir *Dir, run string, opt Options) (*Writer, error) {
	if err := checkRunID(run); err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	opt, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	w := &Writer{dir: dir, run: run, opt: opt, done: make(chan struct{}), stopping: make(chan struct{}), epoch: time.Now()}
	if err := w.open(); err != nil {
		if w.f != nil {
			w.f.Close()
		}
		return nil, fmt.Errorf("capture: begin run %s in %s: %w", run, dir.Name(), err)
	}
	w.sink = NewSink(opt.QueueBytes)
	go w.loop()
	return w, nil
}

// open does Begin's work on the file system.
func (w *Writer) open() error {
	d := w.dir
	if err := d.remove(tempName); err != nil {
		return err
	}
	var err error
	if w.archives, err = d.archives(); err != nil {
		return err
	}
	if err := w.openActive(); err != nil {
		return err
	}
	if err := w.prune(); err != nil {
		return err
	}
	if err := w.reserve(); err != nil {
		return err
	}
	if err := w.f.Sync(); err != nil {
		return err
	}
	return d.sync()
}

// openActive makes the run's first file the active one. Every run has
// files of its own, so that each file's header names the one run it
// holds. The active file of an earlier run is kept as its
// archive (a writer killed inside a record left it torn: the reader
// counts that line). A rotation interrupted after linking the active file
// as its archive leaves nothing to keep; a file this package did not
// write is kept as an archive, untouched.
func (w *Writer) openActive() error {
	last := int64(0)
	if n := len(w.archives); n > 0 {
		last = w.archives[n-1]
	}
	f, err := w.dir.open(ActiveName, unix.O_RDONLY, 0)
	if errors.Is(err, unix.ENOENT) {
		return w.create(last+1, true)
	}
	if err != nil {
		return err
	}
	h, _, herr := readHeader(f)
	f.Close()
	switch {
	case herr == nil && h.Seq == last:
		return w.create(last+1, true)
	case herr == nil && h.Seq > last:
		if err := w.dir.link(ActiveName, archiveName(h.Seq)); err != nil {
			return err
		}
		w.archives = append(w.archives, h.Seq)
		return w.create(h.Seq+1, true)
	}
	if err := w.dir.rename(ActiveName, archiveName(last+1)); err != nil {
		return err
	}
	w.archives = append(w.archives, last+1)
	return w.create(last+2, true)
}

// create makes file seq the active file: it is built under a temporary
// name with its header (and, for the run's first file, the begin record)
// and renamed over the active name, so the active name always holds a file
// that begins with its header, and a file's first bytes never change. The
// old active file, if any, must already be linked as its archive.
func (w *Writer) create(seq int64, began bool) error {
	offset := w.offset + w.size
	if w.f == nil && len(w.archives) > 0 {
		// The first file of this writer: continue from the newest archive.
		var err error
		if offset, err = w.endOf(w.archives[len(w.archives)-1]); err != nil {
			return err
		}
	}
	if w.stoppedNow() {
		return ErrStopped
	}
	f, err := w.dir.openAs(tempName, ActiveName, unix.O_RDWR|unix.O_APPEND|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	ts := appendTime(nil, time.Now())
	hdr := appendMeta(nil, ts, Meta{Event: eventFile, Seq: seq, Offset: offset, Run: w.run,
		At: &Positions{Stdout: w.pos[LogStdout], Stderr: w.pos[LogStderr]}})
	if began {
		m := Meta{Event: eventBegin, Run: w.run}
		if w.parent != "" {
			m.Parent, m.At = w.parent, &Positions{Stdout: w.pos[LogStdout], Stderr: w.pos[LogStderr]}
		}
		hdr = appendMeta(hdr, ts, m)
	}
	if w.opt.beforeWrite != nil {
		w.opt.beforeWrite()
	}
	if _, err := f.Write(hdr); err != nil {
		f.Close()
		w.dir.remove(tempName)
		return err
	}
	if w.stoppedNow() {
		f.Close()
		w.dir.remove(tempName)
		return ErrStopped
	}
	if err := w.dir.rename(tempName, ActiveName); err != nil {
		f.Close()
		w.dir.remove(tempName)
		return err
	}
	w.mu.Lock()
	old, stopped := w.f, w.stopped
	w.f = f
	w.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if stopped {
		f.Close()
		return ErrStopped
	}
	w.seq, w.offset, w.size, w.headLen, w.torn = seq, offset, int64(len(hdr)), int64(len(hdr)), false
	return nil
}

// endOf returns the log offset at which archive seq ends, or 0 when its
// header cannot be read: the offsets restart, and readers see files whose
// offsets do not chain as a gap of unknown size rather than a false count.
func (w *Writer) endOf(seq int64) (int64, error) {
	f, err := w.dir.open(archiveName(seq), unix.O_RDONLY, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h, size, err := readHeader(f)
	if err != nil {
		return 0, nil
	}
	return h.Offset + size, nil
}

// readHeader reads a log file's first record, which must be a file record
// (of this format or an earlier one), and returns it with the file's size.
func readHeader(f *os.File) (Meta, int64, error) {
	st, err := f.Stat()
	if err != nil {
		return Meta{}, 0, err
	}
	buf := make([]byte, maxLine+64+1)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Meta{}, 0, err
	}
	line, _, ok := bytes.Cut(buf[:n], []byte{'\n'})
	if !ok {
		return Meta{}, st.Size(), errors.New("no header")
	}
	r, tagged, err := parseLine(line)
	if err != nil || r.Stream != LogMeta {
		return Meta{}, st.Size(), errors.New("no header")
	}
	m, err := parseMeta(r.Content, tagged)
	if err != nil || m.Event != eventFile {
		return Meta{}, st.Size(), errors.New("no header")
	}
	return m, st.Size(), nil
}

// prune removes the oldest archives beyond the count kept.
func (w *Writer) prune() error {
	for len(w.archives) > w.opt.MaxFiles-1 {
		if w.stoppedNow() {
			return ErrStopped
		}
		if err := w.dir.remove(archiveName(w.archives[0])); err != nil {
			return err
		}
		w.archives = w.archives[1:]
	}
	return nil
}

// reserve sets aside space for the run's last records.
func (w *Writer) reserve() error {
	w.enterFS()
	defer w.leaveFS()
	f, err := w.dir.open(reserveName, unix.O_RDWR|unix.O_CREAT, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, w.opt.Reserve); err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("reserve %d bytes: %w", w.opt.Reserve, err)
		}
		// No fallocate here: write the space out instead.
		if _, err := f.WriteAt(make([]byte, w.opt.Reserve), 0); err != nil {
			return fmt.Errorf("reserve %d bytes: %w", w.opt.Reserve, err)
		}
	}
	w.reserved = true
	return nil
}

// release gives the reserve back to the file system.
func (w *Writer) release() {
	if w.reserved && !w.stoppedNow() {
		w.enterFS()
		w.dir.remove(reserveName)
		w.leaveFS()
		w.reserved = false
	}
}

// stamp takes the time for the records that follow, and their headers.
func (w *Writer) stamp() { w.stampAt(time.Now().UnixNano()) }

// stampAt makes at (Unix nanoseconds) the time of the records that follow.
func (w *Writer) stampAt(at int64) {
	if at == w.stamped && w.ts != nil {
		return
	}
	w.stamped = at
	w.ts = appendTime(w.ts[:0], time.Unix(0, at))
	for s := range LogStream(NumLogStreams) {
		for i, tag := range []string{" F ", " P "} {
			h := append(w.hdr[s][i][:0], w.ts...)
			h = append(h, ' ')
			h = append(h, logStreamNames[s]...)
			w.hdr[s][i] = append(h, tag...)
		}
	}
}

// Sink is where the process's pumps push their chunks.
func (w *Writer) Sink() *Sink { return w.sink }

// Run is the id of the run being written.
func (w *Writer) Run() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.run
}

// Done is closed when the writer has finished or been stopped.
func (w *Writer) Done() <-chan struct{} { return w.done }

// HeldLine is what the writer holds of a stream's unfinished line, which is
// not in the log until its newline comes, it outgrows a record, or the
// run ends.
type HeldLine struct {
	Offset int64  // where it starts in its stream
	Data   []byte // the reader's own copy
}

// Caught waits, bounded by ctx, until everything the pumps pushed before
// the call is in the log, counted lost, or in the held lines it returns: a
// reader of the log then finds there, and after the log's end in the held
// lines, what the engine no longer holds. It returns at once once the
// writer has finished, without held lines: the log then holds every line.
//
// A writer that is late is waited for, however late: the bytes it holds
// are not lost. Only a writer that has been inside one call to the file
// system for stallAfter (its disk does not answer) is given up on, with
// ErrStalled.
func (w *Writer) Caught(ctx context.Context) ([NumLogStreams]HeldLine, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go w.watchStall(ctx, cancel)
	if err := w.sink.Caught(ctx, w.done); err != nil {
		return [NumLogStreams]HeldLine{}, context.Cause(ctx)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.heldLines, nil
}

// watchStall cancels ctx with ErrStalled once the writer has been inside
// one call to the file system for stallAfter, and returns when ctx ends.
func (w *Writer) watchStall(ctx context.Context, cancel context.CancelCauseFunc) {
	for {
		wait := stallAfter
		if at := w.inFS.Load(); at != 0 {
			wait -= time.Since(w.epoch) - time.Duration(at-1)
		}
		if wait <= 0 {
			cancel(ErrStalled)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// enterFS marks the writer as inside a call to the file system, until
// leaveFS: a reader in Caught gives up on a writer that stays there.
func (w *Writer) enterFS() { w.inFS.Store(int64(time.Since(w.epoch)) + 1) }

func (w *Writer) leaveFS() { w.inFS.Store(0) }

// Result reports the run's outcome; it is final once Done is closed.
func (w *Writer) Result() Result {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.result
}

// Finish waits for the writer to finish the run after its sink was closed.
// If ctx ends first it stops the writer, which then writes nothing more,
// and returns ErrStopped: the run stays without an end record. It returns
// the writer's first error otherwise.
func (w *Writer) Finish(ctx context.Context) error {
	select {
	case <-w.done:
		return w.Result().Err
	case <-ctx.Done():
		w.Stop()
		return ErrStopped
	}
}

// Stop makes the writer write nothing more. A write already inside the
// kernel completes; every later one fails. Safe to call at any time and
// more than once.
func (w *Writer) Stop() {
	w.stopOnce.Do(func() { close(w.stopping) })
	w.mu.Lock()
	f := w.f
	w.stopped = true
	if w.result.Err == nil && !w.result.Ended {
		w.result.Err = ErrStopped
	}
	w.mu.Unlock()
	if f != nil {
		f.Close()
	}
}

func (w *Writer) fail(err error) {
	w.mu.Lock()
	if w.result.Err == nil {
		w.result.Err = err
	}
	w.mu.Unlock()
}

// loop is the writer goroutine.
func (w *Writer) loop() {
	defer close(w.done)
	if w.opt.beforeLoop != nil {
		w.opt.beforeLoop()
	}
	var batch []Item
	for {
		// Everything queued at once: one wake-up for however many chunks
		// the pumps handed over meanwhile.
		var more, flush bool
		batch, more, flush = w.sink.Take(batch[:0])
		for _, it := range batch {
			w.add(it)
			w.sink.Done(it)
		}
		clear(batch)
		if !more {
			break
		}
		w.flush()
		// An unfinished line stays held until its newline, maxHeldLine or
		// the end: a partial record that a record of the other stream
		// followed would be joined to it by a reader that joins partial
		// lines (OpenTelemetry's, for one). A reader that waits for the
		// log to hold everything (Caught) is given a copy instead.
		if flush {
			w.keepHeldLines()
		}
		w.sink.Written()
		if w.failed {
			w.pause()
		}
	}
	w.finish()
}

// add encodes one item. The caller gives the item back (Sink.Done)
// afterwards.
func (w *Writer) add(it Item) {
	s := logStream(it.Stream)
	switch it.Kind {
	case Drop:
		// What is held of the line the loss cut goes out first; the drop
		// record itself waits for the stream's next record, so that it
		// stands right before it.
		w.flushPartial(s)
		w.unsaid[s] += it.Dropped
	case Cut:
		// The loss before the cut, as a Drop item says it.
		for rs, n := range it.Lost {
			if n > 0 {
				w.flushPartial(logStream(ring.Stream(rs)))
				w.unsaid[logStream(ring.Stream(rs))] += n
			}
		}
		w.flush()
		if g := w.await(it.hold); g.run != "" {
			err := w.continueAs(g.run, it)
			if g.done != nil {
				g.done <- err
			}
		}
	case Data:
		w.stampAt(it.At)
		if w.failed && !w.recovered() {
			// Nothing can be written: count the chunk, and what is held of
			// its stream's line, without framing it.
			w.lose(s, int64(len(it.Chunk.Data)+len(w.partial[s])))
			w.partial[s] = w.partial[s][:0]
		} else {
			w.addData(s, it.Chunk.Data)
		}
	}
}

// addData frames a chunk's bytes into records.
func (w *Writer) addData(s LogStream, data []byte) {
	for len(data) > 0 {
		data = w.lines(s, data)
		if len(data) == 0 {
			return
		}
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			w.partial[s] = append(w.partial[s], data...)
			if p := w.partial[s]; len(p) > maxHeldLine {
				// Written out but for its last piece, shifted once: a
				// line of gigabytes costs a copy of each byte, not one
				// of the megabyte held per record.
				k := 0
				for ; len(p)-k >= MaxContent; k += MaxContent {
					w.emit(s, true, p[k:k+MaxContent], nil)
				}
				w.partial[s] = p[:copy(p, p[k:])]
			}
			return
		}
		held, line := w.partial[s], data[:i]
		for len(held)+len(line) > MaxContent {
			if len(held) > 0 {
				k := min(len(held), MaxContent)
				n := min(len(line), MaxContent-k)
				w.emit(s, true, held[:k], line[:n])
				held, line = held[k:], line[n:]
			} else {
				w.emit(s, true, line[:MaxContent], nil)
				line = line[MaxContent:]
			}
		}
		w.emit(s, false, held, line)
		w.partial[s] = w.partial[s][:0]
		data = data[i+1:]
	}
}

// lines is addData's fast path for the common case: whole lines that fit a
// record, nothing held, no loss to describe first, and room in the active
// file. The content and its newline are copied as one. It returns what it
// left for the general path.
func (w *Writer) lines(s LogStream, data []byte) []byte {
	if len(w.partial[s]) > 0 || w.failed || w.unsaid[s] > 0 {
		return data
	}
	h := w.hdr[s][0]
	room := w.opt.MaxSize - w.size
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 || i > MaxContent || int64(len(w.out)+len(h)+i+1) > room {
			return data
		}
		w.out = append(w.out, h...)
		w.out = append(w.out, data[:i+1]...)
		w.outBytes[s] += int64(i + 1)
		data = data[i+1:]
		if len(w.out) >= batchSize {
			w.flush()
			if w.failed {
				return data
			}
			room = w.opt.MaxSize - w.size
		}
	}
}

// flushPartial writes what is held of s's unfinished line as P records.
func (w *Writer) flushPartial(s LogStream) {
	for p := w.partial[s]; len(p) > 0; p = p[min(len(p), MaxContent):] {
		w.emit(s, true, p[:min(len(p), MaxContent)], nil)
	}
	w.partial[s] = w.partial[s][:0]
}

func (w *Writer) flushPartials() {
	for s := range LogStream(NumLogStreams) {
		w.flushPartial(s)
	}
}

// keepHeldLines copies what is held of the unfinished lines for Caught, once
// the records before them are written: each starts where its stream
// stands in the log, after the loss its next record is to describe.
func (w *Writer) keepHeldLines() {
	var held [NumLogStreams]HeldLine
	for s, p := range w.partial {
		if len(p) > 0 {
			held[s] = HeldLine{Offset: w.pos[s] + w.outBytes[s] + w.outDrops[s] + w.unsaid[s], Data: bytes.Clone(p)}
		}
	}
	w.mu.Lock()
	w.heldLines = held
	w.mu.Unlock()
}

// emit encodes a data record whose content is a followed by b, after the
// drop record its stream owes, if any.
func (w *Writer) emit(s LogStream, partial bool, a, b []byte) {
	n := int64(len(a)+len(b)) + boolInt(!partial)
	if w.failed && !w.recovered() {
		w.lose(s, n)
		return
	}
	h := w.hdr[s][boolInt(partial)]
	if !w.describe(s) || !w.room(s, len(h)+len(a)+len(b)+1) {
		// A record after a loss it does not describe would stand at the
		// wrong offset: it is lost too.
		w.lose(s, n)
		return
	}
	w.out = append(w.out, h...)
	w.out = append(w.out, a...)
	w.out = append(w.out, b...)
	w.out = append(w.out, '\n')
	w.outBytes[s] += n
	if len(w.out) >= batchSize {
		w.flush()
	}
}

// describe writes the drop record s owes, if any. It reports false when
// it could not: nothing of s may be written then.
func (w *Writer) describe(s LogStream) bool {
	n := w.unsaid[s]
	if n == 0 {
		return true
	}
	m := Meta{Event: eventDrop, Run: w.run}
	if s == LogStderr {
		m.Stderr = n
	} else {
		m.Stdout = n
	}
	rec := appendMeta(nil, w.ts, m)
	if !w.room(s, len(rec)) || w.failed {
		return false
	}
	w.out = append(w.out, rec...)
	w.outDrops[s] += n
	w.unsaid[s] = 0
	return true
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// room rotates first if a record of n bytes of stream s would take the
// active file past its size. A file holds at least one record beyond its
// header. It reports false when the writer failed on the way: the record
// must then be counted, not gathered.
func (w *Writer) room(s LogStream, n int) bool {
	if w.failed {
		return false
	}
	if w.size+int64(len(w.out)+n) <= w.opt.MaxSize {
		return true
	}
	w.flush()
	if w.failed {
		return false
	}
	if w.size <= w.headLen {
		return true
	}
	if err := w.rotate(); err != nil {
		w.failWrite(err)
		return false
	}
	return true
}

// rotate archives the active file under its sequence number and makes the
// next one active. The active name always holds a file: the archive is a
// second link made first, and the new file replaces the name by rename.
// Neither file's bytes change.
func (w *Writer) rotate() error { return w.rotateTo(false) }

// rotateTo is rotate; began says the new file begins a run (its begin
// record follows its header).
func (w *Writer) rotateTo(began bool) error {
	if w.stoppedNow() {
		return ErrStopped
	}
	w.enterFS()
	defer w.leaveFS()
	seq := w.seq
	if err := w.dir.link(ActiveName, archiveName(seq)); err != nil {
		return err
	}
	if err := w.create(seq+1, began); err != nil {
		// The active file stays active: take its second name back, so
		// that a later rotation can make it again.
		if !errors.Is(err, ErrStopped) {
			w.dir.remove(archiveName(seq))
		}
		return err
	}
	w.archives = append(w.archives, seq)
	return w.prune()
}

// flush writes the gathered records, or counts their payload as lost.
func (w *Writer) flush() {
	if len(w.out) == 0 {
		return
	}
	if err := w.writeOut(); err != nil {
		w.failWrite(err)
	}
}

// writeOut writes w.out to the active file. On a short write (a full
// disk) it keeps the whole records that were written and leaves the rest
// in w.out for the caller to count as lost. Nothing written is cut back:
// part of a record written leaves the file torn, and the writer goes on
// in a new file, where the drop record before each stream's next record
// says what the torn one lost.
func (w *Writer) writeOut() error {
	if w.torn {
		if err := w.rotate(); err != nil {
			return err
		}
	}
	n, err := w.write(w.out)
	if err == nil {
		w.size += int64(n)
		w.out = w.out[:0]
		for s := range w.pos {
			w.pos[s] += w.outBytes[s] + w.outDrops[s]
		}
		w.outBytes, w.outDrops = [NumLogStreams]int64{}, [NumLogStreams]int64{}
		return nil
	}
	n = max(n, 0)
	keep := bytes.LastIndexByte(w.out[:n], '\n') + 1
	w.size += int64(n)
	w.torn = w.torn || n > keep
	w.kept(w.out[:keep])
	w.out = w.out[:copy(w.out, w.out[keep:])]
	return err
}

// kept moves the records of out, which the file now holds, from what w.out
// holds to where the streams stand.
func (w *Writer) kept(out []byte) {
	for line := range bytes.Lines(out) {
		r, err := parseRecord(line[:len(line)-1])
		if err != nil {
			continue // the writer's own records always parse
		}
		if r.Stream == LogMeta {
			if m, err := parseMeta(r.Content, false); err == nil && m.Event == eventDrop {
				for s, n := range [NumLogStreams]int64{m.Stdout, m.Stderr} {
					w.outDrops[s] -= n
					w.pos[s] += n
				}
			}
			continue
		}
		n := int64(r.PayloadLen())
		w.outBytes[r.Stream] -= n
		w.pos[r.Stream] += n
	}
}

// failWrite enters the failed state: what was gathered is lost, and the
// reserve is freed for the run's last records.
func (w *Writer) failWrite(err error) {
	w.fail(err)
	w.failed = true
	w.retryAt = time.Now().Add(w.retryEvery())
	w.discard()
	w.release()
}

// discard counts the gathered payload as lost and drops the records: the
// losses their drop records described are to be described again.
func (w *Writer) discard() {
	for s, n := range w.outBytes {
		w.lose(LogStream(s), n)
		w.unsaid[s] += w.outDrops[s]
	}
	w.out = w.out[:0]
	w.outBytes, w.outDrops = [NumLogStreams]int64{}, [NumLogStreams]int64{}
}

func (w *Writer) lose(s LogStream, n int64) {
	w.lost[s] += n
	w.unsaid[s] += n
}

// recovered reports whether a failed writer may write again: at most once
// every retryEvery it tries to take the reserve back, and if there is the
// space for that, it writes again; each stream's next record is preceded
// by a drop record for what it lost meanwhile. A failed writer gathers
// nothing, so w.out is empty here.
func (w *Writer) recovered() bool {
	if w.stoppedNow() || time.Now().Before(w.retryAt) {
		return false
	}
	w.retryAt = time.Now().Add(w.retryEvery())
	if w.reserve() != nil {
		return false
	}
	w.failed = false
	return true
}

func (w *Writer) retryEvery() time.Duration {
	if w.opt.retry > 0 {
		return w.opt.retry
	}
	return retryEvery
}

// pause waits, while the writer cannot write, until it is time to try
// again or the run ends. Taking every chunk only to count it would wake
// this goroutine for each burst and take CPU from the workload; meanwhile
// the sink counts what does not fit in its queue, and the writer counts
// the rest when it resumes, so the total stays exact.
func (w *Writer) pause() {
	t := time.NewTimer(time.Until(w.retryAt))
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.sink.Closing():
	}
}

// file is the active file, unless the writer was stopped. Stop may close
// it meanwhile: a write then fails.
func (w *Writer) file() (*os.File, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return nil, ErrStopped
	}
	return w.f, nil
}

func (w *Writer) stoppedNow() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

// finish ends the run: the trailing fragments, then the end record with
// the run's whole loss, appended, and a sync.
func (w *Writer) finish() {
	w.stamp()
	w.flushPartials()
	w.flush()
	w.mu.Lock()
	w.heldLines = [NumLogStreams]HeldLine{} // the log holds them now, or lost them
	w.mu.Unlock()
	// The pumps have returned and closed the sink: its totals are final.
	var dropped [NumLogStreams]int64
	for s, n := range w.sink.Dropped() {
		dropped[logStream(ring.Stream(s))] += n
	}
	for s, n := range w.lost {
		dropped[s] += n
	}
	// The end counts the run's own loss: a run that continues another
	// began with what that one had lost.
	run := dropped
	for s, n := range w.base {
		run[s] -= n
	}
	// The records first, durably, then the end that vouches for them: a
	// crash in between leaves a run without its end, never an end whose
	// records are missing.
	err := w.sync()
	// The reserve makes room for the end on a full disk.
	w.release()
	if err == nil {
		err = w.appendEnd(Dropped{Stdout: run[LogStdout], Stderr: run[LogStderr]})
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.result.Dropped = dropped
	if err != nil {
		if w.result.Err == nil {
			w.result.Err = err
		}
	} else if !w.stopped {
		w.result.Ended = true
	}
	if !w.stopped {
		w.f.Close()
		w.stopped = true
	}
}

// appendEnd appends the end record, whatever the file's size (it is the
// run's last record: a rotation for it would only make a file of a header
// and an end), and syncs it. A torn file gets no more records: the end
// goes to a new one.
func (w *Writer) appendEnd(d Dropped) error {
	if w.torn {
		if err := w.rotate(); err != nil {
			return err
		}
	}
	w.stamp()
	rec := appendMeta(nil, w.ts, Meta{Event: eventEnd, Run: w.run, Dropped: &d})
	n, err := w.write(rec)
	w.size += int64(max(n, 0))
	if err != nil {
		return err
	}
	return w.sync()
}

// write appends b to the active file. The beforeWrite hook runs inside
// the call, as a disk that does not answer would.
func (w *Writer) write(b []byte) (int, error) {
	w.enterFS()
	defer w.leaveFS()
	if w.opt.beforeWrite != nil {
		w.opt.beforeWrite()
	}
	f, err := w.file()
	if err != nil {
		return 0, err
	}
	return f.Write(b)
}

// sync makes what the active file holds durable.
func (w *Writer) sync() error {
	f, err := w.file()
	if err != nil {
		return err
	}
	w.enterFS()
	defer w.leaveFS()
	return f.Sync()
}
