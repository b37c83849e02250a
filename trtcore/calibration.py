"""Intermediate tensors of a model on calibration text: the statistics trtcore's calibrated
quantizers (:mod:`trtcore.awq`) and ``trtcore check --bisect`` read.

:func:`capture_prefill` runs one prefill of an :class:`~trtcore.llm.LLM` and returns the
named network tensors: on the reference backend (no GPU) any tensor, read at run time (the
reference evaluator's ``capture=``); on a GPU backend the tensors the LLM was built to keep
(``LLM(..., capture=[...])``, extra engine outputs). :func:`calibration_token_ids` cuts a text
into token sequences. :data:`DEFAULT_CALIBRATION` is about 3,700 words of plain English written
for trtcore (``trtcore/data/calibration.txt``: prose, letters, instructions, dialogue, numbers, a
little code), distinct from the passages the quality benchmark scores.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["DEFAULT_CALIBRATION", "calibration_token_ids", "capture_calibration", "capture_prefill", "network_tensor_names"]

#: the calibration text ``trtcore quantize --method awq`` uses by default
DEFAULT_CALIBRATION = Path(__file__).parent / "data" / "calibration.txt"

#: calibration tokens asked for by default (``--calibration-tokens``); :data:`DEFAULT_CALIBRATION`
#: gives 4,423 with SmolLM2's tokenizer; a tokenizer that gives fewer calibrates on all of it
#: silently. On the default model AWQ 4-bit group 64 scored 3.6-3.8% below bfloat16 on three
#: passages with 4,096 tokens against 4.1-5.4% with the earlier 433
#: (bench/results/cpu-2026-12-05-calibration-size); AWQ's search takes about twice as long, and
#: the captured inputs are held in float32 (Llama-3-8B: about 3.4 MB a token)
DEFAULT_CALIBRATION_TOKENS = 4096


class _CaptureFirstRun:
    """An executor that captures ``names`` on its first :meth:`run` (the prefill) and is the
    wrapped executor otherwise. ``at_run_time``: the reference executor, told what to capture
    per run; else an engine built to return them as outputs."""

    def __init__(self, inner: Any, names: Sequence[str], at_run_time: bool):
        self.inner = inner
        self.names = list(names)
        self.at_run_time = at_run_time
        self.captured: dict[str, np.ndarray] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, feeds: Any, capture: Any = ()) -> Any:
        if not self.at_run_time:  # an engine built with them as outputs: they come with every run
            out = self.inner.run(feeds)
        else:
            out = self.inner.run(feeds, capture=self.names if self.captured is None else capture)
        if self.captured is None:
            self.captured = {n: np.asarray(self.inner.to_host(out[n], n)) for n in self.names}
        return out


def network_tensor_names(llm: Any) -> set[str]:
    """The tensor names :func:`capture_prefill` can read from ``llm``: every layer output of
    the reference backend's network; on another backend, those the LLM was built to keep
    (its ``capture=``).
    """
    if _on_reference(llm):
        from .builder import tensor_names

        return tensor_names(llm.executor.network)
    return set(getattr(llm, "captured", ()))


def _on_reference(llm: Any) -> bool:
    from .runtime.reference_executor import ReferenceExecutor

    return isinstance(getattr(llm, "executor", None), ReferenceExecutor)


def capture_prefill(llm: Any, token_ids: Sequence[int], names: Sequence[str]) -> dict[str, np.ndarray]:
    """The tensors ``names`` of the prefill of ``token_ids`` (one request, one new token).

    Args:
        llm: an :class:`~trtcore.llm.LLM` with no requests: on ``backend="reference"``
            (any tensor), or on a GPU backend built with ``capture=`` naming ``names``.
        token_ids: the prompt (at least one id; with the paged cache at most the plan's
            ``max_num_tokens``, so that the prefill is one step).
        names: network tensor names (e.g. ``"model.layers.0.input_layernorm"``).

    Returns:
        ``{name: array}`` as the network holds them (the prompt's positions along the token
        axis, the network's dtype).

    Raises:
        InvalidArgumentError: an empty or too long prompt, or a name that
            :func:`network_tensor_names` lacks (all of them listed; on a GPU backend: build
            the LLM with ``capture=`` naming them).
    """
    from .runtime.generate import HostRunner
    from .runtime.sampling import SamplingParams

    if not token_ids:
        raise InvalidArgumentError("capture_prefill needs a prompt of at least one token")
    if llm.kv_cache == "paged" and len(token_ids) > llm.plan.max_num_tokens:  # chunked prefill
        raise InvalidArgumentError(
            f"capture_prefill: a prompt of {len(token_ids)} tokens is more than one step's max_num_tokens {llm.plan.max_num_tokens}"
        )
    missing = sorted(set(names) - network_tensor_names(llm))
    if missing:
        hint = "" if _on_reference(llm) else f" kept by this {llm.backend} engine (build the LLM with capture= naming them)"
        raise InvalidArgumentError(
            f"no tensor named {missing[:4]}{' ...' if len(missing) > 4 else ''} in the {llm.config.architecture} network{hint}"
        )
    runner = llm.engine.runner
    if not isinstance(runner, HostRunner):
        raise InvalidArgumentError(f"capture_prefill needs an LLM that runs on host arrays, got {type(runner).__name__} (build it with capture=)")
    capturing = _CaptureFirstRun(runner.executor, names, at_run_time=_on_reference(llm))
    runner.executor = capturing  # type: ignore[assignment]  # the same run/to_host, plus the capture
    try:
        [out] = llm.generate([[int(t) for t in token_ids]], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False)
    finally:
        runner.executor = capturing.inner
    if out.error is not None:  # refused in a list, not raised: an empty capture would hide it
        raise InvalidArgumentError(f"capture_prefill: {out.error}")
    return capturing.captured or {}


def calibration_file(calibration: str | os.PathLike[str] | None) -> Path:
    """The calibration text file: ``calibration``, or None for the shipped
    :data:`DEFAULT_CALIBRATION`.

    Raises:
        InvalidArgumentError: the path does not exist, is a directory or is not a regular file
            (a device such as /dev/null, a FIFO).
    """
    path = Path(calibration) if calibration is not None else DEFAULT_CALIBRATION
    if path.is_dir():
        raise InvalidArgumentError(f"calibration file {str(path)!r} is a directory; give a UTF-8 text file")
    if path.exists() and not path.is_file():
        raise InvalidArgumentError(f"calibration file {str(path)!r} is not a regular file (a device or a pipe); give a UTF-8 text file")
    if not path.is_file():
        raise InvalidArgumentError(f"calibration file {str(path)!r} does not exist")
    return path


def calibration_text(calibration: str | os.PathLike[str] | None, max_chars: int | None = None) -> str:
    """The text of :func:`calibration_file`'s file, read as UTF-8: all of it, or its first
    ``max_chars`` characters (a calibration takes some hundred tokens: a file of gigabytes is
    not read whole).

    Raises:
        InvalidArgumentError: what :func:`calibration_file` raises, or the text read is not UTF-8
            (naming the byte offset), or the file holds only white space.
    """
    path = calibration_file(calibration)
    try:
        with path.open(encoding="utf-8") as f:
            text = f.read() if max_chars is None else f.read(max_chars)
    except UnicodeDecodeError as exc:
        # the decoder's offset counts from its current chunk: find the byte in the file
        with path.open("rb") as fb:
            raw = fb.read(-1 if max_chars is None else 4 * max_chars + 4)
        try:
            raw.decode("utf-8")
            start, reason = exc.start, exc.reason
        except UnicodeDecodeError as whole:
            start, reason = whole.start, whole.reason
        raise InvalidArgumentError(f"calibration file {str(path)!r} is not UTF-8 text (byte {start}: {reason}); give a UTF-8 text file") from None
    if not text.strip() and (max_chars is None or len(text) < max_chars):  # a cut text may go on
        raise InvalidArgumentError(
            f"calibration file {str(path)!r} is empty; give a UTF-8 text file with some paragraphs of the model's kind of text"
        )
    return text


#: characters of calibration text read first per token asked (English runs about 4 per token);
#: where they give too few tokens, four times as many, until the file ends
CHARS_PER_TOKEN = 16


def calibration_ids(llm: Any, calibration: str | os.PathLike[str] | None, num_tokens: int) -> list[int]:
    """The first ``num_tokens`` token ids of the calibration text (fewer where the file is
    shorter: a warning says how many, except for :data:`DEFAULT_CALIBRATION` at
    :data:`DEFAULT_CALIBRATION_TOKENS`, both defaults), tokenized by ``llm``'s tokenizer; only as
    much of the file is read as gives them (:data:`CHARS_PER_TOKEN`).

    Raises:
        InvalidArgumentError: what :func:`calibration_text` raises, or the text gives no token.
    """
    chars = max(4096, CHARS_PER_TOKEN * num_tokens)
    while True:
        text = calibration_text(calibration, max_chars=chars)
        whole = len(text) < chars  # the file ended within the read
        ids = [int(t) for t in llm.encode(text)]
        # a cut text's last token may be a word's start: one spare token beyond those used; a cut
        # text of only white space reads on (the file is refused as empty if it stays so)
        if whole or (len(ids) > num_tokens and text.strip()):
            break
        chars *= 4
    if not ids:
        raise InvalidArgumentError("the calibration text gives no token")
    if len(ids) < num_tokens and not (calibration is None and num_tokens == DEFAULT_CALIBRATION_TOKENS):  # both defaults: all of it
        warnings.warn(
            f"the calibration text gives {len(ids)} tokens, fewer than the {num_tokens} asked (--calibration-tokens); calibrating on those",
            stacklevel=2,
        )
    return ids[:num_tokens]


def calibration_token_ids(
    llm: Any, calibration: str | os.PathLike[str] | None, num_tokens: int = DEFAULT_CALIBRATION_TOKENS, seq_len: int = 256
) -> list[list[int]]:
    """:func:`calibration_ids` cut into sequences of at most ``seq_len`` tokens, ``num_tokens``
    in all (fewer when the text is shorter).

    Raises:
        InvalidArgumentError: ``num_tokens`` or ``seq_len`` below 1, or what
            :func:`calibration_ids` raises.
    """
    if num_tokens < 1 or seq_len < 1:
        raise InvalidArgumentError(f"num_tokens and seq_len must be positive, got {num_tokens} and {seq_len}")
    ids = calibration_ids(llm, calibration, num_tokens)
    return [ids[i : i + seq_len] for i in range(0, len(ids), seq_len)]


def capture_calibration(
    model_dir: str | os.PathLike[str],
    select: Callable[[Any, set[str]], list[str]],
    calibration: str | os.PathLike[str] | None = None,
    num_tokens: int = DEFAULT_CALIBRATION_TOKENS,
    seq_len: int = 256,
    token_ids: Sequence[Sequence[int]] | None = None,
) -> tuple[Any, dict[str, np.ndarray], list[int]]:
    """Run calibration text through the float checkpoint in ``model_dir`` (reference backend,
    float32, one prefill per sequence) and capture network tensors.

    Args:
        model_dir: a Hugging Face model folder (with its tokenizer unless ``token_ids``).
        select: ``(config, every tensor name of the network) -> names to capture``.
        calibration: a text file (default :data:`DEFAULT_CALIBRATION`).
        num_tokens: calibration tokens in all. seq_len: tokens per prefill.
        token_ids: calibration sequences as token ids, instead of the text.

    Returns:
        ``(config, {name: [tokens, features]}, lengths)``: the model config, each captured
        tensor with every calibration token's row, sequences concatenated, in the network's
        float32 (a wider dtype where the network wrote one), and the sequences' lengths in order
        (each sequence's first row is its position 0).

    Raises:
        InvalidArgumentError: the calibration file is missing, a directory, not UTF-8 or gives no token, a sequence is
            empty or longer than ``seq_len``, or ``select`` names no tensor.
        InvalidRequestError: the checkpoint has no tokenizer and no ``token_ids`` are given.
    """
    from .llm import LLM

    if token_ids is None:
        calibration_text(calibration, max_chars=4096)  # a bad file before the model is loaded
    if token_ids is not None:
        if not token_ids:
            raise InvalidArgumentError(
                "calibration token_ids is empty: give at least one sequence of token ids (or none, to tokenize the calibration text)"
            )
        bad = next((i for i, t in enumerate(token_ids) if not 0 < len(t) <= seq_len), None)
        if bad is not None:
            raise InvalidArgumentError(
                f"calibration token_ids must be sequences of 1 to seq_len={seq_len} ids; sequence {bad} has {len(token_ids[bad])}"
            )
    llm = LLM(model_dir, backend="reference", dtype="float32", kv_cache="contiguous", device="cpu", max_batch_size=1,
              max_seq_len=max(seq_len + 1, 2), progress=False)  # fmt: skip
    try:
        config = llm.config
        # a sequence and its one new token within the model's positions (a small model's
        # max_position_embeddings can be below seq_len + 1)
        seq_len = max(1, min(seq_len, llm.build_config.max_seq_len - 1))
        names = select(config, network_tensor_names(llm))
        if not names:
            raise InvalidArgumentError(f"no calibration tensor to capture in the {config.architecture} network")
        seqs = [list(t) for t in token_ids] if token_ids is not None else calibration_token_ids(llm, calibration, num_tokens, seq_len)
        inputs: dict[str, list[np.ndarray]] = {n: [] for n in names}
        for ids in seqs:
            for n, v in capture_prefill(llm, ids, names).items():
                # in the dtype the float32 network wrote (not widened: a float64 copy of every
                # layer's inputs would double the memory for the same numbers)
                v = np.asarray(v)
                inputs[n].append(v.astype(np.result_type(v.dtype, np.float32), copy=False).reshape(len(ids), -1))
    finally:
        llm.close()
    return config, {n: np.concatenate(v, axis=0) for n, v in inputs.items()}, [len(ids) for ids in seqs]
