"""trtcore.token_bytes on converted GGUF tokenizers of both kinds: GPT-2 byte-level BPE and
sentencepiece with byte fallback (``tests/test_gguf.py``'s synthetic vocabularies).

The reference is the tokenizer's own encoding: the bytes of the tokens of a text, joined,
are that text's UTF-8, including characters the vocabulary splits over several tokens (and,
for sentencepiece, its ``<0xNN>`` byte tokens). A token's text is never the replacement
character, and tokens of different bytes never share a text.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_gguf import write_synthetic_gguf
from tokenizers import Tokenizer

from trtcore.token_bytes import token_bytes, token_text

#: characters the tiny vocabularies never saw (emoji, CJK outside the corpus): split into bytes
TEXT = "The theory 🦙 of naïve 你好 words, ∑ and ✓ done"


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Tokenizer]:
    from trtcore.gguf_convert import convert_gguf

    root = tmp_path_factory.mktemp(f"tok-{request.param}")
    write_synthetic_gguf(root / "m.gguf", "llama", tokenizer=request.param, seed=1)
    out = Path(convert_gguf(root / "m.gguf", root / "hf", progress=False))
    return request.param, Tokenizer.from_file(str(out / "tokenizer.json"))


def test_token_bytes_join_to_the_text(tokenizer: tuple[str, Tokenizer]) -> None:
    kind, tok = tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    joined = b"".join(token_bytes(tok, i) for i in ids)
    # sentencepiece prepends "▁" to the first word: one leading space
    want = TEXT.encode() if kind == "gpt2" else b" " + TEXT.encode()
    assert joined == want
    partial = [i for i in ids if "\ufffd" in tok.decode([i])]
    assert partial, "the text should split a character over tokens"
    for i in partial:
        text = token_text(tok, i)
        assert "\ufffd" not in text and text.startswith("bytes:\\x")


def test_token_texts_are_never_lossy_and_never_collide(tokenizer: tuple[str, Tokenizer]) -> None:
    _, tok = tokenizer
    texts: dict[str, bytes] = {}
    for i in range(tok.get_vocab_size()):
        raw, text = token_bytes(tok, i), token_text(tok, i)
        assert "\ufffd" not in text, (i, tok.id_to_token(i))
        assert texts.setdefault(text, raw) == raw, (i, text)
    assert token_text(tok, tok.token_to_id("<think>")) == "<think>"  # an added token is its text


def test_bench_serve_random_prompts_have_the_asked_length(tokenizer: tuple[str, Tokenizer]) -> None:
    """``trtcore bench serve --tokenizer``: each random prompt encodes back (the tokenizer's own
    encoding) to ``--input-len`` tokens, and its recorded length is that count."""
    import numpy as np

    from trtcore.bench_serve import random_prompts

    _, tok = tokenizer
    prompts = random_prompts(12, 16, 8, np.random.default_rng(0), tok)
    lens = [len(tok.encode(p.text, add_special_tokens=False).ids) for p in prompts]
    assert [p.prompt_len for p in prompts] == lens
    assert lens == [16] * 12
