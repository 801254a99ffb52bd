"""The SDK's errors: one class per code, all SandkilnErrors, each saying what
went wrong in words and, when kilnd answered, what it answered."""

from __future__ import annotations

from typing import Any, Literal, get_args

ErrorCode = Literal[
    "OUTPUT_CAPACITY",
    "OUTCOME_UNKNOWN",
    "WAIT_ABORTED",
    "UNAVAILABLE",
    "NOT_FOUND",
    "INVALID_ARGUMENT",
    "UNAUTHENTICATED",
    "PERMISSION_DENIED",
    "FAILED_PRECONDITION",
    "OUT_OF_RANGE",
    "ALREADY_EXISTS",
    "PAUSED",
    "STDIN_CLOSED",
    "INPUT_UNCERTAIN",
    "INPUT_CAPACITY",
    "DETACHED",
    "OUTPUT_IN_USE",
    "UNSUPPORTED",
    "INTERNAL",
]

ERROR_CODES: tuple[ErrorCode, ...] = get_args(ErrorCode)


class SandkilnError(Exception):
    """Every error the SDK raises. ``code`` is what to branch on (the same
    codes as the TypeScript SDK's); ``status`` and ``kiln_code`` are kilnd's
    HTTP status and its own code when kilnd answered. The failure that caused
    it, if any, is its ``__cause__``."""

    code: ErrorCode = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        kiln_code: str | None = None,
        confirmed_exit: Any = None,
        output: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kiln_code = kiln_code
        # What exec with a callback had when it failed: an exit already
        # confirmed (an Exit, or None) and the output captured (ExecOutput).
        self.confirmed_exit = confirmed_exit
        self.output = output

    def __str__(self) -> str:
        return self.message


class OutputCapacityError(SandkilnError):
    """Bytes of the output were lost to this handle (its reader fell behind
    what kilnd keeps), or finite output reached its bound."""

    code: ErrorCode = "OUTPUT_CAPACITY"


class OutcomeUnknownError(SandkilnError):
    """A request was sent and its answer lost: it may or may not have taken
    effect. Nothing is sent again."""

    code: ErrorCode = "OUTCOME_UNKNOWN"


class WaitAbortedError(SandkilnError, TimeoutError):
    """The call's timeout ran out before (or instead of) an answer; only that
    call stopped waiting. It is a TimeoutError too."""

    code: ErrorCode = "WAIT_ABORTED"


class UnavailableError(SandkilnError):
    """kilnd, the sandbox or the connection cannot serve now."""

    code: ErrorCode = "UNAVAILABLE"


class NotFoundError(SandkilnError):
    """No such sandbox, process, file or image."""

    code: ErrorCode = "NOT_FOUND"


class InvalidArgumentError(SandkilnError, ValueError):
    """A request malformed, or past one of the API's bounds. It is a
    ValueError too."""

    code: ErrorCode = "INVALID_ARGUMENT"


class UnauthenticatedError(SandkilnError):
    """kilnd's token is missing or wrong."""

    code: ErrorCode = "UNAUTHENTICATED"


class PermissionDeniedError(SandkilnError):
    """kilnd does not allow the request."""

    code: ErrorCode = "PERMISSION_DENIED"


class FailedPreconditionError(SandkilnError):
    """The state of what was asked about refuses the request."""

    code: ErrorCode = "FAILED_PRECONDITION"


class OutOfRangeError(SandkilnError):
    """Offsets beyond what a process has produced."""

    code: ErrorCode = "OUT_OF_RANGE"


class AlreadyExistsError(SandkilnError):
    """Something to make exists already."""

    code: ErrorCode = "ALREADY_EXISTS"


class PausedError(SandkilnError):
    """The sandbox is paused, and the request needs it to run: it succeeds
    once the sandbox is resumed."""

    code: ErrorCode = "PAUSED"


class StdinClosedError(SandkilnError):
    """Input after close_stdin(), or on a process without a stdin pipe."""

    code: ErrorCode = "STDIN_CLOSED"


class InputUncertainError(SandkilnError):
    """An earlier write's or close's outcome is unknown: input is disabled."""

    code: ErrorCode = "INPUT_UNCERTAIN"


class InputCapacityError(SandkilnError):
    """The input queue (256 KiB, 256 calls) is full: await earlier writes."""

    code: ErrorCode = "INPUT_CAPACITY"


class DetachedError(SandkilnError):
    """The handle was detached or disconnected, or its client closed."""

    code: ErrorCode = "DETACHED"


class OutputInUseError(SandkilnError):
    """The process's output has a consumer already."""

    code: ErrorCode = "OUTPUT_IN_USE"


class UnsupportedError(SandkilnError):
    """Something this SDK or kilnd does not support."""

    code: ErrorCode = "UNSUPPORTED"


class InternalError(SandkilnError):
    """A callback raised, or kilnd answered something that is not the API."""

    code: ErrorCode = "INTERNAL"


_CLASSES: dict[str, type[SandkilnError]] = {
    c.code: c
    for c in (
        OutputCapacityError,
        OutcomeUnknownError,
        WaitAbortedError,
        UnavailableError,
        NotFoundError,
        InvalidArgumentError,
        UnauthenticatedError,
        PermissionDeniedError,
        FailedPreconditionError,
        OutOfRangeError,
        AlreadyExistsError,
        PausedError,
        StdinClosedError,
        InputUncertainError,
        InputCapacityError,
        DetachedError,
        OutputInUseError,
        UnsupportedError,
        InternalError,
    )
}


def error(code: ErrorCode, message: str, **kw: Any) -> SandkilnError:
    """An error of code's class."""
    return _CLASSES[code](message, **kw)


# kilnd's codes, as it answers them, to the SDK's: several of kilnd's map to
# one of the SDK's, which keeps kilnd's in kiln_code.
_FROM_WIRE: dict[str, ErrorCode] = {
    "invalid_argument": "INVALID_ARGUMENT",
    "too_large": "INVALID_ARGUMENT",
    "no_space": "UNAVAILABLE",
    "unauthenticated": "UNAUTHENTICATED",
    "permission_denied": "PERMISSION_DENIED",
    "not_found": "NOT_FOUND",
    "method_not_allowed": "INVALID_ARGUMENT",
    "already_exists": "ALREADY_EXISTS",
    "out_of_range": "OUT_OF_RANGE",
    "failed_precondition": "FAILED_PRECONDITION",
    "unavailable": "UNAVAILABLE",
    "outcome_unknown": "OUTCOME_UNKNOWN",
    "bad_gateway": "UNAVAILABLE",
    "command_not_found": "INVALID_ARGUMENT",
    "not_executable": "INVALID_ARGUMENT",
    "paused": "PAUSED",
    "internal": "INTERNAL",
}


def from_answer(status: int, body: Any, what: str) -> SandkilnError:
    """The error of kilnd's answer: its status and decoded JSON body (None
    when the body was not JSON)."""
    e = body.get("error") if isinstance(body, dict) else None
    if isinstance(e, dict) and isinstance(e.get("code"), str) and isinstance(e.get("message"), str):
        kiln_code: str = e["code"]
        return error(_FROM_WIRE.get(kiln_code, "INTERNAL"), f"kilnd: {e['message']}", status=status, kiln_code=kiln_code)
    return error("INTERNAL", f"kilnd: {what}: HTTP {status}, not an answer of the API", status=status, kiln_code="internal")
