package client

import (
	"bytes"
	"iter"
	"unicode/utf8"
)

// Line is one line of a stream, as ReadLines gives it.
type Line struct {
	Stream string
	// Text is the line without its newline (or CRLF), valid UTF-8.
	Text string
	// Partial marks a last line that had no newline when the output
	// ended (or broke).
	Partial bool
	// Truncated marks a line longer than the limit: Text holds its start,
	// the rest up to the newline was discarded.
	Truncated bool
}

// ReadLines turns output into lines, per stream: UTF-8 split across chunks
// and CRLF are handled, a line over maxLineBytes is clipped and marked, a
// gap ends the line it cut (marked partial), and a last line without a
// newline is marked partial. An error from the output ends the lines with
// that error. maxLineBytes 0 is 16 KiB; a negative one is refused
// (ErrInvalidArgument) before the output is read.
func ReadLines(output iter.Seq2[Chunk, error], maxLineBytes int) iter.Seq2[Line, error] {
	if maxLineBytes < 0 {
		err := invalid("maxLineBytes %d: want 0 (16 KiB) or more", maxLineBytes)
		return func(yield func(Line, error) bool) { yield(Line{}, err) }
	}
	if maxLineBytes == 0 {
		maxLineBytes = 16 << 10
	}
	return func(yield func(Line, error) bool) {
		lr := &lineReader{max: maxLineBytes, streams: map[string]*lineState{}, yield: yield}
		for ch, err := range output {
			if err != nil {
				if lr.flushAll() {
					yield(Line{}, err)
				}
				return
			}
			if !lr.chunk(ch) {
				return
			}
		}
		lr.flushAll()
	}
}

// lineReader is ReadLines's state: each stream's line so far, in the
// order the streams came.
type lineReader struct {
	max     int
	streams map[string]*lineState
	order   []string
	yield   func(Line, error) bool
}

type lineState struct {
	buf       []byte
	truncated bool // this line overflowed: discarding to its end
}

func (lr *lineReader) get(s string) *lineState {
	st := lr.streams[s]
	if st == nil {
		st = &lineState{}
		lr.streams[s] = st
		lr.order = append(lr.order, s)
	}
	return st
}

// emit yields stream s's line; false once the consumer stopped.
func (lr *lineReader) emit(s string, st *lineState, partial bool) bool {
	text := st.buf
	if !partial {
		text = bytes.TrimSuffix(text, []byte{'\r'})
	}
	l := Line{Stream: s, Text: string(bytes.ToValidUTF8(text, []byte("\uFFFD"))), Partial: partial, Truncated: st.truncated}
	st.buf, st.truncated = st.buf[:0], false
	return lr.yield(l, nil)
}

// flushAll yields each stream's unfinished line, marked partial.
func (lr *lineReader) flushAll() bool {
	for _, s := range lr.order {
		if st := lr.streams[s]; len(st.buf) > 0 || st.truncated {
			if !lr.emit(s, st, true) {
				return false
			}
		}
	}
	return true
}

// chunk takes a chunk of output: a gap ends the line it cut; bytes add to
// their stream's line, each newline ending one. False once the consumer
// stopped.
func (lr *lineReader) chunk(ch Chunk) bool {
	st := lr.get(ch.Stream)
	if ch.Lost > 0 {
		return !(len(st.buf) > 0 || st.truncated) || lr.emit(ch.Stream, st, true)
	}
	data := ch.Bytes
	if data == nil {
		data = []byte(ch.Text)
	}
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		piece := data
		if i >= 0 {
			piece = data[:i]
		}
		if !st.truncated {
			room := lr.max - len(st.buf)
			if len(piece) > room {
				// Clip at a character boundary, keeping a CR that may end
				// the line out of the count.
				cut := room
				for cut > 0 && !utf8.RuneStart(piece[cut]) {
					cut--
				}
				st.buf = append(st.buf, piece[:cut]...)
				st.truncated = true
			} else {
				st.buf = append(st.buf, piece...)
			}
		}
		if i < 0 {
			break
		}
		if !lr.emit(ch.Stream, st, false) {
			return false
		}
		data = data[i+1:]
	}
	return true
}

// TailOptions bound a Tail. Zero values take the defaults.
type TailOptions struct {
	MaxBytes     int // default 64 KiB
	MaxChunks    int // default 256
	MaxLines     int // default 200
	MaxLineBytes int // default 16 KiB
}

// Tail keeps a rolling window of recent output, bounded in bytes, chunks
// and lines. Push every chunk (beside writing it to your own log);
// Snapshot returns the window at once, even while the process is quiet.
// It is not safe for concurrent use.
type Tail struct {
	o      TailOptions
	chunks []Chunk
	bytes  int
	// truncated records that older output was discarded (or lost).
	truncated bool
}

// NewTail makes an empty tail.
func NewTail(o TailOptions) *Tail {
	if o.MaxBytes <= 0 {
		o.MaxBytes = 64 << 10
	}
	if o.MaxChunks <= 0 {
		o.MaxChunks = 256
	}
	if o.MaxLines <= 0 {
		o.MaxLines = 200
	}
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = 16 << 10
	}
	return &Tail{o: o}
}

// Push adds a chunk; a gap marks the window truncated.
func (t *Tail) Push(ch Chunk) {
	if ch.Lost > 0 {
		t.truncated = true
		return
	}
	data := ch.Bytes
	if data == nil {
		data = []byte(ch.Text)
	}
	if len(data) > t.o.MaxBytes {
		data = data[len(data)-t.o.MaxBytes:]
		t.truncated = true
	}
	ch.Bytes, ch.Text = bytes.Clone(data), ""
	t.chunks = append(t.chunks, ch)
	t.bytes += len(data)
	for t.bytes > t.o.MaxBytes || len(t.chunks) > t.o.MaxChunks {
		t.bytes -= len(t.chunks[0].Bytes)
		t.chunks[0] = Chunk{}
		t.chunks = t.chunks[1:]
		t.truncated = true
	}
}

// Snapshot is the window as lines, at most MaxLines of the newest (each
// clipped to MaxLineBytes), and whether anything before it was discarded.
// Its first and last lines can be partial.
func (t *Tail) Snapshot() (lines []Line, truncated bool) {
	seq := func(yield func(Chunk, error) bool) {
		for _, ch := range t.chunks {
			if !yield(ch, nil) {
				return
			}
		}
	}
	for l, err := range ReadLines(seq, t.o.MaxLineBytes) {
		if err == nil {
			lines = append(lines, l)
		}
	}
	truncated = t.truncated
	if len(lines) > t.o.MaxLines {
		lines = lines[len(lines)-t.o.MaxLines:]
		truncated = true
	}
	return lines, truncated
}
