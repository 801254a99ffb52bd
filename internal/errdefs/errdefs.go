// Package errdefs holds the error classes, one per API error code, that every package's errors belong to.
package errdefs

import "errors"

// Class is a kind of failure. There is one class per API error code, and
// the transport alone (package reply) knows which code and HTTP status
// each stands for, so a package only says which class its errors are of:
// it declares its sentinels with New, or wraps a class itself with %w.
// Classes are compared by identity.
type Class struct{ name string }

func (c *Class) Error() string { return c.name }

// The classes. Each one's message is its code in words, so an error that
// wraps a class directly reads "not found: no sandbox …".
var (
	ErrInvalidArgument    = &Class{"invalid argument"}
	ErrUnauthenticated    = &Class{"unauthenticated"}
	ErrPermissionDenied   = &Class{"permission denied"}
	ErrNotFound           = &Class{"not found"}
	ErrMethodNotAllowed   = &Class{"method not allowed"}
	ErrAlreadyExists      = &Class{"already exists"}
	ErrTooLarge           = &Class{"too large"}
	ErrOutOfRange         = &Class{"out of range"}
	ErrFailedPrecondition = &Class{"failed precondition"}
	ErrUnavailable        = &Class{"unavailable"}
	// ErrOutcomeUnknown: the request reached the sandbox's agent and no
	// answer came back, so it may or may not have taken effect.
	ErrOutcomeUnknown = &Class{"outcome unknown"}
	ErrInternal       = &Class{"internal"}
	// ErrBadGateway: a sandbox's port, proxied, did not answer well.
	ErrBadGateway = &Class{"bad gateway"}
	// ErrCommandNotFound and ErrNotExecutable: a process could not start
	// because its program is not there, or is there and cannot be run
	// (a shell's 127 and 126).
	ErrCommandNotFound = &Class{"command not found"}
	ErrNotExecutable   = &Class{"not executable"}
	// ErrNoSpace: what was to be written, or asked for, does not fit in
	// the space there is (a sandbox's disk, its quota, kilnd's state
	// directory): neither the request's fault nor one of the API's
	// bounds.
	ErrNoSpace = &Class{"no space"}
	// ErrPaused: the sandbox is paused, and what was asked needs it to
	// run; it is asked again once the sandbox is resumed.
	ErrPaused = &Class{"paused"}
)

// New returns an error of class whose message is msg alone: errors.Is
// matches it against itself and against class, and so does every error
// that wraps it with %w. Each call makes a distinct error.
func New(class *Class, msg string) error { return &member{msg: msg, class: class} }

type member struct {
	msg   string
	class *Class
}

func (e *member) Error() string { return e.msg }
func (e *member) Unwrap() error { return e.class }

// Opaque returns an error of class whose message is msg alone and which
// wraps cause, for errors.Is and errors.As, without its words: for a
// failure on the host, whose cause names host paths or speaks the
// kernel's language, neither of which a client is shown. Whoever has the
// error whole (kilnd's log) still has the cause.
func Opaque(class *Class, msg string, cause error) error {
	return &opaque{member: member{msg: msg, class: class}, cause: cause}
}

type opaque struct {
	member
	cause error
}

// Unwrap gives the class first, so that ClassOf finds it, not one the
// cause may have.
func (e *opaque) Unwrap() []error { return []error{e.class, e.cause} }

// ClassOf returns the class of err, or nil if it has none. The tree of
// wrapped errors is searched depth first, as errors.As does, so the
// outermost class wins and, in a join or a multiple %w, the first error
// that has one.
func ClassOf(err error) *Class {
	var c *Class
	errors.As(err, &c)
	return c
}
