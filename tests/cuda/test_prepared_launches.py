"""The cuda execution context's prepared launch lists (CPU: placeholder addresses, no kernel
loads, no launches): one per shape / address combination, kept in an LRU of ``max_prepared``,
``prepare_launches`` preparing without enqueueing, counted in ``num_prepares``."""

from __future__ import annotations

from typing import Any

import pytest
from netutil import compile_net, rms_norm_net

from trtcore.cuda import runtime
from trtcore.cuda.runtime import ICudaEngine

PROFILE = {"a": ((1, 64), (4, 64), (16, 64)), "b": ((1, 64), (4, 64), (16, 64))}


@pytest.fixture
def context(monkeypatch: pytest.MonkeyPatch) -> Any:
    net, _ = rms_norm_net()
    engine = ICudaEngine(compile_net(net, PROFILE))
    monkeypatch.setattr(engine, "_load", lambda: None)  # no GPU: nothing to load
    monkeypatch.setattr(runtime, "Cublas", lambda *args: None)
    engine._const_ptr = {c: (i + 100) << 38 for i, c in enumerate(engine.plan.graph.constants)}
    ctx = engine.create_execution_context_without_device_memory()
    ctx.set_device_memory(1 << 40, engine.device_memory_size_v2)
    for i, name in enumerate(("a", "b", "y", "residual")):
        assert ctx.set_tensor_address(name, (i + 1) << 30)
    return ctx


def _shape(ctx: Any, rows: int) -> None:
    for name in ("a", "b"):
        assert ctx.set_input_shape(name, (rows, 64))


def test_prepared_launch_lists_are_an_lru(context: Any) -> None:
    ctx = context
    ctx.max_prepared = 2
    counts = []
    for rows in (1, 2, 3, 3, 2, 1, 3):
        _shape(ctx, rows)
        n = ctx.prepare_launches()
        assert n == len(ctx.prepare(ctx.engine._const_ptr)) > 0
        counts.append(ctx.num_prepares)
    # 1, 2, 3 are new (3 evicts 1); 3 and 2 are kept; 1 is prepared again (evicting 3, the least
    # recently used once 2 was touched), then 3 again (evicting 2)
    assert counts == [1, 2, 3, 3, 3, 4, 5]
    assert len(ctx._prepared) == 2 and ctx.prepare_seconds > 0
    kept = {dict(key[0])["a"][0] for key in ctx._prepared}
    assert kept == {1, 3}


def test_execute_replays_what_prepare_launches_prepared(context: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = context
    launched: list[str] = []
    monkeypatch.setattr(runtime.IExecutionContext, "_launch", lambda self, step, stream: launched.append(repr(step)))
    _shape(ctx, 5)
    ctx.prepare_launches()
    assert ctx.num_prepares == 1
    assert ctx.execute_async_v3(7)
    assert ctx.num_prepares == 1 and launched == [repr(s) for s in ctx.prepare(ctx.engine._const_ptr)]
