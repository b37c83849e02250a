"""The FP8 linear on the GPU (marker ``gpu``; skipped with the reason without CuPy or a GPU,
and below compute capability 8.9, which has no FP8 tensor cores):

* ``kernels/fp8_gemm.cu``'s quantize kernel gives exactly the E4M3 codes of ml_dtypes' round to
  nearest even (every tie between neighbouring E4M3 values, saturation, subnormals, random
  values; static and dynamic scale, the amax kernel's ``max|x|``);
* the ``trtcore_fp8_gemm`` plugin (quantize + cuBLASLt FP8 GEMM + per-channel epilogue) against
  its float64 reference through :func:`trtcore.testing.check_plugin` (NaN-poisoned output, two
  identical runs), per-tensor / per-channel weights, static / dynamic activations, float16,
  bfloat16 and float32 x, M from 1 to 300. Tolerance relative to ``max|y|``: the output
  dtype's rounding (:func:`trtcore.testing.default_tolerance`) plus
  :data:`trtcore.cuda.cublaslt.FP8_ACCUMULATION_RTOL` (``2**-10``, derived there: Hopper's FP8
  tensor cores accumulate in about 14 bits between cuBLASLt's float32 promotions, measured
  ``2**-12.3 .. 2**-11.2`` of ``max|y|`` for K = 64 .. 4096 on the H200, not growing with K;
  so float32 outputs cannot be held to 1e-5; a wrong scale, layout or code is off by far more);
* a tiny FP8 Llama (``trtcore quantize --method fp8``, static, dynamic and per-token activations) on
  ``backend="cuda"`` (CUDA graphs on, so the plugin is captured): the first token's top-20
  log-probabilities differ from the reference backend's by no more than FP8 moves the model
  from its float weights (see :func:`test_tiny_fp8_llama_on_cuda_equals_the_reference`);
* the Q/DQ form (no plugin) compiled by the cuda backend equals the reference's evaluation;
* per-token dynamic activations: ``trtcore_fp8_quantize_tokens``'s row scales and codes are
  exact, and the per-token plugin matches its reference (M 1, 5, 64; bfloat16, float16;
  per-channel and per-tensor weights).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from trtcore import fp8
from trtcore.testing import check_plugin, default_tolerance, gpu_status

pytestmark = pytest.mark.gpu

OK, WHY = gpu_status()
if not OK:
    pytest.skip(WHY, allow_module_level=True)

from trtcore.gpu import compute_capability  # noqa: E402

if compute_capability(0) < (8, 9):
    pytest.skip(f"FP8 GEMMs need compute capability 8.9+, this GPU is {compute_capability(0)}", allow_module_level=True)

import cupy as cp  # noqa: E402

from trtcore.cuda.cublaslt import FP8_ACCUMULATION_RTOL, FP8_FAST_ACCUMULATION_RTOL, Fp8Matmul  # noqa: E402
from trtcore.plugins.fp8_gemm import _KERNELS, Fp8GemmPlugin  # noqa: E402


def _quantize_on_gpu(x: np.ndarray, scale: float | None, w_scale: float | None = None, offset: int = 0) -> tuple[np.ndarray, float, np.ndarray]:
    """E4M3 codes, the scale and cuBLASLt's ``(alpha, beta)`` from the quantize kernel (dynamic:
    amax kernel first; ``w_scale`` None: a per-channel weight, null pointer); ``offset``
    elements before x in its device buffer (1: x not 16-byte aligned, the kernels' scalar loop)."""
    defines = (("DTYPE", 0),)
    n = x.size
    xd = cp.asarray(np.concatenate([np.zeros(offset, np.float32), x.astype(np.float32).ravel()]))[offset:]
    q = cp.zeros(n, cp.uint8)
    scalars = cp.full(6, 0x7FC00000, cp.uint32)  # amax bits, the scale, NaN, NaN, then alpha and beta (NaN until written)
    static = cp.asarray(np.array([scale or 1.0, w_scale or 1.0], np.float32))
    amax_ptr, scale_ptr, alpha_ptr = scalars.data.ptr, scalars.data.ptr + 4, scalars.data.ptr + 16
    stream = cp.cuda.Stream(non_blocking=True)
    blocks = max(1, min(1024, -(-n // 256)))
    if scale is None:
        _KERNELS.launch(defines, "trtcore_fp8_zero", (1,), (32,), [(amax_ptr, "ptr")], stream.ptr)
        _KERNELS.launch(defines, "trtcore_fp8_amax", (blocks,), (256,), [(xd.data.ptr, "ptr"), (n, "i64"), (amax_ptr, "ptr")], stream.ptr)
    w_ptr = static.data.ptr + 4 if w_scale is not None else 0
    args = [(xd.data.ptr, "ptr"), (n, "i64"), (static.data.ptr if scale else 0, "ptr"), (amax_ptr, "ptr"), (w_ptr, "ptr"), (scale_ptr, "ptr")]
    _KERNELS.launch(defines, "trtcore_fp8_quantize", (blocks,), (256,), args + [(alpha_ptr, "ptr"), (q.data.ptr, "ptr")], stream.ptr)
    stream.synchronize()
    got = cp.asnumpy(scalars).view(np.float32)
    return cp.asnumpy(q).reshape(x.shape), float(got[1]), got[4:6]


# (elements, offset): a multiple of 8 and aligned (the vectorized loop), 8k + 1 (its scalar
# tail), misaligned (the scalar loop only)
LOOPS = [(7384, 0), (7385, 0), (7384, 1)]


@pytest.mark.parametrize(("n", "offset"), LOOPS, ids=["vector", "tail", "misaligned"])
def test_quantize_kernel_codes_are_exact(n: int, offset: int) -> None:
    rng = np.random.default_rng(0)
    values = fp8.from_e4m3(np.arange(0x7F, dtype=np.uint8))  # +0 .. 448
    mids = (values[:-1] + values[1:]) / 2  # every tie
    x = np.concatenate([mids, -mids, values, rng.normal(0, 100, 5000), rng.normal(0, 1e-3, 2000), [449.0, 464.0, 465.0, 1e9, -1e9, 0.0]])
    x = rng.permutation(x)[:n]
    codes, s, _ = _quantize_on_gpu(x, 1.0, offset=offset)
    assert s == 1.0
    np.testing.assert_array_equal(codes, fp8.to_e4m3(x))
    codes, s, _ = _quantize_on_gpu(x * 0.37, 0.37, offset=offset)
    np.testing.assert_array_equal(codes, fp8.quantize(x * 0.37, np.float32(0.37)))


@pytest.mark.parametrize(("n", "offset"), LOOPS, ids=["vector", "tail", "misaligned"])
def test_dynamic_scale_is_amax_over_448(n: int, offset: int) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, n).astype(np.float32)
    x[n - 1] = -77.5  # the last element: in the scalar tail of 8k + 1 elements
    codes, s, _ = _quantize_on_gpu(x, None, offset=offset)
    assert s == float(fp8.amax_scale(77.5))
    np.testing.assert_array_equal(codes, fp8.quantize(x, np.float32(s)))
    _, s0, _ = _quantize_on_gpu(np.zeros(1000), None)
    assert s0 == 1.0


@pytest.mark.parametrize("activations", ["static", "dynamic"])
@pytest.mark.parametrize("w_scale", [0.0123, None], ids=["tensor", "channel"])
def test_quantize_kernel_writes_cublaslt_alpha_and_beta(activations: str, w_scale: float | None) -> None:
    """cuBLASLt's device alpha is ``s_x * s_w`` rounded once to float32 (per-channel weights:
    ``s_x``, their scales come after the GEMM) and beta is 0, written by the kernel on every
    call (a dynamic ``s_x`` exists only on the device)."""
    x = np.random.default_rng(2).normal(0, 5, 3000)
    x[17] = 91.0
    s_x = 0.25 if activations == "static" else float(fp8.amax_scale(91.0))
    _, s, (alpha, beta) = _quantize_on_gpu(x, 0.25 if activations == "static" else None, w_scale)
    assert s == s_x
    want = np.float32(np.float64(s_x) * np.float64(np.float32(w_scale))) if w_scale is not None else np.float32(s_x)
    assert alpha == want and beta == 0.0


DTYPES = [np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)]
CASES = [  # (N, K, per_channel, static)
    (256, 4096, False, True),
    (4096, 1024, True, True),
    (1008, 512, True, False),
    (96, 64, False, False),
]


@pytest.mark.parametrize("m", [1, 7, 64, 300])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_plugin_matches_reference(case: tuple, dtype: np.dtype, m: int) -> None:
    n, k, per_channel, static = case
    rng = np.random.default_rng(zlib.crc32(repr((case, str(dtype), m)).encode()))
    w = rng.normal(0, 0.05, (n, k)) * rng.uniform(0.2, 5, (n, 1))
    fw = fp8.quantize_weight(w, "channel" if per_channel else "tensor", 3.0 / 448 if static else None)
    plugin, consts = Fp8GemmPlugin.from_fp8(fw)
    specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in consts]
    check_plugin(plugin, specs, rtol=default_tolerance(dtype)[0] + FP8_ACCUMULATION_RTOL)


#: top log-probabilities compared per step in the tiny FP8 Llama test
TOP_K = 20


def _top(outputs: object, step: int) -> dict[int, float]:
    return {t: lp.logprob for t, lp in outputs.logprobs[step].items()}  # type: ignore[attr-defined]


@pytest.mark.parametrize("activations", ["static", "dynamic", "token"])
def test_tiny_fp8_llama_on_cuda_equals_the_reference(tmp_path: Path, activations: str) -> None:
    """The quantizer's FP8 checkpoint on ``backend="cuda"`` (CUDA graphs on, so the plugin is
    captured) against the reference backend (the float64 FP8 contract, itself held to
    transformers in tests/test_fp8_model.py), both measured against the unquantized checkpoint
    (reference backend, float32), on the first generated token's top-20 log-probabilities:

    * the two FP8 implementations differ by no more than FP8 moves the model:
      ``max |cuda - ref| <= q``, ``q = max |ref - float|``. Why not a fixed tolerance: the cuda
      GEMM accumulates in about 14 bits (:data:`FP8_ACCUMULATION_RTOL`), which flips the E4M3 code
      of an activation near a rounding boundary in the next layer, a jump of one E4M3 step, so a
      small random model moves by a fraction of its whole FP8 error (0.31 / 0.41 nats on the
      H200 with q larger), not smoothly with the GEMM's error; a flip is one of the roundings
      FP8 itself makes, so it cannot move the model further than FP8 does. A scale or layout
      bug moves it by far more (an output scaled by 1.1 in every linear is several times q);
    * the cuda model is no further from the float model than twice the reference's distance;
    * the greedy first token equals the reference's unless the reference's best two are
      within ``2 q`` (a near tie).

    The GEMM's own numbers are :func:`test_plugin_matches_reference`'s to check.
    """
    from hf_models import VARIANTS, random_prompt, write_checkpoint
    from test_gpu_backend import _stat

    from trtcore import LLM, SamplingParams
    from trtcore.quantizer import quantize_checkpoint

    v = VARIANTS["llama3_rope"]
    src = write_checkpoint(v, tmp_path / "src")
    rng = np.random.default_rng(0)
    calibration = [random_prompt(rng, 24, v.vocab_size) for _ in range(3)]
    if activations == "token":  # an FP8-dynamic checkpoint: per-channel weights, per-token dynamic activations
        from test_fp8_model import _per_token_checkpoint

        out = _per_token_checkpoint(src, tmp_path / "fp8", "channel")
    else:
        static = {"calibration_ids": calibration} if activations == "static" else {}  # dynamic scales take no calibration
        out = quantize_checkpoint(src, tmp_path / "fp8", method="fp8", activations=activations, **static)
    prompt = random_prompt(np.random.default_rng(7), 12, v.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=TOP_K)
    results = []
    for folder, backend in ((src, "reference"), (out, "reference"), (out, "cuda")):
        llm = LLM(folder, backend=backend, dtype="float32", max_batch_size=1, max_seq_len=128, progress=False)
        [res] = llm.generate([prompt], params)
        llm.close()
        results.append(res.outputs[0])
    flt, ref, got = (_top(r, 0) for r in results)

    def dist(a: dict[int, float], b: dict[int, float]) -> float:
        common = a.keys() & b.keys()
        assert len(common) >= TOP_K // 2, (sorted(a), sorted(b))  # the top tokens largely agree
        return max(abs(a[t] - b[t]) for t in common)

    q, d, to_float = dist(ref, flt), dist(got, ref), dist(got, flt)
    _stat(test="fp8_tiny_llama", activations=activations, q=q, d=d, to_float=to_float, tokens=[r.token_ids for r in results])
    assert d <= q and to_float <= 2 * q, (activations, d, q, to_float)
    if results[2].token_ids[0] != results[1].token_ids[0]:
        ranked = sorted(ref.values(), reverse=True)
        assert ranked[0] - ranked[1] <= 2 * q, (results[1].token_ids[0], results[2].token_ids[0], ranked[:2], q)


@pytest.mark.parametrize(("strategy", "input_scale", "per_token"), [("channel", None, False), ("tensor", 2.0 / 448, False), ("channel", None, True)])
def test_qdq_linear_on_the_cuda_engine_equals_the_reference(strategy: str, input_scale: float | None, per_token: bool) -> None:
    """The Q/DQ form (``impl="qdq"``: no plugin) compiled by the cuda backend, against the
    reference backend's evaluation of the same network (bfloat16 x, 37 tokens; per-token:
    the max over each row)."""
    from test_engine_gpu import Run, compare, engine_of
    from test_fp8 import _qdq_net

    import trtcore.cuda as tc
    from trtcore.reference.evaluator import evaluate

    net, _ = _qdq_net(tc, strategy, input_scale, per_token)
    x = np.random.default_rng(11).normal(0, 1, (37, 64))
    if per_token:  # rows of different sizes: each row's own scale
        x *= 10.0 ** np.linspace(-2, 2, 37)[:, None]
    x = x.astype(ml_dtypes.bfloat16)
    ref = evaluate(net, {"x": x.copy()})["y"]
    run = Run(cp, engine_of(net, {"x": ((1, 64), (16, 64), (64, 64))}))
    run.feed({"x": x})
    run.execute()
    compare("y", run.output("y"), ref)


# --- per-token dynamic activations (compressed-tensors strategy "token", FP8-dynamic checkpoints)


def _per_token_rows(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """float64 ``[m, k]`` whose rows differ in size by up to 10^4 (one all-zero row when m > 2)."""
    x = rng.normal(0, 1, (m, k)) * 10.0 ** rng.uniform(-2, 2, (m, 1))
    if m > 2:
        x[m // 2] = 0.0
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("k", "offset"), [(4096, 0), (1000, 0), (1001, 0), (1024, 1)], ids=["vector", "vector-k1000", "scalar", "misaligned"])
def test_quantize_tokens_kernel_codes_and_row_scales_are_exact(dtype: np.dtype, k: int, offset: int) -> None:
    """``trtcore_fp8_quantize_tokens`` (one block per row): row m's scale is exactly
    :func:`trtcore.fp8.amax_scale` of ``max|x[m, :]|`` (1 for the zero row), its codes exactly
    ``fp8.quantize(x[m], s[m])``; alpha 1 and beta 0 for cuBLASLt."""
    m = 37
    rng = np.random.default_rng(k + offset)
    x = _per_token_rows(rng, m, k).astype(dtype)
    x[3, k - 1] = -1234.5  # the row's amax in its last element (the scalar tail when there is one)
    from trtcore.dtypes import KERNEL_DTYPE_CODES

    defines = (("DTYPE", KERNEL_DTYPE_CODES[np.dtype(dtype)]),)
    flat = np.concatenate([np.zeros(offset, dtype), x.ravel()])
    xd = cp.asarray(flat.view(np.uint16) if dtype != np.float32 else flat)[offset:]
    q = cp.zeros(m * k, cp.uint8)
    rows = cp.full(m, np.nan, cp.float32)
    ab = cp.full(2, np.nan, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    args = [(xd.data.ptr, "ptr"), (k, "i32"), (rows.data.ptr, "ptr"), (ab.data.ptr, "ptr"), (q.data.ptr, "ptr")]
    _KERNELS.launch(defines, "trtcore_fp8_quantize_tokens", (m,), (256,), args, stream.ptr)
    stream.synchronize()
    x32 = x.astype(np.float32)
    want_s = fp8.amax_scale(np.abs(x32).max(axis=1))
    np.testing.assert_array_equal(cp.asnumpy(rows), want_s)
    assert want_s[m // 2] == 1.0
    np.testing.assert_array_equal(cp.asnumpy(q).reshape(m, k), fp8.quantize(x32, want_s[:, None]))
    np.testing.assert_array_equal(cp.asnumpy(ab), np.array([1.0, 0.0], np.float32))


@pytest.mark.parametrize("m", [1, 5, 64])
@pytest.mark.parametrize("dtype", [np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)], ids=str)
@pytest.mark.parametrize("per_channel", [True, False], ids=["channel", "tensor"])
def test_per_token_plugin_matches_reference(per_channel: bool, dtype: np.dtype, m: int) -> None:
    """The per-token plugin (quantize_tokens, cuBLASLt FP8 GEMM into float32, scale_tokens)
    against its float64 reference, x rows of very different sizes (a row given another row's
    scale is off by orders of magnitude), tolerance as :func:`test_plugin_matches_reference`."""
    n, k = 1008, 512
    rng = np.random.default_rng(zlib.crc32(repr(("token", per_channel, str(dtype), m)).encode()))
    w = rng.normal(0, 0.05, (n, k)) * rng.uniform(0.2, 5, (n, 1))
    fw = fp8.quantize_weight(w, "channel" if per_channel else "tensor", per_token=True)
    plugin, consts = Fp8GemmPlugin.from_fp8(fw)
    assert plugin.per_token and not plugin.static_input
    x = _per_token_rows(rng, m, k).astype(dtype)
    specs = [((m, k), dtype, x)] + [(a.shape, a.dtype, a) for a in consts]
    check_plugin(plugin, specs, rtol=default_tolerance(dtype)[0] + FP8_ACCUMULATION_RTOL)
    # row by row: the largest row's scale dominates max|y|; scale each row to the same size
    # (a power of two per row: the same codes, the outputs scaled exactly) and check again
    amax = np.abs(x.astype(np.float32)).max(axis=1, keepdims=True)
    even = (x.astype(np.float64) * 2.0 ** -np.floor(np.log2(np.where(amax > 0, amax, 1)))).astype(dtype)
    check_plugin(plugin, [((m, k), dtype, even)] + specs[1:], rtol=default_tolerance(dtype)[0] + FP8_ACCUMULATION_RTOL)


def test_fp8_input_fusion_changes_no_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cuda engine with the FP8 input quantization folded into the producing kernels
    (:mod:`trtcore.cuda.fp8_input_fusion`: RMSNorm -> q / k / v codes, SiLU * mul -> down's
    codes) gives bit for bit the outputs of the engine whose plugins quantize x themselves
    (TRTCORE_FP8_INPUT_FUSION=0): the same division, clip and rounding, the same codes and
    GEMMs. And close to the reference backend's evaluation of the network (17 tokens, bfloat16;
    inputs large enough that some codes saturate): h elementwise; v, an FP8 GEMM's output, within
    2^-6 of its largest value (the GEMM's accumulation, 2^-10 of it, plus a norm output one
    bfloat16 step off flipping an input code by one E4M3 step, about 2^-7 of it: on the H200 one
    element of v was 2^-8 off at -0.2, beyond an elementwise 2^-7); the down projection, whose
    input codes may flip where the GPU moves q and k across a rounding boundary, within 5%."""
    from test_engine_gpu import Run, compare, engine_of
    from test_passes import _fp8_mlp_net

    from trtcore.reference.evaluator import evaluate

    rng = np.random.default_rng(3)
    feeds = {n: (rng.normal(0, 1, (17, 64)) * 30).astype(ml_dtypes.bfloat16) for n in ("a", "b")}
    shapes = {n: ((1, 64), (8, 64), (32, 64)) for n in ("a", "b")}
    outs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("TRTCORE_FP8_INPUT_FUSION", flag)
        run = Run(cp, engine_of(_fp8_mlp_net(), shapes))
        run.feed(feeds)
        run.execute()
        outs[flag] = {n: run.output(n) for n in ("residual", "v", "out")}
    for n in ("residual", "v", "out"):
        np.testing.assert_array_equal(outs["1"][n].view(np.uint16), outs["0"][n].view(np.uint16), err_msg=n)
    ref = evaluate(_fp8_mlp_net(), {k: v.copy() for k, v in feeds.items()})
    compare("residual", outs["1"]["residual"], ref["residual"])
    for n, rel in (("v", 2.0**-6), ("out", 0.05)):
        got, want = outs["1"][n].astype(np.float64), np.asarray(ref[n]).astype(np.float64)
        assert np.abs(got - want).max() <= rel * np.abs(want).max(), (n, np.abs(got - want).max(), np.abs(want).max())


@pytest.mark.parametrize(("m", "n", "k"), [(1, 4096, 4096), (256, 1024, 14336), (2048, 512, 4096)])
def test_fast_accumulation_stays_within_its_bound(m: int, n: int, k: int) -> None:
    """``Fp8Matmul(fast_accum=True)`` (float32 output, so only the accumulation shows) against
    float64: within :data:`trtcore.cuda.cublaslt.FP8_FAST_ACCUMULATION_RTOL` of ``max|D|``;
    the default (promoted) accumulation within ``FP8_ACCUMULATION_RTOL`` on the same operands."""
    rng = np.random.default_rng(m + n + k)
    finite = np.flatnonzero(~np.isnan(np.arange(256, dtype=np.uint8).view(fp8.E4M3).astype(np.float32)))
    small = finite[(finite & 0x78) <= 0x38].astype(np.uint8)  # |value| < 2: no few huge products dominate
    w, x = rng.choice(small, (n, k)), rng.choice(small, (m, k))
    want = fp8.from_e4m3(x) @ fp8.from_e4m3(w).T
    wd, xd = cp.asarray(w), cp.asarray(x)
    ab = cp.asarray(np.array([1.0, 0.0], np.float32))
    ws = cp.empty(8 << 20, cp.uint8)
    for fast, bound in ((True, FP8_FAST_ACCUMULATION_RTOL), (False, FP8_ACCUMULATION_RTOL)):
        d = cp.full((m, n), np.nan, cp.float32)
        mm = Fp8Matmul(fast_accum=fast)
        mm.run(m, n, k, wd.data.ptr, xd.data.ptr, ab.data.ptr, ab.data.ptr + 4, d.data.ptr, 0, ws.data.ptr, ws.size, 0)
        cp.cuda.runtime.deviceSynchronize()
        mm.close()
        err = float(np.abs(cp.asnumpy(d) - want).max() / np.abs(want).max())
        assert err <= bound, (fast, err, bound)
