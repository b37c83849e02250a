"""The memory planner (CPU): no two buffers live at the same step share a byte."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from netutil import llama_plan

from trtcore.cuda import memory
from trtcore.errors import InvalidArgumentError


def _check(buffers: list[memory.Buffer], offsets: dict[str, int], total: int) -> None:
    for b in buffers:
        off = offsets[b.name]
        assert off % memory.ALIGNMENT == 0
        assert off + b.size <= total
    for i, a in enumerate(buffers):
        for b in buffers[i + 1 :]:
            if a.overlaps_in_time(b) and a.size and b.size:
                lo_a, lo_b = offsets[a.name], offsets[b.name]
                assert lo_a + a.size <= lo_b or lo_b + b.size <= lo_a, (a, b, lo_a, lo_b)


@st.composite
def buffer_sets(draw: st.DrawFn) -> list[memory.Buffer]:
    n = draw(st.integers(0, 40))
    out = []
    for i in range(n):
        first = draw(st.integers(0, 30))
        last = draw(st.integers(first, 31))
        out.append(memory.Buffer(f"t{i}", draw(st.integers(0, 5000)), first, last))
    return out


@settings(max_examples=300, deadline=None)
@given(buffer_sets())
def test_no_two_live_buffers_overlap(buffers: list[memory.Buffer]) -> None:
    offsets, total = memory.plan(buffers)
    _check(buffers, offsets, total)
    # never worse than giving every buffer its own memory
    assert total <= sum(-(-max(b.size, 1) // memory.ALIGNMENT) * memory.ALIGNMENT for b in buffers)


def test_disjoint_lifetimes_share_memory() -> None:
    offsets, total = memory.plan([memory.Buffer("a", 1000, 0, 1), memory.Buffer("b", 1000, 2, 3)])
    assert offsets["a"] == offsets["b"] == 0 and total == 1024


def test_bad_buffers_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="first <= last"):
        memory.plan([memory.Buffer("a", 10, 3, 2)])
    with pytest.raises(InvalidArgumentError, match="unique"):
        memory.plan([memory.Buffer("a", 10, 0, 1), memory.Buffer("a", 10, 0, 1)])


def test_a_models_plan_has_no_overlap_and_fits_the_largest_shapes() -> None:
    plan, _ = llama_plan(layers=2)
    g = plan.graph
    from trtcore.cuda.ir import infer_shapes, profile_points
    from trtcore.cuda.views import view_root

    class P:
        def get_shape(self, name: str):
            return plan.profile.get(name, [(), (), ()])

    big = infer_shapes(g, profile_points(g, P())[2])
    root = view_root(g)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, n in enumerate(g.nodes):
        for v in (*n.inputs, *n.outputs):
            r = root.get(v, v)
            if r in plan.offsets:
                first.setdefault(r, i)
                last[r] = i
    bufs = [memory.Buffer(r, plan.sizes[r], first[r], last[r]) for r in first]
    _check(bufs, plan.offsets, plan.device_memory_size)
    for r in first:
        assert plan.sizes[r] >= int(__import__("numpy").prod(big[r])) * g.values[r].dtype.itemsize
