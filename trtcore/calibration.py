"""Intermediate tensors of a model on calibration text, on the reference backend (no GPU):
the statistics trtcore's calibrated quantizers (:mod:`trtcore.awq`) and ``trtcore check
--bisect`` read.

:func:`capture_prefill` runs one prefill of an :class:`~trtcore.llm.LLM` built with
``backend="reference"`` and returns the named network tensors (the reference evaluator's
``capture=``); :func:`calibration_token_ids` cuts a text into token sequences.
:data:`DEFAULT_CALIBRATION` is a few paragraphs of plain English shipped with trtcore
(``trtcore/data/calibration.txt``), distinct from the passage the quality benchmark scores.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["DEFAULT_CALIBRATION", "calibration_token_ids", "capture_calibration", "capture_prefill", "network_tensor_names"]

#: the calibration text ``trtcore quantize --method awq`` uses by default
DEFAULT_CALIBRATION = Path(__file__).parent / "data" / "calibration.txt"


class _CaptureFirstRun:
    """An executor that captures ``names`` on its first :meth:`run` (the prefill) and is the
    wrapped executor otherwise."""

    def __init__(self, inner: Any, names: Sequence[str]):
        self.inner = inner
        self.names = list(names)
        self.captured: dict[str, np.ndarray] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, feeds: Any, capture: Any = ()) -> Any:
        if self.captured is not None:
            return self.inner.run(feeds, capture=capture)
        out = self.inner.run(feeds, capture=self.names)
        self.captured = {n: np.asarray(self.inner.to_host(out[n], n)) for n in self.names}
        return out


def network_tensor_names(llm: Any) -> set[str]:
    """Every tensor name (layer output) of ``llm``'s reference network.

    Raises:
        InvalidArgumentError: ``llm`` is not on backend ``"reference"``.
    """
    network = _reference_network(llm)
    return {network.get_layer(k).get_output(j).name for k in range(network.num_layers) for j in range(network.get_layer(k).num_outputs)}


def _reference_network(llm: Any) -> Any:
    from .runtime.reference_executor import ReferenceExecutor

    if not isinstance(getattr(llm, "executor", None), ReferenceExecutor):
        raise InvalidArgumentError(
            f"capturing tensors needs an LLM on backend 'reference' (it reads them at run time), got {getattr(llm, 'backend', '?')!r}"
        )
    return llm.executor.network


def capture_prefill(llm: Any, token_ids: Sequence[int], names: Sequence[str]) -> dict[str, np.ndarray]:
    """The tensors ``names`` of the prefill of ``token_ids`` (one request, one new token).

    Args:
        llm: an :class:`~trtcore.llm.LLM` with ``backend="reference"`` and no requests.
        token_ids: the prompt (at least one id).
        names: network tensor names (e.g. ``"model.layers.0.input_layernorm"``).

    Returns:
        ``{name: array}`` as the network holds them (the prompt's positions along the token
        axis, the network's dtype).

    Raises:
        InvalidArgumentError: another backend, an empty prompt, or a name that is no tensor of
            the network (all of them listed).
    """
    from .runtime.generate import HostRunner
    from .runtime.sampling import SamplingParams

    _reference_network(llm)
    if not token_ids:
        raise InvalidArgumentError("capture_prefill needs a prompt of at least one token")
    missing = sorted(set(names) - network_tensor_names(llm))
    if missing:
        raise InvalidArgumentError(f"no tensor named {missing[:4]}{' ...' if len(missing) > 4 else ''} in the {llm.config.architecture} network")
    runner = llm.engine.runner
    assert isinstance(runner, HostRunner)  # the reference backend runs on host arrays
    capturing = _CaptureFirstRun(runner.executor, names)
    runner.executor = capturing  # type: ignore[assignment]  # the same run/to_host, plus the capture
    try:
        llm.generate([[int(t) for t in token_ids]], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    finally:
        runner.executor = capturing.inner
    return capturing.captured or {}


def calibration_token_ids(llm: Any, text: str, num_tokens: int = 512, seq_len: int = 256) -> list[list[int]]:
    """``text`` tokenized by ``llm``'s tokenizer and cut into sequences of at most ``seq_len``
    tokens, ``num_tokens`` in all (fewer when the text is shorter).

    Raises:
        InvalidArgumentError: ``num_tokens`` or ``seq_len`` below 1, or the text gives no token.
    """
    if num_tokens < 1 or seq_len < 1:
        raise InvalidArgumentError(f"num_tokens and seq_len must be positive, got {num_tokens} and {seq_len}")
    ids = [int(t) for t in llm.encode(text)][:num_tokens]
    if not ids:
        raise InvalidArgumentError("the calibration text gives no token")
    return [ids[i : i + seq_len] for i in range(0, len(ids), seq_len)]


def capture_calibration(
    model_dir: str | os.PathLike[str],
    select: Callable[[Any, set[str]], list[str]],
    calibration: str | os.PathLike[str] | None = None,
    num_tokens: int = 512,
    seq_len: int = 256,
    token_ids: Sequence[Sequence[int]] | None = None,
) -> tuple[Any, dict[str, np.ndarray]]:
    """Run calibration text through the float checkpoint in ``model_dir`` (reference backend,
    float32, one prefill per sequence) and capture network tensors.

    Args:
        model_dir: a Hugging Face model folder (with its tokenizer unless ``token_ids``).
        select: ``(config, every tensor name of the network) -> names to capture``.
        calibration: a text file (default :data:`DEFAULT_CALIBRATION`).
        num_tokens: calibration tokens in all. seq_len: tokens per prefill.
        token_ids: calibration sequences as token ids, instead of the text.

    Returns:
        ``(config, {name: float64 [tokens, features]})``: the model config, and each captured
        tensor with every calibration token's row, sequences concatenated.

    Raises:
        InvalidArgumentError: the calibration file is missing or gives no token, a sequence is
            empty or longer than ``seq_len``, or ``select`` names no tensor.
        InvalidRequestError: the checkpoint has no tokenizer and no ``token_ids`` are given.
    """
    from .llm import LLM

    path = Path(calibration) if calibration is not None else DEFAULT_CALIBRATION
    if token_ids is None and not path.is_file():
        raise InvalidArgumentError(f"calibration file {str(path)!r} does not exist")
    if token_ids is not None and (not token_ids or any(not 0 < len(t) <= seq_len for t in token_ids)):
        raise InvalidArgumentError(f"calibration token_ids must be sequences of 1 to seq_len={seq_len} ids")
    llm = LLM(model_dir, backend="reference", dtype="float32", kv_cache="contiguous", device="cpu", max_batch_size=1,
              max_seq_len=max(seq_len + 1, 2), progress=False)  # fmt: skip
    try:
        config = llm.config
        names = select(config, network_tensor_names(llm))
        if not names:
            raise InvalidArgumentError(f"no calibration tensor to capture in the {config.architecture} network")
        seqs = (
            [list(t) for t in token_ids]
            if token_ids is not None
            else calibration_token_ids(llm, path.read_text(encoding="utf-8"), num_tokens, seq_len)
        )
        inputs: dict[str, list[np.ndarray]] = {n: [] for n in names}
        for ids in seqs:
            for n, v in capture_prefill(llm, ids, names).items():
                inputs[n].append(np.asarray(v, np.float64).reshape(len(ids), -1))
    finally:
        llm.close()
    return config, {n: np.concatenate(v, axis=0) for n, v in inputs.items()}
