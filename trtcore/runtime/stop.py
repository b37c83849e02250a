"""Stop strings: where a completion's text ends, and how much of it a stream may show yet.

vLLM's semantics (``SamplingParams.stop``, ``vllm/v1/engine/detokenizer.py``:
``check_stop_strings``): once the text generated so far contains one of the stop strings,
the request finishes with ``finish_reason="stop"`` and ``stop_reason`` = that string, and the
output text ends right before it (``include_stop_str_in_output``: right after it). The earliest
occurrence wins (on a tie, the string listed first). Stop strings are not looked for until
more than ``min_tokens`` tokens were generated (vLLM skips the check while
``len(output_token_ids) <= min_tokens``).

Streaming: a piece of text that may still become the start of a stop string is held back
until it either completes one (then it is never shown) or cannot any more. What is held
back is exactly the longest suffix of the text that is a proper prefix of some stop
string, so a stream never shows a piece of a stop string that later completes, and shows
everything else as soon as it can.
"""

from __future__ import annotations

from collections.abc import Sequence

from trtcore.errors import InvalidRequestError

__all__ = ["StopStringMatcher"]


class StopStringMatcher:
    """Finds stop strings in one request's growing completion text.

    Args:
        stop: the stop strings (non-empty), one string, or None for none (as
            :attr:`SamplingParams.stop <trtcore.runtime.sampling.SamplingParams>`).
        min_tokens: no match while at most this many tokens were generated.
        include: the matched stop string is the end of the text (vLLM's
            ``include_stop_str_in_output``); else the text ends before it.

    Attributes:
        shown: the text released so far (a prefix of every later text, without any piece of
            a stop string that completed).
        stop_reason: the matched stop string once one matched, else None.

    Raises:
        InvalidRequestError: an empty stop string or a negative ``min_tokens``.
    """

    def __init__(self, stop: str | Sequence[str] | None, min_tokens: int = 0, include: bool = False) -> None:
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if min_tokens < 0:
            raise InvalidRequestError(f"min_tokens must be >= 0, got {min_tokens}")
        self.min_tokens = int(min_tokens)
        self.include = bool(include)
        self._shown: list[str] = []
        self._num_seen = 0  # characters of the text taken so far (shown + pending)
        self._pending = ""  # taken, not shown: what may still begin a stop string
        self.stop_reason: str | None = None

    @property
    def shown(self) -> str:
        """The text released so far."""
        if len(self._shown) > 1:
            self._shown = ["".join(self._shown)]
        return self._shown[0] if self._shown else ""

    @property
    def stopped(self) -> bool:
        """True once a stop string matched (later calls return nothing)."""
        return self.stop_reason is not None

    def _held(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def update(self, text: str, num_tokens: int, final: bool = False) -> tuple[str, str | None]:
        """:meth:`feed` for the whole completion text so far (``text`` extends the text of
        the last call)."""
        delta = text[self._num_seen :]
        return self.feed(delta, num_tokens, final)

    def feed(self, delta: str, num_tokens: int, final: bool = False) -> tuple[str, str | None]:
        """Take the text a new token added; return what to show now. The work is bounded by
        the text held back plus ``delta``, not by the completion's length.

        Args:
            delta: the text the token added (possibly empty).
            num_tokens: output tokens generated so far.
            final: the request ends with this token for another reason (EOS, length):
                release whatever is held back.

        Returns:
            ``(delta, stop)``: the text to append to what was shown, and the stop string
            that matched with this token (then ``shown`` is the final text) or None.
        """
        if self.stop_reason is not None:  # stopped
            return "", None
        self._num_seen += len(delta)
        if not self.stop:  # nothing to hold back: the delta as it comes
            if delta:
                self._shown.append(delta)
            return delta, None
        pending = self._pending + delta
        # a stop string starts in the text not shown yet: what was shown held no piece of one
        if self.stop and num_tokens > self.min_tokens:
            hits = [(i, k) for k, s in enumerate(self.stop) if (i := pending.find(s)) >= 0]
            if hits:
                idx, k = min(hits)
                out = pending[: idx + len(self.stop[k])] if self.include else pending[:idx]
                self._shown.append(out)
                self._pending = ""
                self.stop_reason = self.stop[k]
                return out, self.stop_reason
        end = len(pending) if final else len(pending) - self._held(pending)
        out, self._pending = pending[:end], pending[end:]
        if out:
            self._shown.append(out)
        return out, None
