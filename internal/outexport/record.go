// The messages of a process's subject: chunks of output and records, each
// with the offset vector, as headers and a payload.

package outexport

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sandkiln/sandkiln/api"
)

// Headers of every message on a process's subject ("Nats-" is the
// server's).
const (
	// hKind is what the message is: kindStdout, kindStderr or
	// kindTerminal for a chunk of that stream, kindRecord for a record.
	hKind = "Kiln-S"
	// hStdout, hStderr and hTerminal are the offset vector: each of the
	// process's streams' offset before the message. A process has
	// stdout and stderr, or the terminal alone; only its streams are
	// there.
	hStdout   = "Kiln-O"
	hStderr   = "Kiln-E"
	hTerminal = "Kiln-T"
	// hSeq is a chunk's kiln.v1 seq (its first byte's).
	hSeq = "Kiln-Q"
	// hRun is the run: one UUID for the whole export of a process,
	// chosen by its begin record.
	hRun = "Kiln-R"
	// hWriter is the exporter that published the message, a UUID of its
	// own: after a refused compare-and-append it tells whether the
	// subject's last message is its own.
	hWriter = "Kiln-W"
)

// Kinds of message (hKind).
const (
	kindStdout   = "o"
	kindStderr   = "e"
	kindTerminal = "t"
	kindRecord   = "k"
)

// numStreams bounds the kiln.v1 stream codes (api.StreamStdout …
// api.StreamTerminal), which index the vectors.
const numStreams = 4

// vecHeaders names each stream's header in the vector, by stream code.
var vecHeaders = [numStreams]string{api.StreamStdout: hStdout, api.StreamStderr: hStderr, api.StreamTerminal: hTerminal}

// kinds is each stream's chunk kind, by stream code.
var kinds = [numStreams]string{api.StreamStdout: kindStdout, api.StreamStderr: kindStderr, api.StreamTerminal: kindTerminal}

// vector is where each of a process's streams stands: how many bytes of
// it come before a point of the subject.
type vector struct {
	has [numStreams]bool
	off [numStreams]int64
}

// streamCode is the code of the stream named name, 0 if none.
func streamCode(name string) byte {
	for code, n := range api.StreamNames {
		if n == name {
			return code
		}
	}
	return 0
}

// offsets are the vector's positions by stream name.
func (v vector) offsets() Offsets {
	o := Offsets{}
	for s := byte(1); s < numStreams; s++ {
		if v.has[s] {
			o[api.StreamNames[s]] = v.off[s]
		}
	}
	return o
}

// message is one message of a process's subject, decoded.
type message struct {
	kind   string
	at     vector // before the message
	seq    uint64 // a chunk's
	run    string
	writer string
	data   []byte // a chunk's bytes or a record's JSON
	// Set on messages read back from the stream.
	streamSeq uint64
	rec       record // a record's, decoded
}

// stream is a chunk's stream code, 0 for a record.
func (m *message) stream() byte {
	for s, k := range kinds {
		if k != "" && k == m.kind {
			return byte(s)
		}
	}
	return 0
}

// after is the vector after the message: past a chunk's bytes, or past a
// gap record's lost bytes.
func (m *message) after() vector {
	v := m.at
	if s := m.stream(); s != 0 {
		v.off[s] += int64(len(m.data))
	} else if m.rec.Event == eventGap {
		if s := streamCode(m.rec.Stream); s != 0 {
			v.off[s] = max(v.off[s], m.rec.From+m.rec.Lost)
		}
	}
	return v
}

// walker is told what a subject's messages say to a reader of them, in
// order, from where it stands (advance).
type walker interface {
	// gap: stream s's bytes from from to to are not on the subject.
	gap(s byte, from, to int64)
	// held: stream s's bytes from from to to are m's, a chunk that
	// begins at start.
	held(m *message, s byte, start, from, to int64)
	// end: stream s's total, an end record's.
	end(s byte, total int64)
}

// advance moves v, where a reader of a subject stands, past message m, a
// chunk of size bytes or a record, telling w what m says beyond v: a gap
// for each stream m's vector is past v in, then m's bytes that v has not
// had, a gap record's loss, or an end record's totals (each stream v has
// or the record names, after a gap up to it).
func (v *vector) advance(m *message, size int64, w walker) {
	gapTo := func(s byte, to int64) {
		if s == 0 {
			return
		}
		v.has[s] = true
		if from := v.off[s]; to > from {
			w.gap(s, from, to)
			v.off[s] = to
		}
	}
	for s := byte(1); s < numStreams; s++ {
		if m.at.has[s] {
			gapTo(s, m.at.off[s])
		}
	}
	if s := m.stream(); s != 0 {
		v.has[s] = true
		start, end := m.at.off[s], m.at.off[s]+size
		if end > v.off[s] {
			// from ≥ start: the gaps above brought v up to start.
			w.held(m, s, start, v.off[s], end)
			v.off[s] = end
		}
		return
	}
	switch m.rec.Event {
	case eventGap:
		gapTo(streamCode(m.rec.Stream), m.rec.From+m.rec.Lost)
	case eventEnd:
		for s := byte(1); s < numStreams; s++ {
			total, ok := m.rec.Totals[api.StreamNames[s]]
			if !ok && !v.has[s] {
				continue
			}
			total = max(total, m.at.off[s])
			gapTo(s, total)
			w.end(s, total)
		}
	}
}

// same reports whether o is m as this writer published it: the same
// writer, kind and vector (a writer publishes each vector once).
func (m *message) same(o *message) bool {
	return m.writer == o.writer && m.kind == o.kind && m.at == o.at
}

// natsMsg is m as published on subject.
func (m *message) natsMsg(subject string) *nats.Msg {
	h := nats.Header{}
	h.Set(hKind, m.kind)
	for s := byte(1); s < numStreams; s++ {
		if m.at.has[s] {
			h.Set(vecHeaders[s], strconv.FormatInt(m.at.off[s], 10))
		}
	}
	if m.kind != kindRecord {
		h.Set(hSeq, strconv.FormatUint(m.seq, 10))
	}
	h.Set(hRun, m.run)
	h.Set(hWriter, m.writer)
	return &nats.Msg{Subject: subject, Header: h, Data: m.data}
}

// errForeign says a message on a process's subject is not one an
// exporter wrote.
var errForeign = errors.New("not an exporter's message")

// decode reads a message of a process's subject: its headers, and a
// record's JSON. What is not one of the exporter's messages is an error
// wrapping errForeign.
func decode(h nats.Header, data []byte, streamSeq uint64) (*message, error) {
	m := &message{kind: h.Get(hKind), run: h.Get(hRun), writer: h.Get(hWriter), data: data, streamSeq: streamSeq}
	switch m.kind {
	case kindStdout, kindStderr, kindTerminal:
		seq, err := strconv.ParseUint(h.Get(hSeq), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("outexport: %w: message %d: seq %q", errForeign, streamSeq, api.Clip(h.Get(hSeq)))
		}
		m.seq = seq
	case kindRecord:
		if err := json.Unmarshal(data, &m.rec); err != nil {
			return nil, fmt.Errorf("outexport: %w: message %d: record: %w", errForeign, streamSeq, err)
		}
		if err := m.rec.check(); err != nil {
			return nil, fmt.Errorf("outexport: %w: message %d: %w", errForeign, streamSeq, err)
		}
	default:
		return nil, fmt.Errorf("outexport: %w: message %d: kind %q", errForeign, streamSeq, api.Clip(m.kind))
	}
	var err error
	if m.at, err = decodeVector(h, m.stream(), streamSeq); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeVector reads the offset vector of message streamSeq's headers h,
// a chunk of stream s or (s 0) a record.
func decodeVector(h nats.Header, s byte, streamSeq uint64) (vector, error) {
	var at vector
	for st := byte(1); st < numStreams; st++ {
		v := h.Get(vecHeaders[st])
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return at, fmt.Errorf("outexport: %w: message %d: %s offset %q", errForeign, streamSeq, api.StreamNames[st], api.Clip(v))
		}
		at.has[st], at.off[st] = true, n
	}
	if s != 0 && !at.has[s] {
		return at, fmt.Errorf("outexport: %w: message %d: a chunk of %s without its offset", errForeign, streamSeq, api.StreamNames[s])
	}
	return at, nil
}

// Record events.
const (
	// eventBegin is a subject's first record: the process, its command
	// and its streams. The export of the process begins there.
	eventBegin = "begin"
	// eventGap says Lost bytes of Stream from From never reached the
	// stream, and why (Cause).
	eventGap = "gap"
	// eventEnd is the last message: the process's exit, as its agent
	// observed it, and its streams' totals. There is none for a process
	// whose exit was not observed.
	eventEnd = "end"
)

// Causes of a gap record.
const (
	// CauseRingEvicted: the exporter fell behind and the process's ring
	// (and captured log, if any) no longer held the bytes when it came
	// for them.
	CauseRingEvicted = "ring-evicted"
	// CauseExportDown: the exporter could not publish (JetStream
	// unreachable or refusing) or was not running, meanwhile the ring
	// moved on.
	CauseExportDown = "export-down"
)

// record is a record message's payload (kindRecord), JSON.
type record struct {
	Event string `json:"event"`
	// A begin record's.
	Node     string     `json:"node,omitempty"`
	Sandbox  string     `json:"sandbox,omitempty"`
	Process  string     `json:"process,omitempty"`
	Argv     []string   `json:"argv,omitempty"`
	Start    *time.Time `json:"start,omitempty"`
	Terminal bool       `json:"terminal,omitempty"`
	Streams  []string   `json:"streams,omitempty"`
	// A gap record's.
	Stream string `json:"stream,omitempty"`
	From   int64  `json:"from,omitempty"`
	Lost   int64  `json:"lost,omitempty"`
	Cause  string `json:"cause,omitempty"`
	// An end record's: the exit and each stream's total. (What the
	// export lost is its gap records' sum; what a reader lost, the
	// vectors tell it.)
	Exit   *api.Exit        `json:"exit,omitempty"`
	Totals map[string]int64 `json:"totals,omitempty"`
}

// check refuses a record that does not say what its event needs.
func (r *record) check() error {
	switch r.Event {
	case eventBegin:
	case eventGap:
		if streamCode(r.Stream) == 0 || r.From < 0 || r.Lost <= 0 {
			return fmt.Errorf("gap record of %d bytes of %q at %d", r.Lost, api.Clip(r.Stream), r.From)
		}
	case eventEnd:
		for s, n := range r.Totals {
			if streamCode(s) == 0 || n < 0 {
				return fmt.Errorf("end record: total %d of %q", n, api.Clip(s))
			}
		}
	default:
		return fmt.Errorf("record event %q", api.Clip(r.Event))
	}
	return nil
}

// recordMsg is a record message at vector at.
func recordMsg(r record, at vector, run, writer string) *message {
	b, _ := json.Marshal(r)
	return &message{kind: kindRecord, at: at, run: run, writer: writer, data: b, rec: r}
}
