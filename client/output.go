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
	Seq    uint64 // its first byte's place in the process's output, all streams together
	// Bytes (Format Bytes) or Text (Format Text) is the output, at most
	// MaxChunkBytes of it (or the handle's ChunkBytes). A chunk owns its
	// bytes.
	Bytes []byte
	Text  string
	// Lost, when non-zero, makes this chunk a gap (Overflow
	// OverflowReport only): that many bytes of Stream, before Offset,
	// were lost to this reader (evicted before it read them). It carries
	// no output.
	Lost int64

	next int64 // where the stream stands once this chunk is delivered
	end  bool  // the stream's end
}

// MaxChunkBytes bounds the output one Chunk carries, unless a handle's
// ChunkBytes says more: what kilnd sends in one message (up to a ring
// block, 256 KiB) is given out in pieces of at most this many bytes
// (before decoding, in Format Text).
const MaxChunkBytes = 16 << 10

// MaxChunkCeiling is the most a handle's ChunkBytes may be: a message's
// most, so a chunk is then a whole message.
const MaxChunkCeiling = 1 << 20

// maxFrame bounds one message from kilnd.
const maxFrame = api.FrameHeader + 1<<20

// Output reads the process's output from where this handle stands (the
// beginning, or where a reopened handle's reference stood), replay then
// live, until every stream ended and the exit came. It reads as its loop
// asks for chunks: the connection's own flow control holds kilnd back
// meanwhile, so nothing queues up in the client.
//
// A process this handle started with flow block (the default) waits for
// this reader when it falls behind, so a reader that reads loses nothing.
// A process that does not wait for it may lose what kilnd cannot keep:
// then, by default (OverflowFail), Output yields a *CapacityError saying
// how many bytes of which stream were lost, after everything before
// them; with OverflowReport a Chunk with Lost set says so, and the output
// goes on.
//
// Leaving the loop early, a ctx that ends, or the capacity error stops
// reading: the process then no longer waits for this handle (its held
// output is released), and input and control stay available. If the
// connection breaks, the error says so (ErrInterrupted), and the output
// stays held for kilnd's grace period: calling Output again resumes after
// the last chunk delivered, with nothing repeated. A handle let go while
// Output reads ends it with ErrDetached.
func (p *Process) Output(ctx context.Context) iter.Seq2[Chunk, error] {
	return func(yield func(Chunk, error) bool) {
		r, err := p.connect(ctx)
		if err != nil {
			yield(Chunk{}, err)
			return
		}
		// A ctx that ends stops the reading: the connection is released
		// (if it holds) and closed under the read, which then ends. The
		// reads and writes themselves are not given ctx: a WebSocket
		// whose call is cancelled closes at once, too soon for the
		// release.
		abandoned := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			defer close(abandoned)
			p.letConnGo(r.c, true)
		})
		how := r.read(ctx, yield)
		if !stop() {
			<-abandoned
		}
		p.mu.Lock()
		p.reading = false
		p.mu.Unlock()
		// One whose consumer stopped owes a release: the process must not
		// wait for a reader that is not there. One whose connection broke
		// does not: it may come back (Output again, or Reopen) within
		// kilnd's grace and find the output it held.
		p.letConnGo(r.c, how == stopped)
		if how == whole {
			p.mu.Lock()
			p.holding = false // a process whose output ended holds nothing
			p.mu.Unlock()
		}
	}
}

// How an Output's reading ended.
type ending int

const (
	stopped ending = iota // its consumer stopped: left the loop, ctx ended, or a capacity error
	whole                 // the exit came: the output is whole
	broken                // the connection broke: a later Output resumes
	letGone               // the handle was let go
)

// reading is one Output's connection and what it has read of it.
type reading struct {
	p   *Process
	c   *websocket.Conn
	dec decoders
	buf []byte // each message, read into the same buffer
	// hold: the connection holds the output (flow=block, ack=true): it
	// acks where the reader stands, and says release when it stops.
	hold bool
	// taken is output given out since the last ack.
	taken int64
}

// connect opens an Output's connection from where the handle stands.
func (p *Process) connect(ctx context.Context) (*reading, error) {
	p.mu.Lock()
	switch {
	case p.gone:
		p.mu.Unlock()
		return nil, ErrDetached
	case p.reading:
		p.mu.Unlock()
		return nil, ErrOutputInUse
	}
	p.reading = true
	q := url.Values{}
	for s, off := range p.offsets {
		q.Set(s, strconv.FormatInt(off, 10))
	}
	hold := p.hold
	if hold {
		// TCP paces this reader: it takes what it reads when it reads,
		// so it needs no credit.
		q.Set("flow", api.FlowBlock)
		q.Set("ack", "true")
	}
	p.mu.Unlock()
	dctx, done, err := p.bind(ctx)
	var c *websocket.Conn
	if err == nil {
		c, err = p.s.c.dialOutput(dctx, p.path("/logs"), q)
		err = settled(dctx, err)
		done()
	}
	if err != nil {
		p.mu.Lock()
		p.reading = false
		p.mu.Unlock()
		if _, answered := errors.AsType[*Error](err); !errors.Is(err, ErrDetached) && (!answered || IsUnavailable(err)) && ctx.Err() == nil {
			err = fmt.Errorf("%w: output of %s (call Output again to resume): %w", ErrInterrupted, p.ID, err)
		}
		return nil, err
	}
	// A frame carries at most a ring block (256 KiB); control messages
	// are small.
	c.SetReadLimit(maxFrame)
	p.mu.Lock()
	if p.gone {
		// Let go while this connected: what it let go of includes this.
		release := p.released && hold
		p.reading = false
		p.mu.Unlock()
		if release {
			releaseOn(c)
		} else {
			c.CloseNow()
		}
		return nil, ErrDetached
	}
	p.conn = c
	if hold {
		p.holding = true
	}
	p.mu.Unlock()
	return &reading{p: p, c: c, hold: hold}, nil
}

// read gives out the connection's chunks until its reading ends, and
// says how it ended. ctx is the Output's, which Output watches.
func (r *reading) read(ctx context.Context, yield func(Chunk, error) bool) ending {
	p := r.p
	ioctx := context.WithoutCancel(ctx)
	for {
		typ, data, err := readMessage(ioctx, r.c, &r.buf)
		if err != nil {
			return r.failed(ctx, err, yield)
		}
		chunks, exited := p.handle(typ, data, &r.dec)
		for _, ch := range chunks {
			// Given out is delivered, even if the reader stops after it.
			p.delivered(ch)
			if ch.Lost > 0 && p.overflow == OverflowFail {
				yield(Chunk{}, &CapacityError{Process: p.ID, Stream: ch.Stream, Offset: ch.Offset, Lost: ch.Lost})
				return stopped
			}
			if ch.Lost == 0 && ch.Text == "" && len(ch.Bytes) == 0 {
				continue // nothing to show: an end, or bytes of a character held back
			}
			if !yield(ch, nil) {
				return stopped
			}
			if p.isGone() {
				yield(Chunk{}, ErrDetached)
				return letGone
			}
			if r.taken += int64(len(ch.Bytes) + len(ch.Text)); r.hold && r.taken >= ackEvery {
				if err := r.ack(ioctx); err != nil {
					return r.failed(ctx, err, yield)
				}
			}
		}
		if exited {
			return whole
		}
	}
}

// failed yields why the connection failed, and says how the reading
// ended: a normal close of kilnd's is the output's end.
func (r *reading) failed(ctx context.Context, err error, yield func(Chunk, error) bool) ending {
	p := r.p
	// The handle let go and a ctx that ended close the connection
	// themselves, normally: theirs is the reason.
	switch {
	case p.isGone():
		yield(Chunk{}, ErrDetached)
		return letGone
	case ctx.Err() != nil:
		yield(Chunk{}, fmt.Errorf("client: output of %s: %w", p.ID, context.Cause(ctx)))
		return stopped
	case websocket.CloseStatus(err) == websocket.StatusNormalClosure:
		return whole
	}
	yield(Chunk{}, fmt.Errorf("%w: output of %s (call Output again to resume): %w", ErrInterrupted, p.ID, err))
	return broken
}

func (p *Process) isGone() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gone
}

// letConnGo closes Output's connection c unless letGo took it first (or
// this did already), with a release first when asked for and owed.
func (p *Process) letConnGo(c *websocket.Conn, release bool) {
	p.mu.Lock()
	mine := p.conn == c
	if mine {
		p.conn = nil
	}
	release = mine && release && p.holding
	if release {
		p.holding = false
	}
	p.mu.Unlock()
	switch {
	case release:
		releaseOn(c)
	case mine:
		c.CloseNow()
	}
}

// releaseOn says on a holding connection that its reader will not come
// back, then closes it with the WebSocket's close handshake, so that
// kilnd reads the release before the connection ends; each bounded.
func releaseOn(c *websocket.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	b, _ := json.Marshal(api.ClientMessage{Type: api.TypeRelease})
	if c.Write(ctx, websocket.MessageText, b) == nil {
		c.Close(websocket.StatusNormalClosure, "")
	}
	c.CloseNow()
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
// chunk, or for an error that reconnecting cannot mend. Once Follow gives
// up, or its ctx ends while it waits to reconnect, the process no longer
// waits for this handle, as when Output's consumer stops.
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
			case !errors.Is(broke, ErrInterrupted):
				yield(Chunk{}, broke)
				return
			case ctx.Err() != nil:
				p.stopHolding()
				yield(Chunk{}, broke)
				return
			case waited+wait > patience:
				p.stopHolding()
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
				p.stopHolding()
				yield(Chunk{}, ctx.Err())
				return
			}
			waited += wait
			wait = min(2*wait, maxWait)
		}
	}
}

// stopHolding releases the output held for this handle while nothing
// reads it: a reader that will not come back.
func (p *Process) stopHolding() {
	p.mu.Lock()
	release := !p.gone && !p.reading && p.holding
	if release {
		p.holding = false
	}
	p.mu.Unlock()
	if release {
		p.releaseHeld()
	}
}

// ackEvery is how much output a holding handle takes between acks: a
// quarter of the agent's ring, the room at which its pumps read on.
const ackEvery = 256 << 10

// ack tells kilnd where this handle's output stands, so that it keeps no
// more of it than what may still be on its way.
func (r *reading) ack(ctx context.Context) error {
	p := r.p
	p.mu.Lock()
	m := api.ClientMessage{Type: api.TypeAck, Offsets: maps.Clone(p.offsets)}
	p.mu.Unlock()
	b, _ := json.Marshal(m)
	if err := r.c.Write(ctx, websocket.MessageText, b); err != nil {
		return err
	}
	r.taken = 0
	return nil
}

// handle turns one message into the chunks it stands for, and says
// whether it was the exit, the last. Each chunk says where its stream
// stands once it is delivered (next) and what it reports lost; the
// handle's position moves only as chunks are delivered, so a reader that
// stops early, or a connection that breaks, resumes exactly after the
// last chunk given out. Bytes of a character not yet complete are not
// counted as delivered: on resume they come again.
func (p *Process) handle(typ websocket.MessageType, data []byte, dec *decoders) ([]Chunk, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// pos is where each stream stands once every chunk so far is out,
	// held bytes included.
	pos := func(stream string) int64 { return p.offsets[stream] + int64(len(dec.carry[stream])) }
	if typ == websocket.MessageBinary {
		f, err := api.ParseFrame(data)
		if err != nil {
			return nil, false
		}
		name := api.StreamNames[f.Stream]
		var out []Chunk
		if at := pos(name); int64(f.Offset) > at {
			// The server reports gaps itself; a jump it did not explain
			// is reported all the same.
			out = append(out, gapChunks(name, at, int64(f.Offset), dec)...)
		}
		step := cmp.Or(p.chunkBytes, MaxChunkBytes)
		for i := 0; i < len(f.Data); i += step {
			piece := f.Data[i:min(i+step, len(f.Data))]
			at := int64(f.Offset) + int64(i)
			ch := Chunk{Stream: name, Offset: at, Seq: f.Seq + uint64(i)}
			switch {
			case p.format == Bytes && p.borrow:
				ch.Bytes = piece // the reader's until it asks for more
			case p.format == Bytes:
				ch.Bytes = bytes.Clone(piece)
			default:
				ch.Text = dec.decode(name, piece)
			}
			ch.next = at + int64(len(piece)) - int64(len(dec.carry[name]))
			out = append(out, ch)
		}
		return out, false
	}
	var head struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &head) != nil {
		return nil, false
	}
	switch head.Type {
	case api.TypeGap:
		var g api.Gap
		json.Unmarshal(data, &g)
		return gapChunks(g.Stream, max(g.From, pos(g.Stream)), g.To, dec), false
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
		return out, false
	case api.TypeExit:
		var e api.ExitMessage
		json.Unmarshal(data, &e)
		p.confirmLocked(e.Exit)
		return nil, true
	}
	return nil, false
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
