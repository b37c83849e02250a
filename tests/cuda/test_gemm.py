"""cuBLAS call planning (CPU): the column-major calls :func:`plan_gemm` derives, run by a
NumPy emulation of cuBLAS's semantics, equal ``numpy.matmul`` in float64 for random shapes,
transposes, broadcast batch dimensions and strided (transposed or sliced) operands."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trtcore.cuda.gemm import emulate, plan_gemm


def _strided(rng: np.random.Generator, shape: tuple[int, ...], layout: str) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """A random array of ``shape`` inside a flat memory, with strides for ``layout``: dense,
    'swapped' (the last two axes stored transposed) or 'padded' (rows longer than needed)."""
    if layout == "swapped" and len(shape) >= 2:
        store = shape[:-2] + (shape[-1], shape[-2])
        mem = rng.standard_normal(int(np.prod(store)))
        full = mem.reshape(store)
        arr = np.swapaxes(full, -1, -2)
    elif layout == "padded":
        store = shape[:-1] + (shape[-1] + 3,)
        mem = rng.standard_normal(int(np.prod(store)))
        arr = mem.reshape(store)[..., : shape[-1]]
    else:
        mem = rng.standard_normal(int(np.prod(shape)))
        arr = mem.reshape(shape)
    strides = tuple(s // 8 for s in arr.strides)
    return mem, arr, strides


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4), st.integers(1, 5), st.integers(1, 5),
    st.lists(st.integers(1, 3), min_size=0, max_size=3), st.data(),
)
def test_planned_calls_equal_matmul(m: int, k: int, n: int, batch: list[int], data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    ta, tb = data.draw(st.booleans()), data.draw(st.booleans())
    a_batch = [d if data.draw(st.booleans()) else 1 for d in batch]
    b_batch = [d if data.draw(st.booleans()) else 1 for d in batch]
    a_shape = tuple(a_batch) + ((k, m) if ta else (m, k))
    b_shape = tuple(b_batch) + ((n, k) if tb else (k, n))
    mem_a, a, sa = _strided(rng, a_shape, data.draw(st.sampled_from(["dense", "swapped", "padded"])))
    mem_b, b, sb = _strided(rng, b_shape, data.draw(st.sampled_from(["dense", "swapped", "padded"])))
    calls = plan_gemm(a_shape, sa, b_shape, sb, ta, tb)
    if calls is None:  # only operands with no unit stride; the builder copies those
        return
    ref = np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b)
    out = np.full(ref.size, np.nan)
    for call in calls:
        emulate(call, mem_b, mem_a, out)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-12, atol=1e-12)


def test_grouped_query_attention_folds_into_m() -> None:
    """[B, Hkv, G, S, D] @ [B, Hkv, 1, T, D]^T: one batched call over B*Hkv with M = G*S."""
    B, H, G, S, D, T = 2, 3, 4, 5, 8, 7
    calls = plan_gemm((B, H, G, S, D), (H * G * S * D, G * S * D, S * D, D, 1), (B, H, 1, T, D), (H * T * D, T * D, T * D, D, 1), False, True)
    assert calls is not None and len(calls) == 1
    assert calls[0].batch == B * H and calls[0].n == G * S and calls[0].m == T


@pytest.mark.parametrize("rows", [1, 4])
def test_decode_row_times_transposed_weight(rows: int) -> None:
    calls = plan_gemm((rows, 64), (64, 1), (64, 32), (1, 64), False, False)
    assert calls is not None and len(calls) == 1 and calls[0].batch == 1
