package client

import (
	"context"
	"net/url"
	"strconv"

	"github.com/sandkiln/sandkiln/api"
)

// The input queue's bounds: Write calls waiting for their turn, the one
// sending included, and their bytes. A write beyond them is refused
// (ErrInputCapacity) without waiting.
const (
	MaxInputBytes = 256 << 10
	MaxInputCalls = 256
)

// Write sends data (at most 64 KiB, api.MaxStdin) to stdin, after every
// earlier write: calls wait their turn, at most MaxInputCalls of them and
// MaxInputBytes in all. Success means kilnd accepted it, not that the
// program read it. An empty write checks that input is still allowed.
// A write whose ctx ends while it waits its turn is not sent, with no
// remote effect; one that ends while it is sent has an unknown outcome.
//
// Each write carries its stdin offset, so kilnd applies it once even if
// sent twice; but if an answer is lost the error is ErrOutcomeUnknown and
// further writes wait for ResyncInput, which learns from kilnd where the
// input stands. Nothing is ever sent again by itself.
func (p *Process) Write(ctx context.Context, data []byte) error {
	if len(data) > api.MaxStdin {
		return ErrWriteTooLarge
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	err := p.inputLocked()
	if err == nil && (p.queued+1 > MaxInputCalls || p.queuedLen+len(data) > MaxInputBytes) {
		err = ErrInputCapacity
	}
	if err != nil {
		p.mu.Unlock()
		return err
	}
	p.queued++
	p.queuedLen += len(data)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.queued--
		p.queuedLen -= len(data)
		p.mu.Unlock()
	}()
	ctx, done, err := p.bind(ctx)
	if err != nil {
		return err
	}
	defer done()
	select {
	case p.writing <- struct{}{}:
		defer func() { <-p.writing }()
	case <-ctx.Done():
		return settled(ctx, ctx.Err()) // not sent
	}
	// What happened while it waited (the handle let go, a write's outcome
	// lost, stdin closed) stops it.
	p.mu.Lock()
	err = p.inputLocked()
	off := p.stdinOff
	p.mu.Unlock()
	if err != nil {
		return err
	}
	var acc api.StdinAccepted
	err = settled(ctx, p.s.c.call(ctx, "POST", p.path("/stdin"), url.Values{"offset": {strconv.FormatInt(off, 10)}}, data, &acc, false))
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if IsOutcomeUnknown(err) {
			p.uncertain = true
		}
		return err
	}
	p.stdinOff = max(p.stdinOff, acc.Accepted)
	return nil
}

// inputLocked says why input cannot be sent now, if it cannot. Called
// under mu.
func (p *Process) inputLocked() error {
	switch {
	case p.gone:
		return ErrDetached
	case !p.stdin:
		return ErrNoStdin
	case p.uncertain:
		return ErrInputUncertain
	case p.closed || p.closing:
		return ErrStdinClosed
	}
	return nil
}

// ResyncInput asks kilnd where stdin stands after an unknown outcome, so
// that writing can go on: what kilnd accepted is not sent again.
func (p *Process) ResyncInput(ctx context.Context) (accepted int64, err error) {
	st, err := p.Status(ctx)
	if err != nil {
		return 0, err
	}
	if st.Process == nil || st.Process.Stdin == nil {
		return 0, ErrNoStdin
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stdinOff, p.uncertain = st.Process.Stdin.Accepted, false
	p.closed = st.Process.Stdin.Closed
	return p.stdinOff, nil
}

// CloseStdin sends end-of-input once every earlier write is delivered;
// later writes are refused (ErrStdinClosed) without being sent. Closing
// again, once a close succeeded, sends nothing. A terminal has no stdin
// to close: its end of input is its end-of-file character (Ctrl-D,
// "\x04"), written as input.
func (p *Process) CloseStdin(ctx context.Context) error {
	if p.terminal {
		return invalid("process %s is on a terminal: write its end-of-file character (Ctrl-D, \\x04) instead of closing its input", p.ID)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	err, closed := p.inputLocked(), p.closed
	p.mu.Unlock()
	if closed && err == ErrStdinClosed {
		return nil
	}
	if err != nil && err != ErrStdinClosed { // a close on its way: this one waits for it
		return err
	}
	ctx, done, err := p.bind(ctx)
	if err != nil {
		return err
	}
	defer done()
	select {
	case p.writing <- struct{}{}:
		defer func() { <-p.writing }()
	case <-ctx.Done():
		return settled(ctx, ctx.Err())
	}
	p.mu.Lock()
	err = p.inputLocked()
	if err == ErrStdinClosed {
		// Another close went first: done.
		p.mu.Unlock()
		return nil
	}
	if err != nil {
		p.mu.Unlock()
		return err
	}
	p.closing = true
	p.mu.Unlock()
	err = settled(ctx, p.s.c.call(ctx, "POST", p.path("/stdin/close"), nil, nil, nil, false))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closing = false
	switch {
	case err == nil:
		p.closed = true
	case IsOutcomeUnknown(err):
		p.uncertain = true
	}
	return err
}
