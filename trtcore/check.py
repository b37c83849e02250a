"""``trtcore check``: run a checkpoint through trtcore and through Hugging Face transformers.

Both run in float32 (trtcore on the reference backend on the CPU with the contiguous KV
cache, whose per-layer cache it feeds step by step; transformers with eager
attention) on the same token ids: the prompt, then ``steps`` greedy tokens chosen by
trtcore. The error reported is ``max |trtcore - hf| / max |hf|`` over the logits of the
last prompt position and of every decode step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .errors import TrtcoreError


def compare_with_transformers(model_dir: str | Path, prompt: str | list[int], steps: int = 8) -> dict[str, Any]:
    """Compare trtcore's and transformers' logits for ``prompt``.

    Returns:
        dict with ``architecture``, ``num_tokens`` (prompt length), ``max_rel_error``,
        ``trtcore_token`` / ``transformers_token`` (greedy next token after the prompt),
        ``greedy_equal`` (all ``steps`` greedy tokens equal).

    Raises:
        TrtcoreError: torch / transformers are not installed.
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise TrtcoreError(f"trtcore check needs torch and transformers ({exc}); install them with: pip install 'trtcore[test]'") from exc
    from .llm import LLM
    from .runtime.sampling import SamplingParams

    llm = LLM(model_dir, backend="reference", dtype="float32", max_batch_size=1, kv_cache="contiguous", device="cpu")
    ids = llm.encode(prompt) if isinstance(prompt, str) else list(prompt)
    [out] = llm.generate([ids], SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True, logprobs=0))
    ours_tokens = out.outputs[0].token_ids
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    seq = ids + ours_tokens[:-1]
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0, len(ids) - 1 :].double().numpy()
    ours = _trtcore_logits(llm, ids, ours_tokens[:-1])
    err = float(np.abs(ours - ref).max() / np.abs(ref).max())
    return {
        "architecture": llm.config.architecture,
        "num_tokens": len(ids),
        "max_rel_error": err,
        "trtcore_token": int(np.argmax(ours[0])),
        "transformers_token": int(np.argmax(ref[0])),
        "greedy_equal": bool((np.argmax(ref, -1) == np.array(ours_tokens)).all()),
    }


def _trtcore_logits(llm: Any, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """Logits ``[1 + len(continuation), vocab]`` at the last prompt position and each step,
    fed step by step through the LLM's contiguous KV cache (``llm.engine.kv_cache``)."""
    kv = llm.engine.kv_cache
    kv.reset(1)
    rows = []
    start = 0
    for chunk in [prompt] + [[t] for t in continuation]:
        pos = np.arange(start, start + len(chunk))[None]
        out = llm.executor.run(kv.step_feeds(np.array([chunk]), pos, pos, np.array([len(chunk) - 1])))
        kv.update(out)
        rows.append(np.asarray(llm.executor.to_host(out["logits"], "logits")[0], np.float64))
        start += len(chunk)
    return np.stack(rows)
