package capture

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ReadOptions configure a Reader.
type ReadOptions struct {
	// Follow keeps reading at the end of the log as the writer appends
	// and rotates, until the context ends. Without it, Next returns io.EOF
	// at the end of what is written.
	Follow bool
	// Poll is how often a follower looks for new bytes at the end of the
	// log (default 100 ms).
	Poll time.Duration
	// From, when set, starts the reader at the newest file whose header
	// says each stream stood at or before these offsets there, instead of
	// at the oldest file: a reader after a span of output need not read
	// the whole log. It then sees the runs from that file on only.
	From *Positions
}

// DefaultPoll is how often a follower checks the end of the log.
const DefaultPoll = 100 * time.Millisecond

// Entry is what a Reader returns: a record, or a gap.
type Entry struct {
	Record
	// Gap, when non-zero, says this entry is not a record: rotation
	// removed files before the reader got to them, and Gap log bytes were
	// missed (-1: how many is unknown, the files had no headers).
	Gap int64
	// Offset is, for a stdout or stderr record, its stream offset: how
	// many bytes the stream had produced before the record's payload (the
	// engine's offsets, the ones watchers resume from); for a drop record,
	// where in stream On the loss begins. -1 when the log does not say: a
	// file of the earliest format whose run began in a file no longer
	// there.
	Offset int64
	// Lost is, for a drop record, how many bytes of each stream were lost
	// right before that stream's next record.
	Lost [NumLogStreams]int64
	// LostAt is, for a drop record, where each stream's loss begins (-1
	// when the log does not say).
	LostAt [NumLogStreams]int64
}

// Reader reads a capture directory's records in order: the archives from
// the oldest retained, then the active file. It tolerates torn and corrupt
// lines, skipping and counting them, and classifies every run it reads.
// Following, it survives rotation: it drains the file it has open before
// moving to the next, and reports a gap, never skipping silently, if
// rotation removed files it had not read.
type Reader struct {
	dir  *Dir
	opt  ReadOptions
	runs Classifier

	f     *os.File
	seq   int64 // the open file's sequence number; 0 without a header
	start int64 // the open file's log offset; -1 unknown
	pos   int64 // bytes of the open file consumed
	fresh bool  // at the open file's first record (its header)
	drain bool  // a newer file exists; read the open one to its end once more

	// The open file's header, if it is one of the previous format, as
	// last read (it changes once, when the run ends): ended says the end
	// it records was given to the classifier, ending that the reader saw
	// it and reads to the end of the file once more, for what was written
	// before it. Headers of this format never change.
	head   Meta
	headAt time.Time
	ended  bool
	ending bool

	// at is where each stream stands: the stream offset of its next
	// record, when known.
	at   [NumLogStreams]int64
	atOK bool
	// before is where the streams stood before the header read last, if
	// known and nothing but the header was read since: a begin record
	// that continues a run checks it against where it says the run was.
	before   [NumLogStreams]int64
	beforeOK bool

	buf     []byte
	r, w    int  // buf[r:w] is read and not yet consumed
	skipEOL bool // discarding an overlong line up to its newline
	atEnd   bool // Next returned io.EOF, with buf holding a last line cut short

	stats ReadStats
}

// ReadStats count what a reader could not return.
type ReadStats struct {
	// Before is how many log bytes came before the oldest retained file:
	// removed by rotation before this reader started.
	Before int64
	// Missed is how many log bytes rotation removed while this reader was
	// behind (the sum of the gaps it returned); MissedUnknown counts gaps
	// of unknown size.
	Missed        int64
	MissedUnknown int
	// Corrupt counts lines that were not records; Torn counts lines cut
	// off by the end of a file.
	Corrupt int
	Torn    int
	// Bytes is how many log bytes the reader went through, whether they
	// held records or not.
	Bytes int64
}

// NewReader starts reading dir. It holds no file open until the first Next.
func NewReader(dir *Dir, opt ReadOptions) *Reader {
	if opt.Poll <= 0 {
		opt.Poll = DefaultPoll
	}
	return &Reader{dir: dir, opt: opt, buf: make([]byte, 64<<10)}
}

// Close releases the open file.
func (r *Reader) Close() error {
	if r.f != nil {
		r.f.Close()
		r.f = nil
	}
	return nil
}

// Stats reports what the reader skipped or missed so far.
func (r *Reader) Stats() ReadStats {
	st := r.stats
	if r.atEnd && (r.w > r.r || r.skipEOL) {
		st.Torn++
		st.Bytes += int64(r.w - r.r)
	}
	return st
}

// SetFollow switches a reader that reached the end of the log into
// following it from there, or back: a caller can read what is written
// (to take its tail, say) and then follow what comes.
func (r *Reader) SetFollow(follow bool) {
	r.opt.Follow = follow
	r.atEnd = false
}

// Runs classifies every run the reader has read so far. Call it at the
// end of the log for the final picture.
func (r *Reader) Runs() []Run { return r.runs.Runs() }

// Next returns the next record or gap. Without Follow it returns io.EOF at
// the end of the log; with Follow it waits for more until ctx ends.
func (r *Reader) Next(ctx context.Context) (Entry, error) {
	for {
		if r.f == nil {
			ok, err := r.openFirst()
			if err != nil {
				return Entry{}, err
			}
			if !ok {
				if !r.opt.Follow {
					return Entry{}, io.EOF
				}
				if err := r.wait(ctx); err != nil {
					return Entry{}, err
				}
				continue
			}
		}
		if e, ok := r.line(); ok {
			return e, nil
		}
		n, err := r.fill()
		if err != nil {
			return Entry{}, err
		}
		if n > 0 {
			continue
		}
		// At the end of the open file. A run that ended there ends after
		// everything written before its header said so: read once more.
		if again, end, ok := r.endOf(); again {
			continue
		} else if ok {
			return end, nil
		}
		next, gap, err := r.newer()
		if err != nil {
			return Entry{}, err
		}
		if next != nil {
			if !r.drain {
				// The writer has moved on: what it appended to this file
				// before it did is read first.
				r.drain = true
				next.f.Close()
				continue
			}
			r.torn()
			r.switchTo(next)
			r.atOK = r.atOK && gap == 0
			if gap != 0 {
				if gap > 0 {
					r.stats.Missed += gap
				} else {
					r.stats.MissedUnknown++
				}
				r.runs.gap()
				return Entry{Gap: gap}, nil
			}
			continue
		}
		if !r.opt.Follow {
			// A last line without its newline stays buffered: a writer may
			// be finishing it, for a reader that goes on with SetFollow.
			// Stats counts it as torn meanwhile.
			r.atEnd = true
			return Entry{}, io.EOF
		}
		if err := r.wait(ctx); err != nil {
			return Entry{}, err
		}
	}
}

func (r *Reader) wait(ctx context.Context) error {
	t := time.NewTimer(r.opt.Poll)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// torn counts a last line without its newline and drops it: the line a
// writer was killed in (the writer never writes past it, it moves to a new
// file), or at the end of the log one it is still writing. Either way the
// run says so by having no end.
func (r *Reader) torn() {
	r.stats.Bytes += int64(r.w - r.r)
	if r.w > r.r || r.skipEOL {
		r.stats.Torn++
	}
	r.r, r.w, r.skipEOL = 0, 0, false
}

// line returns the next whole line of the buffer as an entry, skipping
// corrupt ones.
func (r *Reader) line() (Entry, bool) {
	for {
		i := bytes.IndexByte(r.buf[r.r:r.w], '\n')
		if i < 0 {
			if r.w-r.r > maxLine+64 {
				// No record is this long: drop it up to its newline.
				r.pos += int64(r.w - r.r)
				r.stats.Bytes += int64(r.w - r.r)
				r.r, r.w = 0, 0
				r.skipEOL = true
			}
			return Entry{}, false
		}
		line := r.buf[r.r : r.r+i]
		r.r += i + 1
		r.pos += int64(i + 1)
		r.stats.Bytes += int64(i + 1)
		fresh := r.fresh
		r.fresh = false
		if r.skipEOL {
			r.skipEOL = false
			r.stats.Corrupt++
			r.runs.damaged()
			continue
		}
		rec, tagged, err := parseLine(line)
		if err != nil {
			r.stats.Corrupt++
			r.runs.damaged()
			continue
		}
		e := Entry{Record: rec, Offset: -1}
		if rec.Stream == LogMeta {
			r.metaRecord(&e, tagged, fresh)
		} else {
			if r.atOK {
				e.Offset = r.at[rec.Stream]
				r.at[rec.Stream] += int64(rec.PayloadLen())
			}
			r.beforeOK = false
			r.runs.data(rec)
		}
		return e, true
	}
}

// metaRecord applies what a metadata record says to the runs and to where
// the streams stand, and tells a drop record's entry what it lost where.
func (r *Reader) metaRecord(e *Entry, tagged, fresh bool) {
	rec := e.Record
	m, err := parseMeta(rec.Content, tagged)
	before, beforeOK := r.before, r.beforeOK
	r.beforeOK = false
	switch {
	case err != nil:
		r.runs.invalid(err)
		return
	case m.Event == eventFile && !fresh:
		r.runs.invalid(fmt.Errorf("%w: file record inside a file", errMeta))
		return
	}
	switch m.Event {
	case eventFile:
		if m.Run == "" {
			return // the earliest format's: where the file stands in the log
		}
		r.before, r.beforeOK = r.at, r.atOK
		r.at, r.atOK = [NumLogStreams]int64{m.At.Stdout, m.At.Stderr}, true
		if tagged {
			r.head, r.headAt, r.ended, r.ending = m, rec.Time, false, false
			r.runs.header(m, rec.Time)
			return
		}
		r.runs.file(m.Run)
		return
	case eventBegin:
		var at [NumLogStreams]int64
		if m.At != nil {
			// A run that continues another: its streams go on from there.
			at = [NumLogStreams]int64{m.At.Stdout, m.At.Stderr}
			r.runs.reached = beforeOK && before == at && r.atOK && r.at == at
		}
		r.at, r.atOK = at, true
	case eventDrop:
		e.Lost = [NumLogStreams]int64{m.Stdout, m.Stderr}
		e.LostAt = [NumLogStreams]int64{-1, -1}
		if m.Stdout == 0 {
			e.On = LogStderr
		}
		for s, n := range e.Lost {
			if r.atOK {
				e.LostAt[s] = r.at[s]
			}
			r.at[s] += n
		}
		e.Offset = e.LostAt[e.On]
	}
	r.runs.meta(m, rec.Time)
}

// endOf is called at the end of the open file: it re-reads the file's
// header, and once it says the run ended, the reader goes through what is
// left of the file (written before the end was; again is true) and then
// gives the end to the classifier and returns it as an entry of its own,
// an end record as the earlier format wrote them (ok is true).
func (r *Reader) endOf() (again bool, end Entry, ok bool) {
	if r.head.Run == "" || r.ended {
		return false, Entry{}, false
	}
	if !r.ending {
		h, _, err := readHeader(r.f)
		if err != nil || h.Run != r.head.Run || h.Seq != r.head.Seq || h.Ended == nil {
			return false, Entry{}, false
		}
		r.head, r.ending = h, true
		return true, Entry{}, false
	}
	r.ended = true
	if r.pos != r.head.Size || r.w > r.r || r.skipEOL {
		// Not the file the run ended with: cut, or written to since.
		r.runs.invalid(fmt.Errorf("%w: the run ended with %d bytes in the file, which holds %d", errMeta, r.head.Size, r.pos+int64(r.w-r.r)))
		return false, Entry{}, false
	}
	m := Meta{Event: eventEnd, Run: r.head.Run, Dropped: r.head.Dropped}
	r.runs.meta(m, *r.head.Ended)
	content, _ := json.Marshal(m)
	return false, Entry{Record: Record{Time: *r.head.Ended, Stream: LogMeta, Content: content}, Offset: -1}, true
}

// fill reads more of the open file into the buffer.
func (r *Reader) fill() (int, error) {
	if r.r > 0 {
		r.w = copy(r.buf, r.buf[r.r:r.w])
		r.r = 0
	}
	if r.w == len(r.buf) {
		r.buf = append(r.buf, make([]byte, len(r.buf))...)
	}
	n, err := r.f.Read(r.buf[r.w:])
	r.w += n
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if err != nil {
		return n, fmt.Errorf("capture: read %s: %w", r.f.Name(), err)
	}
	return n, nil
}

// logFile is an open log file with what its header says.
type logFile struct {
	f     *os.File
	seq   int64 // 0: no header
	start int64 // -1: no header
}

func (r *Reader) openFile(name string) (*logFile, error) {
	f, err := r.dir.open(name, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	lf := &logFile{f: f, start: -1}
	if h, _, err := readHeader(f); err == nil {
		lf.seq, lf.start = h.Seq, h.Offset
	}
	if seq, ok := parseArchive(name); ok && lf.seq != seq {
		// The name is what rotation and pruning go by.
		lf.seq, lf.start = seq, -1
	}
	return lf, nil
}

// openFirst opens the oldest retained file. It reports false when the
// directory has no log yet.
func (r *Reader) openFirst() (bool, error) {
	if r.opt.From != nil {
		if ok, err := r.openAt(*r.opt.From); ok || err != nil {
			return ok, err
		}
	}
	for {
		seqs, err := r.dir.archives()
		if err != nil {
			return false, err
		}
		name := ActiveName
		if len(seqs) > 0 {
			name = archiveName(seqs[0])
		}
		lf, err := r.openFile(name)
		if errors.Is(err, unix.ENOENT) {
			if name == ActiveName {
				return false, nil
			}
			continue // pruned meanwhile
		}
		if err != nil {
			return false, err
		}
		if name == ActiveName && lf.seq > 1 && r.archivedBetween(0, lf.seq) {
			// Rotated between the listing and this open: the older files
			// are archives now; start with the oldest.
			lf.f.Close()
			continue
		}
		r.switchTo(lf)
		if lf.start > 0 {
			r.stats.Before = lf.start
		}
		return true, nil
	}
}

// openAt opens the newest file whose header puts each stream at or before
// from. It reports false when none does (or the files changed meanwhile):
// the caller starts at the oldest.
func (r *Reader) openAt(from Positions) (bool, error) {
	seqs, err := r.dir.archives()
	if err != nil {
		return false, err
	}
	names := []string{ActiveName}
	for i := len(seqs) - 1; i >= 0; i-- {
		names = append(names, archiveName(seqs[i]))
	}
	for _, name := range names {
		lf, err := r.openFile(name)
		if errors.Is(err, unix.ENOENT) {
			return false, nil // rotated or pruned meanwhile
		}
		if err != nil {
			return false, err
		}
		h, _, herr := readHeader(lf.f)
		if herr == nil && h.At != nil && h.At.Stdout <= from.Stdout && h.At.Stderr <= from.Stderr {
			r.switchTo(lf)
			if lf.start > 0 {
				r.stats.Before = lf.start
			}
			return true, nil
		}
		lf.f.Close()
	}
	return false, nil
}

func (r *Reader) switchTo(lf *logFile) {
	if r.f != nil {
		r.f.Close()
	}
	r.f, r.seq, r.start = lf.f, lf.seq, lf.start
	r.pos, r.fresh, r.drain = 0, true, false
	r.r, r.w, r.skipEOL = 0, 0, false
	r.head, r.ended, r.ending = Meta{}, false, false
}

// newer opens the file that follows the open one, if the writer has moved
// on from it, and says how many log bytes lie between the two (-1 if that
// cannot be known).
func (r *Reader) newer() (*logFile, int64, error) {
	if still, err := r.stillActive(); err != nil || still {
		return nil, 0, err
	}
	if r.seq == 0 {
		// An active file without a header, archived since: its name now
		// says where it stands.
		seq, err := r.archivedAs()
		if err != nil {
			return nil, 0, err
		}
		// Pruned already (seq 0): go on from the oldest file left, with a
		// gap of unknown size.
		r.seq = seq
	}
	return r.after(r.seq)
}

// archivedAs finds the archive that is the open file.
func (r *Reader) archivedAs() (int64, error) {
	var mine unix.Stat_t
	if err := unix.Fstat(int(r.f.Fd()), &mine); err != nil {
		return 0, err
	}
	seqs, err := r.dir.archives()
	if err != nil {
		return 0, err
	}
	for _, s := range seqs {
		st, err := r.dir.stat(archiveName(s))
		if err == nil && st.Ino == mine.Ino && st.Dev == mine.Dev {
			return s, nil
		}
	}
	return 0, nil
}

// stillActive reports whether the open file is the active one.
func (r *Reader) stillActive() (bool, error) {
	var mine unix.Stat_t
	if err := unix.Fstat(int(r.f.Fd()), &mine); err != nil {
		return false, err
	}
	st, err := r.dir.stat(ActiveName)
	if errors.Is(err, unix.ENOENT) {
		// Between the steps of a rotation made by another writer: look
		// again later.
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return st.Ino == mine.Ino && st.Dev == mine.Dev, nil
}

// after opens the file with the smallest sequence number above seq.
func (r *Reader) after(seq int64) (*logFile, int64, error) {
	for {
		seqs, err := r.dir.archives()
		if err != nil {
			return nil, 0, err
		}
		var lf *logFile
		for _, s := range seqs {
			if s > seq {
				lf, err = r.openFile(archiveName(s))
				break
			}
		}
		if lf == nil && err == nil {
			lf, err = r.openFile(ActiveName)
			if errors.Is(err, unix.ENOENT) {
				return nil, 0, nil // between the steps of a rotation: look again later
			}
			if err == nil && lf.seq <= seq {
				// Not rotated yet (or the rotation is half done).
				lf.f.Close()
				return nil, 0, nil
			}
			if err == nil && lf.seq > seq+1 && r.archivedBetween(seq, lf.seq) {
				// Rotated again between the listing and this open: the
				// files in between are archives now. Take them first.
				lf.f.Close()
				continue
			}
		}
		if errors.Is(err, unix.ENOENT) {
			continue // rotated or pruned meanwhile
		}
		if err != nil {
			return nil, 0, err
		}
		return lf, r.gapTo(lf), nil
	}
}

// archivedBetween reports whether an archive with a sequence number
// between lo and hi (both excluded) exists.
func (r *Reader) archivedBetween(lo, hi int64) bool {
	seqs, err := r.dir.archives()
	if err != nil {
		return false
	}
	for _, s := range seqs {
		if s > lo && s < hi {
			return true
		}
	}
	return false
}

// gapTo is how many log bytes lie between the end of the open file and the
// start of lf.
func (r *Reader) gapTo(lf *logFile) int64 {
	if lf.seq == r.seq+1 && r.seq != 0 {
		return 0
	}
	if r.start < 0 || lf.start < 0 {
		return -1
	}
	end := r.start + r.pos + int64(r.w-r.r)
	if lf.start > end {
		return lf.start - end
	}
	return -1
}
