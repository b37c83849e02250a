"""The cuda engine on a GPU (marker ``gpu``): numerics against the NumPy reference and
transformers, CUDA-graph capture, no allocation while executing, launches per decoder layer.

Skips, saying why, without CuPy, nvmath-python or a CUDA GPU; with ``TRTCORE_REQUIRE_GPU=1``
a missing GPU stack fails instead.

Tolerances (``ref`` the NumPy reference backend's value of the same network):

* float32: ``|gpu - ref| <= 1e-5 * max(1, |ref|)`` (CUDA's libm and cuBLAS's summation order
  against NumPy's; one layer per output, so no error accumulates);
* float16 / bfloat16, one layer: within one unit in the last place of the type,
  ``2^-10`` / ``2^-7`` relative (a float32 difference can move the single rounding to the
  neighbouring value, never further);
* whole networks in bfloat16: relative L2 error of the logits below 2e-2 (several layers of
  bfloat16 rounding, each at most 2^-8 relative, with cuBLAS's summation order);
* integers, booleans and data movement: bit exact; NaN where the reference has NaN.
"""

from __future__ import annotations

import os
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hf_models import hf_models  # noqa: F401  (session fixture)

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)


def _gpu_or_skip() -> Any:
    why = None
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            why = "no CUDA GPU"
    except Exception as exc:  # noqa: BLE001 - any import/driver failure means no GPU here
        why = f"CuPy / CUDA unavailable ({exc})"
    if why is None:
        try:
            import nvmath.bindings.cublas  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            why = f"nvmath-python unavailable ({exc})"
    if why is not None:
        if os.environ.get("TRTCORE_REQUIRE_GPU") == "1":
            pytest.fail(f"TRTCORE_REQUIRE_GPU=1 but {why}")
        pytest.skip(why)
    import cupy

    return cupy


@pytest.fixture(scope="module")
def cp() -> Any:
    return _gpu_or_skip()


class Run:
    """An engine with device buffers for its I/O: ``feed`` host arrays, ``execute``, ``outputs``."""

    def __init__(self, cp: Any, engine: Any):
        self.cp = cp
        self.engine = engine
        self.ctx = engine.create_execution_context()
        self.dev: dict[str, Any] = {}
        self.stream = cp.cuda.Stream(non_blocking=True)

    def feed(self, feeds: dict[str, np.ndarray]) -> None:
        cp, ctx, eng = self.cp, self.ctx, self.engine
        for name, arr in feeds.items():
            host = np.ascontiguousarray(arr)
            raw = host.view(np.uint16) if host.dtype == BF16 else host
            d = cp.asarray(raw)
            self.dev[name] = d
            assert ctx.set_input_shape(name, host.shape), name
            assert ctx.set_tensor_address(name, int(d.data.ptr)), name
        for i in range(eng.num_io_tensors):
            name = eng.get_tensor_name(i)
            if eng.get_tensor_mode(name).name != "OUTPUT":
                continue
            alias = eng.get_aliased_input_tensor(name)
            if alias is not None:
                self.dev[name] = self.dev[alias]
            else:
                shape = ctx.get_tensor_shape(name)
                dt = _storage(eng.get_tensor_dtype(name))
                n = int(np.prod(shape))  # poisoned (0x7F7F...) so that an unwritten element shows
                self.dev[name] = cp.full(n * dt.itemsize, 0x7F, dtype=np.uint8).view(dt).reshape(shape)
            ctx.set_tensor_address(name, int(self.dev[name].data.ptr))

    def execute(self) -> None:
        assert self.ctx.execute_async_v3(self.stream.ptr)
        self.stream.synchronize()

    def output(self, name: str) -> np.ndarray:
        host = self.cp.asnumpy(self.dev[name])
        if self.engine.get_tensor_dtype(name).name == "BF16":
            host = host.view(BF16)
        return host


def _storage(dtype: Any) -> np.dtype:
    import trtcore.cuda as tc

    return np.dtype(np.uint16) if dtype == tc.DataType.BF16 else np.dtype(tc.nptype(dtype))


def compare(name: str, got: np.ndarray, ref: np.ndarray, single_layer: bool = True) -> None:
    ref = np.asarray(ref)
    assert got.shape == ref.shape, (name, got.shape, ref.shape)
    if ref.dtype.kind in "biu":
        np.testing.assert_array_equal(got, ref, err_msg=name)
        return
    g64, r64 = got.astype(np.float64), ref.astype(np.float64)
    nan = np.isnan(r64)
    np.testing.assert_array_equal(np.isnan(g64), nan, err_msg=f"{name}: NaN positions differ")
    same_inf = np.isinf(r64)
    np.testing.assert_array_equal(g64[same_inf], r64[same_inf], err_msg=f"{name}: infinities differ")
    ok = ~(nan | same_inf)
    if ref.dtype == np.float32:
        tol = 1e-5 * np.maximum(1.0, np.abs(r64))
    else:
        rel = 2.0**-7 if ref.dtype == BF16 else 2.0**-10
        tiny = float(ml_dtypes.finfo(ref.dtype).tiny) if ref.dtype == BF16 else float(np.finfo(ref.dtype).tiny)
        tol = rel * np.maximum(np.abs(r64), tiny) + tiny
    err = np.abs(g64 - r64)
    bad = ok & (err > tol)
    assert not bad.any(), f"{name}: {int(bad.sum())} elements off, worst {err[bad].max()} at ref {r64[bad][np.argmax(err[bad])]}"


def engine_of(net: Any, shapes: dict[str, tuple[tuple[int, ...], ...]] | None = None) -> Any:
    from netutil import config_for

    import trtcore.cuda as tc

    blob = tc.Builder(tc.Logger(tc.Logger.ERROR)).build_serialized_network(net, config_for(net, shapes))
    return tc.Runtime().deserialize_cuda_engine(blob)


@pytest.mark.parametrize("float_name", ["FLOAT", "HALF", "BF16"])
def test_every_layer_type_equals_the_reference(cp: Any, float_name: str) -> None:
    from test_device_select import layer_feeds, layer_network

    from trtcore.reference.evaluator import evaluate

    net, kinds = layer_network(float_name)
    feeds = layer_feeds(net, seed=3)
    ref = evaluate(net, {k: v.copy() for k, v in feeds.items()})
    run = Run(cp, engine_of(net))
    run.feed(feeds)
    run.execute()
    for name in kinds:
        compare(name, run.output(name), ref[name])


@pytest.mark.parametrize(
    ("dtype", "hidden", "rows"),
    [("float32", 576, 7), ("bfloat16", 576, 7), ("float32", 4100, 1), ("float32", 4100, 140), ("float32", 10000, 1), ("float32", 576, 200), ("float32", 31, 3)],
)
def test_residual_add_and_rms_norm_kernel(cp: Any, dtype: str, hidden: int, rows: int) -> None:
    """One row kernel; besides SmolLM2's width, rows wider than a thread's register cache
    (codegen.ROW_CACHED elements a thread): at decode (< 132 rows, up to 1024 threads)
    10000 > 8 x 1024; with many rows (256 threads) 4100 > 8 x 256; and rows narrower than
    one element a thread."""
    from netutil import rms_norm_net

    import trtcore.cuda as tc
    from trtcore.reference.evaluator import evaluate

    dt = tc.DataType.FLOAT if dtype == "float32" else tc.DataType.BF16
    net, g = rms_norm_net(dt, hidden=hidden, seed=hidden)
    rng = np.random.default_rng(hidden + rows)
    feeds = {n: rng.standard_normal((rows, hidden)).astype(g.np_dtype) for n in ("a", "b")}
    ref = evaluate(net, feeds)
    shape = ((1, hidden), (rows, hidden), (max(rows, 16), hidden))
    eng = engine_of(net, {"a": shape, "b": shape})
    assert [k.kind for k in eng.kernels] == ["row_group"]
    run = Run(cp, eng)
    run.feed(feeds)
    run.execute()
    for name in ("y", "residual"):
        compare(name, run.output(name), ref[name])


@pytest.mark.parametrize("shape", [(3, 5, 129), (2, 4, 128), (1, 7, 1), (4, 300), (2, 3, 2, 257), (5000,)])
def test_pointwise_group_over_units_of_the_last_axis(cp: Any, shape: tuple[int, ...]) -> None:
    """A pointwise group (exp(a) * b + c) whose domain's last axis is shorter than, equal to
    and longer than a warp unit (codegen.POINTWISE_SPAN), with a broadcast input (b: size 1
    on every axis but the second) and a strided one (c: a transposed view of an input), in
    float32 against NumPy; the output buffer is poisoned first."""
    from netutil import network

    import trtcore.cuda as tc
    from trtcore.reference.evaluator import evaluate

    net = network()
    rank = len(shape)
    bshape = tuple(d if i == min(1, rank - 1) else 1 for i, d in enumerate(shape))
    cshape = (*shape[:-2], shape[-1], shape[-2]) if rank >= 2 else shape
    a = net.add_input("a", tc.DataType.FLOAT, shape)
    b = net.add_input("b", tc.DataType.FLOAT, bshape)
    c_in = net.add_input("c", tc.DataType.FLOAT, cshape)
    c = c_in
    if rank >= 2:
        t = net.add_shuffle(c_in)
        t.first_transpose = (*range(rank - 2), rank - 1, rank - 2)  # a view: strided, not copied
        c = t.get_output(0)
    e = net.add_unary(a, tc.UnaryOperation.EXP).get_output(0)
    m = net.add_elementwise(e, b, tc.ElementWiseOperation.PROD).get_output(0)
    y = net.add_elementwise(m, c, tc.ElementWiseOperation.SUM).get_output(0)
    y.name = "y"
    net.mark_output(y)
    rng = np.random.default_rng(sum(shape))
    feeds = {"a": rng.standard_normal(shape).astype(np.float32), "b": rng.standard_normal(bshape).astype(np.float32)}
    feeds["c"] = rng.standard_normal(cshape).astype(np.float32)
    ref = evaluate(net, feeds)
    eng = engine_of(net)
    assert "pointwise_group" in [k.kind for k in eng.kernels]
    run = Run(cp, eng)
    run.feed(feeds)
    run.execute()
    compare("y", run.output("y"), ref["y"])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("rows", "width", "offset", "pad"), [(3, 264, 8, 8), (3, 264, 1, 8), (3, 264, 0, 4), (1, 4096, 0, 8), (70, 512, 8, 8), (2, 12, 0, 8)]
)
def test_pointwise_vector_and_element_paths(cp: Any, dtype: str, rows: int, width: int, offset: int, pad: int) -> None:
    """``silu(x) * y * s + w`` with ``x`` a slice view of a wider input (rows ``pad`` elements
    longer) starting ``offset`` elements in, ``y`` dense, ``s`` broadcast along the last axis
    (``[rows, 1]``) and ``w`` along the rows (``[1, width]``). Offset 0 or 8, pad 8, a width that
    is a multiple of 8: every lane's 8 elements are vectors (codegen's vector path); offset 1
    (a misaligned view), pad 4 (aligned first row, rows 4 elements off: the next row's start is
    misaligned) or width 12: the element path. Widths of part of a unit (264 = 256 + 8), of
    whole units, and one row (decode). Against the reference backend, the output poisoned
    first; both paths round the same way, so the tolerance is compare()'s."""
    from netutil import network

    import trtcore.cuda as tc
    from trtcore import ops
    from trtcore.reference.evaluator import evaluate

    net = network()
    g = ops.Graph(tc, net, dtype)
    wide = net.add_input("wide", g.trt_dtype, (-1, width + pad))
    y = net.add_input("y", g.trt_dtype, (-1, width))
    s = net.add_input("s", g.trt_dtype, (-1, 1))
    rng = np.random.default_rng(width + offset + rows + pad)
    x = ops.gather_const(g, wide, range(offset, offset + width), 1, "x")
    w = ops.constant(g, rng.standard_normal((1, width)).astype(g.np_dtype), "w")
    out = ops.add(g, ops.mul(g, ops.mul(g, ops.silu(g, x), y, "glu"), s, "scaled"), w, "shifted")
    g.output(out, "out")
    feeds = {"wide": rng.standard_normal((rows, width + pad)), "y": rng.standard_normal((rows, width)), "s": rng.standard_normal((rows, 1))}
    feeds = {k: v.astype(g.np_dtype) for k, v in feeds.items()}
    ref = evaluate(net, {k: v.copy() for k, v in feeds.items()})
    shapes = {k: ((1, v.shape[1]), v.shape, (max(rows, 80), v.shape[1])) for k, v in feeds.items()}
    eng = engine_of(net, shapes)
    assert [k.kind for k in eng.kernels] == ["pointwise_group"]  # x is a view, not a copy
    run = Run(cp, eng)
    run.feed(feeds)
    run.execute()
    compare("out", run.output("out"), ref["out"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_swiglu_mlp_fused_gate_up_and_silu(cp: Any, dtype: str) -> None:
    from netutil import network

    import trtcore.cuda as tc
    from trtcore import ops
    from trtcore.reference.evaluator import evaluate

    net = network()
    g = ops.Graph(tc, net, dtype)
    x = net.add_input("x", g.trt_dtype, (-1, 64))
    rng = np.random.default_rng(2)
    y = ops.swiglu_mlp(g, x, *(rng.standard_normal(s) * 0.2 for s in ((96, 64), (96, 64), (64, 96))))
    g.output(y, "y")
    feeds = {"x": rng.standard_normal((5, 64)).astype(g.np_dtype)}
    ref = evaluate(net, feeds)
    eng = engine_of(net, {"x": ((1, 64), (4, 64), (8, 64))})
    assert [k.kind for k in eng.kernels] == ["gemm", "pointwise_group", "gemm"]
    run = Run(cp, eng)
    run.feed(feeds)
    run.execute()
    got, want = run.output("y").astype(np.float64), ref["y"].astype(np.float64)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < (1e-5 if dtype == "float32" else 2e-2), err


def paged_decode_feeds(plan: Any, batch: int, seed: int) -> dict[str, np.ndarray]:
    """One decode token per sequence over random cached keys/values (``ctx`` tokens each)."""
    from netutil import decode_shapes

    rng = np.random.default_rng(seed)
    shapes = decode_shapes(plan, batch, blocks=4)
    vocab = 512
    ctx = rng.integers(5, 60, size=batch)
    pool_dt = np.dtype(__import__("trtcore.cuda", fromlist=["nptype"]).nptype(plan.graph.values["kv_cache_pool"].dtype))
    feeds = {
        "input_ids": rng.integers(0, vocab, size=batch).astype(np.int32),
        "position_ids": ctx.astype(np.int32),
        "kv_cache_pool": (rng.standard_normal(shapes["kv_cache_pool"]) * 0.5).astype(pool_dt),
        "block_tables": (np.arange(batch * 4).reshape(batch, 4) % 16).astype(np.int32),
        "seq_lens": (ctx + 1).astype(np.int32),
        "query_start_loc": np.arange(batch + 1, dtype=np.int32),
        "last_token_ids": np.arange(batch, dtype=np.int32),
    }
    return feeds


def gemm_tactics(plan: Any, gemm: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """GEMMs on cuBLAS only, on the GEMV kernel wherever it applies, or on the tactics a
    timing run chose (``tuned``, with a fresh timing cache)."""
    from trtcore.cuda import tactics

    if gemm == "tuned":
        monkeypatch.delenv("TRTCORE_CUDA_GEMV", raising=False)
        monkeypatch.setenv("TRTCORE_CACHE", str(tmp_path))
        tactics.tune(plan)
    else:
        monkeypatch.setenv("TRTCORE_CUDA_GEMV", "1" if gemm == "gemv" else "0")


@pytest.mark.parametrize("gemm", ["cublas", "gemv", "tuned"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_llama_paged_decode_equals_the_reference(cp: Any, dtype: str, gemm: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Also with the generated GEMV kernel for the decode GEMMs (``TRTCORE_CUDA_GEMV=1``) and
    with the timed tactics (cuBLASLt algorithms, split-K)."""
    from netutil import llama_plan

    import trtcore.cuda as tc
    from trtcore.reference.evaluator import evaluate

    plan, d = llama_plan(layers=2, dtype=dtype, arch=None)
    gemm_tactics(plan, gemm, monkeypatch, tmp_path)
    feeds = paged_decode_feeds(plan, 3, seed=1)
    ref = evaluate(d.network, {k: v.copy() for k, v in feeds.items()})
    run = Run(cp, tc.ICudaEngine(plan))
    run.feed(feeds)
    run.execute()
    got, want = run.output("logits").astype(np.float64), ref["logits"].astype(np.float64)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < (1e-4 if dtype == "float32" else 2e-2), err


@pytest.mark.parametrize("gemm", ["cublas", "gemv", "tuned"])
def test_decode_step_replays_from_a_cuda_graph_and_allocates_nothing(cp: Any, gemm: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from netutil import allocation_counter, llama_plan

    import trtcore.cuda as tc

    plan, _ = llama_plan(layers=2, dtype="bfloat16", arch=None)
    gemm_tactics(plan, gemm, monkeypatch, tmp_path)
    run = Run(cp, tc.ICudaEngine(plan))
    feeds = paged_decode_feeds(plan, 2, seed=4)
    pool0 = feeds["kv_cache_pool"].copy()
    run.feed(feeds)
    run.execute()  # warm-up: prepares the launches for these shapes
    eager = run.output("logits").copy()

    hook = allocation_counter()
    run.dev["kv_cache_pool"].set(pool0.view(np.uint16))
    cp.cuda.runtime.deviceSynchronize()
    with hook:
        assert run.ctx.execute_async_v3(run.stream.ptr)
        run.stream.synchronize()
    assert hook.n == 0, f"execute_async_v3 allocated device memory {hook.n} times"
    np.testing.assert_array_equal(run.output("logits"), eager)
    # capture one step into a graph, replay it on the restored cache
    run.dev["kv_cache_pool"].set(pool0.view(np.uint16))
    cp.cuda.runtime.deviceSynchronize()
    run.stream.begin_capture()
    run.ctx.execute_async_v3(run.stream.ptr)
    graph = run.stream.end_capture()
    run.dev["logits"].fill(0)
    run.dev["kv_cache_pool"].set(pool0.view(np.uint16))
    cp.cuda.runtime.deviceSynchronize()
    graph.launch(run.stream)
    run.stream.synchronize()
    np.testing.assert_array_equal(run.output("logits"), eager)


def test_launches_per_decoder_layer_at_decode(cp: Any) -> None:
    """Kernel launches (generated kernels and the plugins' own) plus cuBLAS calls of one
    decoder layer at decode, counted while executing: at most 12."""
    from netutil import llama_plan
    from trtcore.kernels import launch as kl

    import trtcore.cuda as tc

    counts = []
    for layers in (2, 3):
        plan, _ = llama_plan(layers=layers, dtype="bfloat16", arch=None)
        run = Run(cp, tc.ICudaEngine(plan))
        run.feed(paged_decode_feeds(plan, 1, seed=2))
        run.execute()
        n = {"k": 0}
        orig = kl.KernelFunction.launch
        orig_gemm = tc.runtime.Cublas.run

        def counting(self: Any, *a: Any, n: dict[str, int] = n, orig: Any = orig, **k: Any) -> None:
            n["k"] += 1
            orig(self, *a, **k)

        def counting_gemm(self: Any, *a: Any, n: dict[str, int] = n, orig_gemm: Any = orig_gemm, **k: Any) -> None:
            n["k"] += 1
            orig_gemm(self, *a, **k)

        kl.KernelFunction.launch = counting  # type: ignore[method-assign]
        tc.runtime.Cublas.run = counting_gemm  # type: ignore[method-assign]
        try:
            run.execute()
        finally:
            kl.KernelFunction.launch = orig  # type: ignore[method-assign]
            tc.runtime.Cublas.run = orig_gemm  # type: ignore[method-assign]
        counts.append(n["k"])
    per_layer = counts[1] - counts[0]
    print(f"launches per decoder layer at decode: {per_layer} (2 layers: {counts[0]}, 3 layers: {counts[1]})")
    assert per_layer <= 12, counts


@pytest.mark.parametrize("variant", ["llama3_rope", "llama_linear_v4", "llama_dynamic_v4", "mistral_sw8", "qwen2_bias", "qwen3_qknorm", "qwen2_mixed_swa", "llama_bf16_sharded"])
def test_tiny_models_match_transformers(cp: Any, hf_models: Any, variant: str) -> None:  # noqa: F811
    """Prefill logits of the last token and one decode step (contiguous KV cache, float32)
    against transformers in float64: within 1e-4 * max(1, |hf|)."""
    import torch
    from hf_models import VARIANTS, random_prompt

    import trtcore.cuda as tc
    from trtcore.builder import BuildConfig, _builder_config, define_network
    from trtcore.checkpoint import Checkpoint
    from trtcore.config import load_config
    from trtcore.kv_modes import attention_mask

    assert variant in VARIANTS
    path = hf_models.dir(variant)
    config = load_config(path)
    bc = BuildConfig(dtype="float32", max_batch_size=2, max_seq_len=64, kv_cache="contiguous", rope="layers")
    d = define_network(tc, config, Checkpoint(path), bc)
    blob = d.builder.build_serialized_network(d.network, _builder_config(d, None))
    engine = tc.Runtime().deserialize_cuda_engine(blob)
    rng = np.random.default_rng(0)
    prompt = random_prompt(rng, 12, config.vocab_size)
    hf = hf_models.hf(variant)
    with torch.no_grad():
        want = hf(torch.tensor([prompt + [prompt[0]]])).logits[0].double().numpy()
    window = config.sliding_window
    past = {f"past_key_values.{i}.{k}": np.zeros((1, config.num_key_value_heads, 0, config.head_dim), np.float32)
            for i in range(config.num_hidden_layers) for k in ("key", "value")}
    S = len(prompt)

    def masks(kpos: np.ndarray, qpos: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        names = {t.name for t in d.network._inputs}
        if "attention_mask" in names:
            out["attention_mask"] = attention_mask(kpos, qpos, None)
        if "sliding_attention_mask" in names:
            out["sliding_attention_mask"] = attention_mask(kpos, qpos, window)
        return out

    pos = np.arange(S, dtype=np.int32)[None]
    feeds = {"input_ids": np.asarray([prompt], np.int32), "position_ids": pos, "last_token_ids": np.array([S - 1], np.int32),
             **masks(pos, pos), **past}
    run = Run(cp, engine)
    run.feed(feeds)
    run.execute()
    got = run.output("logits")[0]
    np.testing.assert_allclose(got, want[S - 1], atol=1e-4, rtol=1e-4)
    present = {f"past_key_values.{i}.{k}": run.output(f"present.{i}.{k}") for i in range(config.num_hidden_layers) for k in ("key", "value")}
    kpos = np.arange(S + 1, dtype=np.int32)[None]
    qpos = np.array([[S]], np.int32)
    feeds = {"input_ids": np.asarray([[prompt[0]]], np.int32), "position_ids": qpos, "last_token_ids": np.array([0], np.int32),
             **masks(kpos, qpos), **present}
    run2 = Run(cp, engine)
    run2.feed(feeds)
    run2.execute()
    np.testing.assert_allclose(run2.output("logits")[0], want[S], atol=1e-4, rtol=1e-4)


def test_build_times_tactics_once_then_the_timing_cache_answers(cp: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A build on a GPU times every GEMM shape of its profile; a second build of the same
    network takes every choice from the timing cache on disk and times nothing."""
    import re

    from netutil import llama_plan

    import trtcore.cuda as tc
    from trtcore.builder import _builder_config

    monkeypatch.setenv("TRTCORE_CACHE", str(tmp_path))
    monkeypatch.delenv("TRTCORE_CUDA_TIMING", raising=False)
    _, d = llama_plan(layers=2, dtype="bfloat16", arch=None)
    builder = tc.Builder(tc.Logger(tc.Logger.ERROR))
    plans = [builder.build_engine(d.network, _builder_config(d, None)).plan for _ in range(2)]
    counts = []
    for p in plans:
        (line,) = [x for x in p.build_log if x.startswith("GEMM tactics")]
        shapes, timed, cached = (int(v) for v in re.search(r"(\d+) shapes, (\d+) timed, (\d+) from", line).groups())
        counts.append((shapes, timed, cached))
    (n, t1, c1), (n2, t2, c2) = counts
    assert n == n2 >= 5 and (t1, c1) == (n, 0) and (t2, c2) == (0, n), counts  # qkv, o, gate/up, down, lm_head at least
    assert plans[0].tactics == plans[1].tactics
    assert (tmp_path / "cuda-timing-cache.json").is_file()
    labels = {label for t in plans[0].tactics.values() for label in t["timed"]}
    assert "cublasGemmEx" in labels and "gemv" in labels and any(x.startswith("heuristic#") for x in labels), labels  # cuBLASLt was timed
