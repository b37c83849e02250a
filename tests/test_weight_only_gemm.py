"""The weight-only GEMM plugin (:mod:`trtcore.plugins.weight_only_gemm`) and
:func:`trtcore.ops.weight_only_linear`, on the CPU.

* the plugin's reference equals float64 NumPy of ``QuantizedWeight.dequantize()`` for random
  shapes, 4/8 bits, group sizes 32/64/128 and per-channel, with and without (fractional) zero
  points and an act-order permutation, M in {1, 3, 17}, float16 and bfloat16;
* the kernels' layout round-trips (``unpack(pack(qw)) == qw``) and puts code ``(n, k)`` where
  the layout's documentation says (an independent per-element formula); the contiguous-x K
  order gives every lane of the mma one contiguous run of x per chunk, b0 / b1 of each k-step
  its 32-bit words in order (the PTX B-fragment table), and is chosen (when turned on) exactly
  where groups are whole chunks without act order; the kernel's index helpers, built for the
  host, invert it;
* every variant of ``kernels/wq_gemm.cu`` compiles with NVRTC for sm_80, sm_89 and sm_90, and
  so does every v2 decode variant (``WQ_DECODE 2``, ROW_TILES, WQ_FOLD) for sm_80 and sm_90;
  v2's bit tricks (LOP3 / PRMT with magic numbers) turn each lane's words into ``offset + code``
  as the kernel's flush assumes (emulated here bit by bit);
* a small network with the plugin runs on the reference backend, and so does the native
  alternative (dequantize + matmul, emulated with layers there), both within float16/bfloat16
  rounding of float64; ``tensorrt_rtx`` builds the native alternative (dequantize layer);
* a network with the plugin compiles on the cuda backend (host only, no GPU).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from ops.conftest import HAS_RTX, OneOp, assert_close

import trtcore.reference as ref
from trtcore import kernels, ops
from trtcore.plugins import base, builtin_plugins
from trtcore.plugins import weight_only_gemm as wog
from trtcore.plugins.base import PluginError
from trtcore.plugins.weight_only_gemm import (
    WeightOnlyGemmPlugin,
    chunk_codes,
    code_position,
    contiguous_x_order,
    pack_codes,
    pack_weight,
    unpack_codes,
    unpack_weight,
)
from trtcore.quantization import QuantizedWeight

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {"float16": np.dtype(np.float16), "bfloat16": BF16}
#: output roundoff (half an ulp at 1) of each format
UNIT = {"float16": 2.0**-11, "bfloat16": 2.0**-8}


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """Seeded by the test's id (as tests/ops): fresh inputs per case, the same on every run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def random_qw(rng: np.random.Generator, n: int, k: int, bits: int, group_size: int, zeros: str, perm: bool) -> QuantizedWeight:
    """Random codes and scales; ``zeros``: "none" (symmetric), "int" (GPTQ-style integer) or
    "frac" (GGUF Q4_1-style fractional)."""
    g = k // group_size
    codes = rng.integers(0, 1 << bits, (n, k)).astype(np.uint8)
    scales = rng.uniform(0.002, 0.05, (n, g)).astype(np.float32)
    z = None
    if zeros == "int":
        z = rng.integers(0, 1 << bits, (n, g)).astype(np.float32)
    elif zeros == "frac":
        z = rng.uniform(0, (1 << bits) - 1, (n, g)).astype(np.float32)
    p = rng.permutation(k).astype(np.int32) if perm else None
    return QuantizedWeight(codes, scales, z, bits, group_size, p)


CASES = [
    # (N, K, bits, group_size (0: per channel), zeros, perm)
    (24, 256, 4, 32, "none", False),
    (40, 512, 4, 64, "int", False),
    (17, 384, 4, 128, "frac", True),
    (8, 1032, 4, 8, "int", False),  # K beyond one tile, not a multiple of it
    (33, 256, 8, 0, "none", False),  # W8A16 per channel
    (16, 640, 8, 64, "frac", True),
    (5, 96, 8, 32, "int", False),
]


def _qw(rng: np.random.Generator, case: tuple) -> QuantizedWeight:
    n, k, bits, gs, zeros, perm = case
    return random_qw(rng, n, k, bits, gs or k, zeros, perm)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_reference_is_float64_dequantize(case: tuple, m: int, dtype: str, rng: np.random.Generator) -> None:
    qw = _qw(rng, case)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    x = rng.standard_normal((m, qw.shape[1])).astype(DTYPES[dtype])
    want = x.astype(np.float64) @ qw.dequantize().T  # float64 NumPy from the canonical form
    (got,) = plugin.reference(x, *packed.arrays())
    assert got.dtype == x.dtype and got.shape == (m, qw.shape[0])
    # one rounding of the float64 result: within half an output ulp
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=UNIT[dtype], atol=1e-30)


def test_reference_keeps_leading_dimensions(rng: np.random.Generator) -> None:
    qw = random_qw(rng, 12, 64, 4, 32, "int", False)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    x = rng.standard_normal((2, 3, 64)).astype(np.float16)
    (got,) = plugin.reference(x, *packed.arrays())
    want = (x.astype(np.float64) @ qw.dequantize().T).astype(np.float16)
    assert got.shape == (2, 3, 12)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_layout_round_trips(case: tuple, rng: np.random.Generator) -> None:
    qw = _qw(rng, case)
    pw = pack_weight(qw)
    n, k = qw.shape
    tiles, chunks = -(-n // 16), -(-k // chunk_codes(qw.bits))
    assert pw.codes.dtype == np.int32 and pw.codes.shape == (tiles, chunks * 128)
    assert pw.scales.shape == (tiles, 16 * (k // qw.group_size))
    back = unpack_weight(pw)
    np.testing.assert_array_equal(back.codes, qw.codes)
    np.testing.assert_array_equal(back.scales, qw.scales)
    assert (back.zeros is None) == (qw.zeros is None) and (back.zeros is None or np.array_equal(back.zeros, qw.zeros))
    assert (back.perm is None) == (qw.perm is None) and (back.perm is None or np.array_equal(back.perm, qw.perm))
    assert (back.bits, back.group_size) == (qw.bits, qw.group_size)


def _a_fragment_table(lane: int, reg: int, e: int) -> tuple[int, int]:
    """Row and column of element ``2 reg + e`` of lane ``lane``'s A fragment of
    ``mma.m16n8k16`` (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type":
    ``row = groupID`` for a0, a1, a4, a5 and ``groupID + 8`` for the others,
    ``col = threadID_in_group * 2 + (i & 1)`` for a0..a3 and ``+ 8`` for a4..a7)."""
    i = 2 * reg + e
    group, thread = divmod(lane, 4)
    row = group + (8 if i in (2, 3, 6, 7) else 0)
    col = thread * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


@pytest.mark.parametrize("bits", [4, 8])
def test_layout_feeds_the_mma_fragments(bits: int, rng: np.random.Generator) -> None:
    """Decoding every lane's words the way kernels/wq_gemm.cu's ``a_fragment`` does (int4:
    register ``reg`` = the nibbles of ``(word >> 4 reg) & 0x000F000F``, low half first; int8:
    register ``2 h + p`` = bytes ``2p``, ``2p + 1`` of word ``2 j + h``) and placing each value
    by the PTX fragment table gives back the 16 x 16 block of codes of every k-step;
    :func:`code_position` agrees, and the padding holds zero codes."""
    n, k = 37, 1544  # 3 tiles (the last one padded), K padded to whole chunks
    codes = rng.integers(0, 1 << bits, (n, k)).astype(np.uint8)
    words = pack_codes(codes, bits).view(np.uint32)
    c = chunk_codes(bits)
    tiles, chunks = words.shape[0], words.shape[1] // 128
    full = np.zeros((tiles * 16, chunks * c), np.uint8)
    full[:n, :k] = codes
    mask = (1 << bits) - 1
    for tile in range(tiles):
        for chunk in range(chunks):
            vec = words[tile, chunk * 128 : (chunk + 1) * 128].reshape(32, 4)
            for j in range(c // 16):
                block = np.full((16, 16), 255, np.int64)
                for lane in range(32):
                    for reg in range(4):
                        for e in range(2):
                            if bits == 4:
                                val = (int(vec[lane, j]) >> (4 * reg + 16 * e)) & mask
                            else:
                                h, p = divmod(reg, 2)
                                val = (int(vec[lane, 2 * j + h]) >> (8 * (2 * p + e))) & mask
                            block[_a_fragment_table(lane, reg, e)] = val
                k0 = chunk * c + 16 * j
                np.testing.assert_array_equal(block, full[tile * 16 : tile * 16 + 16, k0 : k0 + 16])
    for _ in range(200):
        t, ch, lane, w = int(rng.integers(tiles)), int(rng.integers(chunks)), int(rng.integers(32)), int(rng.integers(4))
        slot = int(rng.integers(32 // bits))
        row, col = code_position(bits, t, ch, lane, w, slot)
        assert (int(words[t, ch * 128 + lane * 4 + w]) >> (bits * slot)) & mask == full[row, col]
    np.testing.assert_array_equal(unpack_codes(pack_codes(codes, bits), bits, n, k), codes)


def _b_fragment_rows(lane: int) -> tuple[list[int], list[int]]:
    """The rows (k within the k-step) of lane ``lane``'s B-fragment registers b0 and b1 of
    ``mma.m16n8k16`` (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type":
    ``row = threadID_in_group * 2 + (i & 1)`` for b0, b1 and ``+ 8`` for b2, b3; two elements
    per 32-bit register)."""
    thread = lane % 4
    return [thread * 2 + i for i in (0, 1)], [thread * 2 + 8 + i for i in (0, 1)]


@pytest.mark.parametrize("bits", [4, 8])
def test_contiguous_x_order_gives_each_lane_one_run_of_x(bits: int) -> None:
    """In the contiguous-x order, the x columns of lane ``4 gid + tid``'s b0 and b1 in k-step
    ``j`` of a chunk are 32-bit words ``2 j`` and ``2 j + 1`` of one run of C / 4 columns from
    ``chunk * C + tid * C / 4`` (what the CONTIG_X kernels load, 16 bytes at a time); the
    order is a permutation inside each chunk."""
    c = chunk_codes(bits)
    chunks = 3
    order = contiguous_x_order(chunks * c, bits)
    for chunk in range(chunks):
        np.testing.assert_array_equal(np.sort(order[chunk * c : (chunk + 1) * c]), chunk * c + np.arange(c))
        for lane in range(32):
            run = chunk * c + (lane % 4) * (c // 4) + np.arange(c // 4)
            words = run.reshape(-1, 2)  # two 16-bit x elements per 32-bit word
            rows0, rows1 = _b_fragment_rows(lane)
            for j in range(c // 16):
                k0 = chunk * c + 16 * j
                np.testing.assert_array_equal(order[[k0 + r for r in rows0]], words[2 * j])
                np.testing.assert_array_equal(order[[k0 + r for r in rows1]], words[2 * j + 1])
    with pytest.raises(PluginError, match=f"multiple of {c}"):
        contiguous_x_order(c + 8, bits)


_LAYOUT_MAIN = r"""
#include <cstdio>
int main() {
    const int K = 3 * CHUNK;
    for (int k = 0; k < K; ++k) std::printf("%d ", stored_col(k));
    std::printf("\n");
    for (int k0 = 0; k0 < K; k0 += 16)
        for (int tid = 0; tid < 4; ++tid) {
            int ka, kb;
            b_columns(k0, tid, ka, kb);
            std::printf("%d %d ", ka, kb);
        }
    std::printf("\n");
    return 0;
}
"""


@pytest.mark.parametrize("contig", [0, 1])
@pytest.mark.parametrize("bits", [4, 8])
def test_kernel_index_helpers_invert_the_order(bits: int, contig: int, tmp_path: Any) -> None:
    """kernels/wq_layout.cuh -- the very header the kernels include -- built for the host with
    a C++ compiler (skipped, saying why, without one): ``stored_col`` inverts the K order
    (contiguous_x_order, or the identity without CONTIG_X) and ``b_columns`` gives each lane's b0 /
    b1 pair of every k-step: the order's columns at stored ``k0 + 2 tid`` and ``k0 + 2 tid + 8``."""
    import shutil
    import subprocess

    cxx = shutil.which("g++") or shutil.which("clang++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++ / clang++) to build kernels/wq_layout.cuh")
    c = chunk_codes(bits)
    src = tmp_path / "layout.cpp"
    src.write_text(_LAYOUT_MAIN)
    exe = tmp_path / "layout"
    header = Path(kernels.__file__).resolve().parent / "wq_layout.cuh"
    flags = ["-D__host__=", "-D__device__=", "-D__forceinline__=inline", f"-DCHUNK={c}", f"-DCONTIG_X={contig}", "-include", str(header)]
    built = subprocess.run([cxx, "-std=c++17", *flags, str(src), "-o", str(exe)], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    stored = np.array(lines[0].split(), np.int64)
    pairs = np.array(lines[1].split(), np.int64).reshape(-1, 4, 2)  # [k-step, tid, (ka, kb)]
    order = contiguous_x_order(3 * c, bits) if contig else np.arange(3 * c)
    np.testing.assert_array_equal(stored[order], np.arange(3 * c))
    for step in range(3 * c // 16):
        for tid in range(4):
            np.testing.assert_array_equal(pairs[step, tid], [order[16 * step + 2 * tid], order[16 * step + 2 * tid + 8]])
            assert order[16 * step + 2 * tid + 1] == order[16 * step + 2 * tid] + 1  # pairs: one 32-bit load
            assert order[16 * step + 2 * tid + 9] == order[16 * step + 2 * tid + 8] + 1


@pytest.mark.parametrize(
    ("case", "chosen"),
    [
        ((40, 512, 4, 64, "int", False), True),
        ((33, 256, 8, 0, "none", False), True),  # per channel
        ((5, 96, 8, 32, "int", False), True),  # int8 chunks are 32 codes
        ((24, 256, 4, 32, "none", False), False),  # half-chunk groups
        ((17, 384, 4, 128, "frac", True), False),  # act order
        ((8, 1032, 4, 8, "int", False), False),
    ],
    ids=str,
)
def test_contiguous_x_packing_where_groups_are_whole_chunks(
    case: tuple, chosen: bool, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With CONTIGUOUS_X on (the default), pack_weight stores the codes in the contiguous-x order
    exactly where every group is whole chunks and there is no act order (off: nowhere): the
    natural layout of the permuted columns; it unpacks to the weight, and the plugin's reference
    is float64 NumPy of it. Asking for it elsewhere is refused, by pack_weight and by the
    plugin's fields."""
    qw = _qw(rng, case)
    n, k = qw.shape
    if "TRTCORE_WQ_CONTIGUOUS_X" not in os.environ:
        assert wog.CONTIGUOUS_X, "the contiguous-x order is the default"
    monkeypatch.setattr(wog, "CONTIGUOUS_X", False)
    assert pack_weight(qw).contiguous_x is False and WeightOnlyGemmPlugin.from_quantized(qw)[0].contiguous_x is False
    monkeypatch.setattr(wog, "CONTIGUOUS_X", True)
    pw = pack_weight(qw)
    assert pw.contiguous_x is chosen
    natural = pack_weight(qw, contiguous_x=False)
    assert natural.contiguous_x is False
    np.testing.assert_array_equal(unpack_codes(natural.codes, qw.bits, n, k), qw.codes)
    if chosen:
        np.testing.assert_array_equal(unpack_codes(pw.codes, qw.bits, n, k), qw.codes[:, contiguous_x_order(k, qw.bits)])
    else:
        np.testing.assert_array_equal(pw.codes, natural.codes)
        with pytest.raises(PluginError, match="contiguous-x order needs"):
            pack_weight(qw, contiguous_x=True)
        with pytest.raises(PluginError, match="contiguous_x needs"):
            WeightOnlyGemmPlugin(k, n, qw.bits, qw.group_size, qw.zeros is not None, qw.perm is not None, True)
    for packed in (pw, natural):
        np.testing.assert_array_equal(unpack_weight(packed).codes, qw.codes)
        plugin = WeightOnlyGemmPlugin(k, n, qw.bits, qw.group_size, qw.zeros is not None, qw.perm is not None, packed.contiguous_x)
        assert plugin.defines(BF16).get("CONTIG_X", 0) == int(packed.contiguous_x)
        x = rng.standard_normal((3, k)).astype(BF16)
        (got,) = plugin.reference(x, *packed.arrays())
        np.testing.assert_allclose(got.astype(np.float64), x.astype(np.float64) @ qw.dequantize().T, rtol=UNIT["bfloat16"], atol=1e-30)
    assert WeightOnlyGemmPlugin.from_quantized(qw)[0].contiguous_x is chosen


def test_contiguous_x_field_is_optional_and_keys_fusion(rng: np.random.Generator) -> None:
    """contiguous_x (added after version 1) is left out of the field collection at False, a
    collection without it (an engine serialized before it) loads with False, True round-trips;
    weights of the two K orders do not fuse (different row_fusion_key)."""
    plugin = WeightOnlyGemmPlugin(128, 24, 4, 64, contiguous_x=True)
    assert base.create(plugin, ref) == plugin
    old = WeightOnlyGemmPlugin(128, 24, 4, 64)
    assert "contiguous_x" not in {name for name, _, _ in old.field_values()}
    assert WeightOnlyGemmPlugin.from_field_data({name: data for name, _, data in old.field_values()}) == old
    qw = random_qw(rng, 16, 128, 4, 64, "none", False)
    a_packed, b_packed = pack_weight(qw, contiguous_x=True), pack_weight(qw, contiguous_x=False)
    a, b = WeightOnlyGemmPlugin(128, 16, 4, 64, contiguous_x=True), WeightOnlyGemmPlugin(128, 16, 4, 64)
    assert a.row_fusion_key(a_packed.arrays()) != b.row_fusion_key(b_packed.arrays())


def test_swiglu_field_round_trips_and_an_unknown_field_is_refused() -> None:
    """swiglu (optional, False when absent) round-trips through the field collection; a field
    this version does not know (an engine from a newer trtcore, whose field would change the
    output) is a PluginError naming it, not dropped."""
    plugin = WeightOnlyGemmPlugin(128, 48, 4, 64, swiglu=True)
    assert base.create(plugin, ref) == plugin
    assert "swiglu" not in {name for name, _, _ in WeightOnlyGemmPlugin(128, 48, 4, 64).field_values()}
    data = {name: d for name, _, d in plugin.field_values()}
    with pytest.raises(PluginError, match=r"unknown field\(s\) \['residual_norm'\] \(serialized by a newer trtcore\?\)"):
        WeightOnlyGemmPlugin.from_field_data({**data, "residual_norm": np.asarray([1], np.int32)})
    with pytest.raises(PluginError, match="swiglu needs out_features"):
        WeightOnlyGemmPlugin(128, 24, 4, 64, swiglu=True)


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX ``prmt.b32`` (default mode): result byte i is byte ``(sel >> 4 i) & 7`` of b:a."""
    src = a | (b << 32)
    return sum(((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def _half_value(bits16: int, dtype: str) -> float:
    if dtype == "float16":
        return float(np.array([bits16], np.uint16).view(np.float16)[0])
    return float(np.array([bits16 << 16], np.uint32).view(np.float32)[0])  # bfloat16: float32's top half


def _v2_fragment(vec: np.ndarray, j: int, bits: int, dtype: str, fold: int) -> tuple[list[list[float]], list[float]]:
    """kernels/wq_gemm.cu ``a_fragment2`` with WQ_FOLD ``fold`` 1 or 2 (int8 bfloat16: its
    float32 PRMT path, which does not fold) for one lane's 4 words: the 4 registers' two values
    each, and the offset ``fold_off`` of each register's row half (registers 0, 2: rows gid;
    1, 3: gid + 8)."""
    w = [int(v) for v in vec]
    if bits == 4 and dtype == "float16" and fold == 1:
        regs = [((w[j] << 4) & 0x00F000F0) | 0x54005400, (w[j] & 0x00F000F0) | 0x54005400]
        regs += [((w[j] >> 4) & 0x00F000F0) | 0x54005400, ((w[j] >> 8) & 0x00F000F0) | 0x54005400]
        off = [64.0] * 4
    elif bits == 4 and dtype == "float16":
        t = w[j] >> 8
        regs = [(w[j] & 0x000F000F) | 0x64006400, (w[j] & 0x00F000F0) | 0x54005400, (t & 0x000F000F) | 0x64006400, (t & 0x00F000F0) | 0x54005400]
        off = [1024.0, 64.0, 1024.0, 64.0]
    elif bits == 4:
        regs = [((w[j] >> (4 * r)) & 0x000F000F) | 0x43004300 for r in range(4)]
        off = [128.0] * 4
    elif dtype == "float16":
        regs = [_prmt(w[2 * j + h], 0x64646464, sel) for h in range(2) for sel in (0x4140, 0x4342)]
        off = [1024.0] * 4
    else:
        f = [
            [float(np.array([_prmt(w[2 * j + h], 0x4B000000, 0x7440 + e)], np.uint32).view(np.float32)[0]) - 2.0**23 for e in range(4)]
            for h in range(2)
        ]
        return [[f[h][2 * p], f[h][2 * p + 1]] for h in range(2) for p in range(2)], [0.0] * 4
    return [[_half_value(r & 0xFFFF, dtype), _half_value(r >> 16, dtype)] for r in regs], off


@pytest.mark.parametrize(("bits", "dtype", "fold"), [(4, "float16", 1), (4, "float16", 2), (4, "bfloat16", 1), (8, "float16", 1), (8, "bfloat16", 1)])
def test_v2_fragments_hold_offset_plus_code(bits: int, dtype: str, fold: int, rng: np.random.Generator) -> None:
    """v2's LOP3 / PRMT decoding of every lane's words, each 16-bit half read as float16 /
    bfloat16 and placed by the PTX fragment table, is the block of codes plus the register's
    row-half offset, exactly (every code value occurs)."""
    n, k = 32, 512
    codes = (np.arange(n * k) % (1 << bits)).astype(np.uint8).reshape(n, k)
    codes = rng.permuted(codes, axis=1)
    words = pack_codes(codes, bits).view(np.uint32)
    c = chunk_codes(bits)
    for tile in range(words.shape[0]):
        for chunk in range(words.shape[1] // 128):
            vec = words[tile, chunk * 128 : (chunk + 1) * 128].reshape(32, 4)
            for j in range(c // 16):
                block = np.full((16, 16), -1.0)
                for lane in range(32):
                    vals, off = _v2_fragment(vec[lane], j, bits, dtype, fold)
                    for reg in range(4):
                        for e in range(2):
                            block[_a_fragment_table(lane, reg, e)] = vals[reg][e] - off[reg]
                k0 = chunk * c + 16 * j
                np.testing.assert_array_equal(block, codes[tile * 16 : tile * 16 + 16, k0 : k0 + 16])


V2_DEFINES = [
    {"DTYPE": d, "BITS": b, "HAS_ZEROS": z, "HAS_PERM": 0, "WQ_DECODE": 2, "ROW_TILES": rt, "WQ_FOLD": f, "SEG": seg}
    for d in (1, 2)
    for b in (4, 8)
    for z in (0, 1)
    for rt in (1, 2)
    for f in (0, 1)
    for seg in (1, 2)
]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_v2_variant_compiles(arch: str) -> None:
    """The v2 decode kernel (its default define sets are in the file's trtcore-variants) compiles
    for every dtype / bits / zero points / ROW_TILES / WQ_FOLD / SEG 1, 2, with UNROLL 1 and 3,
    SEG 4, L2_PF and L2_HINT too."""
    extra = [{**V2_DEFINES[0], "UNROLL": 1}, {**V2_DEFINES[-1], "UNROLL": 3}, {**V2_DEFINES[-1], "SEG": 4, "UNROLL": 1}]
    extra += [{**V2_DEFINES[5], "L2_PF": 2}, {**V2_DEFINES[-1], "L2_PF": 3, "L2_HINT": 2}, {**V2_DEFINES[9], "L2_HINT": 1}]
    extra += [{**v, "WQ_FOLD": 2} for v in V2_DEFINES if v["WQ_FOLD"] == 1 and v["SEG"] == 1 and v["ROW_TILES"] == 1 and v["HAS_ZEROS"] == 0]
    extra += [{**v, "NORM_X": 1, "CONTIG_X": 1} for v in V2_DEFINES[::3]]  # the norm folded in (norm_input; contiguous x)
    for v in V2_DEFINES + extra:
        c = kernels.compile_kernel("wq_gemm", defines=v, arch=arch)
        assert kernels.cubin_arch(c.cubin) == arch
        assert set(c.symbols) == {"trtcore_wq_gemv", "trtcore_wq_gemv16", "trtcore_wq_gemm", "trtcore_wq_dequantize", "trtcore_wq_gather_x", "trtcore_wq_swiglu", "trtcore_wq_add_norm", "trtcore_wq_rms_norm", "trtcore_wq_add_residual", "trtcore_wq_copy"}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_default_decode_defines_compile(arch: str) -> None:
    """DEFAULT_DECODE's define sets (what the plugin runs by default), for both dtypes and
    with and without zero points, compile with NVRTC (no GPU needed)."""
    kernels = pytest.importorskip("trtcore.kernels")

    for bits, extra in wog.DEFAULT_DECODE.items():
        for d in (1, 2):
            for z in (0, 1):
                c = kernels.compile_kernel("wq_gemm", defines={"DTYPE": d, "BITS": bits, "HAS_ZEROS": z, "HAS_PERM": 0, **extra}, arch=arch)
                assert "trtcore_wq_gemv" in c.symbols
    # and setup_cuda.py precompiles them (the file's trtcore-variants)
    listed = kernels.nvrtc.variants("wq_gemm")
    for bits, extra in wog.DEFAULT_DECODE.items():
        for d in (1, 2):
            for z in (0, 1):
                assert {"DTYPE": d, "BITS": bits, "HAS_ZEROS": z, "HAS_PERM": 0, **extra} in listed
    # DECODE_RULE's UNROLL 2 for 4-bit without zero points, in the contiguous-x order, plain and gated
    for d in (1, 2):
        for gated in ({}, {"GATED": 1}):
            assert {"DTYPE": d, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, **wog.DEFAULT_DECODE[4], "UNROLL": 2, **gated} in listed


def test_v2_is_chosen_only_where_it_applies(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """DECODE_VARIANT selects v2 for M <= 8 float16/bfloat16 without act order and with
    whole-chunk groups; empty, DEFAULT_DECODE does the same with the tuned defines and about
    4096 warps in all (4 per tile on 14336 rows, 16 on 4096: the H200 tune's best);
    {"WQ_DECODE": 1} selects v1 everywhere."""

    v2 = {"WQ_DECODE": 2, "ROW_TILES": 2, "WQ_FOLD": 1, "SEG": 2}
    g128, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 40, 1024, 4, 128, "none", False))
    g32, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 40, 1024, 4, 32, "none", False))
    perm, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 40, 1024, 8, 64, "int", True))
    chan, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 40, 1024, 8, 1024, "none", False))
    assert g128.decode_variant(BF16, 1) == {**wog.DEFAULT_DECODE[4], "WARPS": 16}  # 3 tiles: capped at 16
    assert chan.decode_variant(BF16, 1) == {**wog.DEFAULT_DECODE[8], "WARPS": 16}
    assert g128.decode_variant(BF16, 9) == {} and perm.decode_variant(BF16, 1) == {}
    gate_up, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 14336, 256, 4, 128, "none", False))
    down, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 4096, 1024, 4, 128, "none", False))
    assert gate_up.decode_variant(BF16, 1)["WARPS"] == 4 and down.decode_variant(BF16, 1)["WARPS"] == 16
    # DECODE_RULE: 4-bit without zero points takes UNROLL 2 at 4 warps or fewer (down keeps 1);
    # with zero points it keeps 1; a weight with more tiles than the warp target (the lm_head)
    # gets 2 warps a block, not 1
    assert gate_up.decode_variant(BF16, 1)["UNROLL"] == 2 and down.decode_variant(BF16, 1)["UNROLL"] == 1
    gate_up_z, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 14336, 256, 4, 128, "int", False))
    assert gate_up_z.decode_variant(BF16, 1)["UNROLL"] == 1
    head, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 16 * 4100, 256, 4, 128, "none", False))
    assert head.decode_warps(1, wog._V2_TARGET_WARPS) == 1 and head.decode_variant(BF16, 1) == {**wog.DEFAULT_DECODE[4], "WARPS": 2, "UNROLL": 2}
    monkeypatch.setattr(wog, "DECODE_RULE", {"min_warps": 1, "unroll2_max_warps": 0})  # the rule before
    assert head.decode_variant(BF16, 1) == {**wog.DEFAULT_DECODE[4], "WARPS": 1} and gate_up.decode_variant(BF16, 1)["UNROLL"] == 1
    monkeypatch.undo()
    monkeypatch.setattr(wog, "DECODE_VARIANT", {"WQ_DECODE": 1})
    assert g128.decode_variant(BF16, 1) == {} and chan.decode_variant(BF16, 1) == {}
    monkeypatch.setattr(wog, "DECODE_VARIANT", v2)
    assert g128.decode_variant(BF16, 1) == v2 and g128.decode_variant(np.float16, 8) == v2 and chan.decode_variant(BF16, 3) == v2
    assert g128.decode_variant(BF16, 9) == {} and g128.decode_variant(np.float32, 1) == {}
    assert g32.decode_variant(BF16, 1) == {} and perm.decode_variant(BF16, 1) == {}
    g64, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 40, 1024, 4, 64, "none", False))
    odd, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 40, 1056, 8, 1056, "none", False))  # 33 chunks
    assert g64.decode_variant(BF16, 1) == odd.decode_variant(BF16, 1) == {"WQ_DECODE": 2, "ROW_TILES": 2, "WQ_FOLD": 1}
    assert g128.decode_warps(2) == 16 and g128.decode_warps() == 16
    monkeypatch.setattr(wog, "DECODE_VARIANT", {**v2, "WARPS": 32})
    with pytest.raises(PluginError, match="WARPS"):
        g128.decode_variant(BF16, 1)


@pytest.mark.parametrize("seg, rt, zeros", [(2, 1, 0), (1, 2, 1), (2, 2, 1), (1, 1, 0)])
def test_async_slot_bytes_are_the_kernels(seg: int, rt: int, zeros: int) -> None:
    """ASYNC (the decode kernel's cp.async rings, sized by the launch's dynamic shared memory):
    the kernel compiles with ASLOT = async_slot_bytes and refuses any other (its static_assert
    on sizeof(AsyncSlot)), so the plugin's launch never sizes the rings wrong; ASYNC without
    ASLOT does not compile."""
    base = {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": zeros, "HAS_PERM": 0, "WQ_DECODE": 2, "ROW_TILES": rt, "SEG": seg, "ASYNC": 4}
    slot = wog.async_slot_bytes(seg, rt, bool(zeros))
    assert "trtcore_wq_gemv" in kernels.compile_kernel("wq_gemm", defines={**base, "ASLOT": slot}, arch="sm_90").symbols
    for wrong in (slot - 16, slot + 16):
        with pytest.raises(kernels.NVRTCError, match="ASLOT is not sizeof"):
            kernels.compile_kernel("wq_gemm", defines={**base, "ASLOT": wrong}, arch="sm_90")
    with pytest.raises(kernels.NVRTCError, match="ASYNC needs ASLOT"):
        kernels.compile_kernel("wq_gemm", defines=base, arch="sm_90")


def test_async_depth_fits_the_ring_memory() -> None:
    """async_depth: the requested depth, lowered to what 96 KiB holds for the block's rings
    (every sm_80+ GPU admits that much dynamic shared memory); 0 (the register path) below 2."""
    slot = wog.async_slot_bytes(2, 1, False)
    assert slot == 2 * 512 + 256  # two 512-byte chunk vectors of a warp, two float scales a lane
    assert wog.async_depth(6, 4, 2, 1, False) == 6
    assert wog.async_depth(64, 4, 2, 1, False) == 96 * 1024 // (4 * slot) == 19
    assert wog.async_depth(64, 16, 2, 1, False) == 4
    assert wog.async_depth(1, 4, 2, 1, False) == 0 and wog.async_depth(0, 4, 2, 1, False) == 0
    assert wog.async_depth(100, 1, 1, 1, False) == wog.MAX_ASYNC == 32  # 128 slots would fit one warp
    base = {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "WQ_DECODE": 2, "SEG": 1, "ASLOT": wog.async_slot_bytes(1, 1, False)}
    assert "trtcore_wq_gemv" in kernels.compile_kernel("wq_gemm", defines={**base, "ASYNC": 32}, arch="sm_90").symbols
    with pytest.raises(kernels.NVRTCError, match=r"ASYNC must be 0 or 2 \.\. 32"):
        kernels.compile_kernel("wq_gemm", defines={**base, "ASYNC": 33}, arch="sm_90")
    assert wog.async_depth(8, 16, 4, 2, True) == 0  # 16 rings of 4.5 KiB slots: not two each


def test_async_variant_sets_the_ring(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """DECODE_VARIANT with ASYNC: the plugin passes the slot size (ASLOT) and the warps it
    launches (WARPS, also where the warps are its own choice), lowers ASYNC to what fits, and
    runs the register path (no ASYNC key) where not even two slots fit."""
    g128, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 14336, 1024, 4, 128, "frac", False))
    v = {"WQ_DECODE": 2, "SEG": 2, "ASYNC": 64}
    monkeypatch.setattr(wog, "DECODE_VARIANT", {**v, "WARPS": 4})
    assert g128.decode_variant(BF16, 1) == {**v, "WARPS": 4, "ASLOT": 1536, "ASYNC": 16}  # 4 x 16 x 1536 bytes = 96 KiB
    monkeypatch.setattr(wog, "DECODE_VARIANT", dict(v))
    warps = g128.decode_warps()
    assert g128.decode_variant(BF16, 1) == {**v, "WARPS": warps, "ASLOT": 1536, "ASYNC": 96 * 1024 // (warps * 1536)}
    monkeypatch.setattr(wog, "DECODE_VARIANT", {**v, "SEG": 4, "ROW_TILES": 2, "WARPS": 16, "ASYNC": 2})
    # SEG 4 does not divide g128's 2 chunks (SEG 1): 16 rings of 2 KiB slots hold 3 each
    assert g128.decode_variant(BF16, 1) == {"WQ_DECODE": 2, "ROW_TILES": 2, "WARPS": 16, "ASYNC": 2, "ASLOT": 2048}
    monkeypatch.setattr(wog, "DECODE_VARIANT", {**v, "ROW_TILES": 2, "SEG": 2, "WARPS": 16, "ASYNC": 3})
    assert g128.decode_variant(BF16, 1)["ASYNC"] == 2  # 16 rings of 3 KiB slots: two each
    g256, _ = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, 64, 1024, 4, 256, "frac", False))
    monkeypatch.setattr(wog, "DECODE_VARIANT", {**v, "ROW_TILES": 2, "SEG": 4, "WARPS": 16, "ASYNC": 2})
    assert g256.decode_variant(BF16, 1) == {"WQ_DECODE": 2, "ROW_TILES": 2, "SEG": 4, "WARPS": 16}  # 5 KiB slots: one each
    # XPF (x a unit ahead) only with the rings and the contiguous-x order
    monkeypatch.setattr(wog, "DECODE_VARIANT", {**v, "ASYNC": 4, "XPF": 1, "WARPS": 4})
    assert g128.contiguous_x and g128.decode_variant(BF16, 1)["XPF"] == 1
    monkeypatch.setattr(wog, "DECODE_VARIANT", {**v, "ASYNC": 0, "XPF": 1, "WARPS": 4})
    assert "XPF" not in g128.decode_variant(BF16, 1)
    natural = WeightOnlyGemmPlugin(1024, 64, 4, 128, True, False, False)
    monkeypatch.setattr(wog, "DECODE_VARIANT", {**v, "ASYNC": 4, "XPF": 1, "WARPS": 4})
    assert "XPF" not in natural.decode_variant(BF16, 1) and natural.decode_variant(BF16, 1)["ASYNC"] == 4


def test_decode_variant_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setenv("TRTCORE_WQ_DECODE", '{"WQ_DECODE": 2, "SEG": 2, "WARPS": 8}')
    assert wog._variant_from_env() == {"WQ_DECODE": 2, "SEG": 2, "WARPS": 8}
    for bad in ("{", "[2]", '{"SEG": 1.5}'):
        monkeypatch.setenv("TRTCORE_WQ_DECODE", bad)
        with pytest.warns(UserWarning, match="ignored"):
            assert wog._variant_from_env() == {}
    monkeypatch.delenv("TRTCORE_WQ_DECODE")
    assert wog._variant_from_env() == {}


def test_bad_fields_and_inputs_are_refused(rng: np.random.Generator) -> None:
    with pytest.raises(PluginError, match="bits"):
        WeightOnlyGemmPlugin(64, 8, 3, 32)
    with pytest.raises(PluginError, match="in_features"):
        WeightOnlyGemmPlugin(60, 8, 4, 20)
    with pytest.raises(PluginError, match="group_size"):
        WeightOnlyGemmPlugin(64, 8, 4, 12)
    qw = random_qw(rng, 4, 64, 4, 32, "none", False)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    with pytest.raises(PluginError, match="in_features=64"):
        plugin.reference(np.zeros((1, 32), np.float16), *packed.arrays())
    with pytest.raises(PluginError, match="takes 3 inputs"):
        plugin.reference(np.zeros((1, 64), np.float16))
    odd = QuantizedWeight(np.zeros((2, 36), np.uint8), np.ones((2, 3), np.float32), None, 4, 12)
    with pytest.raises(PluginError, match=r"the group_size=12 must be a multiple of 8"):
        pack_weight(odd)
    per_channel = QuantizedWeight(np.zeros((2, 36), np.uint8), np.ones((2, 1), np.float32), None, 8, 36)  # one group: the row
    with pytest.raises(PluginError, match=r"the per-channel weight's K=36 must be a multiple of 8"):
        pack_weight(per_channel)


def test_fields_round_trip_through_the_reference_registry() -> None:
    plugin = WeightOnlyGemmPlugin(128, 24, 4, 64, has_zeros=True, has_perm=True)
    made = base.create(plugin, ref)
    assert made == plugin and WeightOnlyGemmPlugin in builtin_plugins()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_every_variant_compiles(arch: str) -> None:
    variants = kernels.variants("wq_gemm")
    assert {(v["DTYPE"], v["BITS"], v["HAS_ZEROS"], v["HAS_PERM"]) for v in variants} == {
        (d, b, z, p) for d in (1, 2) for b in (4, 8) for z in (0, 1) for p in (0, 1)
    }
    for v in variants:
        c = kernels.compile_kernel("wq_gemm", defines=v, arch=arch)
        assert kernels.cubin_arch(c.cubin) == arch
        assert set(c.symbols) == {"trtcore_wq_gemv", "trtcore_wq_gemv16", "trtcore_wq_gemm", "trtcore_wq_dequantize", "trtcore_wq_gather_x", "trtcore_wq_swiglu", "trtcore_wq_add_norm", "trtcore_wq_rms_norm", "trtcore_wq_add_residual", "trtcore_wq_copy"}


NET_CASES = [
    (48, 256, 4, 64, "frac", True),
    (32, 512, 4, 128, "int", False),
    (24, 128, 8, 0, "none", False),
    (16, 256, 8, 32, "int", True),
]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("impl", ["plugin", "dequantize"])
@pytest.mark.parametrize("case", NET_CASES, ids=str)
def test_network_on_the_reference_backend(case: tuple, impl: str, dtype: str, rng: np.random.Generator) -> None:
    qw = _qw(rng, case)
    n, k = qw.shape
    x = rng.standard_normal((2, 5, k)).astype(DTYPES[dtype])
    bias = rng.standard_normal(n).astype(np.float32)
    want = x.astype(np.float64) @ qw.dequantize().T + bias.astype(DTYPES[dtype]).astype(np.float64)
    net = OneOp(
        lambda g, i: ops.weight_only_linear(g, i["x"], qw, bias, name="mlp.down_proj", impl=impl), {"x": x}, dtype=dtype, dynamic={"x": (0, 1)}
    )
    got = net.run()["out"]
    assert got.dtype == x.dtype
    # plugin: the GEMM's rounding and the bias add's; dequantize: the scales and weights
    # rounded to x's dtype (2), the matmul, the zero-point term and the sums (3 more)
    assert_close(got, want, dtype, 2 if impl == "plugin" else 5 + np.sqrt(k) / 4, atol_scale=float(np.abs(want).max()))
    if impl == "dequantize" and dtype == "float16":
        [(_, shape, _)] = net.check_rtx()
        assert shape == (-1, -1, n)


@pytest.mark.skipif(not HAS_RTX, reason="tensorrt_rtx is not installed")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(
    "case",
    [(64, 512, 4, 32, "none", False), (64, 512, 4, 128, "int", True), (48, 256, 8, 0, "none", False), (48, 256, 8, 64, "frac", False)],
    ids=str,
)
def test_rtx_builds_the_dequantize_alternative(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    qw = _qw(rng, case)
    x = rng.standard_normal((3, qw.shape[1])).astype(DTYPES[dtype])
    net = OneOp(lambda g, i: ops.weight_only_linear(g, i["x"], qw, name="q_proj", impl="dequantize"), {"x": x}, dtype=dtype, dynamic={"x": (0,)})
    [(_, shape, dt)] = net.check_rtx()
    assert shape == (-1, qw.shape[0]) and dt == {"float16": "HALF", "bfloat16": "BF16"}[dtype]


def test_unknown_implementation_is_refused(rng: np.random.Generator) -> None:
    from trtcore.errors import InvalidArgumentError

    qw = random_qw(rng, 8, 64, 4, 32, "none", False)
    net = OneOp(lambda g, i: ops.weight_only_linear(g, i["x"], qw, impl="marlin"), {"x": np.zeros((1, 64), np.float16)}, dtype="float16")
    with pytest.raises(InvalidArgumentError, match="'marlin'"):
        net.run()


def test_network_with_the_plugin_compiles_on_the_cuda_backend(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host only: the cuda backend plans the plugin like any other (workspace included); with
    the default PREFILL_KERNEL (pinned: TRTCORE_WQ_PREFILL may be set) 17 rows take the tiled kernel."""
    from trtcore.plugins import weight_only_gemm as wog

    monkeypatch.setattr(wog, "PREFILL_KERNEL", "tiled")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "cuda"))
    from netutil import compile_net, network

    import trtcore.cuda as tc

    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    qw = random_qw(rng, 256, 2048, 4, 128, "int", False)  # 16 tiles of 16 rows: 16 warps per tile
    x = net.add_input("x", tc.DataType.BF16, (-1, 2048))
    g.output(ops.weight_only_linear(g, x, qw, name="o_proj"), "y")
    plan = compile_net(net, {"x": ((1, 2048), (4, 2048), (64, 2048))})
    assert any(node.op == "plugin" for node in plan.graph.nodes)
    plugin = WeightOnlyGemmPlugin.from_quantized(qw)[0]
    assert plugin.decode_warps() == 16 and plugin.uses_tensor_cores(BF16, 16) and not plugin.uses_tensor_cores(BF16, 17)
    assert not plugin.uses_tensor_cores(np.dtype(np.float32), 1)
    assert plugin.workspace_size([((64, 2048), BF16)], [((64, 256), BF16)]) == 0


def test_reference_dequantizes_once_per_constants(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference backend passes the same constant arrays on every call: the dequantized
    weight is made once for them (Plugin.from_constants), again for other arrays (even equal
    ones), and stays out of a pickled plugin; the results are the float64 product each time."""
    import pickle

    qw = random_qw(rng, 24, 128, 4, 64, "int", False)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    made = []
    real = WeightOnlyGemmPlugin.quantized_weight
    monkeypatch.setattr(WeightOnlyGemmPlugin, "quantized_weight", lambda self, *c: made.append(1) or real(self, *c))
    arrays = packed.arrays()
    for _ in range(3):
        x = rng.standard_normal((2, 128)).astype(np.float16)
        (got,) = plugin.reference(x, *arrays)
        np.testing.assert_allclose(got.astype(np.float64), x.astype(np.float64) @ qw.dequantize().T, rtol=UNIT["float16"], atol=1e-30)
    assert len(made) == 1
    plugin.reference(x, *[a.copy() for a in arrays])
    assert len(made) == 2
    clone = pickle.loads(pickle.dumps(plugin))
    assert clone == plugin and "_from_constants" not in clone.__dict__


@pytest.mark.parametrize(
    ("m", "offset", "align", "dtype", "prefill"),
    [
        (1, 2, 4, BF16, "tiled"),
        (12, 6, 4, BF16, "tiled"),
        (17, 8, 16, BF16, "tiled"),
        (64, 4, 16, BF16, "tiled"),
        (17, 2, 4, BF16, "tensor_cores"),
        (4096, 6, 4, BF16, "tensor_cores"),
        (3, 8, 16, np.dtype(np.float32), "tensor_cores"),
    ],
    ids=str,
)
def test_misaligned_x_is_refused_before_a_launch(
    m: int, offset: int, align: int, dtype: np.dtype, prefill: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An x address the kernel's loads cannot take (the tensor-core kernels: 4-byte loads, M up
    to 16 or any M with PREFILL_KERNEL "tensor_cores"; the tiled kernel, float32 x or more rows:
    16-byte ones) is a PluginError naming it, raised before any launch (no GPU needed): a
    launch would fault and take the CUDA context with it."""
    from trtcore.plugins import weight_only_gemm as wog
    from trtcore.plugins.base import DeviceTensor

    monkeypatch.setattr(wog, "PREFILL_KERNEL", prefill)
    qw = random_qw(rng, 32, 128, 4, 64, "none", False)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    ins = [DeviceTensor(0x10000 + offset, (m, 128), dtype)] + [DeviceTensor(0x20000, a.shape, a.dtype) for a in packed.arrays()]
    with pytest.raises(PluginError, match=rf"x at address 0x{0x10000 + offset:x} is not {align}-byte aligned, as the kernel for M={m} needs"):
        plugin.enqueue(ins, [DeviceTensor(0x30000, (m, 32), dtype)], 0, 0)


@pytest.mark.parametrize(
    ("n", "k", "perm", "block_bytes", "rows"),
    [(300, 128, False, 1, 128), (300, 128, True, 1, 128), (4096, 4096, False, 32 << 20, 4096), (4096, 14336, False, 32 << 20, 1152)],
    ids=str,
)
def test_cublas_prefill_dequantizes_w_block_by_block(
    n: int, k: int, perm: bool, block_bytes: int, rows: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``"cublas"`` prefill (no GPU needed: launches and matmuls recorded): act order gathers
    x into the workspace's second part first; then for each block of ``block_rows`` rows
    (``DEQUANT_BLOCK_BYTES`` / 2K rounded down to 128 rows, at least 128: 4096 rows of K = 4096
    and 1152 of K = 14336 in 32 MiB) one dequantize launch writes the block at the workspace's
    start and one cuBLASLt matmul computes y's columns ``n0 ..`` (rows N apart) from it and
    x (or the gathered x), in that order, covering N once; the workspace holds the block, the
    gathered x and cuBLASLt's part. At most 16 rows, float32 x, or no workspace: no matmul."""
    from trtcore.cuda import cublaslt
    from trtcore.plugins.base import DeviceTensor
    from trtcore.plugins.fp8_gemm import LT_WORKSPACE

    monkeypatch.setattr(wog, "PREFILL_KERNEL", "cublas")
    monkeypatch.setattr(wog, "DEQUANT_BLOCK_BYTES", block_bytes)
    events: list[tuple] = []
    monkeypatch.setattr(wog, "_launch", lambda defines, name, grid, block, args, stream, **kw: events.append(("launch", name, grid, args)))

    class Linear:
        def matmul(self, m: int, nn: int, kk: int, w: int, x: int, d: int, out_type: int, ws: int, ws_size: int, stream: int, ldd: int = 0) -> None:
            events.append(("matmul", m, nn, kk, w, x, d, out_type, ws, ws_size, ldd))

    monkeypatch.setattr(cublaslt, "thread_linear", lambda in_type: Linear())
    gs = 64
    qw = random_qw(rng, n, k, 4, gs, "int", perm)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    assert plugin.block_rows() == rows
    m, ws, x_ptr, y_ptr = 40, 0x100000, 0x2000, 0x800000
    assert wog.CUBLAS_MIN_M <= m
    size = plugin.workspace_size([((2, 20, k), BF16)] + [(a.shape, a.dtype) for a in packed.arrays()], [((2, 20, n), BF16)])
    block = -(-2 * rows * k // 256) * 256
    gathered = -(-2 * m * k // 256) * 256 if perm else 0
    assert size == block + gathered + LT_WORKSPACE
    ins = [DeviceTensor(x_ptr, (2, 20, k), BF16)] + [DeviceTensor(0x10000 * (i + 1), a.shape, a.dtype) for i, a in enumerate(packed.arrays())]
    plugin.enqueue(ins, [DeviceTensor(y_ptr, (2, 20, n), BF16)], ws, 7)
    if perm:
        kind, name, grid, args = events.pop(0)
        assert name == "trtcore_wq_gather_x" and args[0][0] == x_ptr and args[1][0] == ins[4].ptr and args[2][0] == ws + block
        assert [a[0] for a in args[3:]] == [m, k] and grid[0] * 256 * 8 >= m * k
    a_in = ws + block if perm else x_ptr
    covered = 0
    for i in range(0, len(events), 2):
        (_, name, grid, args), mm = events[i], events[i + 1]
        n0, r = args[4][0], args[5][0]
        assert name == "trtcore_wq_dequantize" and [a[0] for a in args[:4]] == [ins[1].ptr, ins[2].ptr, ins[3].ptr, ws]
        assert n0 == covered and r == min(rows, n - n0) and [a[0] for a in args[6:]] == [k, gs]
        assert grid[0] == -(-(-(-r // 16) * (k // 64) * 32) // 256), "a thread per 16-byte vector (64 int4 codes of a tile row)"
        assert mm == ("matmul", m, r, k, ws, a_in, y_ptr + 2 * n0, 14, ws + block + gathered, LT_WORKSPACE, n)
        covered += r
    assert covered == n
    for m_small, dtype, workspace in ((16, BF16, ws), (wog.CUBLAS_MIN_M - 1, BF16, ws), (40, np.dtype(np.float32), ws), (40, BF16, 0)):
        events.clear()
        x = DeviceTensor(x_ptr, (m_small, k), dtype)
        plugin.enqueue([x, *ins[1:]], [DeviceTensor(y_ptr, (m_small, n), dtype)], workspace, 7)
        assert [e[1] for e in events] == [("trtcore_wq_gemv16" if dtype == BF16 else "trtcore_wq_gemm")]
    assert plugin.workspace_size([((wog.CUBLAS_MIN_M - 1, k), BF16)], [((16, n), BF16)]) == 0
    assert plugin.workspace_size([((40, k), np.dtype(np.float32))], [((40, n), np.dtype(np.float32))]) == 0


def test_default_dequantize_blocks_and_the_cublas_rows() -> None:
    """The default block (256 MiB of bfloat16 weights): a Llama-3-8B decoder linear in one
    block (gate+up fused 28672 x 4096, down 4096 x 14336), a 128,256-token lm_head in blocks of
    32,768 rows. From CUBLAS_MIN_M rows the "cublas" prefill runs; below it the 16-row kernel,
    except for group sizes the tensor cores do not take (group 8), which take cuBLAS above 16
    rows; float32 x never does."""
    assert WeightOnlyGemmPlugin(4096, 28672, 4, 128).block_rows() == 28672
    assert WeightOnlyGemmPlugin(14336, 4096, 4, 128).block_rows() == 4096
    assert WeightOnlyGemmPlugin(4096, 128256, 4, 128).block_rows() == 32768
    assert WeightOnlyGemmPlugin(1 << 20, 4096, 8, 1 << 20).block_rows() == 128, "at least 128 rows"
    g128, g8 = WeightOnlyGemmPlugin(4096, 256, 4, 128), WeightOnlyGemmPlugin(520, 64, 8, 8)
    lo = wog.CUBLAS_MIN_M
    assert [g128.prefill_on_cublas(BF16, m) for m in (16, 17, lo - 1, lo)] == [False, False, False, True]
    assert [g128.uses_tensor_cores(BF16, m) for m in (16, 17, lo - 1, lo)] == [True, True, True, False]
    assert [g8.prefill_on_cublas(np.float16, m) for m in (16, 17, lo)] == [False, True, True]
    assert not g128.prefill_on_cublas(np.float32, 4096)


@pytest.mark.parametrize(("bits", "inter", "k"), [(4, 32, 128), (4, 48, 256), (8, 16, 96), (8, 64, 64)], ids=str)
def test_swiglu_order_moves_half_tiles_as_packing_the_permuted_rows_does(bits: int, inter: int, k: int, rng: np.random.Generator) -> None:
    """A SwiGLU plugin's weight: rows 16 t .. 16 t + 7 are gate rows 8 t .., rows 16 t + 8 ..
    the up rows of the same features (a formula written here, not the module's); the packed
    codes made by moving half tiles equal packing the permuted rows, and the plugin's constant
    inputs are the permuted weight exactly (scales and zero points too)."""
    n = 2 * inter
    want_order = [(16 * t + p, 8 * t + p if p < 8 else inter + 8 * t + p - 8) for t in range(n // 16) for p in range(16)]
    assert [(r, int(src)) for r, src in enumerate(wog.swiglu_order(n))] == want_order
    codes = rng.integers(0, 1 << bits, (n, k), dtype=np.uint8)
    np.testing.assert_array_equal(wog._swiglu_codes(wog.pack_codes(codes, bits), bits), wog.pack_codes(codes[wog.swiglu_order(n)], bits))
    qw = random_qw(rng, n, k, bits, 32, "int", False)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    made = plugin.with_swiglu(packed.arrays())
    assert made is not None
    fused, arrays = made
    assert fused.swiglu and fused.output_features == inter and fused.with_swiglu(arrays) is None and fused.row_fusion_key(arrays) is None
    back = fused.quantized_weight(*arrays)
    order = [src for _, src in want_order]
    np.testing.assert_array_equal(back.codes, qw.codes[order])
    np.testing.assert_array_equal(back.scales, qw.scales[order])
    np.testing.assert_array_equal(back.zeros, qw.zeros[order])
    assert WeightOnlyGemmPlugin(k, 24, bits, 32).with_swiglu([]) is None, "I = 12 is not a multiple of 8"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_swiglu_reference_is_silu_of_gate_times_up_with_each_layers_rounding(dtype: str, rng: np.random.Generator) -> None:
    """The SwiGLU plugin's reference: the GEMM rounded to x's dtype, then silu(g) = g * sigmoid(g)
    and the product, each rounded to the dtype, from gate feature j at column 16 (j // 8) + j % 8
    and its up 8 columns on (the GEMM in float64; the pointwise layers in float32, as the
    reference backend and the generated kernels compute them, each rounding where a layer writes
    its output). The stacked weight here is the plain [gate; up] one, not the plugin's order."""
    dt = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    inter, k = 24, 64
    qw = random_qw(rng, 2 * inter, k, 4, 32, "none", False)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    fused, arrays = plugin.with_swiglu(packed.arrays())  # type: ignore[misc]
    x = rng.standard_normal((3, k)).astype(dt)
    f32 = np.float32
    y = (x.astype(np.float64) @ qw.dequantize().T).astype(dt).astype(f32)  # [gate; up] rows
    g, u = y[:, :inter], y[:, inter:]
    s = (f32(1) / (f32(1) + np.exp(-g))).astype(dt).astype(f32)
    want = ((g * s).astype(dt).astype(f32) * u).astype(dt)
    got = fused.reference(x, *arrays)[0]
    assert got.shape == (3, inter) and got.dtype == dt
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
    assert fused.output_shapes([[3, k]] + [list(a.shape) for a in arrays])[0][-1].value == inter


def test_swiglu_plugin_launches_the_epilogue_or_stages_its_output(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU needed (launches and matmuls recorded): the tensor-core kernels run with GATED 1
    and write the output; the "cublas" prefill and the tiled kernel (float32 x) write the GEMM
    output into the workspace's first m x N elements, then trtcore_wq_swiglu writes the output
    from it; the workspace holds that staging before the cuBLAS part; a staged path without a
    workspace is refused."""
    from trtcore.cuda import cublaslt
    from trtcore.plugins.base import DeviceTensor

    monkeypatch.setattr(wog, "PREFILL_KERNEL", "cublas")
    events: list[tuple] = []
    monkeypatch.setattr(wog, "_launch", lambda defines, name, grid, block, args, stream, **kw: events.append((dict(defines), name, grid, args)))

    class Linear:
        def matmul(self, m: int, nn: int, kk: int, w: int, x: int, d: int, *rest: Any, ldd: int = 0) -> None:
            events.append(({}, "matmul", (), [(d, "ptr"), (ldd, "i32")]))

    monkeypatch.setattr(cublaslt, "thread_linear", lambda in_type: Linear())
    n, k, inter = 256, 128, 128
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(random_qw(rng, n, k, 4, 64, "none", False))
    fused, arrays = plugin.with_swiglu(packed.arrays())  # type: ignore[misc]
    ins = [DeviceTensor(0x10000 * (i + 1), a.shape, a.dtype) for i, a in enumerate(arrays)]
    ws, x_ptr, out_ptr = 0x1000000, 0x2000, 0x800000
    for m, dtype in ((1, BF16), (20, BF16)):
        events.clear()
        fused.enqueue([DeviceTensor(x_ptr, (m, k), dtype), *ins], [DeviceTensor(out_ptr, (m, inter), dtype)], ws, 0)
        [(defines, name, grid, args)] = events
        assert name == ("trtcore_wq_gemv" if m == 1 else "trtcore_wq_gemv16") and defines["GATED"] == 1 and args[5][0] == out_ptr
        assert grid[0] == n // 16 and fused.workspace_size([((m, k), dtype)], [((m, inter), dtype)]) == 0
    m = 64
    staged = -(-m * n * 2 // 256) * 256
    assert fused.workspace_size([((m, k), BF16)], [((m, inter), BF16)]) == staged + plugin.workspace_size([((m, k), BF16)], [((m, n), BF16)])
    events.clear()
    fused.enqueue([DeviceTensor(x_ptr, (m, k), BF16), *ins], [DeviceTensor(out_ptr, (m, inter), BF16)], ws, 0)
    assert [e[1] for e in events] == ["trtcore_wq_dequantize", "matmul", "trtcore_wq_swiglu"]
    assert events[0][3][3][0] == ws + staged, "the dequantized block after the staging"
    assert events[1][3] == [(ws, "ptr"), (n, "i32")], "the GEMM writes the staging, rows N apart"
    assert [a[0] for a in events[2][3]] == [ws, out_ptr, m, inter] and "GATED" not in events[2][0]
    f32 = np.dtype(np.float32)
    events.clear()
    assert fused.workspace_size([((3, k), f32)], [((3, inter), f32)]) == 3 * n * 4 + (-(3 * n * 4) % 256)
    fused.enqueue([DeviceTensor(x_ptr, (3, k), f32), *ins], [DeviceTensor(out_ptr, (3, inter), f32)], ws, 0)
    assert [e[1] for e in events] == ["trtcore_wq_gemm", "trtcore_wq_swiglu"] and events[0][3][5][0] == ws
    with pytest.raises(PluginError, match="stage the GEMM output in a workspace; none was given"):
        fused.enqueue([DeviceTensor(x_ptr, (3, k), f32), *ins], [DeviceTensor(out_ptr, (3, inter), f32)], 0, 0)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_swiglu_epilogue_compiles_in_every_decode_kernel(arch: str) -> None:
    """GATED with v1 (gemv / gemv16), the default v2, two row tiles, and the cp.async rings with
    two row tiles and with XPF, for both 16-bit dtypes (no GPU needed)."""
    variants = [{}, wog.DEFAULT_DECODE[4], {"WQ_DECODE": 2, "ROW_TILES": 2, "WQ_FOLD": 1, "SEG": 2}]
    variants += [{"WQ_DECODE": 2, "ROW_TILES": 2, "SEG": 1, "ASYNC": 3, "ASLOT": wog.async_slot_bytes(1, 2, True)}]
    variants += [{"WQ_DECODE": 2, "WQ_FOLD": 1, "SEG": 2, "ASYNC": 4, "XPF": 1, "ASLOT": wog.async_slot_bytes(2, 1, True)}]
    for d in (1, 2):
        for v in variants:
            c = kernels.compile_kernel("wq_gemm", defines={"DTYPE": d, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "GATED": 1, **v}, arch=arch)
            assert {"trtcore_wq_gemv", "trtcore_wq_gemv16", "trtcore_wq_swiglu"} <= set(c.symbols)


@pytest.mark.parametrize("bits", [4, 8])
def test_contiguous_x_packing_equals_packing_the_gathered_columns(bits: int, rng: np.random.Generator) -> None:
    """``pack_codes(contiguous_x=True)`` (the order as axes of the layout's transpose) equals
    packing the columns gathered into :func:`contiguous_x_order`, on N with a partial tile; a K
    that is not whole chunks is refused."""
    c = wog.chunk_codes(bits)
    codes = rng.integers(0, 1 << bits, (40, 3 * c), dtype=np.uint8)
    np.testing.assert_array_equal(pack_codes(codes, bits, contiguous_x=True), pack_codes(codes[:, contiguous_x_order(3 * c, bits)], bits))
    with pytest.raises(PluginError, match=f"K must be a multiple of {c}"):
        pack_codes(codes[:, : c + 8], bits, contiguous_x=True)
