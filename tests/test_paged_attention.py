"""The paged attention plugin (``trtcore_paged_attention``).

CPU (CI): the plugin's NumPy reference against a plain float64 attention written here
(per sequence: gather its cached keys from the pool in order, append the new ones, causal
mask, optional window, GQA by repeating KV heads), on mixed batches of prefills, chunked
prefills and decodes with random, shuffled block tables; the pool write (exactly the new
slots change, every other slot keeps its sentinel); field serialization.

GPU (marker ``gpu``): ``enqueue`` against the reference for the same cases in float16,
bfloat16 and float32, and for Gemma 2/3's needs (attention logit soft-capping, a given
query scale, head_dim 256, sliding windows). They skip, saying why, without CuPy or a GPU, and fail on a GPU when
broken. Tolerances:

* the reference itself computes in float32 and rounds once: against float64 its output is
  within one rounding of the dtype (unit roundoff u = 2^-24 float32, 2^-11 float16,
  2^-8 bfloat16) plus float32 noise;
* the tensor-core kernels (float16/bfloat16) also round each softmax probability p to the
  dtype before P.V (as FlashAttention): |sum dp * v| <= u * sum p |v| <= u * max|v|; the
  kernel's and the reference's outputs are each rounded once (<= u |out| each). So per
  element ``|got - ref| <= 2u |ref| + u max|v|`` -- we allow ``2u (|ref| + max|v|)``, and
  ``||got - ref64|| / ||ref64||`` within 1e-2 (bfloat16), 2e-3 (float16), 1e-5 (float32).
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

from trtcore.plugins.base import DeviceTensor, Dim, PluginError, create, register
from trtcore.plugins.paged_attention import INPUT_NAMES, PagedAttentionPlugin

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
UNIT_ROUNDOFF = {F32: 2.0**-24, F16: 2.0**-11, BF16: 2.0**-8}
REL_NORM_TOL = {F32: 1e-5, F16: 2e-3, BF16: 1e-2}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def seed_of(*parts: object) -> int:
    """A stable seed per test case (``hash`` of a str changes between processes)."""
    return zlib.crc32(repr(parts).encode())


# ---------------------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------------------


def mixed_specs(bs: int) -> list[tuple[int, int]]:
    """(cached, new) per sequence: decodes, prefills and chunked prefills of lengths 1,
    bs-1, bs, bs+1 and many blocks."""
    return [
        (0, 1),  # a one-token prompt (a prefill of length 1 is a "decode" of an empty cache)
        (0, bs - 1),  # prefill, bs-1
        (bs - 1, 1),  # decode to length bs
        (0, bs),  # prefill, exactly one block
        (bs, 1),  # decode, first token of a new block (bs+1)
        (0, bs + 1),  # prefill, bs+1
        (37, 5),  # chunked prefill
        (3 * bs, bs + 2),  # chunked prefill across block boundaries
        (5 * bs + 3, 1),  # decode, many blocks
        (0, 70),  # prefill of more than one 64-row tile
        (11 * bs + 7, 1),  # long decode
    ]


class Case:
    """Random inputs of one step, with the pool poisoned by a NaN sentinel outside the
    cached tokens, and random shuffled block ids (non-contiguous, other sequences' blocks
    interleaved, unused blocks left over)."""

    def __init__(self, specs, *, bs, hkv, g, d, dtype, window=0, num_layers=3, layer=1, seed=0, scale=0.0, softcap=0.0):
        rng = np.random.default_rng(seed)
        self.specs, self.bs, self.hkv, self.g, self.d = specs, bs, hkv, g, d
        self.dtype, self.window, self.layer = np.dtype(dtype), window, layer
        hq = hkv * g
        B = len(specs)
        qlens = [n for _, n in specs]
        seq_lens = [c + n for c, n in specs]
        nblk = [cdiv(s, bs) for s in seq_lens]
        max_blocks = max(nblk) + 2
        num_blocks = sum(nblk) + 7
        ids = rng.permutation(num_blocks)
        bt = np.full((B, max_blocks), num_blocks + 1_000_003, np.int32)  # unused entries: far out of range
        used = 0
        for b, n in enumerate(nblk):
            bt[b, :n] = ids[used : used + n]
            used += n
        T = sum(qlens)
        self.T, self.B, self.hq = T, B, hq
        self.q = rng.standard_normal((T, hq, d)).astype(self.dtype)
        self.k = rng.standard_normal((T, hkv, d)).astype(self.dtype)
        self.v = rng.standard_normal((T, hkv, d)).astype(self.dtype)
        pool = np.full((num_layers, num_blocks, 2, hkv, bs, d), np.nan, np.float32).astype(self.dtype)
        for b, (cached, _) in enumerate(specs):
            for pos in range(cached):
                blk, row = bt[b, pos // bs], pos % bs
                pool[layer, blk, :, :, row, :] = rng.standard_normal((2, hkv, d)).astype(self.dtype)
        self.pool = pool
        self.block_tables = bt
        self.seq_lens = np.asarray(seq_lens, np.int32)
        self.qsl = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
        self.plugin = PagedAttentionPlugin(
            layer_idx=layer, num_kv_heads=hkv, head_dim=d, block_size=bs, sliding_window=window, scale=scale, softcap=softcap
        )

    def inputs(self, pool=None):
        return [self.q, self.k, self.v, self.pool.copy() if pool is None else pool, self.block_tables, self.seq_lens, self.qsl]

    def stored(self, kind: int, values: np.ndarray) -> np.ndarray:
        """What the pool holds for new ``values`` of ``kind`` (0 keys, 1 values): the values."""
        return values

    def expected_pool(self) -> np.ndarray:
        """The pool after the step, built slot by slot here (each new token as :meth:`stored`)."""
        pool = self.pool.copy()
        for b, (cached, n) in enumerate(self.specs):
            for j in range(n):
                pos, t = cached + j, int(self.qsl[b]) + j
                blk, row = self.block_tables[b, pos // self.bs], pos % self.bs
                pool[self.layer, blk, 0, :, row, :] = self.stored(0, self.k[t])
                pool[self.layer, blk, 1, :, row, :] = self.stored(1, self.v[t])
        return pool

    def attention_f64(self, softcap: bool = True) -> np.ndarray:
        """Plain float64 attention: [T, Hq * D]; the plugin's soft-capping ``c * tanh(s / c)``
        of each scaled score ``s`` (Gemma 2, arXiv:2408.00118) unless ``softcap`` is False."""
        out = np.zeros((self.T, self.hq, self.d))
        scale = float(self.plugin.scale)
        for b, (cached, n) in enumerate(self.specs):
            q0 = int(self.qsl[b])
            old = [self.pool[self.layer, self.block_tables[b, p // self.bs], :, :, p % self.bs, :] for p in range(cached)]
            old_k = np.array([o[0] for o in old], np.float64).reshape(cached, self.hkv, self.d)
            old_v = np.array([o[1] for o in old], np.float64).reshape(cached, self.hkv, self.d)
            keys = np.concatenate([old_k, self.k[q0 : q0 + n].astype(np.float64)])
            vals = np.concatenate([old_v, self.v[q0 : q0 + n].astype(np.float64)])
            keys = np.repeat(keys, self.g, axis=1)  # [S, Hq, D]
            vals = np.repeat(vals, self.g, axis=1)
            q = self.q[q0 : q0 + n].astype(np.float64)  # [n, Hq, D]
            s = np.einsum("ihd,jhd->hij", q, keys) * scale
            cap = float(self.plugin.softcap)
            if cap and softcap:
                s = cap * np.tanh(s / cap)
            qpos = cached + np.arange(n)[:, None]
            kpos = np.arange(cached + n)[None, :]
            allowed = kpos <= qpos
            if self.window:
                allowed &= qpos - kpos < self.window
            s = np.where(allowed[None], s, -np.inf)
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            out[q0 : q0 + n] = np.einsum("hij,jhd->ihd", p, vals)
        return out.reshape(self.T, self.hq * self.d)


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


CASES = {
    # name: (specs(bs), hkv, g, d, window)
    "mixed_gqa8": (mixed_specs, 2, 8, 64, 0),
    "mixed_mha": (mixed_specs, 3, 1, 128, 0),
    "mixed_mqa": (mixed_specs, 1, 4, 64, 0),
    "window": (lambda bs: [(60, 1), (0, 45), (30, 12), (3, 1), (2 * bs + 5, 1), (100, 3)], 2, 4, 64, 20),
    "decode_only": (lambda bs: [(bs - 1, 1), (7 * bs, 1), (0, 1), (300, 1), (2, 1)], 2, 8, 128, 0),
}

#: Gemma 2/3 shapes: name -> (specs(bs), hkv, g, d, window, scale, softcap). head_dim 256 (the
#: CUDA-core kernel), soft-capping with caps small enough to change the result (checked by
#: test_gemma_cases_depend_on_softcap), query scales other than head_dim ** -0.5
#: (query_pre_attn_scalar ** -0.5), sliding windows shorter than the sequences.
GEMMA_CASES = {
    "gemma_d256_softcap": (mixed_specs, 2, 4, 256, 0, 224**-0.5, 5.0),
    "gemma_d256_window": (lambda bs: [(60, 1), (0, 45), (30, 12), (3, 1), (2 * bs + 5, 1)], 1, 8, 256, 20, 256**-0.5, 0.0),
    "gemma_d128_softcap_window": (mixed_specs, 2, 4, 128, 24, 0.05, 3.0),
    "gemma_d64_softcap_scale": (mixed_specs, 1, 4, 64, 0, 0.3, 2.0),
}


def gemma_case(name: str, bs: int, dtype: np.dtype) -> Case:
    spec_fn, hkv, g, d, window, scale, softcap = GEMMA_CASES[name]
    return Case(spec_fn(bs), bs=bs, hkv=hkv, g=g, d=d, dtype=dtype, window=window, scale=scale, softcap=softcap, seed=seed_of(name, bs, str(dtype)))


# ---------------------------------------------------------------------------------------
# CPU: reference numerics and the pool write
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_matches_float64_attention(name: str, bs: int) -> None:
    spec_fn, hkv, g, d, window = CASES[name]
    case = Case(spec_fn(bs), bs=bs, hkv=hkv, g=g, d=d, dtype=F32, window=window, seed=seed_of(name, bs))
    pool = case.pool.copy()
    (out,) = case.plugin.reference(*case.inputs(pool))
    assert out.shape == (case.T, case.hq * d) and out.dtype == F32
    ref = case.attention_f64()
    err = np.abs(out.astype(np.float64) - ref)
    assert np.isfinite(out).all()
    assert err.max() <= 1e-5 * max(1.0, np.abs(ref).max()), err.max()
    # the pool: exactly the new tokens' slots changed, to exactly k and v
    np.testing.assert_array_equal(bits(pool), bits(case.expected_pool()))


@pytest.mark.parametrize("name", sorted(GEMMA_CASES))
def test_reference_softcap_scale_head_dim_match_float64(name: str) -> None:
    case = gemma_case(name, 16, F32)
    pool = case.pool.copy()
    (out,) = case.plugin.reference(*case.inputs(pool))
    np.testing.assert_allclose(out.astype(np.float64), case.attention_f64(), rtol=0, atol=2e-5 * float(np.abs(case.v).max()))
    np.testing.assert_array_equal(bits(pool), bits(case.expected_pool()))


@pytest.mark.parametrize("name", [n for n in sorted(GEMMA_CASES) if GEMMA_CASES[n][6]])
def test_gemma_cases_depend_on_softcap(name: str) -> None:
    """The caps change the attention a lot, so the GPU comparisons test the kernels' capping."""
    case = gemma_case(name, 16, F32)
    assert np.abs(case.attention_f64() - case.attention_f64(softcap=False)).max() > 0.1


def test_softcap_field_round_trips_and_validates() -> None:
    import trtcore.reference as ref

    p = PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=256, block_size=16, scale=224**-0.5, softcap=50.0)
    fc = p.field_collection(ref)
    assert "softcap" in {f.name for f in fc} and PagedAttentionPlugin.from_field_collection(fc) == p
    assert p.defines(F16)["SOFTCAP"] == 1 and "SOFTCAP" not in _plugin().defines(F16)
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(PluginError, match="softcap"):
            PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=64, block_size=16, softcap=bad)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_reference_low_precision_rounds_once(dtype: np.dtype) -> None:
    case = Case(mixed_specs(16), bs=16, hkv=2, g=8, d=64, dtype=dtype, seed=7)
    pool = case.pool.copy()
    (out,) = case.plugin.reference(*case.inputs(pool))
    assert out.dtype == dtype
    ref = case.attention_f64()
    u = UNIT_ROUNDOFF[dtype]
    err = np.abs(out.astype(np.float64) - ref)
    assert (err <= u * np.abs(ref) + 1e-5).all(), err.max()
    np.testing.assert_array_equal(bits(pool), bits(case.expected_pool()))


def test_reference_steps_reuse_the_pool() -> None:
    """A prefill, then decodes, then a chunk, each step writing into the same pool array,
    equals attention over the whole sequence at once."""
    rng = np.random.default_rng(3)
    bs, hkv, g, d = 16, 2, 2, 32
    n = 40
    plugin = PagedAttentionPlugin(layer_idx=0, num_kv_heads=hkv, head_dim=d, block_size=bs)
    q = rng.standard_normal((n, hkv * g, d)).astype(F32)
    k = rng.standard_normal((n, hkv, d)).astype(F32)
    v = rng.standard_normal((n, hkv, d)).astype(F32)
    pool = np.full((1, 6, 2, hkv, bs, d), np.nan, F32)
    bt = np.array([[4, 1, 5, 0]], np.int32)
    outs = []
    start = 0
    for step in (17, 1, 1, 9, 1, 11):
        end = start + step
        (o,) = plugin.reference(q[start:end], k[start:end], v[start:end], pool, bt, np.array([end], np.int32), np.array([0, step], np.int32))
        outs.append(o)
        start = end
    whole_pool = np.full_like(pool, np.nan)
    (whole,) = plugin.reference(q, k, v, whole_pool, bt, np.array([n], np.int32), np.array([0, n], np.int32))
    np.testing.assert_allclose(np.concatenate(outs), whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(bits(pool), bits(whole_pool))


def test_reference_rejects_bad_inputs() -> None:
    case = Case([(3, 2), (0, 4)], bs=16, hkv=1, g=2, d=32, dtype=F32)
    q, k, v, pool, bt, sl, qsl = case.inputs()
    with pytest.raises(PluginError, match="query_start_loc"):
        case.plugin.reference(q, k, v, pool, bt, sl, np.array([0, 2, 5], np.int32))
    with pytest.raises(PluginError, match="seq_lens"):
        case.plugin.reference(q, k, v, pool, bt, np.array([1, 4], np.int32), qsl)
    bad_bt = bt.copy()
    bad_bt[1, 0] = -1
    with pytest.raises(PluginError, match="block ids"):
        case.plugin.reference(q, k, v, pool, bad_bt, sl, qsl)
    with pytest.raises(PluginError, match="int32"):
        case.plugin.reference(q, k, v, pool, bt.astype(np.int64), sl, qsl)
    with pytest.raises(PluginError, match="numpy"):
        case.plugin.reference(q, k, v, list(pool), bt, sl, qsl)


# ---------------------------------------------------------------------------------------
# CPU: fields, shapes, types, workspace
# ---------------------------------------------------------------------------------------


def _plugin() -> PagedAttentionPlugin:
    return PagedAttentionPlugin(layer_idx=5, num_kv_heads=8, head_dim=128, block_size=32, sliding_window=4096, scale=128**-0.5)


def test_fields_round_trip_reference_collection() -> None:
    import trtcore.reference as ref

    p = _plugin()
    fc = p.field_collection(ref)
    assert isinstance(fc, ref.PluginFieldCollection)
    assert {f.name for f in fc} == {"layer_idx", "num_kv_heads", "head_dim", "block_size", "sliding_window", "scale"}
    back = PagedAttentionPlugin.from_field_collection(fc)
    assert back == p
    assert back.scale == float(np.float32(128**-0.5))
    made = create(p, ref)  # through the registered creator, as an engine build does
    assert isinstance(made, PagedAttentionPlugin) and made == p
    assert register(PagedAttentionPlugin, ref).name == "trtcore_paged_attention"


def test_fields_round_trip_tensorrt_rtx_collection() -> None:
    trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx is not installed")
    p = _plugin()
    fc = p.field_collection(trt)
    assert isinstance(fc, trt.PluginFieldCollection)
    assert PagedAttentionPlugin.from_field_collection(fc) == p


def test_default_scale_and_validation() -> None:
    p = PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=64, block_size=16)
    assert p.scale == float(np.float32(0.125)) and p.sliding_window == 0
    bads: list[dict] = [{"head_dim": 0}, {"head_dim": 2048}, {"num_kv_heads": 0}, {"block_size": 0}, {"sliding_window": -1}, {"layer_idx": -1}, {"scale": -1.0}]
    for bad in bads:
        kw = {"layer_idx": 0, "num_kv_heads": 2, "head_dim": 64, "block_size": 16} | bad
        with pytest.raises(PluginError):
            PagedAttentionPlugin(**kw)


def test_shapes_types_supports() -> None:
    p = PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=64, block_size=16)
    shapes = [[Dim(s) for s in shape] for shape in [(7, 8, 64), (7, 2, 64), (7, 2, 64), (3, 10, 2, 2, 16, 64), (2, 5), (2,), (3,)]]
    [[t, f]] = p.output_shapes(shapes)
    assert (t.value, f.value) == (7, 512)
    dts = [BF16] * 4 + [np.dtype(np.int32)] * 3
    assert p.output_dtypes(dts) == [BF16]
    assert all(p.supports(i, dts + [BF16], 7) for i in range(8))
    assert not p.supports(7, dts + [F16], 7)
    assert not p.supports(4, [BF16] * 4 + [np.dtype(np.int64)], 7)
    assert not p.supports(0, [np.dtype(np.int32)], 7)
    with pytest.raises(PluginError, match="num_kv_heads"):
        p.output_shapes([[Dim(s) for s in shape] for shape in [(7, 8, 64), (7, 4, 64), (7, 4, 64), (3, 10, 2, 4, 16, 64), (2, 5), (2,), (3,)]])
    with pytest.raises(PluginError, match="int32"):
        p.output_dtypes([BF16] * 4 + [np.dtype(np.int64)] * 3)
    assert p.input_names() == list(INPUT_NAMES)


def test_splits_of_a_full_wave_minimize_waves_times_slice_cost() -> None:
    """With at least ``slots`` CTAs unsplit (batch * KV heads here) the split count is the
    smallest minimizer of ceil(CTAs * s / slots) * (max_keys / s + split_cost_keys), computed
    here by brute force; the H200 measurements it was fitted to: batch 256, context 256 takes 1
    split (96 us against 2 splits' 120 us), context 4096 keeps the 3 it had (990 us)."""
    from trtcore.plugins.paged_attention import TUNING

    p = PagedAttentionPlugin(layer_idx=0, num_kv_heads=8, head_dim=128, block_size=16)
    slots, cost_keys = TUNING["slots"], TUNING["split_cost_keys"]
    assert p.num_splits(256, 32, 256 // 16, BF16) == 1
    assert p.num_splits(256, 32, 4096 // 16, BF16) == 3
    rng = np.random.default_rng()
    for _ in range(200):
        batch = int(rng.integers(50, 1024))  # 8 KV heads: >= 400 CTAs
        blocks = int(rng.integers(1, 2048))
        keys = blocks * 16
        limit = min(64, max(1, keys // 128), max(1, (1 << 17) // (batch * 32)))
        costs = [np.ceil(batch * 8 * s / slots) * (keys / s + cost_keys) for s in range(1, limit + 1)]
        assert p.num_splits(batch, 32, blocks, BF16) == 1 + int(np.argmin(costs)), (batch, blocks)


def test_few_ctas_split_down_to_one_key_tile() -> None:
    """With fewer decode CTAs than SMs, up to ``few_cta_splits`` (4) slices of one key tile (64
    keys) while each CTA keeps an SM, where the other rules give fewer: the H100 measurements
    (bench/results/h100-2026-12-06-session31/call1, session 30): context 256 at batch 1, 2 and 4
    takes 4 splits (6.92 / 7.01 / 8.49 us against the earlier 2's 8.62 / 8.71 / 9.00), batch 8
    keeps 2 (4 were slower), batch 32 and 256 keep 1; context 1024 at batch 1 keeps 8 (8.83 us,
    16 took 9.33); the full-wave rule is untouched."""
    from trtcore.plugins.paged_attention import TUNING

    p = PagedAttentionPlugin(layer_idx=0, num_kv_heads=8, head_dim=128, block_size=16)
    assert [p.num_splits(b, 32, 256 // 16, BF16) for b in (1, 2, 4, 8, 32, 256)] == [4, 4, 4, 2, 1, 1]
    assert p.num_splits(1, 32, 1024 // 16, BF16) == 8
    sms, few = TUNING["sms"], TUNING["few_cta_splits"]
    for batch in range(1, 17):
        ctas = batch * 8
        for keys in (64, 128, 256, 512, 1024, 4096):
            s = p.num_splits(batch, 32, keys // 16, BF16)
            tiles = keys // 64
            # at least as many one-tile slices as keep a CTA per SM (up to `few`), never more slices than tiles
            assert s >= min(tiles, sms // ctas, few), (batch, keys, s)
            assert s <= max(tiles, 1), (batch, keys, s)


def test_workspace_covers_every_batch() -> None:
    p = PagedAttentionPlugin(layer_idx=0, num_kv_heads=8, head_dim=128, block_size=16)
    hq, max_blocks = 32, 2048
    ws = p.workspace_size([((64, hq, 128), BF16), ((64, 8, 128), BF16), ((64, 8, 128), BF16), ((1, 10, 2, 8, 16, 128), BF16), ((64, max_blocks), np.int32), ((64,), np.int32), ((65,), np.int32)], [((64, hq * 128), BF16)])
    for b in range(1, 65):
        s = p.num_splits(b, hq, max_blocks, BF16)
        assert 1 <= s <= 64
        assert (s == 1) or s * b * hq * (128 + 2) * 4 <= ws
    assert p.num_splits(1, hq, max_blocks, BF16) > 1  # one long sequence is split
    assert p.num_splits(1, hq, max_blocks, F32) == 1  # float32 has no split kernel
    # the GPU tests' long decodes do take the split path (partials + reduction)
    assert PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=128, block_size=16).num_splits(3, 8, cdiv(4001, 16) + 2, BF16) > 1
    assert ws < 256 * 2**20


# ---------------------------------------------------------------------------------------
# GPU: enqueue against the reference
# ---------------------------------------------------------------------------------------


def _cupy():
    from trtcore.testing import gpu_status

    ok, why = gpu_status()
    if not ok:
        pytest.skip(why)
    import cupy

    return cupy


def _dev(cp, a: np.ndarray):
    """``a`` on the device; ml_dtypes types (bfloat16, float8_e4m3fn) travel as their bits."""
    a = np.ascontiguousarray(a)
    return cp.asarray(bits(a) if a.dtype in (BF16, E4M3) else a)


def run_enqueue(case: Case, pool: np.ndarray | None = None, repeats: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """enqueue on the GPU (output poisoned with NaN first, run ``repeats`` times; every run
    must give the same bits); returns (out, pool after)."""
    cp = _cupy()
    dt = case.dtype
    host = case.inputs(pool)
    dev = [_dev(cp, a) for a in host]
    descs = [DeviceTensor(int(d.data.ptr), tuple(a.shape), a.dtype) for d, a in zip(dev, host)]
    p = case.plugin
    out_shape = (case.T, case.hq * case.d)
    out = cp.empty(out_shape, dtype=np.uint16 if dt == BF16 else dt)
    ws_bytes = p.workspace_size([(a.shape, a.dtype) for a in host], [(out_shape, dt)])
    ws = cp.empty(max(ws_bytes, 1), np.uint8)
    ws.fill(0xA5)
    stream = cp.cuda.Stream(non_blocking=True)
    results = []
    for _ in range(repeats):
        with stream:
            out.view(np.uint8).fill(0xFF)  # NaN in every float format
        p.enqueue(descs, [DeviceTensor(int(out.data.ptr), out_shape, dt)], int(ws.data.ptr) if ws_bytes else 0, int(stream.ptr))
        stream.synchronize()
        got = cp.asnumpy(out)
        results.append(got.view(BF16) if dt == BF16 else got)
    for r in results[1:]:
        np.testing.assert_array_equal(bits(r), bits(results[0]), err_msg="enqueue is not deterministic (a race?)")
    (at,) = [i for i, a in enumerate(host) if a.ndim == case.pool.ndim and a.shape == case.pool.shape]  # its place depends on the plugin's inputs
    pool_after = cp.asnumpy(dev[at])
    return results[0], pool_after.view(host[at].dtype)  # the host pool's type (bfloat16, E4M3 codes)


def check_gpu(case: Case) -> dict:
    got, pool_after = run_enqueue(case)
    ref_pool = case.pool.copy()
    (ref,) = case.plugin.reference(*case.inputs(ref_pool))
    # pool: exactly the reference's (new slots = k/v, everything else untouched)
    np.testing.assert_array_equal(bits(pool_after), bits(ref_pool))
    return assert_output_close(case, got, ref, float(np.abs(case.v.astype(np.float32)).max()))


def assert_output_close(case: Case, got: np.ndarray, ref: np.ndarray, vmax: float) -> dict:
    """The GPU output against the plugin's reference: every element within ``2u (|ref| + vmax)``
    (float32: ``1e-5``), none left unwritten, and the relative norm error against float64
    attention (``case.attention_f64()``) within :data:`REL_NORM_TOL`."""
    assert not np.isnan(got.astype(np.float32)).any(), "output elements left unwritten (NaN)"
    u = UNIT_ROUNDOFF[case.dtype]
    g64, r64 = got.astype(np.float64), ref.astype(np.float64)
    if case.dtype == F32:
        bound = 1e-5 * (np.abs(r64) + vmax)
    else:
        bound = 2 * u * (np.abs(r64) + vmax)
    err = np.abs(g64 - r64)
    worst = np.unravel_index(int(np.argmax(err / bound)), err.shape)
    assert (err <= bound).all(), f"{(err > bound).sum()} elements off; worst at {worst}: got {g64[worst]}, ref {r64[worst]}, bound {bound[worst]}"
    f64 = case.attention_f64()
    rel = float(np.linalg.norm(g64 - f64) / np.linalg.norm(f64))
    assert rel <= REL_NORM_TOL[case.dtype], rel
    return {"max_abs_err": float(err.max()), "rel_norm_err_vs_f64": rel}


GPU_DTYPES = [F16, BF16, F32]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_enqueue_matches_reference(name: str, bs: int, dtype: np.dtype) -> None:
    spec_fn, hkv, g, d, window = CASES[name]
    case = Case(spec_fn(bs), bs=bs, hkv=hkv, g=g, d=d, dtype=dtype, window=window, seed=seed_of(name, bs, str(dtype)))
    check_gpu(case)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize(
    "specs,hkv,g,window",
    [
        ([(4000, 1), (2500, 1), (17, 1)], 2, 4, 0),  # long decodes: many splits + reduction
        ([(5000, 1), (0, 300)], 1, 8, 0),  # a long decode beside a long prefill
        ([(700, 1), (650, 40)], 1, 20, 0),  # 20 query heads per KV head: two decode row tiles
        ([(3000, 1), (1000, 70)], 2, 4, 1000),  # window within a long sequence, decode and chunk
    ],
    ids=["long_decodes", "decode_and_long_prefill", "gqa20", "window_long"],
)
@pytest.mark.parametrize("bs", [16, 64])
def test_gpu_long_sequences(specs, hkv: int, g: int, window: int, bs: int, dtype: np.dtype) -> None:
    case = Case(specs, bs=bs, hkv=hkv, g=g, d=128, dtype=dtype, window=window, num_layers=2, layer=0, seed=seed_of(specs, bs))
    check_gpu(case)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("name", sorted(GEMMA_CASES))
def test_gpu_softcap_scale_head_dim_window(name: str, bs: int, dtype: np.dtype) -> None:
    """Gemma 2/3: soft-capping, a given query scale, head_dim 256, sliding windows (decode,
    prefill and chunked prefill kernels; head_dim 256 on the CUDA-core kernel)."""
    check_gpu(gemma_case(name, bs, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("d", [128, 256])
def test_gpu_softcap_long_sequences(d: int, dtype: np.dtype) -> None:
    """Soft-capped long decodes (split + reduction on the tensor-core kernels at d 128) beside a
    windowed chunked prefill."""
    case = Case([(4000, 1), (2500, 1), (1000, 70)], bs=16, hkv=2, g=4, d=d, dtype=dtype, window=1500, num_layers=2, layer=0,
                seed=seed_of("softcap_long", d, str(dtype)), scale=0.06, softcap=4.0)
    check_gpu(case)


def test_reference_network_updates_the_pool_in_place() -> None:
    """In a ``trtcore.reference`` network (plugin made through its registered creator) the
    pool fed as an input is the array the plugin writes: a prefill step, then a decode step
    on the same pool array, equal the plugin's reference on its own pool."""
    import trtcore.reference as ref
    from trtcore.reference.evaluator import evaluate

    bs, d = 4, 32
    p = PagedAttentionPlugin(layer_idx=1, num_kv_heads=1, head_dim=d, block_size=bs)
    net = ref.Builder(ref.Logger(ref.Logger.ERROR)).create_network(1 << int(ref.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    F, I = ref.DataType.FLOAT, ref.DataType.INT32
    ins = [
        net.add_input("q", F, (-1, 2, d)), net.add_input("k", F, (-1, 1, d)), net.add_input("v", F, (-1, 1, d)),
        net.add_input("kv_pool", F, (2, 4, 2, 1, bs, d)), net.add_input("block_tables", I, (-1, 4)),
        net.add_input("seq_lens", I, (-1,)), net.add_input("query_start_loc", I, (-1,)),
    ]  # fmt: skip
    out = net.add_plugin_v3(ins, [], create(p, ref)).get_output(0)
    out.name = "out"
    net.mark_output(out)
    assert tuple(out.shape) == (-1, 2 * d)
    rng = np.random.default_rng(11)
    pool = np.full((2, 4, 2, 1, bs, d), np.nan, F32)
    own_pool = pool.copy()
    bt = np.array([[2, 0, 3, 1]], np.int32)
    start = 0
    for n in (5, 1, 1):
        x = rng.standard_normal((n, 4, d)).astype(F32)
        q, k, v = x[:, :2].copy(), x[:, 2:3].copy(), x[:, 3:4].copy()
        seq = np.array([start + n], np.int32)
        qsl = np.array([0, n], np.int32)
        feeds = {"q": q, "k": k, "v": v, "kv_pool": pool, "block_tables": bt, "seq_lens": seq, "query_start_loc": qsl}
        got = evaluate(net, feeds)["out"]
        (want,) = p.reference(q, k, v, own_pool, bt, seq, qsl)
        np.testing.assert_array_equal(np.asarray(got), want)
        start += n
    np.testing.assert_array_equal(bits(pool), bits(own_pool))
    # 7 tokens: block 2 full, block 0 rows 0-2; nothing else written
    assert np.isfinite(pool[1, 2]).all() and np.isfinite(pool[1, 0, :, :, :3]).all()
    assert np.isnan(pool[1, 0, :, :, 3]).all() and np.isnan(pool[1, [1, 3]]).all() and np.isnan(pool[0]).all()
