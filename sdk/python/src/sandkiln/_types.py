"""What the SDK gives back and takes: chunks, exits, statuses, references,
options, and kilnd's JSON as typed dictionaries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Required, TypedDict, Union

from ._errors import SandkilnError

StreamName = Literal["stdout", "stderr", "terminal"]


@dataclass(frozen=True, slots=True)
class Limits:
    """The contract's bounds."""

    max_chunk_bytes: int = 16 << 10
    """One delivered chunk."""
    max_queued_bytes: int = 64 << 10
    """The unread output queue, in bytes..."""
    max_queued_chunks: int = 256
    """...and in chunks."""
    max_write_bytes: int = 64 << 10
    """One write."""
    max_input_bytes: int = 256 << 10
    """The input queue, the write in progress included, in bytes..."""
    max_input_calls: int = 256
    """...and in calls."""
    max_finite_output: int = 1 << 20
    """Finite mode's output."""
    reference_lifetime: float = 24 * 60 * 60
    """A reference's life, in seconds."""


LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class TextChunk:
    """Output as text: each stream decoded by its own streaming UTF-8 decoder."""

    stream: StreamName
    text: str
    offset: int
    """Where the chunk's bytes begin in the stream."""
    seq: int
    """Bytes the process had written on all its streams before this chunk."""
    lost: int = 0
    """Non-zero (overflow "report" only): a gap, not output. That many bytes
    of the stream, before offset, were lost to this handle."""


@dataclass(frozen=True, slots=True)
class ByteChunk:
    """Output as the exact bytes."""

    stream: StreamName
    bytes: bytes
    offset: int
    seq: int
    lost: int = 0


Chunk = Union[TextChunk, ByteChunk]


@dataclass(frozen=True, slots=True)
class Exit:
    """How a process ended."""

    exit_code: int
    """The process's own code, or 128 plus the signal's number when a signal
    ended it (137 for SIGKILL), as the shell and Docker have it."""
    signal: str | None = None
    """The signal that ended it ("SIGKILL"), or None."""
    oom_killed: bool = False
    """The kernel's out-of-memory killer ended it."""
    output_cut: str | None = None
    """Why the output did not end by itself, or None: "drain_timeout" when
    something the process left behind held its output open past the drain
    time after its exit, and the output was cut there. Known once this
    handle read the output to its end."""


@dataclass(frozen=True, slots=True)
class StreamCount:
    """What a handle's output accounted for of one stream."""

    bytes: int
    """Bytes up to where the output stands: delivered or lost."""
    lost_bytes: int
    ended: bool


@dataclass(frozen=True, slots=True)
class WaitResult:
    """A confirmed exit, and how complete this handle's output is."""

    exit_code: int
    signal: str | None
    oom_killed: bool
    output_cut: str | None
    output_complete: bool
    """True only when the output reached every stream's end with no gap and
    was not cut. A wait that returns before the output drained says False; a
    later one can say True."""
    streams: dict[str, StreamCount] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProcessStatus:
    state: Literal["running", "exited", "unknown"]
    observed_at: datetime
    exit: Exit | None = None
    error: SandkilnError | None = None
    """Why the state is unknown, when it is."""


@dataclass(frozen=True, slots=True)
class TerminateResult:
    status: Literal["requested", "not-found", "exited"]


@dataclass(frozen=True, slots=True)
class ExecOutput:
    """What exec gives back: the exit, and the output kept."""

    exit_code: int | None
    """See Exit; None only in the output a failed exec's error carries, when
    no exit was confirmed."""
    signal: str | None
    oom_killed: bool
    output_cut: str | None
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    truncated: bool
    """Output beyond max_output_bytes was not kept, or was lost before it was read."""
    timed_out: bool


class ArgvCommand(TypedDict):
    kind: Literal["argv"]
    argv: Sequence[str]


class ShellCommand(TypedDict):
    kind: Literal["shell"]
    script: str


Command = Union[Sequence[str], ArgvCommand, ShellCommand]
"""A command: an argv run directly (["python3", "-u", "w.py"], or the
TypeScript SDK's {"kind": "argv", "argv": [...]}), or a shell script run by
/bin/sh -c ({"kind": "shell", "script": "..."})."""


class TextOutput(TypedDict, total=False):
    """How a process's output is given: as text (the default)."""

    mode: Literal["stream", "finite"]
    """"stream" for long-running work; "finite" (the default) keeps at most max_output_bytes."""
    format: Literal["text"]
    max_output_bytes: int
    """Finite mode's bound, 1 to 1 MiB (the default); not with mode "stream"."""
    overflow: Literal["fail", "report"]
    """Bytes lost to this handle fail the output with OUTPUT_CAPACITY ("fail",
    the default), or a chunk with lost says how many and the output goes on
    ("report")."""
    flow: Literal["block", "drop"]
    """"block" (the default): the process waits for this handle's reader when
    it falls behind, until the handle stops reading. "drop": it never waits,
    and what the reader falls behind on may be lost (see overflow)."""


class ByteOutput(TypedDict, total=False):
    """How a process's output is given: as bytes."""

    mode: Literal["stream", "finite"]
    format: Required[Literal["bytes"]]
    max_output_bytes: int
    overflow: Literal["fail", "report"]
    flow: Literal["block", "drop"]


class StdinReference(TypedDict):
    pipe: bool
    offset: int
    closed: bool


class ProcessReference(TypedDict):
    """What reopen needs to return to a process: the same JSON as the
    TypeScript SDK's reference, so either SDK reopens what the other saved.
    Keep it private: it names the process and where the output stood."""

    kind: Literal["process", "terminal"]
    version: Literal[1]
    sandbox: str
    process: str
    offsets: dict[str, int]
    """Where the output stands, per stream: a reopened handle resumes there."""
    lost: dict[str, int]
    """Bytes reported lost to this handle, per stream."""
    ended: dict[str, bool]
    stdin: StdinReference
    format: Literal["text", "bytes"]
    mode: Literal["stream", "finite"]
    maxOutputBytes: int
    overflow: Literal["fail", "report"]
    hold: bool
    expiresAt: str


class SandboxReference(TypedDict):
    """What client.sandboxes.get() takes to find a sandbox again; plain JSON."""

    kind: Literal["sandbox"]
    id: str


# kilnd's JSON (api/openapi.yaml), as typed dictionaries: what it answers,
# given as it came.


class SandboxLimits(TypedDict, total=False):
    memory_bytes: int
    pids: int
    cpus: float
    disk_bytes: int


class Mount(TypedDict, total=False):
    """A host directory bound into a sandbox (``sandboxes.create(mounts=…)``)."""

    source: Required[str]
    target: Required[str]
    read_only: bool


SandboxState = Literal["running", "paused", "stopped", "deleted", "unknown", "node_lost"]
"""A sandbox's state. paused: running, its processes paused. In a cluster
(kilnd --cluster), unknown: its node has missed its heartbeats, nobody can
say; node_lost: its node has been gone longer than kilnd --node-lost-after
(it did not exit: its output up to what reached the cluster stays
readable)."""


class SandboxInfo(TypedDict, total=False):
    """A sandbox as kilnd describes it."""

    id: Required[str]
    name: str
    state: SandboxState
    created_at: str
    stopped_at: str
    paused_at: str
    hostname: str
    rootfs: str
    runtime: str
    limits: SandboxLimits
    on_oom: str
    reason: str
    agent_pid: int
    exit: dict[str, Any]
    idle_timeout_seconds: int
    ttl_seconds: int
    network: dict[str, Any]
    image: str
    image_id: str
    labels: dict[str, str]
    mounts: list[Mount]
    node: str
    """In a cluster, the node it runs on."""


NodeState = Literal["ready", "draining", "unreachable", "lost"]
"""A node's state: ready takes new sandboxes; draining (nodes.drain) serves
its own and takes no new ones; unreachable has missed its heartbeats for a
few seconds; lost, longer than kilnd --node-lost-after."""


class MovedSandbox(TypedDict, total=False):
    """A stopped sandbox a drain moved, or failed to."""

    sandbox: str
    """Its id on the drained node."""
    name: str
    node: str
    """The node it went to."""
    id: str
    """Its id there."""
    error: str
    """Why it did not move."""
    snapshot: str
    """When it did not move: the snapshot holding its files."""


class NodeInfo(TypedDict, total=False):
    """A node of kilnd's cluster (kilnd --cluster), as its last heartbeat
    told."""

    name: Required[str]
    state: Required[NodeState]
    api_url: str
    """Where the other nodes reach its API (kilnd --advertise)."""
    labels: dict[str, str]
    """Its kilnd --node-label pairs, which a create's constraints match."""
    version: str
    incarnation: str
    """New at each start of its kilnd."""
    started_at: str
    seen_at: str
    """When its last heartbeat reached the cluster."""
    cpus: int
    memory_bytes: int
    free_memory_bytes: int
    """The host's available memory, at its last heartbeat."""
    sandboxes: int
    """Its sandboxes running, at its last heartbeat."""
    self: bool
    """Set on the node that answered."""
    moved: list[MovedSandbox]
    """In the answer of a drain with move_stopped: each stopped sandbox,
    where it went, or why not."""


class ClusterStatus(TypedDict):
    """A clustered kilnd's word on its cluster."""

    node: str
    """This kilnd's name in it."""
    state: Literal["connected", "down"]


class Health(TypedDict, total=False):
    """What client.health() reads and client.ready() gives."""

    status: Required[str]
    """"ok", or from ready() why kilnd is not ready ("cluster down")."""
    cluster: ClusterStatus
    """On a kilnd in a cluster."""


class ProcessInfo(TypedDict, total=False):
    """A process as kilnd describes it, without its output."""

    id: Required[str]
    command: str
    args: list[str]
    state: str
    exit_code: int
    signal: str
    oom_killed: bool
    output_cut: str
    pid: int
    terminal: bool
    flow: str
    held: bool
    streams: dict[str, dict[str, Any]]
    stdin: dict[str, Any]
    started_at: str
    exited_at: str


class FileInfo(TypedDict, total=False):
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: str
    mtime: str
    link: str


class Event(TypedDict, total=False):
    """Something that happened to a sandbox, as kilnd numbers them (seq,
    from 1 under its epoch; in a cluster, the cluster's stream numbers
    them, and node names where it happened); a "gap" counts in lost the
    events kilnd no longer held."""

    seq: Required[int]
    time: Required[str]
    type: Required[str]
    epoch: Required[str]
    node: str
    sandbox: str
    name: str
    reason: str
    exit: dict[str, Any]
    lost: int


class Version(TypedDict, total=False):
    """The build of the kilnd answering."""

    version: str
    revision: str
    modified: bool
    go_version: str
    platform: str


class Preview(TypedDict, total=False):
    id: str
    port: int
    url: str
    """Given once, when it is made."""
    token: str
    expires_at: str


class SnapshotInfo(TypedDict, total=False):
    """A sandbox's files as they were at one moment (AsyncSandbox.snapshot)."""

    id: str
    name: str
    sandbox: str
    sandbox_name: str
    created_at: str
    runtime: str
    image: str
    disk_bytes: int
    size_bytes: int
    copy: str
    processes: list[dict[str, Any]]
    memory: bool
    node: str
    """In a cluster: the node that keeps its files."""
    node_state: str
    """In a cluster: that node's state (ready, draining, unreachable, lost)."""


class ImageInfo(TypedDict, total=False):
    id: str
    names: list[str]
    digest: str
    layers: list[str]
    size: int
    created: str
    added: str
    platform: str
    config: dict[str, Any]


class ImageProgress(TypedDict, total=False):
    """A line of an image pull's or import's progress."""

    status: str
    layer: str
    bytes: int
    total: int
    images: list[ImageInfo]
    error: dict[str, str]


class TopProcess(TypedDict):
    """A process running in a sandbox, as Sandbox.top lists them."""

    pid: int
    ppid: int
    uid: int
    state: str
    cpu_seconds: float
    rss_bytes: int
    command: str


class SandboxStats(TypedDict, total=False):
    """A running sandbox's CPU, memory and pids figures."""

    cpu_seconds: float
    memory_bytes: int
    memory_peak_bytes: int
    memory_limit_bytes: int
    pids: int
    pids_limit: int
    oom_kills: int
    processes: int
    counts: dict[str, int]
    read_at: str


class CapturedLog(TypedDict, total=False):
    """A captured process's log: its runs, each classified, and what reading
    it could not return."""

    process: str
    runs: list[dict[str, Any]]
    stats: dict[str, int]
    complete: bool


class LogRecord(TypedDict, total=False):
    """One record of a captured log (format json): a write's content and
    time, or a gap."""

    time: str
    stream: str
    offset: int
    partial: bool
    text: str
    base64: str
    lost_bytes: int
    gap: int


# Linux's signal numbers, for an exit an older kilnd described by its
# signal's name alone.
_SIGNALS = {
    "HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8, "KILL": 9, "USR1": 10,
    "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15, "STKFLT": 16, "CHLD": 17, "CONT": 18, "STOP": 19,
    "TSTP": 20, "TTIN": 21, "TTOU": 22, "URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28,
    "IO": 29, "PWR": 30, "SYS": 31,
}


def exit_of(e: Mapping[str, Any]) -> Exit:
    """kilnd's exit: it names signals as kill -l does ("KILL"), the SDK as
    the seed does ("SIGKILL")."""
    sig = e.get("signal") or None
    name = sig[3:] if sig and sig.startswith("SIG") else sig
    code = e.get("exit_code")
    if code is None:
        code = 128 + _SIGNALS[name] if name in _SIGNALS else -1
    return Exit(exit_code=int(code), signal=f"SIG{name}" if name else None,
                oom_killed=bool(e.get("oom_killed")), output_cut=e.get("output_cut") or None)
