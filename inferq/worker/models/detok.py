"""Turning generated token ids into text deltas, and stop strings.

With a fast tokenizer, ``tokenizers``' own ``DecodeStream`` does this in Rust. Otherwise, since
decoding all generated ids at every step costs O(length) per token, as in vLLM and TGI only a
short window is decoded: the text of ``ids[prefix:]`` minus the text of
``ids[prefix:read]`` is what the new tokens add. The window starts inside the prompt so that
tokenizers that render a leading space depending on the previous token (SentencePiece) decode
the first generated word correctly. A delta that ends in U+FFFD is an incomplete UTF-8
sequence (a multi-byte character split over tokens): it is held until the next token.

Stop strings: text that could still turn out to be the start of a stop string (an end of the
text that is a prefix of one) is held back; when a stop string appears, the text is cut before
it and the generation ends with finish reason ``stop``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

PREFIX_WINDOW = 5
REPLACEMENT = "\ufffd"


def decode_stream(backend: Any, prompt_ids: Sequence[int]) -> Any | None:
    """``tokenizers``' own incremental decoder (Rust, ~1 us a token) primed with the end of
    the prompt, when the tokenizer is a fast one and the library has it; else None."""
    if backend is None:
        return None
    try:
        from tokenizers.decoders import DecodeStream

        return DecodeStream(ids=list(prompt_ids[-PREFIX_WINDOW:]), skip_special_tokens=True)
    except (ImportError, TypeError):
        return None


class Detokenizer:
    def __init__(self, decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int],
                 stop: Sequence[str] = (), *, backend: Any = None) -> None:
        self._decode = decode
        self._backend = backend
        self._stream = decode_stream(backend, prompt_ids)
        self._held: list[int] = []
        self._ids: list[int] = list(prompt_ids[-PREFIX_WINDOW:])
        self._prefix = 0
        self._read = len(self._ids)
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        #: All text produced so far (cut before a stop string once one is found).
        self.text = ""
        #: How much of ``text`` has been handed out as deltas.
        self.emitted = 0
        self.stopped = False

    def add(self, token: int) -> None:
        """Account for one more generated token (after ``stopped``, nothing changes)."""
        if self.stopped:
            return
        if self._stream is not None:
            piece = self._stream.step(self._backend, token)
            if piece is None:
                self._held.append(token)  # part of a character still incomplete
            else:
                self._held.clear()
                self._append(piece)
            return
        self._ids.append(token)
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        new_text = self._decode(self._ids[self._prefix:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return
        added = new_text[len(prefix_text):]
        self._prefix, self._read = self._read, len(self._ids)
        start = max(0, len(self.text) - self._hold)
        self.text += added
        if self._stop:
            self._check_stop(start)

    def flush(self) -> None:
        """At the end of a generation: take the text of tokens still held (an incomplete
        character decodes as U+FFFD, as a full decode would render it)."""
        if self._stream is not None:
            if self._held and not self.stopped:
                self._append(self._decode(self._held))
                self._held.clear()
            return
        if self.stopped or self._read == len(self._ids):
            return
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        new_text = self._decode(self._ids[self._prefix:])
        self._prefix, self._read = self._read, len(self._ids)
        if len(new_text) > len(prefix_text):
            start = max(0, len(self.text) - self._hold)
            self.text += new_text[len(prefix_text):]
            if self._stop:
                self._check_stop(start)

    def _append(self, piece: str) -> None:
        start = max(0, len(self.text) - self._hold)
        self.text += piece
        if self._stop:
            self._check_stop(start)

    def _partial_stop(self) -> int:
        """Length of the longest end of the text that begins some stop string."""
        longest = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def _check_stop(self, start: int) -> None:
        hits = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def delta(self, final: bool = False) -> str:
        """The text not handed out yet that can no longer change (all of it when ``final``)."""
        end = len(self.text)
        if not final and not self.stopped and self._stop:
            end = max(self.emitted, end - self._partial_stop())
        out = self.text[self.emitted:end]
        self.emitted = end
        return out
