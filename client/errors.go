package client

import (
	"errors"
	"fmt"

	"github.com/sandkiln/sandkiln/api"
)

// Error is an error kilnd (or the sandbox's agent) answered with. Test
// it with the Is… functions, one for each of its codes.
type Error struct {
	Status  int    // HTTP status
	Code    string // one of api.Code…
	Message string
}

func (e *Error) Error() string { return "kilnd: " + e.Message }

// ErrOutcomeUnknown reports a request whose answer was lost: it may or may
// not have taken effect. The client never retries such a request blindly.
// The error wraps the cause as well (a context's deadline or cancellation,
// a broken connection, an Error).
var ErrOutcomeUnknown = errors.New("client: outcome unknown: the request was sent and its answer lost")

func hasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// IsNotFound reports an unknown (or evicted) sandbox or process.
func IsNotFound(err error) bool { return hasCode(err, api.CodeNotFound) }

// errAhead: a reference stands beyond what its process has produced, as
// kilnd's out of range answers say of offsets.
var errAhead = errors.New("client: out of range")

// IsOutOfRange reports offsets beyond what a process has produced (a
// reference's, Reopen finds, or those kilnd was asked for).
func IsOutOfRange(err error) bool {
	return errors.Is(err, errAhead) || hasCode(err, api.CodeOutOfRange)
}

// ErrNoToken: a TCP address was given and no token was found for it. No
// request was sent.
var ErrNoToken = errors.New("client: kilnd's token is needed for")

// ErrInvalidArgument is the class of the arguments the client refuses
// before it sends anything: a bound of the API's or of the streaming
// contract's passed (a drain time, an output bound, a write's size), a
// value it does not know (a flow, a format, an overflow), options that
// exclude each other. IsInvalid reports it as it reports kilnd's own
// refusals.
var ErrInvalidArgument = errors.New("client: invalid argument")

// invalid is an ErrInvalidArgument saying what was wrong.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// IsInvalid reports arguments the client refused before sending them
// (ErrInvalidArgument), or a request kilnd refused as malformed, as too
// large (IsTooLarge tells which), or as a process whose program is not
// there or cannot be run (IsCommandNotFound, IsNotExecutable).
func IsInvalid(err error) bool {
	return errors.Is(err, ErrInvalidArgument) || hasCode(err, api.CodeInvalid) || hasCode(err, api.CodeTooLarge) ||
		IsCommandNotFound(err) || IsNotExecutable(err)
}

// IsCommandNotFound reports a process that did not start because its
// program is not there: no such path, or no such name in its PATH.
func IsCommandNotFound(err error) bool { return hasCode(err, api.CodeCommandNotFound) }

// IsNotExecutable reports a process that did not start because its
// program cannot be run: not executable, a directory, or not a program.
func IsNotExecutable(err error) bool { return hasCode(err, api.CodeNotExecutable) }

// IsTooLarge reports a request past one of the API's bounds: a body, a
// stdin write, or a command's arguments and environment.
func IsTooLarge(err error) bool { return hasCode(err, api.CodeTooLarge) }

// IsNoSpace reports a write that did not fit in the space left: a
// sandbox's disk (its quota) is full. Nothing of it was kept.
func IsNoSpace(err error) bool { return hasCode(err, api.CodeNoSpace) }

// ErrUnavailable reports a call that got no answer from kilnd because the
// connection to it could not be made or broke (an idempotent call: one
// that may be made again). Wait fails with it rather than guess an exit.
var ErrUnavailable = errors.New("client: unavailable: no answer from kilnd")

// IsUnavailable reports kilnd or a sandbox unable to serve now, or a
// connection to kilnd that failed (ErrUnavailable).
func IsUnavailable(err error) bool {
	return errors.Is(err, ErrUnavailable) || hasCode(err, api.CodeUnavailable)
}

// IsOutcomeUnknown reports a request that may or may not have taken
// effect: its answer was lost on the way to the client (ErrOutcomeUnknown),
// or kilnd lost the agent's.
func IsOutcomeUnknown(err error) bool {
	return errors.Is(err, ErrOutcomeUnknown) || hasCode(err, api.CodeUnknown)
}

// IsFailedPrecondition reports a request the process's state refuses for
// good: it has finished, or its stdin is closed or broken.
func IsFailedPrecondition(err error) bool { return hasCode(err, api.CodePrecondition) }

// IsPaused reports a request refused because its sandbox is paused
// (Sandbox.Pause), and needs it to run: the same request succeeds once
// the sandbox is resumed.
func IsPaused(err error) bool { return hasCode(err, api.CodePaused) }

// IsUnauthenticated reports a request without the token kilnd asks for on
// TCP.
func IsUnauthenticated(err error) bool { return hasCode(err, api.CodeUnauthorized) }

// IsPermissionDenied reports a request kilnd does not allow, such as one
// from a browser origin outside its --allow-origin.
func IsPermissionDenied(err error) bool { return hasCode(err, api.CodeForbidden) }

// IsAlreadyExists reports a request to make something that exists already.
func IsAlreadyExists(err error) bool { return hasCode(err, api.CodeConflict) }

// IsMethodNotAllowed reports a method a route does not take.
func IsMethodNotAllowed(err error) bool { return hasCode(err, api.CodeMethod) }

// IsBadGateway reports a sandbox's port that nothing listens on, or
// whose server did not answer well.
func IsBadGateway(err error) bool { return hasCode(err, api.CodeBadGateway) }

// IsInternal reports a failure of kilnd or the agent themselves, or an
// answer that was not one of the API's.
func IsInternal(err error) bool { return hasCode(err, api.CodeInternal) }

// Errors of a process handle.
var (
	// ErrDetached: the handle was let go (Detach, Disconnect, its
	// client's Close, its sandbox's Delete through the same client). A
	// call in progress then fails with it too.
	ErrDetached = errors.New("client: the process handle was detached or disconnected")
	// ErrInterrupted says Output's connection broke, or could not be made,
	// for a reason a later call may not meet (the network, kilnd
	// restarting): calling Output again resumes from the last byte
	// delivered. A held process's output stays held for its grace period.
	ErrInterrupted    = errors.New("client: output interrupted")
	ErrOutputInUse    = errors.New("client: the process's output has a reader already")
	ErrInputUncertain = errors.New("client: an earlier write's outcome is unknown; call ResyncInput first")
	// ErrInputPending: Disconnect was asked while a write or an
	// end-of-input was on its way, whose outcome a reference could not
	// record.
	ErrInputPending  = errors.New("client: a write or end-of-input is in progress; wait for it before disconnecting")
	ErrStdinClosed   = errors.New("client: stdin is closed")
	ErrNoStdin       = errors.New("client: the process has no stdin pipe")
	ErrWriteTooLarge = fmt.Errorf("%w: a write carries at most %d bytes", ErrInvalidArgument, api.MaxStdin)
	// ErrInputCapacity: more writes wait their turn than the input queue
	// takes (MaxInputBytes, MaxInputCalls, the write in progress
	// included). Nothing of the refused write was sent.
	ErrInputCapacity = fmt.Errorf("client: the input queue holds at most %d bytes and %d calls; wait for earlier writes", MaxInputBytes, MaxInputCalls)
	// ErrOutputCapacity is the class of CapacityError: bytes of the
	// output were lost to the handle before it read them.
	ErrOutputCapacity = errors.New("client: output capacity")
)

// CapacityError is how Output fails at a gap (with Overflow OverflowFail,
// the default): Lost bytes of Stream, before Offset, were lost to the
// handle before it read them; everything before them was delivered. It
// wraps ErrOutputCapacity.
type CapacityError struct {
	Process string
	Stream  string
	Offset  int64 // where the stream stands after the gap
	Lost    int64
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("%v: %d bytes of %s of process %s were lost before this handle read them (kilnd could not keep them while the reader was behind); Overflow OverflowReport reads on past such gaps",
		ErrOutputCapacity, e.Lost, e.Stream, e.Process)
}

func (e *CapacityError) Unwrap() error { return ErrOutputCapacity }

// IsForbidden reports a call kilnd refuses whoever makes it: an origin or
// host it does not serve, a mount it does not allow, a snapshot past its
// quota.
func IsForbidden(err error) bool { return hasCode(err, api.CodeForbidden) }
