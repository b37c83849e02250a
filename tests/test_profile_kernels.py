"""bench/profile_kernels.py's exclusive kernel times (CPU): spans that overlap under
programmatic dependent launch are split into parts that partition the GPU's busy time."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = str(Path(__file__).parents[1] / "bench")
if BENCH not in sys.path:
    sys.path.append(BENCH)

from profile_kernels import exclusive_times, kind, summarize  # noqa: E402


def test_pdl_wait_is_charged_to_the_predecessor() -> None:
    # a GEMM 0-10 us; the norm launched early at 2 us waits, runs to 13; the next GEMM launched
    # at 12 runs to 20; a kernel wholly inside an earlier span gets nothing
    spans = [("gemm", 0.0, 10.0), ("k_row_1", 2.0, 13.0), ("gemm", 12.0, 20.0), ("inner", 14.0, 15.0)]
    ex = exclusive_times(spans)
    assert ex["gemm"] == pytest.approx([0.010, 0.007])
    assert ex["k_row_1"] == pytest.approx([0.003])
    assert ex["inner"] == [0.0]


def test_exclusive_times_partition_the_busy_time() -> None:
    rng = np.random.default_rng()
    starts = np.sort(rng.uniform(0, 1000, size=200))
    spans = [(f"k{i % 7}", float(s), float(s + d)) for i, (s, d) in enumerate(zip(starts, rng.uniform(0.5, 30, size=200)))]
    # the union of the intervals, computed independently: sweep over the sorted end points
    union, cur_s, cur_e = 0.0, None, None
    for _, s, e in sorted(spans, key=lambda x: x[1]):
        if cur_e is None or s > cur_e:
            union += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    union += cur_e - cur_s
    ex = exclusive_times(list(reversed(spans)))  # any order in
    assert sum(sum(v) for v in ex.values()) == pytest.approx(union / 1e3)
    assert all(t >= 0 for v in ex.values() for t in v)
    assert sum(len(v) for v in ex.values()) == len(spans)


def test_summarize_groups_by_kind() -> None:
    total, kinds, top = summarize({"k_row_ab": [1.0, 2.0], "paged_attn_decode": [4.0]}, {"k_row_ab": [0.5, 1.0], "paged_attn_decode": [3.0]})
    assert total == 7.0
    assert kind("k_row_ab") == "norm / row groups"
    assert kinds["norm / row groups"]["exclusive_ms"] == 1.5 and kinds["attention"]["launches"] == 1
    assert top[0]["name"] == "paged_attn_decode" and top[0]["exclusive_ms"] == 3.0


@pytest.mark.parametrize(
    ("name", "want"),
    [
        # generated kernels' hex hashes may spell "f8": the SwiGLU kernel of the 8B throughput run
        # was counted as an FP8 GEMM (bench/results/h200-2026-12-03-session11)
        ("k_pointwise_65f837868d07836b", "pointwise / other generated"),
        ("k_pointwise_501c060f8c65d31f", "pointwise / other generated"),
        ("k_row_f8e27cf7d18de850", "norm / row groups"),
        ("k_gemv_prologue_f8a0c3e1d2b49f71", "gemv (generated)"),
        ("k_gather_BF16_INT32_0_1_1", "pointwise / other generated"),
        ("nvjet_sm90_qqtst_128x64_128x8_1x2_h_bx_algo2_TNT", "gemm fp8 (cuBLASLt)"),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "gemm (cuBLAS/cuBLASLt)"),
        ("trtcore_fp8_quantize", "fp8 quantize / scales"),
    ],
)
def test_kernel_kinds_by_name(name: str, want: str) -> None:
    assert kind(name) == want
