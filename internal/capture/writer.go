package capture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/internal/ring"
)

// Options configure a Writer. The zero value means the defaults.
type Options struct {
	// MaxSize is the size at which the active file is rotated
	// (default 10 MiB). A file exceeds it only by holding a single record
	// larger than MaxSize.
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

// batchSize is how many encoded bytes the writer gathers before a write.
const batchSize = 256 << 10

// retryEvery is how often a writer whose file system failed checks
// whether space has come back.
const retryEvery = time.Second

// ErrStopped reports a writer stopped before it could finish its run.
var ErrStopped = errors.New("capture: writer stopped before the end of the run")

// Writer writes one process's captured output to the CRI log of its
// directory. It receives chunks only through its Sink, from the process's
// pumps, and is the only writer of the directory.
//
// A run begins with Begin, which makes the begin record durable before it
// returns: start the process only after that. The process's owner closes
// the Sink once every pump has returned; the writer then writes what is
// queued, the trailing fragments, and the end record with the run's exact
// loss, and finishes. Finish waits for that, bounded, and on timeout stops
// the writer, leaving the run without an end record: "interrupted".
type Writer struct {
	dir  *Dir
	run  string
	opt  Options
	sink *Sink
	done chan struct{}

	// Owned by the writer goroutine (and by Begin before it starts).
	out      []byte
	outBytes [NumLogStreams]int64     // payload bytes in out, per stream
	ts       []byte                   // the records' timestamp
	stamped  int64                    // ts in Unix nanoseconds
	hdr      [NumLogStreams][2][]byte // record headers with ts: F, then P
	size     int64                    // bytes in the active file
	seq      int64                    // the active file's sequence number
	offset   int64                    // log bytes in every file before the active one
	archives []int64                  // the archives' sequence numbers, rising
	partial  [NumLogStreams][]byte
	lost     [NumLogStreams]int64 // bytes the writer failed to persist
	unsaid   [NumLogStreams]int64 // of those, not yet in a drop record
	failed   bool                 // the file system failed; data is counted, not written
	retryAt  time.Time
	reserved bool // the reserve file holds its space

	mu      sync.Mutex // guards f, stopped and result
	f       *os.File
	stopped bool
	result  Result
}

// Result is what a finished (or stopped) writer reports.
type Result struct {
	// Ended is set once the end record was written and synced.
	Ended bool
	// Dropped is, per log stream, every byte of the run that is not in the
	// log: lost in the queue or by a failed write. Final once Ended.
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

// Begin starts a run in dir: it opens or creates the active file (never
// through a symbolic link), cleans up after an interrupted rotation, writes
// the begin record for run and syncs it, and only then returns a writer
// whose goroutine is waiting on its sink. Any failure fails Begin, and
// nothing is started.
func Begin(dir *Dir, run string, opt Options) (*Writer, error) {
	if err := checkRunID(run); err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	opt, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	w := &Writer{dir: dir, run: run, opt: opt, done: make(chan struct{})}
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
	w.stamp()
	w.out = appendMeta(w.out, w.ts, Meta{Run: w.run, Event: eventBegin})
	if err := w.writeOut(); err != nil {
		return err
	}
	if err := w.f.Sync(); err != nil {
		return err
	}
	return d.sync()
}

// openActive opens the active file for appending, or makes a new one when
// there is none, when it has no valid header, or when a rotation was
// interrupted after the active file was linked as an archive.
func (w *Writer) openActive() error {
	last := int64(0)
	if n := len(w.archives); n > 0 {
		last = w.archives[n-1]
	}
	f, err := w.dir.open(ActiveName, unix.O_RDWR|unix.O_APPEND, 0)
	if errors.Is(err, unix.ENOENT) {
		return w.create(last + 1)
	}
	if err != nil {
		return err
	}
	h, size, herr := readHeader(f)
	if herr == nil && h.Seq > last {
		w.f, w.seq, w.offset, w.size = f, h.Seq, h.Offset, size
		torn, err := w.tornTail()
		if err != nil || !torn {
			return err
		}
		// A writer was killed inside a record. Leave that file as it is,
		// an archive ending in a torn line the reader counts, and start
		// the next: appending to it would make the torn record look whole.
		return w.rotate()
	}
	f.Close()
	if herr == nil && h.Seq == last {
		// Interrupted after linking the active file as its archive: the
		// archive has it all; start the next file.
		return w.create(last + 1)
	}
	// Not a file this package wrote: keep it as an archive, untouched.
	if err := w.dir.rename(ActiveName, archiveName(last+1)); err != nil {
		return err
	}
	w.archives = append(w.archives, last+1)
	return w.create(last + 2)
}

// tornTail reports whether the active file ends inside a record.
func (w *Writer) tornTail() (bool, error) {
	if w.size == 0 {
		return false, nil
	}
	var b [1]byte
	if _, err := w.f.ReadAt(b[:], w.size-1); err != nil {
		return false, err
	}
	return b[0] != '\n', nil
}

// create makes file seq the active file: it is built under a temporary
// name with its header and renamed over the active name, so the active
// name always holds a file with a header. The old active file, if any, must
// already be linked as its archive.
func (w *Writer) create(seq int64) error {
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
	w.stamp()
	hdr := appendMeta(nil, w.ts, Meta{Event: eventFile, Seq: seq, Offset: offset})
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
	w.seq, w.offset, w.size = seq, offset, int64(len(hdr))
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

// readHeader reads a log file's first record, which must be a file record,
// and returns it with the file's size.
func readHeader(f *os.File) (Meta, int64, error) {
	st, err := f.Stat()
	if err != nil {
		return Meta{}, 0, err
	}
	buf := make([]byte, 512)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Meta{}, 0, err
	}
	line, _, ok := bytes.Cut(buf[:n], []byte{'\n'})
	if !ok {
		return Meta{}, st.Size(), errors.New("no header")
	}
	r, err := parseRecord(line)
	if err != nil || r.Stream != LogMeta {
		return Meta{}, st.Size(), errors.New("no header")
	}
	m, err := parseMeta(r.Content)
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
		w.dir.remove(reserveName)
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

// Run is the run's id.
func (w *Writer) Run() string { return w.run }

// Done is closed when the writer has finished or been stopped.
func (w *Writer) Done() <-chan struct{} { return w.done }

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
		var more bool
		batch, more = w.sink.Take(batch[:0])
		for _, it := range batch {
			w.add(it)
			w.sink.Done(it)
		}
		clear(batch)
		if !more {
			break
		}
		// Caught up: let what is held of unfinished lines be seen now.
		w.flushPartials()
		w.flush()
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
		w.flushPartial(s)
		m := Meta{Run: w.run, Event: eventDrop}
		if s == LogStderr {
			m.Stderr = it.Dropped
		} else {
			m.Stdout = it.Dropped
		}
		w.emitMeta(m)
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
			for len(w.partial[s]) > MaxContent {
				w.emit(s, true, w.partial[s][:MaxContent], nil)
				w.partial[s] = w.partial[s][:copy(w.partial[s], w.partial[s][MaxContent:])]
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
// record, nothing held, and room in the active file. The content and its
// newline are copied as one. It returns what it left for the general path.
func (w *Writer) lines(s LogStream, data []byte) []byte {
	if len(w.partial[s]) > 0 || w.failed {
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

// flushPartial writes what is held of s's unfinished line as a P record.
func (w *Writer) flushPartial(s LogStream) {
	if len(w.partial[s]) > 0 {
		w.emit(s, true, w.partial[s], nil)
		w.partial[s] = w.partial[s][:0]
	}
}

func (w *Writer) flushPartials() {
	for s := range LogStream(NumLogStreams) {
		w.flushPartial(s)
	}
}

// emit encodes a data record whose content is a followed by b.
func (w *Writer) emit(s LogStream, partial bool, a, b []byte) {
	n := len(a) + len(b)
	if w.failed && !w.recovered() {
		w.lose(s, int64(n)+boolInt(!partial))
		return
	}
	h := w.hdr[s][boolInt(partial)]
	if !w.room(len(h) + n + 1) {
		w.lose(s, int64(n)+boolInt(!partial))
		return
	}
	w.out = append(w.out, h...)
	w.out = append(w.out, a...)
	w.out = append(w.out, b...)
	w.out = append(w.out, '\n')
	w.outBytes[s] += int64(n) + boolInt(!partial)
	if len(w.out) >= batchSize {
		w.flush()
	}
}

func (w *Writer) emitMeta(m Meta) {
	if w.failed && !w.recovered() {
		return
	}
	rec := appendMeta(nil, w.ts, m)
	if w.room(len(rec)) {
		w.out = append(w.out, rec...)
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// room rotates first if a record of n bytes would take the active file
// past its size. A file holds at least one record beyond its header. It
// reports false when the writer failed on the way: the record must then be
// counted, not gathered.
func (w *Writer) room(n int) bool {
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
	if w.size <= w.headerSize() {
		return true
	}
	if err := w.rotate(); err != nil {
		w.failWrite(err)
		return false
	}
	return true
}

func (w *Writer) headerSize() int64 {
	return int64(len(appendMeta(nil, w.ts, Meta{Event: eventFile, Seq: w.seq, Offset: w.offset})))
}

// rotate archives the active file under its sequence number and makes the
// next one active. The active name always holds a file: the archive is a
// second link made first, and the new file replaces the name by rename.
func (w *Writer) rotate() error {
	if w.stoppedNow() {
		return ErrStopped
	}
	seq := w.seq
	if err := w.dir.link(ActiveName, archiveName(seq)); err != nil {
		return err
	}
	if err := w.create(seq + 1); err != nil {
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

// writeOut writes w.out to the active file. On a short write it cuts the
// file back to its last whole record, so the records after stay readable.
func (w *Writer) writeOut() error {
	if w.opt.beforeWrite != nil {
		w.opt.beforeWrite()
	}
	w.mu.Lock()
	f, stopped := w.f, w.stopped
	w.mu.Unlock()
	if stopped {
		return ErrStopped
	}
	n, err := f.Write(w.out)
	if err != nil {
		if n > 0 {
			if terr := f.Truncate(w.size); terr != nil {
				// The part that was written stays, cut inside a record:
				// the reader will count that line as corrupt. Its payload
				// is counted as lost with the rest of the batch, an
				// overcount of at most this batch, and the size is taken
				// from the file so later offsets stay right.
				err = errors.Join(err, terr)
				if st, serr := f.Stat(); serr == nil {
					w.size = st.Size()
				}
			}
		}
		return err
	}
	w.size += int64(n)
	w.out = w.out[:0]
	w.outBytes = [NumLogStreams]int64{}
	return nil
}

// failWrite enters the failed state: what was gathered is lost, and the
// reserve is freed so that the end record fits.
func (w *Writer) failWrite(err error) {
	w.fail(err)
	w.failed = true
	w.retryAt = time.Now().Add(w.retryEvery())
	w.discard()
	w.release()
}

// discard counts the gathered payload as lost and drops the records.
func (w *Writer) discard() {
	for s, n := range w.outBytes {
		w.lose(LogStream(s), n)
	}
	w.out = w.out[:0]
	w.outBytes = [NumLogStreams]int64{}
}

func (w *Writer) lose(s LogStream, n int64) {
	w.lost[s] += n
	w.unsaid[s] += n
}

// recovered reports whether a failed writer may write again: at most once
// every retryEvery it tries to take the reserve back, and if there is the
// space for that, it writes again, telling the log first how much was lost
// meanwhile. A failed writer gathers nothing, so w.out is empty here.
func (w *Writer) recovered() bool {
	if w.stoppedNow() || time.Now().Before(w.retryAt) {
		return false
	}
	w.retryAt = time.Now().Add(w.retryEvery())
	if w.reserve() != nil {
		return false
	}
	w.failed = false
	w.sayLost()
	return true
}

// sayLost writes a drop record for the bytes the writer itself lost.
func (w *Writer) sayLost() {
	if w.unsaid != [NumLogStreams]int64{} {
		w.emitMeta(Meta{Run: w.run, Event: eventDrop, Stdout: w.unsaid[LogStdout], Stderr: w.unsaid[LogStderr]})
		w.unsaid = [NumLogStreams]int64{}
	}
}

func (w *Writer) retryEvery() time.Duration {
	if w.opt.retry > 0 {
		return w.opt.retry
	}
	return retryEvery
}

// pause waits, while the writer cannot write, until it is time to try
// again or the run ends. Receiving every chunk only to count it would wake
// this goroutine for each one and take CPU from the workload; meanwhile
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

func (w *Writer) stoppedNow() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

// finish ends the run: trailing fragments, the end record with the run's
// whole loss, a sync.
func (w *Writer) finish() {
	w.stamp()
	w.flushPartials()
	w.flush()
	// The pumps have returned and closed the sink: its totals are final.
	var dropped [NumLogStreams]int64
	for s, n := range w.sink.Dropped() {
		dropped[logStream(ring.Stream(s))] += n
	}
	for s, n := range w.lost {
		dropped[s] += n
	}
	// Write the end record even after a failure: the freed reserve is
	// there for it.
	w.failed = false
	w.out = w.out[:0]
	w.emitMeta(Meta{Run: w.run, Event: eventEnd, Dropped: &Dropped{Stdout: dropped[LogStdout], Stderr: dropped[LogStderr]}})
	err := w.writeOut()
	w.mu.Lock()
	f := w.f
	w.mu.Unlock()
	if err == nil {
		err = f.Sync()
	}
	w.release()
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
		f.Close()
		w.stopped = true
	}
}
