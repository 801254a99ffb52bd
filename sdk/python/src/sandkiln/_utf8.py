"""A streaming UTF-8 decoder for one stream that says how many bytes of a
character it holds back: those are not delivered yet, so a handle that
resumes asks for them again."""

from __future__ import annotations

import codecs


class StreamDecoder:
    """Decodes one stream's bytes across chunks, invalid bytes as U+FFFD;
    flush() it at a gap or at the stream's end."""

    def __init__(self) -> None:
        self._d = codecs.getincrementaldecoder("utf-8")(errors="replace")

    @property
    def held(self) -> int:
        """Bytes of a character not complete yet at the end of what came."""
        return len(self._d.getstate()[0])

    def decode(self, b: bytes) -> str:
        return self._d.decode(b, final=False)

    def flush(self) -> str:
        """Ends the stream here: a character still held can never complete,
        and is one U+FFFD."""
        text = self._d.decode(b"", final=True)
        self._d.reset()
        return text
