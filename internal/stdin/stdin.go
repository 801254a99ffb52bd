// Package stdin feeds a process's standard input from ordered, bounded, offset-stamped writes.
package stdin

import (
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// Limits on what a queue holds. They bound the daemon's memory per process
// while a child is slow to read; a client refused with ErrFull retries.
const (
	// MaxWrite is the most bytes one Write may carry.
	MaxWrite = 64 << 10
	// MaxQueued is the most bytes queued, the write in progress included.
	MaxQueued = 256 << 10
	// MaxPending is the most writes queued, the write in progress included.
	MaxPending = 256
)

var (
	// ErrTooLarge refuses a write of more than MaxWrite bytes.
	ErrTooLarge = errdefs.New(errdefs.ErrTooLarge, "stdin: write too large")
	// ErrFull refuses a write the queue has no room for now; retry later.
	ErrFull = errdefs.New(errdefs.ErrUnavailable, "stdin: queue full")
	// ErrHole refuses a write that starts past the accepted bytes.
	ErrHole = errdefs.New(errdefs.ErrInvalidArgument, "stdin: write would leave a hole")
	// ErrOffset refuses a negative offset, or one no stream can reach.
	ErrOffset = errdefs.New(errdefs.ErrInvalidArgument, "stdin: offset out of range")
	// ErrClosed refuses new bytes after Close.
	ErrClosed = errdefs.New(errdefs.ErrFailedPrecondition, "stdin: input already closed")
	// ErrBroken says the process stopped reading: a write to it failed. The
	// returned error wraps the cause as well.
	ErrBroken = errdefs.New(errdefs.ErrFailedPrecondition, "stdin: process no longer reads its input")
	// ErrStopped says the queue was stopped: the process is gone.
	ErrStopped = errdefs.New(errdefs.ErrFailedPrecondition, "stdin: input stopped")
)

// plan decides what part of a write of n bytes (n >= 0) at offset is new,
// given that accepted bytes were accepted before: the new bytes are
// p[skip:], and they start exactly at accepted. skip == n means every byte
// was accepted before (a retry), and nothing is to be written. A write that
// starts past accepted would leave a hole and is refused.
func plan(accepted, offset int64, n int) (skip int, err error) {
	switch {
	case offset < 0:
		return 0, fmt.Errorf("%w: negative offset %d", ErrOffset, offset)
	case offset > accepted:
		return 0, fmt.Errorf("%w: write at offset %d, %d bytes accepted", ErrHole, offset, accepted)
	case accepted-offset >= int64(n):
		return n, nil
	}
	skip = int(accepted - offset)
	if int64(n-skip) > math.MaxInt64-accepted {
		return 0, fmt.Errorf("%w: %d bytes at offset %d pass the largest stream", ErrOffset, n, offset)
	}
	return skip, nil
}

// State is a snapshot of a queue.
type State struct {
	Accepted  int64 // bytes accepted in all: the offset the next new write starts at
	Delivered int64 // bytes written to the file
	Pending   int   // writes queued, the one being written included
	Queued    int   // bytes those writes hold
	Closed    bool  // Close was called: end of input requested
	EOFSent   bool  // every accepted byte was delivered, then the file closed
	Stopped   bool  // Stop was called
	Broken    error // why the process stopped taking input, or nil
}

// Queue writes a process's input to its stdin in order, without ever making
// a writer wait for the process: Write queues and returns, and one writer
// goroutine feeds the file as fast as the child reads.
//
// The caller of New owns the queue and must call Stop once the process has
// exited or is being torn down: Stop is what ends the writer goroutine and
// waits for it.
type Queue struct {
	// w belongs to the writer goroutine: only it writes to w and closes it.
	// Stop only sets its write deadline, which os.File allows concurrently.
	w    *os.File
	done chan struct{} // closed when the writer goroutine has closed w and returned

	mu sync.Mutex
	// work is signalled (L is mu) when the writer has something to do:
	// data queued, end of input requested, or Stop.
	work sync.Cond
	// queue holds accepted bytes not yet delivered, in order. While the
	// writer writes queue[0] it stays queued, so that it counts against the
	// limits; only the writer removes entries, except that breaking and
	// stopping discard them all.
	queue     [][]byte
	queued    int // bytes in queue
	accepted  int64
	delivered int64
	writing   bool // the writer is inside w.Write
	closed    bool
	eofSent   bool
	stopped   bool
	broken    error
	// changed, when not nil, is closed at the next change of state. It
	// lets an observer wait for a change instead of polling; it is made
	// only when someone waits, so it costs nothing otherwise.
	changed chan struct{}
}

// New takes ownership of w, the write end of the process's stdin (a pipe,
// or a PTY master), and starts the writer goroutine. w should be pollable
// (os.Pipe's ends and PTY masters are): Stop relies on its write deadline
// to interrupt a write the child does not read.
func New(w *os.File) *Queue {
	q := &Queue{w: w, done: make(chan struct{})}
	q.work.L = &q.mu
	go q.run()
	return q
}

// Write queues the bytes of the input stream at [offset, offset+len(p)) and
// returns the total bytes accepted after the call, also when it refuses.
// It returns as soon as the bytes are queued, never waiting for the child.
//
// Offsets make retries safe: bytes already accepted are not queued again,
// so a client that lost its connection can resend from the last offset it
// knows. A write entirely of accepted bytes is acknowledged and queues
// nothing (even after Close: those bytes were accepted, and are delivered
// before the end of input). A write overlapping the accepted bytes queues
// only its new suffix. A write starting past them is refused with ErrHole.
//
// A write is accepted whole or refused whole: ErrTooLarge past MaxWrite
// bytes, ErrFull when the new bytes would pass MaxQueued or MaxPending.
// An empty write queues nothing; it only checks that input is still
// allowed. After Close, new bytes fail with ErrClosed; once broken, every
// write fails with an ErrBroken error; after Stop, with ErrStopped.
func (q *Queue) Write(offset int64, p []byte) (accepted int64, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(p) > MaxWrite {
		return q.accepted, fmt.Errorf("%w: %d bytes at offset %d, limit %d", ErrTooLarge, len(p), offset, MaxWrite)
	}
	if err := q.refusedLocked(); err != nil {
		return q.accepted, err
	}
	skip, err := plan(q.accepted, offset, len(p))
	switch {
	case err == nil && len(p) > 0 && skip == len(p):
		return q.accepted, nil // a retry of accepted bytes
	case q.closed:
		return q.accepted, fmt.Errorf("%w: %d bytes at offset %d", ErrClosed, len(p), offset)
	case err != nil:
		return q.accepted, err
	}
	n := len(p) - skip
	if n == 0 {
		return q.accepted, nil
	}
	if q.queued+n > MaxQueued || len(q.queue)+1 > MaxPending {
		return q.accepted, fmt.Errorf("%w: %d bytes in %d writes queued, %d more refused", ErrFull, q.queued, len(q.queue), n)
	}
	// Copy: the caller may reuse p as soon as Write returns.
	q.queue = append(q.queue, append([]byte(nil), p[skip:]...))
	q.queued += n
	q.accepted += int64(n)
	q.work.Signal()
	q.notifyLocked()
	return q.accepted, nil
}

// Close requests the end of input: the writer closes the file once every
// byte accepted before has been delivered. Closing again returns nil and
// changes nothing. It fails like Write once the queue is broken or stopped.
func (q *Queue) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.refusedLocked(); err != nil {
		return err
	}
	if !q.closed {
		q.closed = true
		q.work.Signal()
		q.notifyLocked()
	}
	return nil
}

// Stop ends the queue for good, for when the process has exited or is being
// torn down: queued bytes are discarded, a write blocked on a full pipe is
// interrupted, the file is closed if it was not yet, and Stop returns once
// the writer goroutine has exited. Stopping again just waits for that.
// Afterwards Write and Close fail with ErrStopped (or the ErrBroken error,
// if the queue broke first).
func (q *Queue) Stop() {
	q.mu.Lock()
	if !q.stopped {
		q.stopped = true
		q.discardLocked()
		q.work.Signal()
		q.notifyLocked()
	}
	q.mu.Unlock()
	// The deadline stays in force, so it also stops a write the writer
	// starts after this line. Once the writer has closed w this fails,
	// harmlessly.
	_ = q.w.SetWriteDeadline(time.Now())
	<-q.done
}

// State returns a snapshot of the queue.
func (q *Queue) State() State {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stateLocked()
}

func (q *Queue) stateLocked() State {
	return State{
		Accepted:  q.accepted,
		Delivered: q.delivered,
		Pending:   len(q.queue),
		Queued:    q.queued,
		Closed:    q.closed,
		EOFSent:   q.eofSent,
		Stopped:   q.stopped,
		Broken:    q.broken,
	}
}

// refusedLocked returns why no input is allowed any more, or nil.
func (q *Queue) refusedLocked() error {
	switch {
	case q.broken != nil:
		return q.broken
	case q.stopped:
		return fmt.Errorf("%w: %d of %d accepted bytes delivered", ErrStopped, q.delivered, q.accepted)
	}
	return nil
}

func (q *Queue) discardLocked() {
	clear(q.queue)
	q.queue, q.queued = nil, 0
}

func (q *Queue) notifyLocked() {
	if q.changed != nil {
		close(q.changed)
		q.changed = nil
	}
}

// run is the writer goroutine. It delivers queued bytes in order and ends
// by closing w: after the end of input was requested and everything was
// delivered, when a write fails, or when stopped.
func (q *Queue) run() {
	defer close(q.done)
	q.mu.Lock()
	for {
		for len(q.queue) == 0 && !q.closed && !q.stopped {
			q.work.Wait()
		}
		if q.stopped || len(q.queue) == 0 {
			break
		}
		p := q.queue[0]
		q.writing = true
		q.notifyLocked()
		q.mu.Unlock()
		n, err := q.w.Write(p)
		q.mu.Lock()
		q.writing = false
		q.delivered += int64(n)
		if q.stopped {
			// Stop discarded the queue, and err is most likely its deadline.
			break
		}
		if err != nil {
			q.broken = fmt.Errorf("%w: write at stdin offset %d: %w", ErrBroken, q.delivered, err)
			q.discardLocked()
			break
		}
		q.queue[0] = nil
		q.queue = q.queue[1:]
		q.queued -= len(p)
		q.notifyLocked()
	}
	eof := q.closed && q.broken == nil && q.delivered == q.accepted
	q.mu.Unlock()

	// Closing a pipe's write end loses nothing already written, so its
	// error tells nothing worth keeping.
	_ = q.w.Close()

	q.mu.Lock()
	q.eofSent = eof
	q.notifyLocked()
	q.mu.Unlock()
}
