package agent

import (
	"fmt"
	"testing"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/capture"
	"github.com/sandkiln/sandkiln/internal/errdefs"
	"github.com/sandkiln/sandkiln/internal/process"
	"github.com/sandkiln/sandkiln/internal/reply"
	"github.com/sandkiln/sandkiln/internal/ring"
	"github.com/sandkiln/sandkiln/internal/stdin"
)

// Every error the agent can answer with carries its code in the class it
// was declared with, wrapped as the handlers wrap it. The codes are the
// API's: changing one is changing what clients see.
func TestErrorCodes(t *testing.T) {
	tests := []struct {
		err  error
		code string
	}{
		{errBadJSON, api.CodeInvalid},
		{errdefs.ErrTooLarge, api.CodeTooLarge},
		{errdefs.ErrNotFound, api.CodeNotFound},
		{api.ErrInvalid, api.CodeInvalid},
		{api.ErrTooLarge, api.CodeTooLarge},
		{process.ErrInvalid, api.CodeInvalid},
		{process.ErrNotFound, api.CodeNotFound},
		{process.ErrFinished, api.CodePrecondition},
		{process.ErrStart, api.CodeInvalid},
		{process.ErrNoDir, api.CodeNotFound},
		{process.ErrNoCommand, api.CodeCommandNotFound},
		{process.ErrNotExecutable, api.CodeNotExecutable},
		{process.ErrNoStdin, api.CodeInvalid},
		{process.ErrNotTerminal, api.CodeInvalid},
		{process.ErrTerminalEOF, api.CodeInvalid},
		{process.ErrOutOfRange, api.CodeOutOfRange},
		{process.ErrCapture, api.CodeUnavailable},
		{process.ErrClosed, api.CodeUnavailable},
		{ring.ErrOutOfRange, api.CodeOutOfRange},
		{stdin.ErrTooLarge, api.CodeTooLarge},
		{stdin.ErrFull, api.CodeUnavailable},
		{stdin.ErrHole, api.CodeInvalid},
		{stdin.ErrOffset, api.CodeInvalid},
		{stdin.ErrClosed, api.CodePrecondition},
		{stdin.ErrBroken, api.CodePrecondition},
		{stdin.ErrStopped, api.CodePrecondition},
		{capture.ErrStopped, api.CodePrecondition},
		// A capture that cannot begin is the host's failure, whatever the
		// capture said.
		{fmt.Errorf("%w: %w", process.ErrCapture, capture.ErrStopped), api.CodeUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			if code, _ := reply.Code(fmt.Errorf("%w: p1", tt.err)); code != tt.code {
				t.Errorf("%v answers %s, want %s", tt.err, code, tt.code)
			}
		})
	}
}
