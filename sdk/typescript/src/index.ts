// @sandkiln/sdk: kilnd's sandboxes, and processes whose output, input and
// exit are reported as they are known, never guessed.

export { Client, Sandbox, Sandboxes, Processes, Terminals, Files, Previews, Images, Snapshots, Nodes } from "./client.js";
export type {
  ClientOptions, Command, ExecInput, ExecOptions, ExecOutput, FileInfo, ImageInfo, Mount, Preview, EventOptions, SandboxFilter, SandboxInfo, SnapshotInfo,
  SandboxOptions, SandboxReference, StartOptions, TerminalStartOptions,
} from "./client.js";
export type { Health, ImageProgress, NodeInfo, SandboxState, SandboxStats, TarBody, TopProcess } from "./client.js";
export { Logs } from "./logs.js";
export type { CapturedLog, LogReadOptions, LogRecord } from "./logs.js";
export { Ports, PortConnection } from "./ports.js";
export { ProcessHandle, TerminalHandle, LIMITS } from "./process.js";
export type {
  ByteChunk, Chunk, Exit, ProcessReference, ProcessStatus, SignalOptions, StreamCount, StreamName, TerminateResult, TextChunk,
  WaitResult,
} from "./process.js";
export { SandkilnError, isSandkilnError } from "./errors.js";
export type { ErrorCode } from "./errors.js";
export { readProcessLines, createProcessTail } from "./lines.js";
export type { LineOptions, ProcessLine, ProcessTail, TailOptions, TailSnapshot } from "./lines.js";
export type { components as wire } from "./wire.js";
