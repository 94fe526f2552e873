"""Incremental detokenization with stop strings.

Byte-level BPE can split one character over several tokens, so text is released only once the
decoded tail no longer ends in U+FFFD, and never more than the stop strings allow: the longest
prefix of a stop string at the end of the text is held back until it either completes (the
request stops; the stop string is not returned) or diverges (the text is released).
"""
from __future__ import annotations

from ..models.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: list[str]):
        self.tok = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.text = ""  # decoded text so far (complete characters only)
        self.emitted = 0  # characters of self.text already handed out
        self._prefix = 0  # token offsets of the decode window
        self._read = 0
        self.stopped_by: str | None = None

    def add(self, new_ids: list[int]) -> str:
        """Adds tokens; returns the text that became final. Sets stopped_by on a stop string."""
        self.ids.extend(new_ids)
        self._advance(allow_partial=False)
        return self._release()

    def _advance(self, allow_partial: bool) -> None:
        # Decoding from a few tokens back keeps leading spaces and merges right at the boundary.
        prefix_text = self.tok.decode(self.ids[self._prefix:self._read])
        full = self.tok.decode(self.ids[self._prefix:])
        if len(full) > len(prefix_text) and (allow_partial or not full.endswith(_REPLACEMENT)):
            self.text += full[len(prefix_text):]
            self._prefix, self._read = self._read, len(self.ids)

    def _release(self) -> str:
        if self.stop:
            start = max(0, self.emitted - max(len(s) for s in self.stop))
            hits = [(self.text.find(s, start), s) for s in self.stop]
            hits = [(i, s) for i, s in hits if i >= 0]
            if hits:
                i, s = min(hits)
                self.stopped_by = s
                self.text = self.text[:i]
                return self._take(len(self.text))
            return self._take(len(self.text) - self._held_back())
        return self._take(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _take(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        out = self.text[self.emitted:upto]
        self.emitted = upto
        return out

    def flush(self) -> str:
        """At the end of a request: everything not yet released (held-back stop prefixes too)."""
        if self.stopped_by is None:
            self._advance(allow_partial=True)
        return self._take(len(self.text))
