"""Small networks for the cuda backend's tests, built with its (the reference's) network API."""

from __future__ import annotations

from typing import Any

import numpy as np

import trtcore.cuda as tc
from trtcore.builder import BuildConfig, _builder_config, define_network
from trtcore.cuda import synthetic
from trtcore.cuda.builder import compile_network
from trtcore.cuda.plan import Plan


def allocation_counter() -> Any:
    """A CuPy memory hook counting allocations (``.n``; ``with hook: ...``), CuPy imported here."""
    import cupy.cuda.memory_hook as mh

    class Count(mh.MemoryHook):
        name = "count"

        def __init__(self) -> None:
            self.n = 0

        def malloc_preprocess(self, **kw: Any) -> None:
            self.n += 1

        def alloc_preprocess(self, **kw: Any) -> None:
            self.n += 1

    return Count()


def network() -> Any:
    return tc.Builder(tc.Logger(tc.Logger.ERROR)).create_network(1 << int(tc.NetworkDefinitionCreationFlag.STRONGLY_TYPED))


def config_for(net: Any, shapes: dict[str, tuple[tuple[int, ...], ...]] | None = None) -> Any:
    """A builder config with one profile (``shapes``: name -> (min, opt, max))."""
    b = tc.Builder(tc.Logger(tc.Logger.ERROR))
    cfg = b.create_builder_config()
    prof = b.create_optimization_profile()
    for name, (lo, opt, hi) in (shapes or {}).items():
        prof.set_shape(name, lo, opt, hi)
    cfg.add_optimization_profile(prof)
    return cfg


def compile_net(net: Any, shapes: dict[str, tuple[tuple[int, ...], ...]] | None = None, arch: str | None = "sm_90", capture: Any = ()) -> Plan:
    return compile_network(net, config_for(net, shapes), None, arch=arch, capture=capture)


def rms_norm_net(dtype: Any = tc.DataType.BF16, hidden: int = 64, seed: int = 0) -> Any:
    """``h = a + b; y = rms_norm(h) * w``: the residual add feeding a norm, both outputs marked
    (``h`` the residual stream, ``y`` the normalized), tokens dynamic."""
    from trtcore import ops

    net = network()
    g = ops.Graph(tc, net, {tc.DataType.BF16: "bfloat16", tc.DataType.HALF: "float16", tc.DataType.FLOAT: "float32"}[dtype])
    a = net.add_input("a", dtype, (-1, hidden))
    b = net.add_input("b", dtype, (-1, hidden))
    h = ops.add(g, a, b, "residual")
    w = 1 + 0.1 * np.random.default_rng(seed).standard_normal(hidden)
    y = ops.rms_norm(g, h, w, 1e-5, "norm")
    g.output(y, "y")
    net.mark_output(h)
    return net, g


def llama_plan(layers: int = 2, dtype: str = "bfloat16", arch: str | None = "sm_90", rope: str | None = None, **overrides: Any) -> tuple[Plan, Any]:
    """A SmolLM2-shaped Llama (``layers`` layers, small vocabulary) on the paged KV cache;
    ``rope``: the plan's RoPE implementation (None: the default, the RoPE plugin)."""
    cfg = synthetic.config("SmolLM2-135M", num_hidden_layers=layers, vocab_size=512, **overrides)
    bc = BuildConfig(dtype=dtype, max_batch_size=4, max_seq_len=128, max_num_tokens=128, max_num_blocks=64, kv_cache="paged", rope=rope)
    d = define_network(tc, cfg, synthetic.RandomWeights(pool_size=1 << 18), bc)
    return compile_network(d.network, _builder_config(d, None), None, arch=arch), d


def decode_shapes(plan: Plan, batch: int = 1, blocks: int = 4) -> dict[str, tuple[int, ...]]:
    """Input shapes of one paged decode step of ``batch`` sequences."""
    pool = plan.graph.values["kv_cache_pool"].shape
    return {
        "input_ids": (batch,), "position_ids": (batch,), "kv_cache_pool": (pool[0], 16, *pool[2:]),
        "block_tables": (batch, blocks), "seq_lens": (batch,), "query_start_loc": (batch + 1,), "last_token_ids": (batch,),
    }


#: where :func:`prepared_steps` puts the activation block (inputs, outputs and constants lie
#: above it, each ``2**40`` bytes apart)
ACTIVATIONS = 1 << 40


def prepared_steps(plan: Plan, shapes: dict[str, tuple[int, ...]]) -> list[Any]:
    """The launches of ``plan`` at input ``shapes``, prepared on the host with placeholder
    addresses (no GPU): what the runtime would enqueue. Activations at :data:`ACTIVATIONS`
    (``plan.device_memory_size`` bytes)."""
    from trtcore.cuda.runtime import ICudaEngine

    engine = ICudaEngine(plan)
    ctx = engine.create_execution_context_without_device_memory()
    ctx.set_device_memory(ACTIVATIONS, engine.device_memory_size_v2)
    for i in range(engine.num_io_tensors):
        ctx.set_tensor_address(engine.get_tensor_name(i), (i + 2) << 40)
    for name, shape in shapes.items():
        assert ctx.set_input_shape(name, shape), name
    return ctx.prepare({name: (i + 100) << 40 for i, name in enumerate(plan.graph.constants)})


def host_steps(plan: Plan, batch: int = 1) -> list[Any]:
    """The launches of one paged decode step of ``batch`` sequences (:func:`prepared_steps`)."""
    return prepared_steps(plan, decode_shapes(plan, batch=batch))
