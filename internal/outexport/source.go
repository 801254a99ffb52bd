package outexport

import (
	"context"

	"github.com/coder/websocket"
)

// Offsets are per-stream positions by kiln.v1 stream name ("stdout",
// "stderr", "terminal"): how many bytes of each come before a point. A
// stream left out is at 0.
type Offsets map[string]int64

// Conn is a kiln.v1 stream of one process's output, as a reader receives
// it: a hello text message first, then binary frames (api.ParseFrame) and
// text messages of gaps, ends and the exit, as the agent's
// GET /exec-stream/{pid}/logs WebSocket sends them. A *websocket.Conn
// dialled with api.ProtocolV1 is one, and so is a Reader. Read returns an
// error once the stream is over (the exit's normal close included) or
// broken; its owner, who opened it, calls CloseNow once, when done with
// it, from any goroutine.
type Conn interface {
	Read(ctx context.Context) (websocket.MessageType, []byte, error)
	CloseNow() error
}

// Source opens a process's output for the exporter, which owns each Conn
// it is given until it calls its CloseNow. Open is called from many
// goroutines at once.
//
// The conn must be a reader that never holds the output (kiln.v1's
// flow=drop, the default: no flow=block, no credit): the process never
// waits for the exporter, which may fall behind and is then told exactly
// what it missed. from gives where to start; streams not in it start at
// 0. An error that wraps errdefs.ErrNotFound says the process's output
// cannot be read any more (its sandbox is gone, or its agent no longer
// knows it): the exporter stops following it. Any other error is tried
// again.
type Source interface {
	Open(ctx context.Context, sandbox, process string, from Offsets) (Conn, error)
}

// SourceFunc is a function that is a Source.
type SourceFunc func(ctx context.Context, sandbox, process string, from Offsets) (Conn, error)

// Open calls f.
func (f SourceFunc) Open(ctx context.Context, sandbox, process string, from Offsets) (Conn, error) {
	return f(ctx, sandbox, process, from)
}
