// The SDK's one error type: a code to branch on, a message for people, and
// what kilnd said when it answered.

/** What went wrong, to branch on. */
export type ErrorCode =
  /** The output queue (64 KiB, 256 chunks) filled: the consumer fell behind. */
  | "OUTPUT_CAPACITY"
  /** A request was sent and its answer lost: it may or may not have taken effect. */
  | "OUTCOME_UNKNOWN"
  /** The caller's signal aborted the call before (or instead of) an answer. */
  | "WAIT_ABORTED"
  /** kilnd, the sandbox or the connection cannot serve now. */
  | "UNAVAILABLE"
  /** No such sandbox or process (or a reference that no longer reaches it). */
  | "NOT_FOUND"
  /** A request malformed, or past one of the API's bounds. */
  | "INVALID_ARGUMENT"
  /** The token is missing or wrong. */
  | "UNAUTHENTICATED"
  /** kilnd does not allow the request (a browser origin it does not list). */
  | "PERMISSION_DENIED"
  /** The process's state refuses the request for good (it finished, its stdin is closed). */
  | "FAILED_PRECONDITION"
  /** Offsets beyond what a process has produced. */
  | "OUT_OF_RANGE"
  /** Something to make exists already. */
  | "ALREADY_EXISTS"
  /** The sandbox is paused, and the request needs it to run: it succeeds once resumed. */
  | "PAUSED"
  /** Input after closeStdin(), or on a process without a stdin pipe. */
  | "STDIN_CLOSED"
  /** An earlier write's or close's outcome is unknown: further input is disabled. */
  | "INPUT_UNCERTAIN"
  /** The input queue (256 KiB, 256 calls) is full: await earlier writes. */
  | "INPUT_CAPACITY"
  /** The handle was detached or disconnected. */
  | "DETACHED"
  /** The process's output has a consumer already. */
  | "OUTPUT_IN_USE"
  /** The option is not one this SDK or kilnd supports. */
  | "UNSUPPORTED"
  /** A callback threw, or kilnd answered something that is not the API. */
  | "INTERNAL";

/** The wire's error codes, as kilnd answers them, to the SDK's. */
const fromWire: Record<string, ErrorCode> = {
  invalid_argument: "INVALID_ARGUMENT",
  too_large: "INVALID_ARGUMENT",
  no_space: "UNAVAILABLE",
  unauthenticated: "UNAUTHENTICATED",
  permission_denied: "PERMISSION_DENIED",
  not_found: "NOT_FOUND",
  method_not_allowed: "INVALID_ARGUMENT",
  already_exists: "ALREADY_EXISTS",
  out_of_range: "OUT_OF_RANGE",
  failed_precondition: "FAILED_PRECONDITION",
  unavailable: "UNAVAILABLE",
  outcome_unknown: "OUTCOME_UNKNOWN",
  bad_gateway: "UNAVAILABLE",
  command_not_found: "INVALID_ARGUMENT",
  not_executable: "INVALID_ARGUMENT",
  paused: "PAUSED",
  internal: "INTERNAL",
};

export interface SandkilnErrorOptions {
  cause?: unknown;
  /** The HTTP status, when kilnd answered. */
  status?: number;
  /** kilnd's own code ("not_found", "too_large", …), when it answered. */
  kilnCode?: string;
  /** A confirmed exit the failure does not erase (exec with a callback). */
  confirmedExit?: unknown;
  /** Output captured before the failure (exec with a callback). */
  output?: unknown;
}

/** Every error the SDK throws or rejects with. */
export class SandkilnError extends Error {
  readonly code: ErrorCode;
  readonly status: number | undefined;
  readonly kilnCode: string | undefined;
  readonly confirmedExit: unknown;
  readonly output: unknown;

  constructor(code: ErrorCode, message: string, options: SandkilnErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "SandkilnError";
    this.code = code;
    this.status = options.status;
    this.kilnCode = options.kilnCode;
    this.confirmedExit = options.confirmedExit;
    this.output = options.output;
  }

  /** An error of kilnd's answer: its status and body. */
  static fromAnswer(status: number, body: unknown, what: string): SandkilnError {
    const e = (body as { error?: { code?: unknown; message?: unknown } } | null)?.error;
    if (e && typeof e.code === "string" && typeof e.message === "string") {
      return new SandkilnError(fromWire[e.code] ?? "INTERNAL", `kilnd: ${e.message}`, { status, kilnCode: e.code });
    }
    return new SandkilnError("INTERNAL", `kilnd: ${what}: HTTP ${status}, not an answer of the API`, { status, kilnCode: "internal" });
  }
}

/** Says err is a SandkilnError of that code. */
export function isSandkilnError(err: unknown, code?: ErrorCode): err is SandkilnError {
  return err instanceof SandkilnError && (code === undefined || err.code === code);
}
