"""What a sandbox offers besides processes, against a real kilnd: files
(100 MiB there and back without holding them), archives, captured logs,
ports, previews, images and stats."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import platform
import re
import tarfile
import tempfile
import time
import tracemalloc
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import sandkiln
from conftest import Env
from checks import fails, preview_get, sh

ALL_BYTES = bytes(range(256))


def arun(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 170))


@pytest.fixture
def client(env: Env) -> Iterator[sandkiln.Client]:
    with sandkiln.Client(env.kilnd.url, env.kilnd.token) as c:
        yield c


@pytest.fixture
def sandbox(client: sandkiln.Client, env: Env) -> sandkiln.Sandbox:
    return client.sandboxes.get(env.sandbox_id)


def make_tar(entries: list[tuple[str, bytes | None]]) -> bytes:
    """A tar of (name, body) files, a body of None a directory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, body in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1714979289
            if body is None:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            else:
                ti.size, ti.mode = len(body), 0o644
                tf.addfile(ti, io.BytesIO(body))
    return out.getvalue()


def read_tar(data: bytes) -> dict[str, tuple[bytes, bytes]]:
    """A tar's entries by name: (type, body)."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf.getmembers():
            f = tf.extractfile(m)
            out[m.name.rstrip("/")] = (m.type, f.read() if f else b"")
    return out


class Pattern:
    """n bytes that are not all alike, made and hashed a block at a time,
    never held whole."""

    def __init__(self, n: int, block: int = 1 << 20) -> None:
        self.n = n
        self.block = block
        self.sha = hashlib.sha256()

    def blocks(self) -> Iterator[bytes]:
        seed = hashlib.sha256(b"sandkiln").digest()
        left = self.n
        i = 0
        while left > 0:
            b = (hashlib.sha256(seed + i.to_bytes(8, "big")).digest() * (self.block // 32 + 1))[:min(self.block, left)]
            self.sha.update(b)
            left -= len(b)
            i += 1
            yield b


def test_files_round_trip_100_mib_streamed(sandbox: sandkiln.Sandbox) -> None:
    # 100 MiB from an iterable into the sandbox, back out as a stream into a
    # file, and again from that file: by SHA-256 each way, while what Python
    # allocated at any one time stays far below the file's size.
    n = 100 << 20
    src = Pattern(n)
    tracemalloc.start()
    try:
        info = sandbox.files.write("/workspace/big.bin", src.blocks())
        assert info["size"] == n
        back = hashlib.sha256()
        got = 0
        with tempfile.TemporaryFile() as f:
            with sandbox.files.read_stream("/workspace/big.bin") as body:
                for chunk in body:
                    back.update(chunk)
                    f.write(chunk)
                    got += len(chunk)
            assert got == n
            assert back.hexdigest() == src.sha.hexdigest()
            # From a file, read from where it stands: sent with its length.
            f.seek(0)
            info = sandbox.files.write("/workspace/again.bin", f)
            assert info["size"] == n
        check = sandbox.exec(["sha256sum", "/workspace/again.bin"])
        assert check.stdout.split()[0] == src.sha.hexdigest()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak} bytes held at once for a {n}-byte round trip"
    sandbox.files.remove("/workspace/big.bin")
    sandbox.files.remove("/workspace/again.bin")


def test_files_small_and_errors(sandbox: sandkiln.Sandbox) -> None:
    f = sandbox.files
    info = f.write("/workspace/f/a.txt", "alpha\n", mode="0600")
    assert (info["name"], info["type"], info["size"], info["mode"]) == ("a.txt", "file", 6, "0600")
    assert f.read_text("/workspace/f/a.txt") == "alpha\n"
    f.write("/workspace/f/b.bin", ALL_BYTES)
    assert f.read("/workspace/f/b.bin") == ALL_BYTES
    f.write("/workspace/f/c.bin", bytearray(b"from a bytearray"))
    f.write("/workspace/f/d.bin", (bytes([i]) * 1000 for i in range(10)))
    assert f.read("/workspace/f/d.bin") == b"".join(bytes([i]) * 1000 for i in range(10))
    assert f.mkdir("/workspace/f/sub/deeper")["type"] == "dir"
    assert sorted(e["name"] for e in f.list("/workspace/f")) == ["a.txt", "b.bin", "c.bin", "d.bin", "sub"]
    assert f.stat("/workspace/f/sub")["type"] == "dir"
    assert f.move("/workspace/f/c.bin", "/workspace/f/sub/e.bin")["name"] == "e.bin"
    assert f.read("/workspace/f/sub/e.bin") == b"from a bytearray"
    with fails("NOT_FOUND"):
        f.stat("/workspace/f/c.bin")
    with fails("INVALID_ARGUMENT"):
        f.move("/workspace/f/a.txt", "relative")
    with fails("INVALID_ARGUMENT"):
        f.read("/workspace/f")  # a directory
    with fails("INVALID_ARGUMENT"):
        f.list("/workspace/f/a.txt")
    with fails("INVALID_ARGUMENT"):
        f.read("relative/path")
    with fails("NOT_FOUND") as e:
        f.read("/workspace/f/none")
    assert e.err is not None and e.err.status == 404 and isinstance(e.err, sandkiln.NotFoundError)
    with fails("FAILED_PRECONDITION"):
        f.remove("/workspace/f")  # not empty
    f.remove("/workspace/f", recursive=True)
    with fails("NOT_FOUND"):
        f.stat("/workspace/f")
    with fails("INVALID_ARGUMENT"):
        f.write("/workspace/x", 42)  # type: ignore[arg-type]


def test_archive_and_extract(sandbox: sandkiln.Sandbox) -> None:
    f = sandbox.files
    f.write("/workspace/arc/a.txt", "alpha\n")
    f.write("/workspace/arc/sub/b.bin", ALL_BYTES)
    f.mkdir("/workspace/arc/sub/empty")
    with f.archive("/workspace/arc") as tar:
        assert tar.info["name"] == "arc" and tar.info["type"] == "dir"
        entries = read_tar(tar.read())
    assert sorted(entries) == ["arc", "arc/a.txt", "arc/sub", "arc/sub/b.bin", "arc/sub/empty"]
    assert entries["arc/sub/empty"][0] == tarfile.DIRTYPE
    assert entries["arc/a.txt"][1] == b"alpha\n"
    assert entries["arc/sub/b.bin"][1] == ALL_BYTES
    with f.archive("/workspace/arc/a.txt") as one:
        assert (one.info["type"], one.info["size"]) == ("file", 6)
        assert {k: v[1] for k, v in read_tar(one.read()).items()} == {"a.txt": b"alpha\n"}
    with fails("NOT_FOUND"):
        f.archive("/workspace/no-such")

    tar_bytes = make_tar([("x.txt", b"ex\n"), ("d", None), ("d/y.bin", ALL_BYTES)])
    pieces = [tar_bytes[i:i + 700] for i in range(0, len(tar_bytes), 700)]  # cutting headers
    for d, body in (("/workspace/ext-bytes", tar_bytes), ("/workspace/ext-file", io.BytesIO(tar_bytes)),
                    ("/workspace/ext-iter", iter(pieces))):
        f.mkdir(d)
        assert f.extract(d, body)["type"] == "dir"
        assert f.read_text(d + "/x.txt") == "ex\n"
        assert f.read(d + "/d/y.bin") == ALL_BYTES
        assert sorted(e["name"] for e in f.list(d)) == ["d", "x.txt"]
    with fails("NOT_FOUND"):
        f.extract("/workspace/ext-none", tar_bytes)
    f.mkdir("/workspace/ext-bad")
    with fails("PERMISSION_DENIED") as e:
        f.extract("/workspace/ext-bad", make_tar([("../out.txt", b"no")]))
    assert e.err is not None and e.err.status == 403
    with fails("NOT_FOUND"):
        f.stat("/workspace/out.txt")


def test_async_files_stream_both_ways(env: Env) -> None:
    async def run() -> None:
        async with sandkiln.AsyncClient(env.kilnd.url, env.kilnd.token) as c:
            sb = await c.sandboxes.get(env.sandbox_id)

            async def gen() -> AsyncIterator[bytes]:
                for i in range(64):
                    yield bytes([i]) * 65536

            info = await sb.files.write("/workspace/async.bin", gen())
            assert info["size"] == 64 * 65536
            h = hashlib.sha256()
            async with await sb.files.read_stream("/workspace/async.bin") as body:
                async for b in body:
                    h.update(b)
            assert h.hexdigest() == hashlib.sha256(b"".join(bytes([i]) * 65536 for i in range(64))).hexdigest()
            await sb.files.remove("/workspace/async.bin")

    arun(run())


def test_stats(client: sandkiln.Client, sandbox: sandkiln.Sandbox) -> None:
    with sandbox.processes.start(sh("read x"), stdin="pipe") as child:
        st = sandbox.stats()
        top = sandbox.top()
        assert top[0]["pid"] == 1, "the agent"
        assert any(p["command"].endswith("read x") and p["ppid"] == 1 for p in top), top
        assert st["memory_bytes"] > 0
        assert st["pids"] >= 2, "the agent and sh at least"
        assert st["cpu_seconds"] >= 0
        assert st["processes"] >= 1
        child.close_stdin()
        child.wait()
    other = client.sandboxes.create()
    other.destroy()
    with fails("NOT_FOUND"):
        other.stats()


def record_bytes(r: sandkiln.LogRecord) -> bytes:
    content = base64.b64decode(r["base64"]) if "base64" in r else r.get("text", "").encode()
    return content if r.get("partial") else content + b"\n"


def test_logs(sandbox: sandkiln.Sandbox) -> None:
    child = sandbox.processes.start(
        sh("printf 'out-1\\n'; printf 'err-1\\n' >&2; printf 'bin:\\377\\376\\000\\n'; printf 'err-2\\n' >&2"), capture=True)
    assert child.wait().exit_code == 0
    child.detach()
    stdout = b"out-1\nbin:\xff\xfe\x00\n"
    stderr = b"err-1\nerr-2\n"
    # From the log alone, followed until the log says the process ended.
    with sandbox.logs.read(child.id, stream="stdout", source="log", follow=True) as body:
        assert body.read() == stdout
    with sandbox.logs.read(child.id, stream="stderr", source="log") as body:
        assert body.read() == stderr
        # The read's account of the runs, in the trailers the body ends with
        # (a followed read's are what it found before it began to follow).
        assert body.trailers.get("Kiln-Complete") == "true", body.trailers
        runs = json.loads(body.trailers.get("Kiln-Runs") or "null")
        assert runs and all(r["state"] == "lossless" for r in runs), runs
    assert sandbox.logs.read(child.id, stream="stdout").read() == stdout
    assert len(sandbox.logs.read(child.id).read()) == len(stdout) + len(stderr)

    mine = next(x for x in sandbox.logs.list() if x["process"] == child.id)
    assert mine["complete"] and all(r["state"] == "lossless" for r in mine["runs"]), mine

    records = list(sandbox.logs.records(child.id))
    assert b"".join(record_bytes(r) for r in records if r["stream"] == "stdout") == stdout
    assert b"".join(record_bytes(r) for r in records if r["stream"] == "stderr") == stderr
    assert any("base64" in r for r in records if r["stream"] == "stdout"), "invalid UTF-8 comes as base64"
    last = list(sandbox.logs.records(child.id, stream="stderr", tail=1))
    assert [(r["stream"], record_bytes(r)) for r in last] == [("stderr", b"err-2\n")]
    with fails("NOT_FOUND"):
        sandbox.logs.read("01a22779-5cfd-7451-9354-2e19949d5c7f")
    with fails("INVALID_ARGUMENT"):
        sandbox.logs.read(child.id, tail=-1)


def test_logs_follow_and_timeout(sandbox: sandkiln.Sandbox) -> None:
    child = sandbox.processes.start(sh("echo first; read x; echo second $x"), stdin="pipe", capture=True)
    got = b""
    with sandbox.logs.read(child.id, follow=True) as body:
        for b in body:
            got += b
            if b"first\n" in got:
                break
        child.write("go\n")  # read takes it, and the process exits
        for b in body:
            got += b
    assert got == b"first\nsecond go\n"
    assert child.status().state == "exited"
    child.detach()

    quiet = sandbox.processes.start(sh("echo once; read x"), stdin="pipe", capture=True)
    with sandbox.logs.read(quiet.id, follow=True, timeout=3) as body:  # the request and the line within it
        assert next(body) == b"once\n"
        with fails("WAIT_ABORTED"):
            next(body)
    quiet.close_stdin()
    quiet.wait()
    quiet.detach()


def serve(sandbox: sandkiln.Sandbox, script: str) -> sandkiln.ProcessHandle[sandkiln.TextChunk]:
    """Starts python3 -u with script, and gives its handle once it printed ready."""
    child = sandbox.processes.start(["/usr/bin/python3", "-u", "-c", script], output={"mode": "stream"})
    out = ""
    for c in child.output():
        out += c.text
        if "ready\n" in out:
            break
    assert "ready\n" in out, f"the server did not start: {out}"
    return child


def stop(child: sandkiln.ProcessHandle[Any]) -> None:
    child.terminate()
    child.wait()
    child.detach()


HTTP_SERVER = """
import functools, http.server
h = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/workspace/www")
s = http.server.ThreadingHTTPServer(("127.0.0.1", 8000), h)
print("ready")
s.serve_forever()
"""


def test_ports_fetch_and_previews(env: Env, sandbox: sandkiln.Sandbox) -> None:
    sandbox.files.write("/workspace/www/hello.txt", "hello through the proxy\n")
    sandbox.files.mkdir("/workspace/www/sub")
    server = serve(sandbox, HTTP_SERVER)
    try:
        with sandbox.ports.fetch(8000, "/hello.txt") as resp:
            assert resp.status == 200
            assert resp.read() == b"hello through the proxy\n"
        missing = sandbox.ports.fetch(8000, "nope.txt?x=1")
        assert missing.status == 404, "the app's own 404 is an answer, not an error"
        assert missing.headers.get("Kiln-Error") is None
        missing.read()
        moved = sandbox.ports.fetch(8000, "/sub")
        assert moved.status == 301
        assert (moved.headers.get("Location") or "").endswith(f"/sandboxes/{sandbox.id}/ports/8000/sub/")
        moved.close()
        head = sandbox.ports.fetch(8000, "/hello.txt", method="HEAD")
        assert head.headers.get("Content-Length") == "24"
        assert head.read() == b""
        post = sandbox.ports.fetch(8000, "/hello.txt", method="POST", body=b"x")
        assert post.status == 501, "the app refuses POST: its answer, not an error"
        post.read()

        # A preview reaches the port without kilnd's token, on a host of
        # its own under localhost, at kilnd's port.
        p = sandbox.previews.create(8000, ttl_seconds=300)
        assert p["port"] == 8000
        port = urllib.parse.urlsplit(env.kilnd.url).port
        assert re.fullmatch(rf"http://{p['id']}\.localhost:{port}/preview/{p['token']}/", p["url"]), p["url"]
        assert preview_get(p["url"], "hello.txt") == (200, b"hello through the proxy\n")
        assert any(x["id"] == p["id"] for x in sandbox.previews.list())
        sandbox.previews.revoke(p["id"])
        assert all(x["id"] != p["id"] for x in sandbox.previews.list())
        # Revoked, its host serves nothing.
        assert preview_get(p["url"], "hello.txt")[0] == 401
    finally:
        stop(server)
    with fails("UNAVAILABLE") as e:
        sandbox.ports.fetch(8001, "/")
    assert e.err is not None and (e.err.status, e.err.kiln_code) == (502, "bad_gateway")
    with fails("INVALID_ARGUMENT"):
        sandbox.ports.fetch(0, "/")


ECHO_SERVER = """
import socket
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 9000))
l.listen(4)
print("ready")
while True:
    c, _ = l.accept()
    while True:
        b = c.recv(65536)
        if not b:
            break
        if b == b"bye\\n":
            c.sendall(b"bye\\n")
            break
        c.sendall(b)
    c.close()
"""


def test_ports_connect(env: Env, client: sandkiln.Client, sandbox: sandkiln.Sandbox) -> None:
    server = serve(sandbox, ECHO_SERVER)
    try:
        with sandbox.ports.connect(9000) as conn:
            big = bytes((i * 7 + (i >> 9)) & 0xFF for i in range(1 << 20))
            want = ALL_BYTES + big
            conn.write(ALL_BYTES)
            conn.write(big)
            got = b""
            for b in conn:
                got += b
                if len(got) >= len(want):
                    break
            assert got == want
            # A loop left early leaves the connection open: reading again goes on.
            conn.write("again")
            assert next(conn) == b"again"
        assert conn.closed
        with fails("DETACHED"):
            conn.write("late")

        # The server closing ends the iteration.
        second = sandbox.ports.connect(9000)
        second.write("bye\n")
        assert b"".join(second) == b"bye\n"
        second.wait_closed(timeout=10)
        with fails("UNAVAILABLE"):
            second.write("more")

        # close() of the client closes the connections made through it.
        other = sandkiln.Client(env.kilnd.url, env.kilnd.token)
        third = other.sandboxes.get(sandbox.id).ports.connect(9000)
        third.write("ping")
        assert next(third) == b"ping"
        other.close()
        assert third.closed
    finally:
        stop(server)
    with fails("UNAVAILABLE") as e:
        sandbox.ports.connect(9001)
    assert e.err is not None and (e.err.status, e.err.kiln_code) == (502, "bad_gateway")


def docker_save(name: str) -> tuple[str, bytes]:
    """The smallest docker save tar: one image, one layer of one file."""
    layer = make_tar([("data", None), ("data/hello.txt", b"from the imported layer\n")])
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    config = json.dumps({
        "architecture": arch, "os": "linux", "created": "2024-05-06T07:08:09Z",
        "config": {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": ["layer/layer.tar"]}]).encode()
    tar = make_tar([("manifest.json", manifest), (config_name, config), ("layer", None), ("layer/layer.tar", layer)])
    return "sha256:" + hashlib.sha256(config).hexdigest(), tar


def test_images_import(client: sandkiln.Client) -> None:
    name = "example.test/sdk-python-import:1"
    image_id, tar = docker_save(name)
    seen: list[str] = []
    images = client.images.import_(tar, on_progress=lambda p: seen.append(p["status"]))
    assert [(i["id"], i["names"], len(i["layers"])) for i in images] == [(image_id, [name], 1)]
    assert seen[-1:] == ["done"] and "unpacking" in seen, seen
    assert any(i["id"] == image_id for i in client.images.list())
    assert client.images.get(name)["id"] == image_id
    # Again, as a file: the layer is kept already.
    seen.clear()
    assert client.images.import_(io.BytesIO(tar), on_progress=lambda p: seen.append(p["status"]))[0]["id"] == image_id
    assert "exists" in seen, seen
    with client.sandboxes.create(image=name) as sb:
        assert sb.info.get("image_id") == image_id
        assert sb.files.read_text("/data/hello.txt") == "from the imported layer\n"
    client.images.remove(name)
    with fails("NOT_FOUND"):
        client.images.get(name)
    with fails("INVALID_ARGUMENT"):
        client.images.import_(b"not a tar")


def test_unix_socket_and_environment(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # kilnd's unix socket needs no token.
    with sandkiln.Client("unix://" + env.kilnd.socket) as c:
        assert c.health()
        assert c.version()["go_version"].startswith("go1.")
        assert any(s["id"] == env.sandbox_id for s in c.sandboxes.list())
    # The address and token from the environment, host:port as kiln takes it.
    monkeypatch.setenv("KILN_ADDR", env.kilnd.url.removeprefix("http://"))
    monkeypatch.setenv("KILN_TOKEN", env.kilnd.token)
    with sandkiln.Client() as c:
        assert c.url == env.kilnd.url
        assert c.health()
    monkeypatch.setenv("KILN_TOKEN", "wrong")
    with sandkiln.Client() as c:
        with fails("UNAUTHENTICATED"):
            c.sandboxes.list()
    monkeypatch.delenv("KILN_ADDR")
    with fails("INVALID_ARGUMENT"):
        sandkiln.Client()
    with fails("INVALID_ARGUMENT"):
        sandkiln.AsyncClient("http://")
    # Nothing listening: nothing was sent, so even a start is UNAVAILABLE, not OUTCOME_UNKNOWN.
    with sandkiln.Client("127.0.0.1:1", "t") as c:
        with fails("UNAVAILABLE"):
            c.sandboxes.create()


def test_names_and_lifecycle(client: sandkiln.Client) -> None:
    name = "py-" + os.urandom(4).hex()
    sb = client.sandboxes.create(name=name)
    try:
        assert sb.name == name
        got = client.sandboxes.get(name)
        assert got.id == sb.id
        assert client.sandboxes.get(sb.reference).id == sb.id
        assert client.sandboxes.get(sb.id[:12]).id == sb.id
        with fails("ALREADY_EXISTS"):
            client.sandboxes.create(name=name)
        assert sb.refresh()["state"] == "running"
        child = got.processes.start(sh("sleep 30"), output={"mode": "stream"})
        # Deleted by its name: the handles on it made through this client go.
        client.sandboxes.delete(name, remove_logs=True)
        with fails("DETACHED"):
            child.status()
    finally:
        sb.destroy(remove_logs=True)  # gone already: not an error
    with fails("NOT_FOUND"):
        client.sandboxes.get(name)
    with fails("NOT_FOUND"):
        client.sandboxes.delete(name)
    t0 = time.monotonic()
    with client.sandboxes.create() as scoped:
        sid = scoped.id
    assert all(s["id"] != sid for s in client.sandboxes.list()), "the with block's end destroys it"
    assert time.monotonic() - t0 < 170


def test_stop_start_restart(client: sandkiln.Client) -> None:
    with client.sandboxes.create() as sb:
        sb.files.write("/workspace/kept", b"kept\n")
        stopped = sb.stop(timeout_seconds=0)
        assert stopped["state"] == "stopped" and stopped["reason"] == "stopped by request"
        assert sb.info["state"] == "stopped"
        again = sb.stop()  # stopped already: kilnd answers 304, and it is described
        assert again["state"] == "stopped" and again["stopped_at"] == stopped["stopped_at"]
        with fails("FAILED_PRECONDITION"):
            sb.exec(sh("true"))
        started = sb.start()
        assert started["state"] == "running" and started["id"] == sb.id
        assert started.get("agent_pid", 0) > 0
        assert sb.files.read_text("/workspace/kept") == "kept\n"
        assert sb.start()["agent_pid"] == started["agent_pid"]
        restarted = sb.restart(timeout_seconds=1)
        assert restarted["state"] == "running" and restarted["agent_pid"] != started["agent_pid"]
        assert sb.files.read_text("/workspace/kept") == "kept\n"
        for bad in (-1, 601, 1.5, True):
            with fails("INVALID_ARGUMENT"):
                sb.stop(timeout_seconds=bad)  # type: ignore[arg-type]
        assert sb.refresh()["state"] == "running"


def test_snapshots(client: sandkiln.Client) -> None:
    made: list[sandkiln.Sandbox] = []
    with client.sandboxes.create() as sb:
        try:
            sb.files.write("/workspace/state", b"good\n")
            snap = sb.snapshot(name="py-" + sb.id[:8])
            assert snap["sandbox"] == sb.id and len(snap["id"]) == 64 and snap["copy"] in ("reflink", "copy")
            assert snap["processes"] == [] or all("id" in p for p in snap["processes"])
            assert [s["id"] for s in sb.snapshots()] == [snap["id"]]
            sb.files.write("/workspace/state", b"broken\n")
            assert sb.rollback(snap["name"], timeout_seconds=0)["state"] == "running"
            assert sb.files.read_text("/workspace/state") == "good\n"
            forks = sb.fork(count=2, labels={"try": "1"})
            made += forks
            assert len(forks) == 2 and all(f.info["labels"]["try"] == "1" for f in forks)
            forks[0].files.write("/workspace/state", b"fork 0\n")
            assert forks[1].files.read_text("/workspace/state") == "good\n"
            made.append(client.sandboxes.create(snapshot=snap["id"][:12]))
            assert made[-1].files.read_text("/workspace/state") == "good\n"
            with client.snapshots.export(snap["id"]) as stream:
                tar = stream.read()
            assert len(tar) > 1024
            with fails("ALREADY_EXISTS"):
                client.snapshots.import_(tar)
            client.snapshots.remove(snap["id"])
            with fails("NOT_FOUND"):
                client.snapshots.get(snap["id"])
            assert client.snapshots.import_(tar)["id"] == snap["id"]
            assert any(s["id"] == snap["id"] for s in client.snapshots.list(sandbox=sb.id))
            client.snapshots.remove(snap["id"])
            with fails("INVALID_ARGUMENT"):
                sb.fork(count=65)
        finally:
            for m in made:
                m.destroy(remove_logs=True)


def test_pause_resume(client: sandkiln.Client) -> None:
    with client.sandboxes.create() as sb:
        paused = sb.pause()
        assert paused["state"] == "paused" and paused.get("paused_at")
        assert sb.info["state"] == "paused"
        again = sb.pause()  # paused already: kilnd answers 304, and it is described
        assert again["state"] == "paused" and again["paused_at"] == paused["paused_at"]
        with fails("PAUSED"):
            sb.exec(sh("true"))
        resumed = sb.resume()
        assert resumed["state"] == "running" and "paused_at" not in resumed
        assert sb.resume()["state"] == "running"
        assert sb.exec(sh("echo resumed")).stdout == "resumed\n"


def test_async_pause_resume(env: Env) -> None:
    async def go() -> None:
        async with sandkiln.AsyncClient(env.kilnd.url, env.kilnd.token) as c:
            async with c.sandboxes.create() as sb:
                assert (await sb.pause())["state"] == "paused"
                with fails("PAUSED"):
                    await sb.exec(sh("true"))
                assert (await sb.resume())["state"] == "running"
                assert (await sb.exec(sh("echo up"))).stdout == "up\n"
    arun(go())


def test_async_stop_start(env: Env) -> None:
    async def go() -> None:
        async with sandkiln.AsyncClient(env.kilnd.url, env.kilnd.token) as c:
            async with c.sandboxes.create() as sb:
                assert (await sb.stop(timeout_seconds=0))["state"] == "stopped"
                assert (await sb.start())["state"] == "running"
                assert (await sb.restart(timeout_seconds=0))["state"] == "running"
                assert (await sb.exec(sh("echo up"))).stdout == "up\n"
    arun(go())


def test_errors_carry_one_prefix(env: Env, client: sandkiln.Client) -> None:
    """kilnd's answers carry no prefix of their own: the SDK puts one,
    "kilnd: ", before each."""
    with sandkiln.Client(env.kilnd.url, "wrong") as wrong:
        with fails("UNAUTHENTICATED") as unauthenticated:
            wrong.sandboxes.list()
    with fails("INVALID_ARGUMENT") as invalid:
        client.sandboxes.create(limits={"pids": 2**40})
    with fails("NOT_FOUND") as not_found:
        client.sandboxes.get("no-such-sandbox")
    for f in (unauthenticated, invalid, not_found):
        msg = str(f.err)
        assert msg.startswith("kilnd: ") and msg.count("kilnd: ") == 1, msg


def test_mounts_refused_without_allow_mount(client: sandkiln.Client) -> None:
    """The shared kilnd allows no mounts: a create with one is refused,
    naming the flag that would, and makes nothing."""
    before = {s["id"] for s in client.sandboxes.list()}
    with fails("PERMISSION_DENIED") as f:
        client.sandboxes.create(mounts=[{"source": tempfile.gettempdir(), "target": "/data", "read_only": True}])
    assert "--allow-mount" in str(f.err)
    assert {s["id"] for s in client.sandboxes.list()} == before
