"""Incremental detokenization of one request's output tokens: each new token's text delta in
time independent of the output's length.

Decoding the whole output again after every token (``tokenizer.decode(all_ids)``) costs
O(n) per token, O(n^2) per request: about 5.6 ms per token at 4,000 tokens with SmolLM2's
tokenizer, more than a decode step of the GPU for one sequence. :class:`IncrementalDetokenizer`
uses the ``tokenizers`` library's own streaming decoder (``tokenizers.decoders.DecodeStream``,
tokenizers >= 0.21, else the windowed method below: it decodes a short window of the latest tokens and returns the new text
once it forms whole UTF-8 characters), about 3 us per token, the role vLLM's
``IncrementalDetokenizer`` (prefix / read offsets) plays there.

Contract (tested against full decoding): the deltas of a request's tokens, joined, equal
``tokenizer.decode(ids, skip_special_tokens=True)`` of all of them. A token that ends inside a
multi-byte character gives ``""`` until the character completes; on the request's last token
(``final=True``) whatever is still held comes out as the full decode has it (with U+FFFD for
an incomplete character), computed once by a full decode.

One exception, where no stream can agree with full decoding: sentencepiece's byte fallback
decodes a run of byte tokens that is not valid UTF-8 as one U+FFFD per byte, so a full decode
can take back text that a shorter prefix decoded to (``<0x10><0x57>`` is ``"\x10W"``, with
``<0xF0>`` after it ``"\ufffd" * 3``). Text once given is never taken back: the stream keeps
``"\x10W"`` and gives the held tokens' own decode (``"\ufffd"``) at the end.
"""

from __future__ import annotations

from typing import Any

__all__ = ["IncrementalDetokenizer"]


#: tokens of context before the unread ones in the windowed fallback (vLLM's prefix offset
#: starts 5 tokens back: enough for a tokenizer's leading-space and merge rules)
WINDOW = 5


class IncrementalDetokenizer:
    """Text deltas of one request's output tokens (module docstring).

    ``tokenizers.decoders.DecodeStream`` does the work; where it refuses a token (it raises
    when the text decoded so far is no longer a prefix, the byte-fallback exception of the
    module docstring), the request goes on with vLLM's windowed method: decode the last few
    tokens with and without the unread ones, and give the difference once it ends in a whole
    character (two small decodes per token instead of one stream step).

    Args:
        tokenizer: a ``tokenizers.Tokenizer``, or None (every delta is ``""``).
        skip_special_tokens: as ``Tokenizer.decode``'s (default True, as vLLM's).

    Attributes:
        token_ids: the tokens taken so far.
        num_chars: characters of text given out so far.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = bool(skip_special_tokens)
        self.token_ids: list[int] = []
        self._chunks: list[str] = []
        self.num_chars = 0
        self._read = 0  # the first token whose text is not given out yet
        self._prefix = 0  # the windowed fallback's context start
        self._stream: Any = None
        if tokenizer is not None:
            try:
                from tokenizers.decoders import DecodeStream
            except ImportError:  # tokenizers < 0.21: the windowed method throughout
                return
            self._stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)

    @property
    def text(self) -> str:
        """The text given out so far (joined deltas)."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def step(self, token_id: int, final: bool = False) -> str:
        """Take one token; return the text it adds (``""`` while it ends inside a character).

        Args:
            token_id: the next output token.
            final: the request ends with this token: release what is held (module docstring).
        """
        t = int(token_id)
        self.token_ids.append(t)
        if self.tokenizer is None:
            return ""
        chunk: str | None
        if self._stream is not None:
            try:
                chunk = self._stream.step(self.tokenizer, t)
            except Exception:  # noqa: BLE001 - DecodeStream raises a plain Exception on a taken-back prefix
                self._stream = None
                self._prefix = max(0, self._read - WINDOW)
                chunk = self._window_step()
        else:
            chunk = self._window_step()
        if chunk is None:
            if not final:
                return ""
            chunk = self._flush()
        self._read = len(self.token_ids)
        if chunk:
            self._chunks.append(chunk)
            self.num_chars += len(chunk)
        return chunk

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens))

    def _window_step(self) -> str | None:
        """vLLM's ``detokenize_incrementally`` on text: the unread tokens' text, or None while
        it ends inside a character."""
        ids = self.token_ids
        before = self._decode(ids[self._prefix : self._read])
        after = self._decode(ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix = self._read
            return after[len(before) :]
        return None

    def _flush(self) -> str:
        """What a full decode has past the text given out (the held tokens' text, U+FFFD for
        an incomplete character); the held tokens' own decode where the full decode took
        text back (module docstring)."""
        full = self._decode(self.token_ids)
        shown = self.text
        if full.startswith(shown):
            return full[len(shown) :]
        return self._decode(self.token_ids[self._read :])
