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
	// header, and each run's begin, drop and end records. They are lines of
	// a private stream named "kiln", "<time> kiln F <JSON>", which
	// application output cannot forge: the writer alone writes every
	// record's header (time, stream, tag), output is only ever a record's
	// content, and content never holds a newline. CRI readers that take
	// stdout and stderr only pass over them. Logs of the previous format
	// kept them in the tags of empty partial lines of stdout or stderr
	// (metaTag), which the reader still understands.
	LogMeta
)

// metaTag opened the tag of a metadata record in logs of the previous
// format: the CRI partial tag, then more tags holding the metadata as
// JSON, on an empty line of stdout or stderr. The reader still reads them.
const metaTag = "P:kiln:"

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
	// On is, for a drop record, the stream that lost the bytes (the first
	// of them, if a record of the earliest format counts both).
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
	r, _, err := parseLine(line)
	return r, err
}

// parseLine is parseRecord that also says whether a metadata record is of
// the previous format, held in the tags of an empty line of stream On.
func parseLine(line []byte) (Record, bool, error) {
	var r Record
	if len(line) > maxLine+64 {
		return r, false, fmt.Errorf("%w: %d bytes is longer than any record", errRecord, len(line))
	}
	ts, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return r, false, fmt.Errorf("%w: no stream", errRecord)
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return r, false, fmt.Errorf("%w: timestamp: %w", errRecord, err)
	}
	r.Time = t
	name, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		return r, false, fmt.Errorf("%w: no tag", errRecord)
	}
	switch string(name) {
	case "stdout":
		r.Stream = LogStdout
	case "stderr":
		r.Stream = LogStderr
	case "kiln":
		r.Stream = LogMeta
	default:
		return r, false, fmt.Errorf("%w: unknown stream %q", errRecord, clip(name))
	}
	tags, content, _ := bytes.Cut(rest, []byte{' '})
	if r.Stream != LogMeta {
		if m, ok := bytes.CutPrefix(tags, []byte(metaTag)); ok {
			if len(content) != 0 {
				return r, false, fmt.Errorf("%w: metadata record with content", errRecord)
			}
			r.On, r.Stream, r.Partial = r.Stream, LogMeta, false
			r.Content = bytes.TrimRight(m, ":")
			return r, true, nil
		}
	}
	tag, _, _ := bytes.Cut(tags, []byte{':'})
	switch string(tag) {
	case "P":
		r.Partial = true
	case "F":
	default:
		return r, false, fmt.Errorf("%w: tag %q is neither P nor F", errRecord, clip(tags))
	}
	if len(content) > MaxContent && r.Stream != LogMeta {
		return r, false, fmt.Errorf("%w: %d bytes of content, more than %d", errRecord, len(content), MaxContent)
	}
	r.Content = content
	return r, false, nil
}

func clip(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}

// Metadata events.
const (
	// eventFile opens every log file and is never changed: the file's
	// sequence number, how many log bytes all earlier files held (so a
	// reader that finds files missing knows exactly how much it missed),
	// the run whose records it holds, and where each stream stands at its
	// start (so every record's stream offset is known).
	eventFile = "file"
	// eventBegin follows the header of a run's first file: the run began
	// there. It is synced before the process starts. A run that continues
	// another names it (Parent) and where each stream stands as it begins
	// (At): a process restored from a memory snapshot goes on in a run of
	// its own, from where the snapshot's run stood, in each sandbox made
	// from it.
	eventBegin = "begin"
	// eventDrop says how many bytes of a stream were lost right before
	// that stream's next record.
	eventDrop = "drop"
	// eventEnd is the run's last record: its writer finished, and lost
	// exactly Dropped bytes of each stream in the whole run.
	eventEnd = "end"
)

// Meta is the content of a metadata record.
type Meta struct {
	Event string `json:"event"`
	// A file record's sequence number and starting log offset.
	Seq    int64  `json:"seq,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	Run    string `json:"run,omitempty"`
	// A begin record's, when the run continues another: that run's id.
	// At is then where each stream stands as the run begins.
	Parent string `json:"parent,omitempty"`
	// A previous-format header's: the run began in this file.
	Began bool `json:"began,omitempty"`
	// A header's: each stream's offset at the file's start; a continuing
	// run's begin record's: each stream's offset where the run begins.
	At *Positions `json:"at,omitempty"`
	// A drop record's per-stream bytes lost since the previous drop record.
	Stdout int64 `json:"stdout,omitempty"`
	Stderr int64 `json:"stderr,omitempty"`
	// A previous-format header's, rewritten once its run ended: when, and
	// the file's size then.
	Ended *time.Time `json:"ended,omitempty"`
	Size  int64      `json:"size,omitempty"`
	// An end record's per-stream bytes lost in the whole run (and a
	// previous-format header's, once its run had ended).
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

// parseMeta decodes and checks a metadata record's content: a record of
// the kiln stream, or (tagged set) one of the previous format's, kept in
// the tags of an empty stdout or stderr line.
func parseMeta(content []byte, tagged bool) (Meta, error) {
	var m Meta
	if err := json.Unmarshal(content, &m); err != nil {
		return m, fmt.Errorf("%w: %w", errMeta, err)
	}
	if m.Stdout < 0 || m.Stderr < 0 || m.Seq < 0 || m.Offset < 0 || m.Size < 0 {
		return m, fmt.Errorf("%w: negative count", errMeta)
	}
	if m.Dropped != nil && (m.Dropped.Stdout < 0 || m.Dropped.Stderr < 0) || m.At != nil && (m.At.Stdout < 0 || m.At.Stderr < 0) {
		return m, fmt.Errorf("%w: negative count", errMeta)
	}
	if tagged {
		if m.Parent != "" {
			return m, fmt.Errorf("%w: a parent in a tag", errMeta)
		}
		return m, checkTagged(m)
	}
	if m.Parent != "" && m.Event != eventBegin {
		return m, fmt.Errorf("%w: only a begin record names a parent run", errMeta)
	}
	if m.Began || m.Ended != nil || m.Size != 0 {
		return m, fmt.Errorf("%w: a %s record of the kiln stream says what only a rewritten header said", errMeta, m.Event)
	}
	switch m.Event {
	case eventFile:
		if m.Seq == 0 {
			return m, fmt.Errorf("%w: file record needs a sequence number", errMeta)
		}
		if m.Stdout != 0 || m.Stderr != 0 || m.Dropped != nil {
			return m, fmt.Errorf("%w: a file record counts no loss", errMeta)
		}
		if m.Run == "" { // the earliest format's: nothing but where it stands
			if m.At != nil {
				return m, fmt.Errorf("%w: a file record without a run says nothing of one", errMeta)
			}
			return m, nil
		}
		if m.At == nil {
			return m, fmt.Errorf("%w: a header needs the streams' offsets", errMeta)
		}
	case eventBegin, eventEnd:
		// A begin carries where the streams stand exactly when it names
		// the run it continues.
		continues := m.Event == eventBegin && m.Parent != ""
		if m.Stdout != 0 || m.Stderr != 0 || (m.At != nil) != continues || m.Seq != 0 || m.Offset != 0 {
			return m, fmt.Errorf("%w: fields of other records on a %s record", errMeta, m.Event)
		}
		if (m.Event == eventEnd) != (m.Dropped != nil) {
			return m, fmt.Errorf("%w: only an end record carries dropped, and it must", errMeta)
		}
		if continues {
			if err := checkRunID(m.Parent); err != nil || m.Parent == m.Run {
				return m, fmt.Errorf("%w: parent %q: want another run's canonical UUID", errMeta, clip([]byte(m.Parent)))
			}
		}
	case eventDrop:
		if m.Stdout+m.Stderr == 0 || m.Dropped != nil || m.At != nil || m.Seq != 0 || m.Offset != 0 {
			return m, fmt.Errorf("%w: a drop record counts lost bytes and nothing else", errMeta)
		}
	default:
		return m, fmt.Errorf("%w: unknown event %q", errMeta, m.Event)
	}
	if err := checkRunID(m.Run); err != nil {
		return m, fmt.Errorf("%w: %w", errMeta, err)
	}
	return m, nil
}

// checkTagged checks a metadata record of the previous format: a file's
// header (rewritten once its run ended), or a drop record of the header's
// run, counting one stream.
func checkTagged(m Meta) error {
	switch m.Event {
	case eventFile:
		if m.Seq == 0 {
			return fmt.Errorf("%w: file record needs a sequence number", errMeta)
		}
		if err := checkRunID(m.Run); err != nil {
			return fmt.Errorf("%w: %w", errMeta, err)
		}
		if m.At == nil || (m.Ended == nil) != (m.Dropped == nil) || (m.Ended == nil) != (m.Size == 0) || m.Stdout != 0 || m.Stderr != 0 {
			return fmt.Errorf("%w: a header needs the streams' offsets, and an end with its loss", errMeta)
		}
	case eventDrop:
		if m.Run != "" || m.Stdout+m.Stderr == 0 || m.Stdout != 0 && m.Stderr != 0 || m.Began || m.At != nil || m.Ended != nil || m.Dropped != nil || m.Size != 0 {
			return fmt.Errorf("%w: a drop record counts the bytes of one stream", errMeta)
		}
	default:
		return fmt.Errorf("%w: event %q in a tag", errMeta, m.Event)
	}
	return nil
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

// appendMeta appends a metadata record: a full line of the kiln stream
// whose content is m as JSON.
func appendMeta(dst, ts []byte, m Meta) []byte {
	dst = append(dst, ts...)
	dst = append(dst, " kiln F "...)
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // a struct of strings, integers and a time always encodes
	}
	dst = append(dst, b...)
	return append(dst, '\n')
}
