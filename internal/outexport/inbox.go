// What a process's output conn has delivered and its follower not yet
// published: read ahead while a publish is in flight, so that reading
// overlaps publishing and what piles up goes out in fewer, larger
// messages.

package outexport

import (
	"context"
	"sync"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
)

// inboxBytes bounds what an inbox holds, the memory a process's export
// takes beyond its messages in flight (kilnd may follow hundreds): past
// it the reader stops reading, and the output waits in the ring, which
// may let it go (the process never waits).
const inboxBytes = 1 << 20

// inItem is one message read from a conn.
type inItem struct {
	typ  websocket.MessageType
	data []byte
}

// inbox is filled by one reader goroutine (fill) and emptied by the
// follower (take).
type inbox struct {
	// mu guards the rest. ready is closed and replaced when something is
	// put or the reader stops, room when something is taken.
	mu    sync.Mutex
	items []inItem
	size  int
	err   error // why the reader stopped, once it has
	ready chan struct{}
	room  chan struct{}
}

func newInbox() *inbox {
	return &inbox{ready: make(chan struct{}), room: make(chan struct{})}
}

// fill reads c into the inbox until c's Read fails (its error is kept for
// take) or ctx ends.
func (in *inbox) fill(ctx context.Context, c Conn) {
	for {
		typ, data, err := c.Read(ctx)
		in.mu.Lock()
		for err == nil && in.size >= inboxBytes {
			room := in.room
			in.mu.Unlock()
			select {
			case <-room:
			case <-ctx.Done():
				err = ctx.Err()
			}
			in.mu.Lock()
		}
		if err != nil {
			in.err = err
		} else {
			in.items = append(in.items, inItem{typ, data})
			in.size += len(data)
		}
		close(in.ready)
		in.ready = make(chan struct{})
		in.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// take waits for what the reader has put and takes it all; once all is
// taken, it returns the error that stopped the reader.
func (in *inbox) take(ctx context.Context) ([]inItem, error) {
	for {
		in.mu.Lock()
		if len(in.items) > 0 {
			items := in.items
			in.items, in.size = nil, 0
			close(in.room)
			in.room = make(chan struct{})
			in.mu.Unlock()
			return items, nil
		}
		err, ready := in.err, in.ready
		in.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// inOp is one thing a follower does with what it read: a frame's bytes
// (frames that continue each other merged), or a control message.
type inOp struct {
	frame *api.Frame
	text  []byte
}

// merge joins frames that continue each other in one stream (offset and
// seq), up to limit bytes, keeping everything in the order it came: fewer,
// larger messages when the export is behind.
func merge(items []inItem, limit int) ([]inOp, error) {
	// after[i] is how many bytes the frames after item i hold at most:
	// a run's copy is made as large as it can grow, and no larger.
	after := make([]int, len(items))
	for i := len(items) - 2; i >= 0; i-- {
		after[i] = after[i+1]
		if it := items[i+1]; it.typ == websocket.MessageBinary {
			after[i] += max(0, len(it.data)-api.FrameHeader)
		}
	}
	var ops []inOp
	var run *api.Frame // the last op's frame, while frames may join it
	owned := false     // run.Data is a copy of run's own, to append to
	for i, it := range items {
		if it.typ != websocket.MessageBinary {
			ops, run = append(ops, inOp{text: it.data}), nil
			continue
		}
		f, err := api.ParseFrame(it.data)
		if err != nil {
			return nil, err
		}
		if run != nil && f.Stream == run.Stream && f.Offset == run.Offset+uint64(len(run.Data)) &&
			f.Seq == run.Seq+uint64(len(run.Data)) && len(run.Data)+len(f.Data) <= limit {
			if !owned {
				run.Data, owned = append(make([]byte, 0, min(limit, len(run.Data)+len(f.Data)+after[i])), run.Data...), true
			}
			run.Data = append(run.Data, f.Data...)
			continue
		}
		run, owned = &f, false
		ops = append(ops, inOp{frame: run})
	}
	return ops, nil
}
