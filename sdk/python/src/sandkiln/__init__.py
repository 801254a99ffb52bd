"""sandkiln: kilnd's sandboxes, and processes whose output, input and exit
are reported as they are known, never guessed. Client is synchronous,
AsyncClient is for asyncio; both are the same code."""

from ._errors import (
    ERROR_CODES,
    AlreadyExistsError,
    DetachedError,
    ErrorCode,
    FailedPreconditionError,
    InputCapacityError,
    InputUncertainError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutcomeUnknownError,
    OutOfRangeError,
    OutputCapacityError,
    OutputInUseError,
    PermissionDeniedError,
    SandkilnError,
    StdinClosedError,
    UnauthenticatedError,
    UnavailableError,
    UnsupportedError,
    WaitAbortedError,
)

__version__ = "0.1.0"

__all__ = [
    "ERROR_CODES",
    "AlreadyExistsError",
    "DetachedError",
    "ErrorCode",
    "FailedPreconditionError",
    "InputCapacityError",
    "InputUncertainError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutOfRangeError",
    "OutcomeUnknownError",
    "OutputCapacityError",
    "OutputInUseError",
    "PermissionDeniedError",
    "SandkilnError",
    "StdinClosedError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnsupportedError",
    "WaitAbortedError",
    "__version__",
]
