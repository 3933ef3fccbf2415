"""Assembling completion text as tokens arrive: stop strings and what is safe to stream (pure).

A stop string can straddle tokens, so text that might be the start of one is held back until
it is either confirmed harmless or the completion ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TextAssembler:
    stop: list[str]
    text: str = ""  # everything accepted so far (stop string and after removed once matched)
    streamed_chars: int = 0
    stopped: bool = False
    matched: str | None = None  # the stop string that stopped it (the first in the text; the longest there)
    _held_ids: list[int] = field(default_factory=list)

    def add(self, token_id: int | None, segment: str) -> tuple[str, list[int]]:
        """Add one token's text (None: text with no new token, e.g. a detokenizer flush);
        return the (text, ids) that are safe to stream now, possibly empty."""
        if token_id is not None:
            self._held_ids.append(token_id)
        if self.stopped:
            return "", []
        self.text += segment
        hit = self._stop_hit()
        if hit is not None:
            cut, self.matched = hit
            self.text = self.text[:cut]
            self.stopped = True
            return self._release(len(self.text))
        return self._release(len(self.text) - self._holdback())

    def finish(self) -> tuple[str, list[int]]:
        """Everything still held, at the end of the completion."""
        return self._release(len(self.text))

    def _stop_hit(self) -> tuple[int, str] | None:
        """Where the first stop string in the text starts, and which it is."""
        # Only the tail can contain a new match: search from where the longest stop could start.
        window = max((len(s) for s in self.stop), default=0)
        start = max(0, self.streamed_chars - window)
        hits = [(pos, -len(s), s) for s in self.stop if s and (pos := self.text.find(s, start)) >= 0]
        if not hits:
            return None
        pos, _, stop = min(hits)
        return pos, stop

    def _holdback(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(self.text)), 0, -1):
                if self.text.endswith(stop[:size]):
                    longest = max(longest, size)
                    break
        return longest

    def _release(self, upto: int) -> tuple[str, list[int]]:
        upto = max(upto, self.streamed_chars)
        chunk = self.text[self.streamed_chars : upto]
        self.streamed_chars = upto
        if not chunk and not self.stopped and upto < len(self.text):
            return "", []
        ids, self._held_ids = self._held_ids, []
        return chunk, ids
