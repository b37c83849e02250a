"""Device selection and the device storage of bfloat16, on the CPU (CI).

* :func:`trtcore.runtime.device.resolve_device` with CuPy absent (``sys.modules["cupy"] =
  None``), present without a GPU (a fake module), and present with one (a fake module);
  ``LLM(device=...)``.
* bfloat16 as ``uint16`` bit patterns (how CuPy holds it): the conversion helpers of
  :mod:`trtcore.reference.evaluator` run with NumPy as the array module and must equal
  ``ml_dtypes`` bit for bit on random and special values (NaN, inf, subnormals, ties,
  overflow).
* The evaluator's non-NumPy storage path (bfloat16 bits, data-moving layers on stored
  values, plugins on ``ml_dtypes`` views) run with NumPy under another module name
  (:data:`NUMPY_BITS`): every layer type must give bit-identical results to the NumPy
  path, since the arithmetic is the same and only the storage differs. The GPU tests
  (``tests/test_gpu_backend.py``) then only add what CuPy itself changes.

The network with every layer type (:func:`layer_network`) and its feeds
(:func:`layer_feeds`) are shared with the GPU tests.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import pytest
from trtcore.plugins.base import Plugin, create

import trtcore.reference as ref
from trtcore.errors import InvalidArgumentError
from trtcore.reference.evaluator import (
    bf16_bits_to_float32,
    evaluate,
    float32_to_bf16_bits,
)
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
from trtcore.runtime import device as dev
from trtcore.runtime.device import array_module, resolve_device, to_host
from trtcore.runtime.reference_executor import ReferenceExecutor

BF16 = np.dtype(ml_dtypes.bfloat16)

# ---------------------------------------------------------------------------------------
# resolve_device


def _fake_cupy(count: int | None) -> types.ModuleType:
    """A stand-in ``cupy`` whose runtime reports ``count`` devices (None: raises like
    ``cudaErrorNoDevice``)."""

    class CUDARuntimeError(RuntimeError):
        pass

    def get_device_count() -> int:
        if count is None:
            raise CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
        return count

    m = types.ModuleType("cupy")
    m.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=get_device_count, CUDARuntimeError=CUDARuntimeError))  # type: ignore[attr-defined]
    return m


@pytest.fixture
def no_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError


def test_cupy_absent_none_is_cpu(no_cupy: None) -> None:
    assert resolve_device(None) == "cpu"
    assert resolve_device() == "cpu"
    assert array_module(None) is np
    ok, why = dev.cuda_status()
    assert not ok and "not installed" in why


@pytest.mark.parametrize("spelling", ["cpu", "CPU", " cpu "])
def test_cpu_always_resolves(no_cupy: None, spelling: str) -> None:
    assert resolve_device(spelling) == "cpu"
    assert array_module(spelling) is np


@pytest.mark.parametrize("spelling", ["cuda", "gpu", "CUDA", "Gpu"])
def test_cupy_absent_cuda_raises_with_install_hint(no_cupy: None, spelling: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        resolve_device(spelling)
    msg = str(info.value)
    assert "trtcore[gpu]" in msg and "CuPy is not installed" in msg and "device='cpu'" in msg
    with pytest.raises(InvalidArgumentError):
        array_module(spelling)


@pytest.mark.parametrize("count", [None, 0])
def test_cupy_without_gpu(monkeypatch: pytest.MonkeyPatch, count: int | None) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count))
    assert resolve_device(None) == "cpu"
    assert array_module(None) is np
    with pytest.raises(InvalidArgumentError) as info:
        resolve_device("cuda")
    msg = str(info.value)
    assert "trtcore[gpu]" in msg
    assert ("no usable CUDA device" in msg and "cudaErrorNoDevice" in msg) if count is None else "no CUDA device" in msg


def test_cupy_with_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_cupy(2)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert resolve_device(None) == "cuda"
    assert resolve_device("gpu") == "cuda"
    assert resolve_device("cpu") == "cpu"
    assert array_module(None) is fake
    assert array_module("cpu") is np


def test_broken_cupy_import_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CuPy that fails to import for another reason (missing CUDA libraries) means no GPU."""

    class Loader:
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
            if name == "cupy":
                raise OSError("libcudart.so.13: cannot open shared object file")
            return None

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Loader(), *sys.meta_path])
    assert resolve_device(None) == "cpu"
    with pytest.raises(InvalidArgumentError, match=r"CuPy does not import \(OSError"):
        resolve_device("cuda")


@pytest.mark.parametrize("bad", ["tpu", "cuda:0", "", 0, True])
def test_unknown_device(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="device"):
        resolve_device(bad)


def test_tensorrt_backends_execute_on_the_gpu() -> None:
    from trtcore.llm import _execution_device

    for backend in ("tensorrt", "tensorrt_rtx"):
        assert _execution_device(backend, None) == "cuda"
        assert _execution_device(backend, "gpu") == "cuda"
        with pytest.raises(InvalidArgumentError, match="backend='reference'"):
            _execution_device(backend, "cpu")


# ---------------------------------------------------------------------------------------
# LLM(device=...)

from hf_models import ModelStore, hf_models  # noqa: F401  (hf_models is a fixture)


def test_llm_device_argument(hf_models: ModelStore, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from trtcore import LLM

    d = hf_models.dir("llama3_rope")
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(InvalidArgumentError, match=r"trtcore\[gpu\]"):
        LLM(d, backend="reference", device="cuda", progress=False)
    with pytest.raises(InvalidArgumentError, match="unknown device"):
        LLM(d, backend="reference", device="tpu", progress=False)
    llm = LLM(d, backend="reference", progress=False)  # None: no CuPy -> cpu
    assert llm.device == "cpu" and llm.executor.xp is np  # type: ignore[attr-defined]
    assert llm.build_config.dtype == "float32"
    llm = LLM(d, backend="reference", device="cpu", progress=False)
    assert llm.device == "cpu" and llm.executor.device == "cpu"  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------
# bfloat16 bit patterns against ml_dtypes (NumPy as the array module)


def _ml_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x, np.float32).astype(BF16).view(np.uint16)


def _special_float32() -> np.ndarray:
    f32 = np.float32
    base = [
        0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan,
        np.finfo(f32).max, -np.finfo(f32).max, np.finfo(f32).tiny, -np.finfo(f32).tiny,
        np.finfo(f32).smallest_subnormal, -np.finfo(f32).smallest_subnormal,
        float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), float(ml_dtypes.finfo(ml_dtypes.bfloat16).tiny),
        float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal),
    ]
    bits = [
        0x7F800001, 0xFF800001, 0x7FC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FBFFFFF, 0x7F80FFFF,  # NaNs: signalling, quiet, payloads
        0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0xFF7F8000,  # round up to inf / tie at the top / just below
        0x00000001, 0x00007FFF, 0x00008000, 0x00018000, 0x00008001, 0x007FFFFF, 0x00800000,  # subnormals and ties among them
        0x807FFFFF, 0x80008000, 0x80018000,
    ]
    # ties: low half exactly 0x8000 with even and odd kept bit, and one ulp either side
    rng = np.random.default_rng(1)
    hi = rng.integers(0, 0x7F7F, size=2000, dtype=np.uint32) << 16
    ties = np.concatenate([hi | 0x8000, (hi | 0x10000) | 0x8000, hi | 0x7FFF, hi | 0x8001, (hi | 0x8000) | 0x80000000])
    return np.concatenate([np.array(base, np.float32), np.array(bits, np.uint32).view(np.float32), ties.astype(np.uint32).view(np.float32)])


def test_float32_to_bf16_special_values() -> None:
    x = _special_float32()
    ours = float32_to_bf16_bits(x, np)
    assert ours.dtype == np.uint16 and ours.shape == x.shape
    bad = ours != _ml_bits(x)
    assert not bad.any(), [(hex(int(b)), hex(int(o)), hex(int(r))) for b, o, r in zip(x.view(np.uint32)[bad][:8], ours[bad][:8], _ml_bits(x)[bad][:8])]
    # named cases, independent of ml_dtypes
    def one(bits: int) -> int:
        return int(float32_to_bf16_bits(np.array([bits], np.uint32).view(np.float32), np)[0])

    assert one(0x3F808000) == 0x3F80  # tie, kept bit even: down
    assert one(0x3F818000) == 0x3F82  # tie, kept bit odd: up
    assert one(0x3F808001) == 0x3F81
    assert one(0x7F7FFFFF) == 0x7F80  # float32 max overflows to inf
    assert one(0x7F800001) == 0x7FC0 and one(0xFF800001) == 0xFFC0  # NaN: quiet, sign kept
    assert one(0x00008000) == 0x0000 and one(0x00018000) == 0x0002  # subnormal ties
    assert one(0x80000000) == 0x8000


@pytest.mark.parametrize("seed", range(3))
def test_float32_to_bf16_random(seed: int) -> None:
    rng = np.random.default_rng(seed)
    patterns = rng.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)  # any bits: NaN, inf, subnormal
    with np.errstate(over="ignore"):
        scaled = (rng.standard_normal(1 << 18) * np.exp2(rng.integers(-140, 128, size=1 << 18))).astype(np.float32)
    for x in (patterns, scaled, scaled.reshape(512, 512).T):  # a non-contiguous view too
        np.testing.assert_array_equal(float32_to_bf16_bits(x, np), _ml_bits(x))


def test_float64_and_float16_inputs_round_like_ml_dtypes() -> None:
    rng = np.random.default_rng(7)
    x64 = rng.standard_normal(1 << 16) * np.exp2(rng.integers(-30, 30, size=1 << 16))
    np.testing.assert_array_equal(float32_to_bf16_bits(x64, np), x64.astype(BF16).view(np.uint16))
    x16 = rng.standard_normal(1 << 12).astype(np.float16)
    np.testing.assert_array_equal(float32_to_bf16_bits(x16, np), x16.astype(BF16).view(np.uint16))


def test_bf16_bits_to_float32_every_pattern() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    ours = bf16_bits_to_float32(bits, np)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours.view(np.uint32), bits.view(BF16).astype(np.float32).view(np.uint32))
    # round trip of every non-NaN pattern is the identity; NaNs come back quiet with their sign
    back = float32_to_bf16_bits(ours, np)
    nan = np.isnan(ours)
    np.testing.assert_array_equal(back[~nan], bits[~nan])
    assert ((back[nan] & 0x7FFF) >= 0x7FC0).all() and ((back[nan] & 0x8000) == (bits[nan] & 0x8000)).all()


def test_to_host_views_bf16() -> None:
    bits = np.array([0x3F80, 0xC000], np.uint16)
    out = to_host(bits, ref.DataType.BF16)
    assert out.dtype == BF16 and out.astype(np.float32).tolist() == [1.0, -2.0]
    assert to_host(bits, BF16).dtype == BF16
    assert to_host(bits).dtype == np.uint16 and to_host(bits, ref.DataType.FLOAT).dtype == np.uint16

    class Device:  # anything with .get(), like a cupy.ndarray
        def get(self) -> np.ndarray:
            return bits

    assert to_host(Device(), ref.DataType.BF16).dtype == BF16


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
    runs with CuPy on the raw device pointers (bfloat16 as 16-bit patterns)."""

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
            xf = bf16_bits_to_float32(x, cupy) if bf16 else x.astype(cupy.float32)
            y = xf * cupy.float32(self.scale) + cupy.float32(1)
            wrap(o)[...] = float32_to_bf16_bits(y, cupy) if bf16 else y.astype(store)


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


#: NumPy under another module name: the evaluator then uses its non-NumPy storage
#: (bfloat16 as uint16 bits, data-moving layers on stored values, plugins on views)
NUMPY_BITS = types.ModuleType("numpy_bits")
NUMPY_BITS.__getattr__ = lambda name: getattr(np, name)  # type: ignore[method-assign]


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def test_layer_network_covers_every_layer_and_op() -> None:
    net, kinds = layer_network("BF16")
    assert {type(layer) for layer in net._layers} == LAYER_TYPES
    names = set(kinds)
    for enum, prefix in ((ref.UnaryOperation, "unary"), (ref.ElementWiseOperation, "elementwise"),
                         (ref.ActivationType, "activation"), (ref.ReduceOperation, "reduce")):
        assert {f"{prefix}.{op.name}" for op in enum} <= names


@pytest.mark.parametrize("float_name", FLOAT_NAMES)
def test_bits_storage_equals_numpy_bit_for_bit(float_name: str) -> None:
    net, _ = layer_network(float_name)
    feeds = layer_feeds(net, seed=3)
    with np.errstate(all="ignore"):
        want = evaluate(net, feeds, xp=np)
        got = evaluate(net, feeds, xp=NUMPY_BITS)
    assert set(got) == set(want)
    for name, w in want.items():
        g = to_host(got[name], net.tensor(name).dtype)
        if net.tensor(name).dtype == ref.DataType.BF16:
            assert np.asarray(got[name]).dtype == np.uint16, name  # stored as bits
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_array_equal(_bytes(g), _bytes(w), err_msg=name)


def test_bits_executor_feeds_and_constants_cache() -> None:
    net, _ = layer_network("BF16")
    feeds = layer_feeds(net, seed=4)
    feeds["p"] = feeds["p"].astype(np.float32)  # the executor rounds float feeds to bfloat16
    ex_np, ex_bits = ReferenceExecutor(net), ReferenceExecutor(net, xp=NUMPY_BITS)
    with np.errstate(all="ignore"):
        want = ex_np.run(feeds)
        for _ in range(2):  # second run: constants come from the cache
            got = ex_bits.to_host(ex_bits.run(feeds))
            for name, w in want.items():
                np.testing.assert_array_equal(_bytes(got[name]), _bytes(w), err_msg=name)
    assert ex_bits._constants and all(np.asarray(v).dtype == np.uint16 for v in ex_bits._constants.values() if v.size == 8)


def test_gather_range_is_checked_on_numpy() -> None:
    net, _ = layer_network("FLOAT", with_plugin=False)
    feeds = layer_feeds(net, seed=5)
    feeds["idx32"][0, 0] = 3  # axis 1 has 3 entries
    with pytest.raises(Exception, match="out of range"), np.errstate(all="ignore"):
        evaluate(net, feeds, xp=np)


def test_generate_with_bits_storage_equals_numpy(hf_models: ModelStore) -> None:  # noqa: F811
    """The generate loop on the non-NumPy storage (bfloat16 KV cache as bits) gives the same
    tokens and log-probabilities as on NumPy, with batch compaction (different lengths)."""
    from trtcore import LLM, SamplingParams

    llm = LLM(hf_models.dir("qwen2_mixed_swa"), backend="reference", device="cpu", dtype="bfloat16", progress=False)
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, 160, n)] for n in (40, 17)]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=3) for n in (4, 9)]
    want = llm.generate(prompts, params)
    llm.executor.xp = NUMPY_BITS  # type: ignore[attr-defined]
    llm.executor._constants = {}  # type: ignore[attr-defined]
    got = llm.generate(prompts, params)
    for w, g in zip(want, got):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert [{k: v.logprob for k, v in d.items()} for d in g.outputs[0].logprobs] == [{k: v.logprob for k, v in d.items()} for d in w.outputs[0].logprobs]
