"""Where each backend executes, and the network with every layer type, on the CPU (CI).

* :func:`trtcore.runtime.device.resolve_device`: the reference backend is the NumPy oracle on
  the CPU (``device="cuda"`` is refused with a pointer to ``backend="cuda"``, also where a GPU
  and CuPy are there); the GPU backends refuse ``"cpu"``; ``LLM(device=...)``.
* The network with every layer type (:func:`layer_network`) and its feeds
  (:func:`layer_feeds`), shared with the cuda engine's GPU tests, which compare the engine
  with the reference on them (tests/test_gpu_backend.py, tests/cuda/).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import pytest

import trtcore.reference as ref
from trtcore.errors import InvalidArgumentError
from trtcore.plugins.base import Plugin, create
from trtcore.reference.evaluator import evaluate
from trtcore.reference.network import (
    IActivationLayer,
    IAttention,
    ICastLayer,
    IConcatenationLayer,
    IConstantLayer,
    IElementWiseLayer,
    IGatherLayer,
    IIdentityLayer,
    IKVCacheUpdateLayer,
    IMatrixMultiplyLayer,
    IPluginV3Layer,
    IReduceLayer,
    ISelectLayer,
    IShuffleLayer,
    ISoftMaxLayer,
    IUnaryLayer,
)
from trtcore.runtime.device import resolve_device

BF16 = np.dtype(ml_dtypes.bfloat16)

# ---------------------------------------------------------------------------------------
# resolve_device


def _fake_cupy(count: int) -> types.ModuleType:
    """A stand-in ``cupy`` whose runtime reports ``count`` devices."""
    m = types.ModuleType("cupy")
    m.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: count))  # type: ignore[attr-defined]
    return m


@pytest.mark.parametrize("spelling", [None, "cpu", "CPU", " cpu "])
def test_reference_runs_on_the_cpu(spelling: str | None) -> None:
    assert resolve_device("reference", spelling) == "cpu"


@pytest.mark.parametrize("spelling", ["cuda", "gpu", "CUDA", "Gpu"])
def test_reference_on_cuda_points_to_the_cuda_backend(monkeypatch: pytest.MonkeyPatch, spelling: str) -> None:
    """Refused even where CuPy sees a GPU: the CuPy evaluator is retired."""
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(2))
    with pytest.raises(InvalidArgumentError) as info:
        resolve_device("reference", spelling)
    msg = str(info.value)
    assert "backend='cuda'" in msg and "trtcore[gpu]" in msg and "device='cpu'" in msg and repr(spelling) in msg


@pytest.mark.parametrize("bad", ["tpu", "cuda:0", "", 0, True])
def test_unknown_device(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="device"):
        resolve_device("reference", bad)


def test_tensorrt_backends_execute_on_the_gpu() -> None:
    for backend in ("tensorrt", "tensorrt_rtx", "cuda"):
        assert resolve_device(backend, None) == "cuda"
        assert resolve_device(backend, "gpu") == "cuda"
        with pytest.raises(InvalidArgumentError, match="backend='reference'"):
            resolve_device(backend, "cpu")


# ---------------------------------------------------------------------------------------
# LLM(device=...)

from hf_models import ModelStore, hf_models  # noqa: F401, E402  (hf_models is a fixture)


def test_llm_device_argument(hf_models: ModelStore, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from trtcore import LLM

    d = hf_models.dir("llama3_rope")
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(InvalidArgumentError, match=r"trtcore\[gpu\]"):
        LLM(d, backend="reference", device="cuda", progress=False)
    with pytest.raises(InvalidArgumentError, match="unknown device"):
        LLM(d, backend="reference", device="tpu", progress=False)
    llm = LLM(d, backend="reference", progress=False)  # None: the CPU
    assert llm.device == "cpu" and llm.executor.xp is np  # type: ignore[attr-defined]
    assert llm.build_config.dtype == "float32"
    llm = LLM(d, backend="reference", device="cpu", progress=False)
    assert llm.device == "cpu" and llm.executor.device == "cpu"  # type: ignore[attr-defined]


def test_llm_reference_on_a_gpu_machine_points_to_cuda(hf_models: ModelStore, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """With CuPy seeing a GPU, LLM(backend="reference", device="cuda") is refused before any build."""
    from trtcore import LLM

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(1))
    with pytest.raises(InvalidArgumentError, match="backend='cuda'"):
        LLM(hf_models.dir("llama3_rope"), backend="reference", device="gpu", progress=False)


# ---------------------------------------------------------------------------------------
# a network with every layer type, shared with the GPU tests

SHAPE = (2, 3, 4, 8)
FLOAT_NAMES = ("FLOAT", "HALF", "BF16")
#: every layer class the evaluator implements
LAYER_TYPES = {
    IConstantLayer, IElementWiseLayer, IUnaryLayer, IActivationLayer, IReduceLayer, ISoftMaxLayer,
    IConcatenationLayer, IShuffleLayer, IMatrixMultiplyLayer, IGatherLayer, ICastLayer, IIdentityLayer,
    ISelectLayer, IPluginV3Layer, IAttention, IKVCacheUpdateLayer,
}


@dataclass
class AffinePlugin(Plugin):
    """``y = scale * x + 1`` in float32, rounded to x's type: a test plugin whose ``enqueue``
    runs with CuPy on the raw device pointers (bfloat16 as 16-bit patterns), inside the cuda
    engine in the GPU tests."""

    plugin_name: ClassVar[str] = "TestAffine"
    plugin_version: ClassVar[str] = "1"
    num_outputs: ClassVar[int] = 1
    #: dtypes ``enqueue`` was given (the GPU test checks bf16 arrives as ml_dtypes.bfloat16)
    seen: ClassVar[list[tuple[np.dtype, np.dtype]]] = []

    scale: float = 2.0

    def output_dtypes(self, input_dtypes: Any) -> list[np.dtype]:
        return [np.dtype(input_dtypes[0])]

    def output_shapes(self, input_shapes: Any) -> list[list[Any]]:
        return [list(input_shapes[0])]

    def reference(self, *inputs: np.ndarray) -> list[np.ndarray]:
        (x,) = inputs
        return [(x.astype(np.float32) * np.float32(self.scale) + np.float32(1)).astype(x.dtype)]

    def enqueue(self, inputs: Any, outputs: Any, workspace: int, stream: int) -> None:
        import cupy

        (i,), (o,) = inputs, outputs
        AffinePlugin.seen.append((np.dtype(i.dtype), np.dtype(o.dtype)))
        bf16 = np.dtype(i.dtype) == BF16
        store = np.dtype(np.uint16) if bf16 else np.dtype(i.dtype)

        def wrap(t: Any) -> Any:
            mem = cupy.cuda.UnownedMemory(t.ptr, int(np.prod(t.shape)) * store.itemsize, None, cupy.cuda.Device().id)
            return cupy.ndarray(tuple(t.shape), store, cupy.cuda.MemoryPointer(mem, 0))

        with cupy.cuda.ExternalStream(stream) if stream else cupy.cuda.Stream.null:
            x = wrap(i)
            xf = (x.astype(cupy.uint32) << 16).view(cupy.float32) if bf16 else x.astype(cupy.float32)  # bf16 bits are float32's top half
            y = xf * cupy.float32(self.scale) + cupy.float32(1)
            wrap(o)[...] = _bf16_bits(cupy, y) if bf16 else y.astype(store)


def _bf16_bits(xp: Any, y: Any) -> Any:
    """float32 -> bfloat16 bit patterns, round to nearest even; NaN -> quiet NaN with its sign."""
    u = xp.ascontiguousarray(y).view(xp.uint32)
    rounded = (u + (xp.uint32(0x7FFF) + ((u >> xp.uint32(16)) & xp.uint32(1)))) >> xp.uint32(16)
    nan = (u & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    return xp.where(nan, ((u >> xp.uint32(16)) & xp.uint32(0x8000)) | xp.uint32(0x7FC0), rounded).astype(xp.uint16)


def layer_network(float_name: str, with_plugin: bool = True) -> tuple[Any, dict[str, Any]]:
    """A reference network with every layer type and every enum member the evaluator
    implements, its float tensors of type ``float_name``; each output is one layer applied
    to network inputs or constants (so the only difference between two evaluations of a
    layer is that layer's own arithmetic). Returns ``(network, {output: layer kind})``."""
    m = ref
    dt = getattr(m.DataType, float_name)
    np_dt = np.dtype(m.nptype(dt))
    net = m.Builder(m.Logger(m.Logger.ERROR)).create_network(1 << int(m.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    kinds: dict[str, Any] = {}

    def inp(name: str, t: Any, shape: tuple[int, ...] = SHAPE) -> Any:
        return net.add_input(name, t, shape)

    def out(tensor: Any, name: str, kind: Any) -> None:
        tensor.name = name
        net.mark_output(tensor)
        kinds[name] = kind

    x, y, p, u, g, s = (inp(n, dt) for n in "xypugs")
    mb = inp("mb", dt, (2, 3, 8, 5))
    c, ba, bb = inp("c", m.DataType.BOOL), inp("ba", m.DataType.BOOL), inp("bb", m.DataType.BOOL)
    ia, ib = inp("ia", m.DataType.INT32), inp("ib", m.DataType.INT32)
    idx32 = inp("idx32", m.DataType.INT32, (2, 2))
    idx64 = inp("idx64", m.DataType.INT64, (5,))

    U = m.UnaryOperation
    domain = {U.LOG: p, U.SQRT: p, U.RECIP: y, U.TAN: u, U.ASIN: u, U.ACOS: u, U.ATANH: u, U.ACOSH: g}
    for op in U:
        if op == U.NOT:
            out(net.add_unary(ba, op).get_output(0), "unary.NOT", U)
            continue
        out(net.add_unary(domain.get(op, x), op).get_output(0), f"unary.{op.name}", U)
        if op in (U.ISINF, U.ISNAN, U.ABS, U.NEG, U.SIGN):
            out(net.add_unary(s, op).get_output(0), f"unary.{op.name}.special", U)
    for op in (U.ABS, U.NEG, U.SIGN):
        out(net.add_unary(ia, op).get_output(0), f"unary.{op.name}.int", U)

    E = m.ElementWiseOperation
    for eop in E:
        if eop in (E.AND, E.OR, E.XOR):
            out(net.add_elementwise(ba, bb, eop).get_output(0), f"elementwise.{eop.name}", E)
            continue
        a, b = (p, x) if eop == E.POW else (x, y)
        out(net.add_elementwise(a, b, eop).get_output(0), f"elementwise.{eop.name}", E)
        if eop != E.POW:
            out(net.add_elementwise(ia, ib, eop).get_output(0), f"elementwise.{eop.name}.int", E)
    out(net.add_elementwise(ba, bb, E.EQUAL).get_output(0), "elementwise.EQUAL.bool", E)
    bias = np.random.default_rng(11).standard_normal((1, 1, 1, 8)).astype(np_dt)
    const = net.add_constant((1, 1, 1, 8), m.Weights(bias)).get_output(0)
    out(net.add_elementwise(x, const, E.SUM).get_output(0), "elementwise.SUM.broadcast_constant", E)
    const2 = net.add_constant((1, 1, 1, 8), m.Weights(bias)).get_output(0)
    out(const2, "constant", IConstantLayer)

    A = m.ActivationType
    for aop in A:
        layer = net.add_activation(x, aop)
        if aop == A.CLIP:
            layer.alpha, layer.beta = -0.5, 0.75
        if aop == A.LEAKY_RELU:
            layer.alpha = 0.1
        out(layer.get_output(0), f"activation.{aop.name}", A)
    out(net.add_activation(ia, A.RELU).get_output(0), "activation.RELU.int", A)

    R = m.ReduceOperation
    for rop in R:
        # sums and products of a few positive terms (no cancellation; float32 summation order
        # differences stay far below 1e-6); max/min are exact, so they reduce over two axes
        src = x if rop in (R.MAX, R.MIN) else p
        out(net.add_reduce(src, rop, 0b1010 if rop in (R.MAX, R.MIN) else 0b1000, True).get_output(0), f"reduce.{rop.name}", R)
        out(net.add_reduce(src, rop, 0b0100, False).get_output(0), f"reduce.{rop.name}.drop", R)
    out(net.add_reduce(ia, R.SUM, 0b1000, False).get_output(0), "reduce.SUM.int", R)

    sm = net.add_softmax(x)
    out(sm.get_output(0), "softmax.default_axis", ISoftMaxLayer)
    sm = net.add_softmax(x)
    sm.axes = 1 << 3
    out(sm.get_output(0), "softmax.last", ISoftMaxLayer)

    cat = net.add_concatenation([x, y, s])
    cat.axis = 2
    out(cat.get_output(0), "concat", IConcatenationLayer)
    out(net.add_concatenation([ia, ib]).get_output(0), "concat.int", IConcatenationLayer)

    sh = net.add_shuffle(s)
    sh.first_transpose = (0, 2, 1, 3)
    sh.reshape_dims = (0, 0, -1)
    sh.second_transpose = (2, 0, 1)
    out(sh.get_output(0), "shuffle", IShuffleLayer)

    M = m.MatrixOperation
    out(net.add_matrix_multiply(x, M.NONE, mb, M.NONE).get_output(0), "matmul", IMatrixMultiplyLayer)
    out(net.add_matrix_multiply(x, M.TRANSPOSE, y, M.NONE).get_output(0), "matmul.t0", IMatrixMultiplyLayer)
    out(net.add_matrix_multiply(x, M.NONE, y, M.TRANSPOSE).get_output(0), "matmul.t1", IMatrixMultiplyLayer)

    out(net.add_gather(s, idx32, 1).get_output(0), "gather.int32", IGatherLayer)
    out(net.add_gather(x, idx64, 3).get_output(0), "gather.int64", IGatherLayer)

    for to in ("FLOAT", "HALF", "BF16", "INT32", "INT64", "BOOL"):
        out(net.add_cast(x, getattr(m.DataType, to)).get_output(0), f"cast.{to}", ICastLayer)
    out(net.add_cast(s, m.DataType.FLOAT).get_output(0), "cast.FLOAT.special", ICastLayer)
    out(net.add_cast(ia, dt).get_output(0), "cast.from_int32", ICastLayer)
    out(net.add_cast(c, dt).get_output(0), "cast.from_bool", ICastLayer)

    out(net.add_identity(s).get_output(0), "identity", IIdentityLayer)
    out(net.add_select(c, x, s).get_output(0), "select", ISelectLayer)

    # KV cache update: cache [2, 1, 6, 8] (a network input, updated in place), 4 new tokens
    kv_out = net.add_kv_cache_update(inp("kvc", dt, (2, 1, 6, 8)), inp("kvu", dt, (2, 1, 4, 8)), inp("kvw", m.DataType.INT32, (2,)),
                                     m.KVCacheMode.LINEAR).get_output(0)
    out(kv_out, "kv_cache_update", IKVCacheUpdateLayer)
    # attention: q = u [2, 3, 4, 8] (3 query heads), k / v [2, 1, 6, 8] (MQA); |q|, |k|, |v|
    # and the float mask below 0.9 keep float32 rounding well below the GPU comparison's 1e-6
    ak, av = inp("ak", dt, (2, 1, 6, 8)), inp("av", dt, (2, 1, 6, 8))
    AN, CK = m.AttentionNormalizationOp, m.CausalMaskKind
    am = inp("am", m.DataType.BOOL, (2, 1, 4, 6))
    layer = net.add_attention_v2(u, ak, av, AN.SOFTMAX, CK.NONE)
    layer.mask = am
    out(layer.get_output(0), "attention.bool_mask", IAttention)
    layer = net.add_attention_v2(u, ak, av, AN.SOFTMAX, CK.NONE)
    layer.mask = inp("afm", dt, (1, 3, 4, 6))
    out(layer.get_output(0), "attention.float_mask_per_head", IAttention)
    for kind in (CK.UPPER_LEFT, CK.LOWER_RIGHT):
        out(net.add_attention_v2(u, ak, av, AN.SOFTMAX, kind).get_output(0), f"attention.causal.{kind.name}", IAttention)
    layer = net.add_attention_v2(u, ak, av, AN.SOFTMAX, CK.NONE)
    layer.key_value_lengths = inp("akl", m.DataType.INT32, (2,))
    out(layer.get_output(0), "attention.key_value_lengths", IAttention)
    layer = net.add_attention_v2(u, ak, av, AN.NONE, CK.NONE)
    layer.mask = am
    out(layer.get_output(0), "attention.norm_none", IAttention)

    if with_plugin:
        plugin_layer = net.add_plugin_v3([x], [], create(AffinePlugin(scale=1.5), m))
        out(plugin_layer.get_output(0), "plugin", IPluginV3Layer)
    return net, kinds


def layer_feeds(net: Any, seed: int) -> dict[str, np.ndarray]:
    """Random host feeds in each input's dtype; domain-limited where the unary ops need it;
    ``s`` holds special values (inf, NaN, signed zeros, subnormals of the float type)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for t in net._inputs:
        dt = np.dtype(ref.nptype(t.dtype))
        shape = t.shape
        if t.dtype == ref.DataType.BOOL:
            a = rng.random(shape) < 0.5
        elif t.name == "ia":
            a = rng.integers(-50, 50, shape)
        elif t.name == "ib":
            a = rng.integers(1, 9, shape) * rng.choice([-1, 1], shape)
        elif t.name == "idx32":
            a = rng.integers(0, 3, shape)
        elif t.name == "idx64":
            a = rng.integers(0, 8, shape)
        elif t.name == "kvw":
            a = rng.integers(0, 3, shape)  # 4 new tokens into 6 slots
        elif t.name == "akl":
            a = rng.integers(1, 7, shape)
        elif t.name in ("ak", "av", "afm"):
            a = rng.uniform(-0.9, 0.9, shape)
        elif t.name == "p":
            a = rng.uniform(0.5, 3.0, shape)
        elif t.name == "y":
            a = rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape)
        elif t.name == "u":
            a = rng.uniform(-0.9, 0.9, shape)
        elif t.name == "g":
            a = rng.uniform(1.1, 3.0, shape)
        elif t.name == "s":
            tiny = float(ml_dtypes.finfo(dt).smallest_subnormal) if dt == BF16 else float(np.finfo(dt).smallest_subnormal)
            special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, tiny, -3 * tiny, 1.0])
            a = rng.standard_normal(shape)
            a.reshape(-1)[: special.size * 8] = np.tile(special, 8)
        else:
            a = rng.standard_normal(shape) * 1.5
        feeds[t.name] = np.asarray(a).astype(dt)
    return feeds


def test_layer_network_covers_every_layer_and_op() -> None:
    net, kinds = layer_network("BF16")
    assert {type(layer) for layer in net._layers} == LAYER_TYPES
    names = set(kinds)
    for enum, prefix in ((ref.UnaryOperation, "unary"), (ref.ElementWiseOperation, "elementwise"),
                         (ref.ActivationType, "activation"), (ref.ReduceOperation, "reduce")):
        assert {f"{prefix}.{op.name}" for op in enum} <= names


def test_gather_range_is_checked_on_numpy() -> None:
    net, _ = layer_network("FLOAT", with_plugin=False)
    feeds = layer_feeds(net, seed=5)
    feeds["idx32"][0, 0] = 3  # axis 1 has 3 entries
    with pytest.raises(Exception, match="out of range"), np.errstate(all="ignore"):
        evaluate(net, feeds)
