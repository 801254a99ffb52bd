"""The asyncio client, its sandboxes, and what a sandbox offers: processes,
terminals and exec here; files, logs, ports, previews and images in their
own modules. The synchronous client (_sync) runs this same code on an
event loop of its own."""

from __future__ import annotations

import asyncio
import builtins
import inspect
import json as jsonlib
import os
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from datetime import datetime
from typing import Any, Generic, Literal, Protocol, TypeVar, cast, overload
from urllib.parse import urlsplit

from ._errors import SandkilnError, error, from_answer
from ._files import AsyncFiles
from ._http import Transport, _json_or_none, check_timeout, segment
from ._images import AsyncImages
from ._logs import AsyncLogs
from ._nodes import AsyncNodes
from ._ports import AsyncPorts, AsyncPreviews
from ._streams import AsyncByteStream, Source, body_of, left, ndjson
from ._process import AsyncHandle, AsyncProcessHandle, AsyncTerminalHandle, Settings, check_size
from ._types import (
    Event,
    LIMITS,
    ByteChunk,
    ByteOutput,
    Command,
    ExecOutput,
    Exit,
    Health,
    ProcessInfo,
    ProcessReference,
    SandboxInfo,
    SandboxReference,
    SandboxStats,
    SnapshotInfo,
    TopProcess,
    TextChunk,
    TextOutput,
    Version,
    exit_of,
)
from ._utf8 import StreamDecoder

T = TypeVar("T")

# The longest deadline an exec takes: kilnd's bound on timeout_ms.
MAX_DEADLINE_SECONDS = 7 * 24 * 60 * 60

# A stop's timeout when it does not say (kilnd's), and the longest kilnd
# takes.
DEFAULT_STOP_TIMEOUT = 10
MAX_STOP_TIMEOUT = 600


def _stop_timeout(seconds: int | None, what: str) -> int | None:
    """A stop's timeout_seconds, checked before anything is sent."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= MAX_STOP_TIMEOUT:
        raise error("INVALID_ARGUMENT", f"{what}: timeout_seconds {seconds!r}: want whole seconds from 0 to {MAX_STOP_TIMEOUT}")
    return seconds


OutputCallback = Callable[[TextChunk], "Awaitable[object] | object"]


class _Closeable(Protocol):
    async def __aexit__(self, *exc: object) -> None: ...


H = TypeVar("H", bound=_Closeable)


class Opening(Generic[H]):
    """What start() and create() return: await it for the handle, or use it
    as ``async with`` to have the handle closed (detached, destroyed) at the
    block's end."""

    def __init__(self, coro: Coroutine[Any, Any, H]) -> None:
        self._coro = coro
        self._value: H | None = None

    def __await__(self) -> Generator[Any, None, H]:
        return self._coro.__await__()

    async def __aenter__(self) -> H:
        self._value = await self._coro
        return self._value

    async def __aexit__(self, *exc: object) -> None:
        if self._value is not None:
            await self._value.__aexit__(*exc)


def client_url(url: str | None) -> str:
    """kilnd's URL: url, or $KILN_ADDR, as a host:port, tcp://, http(s)://
    or unix:// address."""
    u = url or os.environ.get("KILN_ADDR") or ""
    if not u:
        raise error("INVALID_ARGUMENT", "Client: a url is needed (or KILN_ADDR)")
    if u.startswith("tcp://"):
        u = "http://" + u[len("tcp://"):]
    if not re.match(r"^(https?|unix)://", u):
        u = "http://" + u
    try:
        parts = urlsplit(u)
        ok = bool(parts.path) if parts.scheme == "unix" else bool(parts.hostname)
        parts.port  # noqa: B018 (a bad port raises)
    except ValueError:
        ok = False
    if not ok:
        raise error("INVALID_ARGUMENT", f"Client: url {u!r} is not a URL")
    return u


class AsyncClient:
    """Talks to one kilnd, on the running event loop. url defaults to
    $KILN_ADDR ("127.0.0.1:7777", "http://…", "unix:///…/kilnd.sock"), token
    to $KILN_TOKEN (kilnd's token file; none is needed on its unix socket).
    ``async with AsyncClient() as client`` closes it at the block's end."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        self._transport = Transport(client_url(url), token if token is not None else os.environ.get("KILN_TOKEN") or None)
        self.sandboxes = AsyncSandboxes(self._transport)
        self.images = AsyncImages(self._transport)
        self.snapshots = AsyncSnapshots(self._transport)
        self.nodes = AsyncNodes(self._transport)
        """The nodes of kilnd's cluster (kilnd --cluster)."""

    @property
    def url(self) -> str:
        return self._transport.base

    async def health(self, *, timeout: float | None = None) -> bool:
        """Says kilnd answers."""
        await self._transport.call("GET", "/healthz", idempotent=True, timeout=timeout)
        return True

    async def ready(self, *, timeout: float | None = None) -> Health:
        """Whether kilnd serves all it should (GET /readyz): status "ok"
        when it does, else why not ("cluster down": a kilnd in a cluster
        that cannot reach it serves its own sandboxes, not the other
        nodes'), and cluster its node's name and the cluster's state. Not
        being ready is an answer, not an error: kilnd's 503 gives the
        health it carries. It raises when kilnd does not answer, or answers
        something else."""
        what = "GET /readyz"
        resp = await self._transport.fetch("GET", "/readyz", idempotent=True, timeout=timeout, read=True,
                                           is_error=lambda r: r.status >= 300 and r.status != 503)
        body = _json_or_none(resp.body or b"")
        status = body.get("status") if isinstance(body, dict) else None
        if isinstance(status, str) and status:
            return cast(Health, body)
        if resp.status == 503:
            raise from_answer(resp.status, body, what)
        raise error("INTERNAL", f"kilnd: {what}: the answer is not a health report", status=resp.status)

    async def events(self, *, after: int = 0, sandbox: str | None = None, type: str | None = None,
                     node: str | None = None, follow: bool = True) -> AsyncGenerator[Event, None]:
        """What happens to kilnd's sandboxes, in order, each once: the events
        kilnd holds after ``after`` (the seq of the last one read), then
        each as it happens (with follow=False, to the end of those held);
        ``sandbox``, ``type`` and, in a cluster, ``node`` choose among them.
        A connection that breaks is opened again from the last event given,
        so nothing is missed or given twice; events kilnd no longer holds
        come as one of type "gap" whose lost counts them."""
        epoch: str | None = None
        while True:
            try:
                resp = await self._transport.fetch("GET", "/events", query={
                    "after": after, "epoch": epoch, "sandbox": sandbox, "type": type, "node": node, "follow": None if follow else False,
                }, idempotent=True, unbounded=True)
                async for e in ndjson(AsyncByteStream(resp, "events", None), "events"):
                    ev = cast(Event, e)
                    after, epoch = ev["seq"], ev["epoch"]
                    yield ev
                if not follow:
                    return
            except SandkilnError as err:
                if err.code != "UNAVAILABLE":
                    raise
            await asyncio.sleep(0.5)

    async def version(self, *, timeout: float | None = None) -> Version:
        """The build of the kilnd answering: its version, commit and Go
        version."""
        return cast(Version, await self._transport.call("GET", "/version", idempotent=True, timeout=timeout))

    async def close(self) -> None:
        """Lets go of every handle made through this client: their
        connections close, their calls still waiting fail with DETACHED,
        and their processes no longer wait for them. kilnd, its sandboxes
        and their processes are left as they are."""
        for s in list(self.sandboxes._known):
            s._let_go_handles(True)
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSandboxes:
    def __init__(self, transport: Transport) -> None:
        self._t = transport
        # Sandboxes of this client that have handles or connections open.
        self._known: set[AsyncSandbox] = set()

    def create(
        self,
        *,
        name: str | None = None,
        hostname: str | None = None,
        image: str | None = None,
        rootfs: str | None = None,
        runtime: str | None = None,
        limits: Mapping[str, int | float] | None = None,
        network: Mapping[str, Any] | None = None,
        init: Mapping[str, Any] | None = None,
        idle_timeout_seconds: int | None = None,
        ttl_seconds: int | None = None,
        logs: Mapping[str, int] | None = None,
        on_oom: str | None = None,
        labels: Mapping[str, str] | None = None,
        mounts: Sequence[Mapping[str, Any]] | None = None,
        snapshot: str | None = None,
        node: str | None = None,
        constraints: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> Opening[AsyncSandbox]:
        """Creates a sandbox and gives it once it is ready (kilnd checks
        the options: api/openapi.yaml's CreateSandbox). If the answer is
        lost the error is OUTCOME_UNKNOWN: list the sandboxes before
        creating another. ``async with client.sandboxes.create() as
        sandbox`` destroys it at the block's end. ``mounts`` binds host
        directories in, as docker run -v does: ``[{"source": "/srv/data",
        "target": "/data", "read_only": True}]``, each below a directory
        kilnd allows (kilnd --allow-mount). ``snapshot`` makes it from a
        snapshot's files (AsyncSandbox.snapshot). In a cluster (kilnd
        --cluster), ``node`` places it on the node of that name, and
        ``constraints`` (``["zone=a"]``, KEY=VALUE) on a node with those
        labels (kilnd --node-label); without either, on the least loaded
        node. A kilnd in no cluster refuses both."""
        body = {k: v for k, v in {
            "name": name, "hostname": hostname, "image": image, "rootfs": rootfs, "runtime": runtime,
            "limits": dict(limits) if limits is not None else None, "network": network, "init": init,
            "idle_timeout_seconds": idle_timeout_seconds, "ttl_seconds": ttl_seconds, "logs": logs, "on_oom": on_oom,
            "labels": dict(labels) if labels is not None else None,
            "mounts": [dict(m) for m in mounts] if mounts is not None else None, "snapshot": snapshot,
            "node": node, "constraints": list(constraints) if constraints is not None else None,
        }.items() if v is not None}
        return Opening(self._create(body, timeout))

    async def _create(self, body: dict[str, Any], timeout: float | None) -> AsyncSandbox:
        check_timeout(timeout, "sandboxes.create()")
        info = await self._t.call("POST", "/sandboxes", json=body, timeout=timeout)
        return AsyncSandbox(self._t, info, self)

    async def get(self, sandbox: str | SandboxReference | Mapping[str, Any], *, timeout: float | None = None) -> AsyncSandbox:
        """The sandbox of an id, a name, a prefix of an id no other
        sandbox's has, or a saved reference; NOT_FOUND if kilnd has none.
        The handle holds the full id."""
        sid = sandbox if isinstance(sandbox, str) else sandbox.get("id") if isinstance(sandbox, Mapping) else None
        if not isinstance(sid, str) or not sid:
            raise error("INVALID_ARGUMENT", "sandboxes.get(): an id or a reference is needed")
        info = await self._t.call("GET", f"/sandboxes/{segment(sid)}", idempotent=True, timeout=timeout)
        return AsyncSandbox(self._t, info, self)

    async def list(self, *, label: str | Sequence[str] | Mapping[str, str] | None = None, name: str | None = None,
                   state: str | None = None, image: str | None = None, runtime: str | None = None,
                   node: str | None = None, all: bool = False,
                   timeout: float | None = None) -> builtins.list[SandboxInfo]:
        """The sandboxes kilnd has, oldest first; deleted ones only with
        all=True (or state="deleted"). Each filter given narrows the list:
        label is "KEY" (has it), "KEY=VALUE", several of those, or a
        mapping of KEY to VALUE, each of which must match; node, in a
        cluster, the node they run on."""
        labels: list[str] | None = None
        if isinstance(label, str):
            labels = [label]
        elif isinstance(label, Mapping):
            labels = [f"{k}={v}" for k, v in label.items()]
        elif label is not None:
            labels = list(label)
        query = {"label": labels, "name": name, "state": state, "image": image, "runtime": runtime, "node": node,
                 "all": True if all else None}
        return cast("builtins.list[SandboxInfo]", await self._t.call("GET", "/sandboxes", query=query, idempotent=True, timeout=timeout) or [])

    async def delete(self, sandbox: str | SandboxReference | Mapping[str, Any] | AsyncSandbox, *, remove_logs: bool = False,
                     timeout: float | None = None) -> None:
        """Deletes a sandbox, named as get() names one, or by its handle:
        sandbox.destroy() by another name, except that a sandbox kilnd does
        not have is NOT_FOUND here (the caller named something that is not
        there), where destroy() takes it as done."""
        if isinstance(sandbox, AsyncSandbox):
            await sandbox.destroy(remove_logs=remove_logs, timeout=timeout)
            return
        check_timeout(timeout, "sandboxes.delete()")
        loop = asyncio.get_running_loop()
        start = loop.time()
        # A name or a prefix is made the full id first: the handles let go
        # are those of that sandbox, and no other.
        s = await self.get(sandbox, timeout=timeout)
        await s.destroy(remove_logs=remove_logs, timeout=None if timeout is None else max(timeout - (loop.time() - start), 1e-6))

    def _let_go(self, sid: str) -> None:
        """Lets go of the handles on sandbox sid, whichever AsyncSandbox of
        this client made them."""
        for s in list(self._known):
            if s.id == sid:
                s._let_go_handles(False)


class AsyncSandbox:
    """A handle on a sandbox. ``async with sandbox`` destroys it at the
    block's end."""

    def __init__(self, transport: Transport, info: SandboxInfo, registry: AsyncSandboxes) -> None:
        self._t = transport
        self.info = info
        """kilnd's description when the handle was made (see refresh())."""
        self.id: str = info["id"]
        self.name: str | None = info.get("name")
        self._registry = registry
        self._handles: set[AsyncHandle[Any]] = set()
        self.processes = AsyncProcesses(self)
        self.terminals = AsyncTerminals(self)
        self.files = AsyncFiles(self._t, self._path)
        self.previews = AsyncPreviews(self._t, self._path)
        self.logs = AsyncLogs(self._t, self._path)
        """The captured logs of its processes started with capture."""
        self.ports = AsyncPorts(self._t, self._path, self._watch)
        """Its ports: HTTP through kilnd's proxy, and TCP connections."""

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id}>"

    @property
    def transport(self) -> Transport:
        return self._t

    @property
    def reference(self) -> SandboxReference:
        """What client.sandboxes.get() takes to find this sandbox again; plain JSON."""
        return {"kind": "sandbox", "id": self.id}

    def _path(self, rest: str) -> str:
        return f"/sandboxes/{segment(self.id)}{rest}"

    def _adopt(self, h: AsyncHandle[Any]) -> None:
        self._handles.add(h)
        self._registry._known.add(self)

    def release(self, h: AsyncHandle[Any]) -> None:
        self._handles.discard(h)
        if not self._handles and not self.ports._open:
            self._registry._known.discard(self)

    def _watch(self, open_: bool) -> None:
        if open_:
            self._registry._known.add(self)
        elif not self._handles and not self.ports._open:
            self._registry._known.discard(self)

    def _let_go_handles(self, release: bool) -> None:
        """Lets go of the handles; with release, of the output held for them
        too (their processes go on)."""
        for h in list(self._handles):
            h._let_go(release)
        self.ports._close_all()

    async def refresh(self, *, timeout: float | None = None) -> SandboxInfo:
        """Asks kilnd for the sandbox's description again."""
        self.info = await self._t.call("GET", self._path(""), idempotent=True, timeout=timeout)
        return self.info

    async def stats(self, *, timeout: float | None = None) -> SandboxStats:
        """Its CPU, memory and pids figures, read from its cgroups now; a
        sandbox that does not run is FAILED_PRECONDITION."""
        return cast(SandboxStats, await self._t.call("GET", self._path("/stats"), idempotent=True, timeout=timeout))

    async def top(self, *, timeout: float | None = None) -> list[TopProcess]:
        """Every process running in the sandbox now, as docker top lists a
        container's, by pid as the sandbox sees it."""
        return cast(list[TopProcess], await self._t.call("GET", self._path("/top"), idempotent=True, timeout=timeout))

    async def stop(self, *, timeout_seconds: int | None = None, timeout: float | None = None) -> SandboxInfo:
        """Stops the sandbox, as docker stop does: each process's group gets
        SIGTERM, and what has not exited after timeout_seconds (0 to 600,
        default 10; 0 kills at once) is killed. Its files, record and
        captured logs stay, and start() runs it again. Returns its
        description, stopped (kept in info); one stopped already is left as
        it is (kilnd answers 304 Not Modified) and described as it is.
        timeout bounds the call, as everywhere; without it the call waits
        for kilnd as long as timeout_seconds asks."""
        return await self._change("stop", _stop_timeout(timeout_seconds, "stop()"), True, timeout)

    async def start(self, *, timeout: float | None = None) -> SandboxInfo:
        """Starts a stopped sandbox again, as docker start does: a new
        instance of it runs its init command again on its files as they
        were, with its id, name, labels, limits and network policy. Returns
        its description, running (kept in info); one that runs already is
        left as it is (kilnd answers 304 Not Modified). A sandbox past its
        ttl, which counts from its creation, is FAILED_PRECONDITION."""
        return await self._change("start", None, True, timeout)

    async def restart(self, *, timeout_seconds: int | None = None, timeout: float | None = None) -> SandboxInfo:
        """Stops the sandbox if it runs (stop(), with timeout_seconds) and
        starts it again, as docker restart does. Returns its description,
        running. A lost answer is OUTCOME_UNKNOWN: it may have restarted."""
        return await self._change("restart", _stop_timeout(timeout_seconds, "restart()"), False, timeout)

    async def snapshot(self, *, name: str | None = None, memory: bool = False, timeout: float | None = None) -> SnapshotInfo:
        """Takes a snapshot of the sandbox's files, running or stopped: its
        disk (/workspace and, with an image, the root's writes) copied while
        its file system is frozen. It records the processes and their
        offsets, and outlives the sandbox. A sandbox without a disk of its
        own is FAILED_PRECONDITION; past kilnd's snapshot quota,
        PERMISSION_DENIED. With memory, a running gVisor sandbox's
        processes are saved too (FAILED_PRECONDITION elsewhere)."""
        body: dict[str, Any] = {} if name is None else {"name": name}
        if memory:
            body["memory"] = True
        return cast(SnapshotInfo, await self._t.call("POST", self._path("/snapshots"), json=body, timeout=timeout))

    async def snapshots(self, *, timeout: float | None = None) -> list[SnapshotInfo]:
        """The sandbox's snapshots, oldest first."""
        return cast("list[SnapshotInfo]", await self._t.call("GET", self._path("/snapshots"), idempotent=True, timeout=timeout) or [])

    async def rollback(self, snapshot: str, *, timeout_seconds: int | None = None, timeout: float | None = None) -> SandboxInfo:
        """Gives the sandbox the files of one of its snapshots (an id, a
        unique prefix or a name): a running sandbox is stopped (as stop(),
        with timeout_seconds), gets a copy of them and runs again; a stopped
        one stays stopped. The snapshot's processes are its history
        (forked_from). Returns its description (kept in info)."""
        if not isinstance(snapshot, str) or not snapshot:
            raise error("INVALID_ARGUMENT", "rollback(): a snapshot is needed")
        grace = _stop_timeout(timeout_seconds, "rollback()")
        resp = await self._t.fetch(
            "POST", self._path("/rollback"), query={"timeout": grace}, json={"snapshot": snapshot}, idempotent=False,
            timeout=timeout, later=DEFAULT_STOP_TIMEOUT if grace is None else grace, read=True)
        try:
            self.info = cast(SandboxInfo, jsonlib.loads(resp.body))
        except ValueError as err:
            raise error("OUTCOME_UNKNOWN", f"POST {self._path('/rollback')}: the answer is not JSON") from err
        return self.info

    async def fork(self, *, count: int | None = None, labels: Mapping[str, str] | None = None,
                   files_only: bool = False, timeout: float | None = None) -> list[AsyncSandbox]:
        """Makes count sandboxes (default 1, at most 64) with the sandbox's
        files as they are now, and its image, limits, runtime, network
        policy, init command and labels (labels added). All are made, or
        none."""
        body: dict[str, Any] = {}
        if count is not None:
            body["count"] = count
        if labels is not None:
            body["labels"] = dict(labels)
        if files_only:
            body["files_only"] = True
        out = await self._t.call("POST", self._path("/fork"), json=body, timeout=timeout)
        return [AsyncSandbox(self._t, info, self._registry) for info in out["sandboxes"]]

    async def pause(self, *, timeout: float | None = None) -> SandboxInfo:
        """Pauses the sandbox, as docker pause does: its every process stops
        where it is, its memory kept, and uses no CPU until resume().
        Meanwhile what needs it to run (exec, a process started, stdin, its
        files and ports) is PAUSED (PausedError); its processes' output
        stays readable and their watchers attached, reading on at the same
        offsets after the resume. Returns its description, paused (state
        "paused"); one paused already is left as it is (kilnd answers 304
        Not Modified)."""
        return await self._change("pause", None, True, timeout)

    async def resume(self, *, timeout: float | None = None) -> SandboxInfo:
        """Resumes a paused sandbox, as docker unpause does: its processes
        run on from where they were. Returns its description, running; one
        that is not paused is left as it is (kilnd answers 304 Not
        Modified)."""
        return await self._change("resume", None, True, timeout)

    async def _change(self, verb: str, grace: int | None, idempotent: bool, timeout: float | None) -> SandboxInfo:
        """A stop, start, restart, pause or resume (verb): its answer, or
        after a 304 the sandbox as it is."""
        resp = await self._t.fetch(
            "POST", self._path("/" + verb), query={"timeout": grace}, idempotent=idempotent, timeout=timeout,
            later=DEFAULT_STOP_TIMEOUT if grace is None else grace, read=True,
            is_error=lambda r: r.status >= 300 and r.status != 304)
        if resp.status == 304:
            return await self.refresh(timeout=timeout)
        try:
            self.info = cast(SandboxInfo, jsonlib.loads(resp.body))
        except ValueError as err:
            raise error("OUTCOME_UNKNOWN" if not idempotent else "INTERNAL",
                        f"POST {self._path('/' + verb)}: the answer is not JSON") from err
        return self.info

    async def destroy(self, *, remove_logs: bool = False, timeout: float | None = None) -> None:
        """Deletes the sandbox: its processes are killed; its captured logs
        stay unless remove_logs. Handles on it made through this client
        refuse further requests (DETACHED). A sandbox already gone is not
        an error."""
        check_timeout(timeout, "destroy()")  # run out already: nothing let go, nothing deleted
        self._registry._let_go(self.id)
        try:
            await self._t.call("DELETE", self._path(""), query={"remove_logs": True if remove_logs else None},
                               idempotent=True, timeout=timeout)
        except SandkilnError as err:
            if err.code != "NOT_FOUND":
                raise

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()

    async def exec(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
        deadline_seconds: float | None = None,
        on_output: OutputCallback | None = None,
        timeout: float | None = None,
    ) -> ExecOutput:
        """Runs a command to its end and gives its output: at most
        max_output_bytes kept (default and ceiling 1 MiB), the totals saying
        how much there was, and truncated whether some was not kept.
        deadline_seconds kills the command after that long (kilnd does).
        With on_output, the output's text is given to it as it comes, each
        call awaited when it returns an awaitable, and the exact bytes are
        kept from the same run; the command is never run twice. Then there
        is no deadline: timeout bounds the observation, and does not stop
        the command."""
        argv = argv_of(command)
        if deadline_seconds is not None and on_output is not None:
            raise error("INVALID_ARGUMENT", "exec with on_output has no deadline: pass a timeout to bound the wait")
        if deadline_seconds is not None and (
                isinstance(deadline_seconds, bool) or not isinstance(deadline_seconds, (int, float))
                or not 0 < deadline_seconds <= MAX_DEADLINE_SECONDS):
            raise error("INVALID_ARGUMENT", f"deadline_seconds {deadline_seconds!r}: want more than 0, at most {MAX_DEADLINE_SECONDS}")
        if on_output is not None and not callable(on_output):
            raise error("INVALID_ARGUMENT", "exec(): on_output must be callable")
        if stdin is not None and not isinstance(stdin, (str, bytes, bytearray, memoryview)):
            raise error("INVALID_ARGUMENT", "exec(): stdin must be str or bytes")
        limit = max_output(max_output_bytes, "max_output_bytes")
        check_timeout(timeout, "exec()")
        if on_output is None and stdin is None:
            return await self._exec_finite(argv, cwd, env, user, limit, deadline_seconds, timeout)
        data = None if stdin is None else stdin.encode() if isinstance(stdin, str) else bytes(stdin)
        return await self._exec_live(argv, cwd, env, user, data, limit, on_output, timeout)

    async def _exec_finite(self, argv: list[str], cwd: str | None, env: Mapping[str, str] | None, user: str | None,
                           limit: int, deadline: float | None, timeout: float | None) -> ExecOutput:
        body: dict[str, Any] = {"command": argv[0], "args": argv[1:], "max_output_bytes": limit}
        if env is not None:
            body["env"] = dict(env)
        if cwd is not None:
            body["cwd"] = cwd
        if user is not None:
            body["user"] = user
        if deadline is not None:
            body["timeout_ms"] = round(deadline * 1000)
        r = await self._t.call("POST", self._path("/exec"), json=body, unbounded=True, timeout=timeout)
        x = exit_of(r)
        return ExecOutput(x.exit_code, x.signal, x.oom_killed, x.output_cut, r.get("stdout") or "", r.get("stderr") or "",
                          int(r.get("stdout_bytes") or 0), int(r.get("stderr_bytes") or 0), bool(r.get("truncated")),
                          bool(r.get("timed_out")))

    async def _exec_live(self, argv: list[str], cwd: str | None, env: Mapping[str, str] | None, user: str | None,
                         stdin: bytes | None, limit: int, on_output: OutputCallback | None, timeout: float | None) -> ExecOutput:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout

        def left() -> float | None:
            return None if deadline is None else max(deadline - loop.time(), 1e-6)

        child = await self.processes.start(argv, env=env, cwd=cwd, user=user, stdin="closed" if stdin is None else "pipe",
                                           output={"mode": "stream", "format": "bytes"}, timeout=left())
        kept: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        totals = {"stdout": 0, "stderr": 0}
        room = [limit]
        truncated = [False]
        decoders = {"stdout": StreamDecoder(), "stderr": StreamDecoder()}

        def result(x: Exit | None) -> ExecOutput:
            return ExecOutput(
                x.exit_code if x else None, x.signal if x else None, x.oom_killed if x else False, x.output_cut if x else None,
                b"".join(kept["stdout"]).decode("utf-8", "replace"), b"".join(kept["stderr"]).decode("utf-8", "replace"),
                totals["stdout"], totals["stderr"], truncated[0], False)

        async def give(c: TextChunk) -> None:
            if on_output is not None:
                r = on_output(c)
                if inspect.isawaitable(r):
                    await r

        async def feed() -> None:
            assert stdin is not None
            step = LIMITS.max_write_bytes
            for i in range(0, len(stdin), step):
                await child.write(stdin[i:i + step], timeout=left())
            await child.close_stdin(timeout=left())

        try:
            feeding = loop.create_task(feed()) if stdin is not None else None
            try:
                async for chunk in child.output(timeout=left()):
                    s = chunk.stream
                    totals[s] += len(chunk.bytes)
                    if len(chunk.bytes) > room[0]:
                        truncated[0] = True
                    if room[0] > 0:
                        piece = chunk.bytes[:room[0]]
                        kept[s].append(piece)
                        room[0] -= len(piece)
                    text = decoders[s].decode(chunk.bytes)
                    if text:
                        await give(TextChunk(s, text, chunk.offset, chunk.seq))
                last: tuple[Literal["stdout", "stderr"], ...] = ("stdout", "stderr")
                for name in last:
                    text = decoders[name].flush()
                    if text:
                        await give(TextChunk(name, text, totals[name], 0))
            except Exception as err:
                if feeding is not None:
                    feeding.cancel()
                x: Exit | None = None
                try:
                    x = (await child.status()).exit
                except SandkilnError:
                    pass  # the exit stays unconfirmed
                if isinstance(err, SandkilnError) and err.code != "INTERNAL":
                    raise error(err.code, err.message, status=err.status, kiln_code=err.kiln_code,
                                confirmed_exit=x, output=result(x)) from err
                raise error("INTERNAL", f"exec: the output callback failed: {err!r}", confirmed_exit=x, output=result(x)) from err
            except BaseException:
                if feeding is not None:
                    feeding.cancel()
                raise
            if feeding is not None:
                await feeding
            w = await child.wait(timeout=left())
            return result(Exit(w.exit_code, w.signal, w.oom_killed, w.output_cut))
        finally:
            await child.detach()


def argv_of(c: Command) -> builtins.list[str]:
    """A command's argv: a list of strings, or the TypeScript SDK's
    {"kind": "argv", "argv": [...]} or {"kind": "shell", "script": ...}."""
    if isinstance(c, Mapping):
        kind = c.get("kind")
        if kind == "argv":
            argv = c.get("argv")
            if isinstance(argv, Sequence) and not isinstance(argv, (str, bytes)) and argv and all(isinstance(a, str) for a in argv):
                return list(argv)
        elif kind == "shell":
            script = cast(Mapping[str, object], c).get("script")
            if isinstance(script, str):
                return ["/bin/sh", "-c", script]
    elif isinstance(c, Sequence) and not isinstance(c, (str, bytes)) and c and all(isinstance(a, str) for a in c):
        return list(c)
    raise error("INVALID_ARGUMENT", 'command: want [program, *args], {"kind": "argv", "argv": [...]} or '
                '{"kind": "shell", "script": "..."} (a str alone is ambiguous)')


def max_output(v: object, what: str) -> int:
    """A finite output bound, 1 to 1 MiB (the default)."""
    n = LIMITS.max_finite_output if v is None else v
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= LIMITS.max_finite_output:
        raise error("INVALID_ARGUMENT", f"{what} {v!r}: want an integer from 1 to {LIMITS.max_finite_output}")
    return n


_OUTPUT_KEYS = ("mode", "format", "max_output_bytes", "overflow", "flow")


def settings_of(output: Mapping[str, Any] | None, stdin: str, drain_ms: int | None, terminal: bool, what: str) -> Settings:
    """The settings of start()'s options, every one checked before anything
    is sent: an option not known, or in the wrong place, is refused."""
    if output is None:
        output = {}
    if not isinstance(output, Mapping):
        raise error("INVALID_ARGUMENT", f"{what}: output must be a dict, not {type(output).__name__}")
    unknown = [k for k in output if k not in _OUTPUT_KEYS]
    if unknown:
        raise error("INVALID_ARGUMENT", f"{what}: unknown output option(s) {', '.join(map(repr, unknown))}; it takes {', '.join(_OUTPUT_KEYS)}")
    mode = output.get("mode", "finite")
    if mode not in ("stream", "finite"):
        raise error("INVALID_ARGUMENT", f'output mode {mode!r}: want "stream" or "finite"')
    fmt = "bytes" if terminal else output.get("format", "text")
    if fmt not in ("text", "bytes"):
        raise error("INVALID_ARGUMENT", f'output format {fmt!r}: want "text" or "bytes"')
    if mode == "stream" and "max_output_bytes" in output:
        raise error("INVALID_ARGUMENT", "output max_output_bytes belongs to finite mode, not stream mode")
    limit = max_output(output.get("max_output_bytes"), "output max_output_bytes")
    overflow = output.get("overflow", "fail")
    if overflow not in ("fail", "report"):
        raise error("INVALID_ARGUMENT", f'output overflow {overflow!r}: want "fail" or "report"')
    flow = output.get("flow", "block")
    if flow not in ("block", "drop"):
        raise error("INVALID_ARGUMENT", f'output flow {flow!r}: want "block" or "drop"')
    if stdin not in ("pipe", "closed"):
        raise error("INVALID_ARGUMENT", f'stdin {stdin!r}: want "pipe" or "closed"')
    if drain_ms is not None and (isinstance(drain_ms, bool) or not isinstance(drain_ms, int) or not 0 <= drain_ms <= 60_000):
        raise error("INVALID_ARGUMENT", f"drain_ms {drain_ms!r}: want an integer from 0 to 60000")
    return Settings(cast(Literal["text", "bytes"], fmt), mode, limit, overflow, flow == "block", terminal, terminal or stdin == "pipe")


async def _start_on(s: AsyncSandbox, command: Command, settings: Settings, cwd: str | None, env: Mapping[str, str] | None,
                    user: str | None, capture: bool, drain_ms: int | None, timeout: float | None,
                    tty: dict[str, int] | None = None) -> str:
    """Starts a process and gives its id, once kilnd has it; a lost answer
    is OUTCOME_UNKNOWN (the command is never started again)."""
    argv = argv_of(command)
    body: dict[str, Any] = {"command": argv[0], "args": argv[1:]}
    for k, v in (("env", dict(env) if env is not None else None), ("cwd", cwd), ("user", user), ("tty", tty)):
        if v is not None:
            body[k] = v
    if settings.stdin_pipe:
        body["stdin"] = "pipe"
    if capture:
        body["capture"] = True
    if settings.hold:
        body["flow"] = "block"
    if drain_ms:
        body["drain_ms"] = drain_ms
    st = await s.transport.call("POST", s._path("/exec-stream"), json=body, timeout=timeout)
    return str(st["id"])


def _settings_from(ref: ProcessReference) -> Settings:
    return Settings(ref["format"], ref["mode"], ref["maxOutputBytes"], ref["overflow"], ref["hold"],
                    ref["kind"] == "terminal", ref["stdin"]["pipe"])


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_reference(s: AsyncSandbox, ref: Any, kind: str) -> ProcessReference:
    """Refuses a reference that is not one of kind this SDK makes, of this
    sandbox, still valid: the settings it records become the handle's, so
    ones no handle has are refused, not guessed at."""
    def bad(why: str) -> SandkilnError:
        return error("INVALID_ARGUMENT", f"not a {kind} reference: {why}")

    if not isinstance(ref, Mapping):
        raise bad("not a dict")
    if ref.get("version") != 1:
        raise bad(f"version {ref.get('version')!r}")
    if ref.get("kind") != kind:
        raise bad(f"it is a {ref.get('kind')!r} reference")
    if not isinstance(ref.get("process"), str) or not ref["process"]:
        raise bad("no process")
    if ref.get("sandbox") != s.id:
        raise error("INVALID_ARGUMENT", f"the reference is of sandbox {ref.get('sandbox')}, not {s.id}")
    if ref.get("format") not in ("text", "bytes"):
        raise bad(f"format {ref.get('format')!r}")
    if kind == "terminal" and ref["format"] != "bytes":
        raise bad("a terminal's output is bytes")
    if ref.get("mode") not in ("stream", "finite"):
        raise bad(f"mode {ref.get('mode')!r}")
    if ref.get("overflow") not in ("fail", "report"):
        raise bad(f"overflow {ref.get('overflow')!r}")
    if not isinstance(ref.get("hold"), bool):
        raise bad("hold")
    m = ref.get("maxOutputBytes")
    if not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= LIMITS.max_finite_output:
        raise bad("maxOutputBytes")
    st = ref.get("stdin")
    if not isinstance(st, Mapping) or not isinstance(st.get("pipe"), bool) or not isinstance(st.get("closed"), bool) or not _is_count(st.get("offset")):
        raise bad("stdin")
    for field in ("offsets", "lost"):
        v = ref.get(field)
        if not isinstance(v, Mapping) or not all(isinstance(k, str) and _is_count(x) for k, x in v.items()):
            raise bad(field)
    if not isinstance(ref.get("ended"), Mapping):
        raise bad("ended")
    try:
        expires = datetime.fromisoformat(str(ref.get("expiresAt")).replace("Z", "+00:00")).timestamp()
    except ValueError as err:
        raise bad(f"expiresAt {ref.get('expiresAt')!r}") from err
    now = time.time()
    if not expires > now:
        raise error("FAILED_PRECONDITION", f"the reference expired at {ref['expiresAt']}")
    # A reference lives 24 hours at most: one that says longer was not made by reference().
    if expires > now + LIMITS.reference_lifetime + 60:
        raise bad(f"it says it expires at {ref['expiresAt']}, beyond 24 hours")
    return cast(ProcessReference, dict(ref))


def _check_against(ref: ProcessReference, p: Mapping[str, Any]) -> None:
    """Refuses a reference whose settings the process does not have, or
    whose offsets it never reached."""
    terminal = bool(p.get("terminal"))
    if terminal != (ref["kind"] == "terminal"):
        raise error("INVALID_ARGUMENT", f"process {ref['process']} is {'' if terminal else 'not '}a terminal; the reference says otherwise")
    stdin = p.get("stdin")
    if not terminal and ref["stdin"]["pipe"] != (stdin is not None):
        raise error("INVALID_ARGUMENT", f"process {ref['process']} {'has' if stdin else 'has no'} stdin pipe; the reference says otherwise")
    streams = p.get("streams") or {}
    for name, at in ref["offsets"].items():
        total = (streams.get(name) or {}).get("total_bytes")
        if total is None:
            raise error("INVALID_ARGUMENT", f"process {ref['process']} has no stream {name}")
        if at > total:
            raise error("OUT_OF_RANGE", f"the reference stands at {at} bytes of {name}; process {ref['process']} wrote {total}")
    if ref["stdin"]["pipe"] and stdin and ref["stdin"]["offset"] > stdin.get("accepted", 0):
        raise error("OUT_OF_RANGE", f"the reference wrote {ref['stdin']['offset']} bytes of input; kilnd accepted {stdin.get('accepted', 0)}")


class AsyncProcesses:
    def __init__(self, s: AsyncSandbox) -> None:
        self._s = s

    @overload
    def start(self, command: Command, *, output: ByteOutput, stdin: Literal["pipe", "closed"] = "closed",
              cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None, capture: bool = False,
              drain_ms: int | None = None, timeout: float | None = None,
              deadline_seconds: None = None) -> Opening[AsyncProcessHandle[ByteChunk]]: ...

    @overload
    def start(self, command: Command, *, output: TextOutput | None = None, stdin: Literal["pipe", "closed"] = "closed",
              cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None, capture: bool = False,
              drain_ms: int | None = None, timeout: float | None = None,
              deadline_seconds: None = None) -> Opening[AsyncProcessHandle[TextChunk]]: ...

    def start(self, command: Command, *, output: TextOutput | ByteOutput | None = None, stdin: Literal["pipe", "closed"] = "closed",
              cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None, capture: bool = False,
              drain_ms: int | None = None, timeout: float | None = None,
              deadline_seconds: None = None) -> Opening[AsyncProcessHandle[ByteChunk]] | Opening[AsyncProcessHandle[TextChunk]]:
        """Starts a process and gives its handle at once (await it, or
        ``async with`` it to detach at the block's end).

        stdin "pipe" for write() and close_stdin(); "closed" (the default)
        for none. output: {"mode": "stream"} for long-running work ("finite",
        the default, keeps at most max_output_bytes), "format" "text" (the
        default) or "bytes", "overflow" and "flow" (see TextOutput). capture
        keeps the output in the sandbox's captured logs; drain_ms bounds how
        long output is read after the exit while something the process left
        behind holds it open (default 3000, at most 60000). start() takes no
        runtime deadline: it cannot guarantee one (terminate() instead)."""
        return Opening(self._start(command, output, stdin, cwd, env, user, capture, drain_ms, timeout, deadline_seconds))

    async def _start(self, command: Command, output: Mapping[str, Any] | None, stdin: str, cwd: str | None,
                     env: Mapping[str, str] | None, user: str | None, capture: bool, drain_ms: int | None,
                     timeout: float | None, deadline_seconds: object) -> AsyncProcessHandle[Any]:
        settings = settings_of(output, stdin, drain_ms, False, "processes.start()")
        argv_of(command)
        if deadline_seconds is not None:
            raise error("INVALID_ARGUMENT", "processes.start() cannot guarantee a runtime deadline: it takes no deadline_seconds; terminate() instead")
        check_timeout(timeout, "processes.start()")
        pid = await _start_on(self._s, command, settings, cwd, env, user, capture, drain_ms, timeout)
        h: AsyncProcessHandle[Any] = AsyncProcessHandle(self._s, pid, settings)
        self._s._adopt(h)
        return h

    async def reopen(self, ref: ProcessReference, *, timeout: float | None = None) -> AsyncProcessHandle[Any]:
        """Returns to the process of a reference: its output resumes where
        the reference stood, a gap reported only for bytes lost since (with
        their count). It never starts a process."""
        r = _check_reference(self._s, ref, "process")
        check_timeout(timeout, "processes.reopen()")
        p = await self._s.transport.call("GET", self._s._path(f"/exec-stream/{segment(r['process'])}"), idempotent=True, timeout=timeout)
        _check_against(r, p)
        h: AsyncProcessHandle[Any] = AsyncProcessHandle(self._s, r["process"], _settings_from(r), r)
        self._s._adopt(h)
        return h

    async def get(self, id: str, *, format: Literal["text", "bytes"] = "text", overflow: Literal["fail", "report"] = "fail",
                  timeout: float | None = None) -> AsyncProcessHandle[Any] | AsyncTerminalHandle:
        """A handle on a process of the sandbox's by its id (one another
        client started, say), its output read from the beginning (what
        kilnd still has of it). It does not hold the process's output: what
        kilnd cannot keep while its reader is behind is lost to it (see
        overflow). A terminal's handle is an AsyncTerminalHandle."""
        if not isinstance(id, str) or not id:
            raise error("INVALID_ARGUMENT", "processes.get(): a process id is needed")
        if format not in ("text", "bytes"):
            raise error("INVALID_ARGUMENT", f'format {format!r}: want "text" or "bytes"')
        if overflow not in ("fail", "report"):
            raise error("INVALID_ARGUMENT", f'overflow {overflow!r}: want "fail" or "report"')
        check_timeout(timeout, "processes.get()")
        p = await self._s.transport.call("GET", self._s._path(f"/exec-stream/{segment(id)}"), idempotent=True, timeout=timeout)
        terminal = bool(p.get("terminal"))
        stdin = p.get("stdin")
        ref: ProcessReference = {
            "kind": "terminal" if terminal else "process", "version": 1, "sandbox": self._s.id, "process": id,
            "offsets": {}, "lost": {}, "ended": {},
            "stdin": {"pipe": stdin is not None, "offset": (stdin or {}).get("accepted", 0), "closed": (stdin or {}).get("closed", True)},
            "format": "bytes" if terminal else format, "mode": "stream", "maxOutputBytes": LIMITS.max_finite_output,
            "overflow": "fail" if terminal else overflow, "hold": False, "expiresAt": "",
        }
        settings = _settings_from(ref)
        h: AsyncProcessHandle[Any] | AsyncTerminalHandle
        if terminal:
            h = AsyncTerminalHandle(self._s, id, settings, ref)
        else:
            h = AsyncProcessHandle(self._s, id, settings, ref)
        self._s._adopt(h)
        return h

    async def list(self, *, timeout: float | None = None) -> builtins.list[ProcessInfo]:
        """The sandbox's processes, running and finished."""
        check_timeout(timeout, "processes.list()")
        return cast("builtins.list[ProcessInfo]", await self._s.transport.call("GET", self._s._path("/exec-stream"), idempotent=True, timeout=timeout) or [])


class AsyncTerminals:
    def __init__(self, s: AsyncSandbox) -> None:
        self._s = s

    def start(self, command: Command, *, columns: int = 80, rows: int = 24, cwd: str | None = None,
              env: Mapping[str, str] | None = None, user: str | None = None, capture: bool = False,
              drain_ms: int | None = None, timeout: float | None = None) -> Opening[AsyncTerminalHandle]:
        """Starts a program on a terminal (80x24 unless said). The program
        waits for this handle's reader when it falls behind, as one waits
        for a real terminal, until the handle stops reading."""
        return Opening(self._start(command, columns, rows, cwd, env, user, capture, drain_ms, timeout))

    async def _start(self, command: Command, columns: int, rows: int, cwd: str | None, env: Mapping[str, str] | None,
                     user: str | None, capture: bool, drain_ms: int | None, timeout: float | None) -> AsyncTerminalHandle:
        check_size(columns, rows)
        settings = settings_of({"mode": "stream", "format": "bytes"}, "pipe", drain_ms, True, "terminals.start()")
        argv_of(command)
        check_timeout(timeout, "terminals.start()")
        pid = await _start_on(self._s, command, settings, cwd, env, user, capture, drain_ms, timeout, {"cols": columns, "rows": rows})
        h = AsyncTerminalHandle(self._s, pid, settings)
        self._s._adopt(h)
        return h

    async def reopen(self, ref: ProcessReference, *, timeout: float | None = None) -> AsyncTerminalHandle:
        """Returns to a terminal of a reference, as processes.reopen() does."""
        r = _check_reference(self._s, ref, "terminal")
        check_timeout(timeout, "terminals.reopen()")
        p = await self._s.transport.call("GET", self._s._path(f"/exec-stream/{segment(r['process'])}"), idempotent=True, timeout=timeout)
        _check_against(r, p)
        h = AsyncTerminalHandle(self._s, r["process"], _settings_from(r), r)
        self._s._adopt(h)
        return h


class AsyncSnapshots:
    """kilnd's snapshots (AsyncSandbox.snapshot takes them)."""

    def __init__(self, t: Transport) -> None:
        self._t = t

    async def list(self, *, sandbox: str | None = None, timeout: float | None = None) -> builtins.list[SnapshotInfo]:
        """The snapshots, oldest first; of one sandbox when sandbox is set."""
        return cast("builtins.list[SnapshotInfo]", await self._t.call(
            "GET", "/snapshots", query={"sandbox": sandbox}, idempotent=True, timeout=timeout) or [])

    async def get(self, ref: str, *, timeout: float | None = None) -> SnapshotInfo:
        """A snapshot, by id, a unique prefix of it, or its name."""
        return cast(SnapshotInfo, await self._t.call("GET", "/snapshots/" + segment(ref), idempotent=True, timeout=timeout))

    async def remove(self, ref: str, *, timeout: float | None = None) -> None:
        """Removes a snapshot; the sandboxes made from it keep their files."""
        await self._t.call("DELETE", "/snapshots/" + segment(ref), idempotent=True, timeout=timeout)

    async def export(self, ref: str, *, timeout: float | None = None) -> AsyncByteStream:
        """A snapshot as a tar, streamed as it is read, for import_() on
        another kilnd; a stream that ends in an error is an export that
        failed."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        resp = await self._t.fetch("GET", "/snapshots/" + segment(ref) + "/export", idempotent=True, unbounded=True, timeout=timeout)
        return AsyncByteStream(resp, f"export {ref}", left(timeout, loop.time() - started))

    async def import_(self, tar: Source, *, timeout: float | None = None) -> SnapshotInfo:
        """Takes a snapshot from the tar export() gave, whole or not at
        all, with its id and name (ALREADY_EXISTS when either is taken
        here). A sandbox made from it needs its image here. (import is
        Python's keyword: hence the underscore.)"""
        body, length = body_of(tar, "snapshot import")
        check_timeout(timeout, "snapshots.import_()")
        return cast(SnapshotInfo, await self._t.call(
            "POST", "/snapshots/import", body=body, length=length, content_type="application/x-tar", unbounded=True, timeout=timeout))
