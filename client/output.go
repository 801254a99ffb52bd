package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
)

// Chunk is a piece of output, or a gap.
type Chunk struct {
	Stream string // "stdout", "stderr" or "terminal"
	Offset int64  // of the first byte, in the stream
	Seq    uint64 // one counter across the process's streams
	// Bytes (Format Bytes) or Text (Format Text) is the output. A chunk
	// owns its bytes.
	Bytes []byte
	Text  string
	// Lost, when non-zero, makes this chunk a gap: that many bytes of
	// Stream, before Offset, were lost to this reader (evicted before it
	// read them). It carries no output.
	Lost int64

	next int64 // where the stream stands once this chunk is delivered
	end  bool  // the stream's end
}

// maxFrame bounds one message from kilnd.
const maxFrame = api.FrameHeader + 1<<20

// Output reads the process's output from where this handle stands (the
// beginning, or where a reopened handle's reference stood), replay then
// live, until every stream ended and the exit arrived. A gap is a Chunk
// with Lost set. If the connection breaks, the error says so
// (ErrInterrupted), and calling Output again resumes from the last byte
// delivered, with nothing repeated.
// Leaving the loop early closes the connection; nothing else changes.
func (p *Process) Output(ctx context.Context) iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		p.mu.Lock()
		switch {
		case p.gone:
			p.mu.Unlock()
			yield(Chunk{}, ErrDetached)
			return
		case p.reading:
			p.mu.Unlock()
			yield(Chunk{}, ErrOutputInUse)
			return
		}
		p.reading = true
		q := url.Values{}
		for s, off := range p.offsets {
			q.Set(s, strconv.FormatInt(off, 10))
		}
		if p.hold {
			q.Set("flow", api.FlowBlock)
			q.Set("ack", "true")
		}
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			p.reading, p.conn = false, nil
			p.mu.Unlock()
		}()
		c, err := p.s.c.dialOutput(ctx, p.path("/logs"), q)
		if err != nil {
			if _, answered := errors.AsType[*Error](err); (!answered || IsUnavailable(err)) && ctx.Err() == nil {
				err = fmt.Errorf("%w: output of %s (call Output again to resume): %w", ErrInterrupted, p.ID, err)
			}
			yield(Chunk{}, err)
			return
		}
		defer c.CloseNow()
		// A frame carries at most a ring block (256 KiB); control
		// messages are small.
		c.SetReadLimit(maxFrame)
		p.mu.Lock()
		if p.gone {
			p.mu.Unlock()
			yield(Chunk{}, ErrDetached)
			return
		}
		p.conn = c
		p.mu.Unlock()
		var dec decoders
		var unacked int64 // bytes given out since the last ack
		var buf []byte    // each message, read into the same buffer
		for {
			typ, data, err := readMessage(ctx, c, &buf)
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				return
			}
			if err != nil {
				p.mu.Lock()
				gone := p.gone
				p.mu.Unlock()
				if gone {
					err = ErrDetached
				} else if ctx.Err() == nil {
					err = fmt.Errorf("%w: output of %s (call Output again to resume): %w", ErrInterrupted, p.ID, err)
				}
				yield(Chunk{}, err)
				return
			}
			for _, ch := range p.handle(typ, data, &dec) {
				if ch.end && ch.Text == "" {
					p.delivered(ch) // nothing to show, only the end to record
					continue
				}
				// Given out is delivered, even if the reader stops after it.
				p.delivered(ch)
				if !yield(ch, nil) {
					return
				}
				if unacked += int64(len(ch.Bytes) + len(ch.Text)); p.hold && unacked >= ackEvery {
					// What the reader has taken need not be kept for it.
					unacked = 0
					if err := p.ack(ctx, c); err != nil {
						yield(Chunk{}, fmt.Errorf("%w: output of %s (call Output again to resume): %w", ErrInterrupted, p.ID, err))
						return
					}
				}
			}
		}
	}
}

// readMessage reads the next message into *buf, grown as it needs, and
// returns it: valid until the next call. (websocket.Conn.Read allocates
// each message anew, growing it from 512 bytes: for a stream of 256 KiB
// frames, most of a reader's time.)
func readMessage(ctx context.Context, c *websocket.Conn, buf *[]byte) (websocket.MessageType, []byte, error) {
	typ, r, err := c.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	b := (*buf)[:0]
	if cap(b) == 0 {
		b = make([]byte, 0, api.FrameHeader+256<<10)
	}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // room for more; the read limit bounds it
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			*buf = b
			return typ, b, nil
		}
		if err != nil {
			*buf = b
			return 0, nil, err
		}
	}
}

// Resume says how Follow reconnects a broken output connection. The zero
// value is the default of each field.
type Resume struct {
	// First is the wait before the first reconnect, 100 ms by default;
	// each next wait is twice as long, up to Max, 5 s by default.
	First, Max time.Duration
	// For bounds the waits since the last chunk delivered, 25 s by
	// default: within the 30 s a held output is held for by default.
	For time.Duration
	// OnResume, if set, is told of each break before its wait.
	OnResume func(err error, wait time.Duration)
}

// Follow is Output that resumes: a broken connection (ErrInterrupted) is
// reconnected from the last byte delivered, nothing lost or repeated, as
// r says; the error is yielded only once r.For has passed without a
// chunk, or for an error that reconnecting cannot mend.
func (p *Process) Follow(ctx context.Context, r Resume) iter.Seq2[Chunk, error] {
	first, maxWait, patience := cmp.Or(r.First, 100*time.Millisecond), cmp.Or(r.Max, 5*time.Second), cmp.Or(r.For, 25*time.Second)
	return func(yield func(Chunk, error) bool) {
		wait, waited := first, time.Duration(0)
		for {
			var broke error
			for ch, err := range p.Output(ctx) {
				if err != nil {
					broke = err
					break
				}
				wait, waited = first, 0
				if !yield(ch, nil) {
					return
				}
			}
			switch {
			case broke == nil:
				return
			case !errors.Is(broke, ErrInterrupted) || ctx.Err() != nil:
				yield(Chunk{}, broke)
				return
			case waited+wait > patience:
				yield(Chunk{}, fmt.Errorf("%w; gave up resuming after %v", broke, waited.Round(time.Millisecond)))
				return
			}
			if r.OnResume != nil {
				r.OnResume(broke, wait)
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				yield(Chunk{}, ctx.Err())
				return
			}
			waited += wait
			wait = min(2*wait, maxWait)
		}
	}
}

// ackEvery is how much output a holding handle takes between acks: a
// quarter of the agent's ring, the room at which its pumps read on.
const ackEvery = 256 << 10

// ack tells kilnd where this handle's output stands, so that it keeps no
// more of it than what may still be on its way.
func (p *Process) ack(ctx context.Context, c *websocket.Conn) error {
	p.mu.Lock()
	m := api.ClientMessage{Type: api.TypeAck, Offsets: maps.Clone(p.offsets)}
	p.mu.Unlock()
	b, _ := json.Marshal(m)
	return c.Write(ctx, websocket.MessageText, b)
}

// handle turns one message into the chunks it stands for. Each chunk says
// where its stream stands once it is delivered (next) and what it reports
// lost; the handle's position moves only as chunks are delivered, so a
// reader that stops early, or a connection that breaks, resumes exactly
// after the last chunk given out. Bytes of a character not yet complete
// are not counted as delivered: on resume they come again.
func (p *Process) handle(typ websocket.MessageType, data []byte, dec *decoders) []Chunk {
	p.mu.Lock()
	defer p.mu.Unlock()
	// pos is where each stream stands once every chunk so far is out,
	// held bytes included.
	pos := func(stream string) int64 { return p.offsets[stream] + int64(len(dec.carry[stream])) }
	if typ == websocket.MessageBinary {
		f, err := api.ParseFrame(data)
		if err != nil {
			return nil
		}
		name := api.StreamNames[f.Stream]
		var out []Chunk
		if at := pos(name); int64(f.Offset) > at {
			// The server reports gaps itself; a jump it did not explain
			// is reported all the same.
			out = append(out, gapChunks(name, at, int64(f.Offset), dec)...)
		}
		ch := Chunk{Stream: name, Offset: int64(f.Offset), Seq: f.Seq}
		end := int64(f.Offset) + int64(len(f.Data))
		if p.format == Bytes {
			ch.Bytes = bytes.Clone(f.Data)
		} else {
			ch.Text = dec.decode(name, f.Data)
		}
		ch.next = end - int64(len(dec.carry[name]))
		return append(out, ch)
	}
	var head struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &head) != nil {
		return nil
	}
	switch head.Type {
	case api.TypeGap:
		var g api.Gap
		json.Unmarshal(data, &g)
		return gapChunks(g.Stream, max(g.From, pos(g.Stream)), g.To, dec)
	case api.TypeEnd:
		var e api.End
		json.Unmarshal(data, &e)
		var out []Chunk
		if at := pos(e.Stream); e.TotalBytes > at {
			out = gapChunks(e.Stream, at, e.TotalBytes, dec)
		}
		// Bytes of a character the stream ended inside can never
		// complete: one replacement character.
		t := dec.flush(e.Stream)
		out = append(out, Chunk{Stream: e.Stream, Offset: e.TotalBytes, Text: t, next: e.TotalBytes, end: true})
		return out
	case api.TypeExit:
		var e api.ExitMessage
		json.Unmarshal(data, &e)
		exit := e.Exit
		p.exit = &exit
	}
	return nil
}

// gapChunks reports bytes from..to of stream as lost: what the decoder
// held of a cut character first (one replacement), then the gap.
func gapChunks(stream string, from, to int64, dec *decoders) []Chunk {
	var out []Chunk
	if t := dec.flush(stream); t != "" {
		out = append(out, Chunk{Stream: stream, Offset: from, Text: t, next: from})
	}
	return append(out, Chunk{Stream: stream, Offset: to, Lost: to - from, next: to})
}

// delivered moves the handle past a chunk given out.
func (p *Process) delivered(ch Chunk) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.offsets[ch.Stream] = max(p.offsets[ch.Stream], ch.next)
	p.lost += ch.Lost
	p.lostBy[ch.Stream] += ch.Lost
	if ch.end {
		p.ended[ch.Stream] = true
	}
}

// decoders hold, per stream, the bytes of a UTF-8 sequence split across
// chunks.
type decoders struct {
	carry map[string][]byte
}

func (d *decoders) decode(stream string, b []byte) string {
	if d.carry == nil {
		d.carry = map[string][]byte{}
	}
	buf := b
	if len(d.carry[stream]) > 0 {
		buf = append(d.carry[stream], b...)
	}
	// Keep an incomplete sequence at the end for the next chunk.
	cut := len(buf)
	for i := len(buf) - 1; i >= 0 && i >= len(buf)-3; i-- {
		if utf8.RuneStart(buf[i]) {
			if !utf8.FullRune(buf[i:]) {
				cut = i
			}
			break
		}
	}
	d.carry[stream] = bytes.Clone(buf[cut:])
	return validUTF8(buf[:cut])
}

// validUTF8 replaces each invalid byte with U+FFFD. (bytes.ToValidUTF8
// merges a run of them into one, which would make the text depend on
// where the output was cut into chunks.)
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			out = append(out, "\uFFFD"...)
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return string(out)
}

// flush ends a stream's pending sequence (at a gap or the end): it can
// never complete, so it is one replacement character.
func (d *decoders) flush(stream string) string {
	if len(d.carry[stream]) == 0 {
		return ""
	}
	delete(d.carry, stream)
	return "\uFFFD"
}

// dialOutput opens a kiln.v1 WebSocket on path.
func (c *Client) dialOutput(ctx context.Context, path string, q url.Values) (*websocket.Conn, error) {
	conn, err := c.dial(ctx, path, q, api.ProtocolV1)
	if err != nil {
		if _, ok := errors.AsType[*Error](err); !ok {
			return nil, fmt.Errorf("client: output: %w", err)
		}
	}
	return conn, err
}
