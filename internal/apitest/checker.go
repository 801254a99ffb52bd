// Package apitest holds a process API's watchers to the kiln.v1 stream contract, runs the contract's scenarios against any server that serves the API, and holds a server's answers to its OpenAPI document.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
)

// TypeFrame is what Checker.Message reports for a binary message; the
// text messages are reported by their api.Type.
const TypeFrame = "frame"

// Checker follows one kiln.v1 connection, message by message, and holds it
// to the contract: the hello first; per stream, every frame and gap
// starting exactly where the last one ended (at the resume offset first),
// each gap's lost_bytes its length, and one end whose total_bytes is every
// byte accounted; seq rising across the connection's frames, which never
// overlap in the process's output; nothing of a stream after its end; then
// the exit, once, after every stream's end, and a normal close after it.
//
// Set the options before the first message. A Checker belongs to one
// goroutine; its fields say what the connection said so far.
type Checker struct {
	// From are the offsets the watcher resumed from, by stream name, as
	// its query gave them; a stream not named resumes from 0.
	From map[string]int64
	// Keep keeps every stream's data in its Stream.Data.
	Keep bool
	// Check, when set, is given every frame's data with its stream and
	// offset before the frame is counted; its error fails the frame. The
	// data is valid only during the call.
	Check func(stream string, offset int64, data []byte) error
	// NoGaps refuses any gap: a watcher holding a flow block process's
	// output loses nothing.
	NoGaps bool

	// Hello is the connection's hello, once it came.
	Hello *api.Hello
	// Streams are the streams the hello named, by name.
	Streams map[string]*Stream
	// Exit is the exit, once it came.
	Exit *api.Exit
	// Messages counts the messages taken, the hello included.
	Messages int
	// Closed is set once the connection closed normally after the exit.
	Closed bool

	framed  bool   // a frame came
	lastSeq uint64 // the last frame's seq
	seqEnd  uint64 // where the last frame's bytes end in the process's output
	buf     bytes.Buffer
}

// Stream is what a watcher was told of one stream, held to the contract
// as it comes: every frame and gap starts where the stream stands (From,
// then where the last one ended), and the end says where that is.
type Stream struct {
	Name string
	// Keep keeps the data in Data; Check and NoGaps are Checker's.
	Keep   bool
	Check  func(stream string, offset int64, data []byte) error
	NoGaps bool

	From      int64 // where the watcher resumed
	Next      int64 // where the next frame or gap must start: From + Delivered + Lost
	Delivered int64 // bytes the frames carried
	Lost      int64 // bytes the gaps said were lost
	Frames    int
	Gaps      int
	Data      []byte // with Keep
	Ended     bool
	Total     int64 // the end's total_bytes

	// decoded is set once the stream took text, whose bytes are not the
	// stream's: from then on only the order of offsets is held.
	decoded bool
	last    int64 // the highest offset taken, for decoded streams
}

// NewStream starts the accounting of stream name from offset from, for a
// reader that is given the output some other way than a Checker (an SDK's
// chunks).
func NewStream(name string, from int64) *Stream {
	return &Stream{Name: name, From: from, Next: from, last: from}
}

// Frame takes data the stream carried at offset.
func (s *Stream) Frame(offset int64, data []byte) error {
	switch {
	case s.Ended:
		return fmt.Errorf("%s frame of %d bytes at offset %d after the stream's end at %d", s.Name, len(data), offset, s.Total)
	case s.decoded && offset < s.last:
		return fmt.Errorf("%s frame of %d bytes at offset %d, before offset %d already taken", s.Name, len(data), offset, s.last)
	case !s.decoded && offset != s.Next:
		return fmt.Errorf("%s frame of %d bytes at offset %d, expected %d (%s)", s.Name, len(data), offset, s.Next, overlap(offset, s.Next))
	}
	if s.Check != nil {
		if err := s.Check(s.Name, offset, data); err != nil {
			return fmt.Errorf("%s frame of %d bytes at offset %d: %w", s.Name, len(data), offset, err)
		}
	}
	if s.Keep {
		s.Data = append(s.Data, data...)
	}
	s.Frames++
	s.Delivered += int64(len(data))
	s.Next = max(s.Next, offset) + int64(len(data))
	s.last = max(s.last, offset)
	return nil
}

// Text takes output an SDK decoded as text, given out with the offset of
// the frame it came in. Text has no byte offsets of its own (a character
// split across frames comes whole with the later one, bytes that are not
// UTF-8 come as U+FFFD), so from the first text on the stream's offsets
// are held only to their order, not to abutting; Delivered counts the
// text's bytes.
func (s *Stream) Text(offset int64, text string) error {
	if s.Ended {
		return fmt.Errorf("%s text %.40q at offset %d after the stream's end at %d", s.Name, text, offset, s.Total)
	}
	if offset < s.last || !s.decoded && offset < s.Next {
		return fmt.Errorf("%s text %.40q at offset %d, before offset %d already taken", s.Name, text, offset, max(s.last, s.Next))
	}
	s.decoded = true
	if s.Keep {
		s.Data = append(s.Data, text...)
	}
	s.Frames++
	s.Delivered += int64(len(text))
	s.last = offset
	return nil
}

// Gap takes the loss of bytes [from, to) of the stream.
func (s *Stream) Gap(from, to int64) error {
	switch {
	case s.NoGaps:
		return fmt.Errorf("%s gap [%d, %d) of %d bytes where nothing may be lost", s.Name, from, to, to-from)
	case s.Ended:
		return fmt.Errorf("%s gap [%d, %d) after the stream's end at %d", s.Name, from, to, s.Total)
	case to <= from:
		return fmt.Errorf("%s gap [%d, %d) is empty", s.Name, from, to)
	case s.decoded && to < s.last:
		return fmt.Errorf("%s gap [%d, %d), before offset %d already taken", s.Name, from, to, s.last)
	case !s.decoded && from != s.Next:
		return fmt.Errorf("%s gap [%d, %d) at offset %d, expected one from %d (%s)", s.Name, from, to, from, s.Next, overlap(from, s.Next))
	}
	s.Gaps++
	s.Lost += to - from
	s.Next = to
	s.last = max(s.last, to)
	return nil
}

// End takes the stream's end after total bytes.
func (s *Stream) End(total int64) error {
	switch {
	case s.Ended:
		return fmt.Errorf("%s ends again at %d, after its end at %d", s.Name, total, s.Total)
	case !s.decoded && total != s.Next:
		return fmt.Errorf("%s ends at %d, but %d bytes are accounted (resumed at %d, %d delivered, %d lost)", s.Name, total, s.Next, s.From, s.Delivered, s.Lost)
	case s.decoded && total < s.last:
		return fmt.Errorf("%s ends at %d, before offset %d already taken", s.Name, total, s.last)
	}
	s.Ended, s.Total = true, total
	return nil
}

// overlap names what a wrong offset means.
func overlap(got, want int64) string {
	if got < want {
		return fmt.Sprintf("overlaps %d bytes already accounted", want-got)
	}
	return fmt.Sprintf("leaves a hole of %d bytes", got-want)
}

// Stream is the stream of that name, or, while the hello has not named
// it, an empty one that no message reached.
func (c *Checker) Stream(name string) *Stream {
	if s := c.Streams[name]; s != nil {
		return s
	}
	return NewStream(name, c.From[name])
}

// Position is where each stream stands: the offsets a watcher that took
// every message so far resumes from.
func (c *Checker) Position() map[string]int64 {
	p := maps.Clone(c.From)
	if p == nil {
		p = map[string]int64{}
	}
	for name, s := range c.Streams {
		p[name] = s.Next
	}
	return p
}

// String says where the connection stands, for errors.
func (c *Checker) String() string {
	names := slices.Sorted(maps.Keys(c.Streams))
	var b strings.Builder
	for _, name := range names {
		s := c.Streams[name]
		fmt.Fprintf(&b, "%s=%d", name, s.Next)
		if s.Ended {
			b.WriteString(" (ended)")
		}
		b.WriteString(" ")
	}
	fmt.Fprintf(&b, "after %d messages", c.Messages)
	if c.Exit != nil {
		b.WriteString(", the exit seen")
	}
	return b.String()
}

// control is what a kiln.v1 text message can carry.
type control struct {
	Type    string                   `json:"type"`
	Streams map[string]api.HelloSpan `json:"streams"` // hello
	Stream  string                   `json:"stream"`  // gap, end
	From    int64                    `json:"from"`    // gap
	To      int64                    `json:"to"`
	Lost    int64                    `json:"lost_bytes"`
	Total   int64                    `json:"total_bytes"` // end
	api.Exit
}

// Message takes one message of the connection and returns its type
// (TypeFrame, or the control message's api.Type). msg is not kept.
func (c *Checker) Message(typ websocket.MessageType, msg []byte) (string, error) {
	c.Messages++
	n := c.Messages
	if c.Exit != nil {
		return "", fmt.Errorf("message %d, %s, after the exit", n, describe(typ, msg))
	}
	if c.Hello == nil && (typ != websocket.MessageText || !isHello(msg)) {
		return "", fmt.Errorf("message %d is %s, want the hello first", n, describe(typ, msg))
	}
	if typ == websocket.MessageBinary {
		return TypeFrame, c.frame(msg)
	}
	if typ != websocket.MessageText {
		return "", fmt.Errorf("message %d of type %v", n, typ)
	}
	var m control
	if err := json.Unmarshal(msg, &m); err != nil {
		return "", fmt.Errorf("message %d, %.200q: %w", n, msg, err)
	}
	if m.Type == api.TypeHello {
		if c.Hello != nil {
			return "", fmt.Errorf("message %d is a second hello: %.200q", n, msg)
		}
		return m.Type, c.hello(m.Streams)
	}
	var s *Stream
	if m.Type == api.TypeGap || m.Type == api.TypeEnd {
		if s = c.Streams[m.Stream]; s == nil {
			return "", fmt.Errorf("message %d is a %s of stream %q, which the hello does not name: %.200q", n, m.Type, m.Stream, msg)
		}
	}
	switch m.Type {
	case api.TypeGap:
		if m.Lost != m.To-m.From {
			return "", fmt.Errorf("%s gap [%d, %d) says %d bytes lost, want %d", m.Stream, m.From, m.To, m.Lost, m.To-m.From)
		}
		return m.Type, s.Gap(m.From, m.To)
	case api.TypeEnd:
		if h := c.Hello.Streams[m.Stream]; m.Total < h.Total {
			return "", fmt.Errorf("%s ends at %d, below the %d the hello said it had produced", m.Stream, m.Total, h.Total)
		}
		return m.Type, s.End(m.Total)
	case api.TypeExit:
		for _, name := range slices.Sorted(maps.Keys(c.Streams)) {
			if s := c.Streams[name]; !s.Ended {
				return "", fmt.Errorf("the exit (%v) before the end of %s, at offset %d", m.Exit, name, s.Next)
			}
		}
		e := m.Exit
		c.Exit = &e
		return m.Type, nil
	}
	return "", fmt.Errorf("message %d is of unknown type: %.200q", n, msg)
}

func isHello(msg []byte) bool {
	var head struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(msg, &head) == nil && head.Type == api.TypeHello
}

func describe(typ websocket.MessageType, msg []byte) string {
	if typ == websocket.MessageBinary {
		if f, err := api.ParseFrame(msg); err == nil {
			return fmt.Sprintf("a %s frame of %d bytes at offset %d", api.StreamNames[f.Stream], len(f.Data), f.Offset)
		}
		return fmt.Sprintf("a binary message of %d bytes", len(msg))
	}
	return fmt.Sprintf("%.200q", msg)
}

func (c *Checker) hello(spans map[string]api.HelloSpan) error {
	if len(spans) == 0 {
		return errors.New("the hello names no stream")
	}
	known := slices.Collect(maps.Values(api.StreamNames))
	for name, h := range spans {
		if !slices.Contains(known, name) {
			return fmt.Errorf("the hello names stream %q", name)
		}
		if h.First < 0 || h.First > h.Total {
			return fmt.Errorf("the hello says %s is retained from %d of %d", name, h.First, h.Total)
		}
		if from := c.From[name]; from > h.Total {
			return fmt.Errorf("resumed %s at %d, but the hello says it has produced %d", name, from, h.Total)
		}
	}
	for name, from := range c.From {
		if _, ok := spans[name]; !ok && from != 0 {
			return fmt.Errorf("resumed %s at %d, a stream the hello does not name", name, from)
		}
	}
	c.Hello = &api.Hello{Type: api.TypeHello, Streams: spans}
	c.Streams = map[string]*Stream{}
	for name := range spans {
		s := NewStream(name, c.From[name])
		s.Keep, s.Check, s.NoGaps = c.Keep, c.Check, c.NoGaps
		c.Streams[name] = s
	}
	return nil
}

func (c *Checker) frame(msg []byte) error {
	f, err := api.ParseFrame(msg)
	if err != nil {
		return fmt.Errorf("message %d: %w", c.Messages, err)
	}
	name := api.StreamNames[f.Stream]
	s := c.Streams[name]
	if s == nil {
		return fmt.Errorf("a %s frame at offset %d, a stream the hello does not name", name, f.Offset)
	}
	switch {
	case f.Seq < f.Offset:
		return fmt.Errorf("%s frame at offset %d has seq %d: seq counts the bytes of every stream before it, so it is never below the offset", name, f.Offset, f.Seq)
	case c.framed && f.Seq <= c.lastSeq:
		return fmt.Errorf("%s frame at offset %d has seq %d, after seq %d", name, f.Offset, f.Seq, c.lastSeq)
	case c.framed && f.Seq < c.seqEnd:
		return fmt.Errorf("%s frame at offset %d has seq %d, inside the previous frame's bytes, which end at seq %d", name, f.Offset, f.Seq, c.seqEnd)
	}
	if err := s.Frame(int64(f.Offset), f.Data); err != nil {
		return err
	}
	c.framed, c.lastSeq, c.seqEnd = true, f.Seq, f.Seq+uint64(len(f.Data))
	return nil
}

// Next reads one message from conn and takes it; at the normal close after
// the exit it returns io.EOF itself, not wrapped. A close before the exit,
// or any other close or error, is an error that says where the connection
// stood.
func (c *Checker) Next(ctx context.Context, conn *websocket.Conn) (string, error) {
	if c.Closed {
		return "", io.EOF
	}
	typ, r, err := conn.Reader(ctx)
	if err == nil {
		c.buf.Reset()
		_, err = c.buf.ReadFrom(r)
	}
	if err != nil {
		normal := websocket.CloseStatus(err) == websocket.StatusNormalClosure
		if errors.Is(err, io.EOF) {
			// A connection dropped is cut short, not ended: only the
			// normal close after the exit is io.EOF.
			err = fmt.Errorf("%v (%w)", err, io.ErrUnexpectedEOF)
		}
		switch {
		case normal && c.Exit != nil:
			c.Closed = true
			return "", io.EOF
		case normal:
			return "", fmt.Errorf("closed normally before the exit, at %v", c)
		case c.Exit != nil:
			return "", fmt.Errorf("after the exit, %w; want a normal close", err)
		}
		return "", fmt.Errorf("at %v: %w", c, err)
	}
	return c.Message(typ, c.buf.Bytes())
}

// Read takes every message of conn to its normal close after the exit.
func (c *Checker) Read(ctx context.Context, conn *websocket.Conn) error {
	for {
		if _, err := c.Next(ctx, conn); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}
