"""The graph helpers the epilogue fusion passes share (trtcore.cuda.graph_match), on small
hand-written graphs."""

from __future__ import annotations

import numpy as np
import pytest

from trtcore.cuda.graph_match import Reads, add_derived_constants, env_flag, is_node, splice
from trtcore.cuda.ir import Graph, Node, Value
from trtcore.reference.types import ActivationType, DataType, ElementWiseOperation


def _graph() -> Graph:
    """x -> relu -> a; a + a -> b (engine output); a * c -> d (engine output); c a constant."""
    f = DataType.HALF
    values = {n: Value(n, f, (2, 4)) for n in ("x", "a", "b", "c", "d")}
    nodes = [
        Node("relu", "activation", ["x"], ["a"], {"kind": int(ActivationType.RELU)}),
        Node("twice", "elementwise", ["a", "a"], ["b"], {"op": int(ElementWiseOperation.SUM)}),
        Node("scale", "elementwise", ["a", "c"], ["d"], {"op": int(ElementWiseOperation.PROD)}),
    ]
    return Graph(values, nodes, ["x"], ["b", "d"], {"c": np.ones((2, 4), np.float16)})


@pytest.mark.parametrize(
    ("value", "default", "expected"),
    [
        (None, True, True),
        ("0", True, False),
        ("1", True, True),
        ("yes", True, True),
        (None, False, False),
        ("1", False, True),
        ("0", False, False),
        ("yes", False, False),
    ],
)
def test_env_flag_reads_a_default_on_or_off_switch(monkeypatch: pytest.MonkeyPatch, value: str | None, default: bool, expected: bool) -> None:
    if value is None:
        monkeypatch.delenv("TRTCORE_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("TRTCORE_TEST_SWITCH", value)
    assert env_flag("TRTCORE_TEST_SWITCH", default=default) is expected


def test_is_node_checks_the_op_and_its_kind() -> None:
    relu, twice, _ = _graph().nodes
    assert is_node(relu, "activation") and is_node(relu, "activation", int(ActivationType.RELU), attr="kind")
    assert not is_node(relu, "activation", int(ActivationType.SIGMOID), attr="kind")
    assert is_node(twice, "elementwise", int(ElementWiseOperation.SUM))
    assert not is_node(twice, "elementwise", int(ElementWiseOperation.PROD)) and not is_node(twice, "unary")
    assert not is_node(None, "elementwise")


def test_reads_counts_a_node_reading_a_value_twice_once_and_no_only_reader_of_an_engine_output() -> None:
    g = _graph()
    reads = Reads(g)
    assert [n.name for n in reads.of("a")] == ["twice", "scale"] and reads.count("a") == 2
    assert reads.only("a") is None  # two readers
    assert reads.only("x") is g.nodes[0]
    assert reads.only("c") is g.nodes[2]
    assert reads.of("b") == [] and reads.count("b") == 0 and reads.only("b") is None
    g.outputs.append("x")
    assert Reads(g).only("x") is None  # an engine output: a fused node would no longer write it


def test_add_derived_constants_names_them_after_their_source_and_keeps_its_dtype() -> None:
    g = _graph()
    arr = np.arange(16, dtype=np.float16).reshape(4, 4)
    assert add_derived_constants(g, ["c"], [arr], "fused") == ["c.fused"]
    assert g.constants["c.fused"] is arr
    assert g.values["c.fused"] == Value("c.fused", DataType.HALF, (4, 4))
    with pytest.raises(ValueError, match="1 constants"):
        add_derived_constants(g, ["c"], [arr, arr], "x")


def test_splice_replaces_in_place_drops_renames_and_removes_what_nothing_reads() -> None:
    g = _graph()
    relu, twice, scale = g.nodes
    fused = Node("fused", "elementwise", ["x", "c"], ["d"], {"op": int(ElementWiseOperation.PROD)})
    # "scale" is replaced by a node reading x directly; b now reads the renamed x
    splice(g, {id(scale): fused}, {id(twice)}, {"a": "x"})
    assert [n.name for n in g.nodes] == ["fused"]  # relu's a is read by nothing any more
    assert "a" not in g.values and "c" in g.constants
    g2 = _graph()
    before = list(g2.nodes)
    splice(g2, {}, set())
    assert g2.nodes == before


def test_splice_keeps_the_replaced_nodes_place() -> None:
    g = _graph()
    relu, twice, scale = g.nodes
    new_relu = Node("relu2", "activation", ["x"], ["a"], {"kind": int(ActivationType.SIGMOID)})
    splice(g, {id(relu): new_relu}, set())
    assert [n.name for n in g.nodes] == ["relu2", "twice", "scale"]
