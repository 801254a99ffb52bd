"""A real kilnd for the tests: built from this repository (or $KILND), on a
state directory of its own and a loopback port it chooses, taking any port
of 127.0.0.1 as its Host (the tests reach it through proxies too)."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def binary() -> str:
    if os.environ.get("KILND"):
        return os.environ["KILND"]
    out = str(REPO / ".cache" / "python-test-kilnd")
    # Static, as the README runs it; go build does nothing when nothing changed.
    subprocess.run(["go", "build", "-o", out, "./cmd/kilnd"], cwd=REPO, env={**os.environ, "CGO_ENABLED": "0"}, check=True)
    return out


class Kilnd:
    """One kilnd: url, token, state; stop() deletes its sandboxes and ends it."""

    def __init__(self) -> None:
        if os.getuid() != 0:
            raise RuntimeError("kilnd needs root")
        self.state = tempfile.mkdtemp(prefix="sandkiln-py-")
        self._log: list[str] = []
        self._proc = subprocess.Popen(
            [binary(), "--state-dir", self.state, "--listen", "127.0.0.1:0", "--allow-host", "127.0.0.1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # A run that ends without its fixtures' teardown (an interrupt, a
        # crash of the runner) still takes its kilnd and sandboxes with it.
        atexit.register(self.kill)
        serving = threading.Event()
        found: list[str] = []

        def read() -> None:
            assert self._proc.stderr is not None
            for line in self._proc.stderr:
                self._log.append(line)
                m = re.search(r'msg="kilnd serving".* listen=(\S+)', line)
                if m and not found:
                    found.append(m.group(1))
                    serving.set()
            serving.set()  # it exited

        threading.Thread(target=read, name="kilnd-log", daemon=True).start()
        if not serving.wait(60) or not found:
            self.kill()
            raise RuntimeError("kilnd did not start:\n" + self.log())
        self.url = "http://" + found[0]
        self.token = Path(self.state, "token").read_text().strip()
        self.socket = os.path.join(self.state, "kilnd.sock")

    def log(self) -> str:
        return "".join(self._log)

    def _api(self, method: str, path: str) -> object:
        req = urllib.request.Request(self.url + path, method=method, headers={"Authorization": "Bearer " + self.token})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def stop(self) -> None:
        """kilnd leaves its sandboxes running when it stops, as it should:
        they are deleted first."""
        try:
            for s in self._api("GET", "/sandboxes") or []:  # type: ignore[union-attr]
                try:
                    self._api("DELETE", f"/sandboxes/{s['id']}?remove_logs=true")
                except OSError:
                    pass
        finally:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            self.kill()

    def kill(self) -> None:
        """Ends kilnd and whatever sandboxes it left, and removes its state."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        _kill_agents(self.state)
        shutil.rmtree(self.state, ignore_errors=True)
        atexit.unregister(self.kill)


def _kill_agents(state: str) -> None:
    """Kills every sandbox kilnd recorded on state: everything in its
    cgroup, then its agent if it is still the process recorded, then removes
    its cgroups, as kilnd's delete would have."""
    root = Path(state, "sandboxes")
    if not root.is_dir():
        return
    for d in root.iterdir():
        try:
            rec = json.loads(Path(d, "sandbox.json").read_text())
        except (OSError, ValueError):
            continue
        sb = rec.get("sandbox") or {}
        pid, started, cgroups = sb.get("pid"), sb.get("started"), sb.get("cgroups") or {}
        if not pid or rec.get("state") == "deleted":
            continue
        if cgroups.get("v2"):
            _kill_cgroup(cgroups["v2"])
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            # Field 22, its start time: not a process that reused the pid.
            if int(stat[stat.rindex(")") + 2:].split()[19]) == started:
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass
        leaves = cgroups.get("leaves")
        v2 = cgroups.get("v2")
        dirs = [cgroups.get("procs"), cgroups.get("memory_procs"), leaves and v2 and os.path.join(v2, "procs"),
                *(cgroups.get("v1") or {}).values(), leaves and v2 and os.path.join(v2, "agent"), v2]
        for x in dirs:
            if x:
                try:
                    os.rmdir(x)
                except OSError:
                    pass


def _kill_cgroup(path: str) -> None:
    try:
        Path(path, "cgroup.kill").write_text("1")
    except OSError:
        return
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            if re.search(r"^populated 0$", Path(path, "cgroup.events").read_text(), re.M):
                return
        except OSError:
            return
        time.sleep(0.01)
