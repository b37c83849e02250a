"""The weight-only GEMM kernels (kernels/wq_gemm.cu) against the plugin's float64 reference on
the GPU (marker ``gpu``; skipped with the reason without CuPy or a GPU).

Every variant (int4 group 32/64/128 and int8 per channel / group 64 / group 8, symmetric,
integer and fractional zero points, act-order permutation; float16 and bfloat16) at M in
{1, 4, 9, 16, 17, 64} (up to 16: the tensor-core decode kernels, 8 and 16 columns, except group
8, which runs the tiled kernel; 17 and 64: the tiled kernel, with ``PREFILL_KERNEL``
"tensor_cores" the 16-row kernel in 2 and 4 slices of its grid, and with "cublas" (the default)
at 40 and 64 rows (17 rows: group 8 only, the others take the 16-row kernel below
``CUBLAS_MIN_M``) the weight dequantized into the workspace and cuBLASLt's GEMM, in one block and
in blocks of 128 rows, the last one partial; the weight's extra rounding to x's dtype is inside
the tolerance below, see the plugin's numerical contract),
through :func:`trtcore.testing.check_plugin`, which poisons the output with NaN before each of
two runs and requires bit-identical results. Tolerance: the reference is float64 rounded once;
the kernels accumulate in float32 over K terms, so one output ulp at ``max|y|`` (the default)
plus float32 accumulation noise ``sqrt(K) * 2^-24`` relative.

The v2 decode kernel (``WQ_DECODE 2``: ROW_TILES 1 | 2, WQ_FOLD 0 | 1, SEG 1 | 2, L2_PF, selected through
``weight_only_gemm.DECODE_VARIANT``) is checked the same way at M = 1..8 on shapes with odd tile
counts, N not a multiple of 16, per channel and group 64 / 128 / 256; group 32 int4 (half a
chunk) must fall back to v1, and does.

Both K orders are checked explicitly on the v2 cases with the default decode kernel and four
other v2 variants, the M = 12 and 40 kernels too: the contiguous-x order (``CONTIG_X``,
``pack_weight(contiguous_x=True)``, the default where groups are whole chunks, so the tests
above run it there) and the natural one (``contiguous_x=False``, which act order and partial
groups always use); an x view off 16-byte alignment (v2's x loads) must take v1 and still match.

The SwiGLU form of a gate/up plugin (``swiglu``: gate and up rows interleaved, silu(gate) * up
written by the decode kernels' epilogue or by ``trtcore_wq_swiglu`` after a staged GEMM) is
checked on four shapes at M = 1 .. 64 and with float32 x; so is the RoPE form of a q/k/v plugin
(``rope_rows``: each head's rotation pairs in one thread, rotated by the decode kernels'
epilogue or by ``trtcore_wq_rope`` after a staged GEMM). The add + norm form of an o_proj-like
plugin (``add_norm``: ``h = y + residual`` and RMSNorm(h) as two outputs, by the v2 decode
kernel's last block or by ``trtcore_wq_add_norm`` after the other paths) is checked on four
shapes at M = 1 .. 64, with the v2 variants, and with float32 x. So are the split forms:
``norm_input`` (x is h: the v2 decode kernel folds the norm into x and its output, ``NORM_X``,
whatever the grid, with x or the norm weight off 16-byte alignment copied first; every other path
normalizes by ``trtcore_wq_rms_norm`` into the workspace first) and ``add_residual`` (the residual added by
the tensor-core kernels' epilogue or by ``trtcore_wq_add_residual`` after the GEMM), alone, both
in one plugin, and with SwiGLU.
"""

from __future__ import annotations

import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from trtcore.plugins import weight_only_gemm as wog
from trtcore.plugins.weight_only_gemm import WeightOnlyGemmPlugin
from trtcore.quantization import QuantizedWeight
from trtcore.testing import check_plugin, default_tolerance, gpu_status

pytestmark = pytest.mark.gpu

OK, WHY = gpu_status()
if not OK:
    pytest.skip(WHY, allow_module_level=True)

DTYPES = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
CASES = [
    # (N, K, bits, group_size (0: per channel), zeros, perm)
    (256, 4096, 4, 128, "none", False),
    (300, 1536, 4, 64, "int", False),
    (96, 2080, 4, 32, "frac", True),  # 65 groups of 32: an odd group count
    (512, 1024, 8, 0, "none", False),
    (200, 2048, 8, 64, "int", True),
    (64, 520, 8, 8, "frac", False),
]


def _qw(rng: np.random.Generator, n: int, k: int, bits: int, gs: int, zeros: str, perm: bool) -> QuantizedWeight:
    gs = gs or k
    g = k // gs
    z = (
        None
        if zeros == "none"
        else (rng.integers(0, 1 << bits, (n, g)) if zeros == "int" else rng.uniform(0, (1 << bits) - 1, (n, g))).astype(np.float32)
    )
    return QuantizedWeight(
        rng.integers(0, 1 << bits, (n, k)).astype(np.uint8),
        rng.uniform(0.002, 0.05, (n, g)).astype(np.float32),
        z,
        bits,
        gs,
        rng.permutation(k).astype(np.int32) if perm else None,
    )


PREFILLS = [(1, "tiled"), (4, "tiled"), (9, "tiled"), (16, "tiled"), (17, "tiled"), (64, "tiled"), (17, "tensor_cores"), (64, "tensor_cores")]
PREFILLS += [(17, "cublas"), (40, "cublas"), (64, "cublas"), (16, "cublas"), (64, "cublas-blocks")]


@pytest.mark.parametrize(("m", "prefill"), PREFILLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel_matches_reference(case: tuple, dtype: np.dtype, m: int, prefill: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if prefill == "cublas-blocks":  # blocks of 128 rows: N = 200 .. 512 in 2 .. 4 blocks, the last one partial
        monkeypatch.setattr(wog, "DEQUANT_BLOCK_BYTES", 1)
        prefill = "cublas"
    monkeypatch.setattr(wog, "PREFILL_KERNEL", prefill)
    rng = np.random.default_rng(zlib.crc32(repr((case, str(dtype), m)).encode()))
    qw = _qw(rng, *case)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    gs = case[3] or case[1]
    rows_tc = m <= 16 or prefill == "tensor_cores" or (prefill == "cublas" and m < wog.CUBLAS_MIN_M)
    assert plugin.uses_tensor_cores(dtype, m) == (rows_tc and (gs % 16 == 0 or gs == case[1]))
    tc_groups = gs % 16 == 0 or gs == case[1]
    assert plugin.prefill_on_cublas(dtype, m) == (prefill == "cublas" and (m >= wog.CUBLAS_MIN_M or (m > 16 and not tc_groups)))
    k = qw.shape[1]
    specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in packed.arrays()]
    rtol = default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24
    check_plugin(plugin, specs, rtol=rtol)


@pytest.mark.parametrize("m", [1, 17, 64])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_float32_x_takes_the_tiled_kernel(case: tuple, m: int) -> None:
    """float32 x (a float32 engine's linears) runs the tiled float32 kernel at any M, whatever
    PREFILL_KERNEL says, and matches the float64 reference within float32 accumulation error."""
    f32 = np.dtype(np.float32)
    rng = np.random.default_rng(zlib.crc32(repr((case, "f32", m)).encode()))
    qw = _qw(rng, *case)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    assert not plugin.uses_tensor_cores(f32, m) and not plugin.prefill_on_cublas(f32, m)
    k = qw.shape[1]
    specs = [((m, k), f32)] + [(a.shape, a.dtype, a) for a in packed.arrays()]
    check_plugin(plugin, specs, rtol=default_tolerance(f32)[0] + np.sqrt(k) * 2.0**-24)


SWIGLU_CASES = [
    # (2 I, K, bits, group_size (0: per channel), zeros, perm): I = 256 and 48 move half tiles, I = 40 repacks
    (512, 4096, 4, 128, "none", False),
    (96, 1024, 4, 64, "int", False),
    (80, 2080, 4, 32, "frac", True),
    (128, 1024, 8, 0, "none", False),
]


@pytest.mark.parametrize(("m", "prefill"), [(1, "cublas"), (5, "cublas"), (12, "cublas"), (17, "cublas"), (64, "cublas"), (64, "tiled")])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", SWIGLU_CASES, ids=str)
def test_swiglu_plugin_matches_reference(case: tuple, dtype: np.dtype, m: int, prefill: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SwiGLU form of a gate/up plugin (``with_swiglu``): the decode kernels' epilogue (M up
    to 16, v2 where it applies, v1 for act order) and the staged paths (cuBLAS at 64 rows, the
    tiled kernel) against the reference, silu(gate) * up of the float64 GEMM rounded as the layers
    round. Tolerance: four times the GEMM's, since an ulp of gate or up moves the product by
    about that much of |up| or |silu(gate)|."""
    monkeypatch.setattr(wog, "PREFILL_KERNEL", prefill)
    rng = np.random.default_rng(zlib.crc32(repr((case, str(dtype), m, "swiglu")).encode()))
    qw = _qw(rng, *case)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    made = plugin.with_swiglu(packed.arrays())
    assert made is not None
    fused, arrays = made
    k = qw.shape[1]
    specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in arrays]
    check_plugin(fused, specs, rtol=4 * (default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24))


#: many-tile weights where DECODE_RULE changes the default decode kernel: (case, WARPS, UNROLL)
RULE_CASES = [
    ((16 * 1024, 256, 4, 128, "none", False), 4, 2),  # 1024 tiles: 4 warps, UNROLL 2
    ((16 * 4100, 256, 4, 128, "none", False), 2, 2),  # more tiles than the warp target: 2 warps, not 1
    ((16 * 1024, 256, 4, 128, "int", False), 4, 1),  # zero points keep UNROLL 1
    ((16 * 4100, 256, 8, 0, "none", False), 2, 2),  # int8: UNROLL 2 always; 2 warps
]


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize(("case", "warps", "unroll"), RULE_CASES, ids=str)
def test_decode_rule_kernels_match_reference(case: tuple, warps: int, unroll: int, m: int, gated: bool) -> None:
    """The default decode kernel on the shapes where weight_only_gemm.DECODE_RULE picks more
    warps or UNROLL 2 (the lm_head's and gate/up's), alone and with the SwiGLU epilogue, against
    the reference (bfloat16 x)."""
    dtype = DTYPES[1]
    rng = np.random.default_rng(zlib.crc32(repr((case, m, gated, "rule")).encode()))
    qw = _qw(rng, *case)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    arrays = packed.arrays()
    if gated:
        made = plugin.with_swiglu(arrays)
        assert made is not None
        plugin, arrays = made
    variant = plugin.decode_variant(dtype, m)
    assert (variant["WARPS"], variant["UNROLL"]) == (warps, unroll), variant
    k = qw.shape[1]
    specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in arrays]
    check_plugin(plugin, specs, rtol=(4 if gated else 1) * (default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24))


@pytest.mark.parametrize("case", SWIGLU_CASES[:2], ids=str)
def test_swiglu_plugin_float32_stages_the_tiled_output(case: tuple) -> None:
    """float32 x: the tiled kernel into the workspace, then trtcore_wq_swiglu."""
    f32 = np.dtype(np.float32)
    rng = np.random.default_rng(zlib.crc32(repr((case, "f32", "swiglu")).encode()))
    qw = _qw(rng, *case)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    fused, arrays = plugin.with_swiglu(packed.arrays())  # type: ignore[misc]
    k = qw.shape[1]
    specs = [((3, k), f32)] + [(a.shape, a.dtype, a) for a in arrays]
    check_plugin(fused, specs, rtol=4 * (default_tolerance(f32)[0] + np.sqrt(k) * 2.0**-24))


@pytest.mark.parametrize("warps", [1, 3, 16])
def test_decode_warps_share_a_tile(warps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any number of warps per tile gives the same sums (the warps' partials added in shared
    memory); K = 4128 leaves the last chunk half outside K."""
    rng = np.random.default_rng(5 + warps)
    qw = _qw(rng, 48, 4128, 4, 96, "frac", False)  # group 96: segments end inside chunks
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    monkeypatch.setattr(WeightOnlyGemmPlugin, "decode_warps", lambda self, row_tiles=1, target=0: warps)
    dtype = np.dtype(ml_dtypes.bfloat16)
    assert plugin.uses_tensor_cores(dtype, 2)
    specs = [((2, 4128), dtype)] + [(a.shape, a.dtype, a) for a in packed.arrays()]
    check_plugin(plugin, specs, rtol=2.0**-7 + 1e-5)


V2_VARIANTS = [{"WQ_DECODE": 2, "ROW_TILES": rt, "WQ_FOLD": f, "SEG": seg, "L2_PF": 0} for rt in (1, 2) for f in (0, 1) for seg in (1, 2)]
# the L2 prefetch and fetch size change no sums, only how loads are issued: two variants with
# them; WQ_FOLD 2
# (float16 int4's 1024 offset: the least accurate) once
V2_VARIANTS += [
    {"WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 2, "SEG": 2, "L2_PF": 0},
    {"WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 1, "SEG": 1, "L2_PF": 2},
    {"WQ_DECODE": 2, "ROW_TILES": 2, "WQ_FOLD": 0, "SEG": 2, "L2_PF": 2, "L2_HINT": 2},
]
# the weights in flight in shared memory (cp.async rings): the same sums, other loads
V2_VARIANTS += [
    {"WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "L2_PF": 0, "ASYNC": 6},
    {"WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 1, "SEG": 1, "L2_PF": 0, "ASYNC": 2},
    {"WQ_DECODE": 2, "ROW_TILES": 2, "WQ_FOLD": 0, "SEG": 1, "L2_PF": 0, "ASYNC": 3},
    {"WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 1, "SEG": 2, "L2_PF": 0, "ASYNC": 4, "XPF": 1},
]


#: v2 variants the contiguous-x order is checked with beside the default decode kernel
CONTIG_X_VARIANTS = [V2_VARIANTS[i] for i in (0, 3, 5, 8, 11, 14)]  # 11, 14: the cp.async rings (14 with XPF)


def _v2_id(v: dict) -> str:
    return f"rt{v['ROW_TILES']}_f{v['WQ_FOLD']}_s{v['SEG']}_pf{v['L2_PF']}_h{v.get('L2_HINT', 0)}_a{v.get('ASYNC', 0)}_x{v.get('XPF', 0)}"


@pytest.fixture(scope="module", autouse=True)
def _v2_compiled() -> None:
    """Every v2 define set compiled first, by parallel threads (NVRTC releases the GIL; the
    launcher then finds them in the disk cache; one after another they would take minutes)."""
    import concurrent.futures

    from trtcore import kernels

    sets = [
        {"DTYPE": d, "BITS": b, "HAS_ZEROS": z, "HAS_PERM": 0, **v}
        for d in (1, 2)
        for b in (4, 8)
        for z in (0, 1)
        for v in V2_VARIANTS + [{key: val for key, val in v.items() if key != "SEG"} for v in V2_VARIANTS]  # SEG left out: the fallback
    ]
    # the contiguous-x order's: the default decode kernel, CONTIG_X_VARIANTS, v1 (prefill, M > 8)
    sets += [
        {"DTYPE": d, "BITS": b, "HAS_ZEROS": z, "HAS_PERM": 0, "CONTIG_X": 1, **v}
        for d in (1, 2)
        for b in (4, 8)
        for z in (0, 1)
        for v in [{}, wog.DEFAULT_DECODE[b], *CONTIG_X_VARIANTS]
    ]
    sets += [{k: val for k, val in d.items() if k != "SEG"} for d in sets if d.get("CONTIG_X")]  # the SEG fallback
    for d in sets:  # as the plugin adds or drops them: the rings' slot size, XPF (contiguous x only)
        if d.get("ASYNC"):
            d["ASLOT"] = wog.async_slot_bytes(d.get("SEG", 1), d.get("ROW_TILES", 1), bool(d["HAS_ZEROS"]))
        if d.get("XPF") and not d.get("CONTIG_X"):
            del d["XPF"]
    unique = [dict(t) for t in sorted({tuple(sorted(d.items())) for d in sets})]
    arch = kernels.current_arch()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda d: kernels.compile_kernel("wq_gemm", defines=d, arch=arch), unique))


V2_CASES = [
    # (N, K, bits, group_size (0: per channel), zeros): N = 40 and 300 leave half tiles, 3 and
    # 19 tiles an odd count for ROW_TILES 2; K = 1536, 2560 and 4160 are whole chunks only;
    # SEG 2 needs an even chunk count per group (else it runs as SEG 1): group 64 int4 and
    # K = 2080 int8 per channel (65 chunks) fall back
    (40, 4096, 4, 128, "none"),
    (300, 1536, 4, 64, "int"),
    (48, 2560, 4, 256, "frac"),
    (200, 4160, 4, 64, "none"),
    (96, 2048, 4, 32, "int"),  # half-chunk groups: v1
    (512, 1024, 8, 0, "none"),
    (40, 2080, 8, 0, "int"),
    (300, 2048, 8, 64, "frac"),
    (72, 1536, 8, 128, "none"),
]


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", V2_CASES, ids=str)
@pytest.mark.parametrize("variant", V2_VARIANTS, ids=_v2_id)
def test_v2_decode_matches_reference(variant: dict, case: tuple, dtype: np.dtype, m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((variant, case, str(dtype), m)).encode()))
    qw = _qw(rng, *case, False)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    monkeypatch.setattr(wog, "DECODE_VARIANT", dict(variant))
    # v2 exactly where it applies: whole-chunk groups (all here but int4 group 32)
    chosen = plugin.decode_variant(dtype, m)
    assert bool(chosen) == (case[2:4] != (4, 32))
    assert not chosen or chosen.get("SEG", 1) == (variant["SEG"] if plugin.chunks_per_group() % variant["SEG"] == 0 else 1)
    k = qw.shape[1]
    specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in packed.arrays()]
    rtol = default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24
    check_plugin(plugin, specs, rtol=rtol)


@pytest.mark.parametrize("warps", [1, 3, 16])
@pytest.mark.parametrize("variant", V2_VARIANTS, ids=_v2_id)
def test_v2_warps_share_the_tiles(variant: dict, warps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """v2 gives the same sums with any number of warps per block, also with fewer units
    (K = 1024: 16 chunks) than UNROLL x warps, and with act order falls back to v1."""
    rng = np.random.default_rng(11 + warps)
    monkeypatch.setattr(wog, "DECODE_VARIANT", dict(variant))
    monkeypatch.setattr(WeightOnlyGemmPlugin, "decode_warps", lambda self, row_tiles=1, target=0: warps)
    dtype = np.dtype(ml_dtypes.bfloat16)
    for gs, perm in ((64, False), (128, False), (128, True)):
        qw = _qw(rng, 56, 1024, 4, gs, "frac", perm)
        plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
        assert bool(plugin.decode_variant(dtype, 4)) != perm
        specs = [((4, 1024), dtype)] + [(a.shape, a.dtype, a) for a in packed.arrays()]
        check_plugin(plugin, specs, rtol=2.0**-7 + 1e-5)


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous_x", "natural"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", V2_CASES, ids=str)
def test_k_order_matches_reference(case: tuple, dtype: np.dtype, contiguous: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights packed in the contiguous-x K order (where groups are whole chunks; int4 group 32
    cannot be) or the natural one run the default decode kernel at M = 1, 5 and 8, the M = 12
    and 40 kernels, and CONTIG_X_VARIANTS at M = 3, within the same tolerance."""
    rng = np.random.default_rng(zlib.crc32(repr((case, str(dtype), "contiguous x" if contiguous else "natural")).encode()))
    qw = _qw(rng, *case, False)
    if contiguous and case[2:4] == (4, 32):
        with pytest.raises(wog.PluginError, match="contiguous-x order needs"):
            wog.pack_weight(qw, contiguous_x=True)
        return
    packed = wog.pack_weight(qw, contiguous_x=contiguous)
    plugin = WeightOnlyGemmPlugin(qw.shape[1], qw.shape[0], qw.bits, qw.group_size, qw.zeros is not None, False, contiguous)
    k = qw.shape[1]
    rtol = default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24
    runs = [(m, {}) for m in (1, 5, 8, 12, 40)] + [(3, v) for v in CONTIG_X_VARIANTS]
    for m, variant in runs:
        monkeypatch.setattr(wog, "DECODE_VARIANT", dict(variant))
        assert plugin.defines(dtype).get("CONTIG_X", 0) == int(contiguous)
        assert m > 8 or plugin.decode_variant(dtype, m).get("WQ_DECODE") == 2 or case[2:4] == (4, 32)
        specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in packed.arrays()]
        check_plugin(plugin, specs, rtol=rtol)


@pytest.mark.parametrize("offset", [4, 8])
@pytest.mark.parametrize("case", [(40, 4096, 4, 128, "none"), (300, 2048, 8, 64, "frac"), (512, 1024, 8, 0, "none")], ids=str)
def test_x_off_16_byte_alignment_takes_v1(case: tuple, offset: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A contiguous-x weight and an x view ``offset`` bytes past 16-byte alignment (a slice of a
    bigger tensor): the plugin runs v1 for M <= 8 (its 4-byte x loads need 4-byte alignment only,
    v2's 16-byte ones would fault) and the 16-row kernel above (M = 12 one slice; with
    ``PREFILL_KERNEL`` "tensor_cores" M = 17 and 40 in two and three; with "cublas" cuBLASLt
    reads that x, told its alignment), and their outputs equal the reference of that x; a
    float32 x (the tiled kernel's 16-byte x loads) is refused before any launch."""
    import cupy as cp

    from trtcore.plugins.base import DeviceTensor

    rng = np.random.default_rng(zlib.crc32(repr((case, offset)).encode()))
    qw = _qw(rng, *case, False)
    packed = wog.pack_weight(qw, contiguous_x=True)
    n, k = qw.shape
    plugin = WeightOnlyGemmPlugin(k, n, qw.bits, qw.group_size, qw.zeros is not None, False, True)
    bf16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
    consts = [cp.asarray(a) for a in packed.arrays()]
    runs = [(1, bf16, "tensor_cores"), (3, bf16, "tensor_cores"), (12, bf16, "tensor_cores"), (17, bf16, "tensor_cores")]
    runs += [(40, bf16, "tensor_cores"), (3, f32, "tensor_cores"), (40, bf16, "cublas"), (64, bf16, "cublas")]
    for m, dtype, prefill in runs:
        monkeypatch.setattr(wog, "PREFILL_KERNEL", prefill)
        ws_bytes = plugin.workspace_size([((m, k), dtype)] + [(a.shape, a.dtype) for a in packed.arrays()], [((m, n), dtype)])
        ws = cp.full(max(ws_bytes, 1), 0xA5, cp.uint8)
        ws_ptr = int(ws.data.ptr) if ws_bytes else 0
        x = rng.standard_normal((m, k)).astype(dtype)
        buf = cp.zeros(m * k * dtype.itemsize + 64, cp.uint8)
        base_ptr = int(buf.data.ptr)
        start = (-base_ptr) % 16 + offset  # 16-byte aligned, then offset bytes on
        buf[start : start + x.nbytes] = cp.asarray(x.view(np.uint8).reshape(-1))
        out = cp.full((m, n), 0xFFFF, cp.uint16)  # NaN
        ins = [DeviceTensor(base_ptr + start, (m, k), dtype)] + [DeviceTensor(int(a.data.ptr), a.shape, a.dtype) for a in consts]
        outs = [DeviceTensor(int(out.data.ptr), (m, n), dtype)]
        if dtype == f32:
            with pytest.raises(wog.PluginError, match="not 16-byte aligned"):
                plugin.enqueue(ins, outs, ws_ptr, int(cp.cuda.get_current_stream().ptr))
            continue
        plugin.enqueue(ins, outs, ws_ptr, int(cp.cuda.get_current_stream().ptr))
        got = cp.asnumpy(out).view(dtype).astype(np.float64)
        (want,) = plugin.reference(x, *packed.arrays())
        want = want.astype(np.float64)
        tol = (default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24) * np.abs(want).max()
        assert np.isfinite(got).all() and np.abs(got - want).max() <= tol, (m, offset, prefill)


#: v2 variants the SwiGLU epilogue is checked with beside the default: two row tiles (odd tile
#: counts), the folded offset, and the cp.async rings (ROW_TILES 2, and XPF)
SWIGLU_V2_VARIANTS = [V2_VARIANTS[i] for i in (2, 5, 13, 14)]


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("case", [(512, 4096, 4, 128, "none"), (80, 1536, 4, 128, "int"), (96, 2048, 8, 64, "frac")], ids=str)
@pytest.mark.parametrize("variant", SWIGLU_V2_VARIANTS, ids=_v2_id)
def test_swiglu_epilogue_of_v2_variants(variant: dict, case: tuple, m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SwiGLU epilogue (GATED) of the v2 decode kernels that are not the default, on the
    contiguous-x order: 2 I = 80 rows are 5 tiles, an odd count for two row tiles per block."""
    monkeypatch.setattr(wog, "DECODE_VARIANT", variant)
    dtype = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(zlib.crc32(repr((variant, case, m, "swiglu-v2")).encode()))
    qw = _qw(rng, *case, False)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    fused, arrays = plugin.with_swiglu(packed.arrays())  # type: ignore[misc]
    assert fused.decode_variant(dtype, m).get("WQ_DECODE") == 2
    k = qw.shape[1]
    specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in arrays]
    check_plugin(fused, specs, rtol=4 * (default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24))


ROPE_CASES = [
    # (head_dim, q heads, kv heads, K, bits, group_size, zeros, perm): 128 and 64 move half tiles, 16 repacks
    (128, 4, 2, 4096, 4, 128, "none", False),
    (64, 3, 1, 1536, 4, 64, "int", False),
    (16, 5, 1, 1024, 8, 0, "none", False),
    (64, 2, 2, 2080, 4, 32, "frac", True),
]


def _rope_plugin(rng: np.random.Generator, case: tuple) -> tuple[WeightOnlyGemmPlugin, list[np.ndarray], int, np.ndarray]:
    """A q/k/v weight with RoPE in its epilogue (``with_rope``, attention scaling 0.9), its
    constants, K, and inv_freq (base 500000, as Llama 3)."""
    d, hq, hkv, k, bits, gs, zeros, perm = case
    qw = _qw(rng, (hq + 2 * hkv) * d, k, bits, gs, zeros, perm)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    made = plugin.with_rope(packed.arrays(), (hq + hkv) * d, d, 0.9)
    assert made is not None
    freq = (1.0 / 500000.0 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    return made[0], made[1], k, freq


@pytest.mark.parametrize(("m", "prefill"), [(1, "cublas"), (5, "cublas"), (12, "cublas"), (17, "cublas"), (64, "cublas"), (64, "tiled")])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ROPE_CASES, ids=str)
def test_rope_plugin_matches_reference(case: tuple, dtype: np.dtype, m: int, prefill: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The RoPE form of a q/k/v plugin (``with_rope``): the decode kernels' epilogue (M up to 16,
    v2 where it applies, v1 for act order and per channel int8) and the staged paths (cuBLAS at
    64 rows, the tiled kernel, then ``trtcore_wq_rope``) against the reference: the float64 GEMM
    rounded to the dtype, rotated by the RoPE plugin's reference at random positions up to 8000,
    v rows as they are. Tolerance: four times the GEMM's (an ulp of one pair element moves both
    rotated values by up to that ulp)."""
    monkeypatch.setattr(wog, "PREFILL_KERNEL", prefill)
    rng = np.random.default_rng(zlib.crc32(repr((case, str(dtype), m, "rope")).encode()))
    fused, arrays, k, freq = _rope_plugin(rng, case)
    pos = rng.integers(0, 8000, m).astype(np.int32)
    specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in (*arrays, pos, freq)]
    check_plugin(fused, specs, rtol=4 * (default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24))


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("variant", SWIGLU_V2_VARIANTS, ids=_v2_id)
def test_rope_epilogue_of_v2_variants(variant: dict, m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The RoPE epilogue of the v2 decode kernels that are not the default (two row tiles, the
    folded offset, the cp.async rings), head_dim 128: 6 heads of q and k in 48 tiles, v in 16."""
    monkeypatch.setattr(wog, "DECODE_VARIANT", variant)
    dtype = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(zlib.crc32(repr((variant, m, "rope-v2")).encode()))
    fused, arrays, k, freq = _rope_plugin(rng, ROPE_CASES[0])
    assert fused.decode_variant(dtype, m).get("WQ_DECODE") == 2
    pos = rng.integers(0, 8000, m).astype(np.int32)
    specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in (*arrays, pos, freq)]
    check_plugin(fused, specs, rtol=4 * (default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24))


def test_rope_plugin_float32_stages_the_tiled_output() -> None:
    """float32 x: the tiled kernel into the workspace, then trtcore_wq_rope."""
    f32 = np.dtype(np.float32)
    rng = np.random.default_rng(zlib.crc32(b"rope-f32"))
    fused, arrays, k, freq = _rope_plugin(rng, ROPE_CASES[1])
    pos = rng.integers(0, 8000, 3).astype(np.int32)
    specs = [((3, k), f32)] + [(a.shape, a.dtype, a) for a in (*arrays, pos, freq)]
    check_plugin(fused, specs, rtol=4 * (default_tolerance(f32)[0] + np.sqrt(k) * 2.0**-24))


# (N, K, bits, group_size (0: per channel), zeros, perm): 4160 rows are longer than the tail's
# register cache (256 threads x 16), 300 not whole tiles; act order takes v1 and the add + norm kernel
ADD_NORM_CASES = [
    (4160, 1024, 4, 128, "none", False),
    (512, 2048, 8, 0, "none", False),
    (300, 1536, 4, 64, "int", False),
    (96, 2080, 4, 32, "frac", True),
]


def _add_norm_specs(rng: np.random.Generator, case: tuple, m: int, dtype: np.dtype) -> tuple[WeightOnlyGemmPlugin, list, float]:
    """The add + norm form of a weight (``with_add_norm``, epsilon 1e-5), its input specs (x and
    the residual random, the norm weight in [0.5, 1.5], the counter zero) and the tolerance: four
    times the GEMM's (an ulp of h moves the normalized value by about an ulp too)."""
    n, k, bits, gs, zeros, perm = case
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(_qw(rng, n, k, bits, gs, zeros, perm))
    made = plugin.with_add_norm(packed.arrays(), 1e-5)
    assert made is not None
    fused, arrays = made
    w = rng.uniform(0.5, 1.5, n).astype(dtype)
    specs = (
        [((m, k), dtype)]
        + [(a.shape, a.dtype, a) for a in arrays]
        + [((m, n), dtype), (w.shape, w.dtype, w), ((1,), np.dtype(np.int32), np.zeros(1, np.int32))]
    )
    return fused, specs, 4 * (default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24)


@pytest.mark.parametrize(("m", "prefill"), [(1, "cublas"), (3, "cublas"), (8, "cublas"), (12, "cublas"), (64, "cublas"), (64, "tiled")])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ADD_NORM_CASES, ids=str)
def test_add_norm_plugin_matches_reference(case: tuple, dtype: np.dtype, m: int, prefill: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The add + norm form of an o_proj-like plugin (``with_add_norm``): the v2 decode kernel's
    last-block tail (M up to 8), and ``trtcore_wq_add_norm`` after the v1 / 16-row kernels, the
    cuBLAS prefill and the tiled kernel, against the reference: ``h = y + residual`` and its
    RMSNorm (:func:`~trtcore.plugins.weight_only_gemm.add_norm_reference`). check_plugin poisons
    both outputs, runs twice (the counter must be back at 0 for the second run to match, and it is
    an input, which must come back unchanged)."""
    monkeypatch.setattr(wog, "PREFILL_KERNEL", prefill)
    rng = np.random.default_rng(zlib.crc32(repr((case, str(dtype), m, prefill, "add_norm")).encode()))
    fused, specs, rtol = _add_norm_specs(rng, case, m, dtype)
    check_plugin(fused, specs, rtol=rtol)


@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("variant", SWIGLU_V2_VARIANTS, ids=_v2_id)
def test_add_norm_tail_of_v2_variants(variant: dict, m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The add + norm tail of the v2 decode kernels that are not the default (two row tiles, the
    folded offset, the cp.async rings)."""
    monkeypatch.setattr(wog, "DECODE_VARIANT", variant)
    dtype = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(zlib.crc32(repr((variant, m, "add-norm-v2")).encode()))
    fused, specs, rtol = _add_norm_specs(rng, ADD_NORM_CASES[0], m, dtype)
    assert fused.decode_variant(dtype, m).get("WQ_DECODE") == 2
    check_plugin(fused, specs, rtol=rtol)


def test_add_norm_plugin_float32_runs_the_add_norm_kernel() -> None:
    """float32 x: the tiled kernel, then trtcore_wq_add_norm in float32."""
    f32 = np.dtype(np.float32)
    rng = np.random.default_rng(zlib.crc32(b"add-norm-f32"))
    fused, specs, rtol = _add_norm_specs(rng, ADD_NORM_CASES[2], 3, f32)
    check_plugin(fused, specs, rtol=rtol)


# (N, K, bits, group_size, zeros, perm): a Llama-3-8B-wide K, N not whole tiles, per channel int8,
# act order (v1 and the norm kernel)
SPLIT_CASES = [
    (256, 4096, 4, 128, "none", False),
    (300, 1536, 4, 64, "int", False),
    (512, 2048, 8, 0, "none", False),
    (96, 2080, 4, 32, "frac", True),
]


def _split_specs(rng: np.random.Generator, case: tuple, m: int, dtype: np.dtype, form: str, swiglu: bool = False) -> tuple[WeightOnlyGemmPlugin, list, float]:
    """The ``norm_input`` / ``add_residual`` / ``both`` form of a weight (epsilon 1e-5; with
    ``swiglu`` the gate/up form first), its input specs (x as h with magnitudes up to 4, the
    residual random, the norm weight in [0.5, 1.5]) and the tolerance: four times the GEMM's (an
    ulp of the normalized x or of h moves an output by about an ulp)."""
    n, k, bits, gs, zeros, perm = case
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(_qw(rng, n, k, bits, gs, zeros, perm))
    arrays = packed.arrays()
    if swiglu:
        plugin, arrays = plugin.with_swiglu(arrays)  # type: ignore[misc]
    if form in ("norm_input", "both"):
        plugin, arrays = plugin.with_norm_input(arrays, 1e-5)  # type: ignore[misc]
    if form in ("add_residual", "both"):
        plugin, arrays = plugin.with_residual(arrays)  # type: ignore[misc]
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 4.0, (m, 1))).astype(dtype)
    specs = [((m, k), dtype, x)] + [(a.shape, a.dtype, a) for a in arrays]
    if plugin.add_residual:
        specs.append(((m, plugin.output_features), dtype))
    if plugin.norm_input:
        w = rng.uniform(0.5, 1.5, k).astype(dtype)
        specs.append((w.shape, w.dtype, w))
    return plugin, specs, 4 * (default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24)


@pytest.mark.parametrize(("m", "prefill"), [(1, "cublas"), (5, "cublas"), (8, "cublas"), (12, "cublas"), (64, "cublas"), (64, "tiled")])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", ["norm_input", "add_residual", "both"])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=str)
def test_split_add_norm_plugin_matches_reference(case: tuple, form: str, dtype: np.dtype, m: int, prefill: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The norm_input / add_residual forms (trtcore.cuda.norm_input_fusion): the v2 decode
    kernel's folded norm (``NORM_X``) and epilogue add, ``trtcore_wq_rms_norm`` /
    ``trtcore_wq_add_residual`` around the other paths, against the float64 reference
    (:meth:`~trtcore.plugins.weight_only_gemm.WeightOnlyGemmPlugin.reference`: the folded formula
    where ``norm_folds``, else the unfused graph's). check_plugin
    poisons the output and requires every input back unchanged (h is read, not normalized in place)."""
    monkeypatch.setattr(wog, "PREFILL_KERNEL", prefill)
    rng = np.random.default_rng(zlib.crc32(repr((case, form, str(dtype), m, prefill, "split")).encode()))
    plugin, specs, rtol = _split_specs(rng, case, m, dtype, form)
    check_plugin(plugin, specs, rtol=rtol)


@pytest.mark.parametrize("m", [1, 3, 12])
def test_norm_input_swiglu_plugin_matches_reference(m: int) -> None:
    """A gate/up plugin with SwiGLU in its epilogue and the norm in its prologue (the Llama MLP's
    first GEMM after the fusion passes)."""
    dtype = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(zlib.crc32(repr((m, "norm-swiglu")).encode()))
    plugin, specs, rtol = _split_specs(rng, (512, 4096, 4, 128, "none", False), m, dtype, "norm_input", swiglu=True)
    check_plugin(plugin, specs, rtol=rtol)


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("variant", SWIGLU_V2_VARIANTS, ids=_v2_id)
def test_norm_x_of_v2_variants(variant: dict, m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """NORM_X and the epilogue add in the v2 decode kernels that are not the default (two row
    tiles, the folded offset; the cp.async rings are left out with NORM_X)."""
    monkeypatch.setattr(wog, "DECODE_VARIANT", variant)
    dtype = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(zlib.crc32(repr((variant, m, "norm-x-v2")).encode()))
    plugin, specs, rtol = _split_specs(rng, SPLIT_CASES[0], m, dtype, "both")
    assert plugin.norm_folds(dtype, m) and "ASYNC" not in plugin.decode_variant(dtype, m)
    check_plugin(plugin, specs, rtol=rtol)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norm_input_off_16_byte_alignment_is_copied(dtype: np.dtype, m: int) -> None:
    """A folded-norm plugin (``norm_folds``) given h and the norm weight as views 8 bytes past
    16-byte alignment: both are copied into the workspace first (``trtcore_wq_copy``), and the
    output equals the reference of those values; h and the weight are left as they were."""
    import cupy as cp

    from trtcore.plugins.base import DeviceTensor

    rng = np.random.default_rng(zlib.crc32(repr((str(dtype), m, "norm-misaligned")).encode()))
    plugin, specs, rtol = _split_specs(rng, SPLIT_CASES[0], m, dtype, "norm_input")
    assert plugin.norm_folds(dtype, m)
    x, w = specs[0][2], specs[-1][2]
    consts = [cp.asarray(a) for _, _, a in specs[1:-1]]

    def view(a: np.ndarray) -> tuple[Any, int]:  # a copy of a at 16-byte alignment + 8
        buf = cp.zeros(a.nbytes + 64, cp.uint8)
        start = (-int(buf.data.ptr)) % 16 + 8
        buf[start : start + a.nbytes] = cp.asarray(a.view(np.uint8).reshape(-1))
        return buf, int(buf.data.ptr) + start

    (xbuf, xp), (wbuf, wp) = view(x), view(w)
    n, k = plugin.out_features, plugin.in_features
    ws_bytes = plugin.workspace_size([((m, k), dtype)], [((m, n), dtype)])
    ws = cp.full(ws_bytes, 0xA5, cp.uint8)
    out = cp.full((m, n), 0xFFFF, cp.uint16)  # NaN
    ins = [DeviceTensor(xp, (m, k), dtype)] + [DeviceTensor(int(a.data.ptr), a.shape, a.dtype) for a in consts] + [DeviceTensor(wp, (k,), dtype)]
    before = (xbuf.copy(), wbuf.copy())
    plugin.enqueue(ins, [DeviceTensor(int(out.data.ptr), (m, n), dtype)], int(ws.data.ptr), int(cp.cuda.get_current_stream().ptr))
    got = cp.asnumpy(out).view(dtype).astype(np.float64)
    (want,) = plugin.reference(x, *[a for _, _, a in specs[1:-1]], w)
    want = want.astype(np.float64)
    assert np.isfinite(got).all() and np.abs(got - want).max() <= rtol * np.abs(want).max()
    assert bool((xbuf == before[0]).all()) and bool((wbuf == before[1]).all())


def test_split_add_norm_plugin_float32() -> None:
    """float32 x: trtcore_wq_rms_norm, the tiled kernel, trtcore_wq_add_residual, in float32."""
    f32 = np.dtype(np.float32)
    rng = np.random.default_rng(zlib.crc32(b"split-f32"))
    plugin, specs, rtol = _split_specs(rng, SPLIT_CASES[1], 3, f32, "both")
    check_plugin(plugin, specs, rtol=rtol)
