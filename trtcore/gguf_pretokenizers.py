"""Byte-level BPE pre-tokenizers of GGUF files, keyed by ``tokenizer.ggml.pre``, as llama.cpp
reads them (``src/llama-vocab.cpp``: the name -> ``LLAMA_VOCAB_PRE_TYPE_*`` mapping of
``llama_vocab::impl::load`` and the regex lists of ``llm_tokenizer_bpe``).

llama.cpp splits a text with a list of regular expressions applied one after another: each
splits every piece left by the previous one into its matches and the text between them (both
kept); the pieces are then byte-level BPE encoded. That is a Hugging Face ``tokenizers``
``Sequence`` of ``Split(pattern, behavior="isolated")`` pre-tokenizers followed by
``ByteLevel(use_regex=False)``, which is how the models' own ``tokenizer.json`` files spell them.
Where llama.cpp rewrote a model's regex for its own engine (case-insensitive groups, Unicode
classes written as lookaheads) and kept the original in a comment, the original is used here: the
``tokenizers`` library runs it as the model's tokenizer does. DeepSeek's individual digits are
``Digits(individual_digits=True)`` as in DeepSeek's tokenizer.json (llama.cpp's ``deepseek-llm``
list has ``\\p{N}+``; on DeepSeek's vocabulary, which has no multi-digit tokens, both give the
same tokens).

Deliberate differences: ``default`` (and a GGUF without the key) is GPT-2's regex, as
transformers' GGUF converter reads it (llama.cpp's ``default`` list also isolates punctuation and
cuts digit runs in threes); the names llama.cpp handles with hand-written code (``kimi-k2``,
``afmoe``, ``superbpe``) or without byte-level encoding (``gemma4``, ``sarvam-moe``,
``whitespace``, ``granite-embed-multi-311m``), two whose lists were not transcribed (``youtu``,
``granite-embed-multi-97m``: non-ASCII classes, and llama.cpp's lookahead rewrite without its
original) and names llama.cpp does not know fall back to GPT-2's regex with a warning (llama.cpp
refuses an unknown name).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["DEFAULT_BOS_PRE", "IGNORE_MERGES_PRE", "KNOWN_PRE", "byte_level_pre_tokenizer"]

logger = logging.getLogger(__name__)

#: a step of a list: each digit its own piece (tokenizers' ``Digits(individual_digits=True)``)
DIGITS = "<digits>"

# GPT-2's byte-level regex (tokenizers' ByteLevel(use_regex=True); llama.cpp's lists leave out the
# last ``\s+``, which isolated splitting makes a piece of anyway)
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# DeepSeek's CJK run: U+4E00-9FA5, U+0800-4E00, U+AC00-D7FF (escapes: several of these
# characters have look-alikes)
_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# DeepSeek LLM's cased letters (Unicode Lu / Ll / Lt as its tokenizer.json lists them)
_DEEPSEEK_LETTERS = (
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134"
    "\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+"
)
_DEEPSEEK_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
# DeepSeek-V3's: CJK and kana runs, then words, punctuation and spaces
_DEEPSEEK3_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_DEEPSEEK3 = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# BLOOM's (and Poro's, Viking's): a word is any run without whitespace or these stops
_BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"

#: ``tokenizer.ggml.pre`` -> its steps (regular expressions, or :data:`DIGITS`), llama.cpp's lists
_SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"],
        (_LLAMA3,),
    ),
    **dict.fromkeys(["glm4", "chatglm-bpe"], (_LLAMA3,)),  # CHATGLM4: the same regex
    "jais-2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)"
        r"|\s{1,2}(?!\S)|\s{1}",
    ),
    "deepseek-llm": (r"[\r\n]", _DEEPSEEK_LETTERS, _DEEPSEEK_PUNCT, r"\s+$", _DEEPSEEK_CJK, DIGITS),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK, DIGITS),
    **dict.fromkeys(["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"], (r"\p{N}{1,3}", _DEEPSEEK3_KANA, _DEEPSEEK3)),
    "spark2_5": (
        r"\p{N}{1,3}",
        _DEEPSEEK3_KANA,
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
        r"\p{N}",
    ),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    # STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA, MELLUM2: digits, then GPT-2
    **dict.fromkeys(["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"], (DIGITS, _GPT2)),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open", "grok-2"], (_QWEN2,)),
    "qwen35": (_QWEN35,),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "laguna": (r"[^\n]+|[\n]+", _QWEN2),
    **dict.fromkeys(["poro-chat", "bloom", "gpt3-finnish"], (_BLOOM,)),
    "viking": (_BLOOM, r"\p{N}"),
    "tekken": (_TEKKEN,),
    "chameleon": (
        r"<sentinel:[0-9]+>",
        r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        r"([\t\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    ),
    **dict.fromkeys(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], (_GPT4O,)),
    **dict.fromkeys(["tiny_aya", "cohere2moe"], (r"\d{1,3}(?=(?:\d{3})*\b)", _GPT4O)),
    **dict.fromkeys(
        ["bailingmoe", "bailingmoe2", "llada-moe"],
        (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    ),
    "seed-coder": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "exaone-moe": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?"
        r"|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "minicpm5": (
        r"\p{N}{1,3}",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
}
#: names that are GPT-2's regex alone (llama.cpp's GPT2, MPT, OLMO, JAIS, TRILLION and
#: GRANITE_DOCLING; ``default`` and ``gpt2`` as transformers reads them)
_GPT2_PRE = {
    "default", "gpt2", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
    "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4", "mpt", "olmo", "jais", "trillion", "granite-docling",
}  # fmt: skip
#: every name read as llama.cpp reads it
KNOWN_PRE = frozenset(_SPLITS) | frozenset(_GPT2_PRE)

# llama.cpp's LLAMA3 arm sets ignore_merges and add_bos
_LLAMA3_PRE = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"}
#: names llama.cpp encodes with ``ignore_merges``: a pre-token that is a whole vocabulary entry is
#: that one token, merges or not (Meta's Llama-3 tokenizer.json says ``"ignore_merges": true``;
#: transformers' GGUF converter leaves it out; llama.cpp PR #7193)
IGNORE_MERGES_PRE = frozenset(_LLAMA3_PRE | {"tekken", "youtu", "minicpm5", "granite-embed-multi-97m"})
#: names llama.cpp adds BOS for where ``tokenizer.ggml.add_bos_token`` is absent (GGUFs written
#: before the key existed, the original Llama-3-8B-Instruct ones)
DEFAULT_BOS_PRE = frozenset(_LLAMA3_PRE | {"tekken", "chameleon"})


def byte_level_pre_tokenizer(pre: str) -> Any:
    """The ``tokenizers`` pre-tokenizer of a byte-level BPE GGUF whose ``tokenizer.ggml.pre`` is
    ``pre``: GPT-2's ``ByteLevel`` for the GPT-2 names, else a ``Sequence`` of isolated
    ``Split`` (and ``Digits``) steps, then ``ByteLevel(use_regex=False)`` (module docstring). A
    name not in :data:`KNOWN_PRE` logs a warning and gets GPT-2's regex.

    Raises:
        ImportError: the ``tokenizers`` package is missing.
    """
    from tokenizers import Regex, pre_tokenizers

    steps = _SPLITS.get(pre)
    if steps is None:
        if pre not in _GPT2_PRE:
            logger.warning("GGUF pre-tokenizer %r is not known; using GPT-2's byte-level regex (tokens may differ from llama.cpp's)", pre)
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    seq = [
        pre_tokenizers.Digits(individual_digits=True) if step == DIGITS else pre_tokenizers.Split(Regex(step), behavior="isolated") for step in steps
    ]
    return pre_tokenizers.Sequence([*seq, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
