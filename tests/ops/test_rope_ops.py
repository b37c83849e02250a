"""RoPE ops against transformers' rotary modules evaluated in float64: ``rope_cos_sin``,
``apply_rope`` and ``rotary`` (both implementations: composed layers, and ``rope_plugin``
on the reference backend) for the default, linear, llama3, YaRN, dynamic NTK and LongRoPE
scalings and partial rotary (transformers' GPT-NeoX classes, which rotate the first ``rotary_dim``
features), head_dim 128, GQA variants, ``[batch, seq]`` and packed ``[tokens]`` positions.

transformers' modules and configurations come from tests/test_rope_plugin.py (its
``hf_float64`` runs them in float64). Dynamic scaling: trtcore gives each sequence (row, or
packed sequence via ``seq_lens``) its own length, as one transformers forward call per
sequence does; transformers is run per sequence. So is LongRoPE (short factors for a
sequence of at most ``original_max_position_embeddings`` = 16 tokens, long ones beyond).

Tolerances: the ops compute the angle ``position * inv_freq`` in float32 (``inv_freq`` rounded
to float32, one rounding of the product: ``|d angle| <= 2 u32 * angle``), then float32
cos/sin, so cos/sin are within ``(2 * max_angle + 64) * u32`` (times YaRN's attention
factor) of transformers' float64 values; positions stay below 64 here, so that is ~1e-5.
``apply_rope`` rounds cos/sin to the graph dtype (as transformers' ``cos.to(x.dtype)``),
then ``x * cos``, ``rotate_half(x) * sin`` and their sum: 4 roundings of the dtype against
``max|out|``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trtcore import ops
from trtcore.rope import rope_spec

from .conftest import DTYPES, NP_DTYPES, UNIT_ROUNDOFF, OneOp, as_float64, assert_close, builds_rtx, randn

torch = pytest.importorskip("torch")
from test_rope_plugin import HEAD_DIM, hf_float64, hf_rotary, trtcore_config  # noqa: E402

#: name -> (rope_theta, rope_scaling, partial_rotary_factor, max_position_embeddings); small
#: position ranges (positions up to 63; dynamic: max_position_embeddings 16, so rows longer
#: and shorter than it)
CASES: dict[str, tuple[float, dict[str, Any] | None, float, int]] = {
    "default": (10000.0, None, 1.0, 64),
    "linear": (10000.0, {"rope_type": "linear", "factor": 4.0}, 1.0, 64),
    "llama3": (500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 16}, 1.0, 128),
    "yarn": (10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, 1.0, 64),
    "dynamic": (10000.0, {"rope_type": "dynamic", "factor": 2.0}, 1.0, 16),
    "partial0.5": (10000.0, None, 0.5, 64),
    "partial0.25_llama3": (500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 16}, 0.25, 128),
    # LongRoPE: factor max/original = 4 -> attention factor sqrt(1 + ln 4 / ln 16)
    "longrope": (10000.0, {"rope_type": "longrope", "short_factor": np.linspace(1.0, 1.6, HEAD_DIM // 2).tolist(),
                           "long_factor": np.linspace(1.0, 9.0, HEAD_DIM // 2).tolist(), "original_max_position_embeddings": 16}, 1.0, 64),
    "partial0.5_longrope": (10000.0, {"rope_type": "longrope", "short_factor": np.linspace(1.2, 1.0, HEAD_DIM // 4).tolist(),
                                      "long_factor": np.linspace(2.0, 5.0, HEAD_DIM // 4).tolist(), "original_max_position_embeddings": 16,
                                      "attention_factor": 1.3}, 0.5, 64),
}
#: the scalings whose frequencies depend on each sequence's length
PER_SEQUENCE = ["dynamic", "longrope", "partial0.5_longrope"]

#: per batch row: (first position, length): a prefill from 0, a chunk after a cache, a decode
ROWS = [(0, 24), (9, 24), (38, 24)]


def positions(rows: list[tuple[int, int]]) -> np.ndarray:
    """int32 ``[batch, seq]``: row ``b`` is ``start_b + arange(seq)``."""
    return np.array([np.arange(s, s + n) for s, n in rows], np.int32)


def hf_cos_sin(case: str, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """transformers' float64 cos/sin ``[..., rotary_dim]`` for int positions ``[rows, seq]``,
    one forward call (a fresh module) per row; and its attention scaling."""
    cos, sin = [], []
    with hf_float64():
        for row in pos.reshape(-1, pos.shape[-1]):
            rotary, _ = hf_rotary(*CASES[case])
            c, s = rotary(torch.zeros(1, dtype=torch.float64), torch.from_numpy(row.astype(np.int64))[None])
            cos.append(c[0].numpy())
            sin.append(s[0].numpy())
    return np.stack(cos).reshape(pos.shape + (-1,)), np.stack(sin).reshape(pos.shape + (-1,)), float(rotary.attention_scaling)


def hf_apply(case: str, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """transformers' ``apply_rotary_pos_emb`` (Llama's, or GPT-NeoX's for partial rotary) in
    float64 on ``x [..., heads, head_dim]`` with cos/sin ``[..., rotary_dim]``."""
    with hf_float64():
        _, apply = hf_rotary(*CASES[case])
        t = torch.from_numpy(as_float64(x))
        out, _ = apply(t, t, torch.from_numpy(cos), torch.from_numpy(sin), unsqueeze_dim=-2)
    return out.numpy()


def angle_tolerance(pos: np.ndarray, scaling: float) -> float:
    return (2 * float(pos.max()) + 64) * UNIT_ROUNDOFF["float32"] * max(1.0, scaling)


@pytest.mark.parametrize("case", list(CASES))
def test_rope_cos_sin_matches_transformers(case: str) -> None:
    spec = rope_spec(trtcore_config(*CASES[case]))
    pos = positions(ROWS)
    net = OneOp(lambda g, i: ops.rope_cos_sin(g, i["position_ids"], spec), {"position_ids": pos}, dynamic={"position_ids": (0, 1)})
    out = net.run()
    want_cos, want_sin, scaling = hf_cos_sin(case, pos)
    assert out["out0"].dtype == np.float32 and out["out0"].shape == pos.shape + (1, spec.rotary_dim)
    tol = angle_tolerance(pos, scaling)
    np.testing.assert_allclose(out["out0"][..., 0, :], want_cos, rtol=0, atol=tol)
    np.testing.assert_allclose(out["out1"][..., 0, :], want_sin, rtol=0, atol=tol)
    assert net.check_rtx() == [("out0", (-1, -1, 1, spec.rotary_dim), "FLOAT"), ("out1", (-1, -1, 1, spec.rotary_dim), "FLOAT")]


@pytest.mark.parametrize("case", PER_SEQUENCE)
def test_rope_cos_sin_per_sequence_packed_with_seq_lens(case: str) -> None:
    """Packed tokens of two sequences, one shorter and one longer than
    max_position_embeddings (dynamic) / original_max_position_embeddings (longrope), both 16:
    each scales by its own ``seq_lens``."""
    spec = rope_spec(trtcore_config(*CASES[case]))
    lengths = [11, 40]
    pos = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
    seq_lens = np.repeat(lengths, lengths).astype(np.int32)
    net = OneOp(lambda g, i: ops.rope_cos_sin(g, i["position_ids"], spec, seq_lens=i["seq_lens"]),
                {"position_ids": pos, "seq_lens": seq_lens}, dynamic={"position_ids": (0,), "seq_lens": (0,)})
    out = net.run()
    start = 0
    for n in lengths:
        want_cos, want_sin, scaling = hf_cos_sin(case, pos[None, start : start + n])
        tol = angle_tolerance(pos, scaling)
        np.testing.assert_allclose(out["out0"][start : start + n, 0], want_cos[0], rtol=0, atol=tol)
        np.testing.assert_allclose(out["out1"][start : start + n, 0], want_sin[0], rtol=0, atol=tol)
        start += n
    net.check_rtx()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["default", "partial0.5", "partial0.25_llama3"])
def test_apply_rope_matches_transformers(case: str, dtype: str, rng: np.random.Generator) -> None:
    """Given cos/sin (float32 inputs, transformers' values), rotate ``x [batch, seq, heads,
    head_dim]``; features past ``rotary_dim`` pass through unchanged."""
    spec = rope_spec(trtcore_config(*CASES[case]))
    pos = positions(ROWS[:2])
    cos64, sin64, _ = hf_cos_sin(case, pos)
    cos, sin = cos64[..., None, :].astype(np.float32), sin64[..., None, :].astype(np.float32)
    x = randn(rng, pos.shape + (3, HEAD_DIM), dtype)
    net = OneOp(lambda g, i: ops.apply_rope(g, i["x"], i["cos"], i["sin"], spec, "q_rope"), {"x": x, "cos": cos, "sin": sin},
                dtype=dtype, dynamic={"x": (0, 1), "cos": (0, 1), "sin": (0, 1)})
    got = net.run()["out"]
    # transformers rounds cos/sin to x's dtype before applying them; so does the op
    as_dtype = lambda a: as_float64(a.astype(NP_DTYPES[dtype]))  # noqa: E731
    want = hf_apply(case, x, as_dtype(cos[..., 0, :]), as_dtype(sin[..., 0, :]))
    assert got.dtype == NP_DTYPES[dtype]
    assert_close(got, want, dtype, 4, atol_scale=float(np.abs(want).max()))
    np.testing.assert_array_equal(as_float64(got[..., spec.rotary_dim :]), as_float64(x[..., spec.rotary_dim :]))
    if builds_rtx(dtype, case == "default"):
        [(_, shape, _)] = net.check_rtx()
        assert shape == (-1, -1, 3, HEAD_DIM)


HEADS = [(4, 2), (2, 2), (4, 1)]  # (query heads, key/value heads): GQA, MHA, MQA


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("impl", ["layers", "plugin"])
@pytest.mark.parametrize("case", list(CASES))
def test_rotary_matches_transformers(case: str, impl: str, dtype: str, rng: np.random.Generator) -> None:
    """``ops.rotary`` on q and k ``[batch, seq, heads, head_dim]``, both implementations, vs
    transformers' RotaryEmbedding + apply_rotary_pos_emb per sequence in float64."""
    spec = rope_spec(trtcore_config(*CASES[case]))
    hq, hkv = HEADS[list(CASES).index(case) % len(HEADS)]
    pos = positions(ROWS)
    q, k = randn(rng, pos.shape + (hq, HEAD_DIM), dtype), randn(rng, pos.shape + (hkv, HEAD_DIM), dtype)
    net = OneOp(lambda g, i: ops.rotary(g, i["q"], i["k"], i["position_ids"], spec), {"q": q, "k": k, "position_ids": pos},
                dtype=dtype, dynamic={"q": (0, 1), "k": (0, 1), "position_ids": (0, 1)}, graph_kwargs={"implementations": {"rope": impl}})
    out = net.run()
    cos, sin, scaling = hf_cos_sin(case, pos)
    tol_angle = angle_tolerance(pos, scaling)
    for got, x in ((out["out0"], q), (out["out1"], k)):
        assert got.dtype == NP_DTYPES[dtype] and got.shape == x.shape
        want = hf_apply(case, x, cos, sin)
        scale = float(np.abs(want).max())
        # the dtype's roundings plus the float32 angle error on each of the two products
        np.testing.assert_allclose(as_float64(got), want, rtol=0,
                                   atol=(4 * UNIT_ROUNDOFF[dtype] + 2 * tol_angle) * scale, err_msg=f"{case} {impl} {dtype}")
    if impl == "layers" and (dtype == "float16" or case == "default"):  # every scaling once, every dtype once: build time
        net.check_rtx()


@pytest.mark.parametrize("case", PER_SEQUENCE)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rope_plugin_packed_per_sequence_with_seq_lens(case: str, dtype: str, rng: np.random.Generator) -> None:
    """The plugin on packed tokens ``[T, heads, head_dim]`` of two sequences with their
    ``seq_lens`` (dynamic NTK / LongRoPE: one below, one above the threshold 16)."""
    spec = rope_spec(trtcore_config(*CASES[case]))
    lengths = [11, 40]
    pos = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
    seq_lens = np.repeat(lengths, lengths).astype(np.int32)
    q, k = randn(rng, (pos.size, 4, HEAD_DIM), dtype), randn(rng, (pos.size, 2, HEAD_DIM), dtype)
    net = OneOp(lambda g, i: ops.rope_plugin(g, i["q"], i["k"], i["position_ids"], spec, seq_lens=i["seq_lens"]),
                {"q": q, "k": k, "position_ids": pos, "seq_lens": seq_lens}, dtype=dtype)
    out = net.run()
    start = 0
    for n in lengths:
        cos, sin, scaling = hf_cos_sin(case, pos[None, start : start + n])
        for got, x in ((out["out0"], q), (out["out1"], k)):
            want = hf_apply(case, x[start : start + n], cos[0], sin[0])
            atol = (4 * UNIT_ROUNDOFF[dtype] + 2 * angle_tolerance(pos, scaling)) * float(np.abs(want).max())
            np.testing.assert_allclose(as_float64(got[start : start + n]), want, rtol=0, atol=atol)
        start += n
