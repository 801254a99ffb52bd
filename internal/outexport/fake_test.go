package outexport

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// fakeProc is a process's output as an agent's ring holds it, in memory:
// each stream's bytes in the order written, those more than window behind
// a stream's end evicted. Its conns send what an agent's kiln.v1 watcher
// (flow=drop) gets: hello, frames, gaps for what was evicted before they
// got to it, ends and the exit.
type fakeProc struct {
	streams []byte
	window  int64 // bytes a stream keeps; 0: all
	opens   atomic.Int32

	// mu guards the rest; wake is closed and replaced on every write.
	mu     sync.Mutex
	data   [numStreams][]byte
	chunks []fakeChunk
	seq    uint64
	exit   *api.Exit
	gone   bool // the agent no longer knows the process
	wake   chan struct{}
	conns  []*fakeConn
}

type fakeChunk struct {
	stream byte
	off    int64
	seq    uint64
	n      int
}

func newFakeProc(window int64, streams ...byte) *fakeProc {
	return &fakeProc{streams: streams, window: window, wake: make(chan struct{})}
}

// write appends b to stream s, as the process writing it.
func (p *fakeProc) write(s byte, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.chunks = append(p.chunks, fakeChunk{stream: s, off: int64(len(p.data[s])), seq: p.seq, n: len(b)})
	p.data[s] = append(p.data[s], b...)
	p.seq += uint64(len(b))
	p.wakeLocked()
}

// finish ends the process with code.
func (p *fakeProc) finish(code int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exit = &api.Exit{ExitCode: &code}
	p.wakeLocked()
}

func (p *fakeProc) wakeLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// want is what the process wrote, by stream name.
func (p *fakeProc) want() map[string][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := map[string][]byte{}
	for _, s := range p.streams {
		w[api.StreamNames[s]] = append([]byte(nil), p.data[s]...)
	}
	return w
}

// first is where stream s's ring begins now.
func (p *fakeProc) firstLocked(s byte) int64 {
	if p.window == 0 {
		return 0
	}
	return max(0, int64(len(p.data[s]))-p.window)
}

// fakeSource serves fakeProcs by process id.
type fakeSource struct {
	mu    sync.Mutex
	procs map[string]*fakeProc
}

func (fs *fakeSource) add(id string, p *fakeProc) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.procs == nil {
		fs.procs = map[string]*fakeProc{}
	}
	fs.procs[id] = p
}

func (fs *fakeSource) Open(ctx context.Context, sandbox, process string, from Offsets) (Conn, error) {
	fs.mu.Lock()
	p := fs.procs[process]
	fs.mu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("%w: fake: process %s", errdefs.ErrNotFound, process)
	}
	p.mu.Lock()
	gone := p.gone
	p.mu.Unlock()
	if gone {
		return nil, fmt.Errorf("%w: fake: process %s is gone", errdefs.ErrNotFound, process)
	}
	p.opens.Add(1)
	c := &fakeConn{p: p, closed: make(chan struct{})}
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	for name, off := range from {
		c.pos[streamCode(name)] = off
	}
	return c, nil
}

// breakAll breaks the conns of process id, as an agent that goes does.
func (fs *fakeSource) breakAll(id string) {
	fs.mu.Lock()
	p := fs.procs[id]
	fs.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.CloseNow()
	}
}

// fakeConn is one watcher of a fakeProc.
type fakeConn struct {
	p         *fakeProc
	pos       [numStreams]int64
	next      int // the next chunk
	helloSent bool
	queue     [][]byte // text messages to send before more output
	done      bool
	closeOnce sync.Once
	closed    chan struct{}
}

func (c *fakeConn) Read(ctx context.Context) (websocket.MessageType, []byte, error) {
	for {
		select {
		case <-c.closed:
			return 0, nil, io.ErrClosedPipe
		default:
		}
		if len(c.queue) > 0 {
			b := c.queue[0]
			c.queue = c.queue[1:]
			return websocket.MessageText, b, nil
		}
		if c.done {
			return 0, nil, io.EOF
		}
		p := c.p
		p.mu.Lock()
		if !c.helloSent {
			h := api.Hello{Type: api.TypeHello, Streams: map[string]api.HelloSpan{}}
			for _, s := range p.streams {
				h.Streams[api.StreamNames[s]] = api.HelloSpan{First: p.firstLocked(s), Total: int64(len(p.data[s]))}
			}
			c.helloSent = true
			p.mu.Unlock()
			c.queueJSON(h)
			continue
		}
		if c.next < len(p.chunks) {
			ch := p.chunks[c.next]
			s := ch.stream
			if first := p.firstLocked(s); c.pos[s] < first {
				c.gapLocked(s, first)
				p.mu.Unlock()
				continue
			}
			end := ch.off + int64(ch.n)
			c.next++
			if end <= c.pos[s] {
				p.mu.Unlock()
				continue
			}
			skip := c.pos[s] - ch.off
			if skip < 0 {
				skip = 0 // a stream's chunks follow each other: cannot be
			}
			f := api.Frame{Stream: s, Offset: uint64(ch.off + skip), Seq: ch.seq + uint64(skip), Data: p.data[s][ch.off+skip : end]}
			b := api.AppendFrame(nil, f)
			c.pos[s] = end
			p.mu.Unlock()
			return websocket.MessageBinary, b, nil
		}
		if p.exit != nil {
			for _, s := range p.streams {
				c.gapLocked(s, int64(len(p.data[s])))
				c.queueJSONLocked(api.End{Type: api.TypeEnd, Stream: api.StreamNames[s], TotalBytes: int64(len(p.data[s]))})
			}
			c.queueJSONLocked(api.ExitMessage{Type: api.TypeExit, Exit: *p.exit})
			c.done = true
			p.mu.Unlock()
			continue
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		case <-c.closed:
		}
	}
}

func (c *fakeConn) gapLocked(s byte, to int64) {
	if to > c.pos[s] {
		c.queueJSONLocked(api.Gap{Type: api.TypeGap, Stream: api.StreamNames[s], From: c.pos[s], To: to, LostBytes: to - c.pos[s]})
		c.pos[s] = to
	}
}

func (c *fakeConn) queueJSONLocked(v any) { c.queueJSON(v) }

func (c *fakeConn) queueJSON(v any) {
	b, _ := json.Marshal(v)
	c.queue = append(c.queue, b)
}

func (c *fakeConn) CloseNow() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}
