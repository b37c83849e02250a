"""``trtcore check --bisect`` on the cuda engine (marker ``gpu``; skipped with the reason without
a GPU): :func:`trtcore.check.compare` with ``backend="cuda"`` builds the engine with ``capture=``
of every compared tensor, so the fusion passes write each of them out (a fused kernel at its
outputs), and compares them with transformers' module outputs (CPU, float32, eager).

* a correct model is within ``1e-4`` relative L2 at every module, every module captured (no
  "not captured" where the reference backend has the tensor): the tiny Llama, a Mixtral and a
  Qwen2-MoE with shared expert and a dense layer, Gemma 2 with soft-capping;
* a copy whose layer-1 ``o_proj`` the test perturbed, against the original (``reference=``):
  layer 1's attention output is the first divergence, layer 0 within tolerance; the same for
  Mixtral's layer-1 experts (the MoE block is the first divergence);
* the paged cache on a GPU backend is refused with the reason (its device runner returns no
  captured tensors), and the captured engine's logits equal the plain engine's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import ModelStore, hf_models, random_prompt  # noqa: F401
from test_check_bisect import PERTURBED, _perturbed_copy
from test_gemma import _prompt as gemma_prompt
from test_gemma import store as gemma_store  # noqa: F401  (module fixture)
from test_gpu_backend import cp  # noqa: F401
from test_moe import MOE, _Store, perturbed_experts
from test_moe import _prompt as moe_prompt
from test_moe import write as write_moe

from trtcore import LLM, SamplingParams
from trtcore.check import FIRST_DIVERGENCE, NOT_CAPTURED, OK, compare
from trtcore.errors import InvalidArgumentError

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def moe_store(tmp_path_factory: pytest.TempPathFactory) -> _Store:
    return _Store(tmp_path_factory.mktemp("moe_bisect"), lambda name, path: write_moe(MOE[name], path))


def _all_within(report: Any, allowed_not_captured: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    assert report.ok and report.first_divergence is None, report.table()
    for m in report.modules:
        if m.module in allowed_not_captured:
            assert m.status == NOT_CAPTURED, report.table()
        else:
            assert m.status == OK and m.rel_error is not None and m.rel_error <= 1e-4, report.table()


def test_llama_is_within_tolerance_at_every_module(cp: Any, hf_models: ModelStore) -> None:  # noqa: F811
    d = hf_models.dir("llama3_rope")
    report = compare(d, random_prompt(np.random.default_rng(11), 19, 160), backend="cuda")
    assert [m.module for m in report.modules] == [
        "model.embed_tokens",
        *[f"model.layers.{i}{s}" for i in range(2) for s in (".self_attn", ".mlp", "")],
        "model.norm",
        "lm_head",
    ]
    _all_within(report)


def test_llama_perturbed_o_proj_is_the_first_divergence(cp: Any, hf_models: ModelStore, tmp_path: Path) -> None:  # noqa: F811
    good = hf_models.dir("llama3_rope")
    bad = _perturbed_copy(good, tmp_path / "perturbed", seed=4)
    report = compare(bad, random_prompt(np.random.default_rng(12), 13, 160), reference=good, backend="cuda")
    first = report.first_divergence
    assert first is not None and first.module == "model.layers.1.self_attn" and first.tensor == PERTURBED.removesuffix(".weight"), report.table()
    by_module = {m.module: m for m in report.modules}
    for name in ("model.embed_tokens", "model.layers.0.self_attn", "model.layers.0.mlp", "model.layers.0"):
        assert by_module[name].status == OK, report.table()
    assert [m.status for m in report.modules].count(FIRST_DIVERGENCE) == 1


@pytest.mark.parametrize("name", ["mixtral_top2", "qwen2_moe_shared_dense1"])
def test_moe_is_within_tolerance(cp: Any, moe_store: _Store, name: str) -> None:  # noqa: F811
    from trtcore.config import load_config
    from trtcore.models.moe import is_sparse

    cfg = load_config(moe_store.dir(name))
    dense = {f"model.layers.{i}.mlp" for i in range(cfg.num_hidden_layers) if not is_sparse(cfg, i)}
    _all_within(compare(moe_store.dir(name), moe_prompt(name)[:12], backend="cuda"), dense)


def test_moe_perturbed_experts_are_the_first_divergence(cp: Any, moe_store: _Store, tmp_path: Path) -> None:  # noqa: F811
    name = "mixtral_top2"
    d = perturbed_experts(moe_store, name, tmp_path / "perturbed")
    report = compare(d, moe_prompt(name)[:12], reference=moe_store.dir(name), backend="cuda")
    assert report.first_divergence is not None and report.first_divergence.module == "model.layers.1.mlp", report.table()


def test_gemma2_is_within_tolerance(cp: Any, gemma_store: ModelStore) -> None:  # noqa: F811
    name = "gemma2_softcap"
    _all_within(compare(gemma_store.dir(name), gemma_prompt(name)[:20], backend="cuda"))


def test_paged_is_refused_and_a_capture_leaves_the_logits(cp: Any, hf_models: ModelStore) -> None:  # noqa: F811
    d = hf_models.dir("llama3_rope")
    with pytest.raises(InvalidArgumentError, match="kv_cache='contiguous'"):
        compare(d, [3, 4, 5], backend="cuda", kv_cache="paged")
    ids = random_prompt(np.random.default_rng(13), 9, 160)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    common = {"backend": "cuda", "dtype": "float32", "max_batch_size": 1, "kv_cache": "contiguous", "progress": False}
    plain = LLM(d, **common)
    kept = LLM(d, **common, capture=["model.layers.0.mlp.down_proj", "model.layers.1.self_attn.o_proj"])
    assert kept.captured == ("model.layers.0.mlp.down_proj", "model.layers.1.self_attn.o_proj")
    [a] = plain.generate([ids], params)
    [b] = kept.generate([ids], params)
    plain.close()
    kept.close()
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    la = np.array([lp[t].logprob for lp, t in zip(a.outputs[0].logprobs, a.outputs[0].token_ids)])
    lb = np.array([lp[t].logprob for lp, t in zip(b.outputs[0].logprobs, b.outputs[0].token_ids)])
    assert np.allclose(la, lb, rtol=1e-5, atol=1e-5), (la, lb)
