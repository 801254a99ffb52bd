package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/handoff"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/ring"
)

// Timing of a WebSocket watcher.
const (
	// writeTimeout drops a watcher that has not taken a message for this
	// long: a dead client costs nobody else anything, and not for long.
	writeTimeout = 30 * time.Second
	pingEvery    = 20 * time.Second
)

// watcherSendBuffer is the socket send buffer of a WebSocket watcher's
// connection (the kernel's default is about 200 KiB). Output is bursty and
// the watcher's side is two hops away (kilnd, then the client): a deeper
// buffer lets a watcher that keeps up on average ride out a moment of not
// being scheduled instead of falling behind the ring. It is memory only a
// watcher that does not read holds, and the write deadline bounds how long.
// The kernel reserves twice what is asked, for its bookkeeping, and caps
// what is asked at net.core.wmem_max unless forced (SO_SNDBUFFORCE, which
// the agent, root on the host, may do).
const watcherSendBuffer = 4 << 20

// setSendBuffer asks for a send buffer of n bytes on c, past the system's
// cap when allowed, and otherwise up to it.
func setSendBuffer(c syscall.Conn, n int) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, n) != nil {
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, n)
		}
	})
}

type connKey struct{}

// withConn keeps a request's connection in its context, for the handlers
// that tune it.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// parseFrom reads the per-stream offsets a reader resumes from.
func parseFrom(q url.Values) (ring.Offsets, error) {
	var from ring.Offsets
	for name, st := range streamOf {
		v := q.Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return from, fmt.Errorf("%w: %s offset %q", process.ErrInvalid, name, api.Clip(v))
		}
		from[st] = n
	}
	return from, nil
}

func parseBool(q url.Values, name string, def bool) (bool, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return def, fmt.Errorf("%w: %s=%q: want true or false", process.ErrInvalid, name, api.Clip(v))
	}
	return b, nil
}

// logs attaches to a process's output: a WebSocket when asked for one,
// else a plain HTTP stream (follow=0 stops at what is retained).
func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("pid")
	q := r.URL.Query()
	from, err := parseFrom(q)
	if err != nil {
		writeError(w, err)
		return
	}
	follow, err := parseBool(q, "follow", true)
	if err != nil {
		writeError(w, err)
		return
	}
	withStdin, err := parseBool(q, "stdin", false)
	if err != nil {
		writeError(w, err)
		return
	}
	var ao process.AttachOptions
	switch v := q.Get("flow"); v {
	case "", api.FlowDrop:
	case api.FlowBlock:
		ao.Hold = true
	default:
		writeError(w, fmt.Errorf("%w: flow %q: want %s or %s", process.ErrInvalid, api.Clip(v), api.FlowDrop, api.FlowBlock))
		return
	}
	if ao.Acked, err = parseBool(q, "ack", false); err != nil {
		writeError(w, err)
		return
	}
	var granted int64
	if v := q.Get("credit"); v != "" {
		if granted, err = strconv.ParseInt(v, 10, 64); err != nil || granted < api.CreditFrame || granted > api.MaxCredit {
			writeError(w, fmt.Errorf("%w: credit %q: want %d to %d bytes", process.ErrInvalid, api.Clip(v), api.CreditFrame, api.MaxCredit))
			return
		}
	}
	st, err := s.cfg.Table.Status(id)
	if err != nil {
		writeError(w, err)
		return
	}
	a, err := s.cfg.Table.Attach(id, from, ao)
	if err != nil {
		writeError(w, err)
		return
	}
	defer a.Close()
	s.watchers.Add(1)
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		var fc *credit
		if granted > 0 {
			fc = newCredit(granted)
		}
		s.watch(w, r, id, st, a, withStdin, ao.Hold, fc)
		return
	}
	if withStdin || granted > 0 {
		writeError(w, fmt.Errorf("%w: stdin=1 and credit need a WebSocket", process.ErrInvalid))
		return
	}
	s.logsHTTP(w, r, st, a, follow)
}

// lostLine is how the plain shapes tell a reader about a gap.
func lostLine(e ring.Event) string {
	return fmt.Sprintf("[%d bytes of %s lost]\n", e.Lost(), streamName(e.Stream))
}

// logsHTTP streams raw output as produced, with the seed's closing line.
// Without follow it stops where the output stood at the request.
func (s *Server) logsHTTP(w http.ResponseWriter, r *http.Request, st process.Status, a *process.Attachment, follow bool) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	ctx := r.Context()
	target := st.Totals
	caughtUp := func(pos ring.Offsets) bool {
		for _, s := range st.Streams {
			if pos[s] < target[s] {
				return false
			}
		}
		return true
	}
	if !follow && st.State != process.Exited && caughtUp(a.Position()) {
		return
	}
	for {
		e, err := a.NextMerged(ctx, maxMerged)
		if err != nil {
			return // EOF, or the client left
		}
		var werr error
		rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		switch e.Kind {
		case ring.Data:
			_, werr = w.Write(e.Data)
		case ring.Gap:
			s.lostTo(e)
			_, werr = io.WriteString(w, lostLine(e.Event))
		case ring.Exit:
			_, werr = fmt.Fprintf(w, "[%s]\n", toExit(&e.Exit))
		}
		if werr != nil {
			return
		}
		rc.Flush()
		if !follow && st.State != process.Exited && e.Kind != ring.Exit && caughtUp(a.Position()) {
			return
		}
	}
}

// credit is the output a watcher that attached with credit=N has granted
// and not yet been sent (api.TypeCredit): the watcher's sender takes from
// it, a frame at least api.CreditFrame, waiting while there is less, and
// the reader of the watcher's messages adds to it.
type credit struct {
	// mu guards avail and wake; wake is closed and replaced when a grant
	// comes.
	mu    sync.Mutex
	avail int64
	wake  chan struct{}
}

func newCredit(n int64) *credit { return &credit{avail: n, wake: make(chan struct{})} }

// grant adds n to what may be sent; more than api.MaxCredit outstanding is
// refused.
func (c *credit) grant(n int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n < 1 || n > api.MaxCredit-c.avail {
		return fmt.Errorf("credit of %d bytes: want 1 to %d beyond the %d granted", n, api.MaxCredit-c.avail, c.avail)
	}
	c.avail += n
	close(c.wake)
	c.wake = make(chan struct{})
	return nil
}

// available is what may be sent now: 0 while that is less than a frame
// costs.
func (c *credit) available() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.avail < api.CreditFrame {
		return 0
	}
	return c.avail
}

// wait waits until a frame may be sent. Only grants change what is
// available meanwhile, so once it returns, take takes something until the
// caller, the one sender, has taken it all.
func (c *credit) wait(ctx context.Context) error {
	for {
		c.mu.Lock()
		avail, wake := c.avail, c.wake
		c.mu.Unlock()
		if avail >= api.CreditFrame {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// take takes what a frame of up to n bytes costs, and returns how many
// bytes the frame may carry: 0 while a frame costs more than there is.
func (c *credit) take(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.avail < api.CreditFrame {
		return 0
	}
	n = int(min(int64(n), c.avail))
	c.avail -= max(int64(n), api.CreditFrame)
	return n
}

// watch serves one WebSocket watcher: kiln.v1 frames, or the raw shape. A
// watcher that sends input, holds the output (and acks it), or grants
// credit (fc) is read from.
func (s *Server) watch(w http.ResponseWriter, r *http.Request, id string, st process.Status, a *process.Attachment, withStdin, hold bool, fc *credit) {
	// Origins were checked where the request came in (kilnd); the agent's
	// socket is reachable from kilnd alone.
	mc, ok := r.Context().Value(connKey{}).(*movable)
	if !ok {
		http.Error(w, "agent: a watcher's connection is not the agent's", http.StatusInternalServerError)
		return
	}
	kilnd, move := mc.unixConn()
	move = move && r.Header.Get(api.MoveHeader) == "1"
	if move {
		w.Header().Set(api.MoveHeader, "1")
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols:       []string{api.ProtocolV1, api.ProtocolRaw},
		InsecureSkipVerify: true,
	})
	if err != nil {
		return // Accept has answered
	}
	defer c.CloseNow()
	// Last, once the watcher's messages are read: a holding watcher that
	// said it will not come back (api.TypeRelease) holds nothing when it
	// goes.
	var released *atomic.Bool
	if hold {
		released = new(atomic.Bool)
		defer func() {
			if released.Load() {
				a.Abandon()
			}
		}()
	}
	// Taken up on its offer, kilnd hands the client's socket over: the
	// output then goes to the client straight from here, not through a
	// relay in kilnd, which would copy it twice more.
	if move {
		// Hijacked, the connection is this handler's alone: kilnd may
		// send its socket now (one sent earlier could meet the server's
		// last read, which takes no descriptor).
		if _, err := kilnd.Write([]byte{api.MoveMarker}); err != nil {
			return
		}
		if err := mc.awaitMove(); err != nil {
			s.cfg.Log.Warn("a watcher's move", "err", err)
			return
		}
	}
	// Its messages are written here, a frame each; coder/websocket reads
	// and keeps the control frames.
	mc.frameMessages()
	if sc, ok := mc.current().(syscall.Conn); ok {
		setSendBuffer(sc, watcherSendBuffer)
	}
	c.SetReadLimit(api.MaxWSClient)
	v1 := c.Subprotocol() == api.ProtocolV1

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	if withStdin || hold || fc != nil {
		wg.Go(func() {
			defer cancel()
			s.readInput(ctx, c, id, st, a, withStdin, fc, released)
		})
	} else {
		ctx = c.CloseRead(ctx)
	}
	wg.Go(func() { keepalive(ctx, c, cancel) })
	// A watcher dropped (it did not answer a ping, it sent bad input) is
	// closed at once, whatever write it is in.
	defer context.AfterFunc(ctx, func() { c.CloseNow() })()

	o := &wsOut{s: s, mc: mc, c: c, a: a, fc: fc, v1: v1, ctx: ctx, cancel: cancel, limit: firstMessage}
	if v1 && !o.hello(id, st) {
		return
	}
	o.stream()
}

// wsOut writes a watcher's output to its WebSocket, as watch set it up.
type wsOut struct {
	s      *Server
	mc     *movable
	c      *websocket.Conn
	a      *process.Attachment
	fc     *credit // nil but for a credit watcher
	v1     bool    // kiln.v1 frames, not the raw shape
	ctx    context.Context
	cancel context.CancelFunc
	// batch holds small messages that had more ready behind them, whole
	// frames, written with the next message that has none: a watcher
	// that keeps up with short chunks of two streams (which are never
	// merged), or a stream's end and the exit, gets them in one write.
	// Nothing waits in it: the message before a wait goes out at once,
	// and so does the exit, after which nothing is ready.
	batch []byte
	frame []byte // a data frame's header, reused
	// limit bounds the next message's output. It starts small and
	// doubles, up to maxMerged, with each message that fills half of it
	// or more: a link that breaks before a whole large message gets
	// through (a flaky network, a proxy that cuts connections) still
	// carries the first bytes of each connection, so a client that comes
	// back from where it got always gets further.
	limit int
}

// send writes a message (or batches it); false once the watcher is gone.
func (o *wsOut) send(op byte, head, body []byte) bool {
	if n := len(head) + len(body); n <= batchMessage && len(o.batch)+n <= maxBatch && o.a.Ready() {
		o.batch = appendWSHeader(o.batch, op, n)
		o.batch = append(append(o.batch, head...), body...)
		return true
	}
	err := o.mc.writeMessage(o.batch, op, head, body, writeTimeout)
	o.batch = o.batch[:0]
	if err != nil {
		o.cancel()
		return false
	}
	return true
}

func (o *wsOut) sendJSON(v any) bool {
	b, _ := json.Marshal(v)
	return o.send(wsText, b, nil)
}

// sendData writes a chunk: the header, then the chunk as the ring holds
// it, one message, and no copy of the payload on the way.
func (o *wsOut) sendData(e process.Event) bool {
	if !o.v1 {
		return o.send(wsBinary, nil, e.Data)
	}
	o.frame = api.AppendFrame(o.frame[:0], api.Frame{Stream: streamCode(e.Stream), Offset: uint64(e.Offset), Seq: e.Seq})
	return o.send(wsBinary, o.frame, e.Data)
}

// flush writes what is batched, before a wait for credit: the watcher
// may be waiting for it to grant more.
func (o *wsOut) flush() bool {
	if len(o.batch) == 0 {
		return true
	}
	err := o.mc.writeFrames(o.batch, writeTimeout)
	o.batch = o.batch[:0]
	if err != nil {
		o.cancel()
		return false
	}
	return true
}

// awaitCredit waits until a credit watcher may be sent output, sending
// what is batched first if it must wait.
func (o *wsOut) awaitCredit() bool {
	if o.fc == nil {
		return true
	}
	if o.fc.available() == 0 && !o.flush() {
		return false
	}
	return o.fc.wait(o.ctx) == nil
}

// hello sends kiln.v1's first message: each stream's retained span.
func (o *wsOut) hello(id string, st process.Status) bool {
	return o.sendJSON(api.Hello{Type: api.TypeHello, Streams: o.s.spans(id, st)})
}

// spans are each stream of process id's retained span now, st being its
// status a moment ago.
func (s *Server) spans(id string, st process.Status) map[string]api.HelloSpan {
	// The totals are taken after the retained span: the ring may have
	// moved on since the request's status, and a span must not start
	// past its stream's total.
	totals := st.Totals
	first, err := s.cfg.Table.Retained(id)
	if err != nil {
		first = st.First
	} else if now, err := s.cfg.Table.Status(id); err == nil {
		totals = now.Totals
	}
	spans := map[string]api.HelloSpan{}
	for _, str := range st.Streams {
		spans[streamName(str)] = api.HelloSpan{First: first[str], Total: totals[str]}
	}
	return spans
}

// retained answers kilnd's GET handoff.RetainedPath{pid}: what of the
// process's output a watcher attaching now would be given.
func (s *Server) retained(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("pid")
	st, err := s.cfg.Table.Status(id)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, handoff.Retained{Process: id, Streams: s.spans(id, st), Exited: st.State == process.Exited})
}

// stream sends the output, its gaps, ends and exit, until the
// attachment's end (the connection is then closed normally) or the
// watcher's.
func (o *wsOut) stream() {
	for {
		// A credit watcher's output waits for its credit (in data) once
		// it is taken from the ring, a message's worth at most; its gaps,
		// ends and exit do not. Its hold (flow=block, acked) is where it
		// says it has read, not where this has got to.
		next := o.limit
		if o.fc != nil {
			if avail := o.fc.available(); avail > 0 {
				next = int(min(int64(o.limit), avail))
			}
		}
		// A watcher that is behind gets what continues a chunk in one
		// message: a message per chunk of a small-write program costs more
		// than the bytes (headers, a write each, a read each).
		e, err := o.a.NextMerged(o.ctx, next)
		if errors.Is(err, io.EOF) {
			o.c.Close(websocket.StatusNormalClosure, "")
			return
		}
		if err != nil || !o.event(e) {
			return
		}
	}
}

// event sends one event of the attachment's.
func (o *wsOut) event(e process.Event) bool {
	switch e.Kind {
	case ring.Data:
		return o.data(e)
	case ring.Gap:
		o.s.lostTo(e)
		if o.v1 {
			return o.sendJSON(api.Gap{Type: api.TypeGap, Stream: streamName(e.Stream), From: e.Offset, To: e.To, LostBytes: e.Lost()})
		}
		return o.send(wsText, []byte(lostLine(e.Event)), nil)
	case ring.End:
		if o.v1 {
			return o.sendJSON(api.End{Type: api.TypeEnd, Stream: streamName(e.Stream), TotalBytes: e.Offset})
		}
	case ring.Exit:
		if o.v1 {
			return o.sendJSON(api.ExitMessage{Type: api.TypeExit, Exit: toExit(&e.Exit)})
		}
		return o.send(wsText, []byte("["+toExit(&e.Exit).String()+"]\n"), nil)
	}
	return true
}

// data sends a chunk. One larger than the limit by itself goes in
// pieces, each with its own offset and seq: the same bytes, in order.
func (o *wsOut) data(e process.Event) bool {
	for rest := e; len(rest.Data) > 0; {
		n := min(len(rest.Data), o.limit)
		if o.fc != nil {
			if !o.awaitCredit() {
				return false
			}
			n = o.fc.take(n)
		}
		piece := rest
		piece.Data = rest.Data[:n]
		if !o.sendData(piece) {
			return false
		}
		rest.Data, rest.Offset, rest.Seq = rest.Data[n:], rest.Offset+int64(n), rest.Seq+uint64(n)
		if 2*n >= o.limit {
			o.limit = min(2*o.limit, maxMerged)
		}
	}
	return true
}

// lostTo counts a gap a watcher is told of, and its bytes when known.
func (s *Server) lostTo(e process.Event) {
	s.gaps.Add(1)
	if n := e.Lost(); n > 0 {
		s.lost.Add(n)
	}
}

// A watcher's messages of up to batchMessage bytes are written together,
// up to maxBatch bytes, when more are ready behind them.
const (
	batchMessage = 16 << 10
	maxBatch     = 64 << 10
)

// maxMerged bounds the output one watcher's message carries when chunks
// are joined (see process.Attachment.NextMerged); a WebSocket watcher's
// messages start at firstMessage and double up to it. Clients read
// messages of up to 1 MiB.
const (
	maxMerged    = 256 << 10
	firstMessage = 16 << 10
)

// keepalive pings the client until ctx ends; a client that does not answer
// within writeTimeout is dropped.
func keepalive(ctx context.Context, c *websocket.Conn, drop context.CancelFunc) {
	t := time.NewTicker(pingEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, writeTimeout)
		err := c.Ping(pctx)
		cancel()
		if err != nil {
			drop()
			return
		}
	}
}

// readInput takes a watcher's messages: binary messages are input, in
// order (when the watcher asked for stdin); text messages are control
// (stdin_close, resize, ack).
func (s *Server) readInput(ctx context.Context, c *websocket.Conn, id string, st process.Status, a *process.Attachment, withStdin bool, fc *credit, released *atomic.Bool) {
	var offset int64
	if st.Stdin != nil {
		offset = st.Stdin.Accepted
	}
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			return
		}
		switch typ {
		case websocket.MessageBinary:
			if !withStdin {
				c.Close(websocket.StatusPolicyViolation, "input without stdin=1")
				return
			}
			// Append where the input stands now: another writer (an HTTP
			// client) may have moved it, and a stale offset would make
			// this write look like a retry of theirs.
			if st, err := s.cfg.Table.Status(id); err == nil && st.Stdin != nil {
				offset = max(offset, st.Stdin.Accepted)
			}
			accepted, err := s.cfg.Table.Write(id, offset, data)
			if err != nil {
				c.Close(websocket.StatusPolicyViolation, api.Clip("stdin: "+err.Error()))
				return
			}
			offset = accepted
		case websocket.MessageText:
			m, err := controlMessage(data)
			if errors.Is(err, errBadJSON) {
				c.Close(websocket.StatusUnsupportedData, "malformed control message")
				return
			}
			if err == nil {
				switch m.Type {
				case api.TypeStdinClose:
					err = s.cfg.Table.CloseStdin(id)
				case api.TypeResize:
					err = s.cfg.Table.Resize(id, process.WindowSize{Cols: m.Cols, Rows: m.Rows})
				case api.TypeAck:
					a.Ack(offsetsOf(m.Offsets))
				case api.TypeCredit:
					if fc == nil {
						err = errors.New("credit from a watcher that did not attach with credit=N")
						break
					}
					if len(m.Offsets) > 0 {
						a.Ack(offsetsOf(m.Offsets))
					}
					err = fc.grant(m.Bytes)
				case api.TypeRelease:
					if released == nil {
						err = errors.New("release from a watcher that holds nothing (flow=block)")
						break
					}
					released.Store(true)
				}
			}
			if err != nil {
				c.Close(websocket.StatusPolicyViolation, api.Clip(err.Error()))
				return
			}
		}
	}
}

// offsetsOf reads an ack's offsets, checked by controlMessage.
func offsetsOf(m map[string]int64) ring.Offsets {
	var at ring.Offsets
	for name, off := range m {
		at[streamOf[name]] = off
	}
	return at
}

// streamOf names the streams in query parameters and acks.
var streamOf = map[string]ring.Stream{"stdout": ring.Stdout, "stderr": ring.Stderr, "terminal": ring.PTY}

// controlMessage decodes a watcher's text message: stdin_close, resize to a
// size within MaxTTYSize, or ack of offsets of known streams. What is not
// JSON wraps errBadJSON; any other type, or a value out of bounds, is
// refused with the reason.
func controlMessage(data []byte) (api.ClientMessage, error) {
	var m api.ClientMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("%w: %w", errBadJSON, err)
	}
	switch m.Type {
	case api.TypeStdinClose:
	case api.TypeResize:
		if m.Cols == 0 || m.Rows == 0 || m.Cols > api.MaxTTYSize || m.Rows > api.MaxTTYSize {
			return m, fmt.Errorf("terminal size %dx%d", m.Cols, m.Rows)
		}
	case api.TypeAck, api.TypeCredit:
		for name, off := range m.Offsets {
			if _, ok := streamOf[name]; !ok || off < 0 {
				return m, fmt.Errorf("ack of %s offset %d", api.Clip(name), off)
			}
		}
		if m.Type == api.TypeCredit && (m.Bytes < 1 || m.Bytes > api.MaxCredit) {
			return m, fmt.Errorf("credit of %d bytes: want 1 to %d", m.Bytes, api.MaxCredit)
		}
	case api.TypeRelease:
	default:
		return m, fmt.Errorf("unknown message type %q", api.Clip(m.Type))
	}
	return m, nil
}
