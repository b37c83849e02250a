"""The paged attention plugin with an FP8 (E4M3) KV cache (field ``kv_fp8``; vLLM's
``kv_cache_dtype="fp8_e4m3"``).

The contract (plugins/paged_attention.py, "FP8 KV cache"): the pool holds
``code = e4m3(clip(float32(x) / scale, -448, 448))`` (round to nearest even, saturating) and
attention reads ``float32(code) * scale``, never rounded to the model dtype (FlashInfer's
``k_scale`` / ``v_scale``), for every key and value -- the step's own new tokens included.

CPU (CI): the reference against a float64 attention written here over K/V rounded through E4M3
with ml_dtypes (not through trtcore's quantizer), on mixed batches of prefills, chunked prefills
and decodes, GQA/MQA, scales other than 1 (one case small enough to saturate); the pool's new
slots hold exactly the E4M3 codes of ``x / scale`` and nothing else changes; saturation;
fields, dtypes and validation.

GPU (marker ``gpu``; skip without CuPy or a GPU): ``enqueue`` with the ``KV_FP8`` kernels against
the reference, float16 and bfloat16, head_dim 64 / 128 (tensor cores) and 96 (the CUDA-core
kernel), decodes with many splits. The pool after the step must equal the reference's pool bit
for bit (the kernels' E4M3 conversion is the reference's). The output tolerance is the 16-bit
pool's (tests/test_paged_attention.py): kernel and reference attend over the *same* values
(``code * scale``: the kernels multiply the exact float16 codes and scale the scores and the
output, the reference multiplies float32 products; a bfloat16 q reaches float16 exactly after
its power-of-two row scaling), so what is left is the tensor-core kernels' rounding of each
probability to float16 and the two final roundings: ``|got - ref| <= 2u (|ref| + max|v|)`` with
``max|v|`` over the values read; and against the float64 attention over the same E4M3 values the
relative norm error is the dtype's (2e-3 float16, 1e-2 bfloat16). Rows of q far from 1 in
magnitude (1e-6, 1e4) check that power-of-two scaling: float16 would flush or overflow them.
"""

from __future__ import annotations

import copy
import dataclasses

import ml_dtypes
import numpy as np
import pytest
from test_paged_attention import (
    BF16,
    CASES,
    F16,
    F32,
    UNIT_ROUNDOFF,
    Case,
    assert_output_close,
    bits,
    mixed_specs,
    run_enqueue,
    seed_of,
)
from test_paged_attention_rope import FusedCase

from trtcore.plugins.base import PluginError
from trtcore.plugins.paged_attention import PagedAttentionPlugin

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def e4m3_codes(x: np.ndarray, scale: float) -> np.ndarray:
    """The formula's codes, written here: float32 division, saturate to +-448, ml_dtypes' RNE cast."""
    y = np.asarray(x, np.float32) / np.float32(scale)
    return np.clip(y, -448.0, 448.0).astype(E4M3)


def read_values(codes: np.ndarray, scale: float) -> np.ndarray:
    """What attention reads: the exact float64 product code * scale (the float64 product of a
    4-bit and a 24-bit significand is exact), not rounded to the model dtype."""
    return codes.astype(np.float64) * float(np.float32(scale))


class Fp8Case(Case):
    """A :class:`Case` whose pool holds E4M3 codes: the cached tokens' random values stored as
    ``e4m3(x / scale)``, the NaN sentinel elsewhere (E4M3's NaN code)."""

    def __init__(self, specs, *, k_scale: float, v_scale: float, **kw):
        super().__init__(specs, **kw)
        self.k_scale, self.v_scale = float(np.float32(k_scale)), float(np.float32(v_scale))
        pool = self.pool.astype(np.float32)
        codes = np.empty(pool.shape, E4M3)
        codes[:, :, 0] = e4m3_codes(pool[:, :, 0], self.k_scale)
        codes[:, :, 1] = e4m3_codes(pool[:, :, 1], self.v_scale)
        self.pool = codes
        self.plugin = dataclasses.replace(self.plugin, kv_fp8=True, k_scale=k_scale, v_scale=v_scale)

    def stored(self, kind: int, values: np.ndarray) -> np.ndarray:
        """New keys / values are stored as their E4M3 codes."""
        return e4m3_codes(values, self.v_scale if kind else self.k_scale)

    def dequantized(self) -> Case:
        """A plain (16-bit) case holding the values attention reads: cached and new K/V."""
        c = copy.copy(self)
        pool = np.empty(self.pool.shape, np.float64)
        pool[:, :, 0] = read_values(self.pool[:, :, 0], self.k_scale)
        pool[:, :, 1] = read_values(self.pool[:, :, 1], self.v_scale)
        c.pool = pool
        c.k = read_values(e4m3_codes(self.k, self.k_scale), self.k_scale)
        c.v = read_values(e4m3_codes(self.v, self.v_scale), self.v_scale)
        return c

    def attention_f64(self, softcap: bool = True) -> np.ndarray:
        """float64 attention (the parent's oracle) over the E4M3-rounded keys and values."""
        return Case.attention_f64(self.dequantized(), softcap)

    def vmax(self) -> float:
        """max |v| over the values attention can read (cached and new)."""
        d = self.dequantized()
        cached = np.abs(d.pool[self.layer, :, 1].astype(np.float32))
        return float(max(np.nanmax(cached), np.abs(d.v.astype(np.float32)).max()))


#: (k_scale, v_scale): near the calibrated amax / 448 of N(0, 1) data, above 1, and one small
#: enough that keys beyond 448 * 0.006 = 2.7 saturate
SCALES = {"small": (0.0123, 0.009), "large": (2.5, 1.75), "saturating": (0.006, 0.3)}


def fp8_case(name: str, bs: int, dtype: np.dtype, scales: str) -> Fp8Case:
    spec_fn, hkv, g, d, window = CASES[name]
    ks, vs = SCALES[scales]
    return Fp8Case(spec_fn(bs), bs=bs, hkv=hkv, g=g, d=d, dtype=dtype, window=window, seed=seed_of("fp8", name, bs, str(dtype)), k_scale=ks, v_scale=vs)


# ---------------------------------------------------------------------------------------
# CPU: the reference
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scales", sorted(SCALES))
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_fp8_matches_float64_over_e4m3_values(name: str, dtype: np.dtype, scales: str) -> None:
    case = fp8_case(name, 16, dtype, scales)
    pool = case.pool.copy()
    (out,) = case.plugin.reference(*case.inputs(pool))
    assert out.dtype == dtype and pool.dtype == E4M3
    # the pool: exactly the new slots changed, to the formula's codes
    np.testing.assert_array_equal(bits(pool), bits(case.expected_pool()))
    # the output: float32 attention over the read values, rounded once to the dtype
    want = case.attention_f64()
    got = out.astype(np.float64)
    u = UNIT_ROUNDOFF[np.dtype(dtype)]
    bound = u * np.abs(want) + 1e-5 * (np.abs(want) + case.vmax())
    err = np.abs(got - want)
    assert (err <= bound).all(), f"{(err > bound).sum()} elements off, worst {float((err / bound).max())}x the bound"


def test_fp8_oracle_differs_from_the_unquantized_one() -> None:
    """The E4M3 rounding changes the attention measurably (so the test above can fail if the
    reference skipped it), and the step's own token counts: an oracle that reads the new
    tokens unquantized misses the reference on the decode rows."""
    case = fp8_case("mixed_gqa8", 16, BF16, "small")
    (out,) = case.plugin.reference(*case.inputs())
    got = out.astype(np.float64)
    raw_new = case.dequantized()
    raw_new.k, raw_new.v = case.k, case.v  # cached tokens dequantized, the step's own tokens not
    want = case.attention_f64()
    miss = Case.attention_f64(raw_new)
    assert np.abs(got - want).max() < 0.3 * np.abs(got - miss).max()


def test_reference_prefill_then_decode_equals_one_prefill() -> None:
    """A prompt prefilled whole, and the same prompt prefilled but for its last token then
    decoded, give that last token the same output (within float32 noise) and the same pool:
    the decode's own token is read through its code as the prefill's are."""
    rng = np.random.default_rng(5)
    hkv, g, d, bs, n = 2, 4, 64, 16, 37
    p = PagedAttentionPlugin(layer_idx=0, num_kv_heads=hkv, head_dim=d, block_size=bs, kv_fp8=True, k_scale=0.011, v_scale=0.02)
    q = rng.standard_normal((n, hkv * g, d)).astype(BF16)
    k = rng.standard_normal((n, hkv, d)).astype(BF16)
    v = rng.standard_normal((n, hkv, d)).astype(BF16)
    bt = np.array([[3, 0, 2, 1]], np.int32)
    pool_a = np.zeros((1, 4, 2, hkv, bs, d), E4M3)
    pool_b = pool_a.copy()
    (whole,) = p.reference(q, k, v, pool_a, bt, np.array([n], np.int32), np.array([0, n], np.int32))
    p.reference(q[:-1], k[:-1], v[:-1], pool_b, bt, np.array([n - 1], np.int32), np.array([0, n - 1], np.int32))
    (last,) = p.reference(q[-1:], k[-1:], v[-1:], pool_b, bt, np.array([n], np.int32), np.array([0, 1], np.int32))
    np.testing.assert_array_equal(bits(pool_a), bits(pool_b))
    np.testing.assert_allclose(last.astype(np.float32), whole[-1:].astype(np.float32), rtol=2**-7, atol=1e-3)


def test_quantize_kv_saturates_rounds_to_nearest_even() -> None:
    """Saturation (not ml_dtypes' NaN above 464), ties to even, NaN kept, scale divides first."""
    x = np.array([0.0, 1.0, 448.0, 463.9, 464.0, 465.0, 1e6, np.inf, -500.0, -np.inf, 1.0625, 1.1875, np.nan], np.float32)
    got = PagedAttentionPlugin.quantize_kv(x, 1.0)
    assert got.dtype == E4M3
    want = np.array([0, 1, 448, 448, 448, 448, 448, 448, -448, -448, 1.0, 1.25, np.nan], np.float32)
    np.testing.assert_array_equal(got.astype(np.float32)[:-1], want[:-1])  # 1.0625: tie -> 1.0 (even); 1.1875 tie -> 1.25
    assert np.isnan(got.astype(np.float32)[-1])
    assert np.isnan(x[5:6].astype(E4M3).astype(np.float32)).all(), "ml_dtypes' plain cast is NaN above 464 (why trtcore clips)"
    np.testing.assert_array_equal(PagedAttentionPlugin.quantize_kv(np.array([9.0, 1e5], np.float32), 0.5).astype(np.float32), [18.0, 448.0])
    # what attention reads: the exact product rounded to float32, not to the model dtype (3.5 *
    # float32(0.1) is 0.35 in float32, 0.3496 in bfloat16); uint8 bytes read as the same codes
    codes = np.array([0.0, 3.5, -448.0, 2.0**-9], np.float32).astype(E4M3)
    got = PagedAttentionPlugin.dequantize_kv(codes, 0.1)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, (np.array([0.0, 3.5, -448.0, 2.0**-9], np.float64) * float(np.float32(0.1))).astype(np.float32))
    assert got[1] != np.float32(got[1].astype(BF16))
    np.testing.assert_array_equal(PagedAttentionPlugin.dequantize_kv(codes.view(np.uint8), 0.1), got)


def test_fp8_fields_dtypes_and_validation() -> None:
    p = PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=64, block_size=16, kv_fp8=True, k_scale=0.5, v_scale=0.25)
    assert p.defines(BF16)["KV_FP8"] == 1 and "KV_FP8" not in dataclasses.replace(p, kv_fp8=False).defines(BF16)
    i32 = np.dtype(np.int32)
    assert p.output_dtypes([BF16, BF16, BF16, E4M3, i32, i32, i32]) == [BF16]
    assert p.supports(3, [BF16, BF16, BF16, E4M3], 7) and not p.supports(3, [BF16, BF16, BF16, BF16], 7)
    with pytest.raises(PluginError, match="kv_pool must be float8_e4m3fn"):
        p.output_dtypes([BF16, BF16, BF16, BF16, i32, i32, i32])
    with pytest.raises(PluginError, match="float16 or bfloat16"):
        p.output_dtypes([F32, F32, F32, E4M3, i32, i32, i32])
    plain = dataclasses.replace(p, kv_fp8=False)
    with pytest.raises(PluginError, match="q's dtype"):
        plain.output_dtypes([BF16, BF16, BF16, E4M3, i32, i32, i32])
    # 1e-40 is a float32 subnormal: 1 / 1e-40 overflows float32, so x / scale would saturate every code
    for bad in (0.0, -1.0, float("inf"), float("nan"), 1e-40):
        with pytest.raises(PluginError, match="k_scale"):
            PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=64, block_size=16, kv_fp8=True, k_scale=bad)
    tiny = float(np.finfo(np.float32).tiny)  # the smallest normal float32: 1 / tiny is finite
    assert np.isfinite(np.float32(1) / np.float32(tiny))
    assert PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=64, block_size=16, kv_fp8=True, v_scale=tiny).v_scale == tiny
    # serialized fields round-trip; a plugin without FP8 serializes the fields it had before
    import trtcore.reference as ref

    assert PagedAttentionPlugin.from_field_collection(p.field_collection(ref)) == p
    assert {"kv_fp8", "k_scale", "v_scale"} <= {f.name for f in p.field_collection(ref)}
    fresh = PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=64, block_size=16)
    assert not {"kv_fp8", "k_scale", "v_scale"} & {f.name for f in fresh.field_collection(ref)}


def test_fp8_fields_round_trip_tensorrt_rtx_collection() -> None:
    """The FP8 fields serialize through TensorRT's own PluginFieldCollection (tensorrt_rtx on the
    CPU), and the FP8 pool's dtype maps to TensorRT's DataType.FP8 (plugin I/O takes FP8, not UINT8)."""
    trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx is not installed")
    from trtcore.dtypes import numpy_dtype, trt_dtype

    p = PagedAttentionPlugin(layer_idx=3, num_kv_heads=2, head_dim=128, block_size=32, kv_fp8=True, k_scale=0.0125, v_scale=3.5)
    assert PagedAttentionPlugin.from_field_collection(p.field_collection(trt)) == p
    assert trt_dtype(trt, E4M3) == trt.DataType.FP8 and numpy_dtype(trt.DataType.FP8) == E4M3


# ---------------------------------------------------------------------------------------
# GPU: the KV_FP8 kernels against the reference
# ---------------------------------------------------------------------------------------


def check_fp8_gpu(case: Fp8Case) -> dict:
    got, pool_after = run_enqueue(case)
    ref_pool = case.pool.copy()
    (ref,) = case.plugin.reference(*case.inputs(ref_pool))
    assert pool_after.dtype == E4M3
    np.testing.assert_array_equal(bits(pool_after), bits(ref_pool), err_msg="pool codes differ from the reference's E4M3 codes")
    return assert_output_close(case, got, ref, case.vmax())


@pytest.mark.gpu
@pytest.mark.parametrize("scales", ["small", "saturating"])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_fp8_enqueue_matches_reference(name: str, bs: int, dtype: np.dtype, scales: str) -> None:
    """Mixed prefill / chunked prefill / decode batches, GQA, MHA, MQA, a window; head_dim 64 and 128."""
    check_fp8_gpu(fp8_case(name, bs, dtype, scales))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize(
    "specs,hkv,g,d",
    [
        ([(4000, 1), (2500, 1), (17, 1)], 2, 4, 128),  # long decodes: many splits + reduction
        ([(3000, 1), (0, 300), (700, 40)], 1, 8, 64),  # a split decode beside a prefill and a chunk
        ([(700, 1), (650, 40)], 1, 20, 128),  # two decode row tiles
    ],
    ids=["long_decodes", "decode_prefill_chunk_d64", "gqa20"],
)
def test_gpu_fp8_long_sequences(specs, hkv: int, g: int, d: int, dtype: np.dtype) -> None:
    case = Fp8Case(specs, bs=16, hkv=hkv, g=g, d=d, dtype=dtype, num_layers=2, layer=0, seed=seed_of("fp8_long", specs), k_scale=0.0123, v_scale=0.009)
    assert case.plugin.num_splits(case.B, case.hq, case.block_tables.shape[1], dtype) > 1 or specs[0][0] < 4000
    check_fp8_gpu(case)


def q_gain_case(gain: float) -> Fp8Case:
    """A bfloat16 case whose q is ``gain`` times larger and whose keys (cached and new) are
    ``gain`` times smaller, through k_scale (the pool's codes stay): the scores are unchanged,
    O(1). q far from 1 in magnitude is what the tensor-core kernels' float16 q must survive:
    1e5 overflows float16 (65504), 1e-6 is a float16 subnormal with 4 significant bits."""
    case = fp8_case("mixed_gqa8", 16, BF16, "small")
    case.q = (case.q.astype(np.float64) * gain).astype(BF16)
    case.k = (case.k.astype(np.float64) / gain).astype(BF16)
    case.k_scale = float(np.float32(case.k_scale / gain))
    case.plugin = dataclasses.replace(case.plugin, k_scale=case.k_scale)
    return case


@pytest.mark.parametrize("gain", [1e-6, 1e5], ids=["tiny_q", "huge_q"])
def test_reference_fp8_q_far_from_one(gain: float) -> None:
    """The reference over such a case is the float64 attention's (the case itself is consistent:
    same codes, scores of order 1)."""
    case = q_gain_case(gain)
    pool = case.pool.copy()
    (out,) = case.plugin.reference(*case.inputs(pool))
    np.testing.assert_array_equal(bits(pool), bits(case.expected_pool()))
    want = case.attention_f64()
    bound = UNIT_ROUNDOFF[BF16] * np.abs(want) + 1e-5 * (np.abs(want) + case.vmax())
    assert (np.abs(out.astype(np.float64) - want) <= bound).all()


@pytest.mark.gpu
@pytest.mark.parametrize("gain", [1e-6, 1e5], ids=["tiny_q", "huge_q"])
def test_gpu_fp8_bfloat16_q_far_from_one(gain: float) -> None:
    """The tensor-core kernels scale each bfloat16 q row by a power of two before rounding it to
    float16: without it 1e5 would be inf (NaN output) and 1e-6 would keep 4 bits."""
    check_fp8_gpu(q_gain_case(gain))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_gpu_fp8_cuda_core_head_dim(dtype: np.dtype) -> None:
    """head_dim 96: paged_kv_write + paged_attn_simple with KV_FP8."""
    case = Fp8Case(mixed_specs(16), bs=16, hkv=2, g=3, d=96, dtype=dtype, seed=seed_of("fp8_d96", str(dtype)), k_scale=0.02, v_scale=0.5)
    check_fp8_gpu(case)


# ---------------------------------------------------------------------------------------
# fused RoPE with the FP8 pool (the decode kernel's rotated own key goes through shared memory)
# ---------------------------------------------------------------------------------------


class FusedFp8Case(Fp8Case, FusedCase):
    """FusedCase (unrotated q/k fed, rotated by the plugin; ``q``/``k`` hold the rotated values)
    with the FP8 pool: the rotated keys are what is quantized."""


def fused_fp8_case(name: str, dtype: np.dtype, rope: str, packed: bool) -> FusedFp8Case:
    spec_fn, hkv, g, d, window = CASES[name]
    return FusedFp8Case(
        spec_fn(16), bs=16, hkv=hkv, g=g, d=d, dtype=dtype, window=window, seed=seed_of("fp8_rope", name, str(dtype), rope, packed),
        packed=packed, rope=rope, k_scale=0.0123, v_scale=0.009,
    )  # fmt: skip


@pytest.mark.parametrize("rope", ["neox", "gptj_partial_scaled", "neox_longrope"])
@pytest.mark.parametrize("name", ["mixed_gqa8", "decode_only"])
def test_reference_fp8_fused_rope_equals_rope_then_unfused(name: str, rope: str) -> None:
    case = fused_fp8_case(name, BF16, rope, packed=True)
    assert case.plugin.kv_fp8 and case.plugin.rotary_dim > 0
    pool = case.pool.copy()
    (got,) = case.plugin.reference(*case.inputs(pool))
    unfused = dataclasses.replace(case.plugin, packed_qkv=False, rotary_dim=0, is_neox=True, attention_scaling=1.0, original_max_position_embeddings=0)
    two_pool = case.pool.copy()
    (want,) = unfused.reference(case.q, case.k, case.v, two_pool, case.block_tables, case.seq_lens, case.qsl)  # q/k: rotated
    np.testing.assert_array_equal(bits(pool), bits(two_pool))
    np.testing.assert_array_equal(bits(got), bits(want))
    np.testing.assert_array_equal(bits(pool), bits(case.expected_pool()))  # codes of the rotated keys


# ---------------------------------------------------------------------------------------
# CPU: the KV_FP8 kernels compile, and enqueue passes every kernel its full parameter list
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_fp8_kernels_compile(arch: str) -> None:
    from trtcore import kernels

    for p, dt in [
        (PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=128, block_size=16, kv_fp8=True, k_scale=0.1), BF16),
        (PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=64, block_size=32, kv_fp8=True, packed_qkv=True, rotary_dim=64), F16),
        (PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=96, block_size=16, kv_fp8=True), BF16),
    ]:
        defines = p.defines(dt)
        assert defines["KV_FP8"] == 1
        built = kernels.compile_kernel("paged_attention", defines=defines, arch=arch)
        want = {"paged_kv_write", "paged_attn_simple"} | ({"paged_attn_decode", "paged_attn_prefill", "paged_attn_reduce"} if p.uses_tensor_cores(dt) else set())
        assert set(built.symbols) == want, (defines, built.symbols)


def _kernel_params() -> dict[str, list[str]]:
    """Parameter names of each extern "C" kernel of kernels/paged_attention.cu."""
    import re
    from pathlib import Path

    import trtcore.plugins.paged_attention as pa

    source = (Path(pa.__file__).resolve().parents[1] / "kernels" / "paged_attention.cu").read_text()
    out = {}
    for name, params in re.findall(r"extern \"C\" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(([^)]*)\)", source):
        out[name] = [p.split()[-1].lstrip("*") for p in params.split(",")]
    return out


@pytest.mark.parametrize("head_dim", [128, 96])
def test_enqueue_passes_every_parameter_and_the_scales(head_dim: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each launch's argument list is as long as its kernel's parameter list, and the scales land
    in the kernels' k_scale / v_scale (a missing or shifted argument would read garbage on a GPU)."""
    import trtcore.plugins.paged_attention as pa
    from trtcore.plugins.base import DeviceTensor

    launches: list[tuple[str, list]] = []

    class Recorder:
        def launch(self, symbol, grid, block, args, smem, stream):
            launches.append((symbol, args))

    monkeypatch.setattr(pa, "_functions", lambda defines: Recorder())
    p = PagedAttentionPlugin(layer_idx=1, num_kv_heads=2, head_dim=head_dim, block_size=16, kv_fp8=True, k_scale=0.25, v_scale=0.75)
    T, B, hq, mb = 40, 3, 8, 300  # a prefill beside decodes, long enough to split
    i32 = np.dtype(np.int32)
    ins = [
        DeviceTensor(0x1000, (T, hq, head_dim), BF16),
        DeviceTensor(0x2000, (T, 2, head_dim), BF16),
        DeviceTensor(0x3000, (T, 2, head_dim), BF16),
        DeviceTensor(0x4000, (2, 500, 2, 2, 16, head_dim), E4M3),
        DeviceTensor(0x5000, (B, mb), i32),
        DeviceTensor(0x6000, (B,), i32),
        DeviceTensor(0x7000, (B + 1,), i32),
    ]
    out = DeviceTensor(0x8000, (T, hq * head_dim), BF16)
    ws = p.workspace_size([(t.shape, t.dtype) for t in ins], [(out.shape, out.dtype)])
    p.enqueue(ins, [out], 0x9000 if ws else 0, 7)
    params = _kernel_params()
    names = {s for s, _ in launches}
    assert {"paged_kv_write"} <= names and (("paged_attn_simple" in names) != (head_dim == 128))
    if head_dim == 128:
        assert {"paged_attn_decode", "paged_attn_reduce", "paged_attn_prefill"} <= names
    for symbol, args in launches:
        assert len(args) == len(params[symbol]), (symbol, len(args), params[symbol])
        got = dict(zip(params[symbol], (value for value, _ in args)))
        assert got["pool" if "pool" in got else "ws_o"] is not None
        if "k_scale" in got:
            assert (got["k_scale"], got["v_scale"]) == (0.25, 0.75), symbol
    # a 16-bit pool is refused for an FP8 plugin
    with pytest.raises(PluginError, match="not supported"):
        p.enqueue([*ins[:3], DeviceTensor(0x4000, ins[3].shape, BF16), *ins[4:]], [out], 0x9000, 7)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
@pytest.mark.parametrize("rope", ["neox", "gptj_partial_scaled", "neox_longrope"])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("name", ["mixed_gqa8", "mixed_mha", "decode_only"])
def test_gpu_fp8_fused_rope(name: str, dtype: np.dtype, rope: str, packed: bool) -> None:
    """KV_FP8 with fused RoPE: paged_kv_write quantizes the rotated keys, the decode kernel
    quantizes its own rotated key from shared memory (and rounds it through the code to attend)."""
    check_fp8_gpu(fused_fp8_case(name, dtype, rope, packed))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_gpu_fp8_fused_rope_long_decodes(dtype: np.dtype) -> None:
    case = FusedFp8Case(
        [(4000, 1), (2500, 1), (1000, 70)], bs=16, hkv=2, g=4, d=128, dtype=dtype, num_layers=2, layer=0,
        seed=seed_of("fp8_rope_long", str(dtype)), packed=True, rope="neox", k_scale=0.0123, v_scale=0.009,
    )  # fmt: skip
    check_fp8_gpu(case)
