"""The raw bytes of a vocabulary token, and a text for it that is never lossy.

A byte-level BPE token can hold part of a UTF-8 character (an emoji is often split over two
tokens). Decoding it alone gives ``"\\ufffd"``, so two different tokens would show the same
text. :func:`token_bytes` reads the token's bytes from the vocabulary instead. It follows the
tokenizer's decoder (``tokenizer.json``):
- ``ByteLevel``: GPT-2's byte-to-character table, inverted;
- sentencepiece's ``ByteFallback``: ``<0xNN>`` tokens are byte NN;
- ``Metaspace`` / ``Replace``: ``"▁"`` is a space.
Added (special) tokens are their own text.

:func:`token_text` is the token's text where its bytes are valid UTF-8. Otherwise it is
``"bytes:\\xNN..."``, OpenAI's spelling for such tokens in logprobs.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

__all__ = ["bytes_to_unicode", "token_bytes", "token_text"]

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies
    (Radford et al. 2019, the released ``encoder.py``)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def _decoder_types(decoder: dict[str, Any] | None) -> set[str]:
    if not decoder:
        return set()
    if decoder.get("type") == "Sequence":
        return {t for d in decoder.get("decoders", []) for t in _decoder_types(d)}
    return {str(decoder.get("type"))}


@functools.lru_cache(maxsize=8)
def _kind(tokenizer: Any) -> tuple[frozenset[str], frozenset[int]]:
    """(decoder types, added-token ids) of a ``tokenizers.Tokenizer``."""
    decoder = json.loads(tokenizer.to_str()).get("decoder")
    return frozenset(_decoder_types(decoder)), frozenset(tokenizer.get_added_tokens_decoder())


def token_bytes(tokenizer: Any, token_id: int) -> bytes:
    """The bytes token ``token_id`` stands for (module docstring); the UTF-8 of its lone
    decoding when the vocabulary has no spelling for it (an unknown decoder)."""
    piece = tokenizer.id_to_token(int(token_id))
    types, added = _kind(tokenizer)
    if piece is None:
        return b""
    if int(token_id) in added:
        return piece.encode()
    if "ByteLevel" in types:
        table = _unicode_to_byte()
        if all(c in table for c in piece):
            return bytes(table[c] for c in piece)
    if "ByteFallback" in types and (m := _BYTE_TOKEN.match(piece)):
        return bytes([int(m.group(1), 16)])
    if types & {"Metaspace", "Replace", "ByteFallback"}:
        return piece.replace("▁", " ").encode()
    return str(tokenizer.decode([int(token_id)], skip_special_tokens=False)).encode()


def token_text(tokenizer: Any, token_id: int) -> str:
    """The token's text if its bytes are UTF-8, else ``"bytes:\\xNN..."`` (never the
    replacement character)."""
    raw = token_bytes(tokenizer, token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
