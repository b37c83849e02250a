"""The cuda engine against the NumPy oracle tensor by tensor (marker ``gpu``): ``capture=``
on both backends. A two-layer Llama decode step (paged KV cache, float32) is built with
``capture="all"``, so every tensor of the network that is no constant or input comes back
from the engine; the reference executor's ``run(feeds, capture="all")`` gives the same
tensors; each must agree within ``1e-4 * max(1, max|ref|)`` of that tensor (float32 through at
most two decoder layers: cuBLAS's and the fused kernels' summation orders against NumPy's,
a few float32 ulps per layer), integers exactly. A capture that broke a value would show as
an O(1) error in that tensor and every later one, so the first bad name is where to look.

Also: building with a capture leaves the engine's own outputs as they were without one
(float32, relative L2 error below 1e-5: a capture may split a fused kernel, which reorders
float32 sums).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_engine_gpu import cp, paged_decode_feeds  # noqa: F401  (cp is a fixture)

pytestmark = pytest.mark.gpu


def _executor(d: Any, capture: Any) -> Any:
    import trtcore.cuda as tc
    from trtcore.builder import _builder_config
    from trtcore.runtime.trt_executor import TensorRTExecutor

    blob = tc.Builder(tc.Logger(tc.Logger.ERROR)).build_serialized_network(d.network, _builder_config(d, None), capture=capture)
    return TensorRTExecutor(tc, bytes(blob))


def test_every_tensor_of_a_decode_step_equals_the_reference(cp: Any) -> None:  # noqa: F811
    from netutil import llama_plan

    from trtcore.builder import _builder_config
    from trtcore.runtime.reference_executor import ReferenceExecutor

    plan, d = llama_plan(layers=2, dtype="float32", arch=None)
    feeds = paged_decode_feeds(plan, 3, seed=1)
    (profile,) = _builder_config(d, None)._profiles  # the network's dynamic shapes need the build's profile
    want = ReferenceExecutor(d.network, profile).run({k: v.copy() for k, v in feeds.items()}, capture="all")
    with _executor(d, "all") as ex:
        got = ex.run({k: v.copy() for k, v in feeds.items()})
    captured = set(got) - set(plan.graph.outputs)
    assert len(captured) > 50, sorted(got)  # every layer's outputs, not just the logits
    bad = []
    order = [t.name for layer in d.network._layers for t in layer._outputs]
    for name in sorted(got, key=lambda n: order.index(n) if n in order else -1):
        g, w = np.asarray(got[name]), np.asarray(want[name])
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.kind in "biu":
            ok = np.array_equal(g, w)
        else:
            w64 = w.astype(np.float64)
            ok = bool(np.all(np.abs(g.astype(np.float64) - w64) <= 1e-4 * max(1.0, float(np.abs(w64).max(initial=0.0)))))
        if not ok:
            bad.append(name)
    assert not bad, f"{len(bad)} of {len(got)} tensors differ from the reference; first {bad[:5]}"


def test_a_capture_leaves_the_outputs_as_they_were(cp: Any) -> None:  # noqa: F811
    from netutil import llama_plan

    plan, d = llama_plan(layers=2, dtype="float32", arch=None)
    feeds = paged_decode_feeds(plan, 2, seed=3)
    with _executor(d, ()) as plain, _executor(d, ["model.layers.0.input_layernorm.variance"]) as one:
        a = plain.run({k: v.copy() for k, v in feeds.items()})
        b = one.run({k: v.copy() for k, v in feeds.items()})
    assert "model.layers.0.input_layernorm.variance" in b
    # the captured variance splits the fused norm kernel, which may reorder float32 sums
    err = np.linalg.norm(b["logits"].astype(np.float64) - a["logits"]) / np.linalg.norm(a["logits"].astype(np.float64))
    assert err < 1e-5, err
