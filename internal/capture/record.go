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
	// LogMeta is the private metadata stream. Its records are written by
	// the writer alone: application output cannot produce them, because
	// every record's header is the writer's and content never holds a
	// newline.
	LogMeta
)

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
	// them, without the newline that ends an F record. A reader's Content
	// is only valid until its next call.
	Content []byte
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

// Metadata events on the kiln stream.
const (
	eventBegin = "begin"
	eventDrop  = "drop"
	eventEnd   = "end"
	// eventFile opens every log file: its sequence number and how many log
	// bytes all earlier files held, so a reader that finds files missing
	// knows exactly how much it missed.
	eventFile = "file"
)

// Meta is the content of a kiln record.
type Meta struct {
	Run   string `json:"run,omitempty"`
	Event string `json:"event"`
	// A drop record's per-stream bytes lost since the previous drop record.
	Stdout int64 `json:"stdout,omitempty"`
	Stderr int64 `json:"stderr,omitempty"`
	// An end record's per-stream bytes lost in the whole run.
	Dropped *Dropped `json:"dropped,omitempty"`
	// A file record's sequence number and starting log offset.
	Seq    int64 `json:"seq,omitempty"`
	Offset int64 `json:"offset,omitempty"`
}

// Dropped is an end record's loss per stream.
type Dropped struct {
	Stdout int64 `json:"stdout"`
	Stderr int64 `json:"stderr"`
}

var errMeta = errors.New("invalid metadata")

// parseMeta decodes and checks a kiln record's content.
func parseMeta(content []byte) (Meta, error) {
	var m Meta
	if err := json.Unmarshal(content, &m); err != nil {
		return m, fmt.Errorf("%w: %v", errMeta, err)
	}
	if m.Stdout < 0 || m.Stderr < 0 || m.Seq < 0 || m.Offset < 0 {
		return m, fmt.Errorf("%w: negative count", errMeta)
	}
	switch m.Event {
	case eventFile:
		if m.Run != "" || m.Seq == 0 {
			return m, fmt.Errorf("%w: file record needs a sequence number and no run", errMeta)
		}
		return m, nil
	case eventBegin, eventDrop, eventEnd:
	default:
		return m, fmt.Errorf("%w: unknown event %q", errMeta, m.Event)
	}
	if err := checkRunID(m.Run); err != nil {
		return m, fmt.Errorf("%w: %v", errMeta, err)
	}
	if (m.Event == eventEnd) != (m.Dropped != nil) {
		return m, fmt.Errorf("%w: only an end record carries dropped, and it must", errMeta)
	}
	if m.Dropped != nil && (m.Dropped.Stdout < 0 || m.Dropped.Stderr < 0) {
		return m, fmt.Errorf("%w: negative count", errMeta)
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

func appendMeta(dst, ts []byte, m Meta) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // a struct of strings and integers always encodes
	}
	return appendRecord(dst, ts, LogMeta, false, b)
}
