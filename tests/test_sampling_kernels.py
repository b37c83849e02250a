"""The GPU sampler's pieces that need no GPU: the Philox4x32-10 reference against the
published known-answer vectors, the NVRTC compile of kernels/sampling.cu for sm_80, sm_89
and sm_90, and the host mirror of the kernel's parameter struct.

Known-answer vectors: Random123's ``examples/kat_vectors`` (D. E. Shaw Research; the paper
is Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3", SC11 2011),
the three ``philox4x32 10`` lines: counter (4 words), key (2 words) -> output (4 words).
"""

from __future__ import annotations

import numpy as np
import pytest

from trtcore import kernels
from trtcore.runtime.sampling import philox4x32, philox_uniform
from trtcore.runtime.sampling_gpu import ROW_PARAMS_DTYPE, ROW_RESULT_DTYPE, row_params_dtype

KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0), (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize(("counter", "key", "want"), KAT)
def test_philox4x32_10_known_answers(counter, key, want) -> None:
    assert philox4x32(np.array(counter), np.array(key)).tolist() == list(want)


def test_philox_vectorized_equals_scalar_and_uniform_bits() -> None:
    counters = np.array([c for c, _, _ in KAT])
    keys = np.array([k for _, k, _ in KAT])
    assert philox4x32(counters, keys).tolist() == [list(w) for _, _, w in KAT]
    # u = ((r1 << 32 | r0) >> 11) * 2**-53 with counter (step, 0, 0, 0) and key (seed lo, seed hi)
    r = philox4x32(np.array([0, 0, 0, 0]), np.array([0, 0])).astype(np.uint64)
    assert philox_uniform(0, 0) == float(((int(r[1]) << 32 | int(r[0])) >> 11) * 2.0**-53)
    seed, step = 0x0123456789ABCDEF, 2**40 + 7
    r = philox4x32(np.array([step & 0xFFFFFFFF, step >> 32, 0, 0]), np.array([seed & 0xFFFFFFFF, seed >> 32])).astype(np.uint64)
    assert philox_uniform(seed, step) == float(((int(r[1]) << 32 | int(r[0])) >> 11) * 2.0**-53)


def test_philox_uniforms_are_uniform_and_distinct_per_seed() -> None:
    u = philox_uniform(7, np.arange(200_000, dtype=np.uint64))
    assert u.min() >= 0.0 and u.max() < 1.0
    hist = np.bincount((u * 20).astype(int), minlength=20) / u.size
    assert np.abs(hist - 0.05).max() < 0.003
    v = philox_uniform(8, np.arange(1000, dtype=np.uint64))
    assert not np.array_equal(u[:1000], v) and abs(np.corrcoef(u[:1000], v)[0, 1]) < 0.1


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_sampling_kernels_compile_for_every_arch(arch: str) -> None:
    want = {"sampling_step", "sampling_clear_slot", "sampling_fill_slot", "sampling_layout", "sampling_philox"}
    for v in kernels.variants("sampling"):
        ck = kernels.compile_kernel("sampling", defines=v, arch=arch)
        assert kernels.cubin_arch(ck.cubin) == arch and want <= set(ck.symbols), (arch, v)
    # what GpuSampler compiles: every define it sets
    ck = kernels.compile_kernel("sampling", defines={"DTYPE": 2, "MAX_LOGPROBS": 5, "MAX_BANNED": 4, "BLOCK": 1024}, arch=arch)
    assert "sampling_step" in ck.symbols


def test_host_struct_mirrors_the_c_layout() -> None:
    # C rules by hand: six doubles and two uint64 (0..56), six int32 (64..84), int32[32] at 88
    names = ["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "step"]
    assert [ROW_PARAMS_DTYPE.fields[n][1] for n in names] == list(range(0, 64, 8))
    ints = ["top_k", "slot", "flags", "num_logprobs", "num_banned", "reserved"]
    assert [ROW_PARAMS_DTYPE.fields[n][1] for n in ints] == list(range(64, 88, 4))
    assert ROW_PARAMS_DTYPE.fields["banned"][1] == 88 and ROW_PARAMS_DTYPE.itemsize == 88 + 4 * 32
    assert row_params_dtype(3).itemsize == 104  # 88 + 12, padded to the 8-byte alignment
    assert ROW_RESULT_DTYPE.itemsize == 16 and [ROW_RESULT_DTYPE.fields[n][1] for n in ("token", "status", "logprob", "rank")] == [0, 4, 8, 12]
