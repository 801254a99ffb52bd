"""The synchronous client: the same code on a loop of its own thread. What
it adds is held here: iteration with for, threads calling at once,
timeouts and interrupts ending a wait, callbacks that call back, context
managers, and its thread's life."""

from __future__ import annotations

import gc
import hashlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import sandkiln
from conftest import Env
from checks import fails, sh


@pytest.fixture
def client(env: Env) -> Iterator[sandkiln.Client]:
    with sandkiln.Client(env.kilnd.url, env.kilnd.token) as c:
        yield c


@pytest.fixture
def sandbox(client: sandkiln.Client, env: Env) -> sandkiln.Sandbox:
    return client.sandboxes.get(env.sandbox_id)


def test_the_seeds_example_with_a_reader_thread(sandbox: sandkiln.Sandbox) -> None:
    child = sandbox.processes.start(["sh", "-c", 'while read l; do echo "done: $l"; done'], stdin="pipe", output={"mode": "stream"})
    seen: list[str] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for chunk in child.output():
                seen.append(chunk.text)
        except BaseException as e:  # the test thread says what went wrong
            errors.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        child.write("first request\n")
        child.write("second request\n".encode())
        child.close_stdin()
        status = child.status()
        reader.join(60)
        assert not reader.is_alive()
        result = child.wait()
    finally:
        child.detach()
    assert status.state in ("running", "exited")
    assert errors == []
    assert "".join(seen) == "done: first request\ndone: second request\n"
    assert result.exit_code == 0 and result.output_complete


def test_leaving_a_for_loop(sandbox: sandkiln.Sandbox) -> None:
    # Stream mode: reading stops, input and control go on, and output()
    # again resumes where the loop left.
    child = sandbox.processes.start(["cat"], stdin="pipe", output={"mode": "stream"})
    child.write("a\n")
    for c in child.output():
        assert c.text == "a\n"
        break
    child.write("b\n")
    assert child.status().state == "running"
    assert next(iter(child.output())).text == "b\n"
    child.close_stdin()
    assert [c.text for c in child.output()] == []
    assert child.wait().exit_code == 0
    child.detach()
    # Finite mode: the handle is detached as the loop is left.
    finite = sandbox.processes.start(sh("echo one; sleep 30"), stdin="pipe")
    for c in finite.output():
        assert c.text == "one\n"
        break
    with fails("DETACHED"):
        finite.write("x")
    with fails("DETACHED"):
        finite.wait()
    sandbox.processes.get(finite.id).terminate()


def test_a_loop_left_inside_a_batch_resumes_exactly(sandbox: sandkiln.Sandbox) -> None:
    # A reader slow at first lets the queue fill with many chunks, which one
    # call to the loop brings back together; leaving the loop after the
    # third leaves the rest undelivered: the reference stands after the
    # third, and output() again goes on from there, nothing lost or repeated.
    want = "".join(f"{i}\n" for i in range(1, 100_001))
    child = sandbox.processes.start(["seq", "1", "100000"], output={"mode": "stream"})
    got = ""
    for n, c in enumerate(child.output()):
        if n == 0:
            time.sleep(0.5)  # the slow reader itself: the queue fills meanwhile
        got += c.text
        if n == 2:
            break
    assert child.reference()["offsets"]["stdout"] == len(got.encode())
    got += "".join(c.text for c in child.output())
    assert got == want
    assert child.wait().output_complete
    child.detach()


def test_bytes_burst_32_mib(sandbox: sandkiln.Sandbox) -> None:
    n = 32 << 20
    child = sandbox.processes.start(sh(f"head -c {n} /dev/urandom > /tmp/b.$$ && sha256sum < /tmp/b.$$ >&2 && cat /tmp/b.$$; rm /tmp/b.$$"),
                                    output={"mode": "stream", "format": "bytes"})
    h = hashlib.sha256()
    got = 0
    err = b""
    for c in child.output():
        if c.stream == "stdout":
            h.update(c.bytes)
            got += len(c.bytes)
        else:
            err += c.bytes
    assert got == n
    assert h.hexdigest() == err.split()[0].decode()
    assert child.wait().output_complete
    child.detach()


def test_timeouts(sandbox: sandkiln.Sandbox) -> None:
    child = sandbox.processes.start(sh("echo x; sleep 30"), output={"mode": "stream"})
    with pytest.raises(sandkiln.WaitAbortedError) as e:
        child.wait(timeout=0.2)
    assert isinstance(e.value, TimeoutError) and e.value.code == "WAIT_ABORTED"
    got = []
    with fails("WAIT_ABORTED"):
        for c in child.output(timeout=3):  # the connection and the replay within it
            got.append(c.text)
    assert got == ["x\n"]
    lines = []
    with fails("WAIT_ABORTED"):
        for line in sandkiln.read_process_lines(child.output(), timeout=0.5):
            lines.append(line)
    assert lines == []  # the output stands after "x\n" now
    assert child.status().state == "running"
    assert child.terminate() == sandkiln.TerminateResult("requested")
    assert child.wait().signal == "SIGKILL"
    child.detach()


def test_an_interrupt_cancels_the_wait_on_the_loop(sandbox: sandkiln.Sandbox) -> None:
    # Ctrl-C while a call waits: the call's task on the loop is cancelled,
    # the interrupt reaches the caller, and the handle goes on.
    child = sandbox.processes.start(sh("read x; exit 7"), stdin="pipe", output={"mode": "stream"})
    main = threading.get_ident()
    old = signal.signal(signal.SIGUSR1, signal.default_int_handler)
    try:
        threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGUSR1)).start()
        with pytest.raises(KeyboardInterrupt):
            child.wait()
    finally:
        signal.signal(signal.SIGUSR1, old)
    child.write("\n")
    assert child.wait(timeout=30).exit_code == 7
    child.detach()


def test_threads_at_once(sandbox: sandkiln.Sandbox) -> None:
    # Writes from four threads, each thread's in its order, and one reader.
    child = sandbox.processes.start(["cat"], stdin="pipe", output={"mode": "stream"})
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(c.text for c in child.output()))
    reader.start()

    def write(k: int) -> None:
        for i in range(50):
            child.write(f"{k}:{i}\n")

    writers = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
    child.close_stdin()
    reader.join(60)
    lines = "".join(out).splitlines()
    assert len(lines) == 200
    for k in range(4):
        assert [x for x in lines if x.startswith(f"{k}:")] == [f"{k}:{i}" for i in range(50)]
    child.detach()


def test_exec_and_a_callback_that_calls_back(sandbox: sandkiln.Sandbox) -> None:
    r = sandbox.exec(sh("echo out; echo err >&2; exit 3"))
    assert (r.exit_code, r.stdout, r.stderr, r.truncated) == (3, "out\n", "err\n", False)
    seen: list[str] = []
    states: list[str] = []

    def on_output(c: sandkiln.TextChunk) -> None:
        # A callback runs in a worker thread: it may block, and call the client.
        seen.append(c.text)
        states.append(sandbox.refresh()["state"])

    r = sandbox.exec(sh("cat; echo live"), on_output=on_output, stdin="in\n")
    assert r.stdout == "in\nlive\n" and "".join(seen) == "in\nlive\n"
    assert states == ["running"] * len(seen)
    r = sandbox.exec(sh("head -c 2000000 /dev/zero"), max_output_bytes=1000)
    assert (len(r.stdout), r.stdout_bytes, r.truncated) == (1000, 2000000, True)
    r = sandbox.exec(sh("sleep 30"), deadline_seconds=0.5)
    assert r.timed_out


def test_terminal(sandbox: sandkiln.Sandbox) -> None:
    with sandbox.terminals.start(["sh"], columns=100, rows=20) as term:
        term.resize(120, 40)
        term.write("stty size; exit 5\n")
        seen = b"".join(term.output())
        assert b"40 120" in seen
        assert term.wait().exit_code == 5
        lines = [x.text for x in sandkiln.read_process_lines([seen])]
        assert any("40 120" in x for x in lines)


def test_tail_and_lines_over_the_sync_output(sandbox: sandkiln.Sandbox) -> None:
    child = sandbox.processes.start(sh("seq 1 500; printf partial"), output={"mode": "stream"})
    tail = sandkiln.ProcessTail(max_lines=3)

    def pushed() -> Iterator[sandkiln.TextChunk]:
        for c in child.output():
            tail.push(c)
            yield c

    lines = list(sandkiln.read_process_lines(pushed()))
    assert len(lines) == 501 and lines[-1] == sandkiln.ProcessLine("stdout", "partial", partial=True)
    snap = tail.snapshot()
    assert [x.text for x in snap.lines] == ["499", "500", "partial"] and snap.truncated
    child.detach()


def test_context_managers_and_the_thread(env: Env) -> None:
    with sandkiln.Client(env.kilnd.url, env.kilnd.token) as c:
        thread = c._p.thread
        with c.sandboxes.create() as sb:
            with sb.processes.start(sh("sleep 30"), output={"mode": "stream"}) as child:
                assert child.status().state == "running"
            with fails("DETACHED"):
                child.status()  # the with block detached it
            sid = sb.id
        assert all(s["id"] != sid for s in c.sandboxes.list()), "the with block destroyed it"
    thread.join(10)
    assert not thread.is_alive(), "close() stops the client's thread"
    with fails("DETACHED"):
        c.health()

    # A client dropped without close(): its thread ends once nothing made
    # through it is left.
    d = sandkiln.Client(env.kilnd.url, env.kilnd.token)
    assert d.health()
    thread = d._p.thread
    del d
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()


def test_a_sync_call_on_the_clients_own_loop_is_refused(client: sandkiln.Client) -> None:
    loop = client._p.loop
    result: list[BaseException] = []
    done = threading.Event()

    def on_loop() -> None:
        try:
            client.health()
        except BaseException as e:
            result.append(e)
        done.set()

    loop.call_soon_threadsafe(on_loop)
    assert done.wait(10)
    assert isinstance(result[0], RuntimeError)


def test_concurrent_terminates_share_one_request(env: Env, sandbox: sandkiln.Sandbox) -> None:
    via = sandkiln.Client(env.proxy.url, env.kilnd.token)
    try:
        child = via.sandboxes.get(sandbox.id).processes.start(sh("sleep 30"), output={"mode": "stream"})
        path = f"^/sandboxes/{sandbox.id}/exec-stream/{child.id}(\\?|$)"
        held = env.proxy.hold("DELETE", path)
        results: list[Any] = []
        threads = [threading.Thread(target=lambda: results.append(child.terminate())) for _ in range(3)]
        for th in threads:
            th.start()
        assert held.seen.wait(30)
        with fails("WAIT_ABORTED"):
            child.terminate(timeout=0.2)  # this caller stops waiting; the request goes on
        held.release()
        for th in threads:
            th.join(30)
        assert results == [sandkiln.TerminateResult("requested")] * 3
        assert env.proxy.count("DELETE", path) == 1
        assert child.wait().signal == "SIGKILL"
        child.detach()
    finally:
        via.close()


def test_labels_and_list_filters(client: sandkiln.Client) -> None:
    b = client.sandboxes.create(labels={"suite": "py-labels"})
    with client.sandboxes.create(labels={"suite": "py-labels", "tier": "front"}) as a:
        assert a.info["labels"] == {"suite": "py-labels", "tier": "front"}
        ids = [s["id"] for s in client.sandboxes.list(label="suite=py-labels")]
        assert ids == [b.id, a.id]  # oldest first
        assert [s["id"] for s in client.sandboxes.list(label={"suite": "py-labels", "tier": "front"})] == [a.id]
        assert [s["id"] for s in client.sandboxes.list(label=["suite=py-labels", "tier"])] == [a.id]
        assert client.sandboxes.list(label="suite=py-labels", state="stopped") == []
        b.destroy()
        assert [s["id"] for s in client.sandboxes.list(label="suite=py-labels")] == [a.id]
        assert [s["id"] for s in client.sandboxes.list(label="suite=py-labels", all=True)] == [b.id, a.id]
        with fails("INVALID_ARGUMENT", "list(state='frozen')") as f:
            client.sandboxes.list(state="frozen")
        assert "state" in str(f.err)


def test_events_in_order_taken_up_after_the_last(client: sandkiln.Client) -> None:
    last = 0
    for e in client.events(follow=False):
        last = e["seq"]
    sb = client.sandboxes.create(labels={"for": "py-events"})
    sb.destroy()
    # Another sandbox's event may come between (a process's end, told late).
    got = [(e["seq"], e["type"]) for e in client.events(after=last, follow=False) if e.get("sandbox") == sb.id]
    assert [t for _, t in got] == ["sandbox.created", "sandbox.deleted"]
    assert last < got[0][0] < got[1][0], (last, got)
    # Outside a cluster no event has a node: a node's events are none.
    assert list(client.events(node="n1", follow=False)) == []
    with fails("INVALID_ARGUMENT", "events(type='nothing')"):
        for _ in client.events(type="nothing"):
            break
