package client

import (
	"context"
	"net/url"
	"strconv"

	"github.com/sandkiln/sandkiln/api"
)

// Write sends data (at most 64 KiB) to stdin, after every earlier write.
// Success means kilnd accepted it, not that the program read it. Each
// write carries its stdin offset, so kilnd applies it once even if sent
// twice; but if an answer is lost the error is ErrOutcomeUnknown and
// further writes wait for ResyncInput, which learns from kilnd where the
// input stands.
func (p *Process) Write(ctx context.Context, data []byte) error {
	if len(data) > api.MaxStdin {
		return ErrWriteTooLarge
	}
	p.writing.Lock()
	defer p.writing.Unlock()
	p.mu.Lock()
	err := p.inputLocked()
	if err == nil && p.closed {
		err = ErrStdinClosed
	}
	off := p.stdinOff
	p.mu.Unlock()
	if err != nil {
		return err
	}
	var acc api.StdinAccepted
	err = p.s.c.call(ctx, "POST", p.path("/stdin"), url.Values{"offset": {strconv.FormatInt(off, 10)}}, data, &acc, false)
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

// CloseStdin sends end-of-input once every earlier write is delivered.
// Closing again does nothing.
func (p *Process) CloseStdin(ctx context.Context) error {
	p.writing.Lock()
	defer p.writing.Unlock()
	p.mu.Lock()
	err, closed := p.inputLocked(), p.closed
	p.mu.Unlock()
	if err != nil || closed {
		return err
	}
	err = p.s.c.call(ctx, "POST", p.path("/stdin/close"), nil, nil, nil, false)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		p.closed = true
	case IsOutcomeUnknown(err):
		p.uncertain = true
	}
	return err
}
