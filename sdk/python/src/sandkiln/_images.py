"""The OCI images kilnd keeps: listed, pulled, imported from a tar, removed."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from ._errors import error
from ._http import Transport, segment
from ._streams import AsyncByteStream, Source, body_of, left, maybe_await, ndjson, progress_error
from ._types import ImageInfo, ImageProgress


def _image_path(name: str) -> str:
    return "/images/" + "/".join(segment(x) for x in name.split("/"))


class AsyncImages:
    """The OCI images kilnd keeps."""

    def __init__(self, t: Transport) -> None:
        self._t = t

    async def list(self, *, timeout: float | None = None) -> builtins.list[ImageInfo]:
        return cast("builtins.list[ImageInfo]", await self._t.call("GET", "/images", idempotent=True, timeout=timeout) or [])

    async def get(self, name: str, *, timeout: float | None = None) -> ImageInfo:
        return cast(ImageInfo, await self._t.call("GET", _image_path(name), idempotent=True, timeout=timeout))

    async def remove(self, name: str, *, timeout: float | None = None) -> None:
        await self._t.call("DELETE", _image_path(name), idempotent=True, timeout=timeout)

    async def pull(self, ref: str, *, on_progress: Callable[[ImageProgress], object] | None = None,
                   timeout: float | None = None) -> ImageInfo:
        """Pulls an image, telling on_progress of each step; gives the image."""
        async for p in self._progress("POST", "/images/pull", f"pull {ref}", timeout, json={"ref": ref}):
            if on_progress is not None:
                await maybe_await(on_progress(p))
            if p.get("status") == "error":
                raise progress_error(p, f"pull {ref}")
            if p.get("status") == "done" and p.get("images"):
                return p["images"][0]
        raise error("UNAVAILABLE", f"pull {ref}: the answer ended before the image")

    async def import_(self, tar: Source, *, on_progress: Callable[[ImageProgress], object] | None = None,
                      timeout: float | None = None) -> builtins.list[ImageInfo]:
        """Imports the images of a tar as docker save or an OCI image layout
        writes it (for a host without a registry), telling on_progress of
        each line; gives the images imported. A tar kilnd cannot read is
        INVALID_ARGUMENT. (import is Python's keyword: hence the underscore.)"""
        body, length = body_of(tar, "import")
        async for p in self._progress("POST", "/images/import", "import", timeout, body=body, length=length,
                                      content_type="application/x-tar"):
            if on_progress is not None:
                await maybe_await(on_progress(p))
            if p.get("status") == "error":
                raise progress_error(p, "import")
            if p.get("status") == "done":
                return list(p.get("images") or [])
        raise error("UNAVAILABLE", "import: the answer ended before it was done")

    async def _progress(self, method: str, path: str, what: str, timeout: float | None, **kw: Any) -> AsyncIterator[ImageProgress]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        resp = await self._t.fetch(method, path, idempotent=True, unbounded=True, timeout=timeout, **kw)
        async for p in ndjson(AsyncByteStream(resp, what, left(timeout, loop.time() - start)), what):
            yield cast(ImageProgress, p)
