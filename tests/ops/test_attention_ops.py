"""Attention ops against a float64 ``softmax(scale * Q K^T, masked) V`` written here (query
head ``h`` reads key/value head ``h // (Hq // Hkv)``, transformers' ``repeat_kv``):

* ``attention``: the composed layers over a contiguous cache (float32 additive mask
  ``[B, 1, 1, S, T]``): prefill, chunked prefill after a cache, decode with padded rows;
  MHA, GQA, MQA;
* ``kv_cache_update``, ``sdpa_native`` and ``native_attention`` (TensorRT's
  ``IKVCacheUpdateLayer`` + ``IAttention``) over a fixed-size cache with a bool mask;
* ``paged_attention`` (the plugin's reference) on packed tokens of several sequences whose
  cached keys/values sit in a pool under random, shuffled block tables; the pool's unused
  slots hold NaN, so a read of one shows in the output;
* attention logit soft-capping (``softcap``), query scales other than ``head_dim ** -0.5`` and
  head_dim 256 (Gemma 2/3), in the composed attention and the paged plugin.

Tolerances (``u``: the dtype's unit roundoff): the composed attention rounds the raw scores
``Q K^T`` to the dtype (``|d score| <= u |score|``, moving each probability by at most
``2 u max|scaled score|`` relative), rounds the probabilities (u) and the output (u): the
error is within ``u (2 max|scaled score| + 2) max|V|`` plus float32 noise. ``native_attention``
rounds the scaled queries once (the same score term) and the fused attention's output once.
``sdpa_native`` and the paged plugin compute from their inputs in float32 and round once:
``u max|V|``. Cache updates move data: bit-exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtcore import ops

from .conftest import DTYPES, NP_DTYPES, UNIT_ROUNDOFF, OneOp, as_float64, builds_rtx, randn

#: the runtime's additive mask value (trtcore.runtime.generate.MASK_VALUE): exp() of it is 0
MASK_VALUE = np.float32(-1e30)


def attention64(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray, scale: float, softcap: float | None = None) -> np.ndarray:
    """float64 attention. q ``[B, Hq, S, D]``, k/v ``[B, Hkv, T, D]``, allowed bool broadcasting
    to ``[B, Hq, S, T]`` (every row allows a key); with ``softcap`` each scaled score ``s``
    becomes ``softcap * tanh(s / softcap)`` (Gemma 2's attention logit soft-capping,
    arXiv:2408.00118); returns ``[B, Hq, S, D]``."""
    q, k, v = as_float64(q), as_float64(k), as_float64(v)
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    raw = scale * q @ np.swapaxes(k, -1, -2)
    if softcap:
        raw = softcap * np.tanh(raw / softcap)
    scores = np.where(allowed, raw, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def assert_attention_close(got: np.ndarray, want: np.ndarray, dtype: str, v: np.ndarray, score_roundings: float) -> None:
    """``|got - want| <= (u (score_roundings + 2) + 64 u32) max|v|``, see the module docstring."""
    tol = (UNIT_ROUNDOFF[dtype] * (score_roundings + 2) + 64 * UNIT_ROUNDOFF["float32"]) * float(np.abs(as_float64(v)).max())
    np.testing.assert_allclose(as_float64(got), want, rtol=0, atol=tol, err_msg=dtype)


def max_scaled_score(q: np.ndarray, k: np.ndarray, scale: float) -> float:
    """``max |scale * q . k|`` over all query/key pairs of a head group; q ``[B, S, Hq, D]``,
    k ``[B, Hkv, T, D]``."""
    k = np.repeat(as_float64(k), q.shape[2] // k.shape[1], axis=1)
    return float(np.max(np.abs(scale * np.einsum("bshd,bhtd->bhst", as_float64(q), k))))


def causal_allowed(rng: np.random.Generator, B: int, S: int, past: int, padded: bool) -> np.ndarray:
    """bool ``[B, S, past + S]``: query ``i`` (position ``past + i``) sees keys ``<= past + i``;
    with ``padded`` each row also hides a random number of its first keys (left padding)."""
    T = past + S
    allowed = np.arange(T)[None, None, :] <= past + np.arange(S)[None, :, None]
    allowed = np.broadcast_to(allowed, (B, S, T)).copy()
    if padded:
        for b in range(B):
            allowed[b, :, : int(rng.integers(0, past + 1))] = False
    return allowed


HEADS = [(4, 4), (4, 2), (8, 1)]  # MHA, GQA, MQA
#: (batch, new tokens, cached tokens, padded rows)
STEPS = [(2, 5, 0, False), (3, 1, 7, True), (1, 4, 3, False), (1, 1, 0, False)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("step", STEPS, ids=lambda s: f"B{s[0]}-S{s[1]}-past{s[2]}{'-padded' if s[3] else ''}")
def test_attention(step: tuple, heads: tuple, dtype: str, rng: np.random.Generator) -> None:
    B, S, past, padded = step
    hq, hkv = heads
    D, T = 16, step[1] + step[2]
    scale = D**-0.5
    q = randn(rng, (B, S, hq, D), dtype)
    k_cache, v_cache = randn(rng, (B, hkv, T, D), dtype), randn(rng, (B, hkv, T, D), dtype)
    allowed = causal_allowed(rng, B, S, past, padded)
    mask = np.where(allowed, np.float32(0), MASK_VALUE)[:, None, None]  # [B, 1, 1, S, T]
    net = OneOp(lambda g, i: ops.attention(g, i["q"], i["k"], i["v"], i["mask"], hkv, D, scale),
                {"q": q, "k": k_cache, "v": v_cache, "mask": mask}, dtype=dtype,
                dynamic={"q": (0, 1), "k": (0, 2), "v": (0, 2), "mask": (0, 3, 4)})
    got = net.run()["out"]
    assert got.dtype == NP_DTYPES[dtype] and got.shape == (B, S, hq * D)
    want = attention64(np.transpose(q, (0, 2, 1, 3)), k_cache, v_cache, allowed[:, None], scale)  # [B, Hq, S, D]
    smax = max_scaled_score(q, k_cache, scale)
    assert_attention_close(got, want.transpose(0, 2, 1, 3).reshape(B, S, hq * D), dtype, v_cache, 2 * smax)
    if step == STEPS[0] and builds_rtx(dtype, heads == (4, 2)):
        [(_, shape, _)] = net.check_rtx()
        assert shape == (-1, -1, hq * D)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("softcap", [0.7, 3.0])
def test_attention_softcap_and_query_scale(softcap: float, dtype: str, rng: np.random.Generator) -> None:
    """Soft-capped scores with a query scale that is not head_dim ** -0.5 (Gemma 2's
    query_pre_attn_scalar ** -0.5); a cap of 0.7 changes the result a lot (checked)."""
    B, S, past, hq, hkv, D = 2, 5, 3, 4, 2, 16
    T, scale = S + past, 24**-0.5
    q = randn(rng, (B, S, hq, D), dtype, scale=2.0)
    k_cache, v_cache = randn(rng, (B, hkv, T, D), dtype, scale=2.0), randn(rng, (B, hkv, T, D), dtype)
    allowed = causal_allowed(rng, B, S, past, True)
    mask = np.where(allowed, np.float32(0), MASK_VALUE)[:, None, None]
    net = OneOp(lambda g, i: ops.attention(g, i["q"], i["k"], i["v"], i["mask"], hkv, D, scale, softcap=softcap),
                {"q": q, "k": k_cache, "v": v_cache, "mask": mask}, dtype=dtype,
                dynamic={"q": (0, 1), "k": (0, 2), "v": (0, 2), "mask": (0, 3, 4)})
    got = net.run()["out"]
    qt = np.transpose(q, (0, 2, 1, 3))
    want = attention64(qt, k_cache, v_cache, allowed[:, None], scale, softcap).transpose(0, 2, 1, 3).reshape(B, S, hq * D)
    assert_attention_close(got, want, dtype, v_cache, 2 * max_scaled_score(q, k_cache, scale))
    if softcap < 1:
        uncapped = attention64(qt, k_cache, v_cache, allowed[:, None], scale).transpose(0, 2, 1, 3).reshape(B, S, hq * D)
        assert np.abs(uncapped - want).max() > 0.1  # the cap matters here
    if builds_rtx(dtype, softcap == 0.7):
        [(_, shape, _)] = net.check_rtx()
        assert shape == (-1, -1, hq * D)


def kv_update64(cache: np.ndarray, update: np.ndarray, write_indices: np.ndarray) -> np.ndarray:
    """``cache[b, :, w[b] + s] = update[b, :, s]``."""
    out = cache.copy()
    for b, w in enumerate(write_indices):
        out[b, :, w : w + update.shape[2]] = update[b]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [(3, 2, 10, 4), (1, 1, 4, 1), (2, 4, 8, 8)], ids=lambda c: f"B{c[0]}-H{c[1]}-L{c[2]}-S{c[3]}")
def test_kv_cache_update(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    """The update lands at each row's write index (the last one may end at ``max_seq_len``),
    the rest of the cache is unchanged, bit for bit; in place."""
    B, H, L, S = case
    D = 8
    cache, update = randn(rng, (B, H, L, D), dtype), randn(rng, (B, H, S, D), dtype)
    w = rng.integers(0, L - S + 1, B).astype(np.int32)
    w[-1] = L - S
    net = OneOp(lambda g, i: ops.kv_cache_update(g, i["cache"], i["update"], i["write_indices"]),
                {"cache": cache, "update": update, "write_indices": w}, dtype=dtype,
                dynamic={"cache": (0,), "update": (0, 2), "write_indices": (0,)})
    got = net.run()["out"]
    want = kv_update64(cache, update, w)
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(net.fed["cache"].view(np.uint8), want.view(np.uint8))  # the cache input itself
    if builds_rtx(dtype, case == (3, 2, 10, 4)):
        [(_, shape, _)] = net.check_rtx()
        assert shape == (-1, H, L, D)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "bool_mask"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
def test_sdpa_native(heads: tuple, masked: bool, dtype: str, rng: np.random.Generator) -> None:
    """``IAttention`` on pre-scaled queries ``[B, Hq, S, D]``, GQA native."""
    hq, hkv = heads
    B, S, T, D = 2, 3, 7, 16
    q = randn(rng, (B, hq, S, D), dtype, scale=D**-0.5)  # already scaled
    k, v = randn(rng, (B, hkv, T, D), dtype), randn(rng, (B, hkv, T, D), dtype)
    feeds = {"q": q, "k": k, "v": v}
    allowed = np.ones((B, 1, S, T), bool)
    if masked:
        allowed = rng.random((B, 1, S, T)) < 0.6
        allowed[..., 0] = True
        feeds["mask"] = allowed
    net = OneOp(lambda g, i: ops.sdpa_native(g, i["q"], i["k"], i["v"], i.get("mask")), feeds, dtype=dtype,
                dynamic={name: (0, 2) for name in feeds})
    assert_attention_close(net.run()["out"], attention64(q, k, v, allowed, 1.0), dtype, v, 0)
    if builds_rtx(dtype, heads == (4, 2)):
        [(_, shape, _)] = net.check_rtx()
        assert shape == (-1, hq, -1, D)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("step", [(2, 3, False), (3, 1, True)], ids=["prefill_chunk", "decode_padded"])
def test_native_attention(step: tuple, heads: tuple, dtype: str, rng: np.random.Generator) -> None:
    """This step's k/v go into the fixed-size caches at ``write_indices``, then the queries
    attend over every slot the bool mask allows (written ones, causal)."""
    B, S, padded = step
    hq, hkv = heads
    L, D = 12, 16
    scale = D**-0.5
    q = randn(rng, (B, S, hq, D), dtype)
    k_new, v_new = randn(rng, (B, S, hkv, D), dtype), randn(rng, (B, S, hkv, D), dtype)
    k_cache, v_cache = randn(rng, (B, hkv, L, D), dtype), randn(rng, (B, hkv, L, D), dtype)
    w = rng.integers(0, L - S + 1, B).astype(np.int32)  # slot of each row's first new token
    pos = w[:, None] + np.arange(S)[None, :]  # [B, S]
    allowed = np.arange(L)[None, None, :] <= pos[:, :, None]  # [B, S, L]
    if padded:
        allowed &= np.arange(L)[None, None, :] >= rng.integers(0, w.min() + 1, B)[:, None, None]
    net = OneOp(lambda g, i: ops.native_attention(g, i["q"], i["k_new"], i["v_new"], i["k_cache"], i["v_cache"], i["write_indices"],
                                                  i["mask"], head_dim=D, scale=scale),
                {"q": q, "k_new": k_new, "v_new": v_new, "k_cache": k_cache, "v_cache": v_cache, "write_indices": w,
                 "mask": allowed[:, None]}, dtype=dtype,
                dynamic={"q": (0, 1), "k_new": (0, 1), "v_new": (0, 1), "k_cache": (0,), "v_cache": (0,), "write_indices": (0,),
                         "mask": (0, 2)})
    out = net.run()
    k_all = kv_update64(k_cache, np.transpose(k_new, (0, 2, 1, 3)), w)
    v_all = kv_update64(v_cache, np.transpose(v_new, (0, 2, 1, 3)), w)
    np.testing.assert_array_equal(as_float64(out["out1"]), as_float64(k_all))
    np.testing.assert_array_equal(as_float64(out["out2"]), as_float64(v_all))
    want = attention64(np.transpose(q, (0, 2, 1, 3)), k_all, v_all, allowed[:, None], scale)
    smax = max_scaled_score(q, k_all, scale)
    assert_attention_close(out["out0"], want.transpose(0, 2, 1, 3).reshape(B, S, hq * D), dtype, v_all, 2 * smax)
    if padded and builds_rtx(dtype, heads == (4, 2)):  # the network does not depend on the step
        shapes = [s for _, s, _ in net.check_rtx()]
        assert shapes == [(-1, -1, hq * D), (-1, hkv, L, D), (-1, hkv, L, D)]


#: per sequence (cached, new): decode, decode across a block boundary, prefill, chunked prefill
PAGED_SPECS = [[(5, 1)], [(3, 1), (8, 1), (0, 6), (9, 4)], [(0, 1)], [(17, 3), (0, 9)]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [0, 5], ids=["full", "window5"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("specs", PAGED_SPECS, ids=lambda s: "+".join(f"{c}c{n}n" for c, n in s))
def test_paged_attention(specs: list, heads: tuple, window: int, dtype: str, rng: np.random.Generator) -> None:
    paged_attention_case(specs, heads, window, dtype, rng)


#: (head_dim, scale, softcap, window): Gemma 2/3's shapes (head_dim 256, a query scale of
#: query_pre_attn_scalar ** -0.5, soft-capping, sliding windows)
GEMMA_PAGED = [(256, 200**-0.5, 1.5, 5), (16, 24**-0.5, 0.5, 0), (32, 32**-0.5, None, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GEMMA_PAGED, ids=lambda c: f"D{c[0]}-cap{c[2]}-w{c[3]}")
def test_paged_attention_softcap_scale_head_dim(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    D, scale, softcap, window = case
    paged_attention_case(PAGED_SPECS[1] + [(0, 9)], (4, 2), window, dtype, rng, head_dim=D, scale=scale, softcap=softcap)


def paged_attention_case(
    specs: list, heads: tuple, window: int, dtype: str, rng: np.random.Generator, head_dim: int = 16, scale: float | None = None,
    softcap: float | None = None,
) -> None:
    """One paged_attention call on ``specs`` (per sequence (cached, new)) against
    :func:`attention64`, and its pool write checked bit for bit."""
    hq, hkv = heads
    D, bs, layers, layer = head_dim, 4, 2, 1
    scale = D**-0.5 if scale is None else scale
    B = len(specs)
    seq_lens = np.array([c + n for c, n in specs], np.int32)
    qsl = np.concatenate([[0], np.cumsum([n for _, n in specs])]).astype(np.int32)
    T = int(qsl[-1])
    nblk = -(-seq_lens // bs)
    num_blocks = int(nblk.sum()) + 3
    ids = rng.permutation(num_blocks).astype(np.int32)
    block_tables = np.zeros((B, int(nblk.max()) + 1), np.int32)  # entries past a sequence's blocks are never read
    starts = np.concatenate([[0], np.cumsum(nblk)])
    for b in range(B):
        block_tables[b, : nblk[b]] = ids[starts[b] : starts[b + 1]]
    pool = np.full((layers, num_blocks, 2, hkv, bs, D), np.nan).astype(NP_DTYPES[dtype])
    cached_k, cached_v = [], []
    for b, (cached, _) in enumerate(specs):
        kv = randn(rng, (cached, 2, hkv, D), dtype)
        for p in range(cached):
            pool[layer, block_tables[b, p // bs], :, :, p % bs] = kv[p]
        cached_k.append(kv[:, 0])
        cached_v.append(kv[:, 1])
    q = randn(rng, (T, hq, D), dtype)
    k, v = randn(rng, (T, hkv, D), dtype), randn(rng, (T, hkv, D), dtype)

    net = OneOp(lambda g, i: ops.paged_attention(g, i["q"], i["k"], i["v"], i["kv_pool"], i["block_tables"], i["seq_lens"],
                                                 i["query_start_loc"], layer_idx=layer, num_kv_heads=hkv, head_dim=D, block_size=bs,
                                                 sliding_window=window, scale=scale, softcap=softcap),
                {"q": q, "k": k, "v": v, "kv_pool": pool, "block_tables": block_tables, "seq_lens": seq_lens, "query_start_loc": qsl},
                dtype=dtype)
    got = net.run()["out"]
    assert got.dtype == NP_DTYPES[dtype] and got.shape == (T, hq * D)

    want_pool = pool.copy()
    for b, (cached, n) in enumerate(specs):
        t0, t1 = qsl[b], qsl[b + 1]
        keys = np.concatenate([cached_k[b], k[t0:t1]])  # [cached + n, Hkv, D], position order
        values = np.concatenate([cached_v[b], v[t0:t1]])
        qpos, kpos = cached + np.arange(n)[:, None], np.arange(cached + n)[None, :]
        allowed = (kpos <= qpos) & ((qpos - kpos < window) if window else True)
        want = attention64(q[t0:t1].transpose(1, 0, 2)[None], keys.transpose(1, 0, 2)[None], values.transpose(1, 0, 2)[None],
                           allowed[None, None], scale, softcap)  # [1, Hq, n, D]
        assert_attention_close(got[t0:t1], want[0].transpose(1, 0, 2).reshape(n, hq * D), dtype, values, 0)
        for j in range(n):
            p = cached + j
            want_pool[layer, block_tables[b, p // bs], :, :, p % bs] = np.stack([k[t0 + j], v[t0 + j]])
    # the step's keys/values are written into their slots of layer `layer`; nothing else changes
    np.testing.assert_array_equal(net.fed["kv_pool"].view(np.uint8), want_pool.view(np.uint8))
