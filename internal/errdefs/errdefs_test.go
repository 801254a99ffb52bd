package errdefs_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// An error's class is found however it was wrapped, as long as it was
// wrapped with %w; the outermost class, then the first, wins.
func TestClassOf(t *testing.T) {
	full := errdefs.New(errdefs.ErrUnavailable, "stdin: queue full")
	hole := errdefs.New(errdefs.ErrInvalidArgument, "stdin: write would leave a hole")
	plain := errors.New("plain")
	tests := []struct {
		name string
		err  error
		want *errdefs.Class
	}{
		{"a class", errdefs.ErrNotFound, errdefs.ErrNotFound},
		{"a class wrapped", fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, "x"), errdefs.ErrNotFound},
		{"a sentinel", full, errdefs.ErrUnavailable},
		{"wrapped", fmt.Errorf("%w: 3 bytes", full), errdefs.ErrUnavailable},
		{"doubly wrapped", fmt.Errorf("write: %w", fmt.Errorf("%w: 3 bytes", full)), errdefs.ErrUnavailable},
		{"joined", errors.Join(plain, full), errdefs.ErrUnavailable},
		{"joined and wrapped", fmt.Errorf("close: %w", errors.Join(plain, fmt.Errorf("%w: 3 bytes", full))), errdefs.ErrUnavailable},
		{"a class around a sentinel of another", fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, hole), errdefs.ErrFailedPrecondition},
		{"the first of two", fmt.Errorf("%w: %w", hole, full), errdefs.ErrInvalidArgument},
		{"the first of a join", errors.Join(full, hole), errdefs.ErrUnavailable},
		{"no class", plain, nil},
		{"a sentinel formatted with %v", fmt.Errorf("write: %v", full), nil},
		{"nil", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := errdefs.ClassOf(tt.err); got != tt.want {
				t.Errorf("ClassOf(%v) = %v, want %v", tt.err, got, tt.want)
			}
			if tt.want != nil && !errors.Is(tt.err, tt.want) {
				t.Errorf("errors.Is(%v, %v) is false", tt.err, tt.want)
			}
		})
	}
}

// A sentinel keeps its message and its identity: errors.Is tells it from
// another of the same class and message, and matches its class.
func TestSentinel(t *testing.T) {
	stopped := errdefs.New(errdefs.ErrFailedPrecondition, "stdin: input stopped")
	twin := errdefs.New(errdefs.ErrFailedPrecondition, "stdin: input stopped")
	wrapped := fmt.Errorf("%w: 2 of 5 accepted bytes delivered", stopped)
	if got, want := wrapped.Error(), "stdin: input stopped: 2 of 5 accepted bytes delivered"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	for _, tt := range []struct {
		name   string
		err    error
		target error
		want   bool
	}{
		{"itself", stopped, stopped, true},
		{"its class", stopped, errdefs.ErrFailedPrecondition, true},
		{"wrapped, itself", wrapped, stopped, true},
		{"wrapped, its class", wrapped, errdefs.ErrFailedPrecondition, true},
		{"another class", wrapped, errdefs.ErrUnavailable, false},
		{"its twin", wrapped, twin, false},
		{"its class is not it", errdefs.ErrFailedPrecondition, stopped, false},
	} {
		if got := errors.Is(tt.err, tt.target); got != tt.want {
			t.Errorf("%s: errors.Is(%v, %v) = %v, want %v", tt.name, tt.err, tt.target, got, tt.want)
		}
	}
}
