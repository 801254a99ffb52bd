"""The nodes of kilnd's cluster (kilnd --cluster): listed, described,
drained and undrained. Any node answers for all of them."""

from __future__ import annotations

import builtins
from typing import cast

from ._errors import error
from ._http import Transport, segment
from ._types import NodeInfo


def _node_path(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise error("INVALID_ARGUMENT", "nodes: a node's name is needed")
    return "/nodes/" + segment(name)


class AsyncNodes:
    """The nodes of kilnd's cluster. A kilnd in no cluster refuses these
    calls, FAILED_PRECONDITION."""

    def __init__(self, t: Transport) -> None:
        self._t = t

    async def list(self, *, timeout: float | None = None) -> builtins.list[NodeInfo]:
        """The nodes by name, each as its last heartbeat told: state,
        labels, capacity and load; self on the node that answered."""
        return cast("builtins.list[NodeInfo]", await self._t.call("GET", "/nodes", idempotent=True, timeout=timeout) or [])

    async def get(self, name: str, *, timeout: float | None = None) -> NodeInfo:
        """A node by name; NOT_FOUND if the cluster has none of that name."""
        return cast(NodeInfo, await self._t.call("GET", _node_path(name), idempotent=True, timeout=timeout))

    async def drain(self, name: str, *, move_stopped: bool = False, timeout: float | None = None) -> NodeInfo:
        """Places no new sandbox on the node, as kubectl cordon does: its
        sandboxes run on and are served as before; creates go to the other
        nodes (one naming it is FAILED_PRECONDITION). Gives the node,
        draining. Draining twice changes nothing, so a lost answer is
        UNAVAILABLE, to be asked again. With move_stopped, the node also
        moves each of its stopped sandboxes to another ready node, as a
        snapshot of its files, before it answers: the node's "moved" says
        where each went, or why not and which snapshot holds its files."""
        if move_stopped:
            return cast(NodeInfo, await self._t.call("POST", _node_path(name) + "/drain", json={"move_stopped": True},
                                                     idempotent=False, timeout=timeout))
        return cast(NodeInfo, await self._t.call("POST", _node_path(name) + "/drain", idempotent=True, timeout=timeout))

    async def undrain(self, name: str, *, timeout: float | None = None) -> NodeInfo:
        """Places sandboxes on a drained node again (kubectl uncordon);
        gives the node."""
        return cast(NodeInfo, await self._t.call("DELETE", _node_path(name) + "/drain", idempotent=True, timeout=timeout))
