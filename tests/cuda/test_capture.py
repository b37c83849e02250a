"""``capture=`` on the cuda backend, on the CPU: tensors named at build time become engine
outputs under their own names (the GPU tests read them after a run and compare them with the
reference executor's ``run(feeds, capture=...)``, tests/cuda/test_oracle_gpu.py).

* a captured tensor is an output of the engine with the network tensor's name, dtype and
  shape; the network's own outputs stay; ``Plan.stats["captured"]`` lists what was added;
* a value inside a fused kernel (an RMS norm's variance) is written by the kernels too;
* ``"all"`` makes every layer output (constants aside) an output, also of a whole model;
* bad names are refused, naming the tensor; the launches of an execution write the captured
  tensor's bound address, and a missing address is refused like any output's.
"""

from __future__ import annotations

import pytest
from netutil import compile_net, rms_norm_net

from trtcore.reference.network import IConstantLayer
from trtcore.cuda.runtime import EngineExecutionError, ICudaEngine
from trtcore.errors import NetworkError

PROFILE = {"a": ((1, 64), (4, 64), (16, 64)), "b": ((1, 64), (4, 64), (16, 64))}


def _io(engine: ICudaEngine) -> dict[str, str]:
    return {engine.get_tensor_name(i): engine.get_tensor_mode(engine.get_tensor_name(i)).name for i in range(engine.num_io_tensors)}


def test_captured_tensors_are_engine_outputs_by_name() -> None:
    net, _ = rms_norm_net()
    names = ["norm.variance", "norm.rsqrt"]
    plan = compile_net(net, PROFILE, capture=names)
    engine = ICudaEngine(plan)
    assert _io(engine) == {"a": "INPUT", "b": "INPUT", "y": "OUTPUT", "residual": "OUTPUT", "norm.variance": "OUTPUT", "norm.rsqrt": "OUTPUT"}
    assert plan.stats["captured"] == names
    for name in names:
        t = net.tensor(name)
        assert engine.get_tensor_dtype(name) == t.dtype
        assert engine.get_tensor_shape(name) == tuple(t.shape)


def test_a_value_inside_a_fused_kernel_is_written_by_it() -> None:
    """The variance lives only in registers of the fused norm kernel; captured, the kernel (or
    a copy after it) writes it to memory, and the norm's output is still computed."""
    net, _ = rms_norm_net()
    plain = compile_net(net, PROFILE)
    assert [n.op for n in plain.graph.nodes] == ["row_group"]
    plan = compile_net(net, PROFILE, capture="norm.variance")
    writers = [n for n in plan.graph.nodes if "norm.variance" in n.outputs]
    assert len(writers) == 1 and writers[0].op == "copy"
    (source,) = writers[0].inputs
    producers = {v: n for n in plan.graph.nodes for v in n.outputs}
    while producers[source].op == "view":
        source = producers[source].inputs[0]
    assert producers[source].op == "row_group"
    assert any("y" in n.outputs for n in plan.graph.nodes)


def test_capturing_an_output_changes_nothing() -> None:
    net, _ = rms_norm_net()
    plain = compile_net(net, PROFILE)
    plan = compile_net(net, PROFILE, capture=["residual", "y"])
    assert plan.stats["captured"] == []
    assert [(n.op, n.outputs) for n in plan.graph.nodes] == [(n.op, n.outputs) for n in plain.graph.nodes]


def test_capture_all_of_every_layer_type() -> None:
    from test_device_select import layer_network

    net, _ = layer_network("BF16")
    plan = compile_net(net, arch=None, capture="all")
    net._refresh()
    want = {t.name for layer in net._layers if not isinstance(layer, IConstantLayer) for t in layer._outputs} | {t.name for t in net._outputs}
    assert set(plan.graph.outputs) == want
    assert set(ICudaEngine(plan)._io) == want | {t.name for t in net._inputs}


def test_capture_all_of_a_model_compiles() -> None:
    from netutil import llama_plan

    plain, d = llama_plan(layers=2)
    from trtcore.builder import _builder_config
    from trtcore.cuda.builder import compile_network

    plan = compile_network(d.network, _builder_config(d, None), None, arch="sm_90", capture="all")
    hidden = "model.layers.1.input_layernorm"  # a norm's output inside a decoder layer
    assert any(o.startswith(hidden) for o in plan.graph.outputs)
    assert set(plain.graph.outputs) <= set(plan.graph.outputs)
    assert len(plan.kernels) > len(plain.kernels)  # captured values break fusion only where read


@pytest.mark.parametrize(
    ("name", "why"),
    [("nope", "no tensor 'nope'"), ("a", "'a' is a network input"), ("norm.weight", "'norm.weight' is a constant")],
)
def test_bad_capture_names_are_refused(name: str, why: str) -> None:
    net, _ = rms_norm_net()
    with pytest.raises(NetworkError, match=why):
        compile_net(net, PROFILE, capture=[name])


def test_launches_write_the_captured_address() -> None:
    net, _ = rms_norm_net()
    engine = ICudaEngine(compile_net(net, PROFILE, capture=["norm.variance"]))
    ctx = engine.create_execution_context_without_device_memory()
    ctx.set_device_memory(1 << 40, engine.device_memory_size_v2)
    addresses = {"a": 1 << 30, "b": 2 << 30, "y": 3 << 30, "residual": 4 << 30}
    for name in ("a", "b"):
        assert ctx.set_input_shape(name, (5, 64))
    for name, ptr in addresses.items():
        assert ctx.set_tensor_address(name, ptr)
    with pytest.raises(EngineExecutionError, match="no address set for tensor 'norm.variance'"):
        ctx.prepare({c: 1 << 38 for c in engine.plan.graph.constants})
    assert ctx.get_tensor_shape("norm.variance") == (5, 1)
    assert ctx.set_tensor_address("norm.variance", 5 << 30)
    steps = ctx.prepare({c: 1 << 38 for c in engine.plan.graph.constants})
    written = [s.name for s in steps if s.kind == "kernel" and (5 << 30, "ptr") in s.args]
    assert written, [(s.kind, s.name, s.args) for s in steps]
