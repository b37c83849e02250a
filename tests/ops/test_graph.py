"""``ops.Graph`` (names, scopes, types, inputs/outputs), the implementation defaults and the
clear errors of the ops layer."""

from __future__ import annotations

import types

import numpy as np
import pytest

import trtcore.reference as ref
from trtcore import ops
from trtcore.errors import InvalidArgumentError
from trtcore.rope import RopeSpec, default_inv_freq

from .conftest import HAS_RTX


def graph(dtype: str = "float32") -> ops.Graph:
    network = ref.Builder().create_network(1 << int(ref.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    return ops.Graph(ref, network, dtype)


def test_names_are_scoped_and_unique() -> None:
    """Layers and their outputs are named after the scope (``model.layers.0.mlp``); a repeated
    name gets ``_1``, ``_2``; ``scope_at`` names under an absolute path, then restores."""
    g = graph()
    x = g.input("x", np.float32, (2, 4))
    with g.scope("model"), g.scope("layers.0"):
        a = ops.add(g, x, x, "residual")
        b = ops.add(g, a, x, "residual")
        with g.scope_at("model.rotary_emb"):
            c = ops.mul(g, b, b, "cos")
        d = ops.unary(g, c, "NEG", "neg")
    assert [t.name for t in (a, b, c, d)] == ["model.layers.0.residual", "model.layers.0.residual_1", "model.rotary_emb.cos",
                                              "model.layers.0.neg"]
    assert [g.network.get_layer(i).name for i in range(g.network.num_layers)] == [t.name for t in (a, b, c, d)]
    assert g.unique("") == "" and g.unique("") == "_1"
    out = g.output(d, "logits")
    assert out.name == "logits" and g.network.num_outputs == 1 and g.network.get_output(0) is out


@pytest.mark.parametrize("dtype, np_dtype", [("float32", np.float32), ("float16", np.float16), ("bfloat16", "bfloat16")])
def test_graph_dtypes(dtype: str, np_dtype: object) -> None:
    g = graph(dtype)
    assert g.np_dtype == np.dtype(np_dtype) and g.trt_dtype == ref.from_numpy_dtype(g.np_dtype)
    assert [g.trt_type(t) for t in (np.int32, np.int64, np.bool_)] == [ref.int32, ref.int64, ref.bool]
    x = g.input("ids", np.int32, (-1, 3))
    assert x.dtype == ref.int32 and x.shape == (-1, 3) and x.is_network_input


def test_graph_errors_name_the_value() -> None:
    with pytest.raises(InvalidArgumentError, match=r"dtype 'int8' is not supported; expected one of \['bfloat16', 'float16', 'float32'\]"):
        graph("int8")
    with pytest.raises(TypeError, match="float64 has no TensorRT equivalent"):
        graph().trt_type(np.float64)


def test_default_implementations() -> None:
    """Plugins where the module hosts them (the reference), composed layers elsewhere
    (the plan's one rule, :func:`trtcore.plan.implementations`)."""
    from trtcore.plan import BuildConfig, implementations

    assert implementations(BuildConfig(), "reference", ref) == {"rope": "plugin", "kv_cache": "paged"}
    if HAS_RTX:
        import tensorrt_rtx

        got = implementations(BuildConfig(), "tensorrt_rtx", tensorrt_rtx)
        assert got == {"rope": "layers", "kv_cache": "contiguous", "attention": "layers"}
    for op, impl in implementations(BuildConfig(), "reference", ref).items():
        assert impl in ops.IMPLEMENTATIONS[op]


def test_rotary_rejects_an_unknown_implementation() -> None:
    g = ops.Graph(ref, graph().network, implementations={"rope": "fused"})
    q = g.input("q", np.float32, (1, 2, 2, 8))
    pos = g.input("position_ids", np.int32, (1, 2))
    spec = RopeSpec(rotary_dim=8, head_dim=8, base=10000.0, rope_type="default", inv_freq=default_inv_freq(10000.0, 8))
    with pytest.raises(InvalidArgumentError, match=r"rope implementation 'fused' is not one of \('plugin', 'layers'\)"):
        ops.rotary(g, q, q, pos, spec)


def test_native_attention_needs_the_layers() -> None:
    """A TensorRT module without ``add_attention_v2`` / ``add_kv_cache_update`` (TensorRT
    before 10.15) gets an error that says what is missing and what to use instead."""
    old = types.SimpleNamespace(__name__="tensorrt", __version__="10.13.0")
    g = ops.Graph(ref, types.SimpleNamespace())  # a network of that older module
    g.trt = old
    with pytest.raises(InvalidArgumentError, match=r"add_attention_v2.*tensorrt 10\.13\.0 has none; use attention='layers'"):
        ops.sdpa_native(g, None, None, None, None)
    with pytest.raises(InvalidArgumentError, match="add_kv_cache_update"):
        ops.kv_cache_update(g, None, None, None)
