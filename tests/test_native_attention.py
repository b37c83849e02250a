"""The native TensorRT attention of the contiguous KV cache mode (``attention="native"``):
``IKVCacheUpdateLayer`` + ``IAttention``.

(a) trtcore.reference's two layers against float64 NumPy formulas written from TensorRT's
    documentation (GQA, bool / additive / per-head masks, ``UPPER_LEFT`` / ``LOWER_RIGHT``
    causal kinds, ``key_value_lengths``, write indices, in-place update), and the rules
    TensorRT checks; the same small networks also build with ``tensorrt_rtx`` (conformance).
(b) every tiny checkpoint of tests/hf_models.py built with ``attention="native"`` on the
    reference backend gives the greedy tokens and full log-probability rows (1e-5) of
    ``attention="layers"``, with prompts of different lengths in one batch (padding) and
    sequences finishing at different steps.
(c) ``tensorrt_rtx`` builds every tiny checkpoint with ``attention="native"`` in float16 and
    float32 into a serialized engine (ahead of time, sm89, no GPU needed).

``tensorrt_rtx`` is imported directly, not through ``pytest.importorskip``: CI installs it
and this file must never be skipped there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tensorrt_rtx  # no importorskip: CI must run this file
from hf_models import VARIANTS, ModelStore, hf_models, random_prompt  # noqa: F401  (hf_models is a fixture)

import trtcore.reference as ref
from trtcore import ops
from trtcore.builder import (
    BuildConfig,
    build_engine,
    build_reference_engine,
    define_network,
    implementations,
    save_engine,
)
from trtcore.checkpoint import Checkpoint
from trtcore.config import load_config
from trtcore.errors import InvalidArgumentError, NetworkError
from trtcore.reference.evaluator import evaluate
from trtcore.kv_modes import kv_mode
from trtcore.runtime.generate import make_engine
from trtcore.runtime.request import Request
from trtcore.runtime.reference_executor import ReferenceExecutor
from trtcore.runtime.sampling import SamplingParams

CC = "sm89"
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


# ---------------------------------------------------------------------------------------
# float64 formulas (TensorRT's documentation of IAttention and IKVCacheUpdateLayer)


def attention64(q, k, v, *, mask=None, causal="NONE", kv_lengths=None) -> np.ndarray:
    """softmax(Q K^T (+ or masked by) mask) V per batch and query head, in float64; query head
    ``h`` reads key/value head ``h // (Hq // Hkv)``; a row with no key left gives zeros."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, Hq, S, D = q.shape
    Hkv, T = k.shape[1], k.shape[2]
    out = np.zeros((B, Hq, S, D))
    for b in range(B):
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            scores = q[b, h] @ k[b, kh].T  # [S, T]
            allowed = np.ones((S, T), bool)
            if mask is not None:
                m = mask[min(b, mask.shape[0] - 1), min(h, mask.shape[1] - 1)]
                if m.dtype == np.bool_:
                    allowed &= m
                else:
                    scores = scores + np.asarray(m, np.float64)
            i, j = np.arange(S)[:, None], np.arange(T)[None, :]
            if causal == "UPPER_LEFT":
                allowed &= j <= i
            elif causal == "LOWER_RIGHT":
                allowed &= j <= i + (T - S)
            if kv_lengths is not None:
                allowed &= j < kv_lengths[b]
            for s in range(S):
                if not allowed[s].any():
                    continue
                x = np.where(allowed[s], scores[s], -np.inf)
                p = np.exp(x - x.max())
                out[b, h, s] = (p / p.sum()) @ v[b, kh]
    return out


def kv_update64(cache: np.ndarray, update: np.ndarray, write_indices: np.ndarray) -> np.ndarray:
    out = cache.copy()
    for b in range(cache.shape[0]):
        for s in range(update.shape[2]):
            out[b, :, write_indices[b] + s, :] = update[b, :, s, :]
    return out


# ---------------------------------------------------------------------------------------
# (a) the reference layers


def _attention_network(trt: Any, dtype: Any, Hq: int, Hkv: int, D: int, T: int, *, mask: str | None = None,
                       causal: str = "NONE", kv_lengths: bool = False) -> tuple[Any, Any]:
    """q [B, Hq, S, D], k/v [B, Hkv, T, D] -> IAttention; returns (builder, network)."""
    builder = trt.Builder(ref.Logger() if trt is ref else tensorrt_rtx.Logger(tensorrt_rtx.Logger.ERROR))
    n = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    q = n.add_input("q", dtype, (-1, Hq, -1, D))
    k = n.add_input("k", dtype, (-1, Hkv, T, D))
    v = n.add_input("v", dtype, (-1, Hkv, T, D))
    layer = n.add_attention_v2(q, k, v, trt.AttentionNormalizationOp.SOFTMAX, getattr(trt.CausalMaskKind, causal))
    if mask == "bool":
        layer.mask = n.add_input("mask", trt.bool, (-1, 1, -1, T))
    elif mask == "bool_per_head":
        layer.mask = n.add_input("mask", trt.bool, (-1, Hq, -1, T))
    elif mask == "float":
        layer.mask = n.add_input("mask", dtype, (1, 1, -1, T))
    if kv_lengths:
        layer.key_value_lengths = n.add_input("kv_lengths", trt.int32, (-1,))
    layer.decomposable = True
    layer.name = "sdpa"
    out = layer.get_output(0)
    out.name = "out"
    n.mark_output(out)
    return builder, n


def _profile(builder: Any, n: Any, B: int, S: int) -> Any:
    """One profile: dynamic axis 0 up to ``B``, other dynamic axes up to ``S`` (opt = max)."""
    p = builder.create_optimization_profile()
    for i in range(n.num_inputs):
        t = n.get_input(i)
        hi = tuple((B if a == 0 else S) if d == -1 else d for a, d in enumerate(t.shape))
        p.set_shape(t.name, tuple(1 if d == -1 else d for d in t.shape), hi, hi)
    return p


def _ref_engine(n: Any, B: int, S: int) -> Any:
    b = ref.Builder()
    cfg = b.create_builder_config()
    cfg.add_optimization_profile(_profile(b, n, B, S))
    return b.build_engine(n, cfg)


CASES = [
    # (Hq, Hkv, mask, causal, kv_lengths)
    (4, 4, "bool", "NONE", False),
    (4, 2, "bool", "NONE", False),
    (8, 2, "bool_per_head", "NONE", False),
    (4, 1, "float", "NONE", False),
    (4, 2, None, "UPPER_LEFT", False),
    (4, 2, None, "LOWER_RIGHT", False),
    (4, 2, None, "NONE", True),
    (4, 2, "bool", "NONE", True),
    (2, 2, None, "NONE", False),
]


def _case_feeds(rng: np.random.Generator, dt: Any, B: int, Hq: int, Hkv: int, S: int, T: int, D: int, mask: str | None) -> dict[str, np.ndarray]:
    feeds = {
        "q": (rng.standard_normal((B, Hq, S, D)) * 0.5).astype(dt),
        "k": rng.standard_normal((B, Hkv, T, D)).astype(dt),
        "v": rng.standard_normal((B, Hkv, T, D)).astype(dt),
    }
    if mask in ("bool", "bool_per_head"):
        m = rng.random((B, 1 if mask == "bool" else Hq, S, T)) < 0.6
        m[..., 0] = True  # every row keeps a key (one row with none is tested separately)
        feeds["mask"] = m
    elif mask == "float":
        feeds["mask"] = np.where(rng.random((1, 1, S, T)) < 0.6, rng.standard_normal((1, 1, S, T)), -1e4).astype(dt)
    return feeds


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}q{c[1]}kv-{c[2]}-{c[3]}{'-kvlen' if c[4] else ''}")
def test_reference_attention_matches_float64(case: tuple, dtype: str) -> None:
    Hq, Hkv, mask, causal, kv_lengths = case
    B, S, T, D = 3, 5, 9, 16
    rng = np.random.default_rng([CASES.index(case), len(dtype)])
    _, n = _attention_network(ref, getattr(ref, dtype), Hq, Hkv, D, T, mask=mask, causal=causal, kv_lengths=kv_lengths)
    assert n.get_layer(0).get_output(0).shape == (-1, Hq, -1, D)
    assert n.get_layer(0).get_output(0).dtype == getattr(ref, dtype)
    dt = NP[dtype]
    feeds = _case_feeds(rng, dt, B, Hq, Hkv, S, T, D, mask)
    lengths = None
    if kv_lengths:
        lengths = np.array([T, 1, 4], np.int32)
        feeds["kv_lengths"] = lengths
    out = evaluate(n, feeds)["out"]
    assert out.dtype == np.dtype(dt) and out.shape == (B, Hq, S, D)
    want = attention64(feeds["q"], feeds["k"], feeds["v"], mask=feeds.get("mask"), causal=causal, kv_lengths=lengths)
    # float32 compute from the inputs' values, one rounding of the output to its type
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=tol, atol=tol)


def test_reference_attention_without_normalization() -> None:
    """``AttentionNormalizationOp.NONE``: ``(Q K^T, masked to 0) V`` (GQA 4:2, bool mask)."""
    rng = np.random.default_rng(3)
    _, n = _attention_network(ref, ref.float32, 4, 2, 8, 6, mask="bool")
    n.get_layer(0).norm_op = ref.AttentionNormalizationOp.NONE
    f = _case_feeds(rng, np.float32, 2, 4, 2, 3, 6, 8, "bool")
    k = np.repeat(f["k"].astype(np.float64), 2, axis=1)
    v = np.repeat(f["v"].astype(np.float64), 2, axis=1)
    want = ((f["q"].astype(np.float64) @ np.swapaxes(k, -1, -2)) * f["mask"]) @ v
    np.testing.assert_allclose(evaluate(n, f)["out"], want, rtol=1e-5, atol=1e-5)


def test_reference_attention_causal_kinds_and_empty_rows() -> None:
    """LOWER_RIGHT with S_q=1 sees every key, UPPER_LEFT only key 0; a bool mask row with no
    True gives zeros; ``add_attention(causal=True)`` is ``UPPER_LEFT``."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 1, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    outs = {}
    for kind in ("UPPER_LEFT", "LOWER_RIGHT"):
        _, n = _attention_network(ref, ref.float32, 2, 2, 8, 6, causal=kind)
        outs[kind] = evaluate(n, {"q": q, "k": k, "v": v})["out"]
    np.testing.assert_allclose(outs["UPPER_LEFT"], v[:, :, :1], rtol=1e-6)
    np.testing.assert_allclose(outs["LOWER_RIGHT"], attention64(q, k, v), rtol=1e-5, atol=1e-6)

    _, n = _attention_network(ref, ref.float32, 2, 2, 8, 6, mask="bool")
    out = evaluate(n, {"q": q, "k": k, "v": v, "mask": np.zeros((1, 1, 1, 6), bool)})["out"]
    assert np.all(out == 0)

    n = ref.Builder().create_network(1)
    t = [n.add_input(x, ref.float32, (1, 2, 6, 8)) for x in "qkv"]
    layer = n.add_attention(*t, ref.AttentionNormalizationOp.SOFTMAX, True)
    assert layer.causal and layer.causal_kind == ref.CausalMaskKind.UPPER_LEFT
    layer.causal = False
    assert layer.causal_kind == ref.CausalMaskKind.NONE


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_reference_kv_cache_update(dtype: str) -> None:
    """``out[b, :, w[b] + s] = update[b, :, s]``, the rest unchanged, in place, bit-exact."""
    B, H, L, S, D = 3, 2, 10, 4, 8
    rng = np.random.default_rng(1)
    n = ref.Builder().create_network(1)
    cache = n.add_input("cache", getattr(ref, dtype), (-1, H, L, D))
    update = n.add_input("update", getattr(ref, dtype), (-1, H, -1, D))
    wi = n.add_input("write_indices", ref.int32, (-1,))
    layer = n.add_kv_cache_update(cache, update, wi, ref.KVCacheMode.LINEAR)
    assert layer.type == ref.LayerType.KV_CACHE_UPDATE and layer.cache_mode == ref.KVCacheMode.LINEAR
    out = layer.get_output(0)
    assert out.shape == (-1, H, L, D) and out.dtype == getattr(ref, dtype)
    out.name = "present"
    n.mark_output(out)
    dt = NP[dtype]
    c = rng.standard_normal((B, H, L, D)).astype(dt)
    u = rng.standard_normal((B, H, S, D)).astype(dt)
    w = np.array([0, 6, 3], np.int32)  # 6 + 4 == L: the last slot
    want = kv_update64(c, u, w)
    got = evaluate(n, {"cache": c, "update": u, "write_indices": w})["present"]
    assert got is c, "the output is the cache's memory (TensorRT updates it in place)"
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))

    assert _ref_engine(n, B, S).get_aliased_input_tensor("present") == "cache"

    with pytest.raises(NetworkError, match="write_indices"):
        evaluate(n, {"cache": c, "update": u, "write_indices": np.array([0, 7, 0], np.int32)})
    with pytest.raises(NetworkError, match="write_indices"):
        evaluate(n, {"cache": c, "update": u, "write_indices": np.array([-1, 0, 0], np.int32)})


def test_reference_kv_update_then_attention_reads_the_update() -> None:
    """The attention consumes the updated cache (the network order of TensorRT's KV cache
    example): decode one token at slot w into a cache and attend over it."""
    B, H, Hkv, L, D = 2, 4, 2, 8, 8
    rng = np.random.default_rng(2)
    n = ref.Builder().create_network(1)
    q = n.add_input("q", ref.float32, (-1, H, -1, D))
    kc, vc = (n.add_input(x, ref.float32, (-1, Hkv, L, D)) for x in ("kc", "vc"))
    kn, vn = (n.add_input(x, ref.float32, (-1, Hkv, -1, D)) for x in ("kn", "vn"))
    w = n.add_input("w", ref.int32, (-1,))
    m = n.add_input("mask", ref.bool, (-1, 1, -1, L))
    k_all = n.add_kv_cache_update(kc, kn, w, ref.KVCacheMode.LINEAR).get_output(0)
    v_all = n.add_kv_cache_update(vc, vn, w, ref.KVCacheMode.LINEAR).get_output(0)
    att = n.add_attention_v2(q, k_all, v_all, ref.AttentionNormalizationOp.SOFTMAX, ref.CausalMaskKind.NONE)
    att.mask = m
    for t, name in ((att.get_output(0), "out"), (k_all, "k_present"), (v_all, "v_present")):
        t.name = name
        n.mark_output(t)
    f = {
        "q": rng.standard_normal((B, H, 1, D)).astype(np.float32),
        "kc": rng.standard_normal((B, Hkv, L, D)).astype(np.float32),
        "vc": rng.standard_normal((B, Hkv, L, D)).astype(np.float32),
        "kn": rng.standard_normal((B, Hkv, 1, D)).astype(np.float32),
        "vn": rng.standard_normal((B, Hkv, 1, D)).astype(np.float32),
        "w": np.array([3, 5], np.int32),
    }
    f["mask"] = (np.arange(L)[None, :] <= f["w"][:, None])[:, None, None, :]
    k_want, v_want = kv_update64(f["kc"], f["kn"], f["w"]), kv_update64(f["vc"], f["vn"], f["w"])
    want = attention64(f["q"], k_want, v_want, mask=f["mask"])
    out = ReferenceExecutor(_ref_engine(n, B, 1)).run(f)
    np.testing.assert_allclose(out["out"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["k_present"], k_want)
    np.testing.assert_array_equal(out["v_present"], v_want)


def test_reference_rules_as_tensorrt() -> None:
    """What TensorRT(-RTX 1.7) refuses, the reference refuses too (messages as TensorRT's)."""
    b = ref.Builder()

    def net() -> Any:
        return b.create_network(1)

    # query heads not a multiple of key/value heads
    n = net()
    layer = n.add_attention_v2(n.add_input("q", ref.float16, (1, 3, 4, 8)), n.add_input("k", ref.float16, (1, 2, 4, 8)),
                               n.add_input("v", ref.float16, (1, 2, 4, 8)), ref.AttentionNormalizationOp.SOFTMAX, ref.CausalMaskKind.NONE)
    with pytest.raises(NetworkError, match="divisible"):
        _ = layer.get_output(0).shape
    # mask and causal kind are exclusive, whichever comes second
    n = net()
    t = [n.add_input(x, ref.float16, (1, 2, 4, 8)) for x in "qkv"]
    m = n.add_input("m", ref.bool, (1, 1, 4, 4))
    layer = n.add_attention_v2(*t, ref.AttentionNormalizationOp.SOFTMAX, ref.CausalMaskKind.LOWER_RIGHT)
    with pytest.raises(NetworkError, match="mask"):
        layer.mask = m
    layer.causal_kind = ref.CausalMaskKind.NONE
    layer.mask = m
    with pytest.raises(NetworkError, match="mask"):
        layer.causal_kind = ref.CausalMaskKind.UPPER_LEFT
    # a float mask must have the query's type; the mask must be 4-D
    layer.mask = n.add_input("m32", ref.float32, (1, 1, 4, 4))
    with pytest.raises(NetworkError, match="BOOL or of the query's type"):
        _ = layer.get_output(0).shape
    layer.mask = n.add_input("m3", ref.bool, (1, 4, 4))
    with pytest.raises(NetworkError, match="4D"):
        _ = layer.get_output(0).shape
    layer.mask = None
    assert layer.get_output(0).shape == (1, 2, 4, 8)
    # q/k/v of one type
    n = net()
    layer = n.add_attention_v2(n.add_input("q", ref.float32, (1, 2, 4, 8)), n.add_input("k", ref.float16, (1, 2, 4, 8)),
                               n.add_input("v", ref.float16, (1, 2, 4, 8)), ref.AttentionNormalizationOp.SOFTMAX, ref.CausalMaskKind.NONE)
    with pytest.raises(NetworkError, match="one input type"):
        _ = layer.get_output(0).shape

    # the cache's sequence length must be static
    n = net()
    layer = n.add_kv_cache_update(n.add_input("c", ref.float16, (-1, 2, -1, 8)), n.add_input("u", ref.float16, (-1, 2, -1, 8)),
                                  n.add_input("w", ref.int32, (-1,)), ref.KVCacheMode.LINEAR)
    with pytest.raises(NetworkError, match="static sequence length"):
        _ = layer.get_output(0).shape
    # heads / head size must agree; write indices are [B] int32 or int64
    n = net()
    layer = n.add_kv_cache_update(n.add_input("c", ref.float16, (-1, 2, 16, 8)), n.add_input("u", ref.float16, (-1, 4, -1, 8)),
                                  n.add_input("w", ref.int64, (-1,)), ref.KVCacheMode.LINEAR)
    with pytest.raises(NetworkError, match="same number of heads"):
        _ = layer.get_output(0).shape
    n = net()
    layer = n.add_kv_cache_update(n.add_input("c", ref.float16, (-1, 2, 16, 8)), n.add_input("u", ref.float16, (-1, 2, -1, 8)),
                                  n.add_input("w", ref.int32, (-1, 1)), ref.KVCacheMode.LINEAR)
    with pytest.raises(NetworkError, match="rank 1"):
        _ = layer.get_output(0).shape
    # the cache must be a network input and the output a network output (checked at build)
    for cache_from_layer, mark in ((True, True), (False, False)):
        n = net()
        c = n.add_input("c", ref.float16, (2, 2, 16, 8))
        if cache_from_layer:
            c = n.add_identity(c).get_output(0)
        out = n.add_kv_cache_update(c, n.add_input("u", ref.float16, (2, 2, 1, 8)), n.add_input("w", ref.int32, (2,)),
                                    ref.KVCacheMode.LINEAR).get_output(0)
        n.mark_output(out if mark else n.add_identity(out).get_output(0))
        with pytest.raises(NetworkError, match="network input" if cache_from_layer else "network output"):
            b.build_engine(n, b.create_builder_config())


@pytest.mark.parametrize("case", CASES[:6], ids=lambda c: f"{c[0]}q{c[1]}kv-{c[2]}-{c[3]}")
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_same_attention_networks_build_with_rtx(case: tuple, dtype: str) -> None:
    """Conformance: the networks of the tests above are valid TensorRT-RTX graphs, and both
    modules infer the same output shape and type."""
    Hq, Hkv, mask, causal, _ = case
    shapes = {}
    for trt in (ref, tensorrt_rtx):
        builder, n = _attention_network(trt, getattr(trt, dtype), Hq, Hkv, 16, 32, mask=mask, causal=causal)
        out = n.get_output(0)
        shapes[trt.__name__] = (tuple(out.shape), out.dtype.name)
        if trt is tensorrt_rtx:
            cfg = builder.create_builder_config()
            cfg.add_optimization_profile(_profile(builder, n, 2, 32))
            cfg.num_compute_capabilities = 1
            cfg.set_compute_capability(tensorrt_rtx.ComputeCapability.SM89, 0)
            assert builder.build_serialized_network(n, cfg) is not None
    assert shapes["trtcore.reference"][0] == shapes["tensorrt_rtx"][0]
    assert shapes["trtcore.reference"][1] == shapes["tensorrt_rtx"][1]


def test_enums_match_tensorrt_rtx() -> None:
    for name in ("KVCacheMode", "CausalMaskKind", "AttentionIOForm", "AttentionNormalizationOp"):
        ours, theirs = getattr(ref, name), getattr(tensorrt_rtx, name)
        assert {k: int(v) for k, v in ours.__members__.items()} == {k: int(v) for k, v in theirs.__members__.items()}, name
    for name in ("ATTENTION_INPUT", "ATTENTION_OUTPUT", "KV_CACHE_UPDATE"):
        assert int(getattr(ref.LayerType, name)) == int(getattr(tensorrt_rtx.LayerType, name))


# ---------------------------------------------------------------------------------------
# build configuration


def test_build_config_attention(hf_models: ModelStore) -> None:  # noqa: F811
    assert BuildConfig().attention == "layers"
    with pytest.raises(InvalidArgumentError, match="attention"):
        BuildConfig(attention="fused")
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        BuildConfig(attention="native", kv_cache="paged")
    assert ops.IMPLEMENTATIONS["attention"] == ("layers", "native")
    # native alone picks the contiguous cache, also where plugins (paged) would be the default
    assert implementations(ref, BuildConfig(attention="native")) == {"rope": "plugin", "kv_cache": "contiguous", "attention": "native"}
    assert implementations(tensorrt_rtx, BuildConfig(attention="native"))["attention"] == "native"
    assert implementations(tensorrt_rtx, BuildConfig())["attention"] == "layers"
    assert "attention" not in implementations(ref, BuildConfig())  # paged: its plugin attends
    config = load_config(hf_models.dir("llama3_rope"))
    assert BuildConfig(attention="native", kv_cache="contiguous").for_model(config).attention == "native"


# ---------------------------------------------------------------------------------------
# (b) native == layers on every tiny checkpoint (reference backend, float32)

MAX_BATCH, MAX_SEQ = 4, 64


def _executor(store: ModelStore, name: str, attention: str, dtype: str = "float32") -> tuple[ReferenceExecutor, Any, Any]:
    d_dir = store.dir(name)
    config = load_config(d_dir)
    bc = BuildConfig(dtype=dtype, max_batch_size=MAX_BATCH, max_seq_len=MAX_SEQ, kv_cache="contiguous", rope="layers",
                     attention=attention).for_model(config)
    with Checkpoint(d_dir) as weights:
        d = define_network(ref, config, weights, bc)
        return ReferenceExecutor(build_reference_engine(d)), config, d


def _run(store: ModelStore, name: str, attention: str, prompts: list[list[int]], max_tokens: list[int]) -> dict[int, Any]:
    executor, config, d = _executor(store, name, attention)
    gen = make_engine(executor, kv_mode(d.plan, config))
    assert gen.kv_cache.native == (attention == "native")
    v = VARIANTS[name]
    reqs = [
        Request(i, p, SamplingParams(temperature=0, max_tokens=m, ignore_eos=True, logprobs=v.vocab_size))
        for i, (p, m) in enumerate(zip(prompts, max_tokens))
    ]
    events: dict[int, Any] = {i: [] for i in range(len(reqs))}
    for ev in gen.generate(reqs):
        events[ev.request_id].append(ev)
    return events


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_native_matches_layers_on_reference(hf_models: ModelStore, name: str) -> None:  # noqa: F811
    v = VARIANTS[name]
    rng = np.random.default_rng([v.seed, 11])
    # 5 prompts > max_batch 4: two batches; lengths differ (padding), finishing steps differ
    lens = [30, 7, 19, 1, 12]
    prompts = [random_prompt(rng, n, v.vocab_size) for n in lens]
    max_tokens = [12, 20, 5, 9, MAX_SEQ]  # the last one stops at max_seq_len ("length")
    native = _run(hf_models, name, "native", prompts, max_tokens)
    layers = _run(hf_models, name, "layers", prompts, max_tokens)
    for i in range(len(prompts)):
        a, b = native[i], layers[i]
        assert [e.token_id for e in a] == [e.token_id for e in b], f"request {i}"
        assert [e.finish_reason for e in a] == [e.finish_reason for e in b]
        assert len(a) == (min(max_tokens[i], MAX_SEQ - lens[i]))
        for step, (ea, eb) in enumerate(zip(a, b)):
            # the whole vocabulary's log-probabilities (logprobs=vocab_size)
            ra, rb = dict(ea.logprobs.top), dict(eb.logprobs.top)
            assert sorted(ra) == sorted(rb) == list(range(v.vocab_size))
            np.testing.assert_allclose(
                [ra[t].logprob for t in range(v.vocab_size)], [rb[t].logprob for t in range(v.vocab_size)],
                rtol=1e-5, atol=1e-5, err_msg=f"{name} request {i} step {step}",
            )


def test_native_network_io(hf_models: ModelStore) -> None:  # noqa: F811
    """The native network's I/O is what the KV cache contract (trtcore.kv_modes) documents,
    and the cache outputs alias the inputs."""
    from trtcore.kv_modes import kv_mode

    _, config, d = _executor(hf_models, "qwen2_mixed_swa", "native")
    L, Hkv, D = MAX_SEQ, config.num_key_value_heads, config.head_dim
    assert d.plan.dtype == "float32" and d.plan.max_seq_len == L
    spec = {t.name: (np.dtype(t.dtype), t.shape) for t in kv_mode(d.plan, config).inputs}
    net = d.network
    assert [net.get_input(i).name for i in range(net.num_inputs)] == list(spec)
    assert spec["attention_mask"] == (np.dtype(bool), (-1, 1, -1, L))
    assert spec["sliding_attention_mask"] == (np.dtype(bool), (-1, 1, -1, L))
    assert spec["cache_write_positions"] == (np.dtype(np.int32), (-1,))
    assert spec["kv_cache.1.value"] == (np.dtype(np.float32), (-1, Hkv, L, D))
    engine = build_reference_engine(d)
    for i in range(config.num_hidden_layers):
        for kind in ("key", "value"):
            assert engine.get_aliased_input_tensor(f"present.{i}.{kind}") == f"kv_cache.{i}.{kind}"
            assert tuple(net.tensor(f"present.{i}.{kind}").shape) == (-1, Hkv, L, D)
    layer_types = {type(layer).__name__ for layer in net.layers}
    assert {"IAttention", "IKVCacheUpdateLayer"} <= layer_types
    assert "ISoftMaxLayer" not in layer_types


def test_native_generator_keeps_cache_in_place(hf_models: ModelStore) -> None:  # noqa: F811
    """One prefill + decode by hand: the engine writes the step's k/v at
    cache_write_positions and returns the cache arrays it was given (in place)."""
    executor, config, _ = _executor(hf_models, "llama3_rope", "native")
    from trtcore.kv_modes import mask_feeds

    L = MAX_SEQ
    caches = {f"kv_cache.{i}.{k}": np.zeros((1, config.num_key_value_heads, L, config.head_dim), np.float32)
              for i in range(config.num_hidden_layers) for k in ("key", "value")}
    key_pos = np.full((1, L), -1)
    key_pos[0, :3] = np.arange(3)
    qpos = np.arange(3)[None, :]
    feeds = {"input_ids": np.array([[5, 6, 7]], np.int32), "position_ids": qpos.astype(np.int32),
             **mask_feeds(config, key_pos, qpos, native=True),
             "last_token_ids": np.array([2], np.int32), "cache_write_positions": np.array([0], np.int32), **caches}
    out = executor.run(feeds)
    k0 = out["present.0.key"]
    assert k0 is caches["kv_cache.0.key"]
    assert np.abs(k0[0, :, :3]).sum() > 0 and not k0[0, :, 3:].any()


# ---------------------------------------------------------------------------------------
# (c) tensorrt_rtx builds every tiny checkpoint with attention="native"


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_rtx_builds_native_attention(hf_models: ModelStore, tmp_path: Path, name: str, dtype: str) -> None:  # noqa: F811
    d_dir = hf_models.dir(name)
    config = load_config(d_dir)
    B, L = 4, 128
    bc = BuildConfig(dtype=dtype, max_batch_size=B, max_seq_len=L, kv_cache="contiguous", attention="native").for_model(config)
    with Checkpoint(d_dir) as weights:
        d = define_network(tensorrt_rtx, config, weights, bc)
        engine = build_engine(d, CC)
    assert len(engine) > 1000
    path = tmp_path / f"{name}.{dtype}.engine"
    side = save_engine(d, engine, path, backend="tensorrt_rtx", compute_capability=CC)
    meta = json.loads(side.read_text())
    assert meta["attention"] == "native" and meta["kv_cache"] == "contiguous"
    assert meta["implementations"]["attention"] == "native"
    assert meta["build_config"]["attention"] == "native"
    [profile] = meta["optimization_profiles"]
    Hkv, D = config.num_key_value_heads, config.head_dim
    assert profile["kv_cache.0.key"] == {"min": [1, Hkv, L, D], "opt": [1, Hkv, L, D], "max": [B, Hkv, L, D]}
    assert profile["cache_write_positions"]["max"] == [B]
    mask = "sliding_attention_mask" if "attention_mask" not in profile else "attention_mask"
    assert profile[mask]["max"] == [B, 1, L, L]
    net = d.network
    inputs = {net.get_input(i).name: net.get_input(i) for i in range(net.num_inputs)}
    assert set(profile) == set(inputs)
    assert inputs[mask].dtype == tensorrt_rtx.bool
    assert tuple(inputs["kv_cache.0.value"].shape) == (-1, Hkv, L, D)
    outputs = {net.get_output(i).name: net.get_output(i) for i in range(net.num_outputs)}
    assert outputs["logits"].dtype == tensorrt_rtx.float32
    for i in range(config.num_hidden_layers):
        for kind in ("key", "value"):
            assert tuple(outputs[f"present.{i}.{kind}"].shape) == (-1, Hkv, L, D)
    types = {net.get_layer(i).type for i in range(net.num_layers)}
    assert {tensorrt_rtx.LayerType.KV_CACHE_UPDATE, tensorrt_rtx.LayerType.ATTENTION_INPUT,
            tensorrt_rtx.LayerType.ATTENTION_OUTPUT} <= types
    assert tensorrt_rtx.LayerType.SOFTMAX not in types
