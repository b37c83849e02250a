"""trtcore.runtime.detokenizer (incremental detokenization) against full decoding, on converted
GGUF tokenizers of both kinds (GPT-2 byte-level BPE, sentencepiece with byte fallback; the
vocabularies of tests/test_gguf.py) and on a hand-made character-level tokenizer.

The reference is the tokenizer's own ``decode`` of all the ids at once: after every token, the
deltas given so far, joined, are a prefix of it that lacks at most the characters of tokens
that end inside a character; after the last token (``final=True``) they equal it exactly.
Random id sequences (special tokens, byte tokens that split characters included) and the ids
of real text cut anywhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_gguf import write_synthetic_gguf
from tokenizers import Tokenizer

from trtcore.runtime.detokenizer import IncrementalDetokenizer

TEXT = "The theory 🦙 of naïve 你好 words, ∑ and ✓ done. The end"


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    from trtcore.gguf_convert import convert_gguf

    root = tmp_path_factory.mktemp(f"detok-{request.param}")
    write_synthetic_gguf(root / "m.gguf", "llama", tokenizer=request.param, seed=1)
    out = Path(convert_gguf(root / "m.gguf", root / "hf", progress=False))
    return Tokenizer.from_file(str(out / "tokenizer.json"))


def _monotone(tok: Tokenizer, ids: list[int]) -> bool:
    """Whether each prefix's full decode (without a trailing U+FFFD) begins the next one's: not
    so where sentencepiece's byte fallback turns a run of bytes that is not UTF-8 into one
    U+FFFD per byte (the detokenizer's documented exception)."""
    texts = [tok.decode(ids[:n], skip_special_tokens=True).rstrip("\ufffd") for n in range(1, len(ids) + 1)]
    return all(b.startswith(a) for a, b in zip(texts, texts[1:]))


def _check(tok: Tokenizer, ids: list[int]) -> bool:
    """Stream ``ids``; returns whether the strict contract applied (a monotone decode)."""
    d = IncrementalDetokenizer(tok)
    strict = _monotone(tok, ids)
    shown = ""
    for n, t in enumerate(ids, start=1):
        shown += d.step(t, final=n == len(ids))
        assert d.num_chars == len(shown) and d.text == shown
        if strict:
            assert tok.decode(ids[:n], skip_special_tokens=True).startswith(shown), (ids[:n], shown)
    full = tok.decode(ids, skip_special_tokens=True)
    if strict:
        assert shown == full
    elif "\ufffd" not in full:  # a prefix took text back, but the whole run is valid UTF-8
        assert shown == full
    else:  # text given is kept; every token is accounted for at the end
        assert len(shown) >= len(full.rstrip("\ufffd")) - len(ids)
    return strict


def test_deltas_join_to_the_full_decode_of_text_cut_anywhere(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(TEXT).ids
    assert len(ids) > 10
    for cut in range(1, len(ids) + 1):
        _check(tokenizer, ids[:cut])


def test_deltas_join_to_the_full_decode_of_random_ids(tokenizer: Tokenizer) -> None:
    rng = np.random.default_rng()
    vocab = tokenizer.get_vocab_size()
    strict = [_check(tokenizer, rng.integers(0, vocab, size=int(rng.integers(1, 40))).tolist()) for _ in range(100)]
    assert sum(strict) >= 10  # most sequences: the strict contract (byte-token runs are frequent in the tiny vocabulary)


def test_a_token_inside_a_character_gives_nothing_until_it_completes(tokenizer: Tokenizer) -> None:
    """A character the vocabulary splits into byte tokens: no U+FFFD is ever shown mid-stream."""
    ids = tokenizer.encode("a 🦙 b").ids
    d = IncrementalDetokenizer(tokenizer)
    pieces = [d.step(t) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    # ending in the middle of the character: the last token releases what a full decode shows
    cut = next(n for n in range(1, len(ids)) if tokenizer.decode(ids[:n]).endswith("\ufffd"))
    d = IncrementalDetokenizer(tokenizer)
    text = "".join(d.step(t, final=n == cut) for n, t in enumerate(ids[:cut], start=1))
    assert text == tokenizer.decode(ids[:cut], skip_special_tokens=True) and text.endswith("\ufffd")


def test_without_a_tokenizer_every_delta_is_empty() -> None:
    d = IncrementalDetokenizer(None)
    assert [d.step(t) for t in (1, 2, 3)] == ["", "", ""] and d.token_ids == [1, 2, 3]
