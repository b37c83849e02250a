"""The fused RoPE plugin and the composed-layers RoPE give the same model outputs.

For every tiny checkpoint (all RoPE scalings, partial rotary absent, GQA, sliding window),
trtcore on the reference backend (NumPy: the plugin runs its NumPy reference) is run with
``rope="plugin"`` and ``rope="layers"``; the full log-probability rows of the last prompt
position and 16 decode steps must agree, and the greedy tokens must be equal. Both are
also checked against transformers elsewhere (tests/test_models_hf.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hf_models import VARIANTS, hf_models, random_prompt  # noqa: F401  (fixture)

from trtcore import LLM, SamplingParams


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_plugin_and_layers_agree(hf_models, name: str) -> None:  # noqa: F811
    v = VARIANTS[name]
    d = hf_models.dir(name)
    prompt = random_prompt(np.random.default_rng(), 40, v.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=v.vocab_size)
    outs = {}
    for impl in ("plugin", "layers"):
        llm = LLM(d, backend="reference", dtype="float32", rope=impl, progress=False)
        assert llm.build_config.rope == impl
        names = [layer.name for layer in llm.executor.network.layers]
        assert any(".rotary_emb.plugin" in n for n in names) == (impl == "plugin")
        outs[impl] = llm.generate([prompt], params)[0].outputs[0]
    a, b = outs["plugin"], outs["layers"]
    assert a.token_ids == b.token_ids
    for step, (ra, rb) in enumerate(zip(a.logprobs, b.logprobs)):
        ids = sorted(ra)
        la = np.array([ra[i].logprob for i in ids])
        lb = np.array([rb[i].logprob for i in ids])
        np.testing.assert_allclose(la, lb, rtol=1e-5, atol=1e-5, err_msg=f"step {step}")


def test_default_is_plugin_on_reference_and_layers_on_rtx(hf_models) -> None:  # noqa: F811
    import tensorrt_rtx

    import trtcore.reference as ref
    from trtcore.builder import BuildConfig, implementations

    assert implementations(ref, BuildConfig()) == {"rope": "plugin", "kv_cache": "paged"}
    # contiguous networks also record their attention (tests/test_native_attention.py)
    assert implementations(tensorrt_rtx, BuildConfig()) == {"rope": "layers", "kv_cache": "contiguous", "attention": "layers"}
    from trtcore.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="add_plugin_v3"):
        implementations(tensorrt_rtx, BuildConfig(rope="plugin"))
    with pytest.raises(InvalidArgumentError, match="add_plugin_v3"):
        implementations(tensorrt_rtx, BuildConfig(kv_cache="paged"))
