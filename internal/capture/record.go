package capture

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// LogStream is the stream a record belongs to in the log.
type LogStream uint8

const (
	// LogStdout holds the process's standard output (and a terminal's
	// combined output: a process with a terminal has no separate streams).
	LogStdout LogStream = iota
	// LogStderr holds the process's standard error.
	LogStderr
	// LogMeta is what the writer says of the log itself: each file's
	// header, and drop records. Only the writer can produce these records,
	// because it alone writes every record's header (time, stream, tag),
	// application output is only ever a record's content, and content never
	// holds a newline. The records are ordinary CRI lines of stdout or
	// stderr whose tag is metaTag and whose content is empty: a CRI reader
	// (kubelet's, a log shipper's) sees an empty partial line and prints
	// nothing for it. Logs of an earlier format kept them in a stream of
	// their own, named "kiln", which the reader still understands.
	LogMeta
)

// metaTag opens the tag of a metadata record: the CRI partial tag, then
// more tags (which CRI readers ignore) holding the metadata as JSON.
const metaTag = "P:kiln:"

// HeaderSize is the length of every file's first record, its header. The
// header is rewritten in place when the file's run ends, so it has one
// size whatever it says; at 512 bytes it is one disk sector.
const HeaderSize = 512

// NumLogStreams counts the application streams in the log (stdout, stderr).
const NumLogStreams = 2

var logStreamNames = [...]string{LogStdout: "stdout", LogStderr: "stderr", LogMeta: "kiln"}

func (s LogStream) String() string {
	if int(s) < len(logStreamNames) {
		return logStreamNames[s]
	}
	return fmt.Sprintf("logstream(%d)", uint8(s))
}

// MaxContent is the most content one record carries. A longer line is
// written as several partial (P) records followed by a full (F) one.
const MaxContent = 16 << 10

// timeLayout is RFC 3339 with nanoseconds at a fixed width, so records sort
// by their text; time.RFC3339Nano parses it.
const timeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// maxHeader bounds a record's bytes before its content: the fixed-width
// UTC timestamp (30), the longest stream name, the tag and three spaces.
const maxHeader = len("2006-01-02T15:04:05.000000000Z") + len(" stdout P ")

// maxLine bounds a well-formed record line without its newline. The reader
// treats anything longer as corrupt.
const maxLine = maxHeader + MaxContent

// Record is one line of the log.
type Record struct {
	Time   time.Time
	Stream LogStream
	// Partial is set for a P record: a fragment of a line that continues in
	// the stream's next record. An F record ends the line, and its content
	// is followed by a newline in the payload; a trailing P that nothing
	// follows is a final line that had no newline.
	Partial bool
	// Content is the record's payload bytes, exactly as the process wrote
	// them, without the newline that ends an F record; for metadata, its
	// JSON. A reader's Content is only valid until its next call.
	Content []byte
	// On is, for metadata, the stream the record is written on: a drop
	// record's is the stream that lost the bytes.
	On LogStream
}

// Payload returns the bytes the record stands for in its stream: the
// content, plus a newline for a full record.
func (r Record) Payload() []byte {
	if r.Partial || r.Stream == LogMeta {
		return r.Content
	}
	return append(r.Content[:len(r.Content):len(r.Content)], '\n')
}

// PayloadLen is len(r.Payload()) without building it.
func (r Record) PayloadLen() int {
	if r.Partial || r.Stream == LogMeta {
		return len(r.Content)
	}
	return len(r.Content) + 1
}

// appendRecord appends one encoded record, newline included. Content must
// not contain a newline.
func appendRecord(dst, ts []byte, s LogStream, partial bool, content []byte) []byte {
	dst = append(dst, ts...)
	dst = append(dst, ' ')
	dst = append(dst, logStreamNames[s]...)
	if partial {
		dst = append(dst, " P "...)
	} else {
		dst = append(dst, " F "...)
	}
	dst = append(dst, content...)
	return append(dst, '\n')
}

// appendTime appends t in the log's timestamp layout, in UTC.
func appendTime(dst []byte, t time.Time) []byte {
	return t.UTC().AppendFormat(dst, timeLayout)
}

var errRecord = errors.New("malformed record")

// parseRecord parses one line without its newline. Content aliases line.
// It accepts what CRI writers produce: any RFC 3339 timestamp, extra tags
// after P or F joined with ':', and an empty content with or without the
// space before it.
func parseRecord(line []byte) (Record, error) {
	var r Record
	if len(line) > maxLine+64 {
		return r, fmt.Errorf("%w: %d bytes is longer than any record", errRecord, len(line))
	}
	ts, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return r, fmt.Errorf("%w: no stream", errRecord)
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return r, fmt.Errorf("%w: timestamp: %v", errRecord, err)
	}
	r.Time = t
	name, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		return r, fmt.Errorf("%w: no tag", errRecord)
	}
	switch string(name) {
	case "stdout":
		r.Stream = LogStdout
	case "stderr":
		r.Stream = LogStderr
	case "kiln":
		r.Stream = LogMeta
	default:
		return r, fmt.Errorf("%w: unknown stream %q", errRecord, clip(name))
	}
	tags, content, _ := bytes.Cut(rest, []byte{' '})
	if r.Stream != LogMeta {
		if m, ok := bytes.CutPrefix(tags, []byte(metaTag)); ok {
			if len(content) != 0 {
				return r, fmt.Errorf("%w: metadata record with content", errRecord)
			}
			r.On, r.Stream, r.Partial = r.Stream, LogMeta, false
			r.Content = bytes.TrimRight(m, ":")
			return r, nil
		}
	}
	tag, _, _ := bytes.Cut(tags, []byte{':'})
	switch string(tag) {
	case "P":
		r.Partial = true
	case "F":
	default:
		return r, fmt.Errorf("%w: tag %q is neither P nor F", errRecord, clip(tags))
	}
	if len(content) > MaxContent && r.Stream != LogMeta {
		return r, fmt.Errorf("%w: %d bytes of content, more than %d", errRecord, len(content), MaxContent)
	}
	r.Content = content
	return r, nil
}

func clip(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}

// Metadata events.
const (
	// eventFile opens every log file: its sequence number, how many log
	// bytes all earlier files held (so a reader that finds files missing
	// knows exactly how much it missed), the run it holds, whether the run
	// began in it, and where each stream stands at its start. When the run
	// ends, its last file's header is rewritten to say so, with the run's
	// loss: the end is known from the start of the file, and no record
	// follows the run's last line (a reader's "last N lines" are the
	// output's).
	eventFile = "file"
	// eventDrop says how many bytes of the record's stream were lost right
	// before the stream's next record.
	eventDrop = "drop"
	// The earlier format's begin and end records.
	eventBegin = "begin"
	eventEnd   = "end"
)

// Meta is the content of a metadata record.
type Meta struct {
	Event string `json:"event"`
	// A file record's sequence number and starting log offset.
	Seq    int64  `json:"seq,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	Run    string `json:"run,omitempty"`
	// A header's: the run began in this file; each stream's offset at the
	// file's start.
	Began bool       `json:"began,omitempty"`
	At    *Positions `json:"at,omitempty"`
	// A drop record's per-stream bytes lost since the previous drop record.
	Stdout int64 `json:"stdout,omitempty"`
	Stderr int64 `json:"stderr,omitempty"`
	// A header's, once its run ended: when, and the file's size then.
	// What the file holds beyond it, or short of it, was not written by
	// the run.
	Ended *time.Time `json:"ended,omitempty"`
	Size  int64      `json:"size,omitempty"`
	// An end record's per-stream bytes lost in the whole run; in a header,
	// set once the run has ended.
	Dropped *Dropped `json:"dropped,omitempty"`
}

// Dropped is an end record's loss per stream.
type Dropped struct {
	Stdout int64 `json:"stdout"`
	Stderr int64 `json:"stderr"`
}

// Positions are per-stream offsets: how many bytes each stream had
// produced before a point of the log.
type Positions struct {
	Stdout int64 `json:"stdout"`
	Stderr int64 `json:"stderr"`
}

var errMeta = errors.New("invalid metadata")

// parseMeta decodes and checks a metadata record's content: a kiln
// record of the earlier format, or (header set) a header or drop record.
func parseMeta(content []byte) (Meta, error) {
	var m Meta
	if err := json.Unmarshal(content, &m); err != nil {
		return m, fmt.Errorf("%w: %v", errMeta, err)
	}
	if m.Stdout < 0 || m.Stderr < 0 || m.Seq < 0 || m.Offset < 0 || m.Size < 0 {
		return m, fmt.Errorf("%w: negative count", errMeta)
	}
	if m.Dropped != nil && (m.Dropped.Stdout < 0 || m.Dropped.Stderr < 0) || m.At != nil && (m.At.Stdout < 0 || m.At.Stderr < 0) {
		return m, fmt.Errorf("%w: negative count", errMeta)
	}
	switch m.Event {
	case eventFile:
		if m.Seq == 0 {
			return m, fmt.Errorf("%w: file record needs a sequence number", errMeta)
		}
		if m.Run == "" { // the earlier format's: nothing but where it stands
			if m.Began || m.At != nil || m.Ended != nil || m.Dropped != nil || m.Size != 0 {
				return m, fmt.Errorf("%w: a file record without a run says nothing of one", errMeta)
			}
			return m, nil
		}
		if err := checkRunID(m.Run); err != nil {
			return m, fmt.Errorf("%w: %v", errMeta, err)
		}
		if m.At == nil || (m.Ended == nil) != (m.Dropped == nil) || (m.Ended == nil) != (m.Size == 0) || m.Stdout != 0 || m.Stderr != 0 {
			return m, fmt.Errorf("%w: a header needs the streams' offsets, and an end with its loss", errMeta)
		}
		return m, nil
	case eventDrop:
		if m.Run == "" { // a drop record of a header's run
			if m.Stdout+m.Stderr == 0 || m.Stdout != 0 && m.Stderr != 0 {
				return m, fmt.Errorf("%w: a drop record counts the bytes of one stream", errMeta)
			}
			return m, nil
		}
	case eventBegin, eventEnd:
	default:
		return m, fmt.Errorf("%w: unknown event %q", errMeta, m.Event)
	}
	if err := checkRunID(m.Run); err != nil {
		return m, fmt.Errorf("%w: %v", errMeta, err)
	}
	if (m.Event == eventEnd) != (m.Dropped != nil) || m.Began || m.At != nil || m.Ended != nil || m.Size != 0 {
		return m, fmt.Errorf("%w: only an end record carries dropped, and it must", errMeta)
	}
	if m.Event != eventDrop && (m.Stdout != 0 || m.Stderr != 0) {
		return m, fmt.Errorf("%w: per-stream counts on a %s record", errMeta, m.Event)
	}
	return m, nil
}

// checkRunID accepts only a canonical, non-nil UUID: lower-case hex with
// hyphens, 36 characters, as uuid.UUID.String writes it.
func checkRunID(id string) error {
	u, err := uuid.Parse(id)
	if err != nil || u.String() != id || u == uuid.Nil {
		return fmt.Errorf("run id %q is not a canonical UUID", clip([]byte(id)))
	}
	return nil
}

// appendMeta appends a metadata record on stream on: an empty partial
// line whose tag holds m.
func appendMeta(dst, ts []byte, on LogStream, m Meta) []byte { return appendTagged(dst, ts, on, m, 0) }

// appendHeader appends a file's header: a metadata record of HeaderSize.
func appendHeader(dst, ts []byte, on LogStream, m Meta) []byte {
	return appendTagged(dst, ts, on, m, HeaderSize)
}

// appendTagged appends a metadata record, padded with empty tags to size
// bytes when size is set.
func appendTagged(dst, ts []byte, on LogStream, m Meta, size int) []byte {
	start := len(dst)
	dst = append(dst, ts...)
	dst = append(dst, ' ')
	dst = append(dst, logStreamNames[on]...)
	dst = append(dst, ' ')
	dst = append(dst, metaTag...)
	dst = appendJSON(dst, m)
	if size > 0 {
		pad := size - 2 - (len(dst) - start)
		if pad < 0 {
			panic(fmt.Sprintf("capture: a header of %d bytes, more than %d", len(dst)-start+2, size))
		}
		for range pad {
			dst = append(dst, ':')
		}
	}
	return append(dst, " \n"...)
}

func appendJSON(dst []byte, m Meta) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // a struct of strings, integers and a time always encodes
	}
	// No space may appear in a tag; JSON of these fields has none (the run
	// id is checked, times are RFC 3339).
	return append(dst, b...)
}
