"""TensorRTExecutor: typing against tensorrt-stubs, CPU-side checks, and the engine on a GPU.

* mypy checks trtcore's TensorRT calls against ``tensorrt-stubs`` (a repaired copy: the
  10.13 stubs are not PEP 561-discoverable and do not parse; see ``_repair_stubs``).
* a tiny strongly typed network (dynamic dims, matmul with a constant, an optimization
  profile) is built with ``tensorrt_rtx`` on the CPU; without a GPU the executor must fail
  with a clear CUDA error, with one (marker ``gpu``) it must match NumPy.
* the CUDA plumbing (buffer pool, copies, stream) is exercised on a GPU with a fake
  TensorRT module whose "engine" copies its input to its output (marker ``gpu``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import runtime as cudart

from trtcore.errors import BackendNotAvailableError
from trtcore.runtime.executor import Executor
from trtcore.runtime.trt_executor import (
    CudaError,
    DeviceBufferPool,
    TensorRTExecutor,
    check_input,
    cuda_check,
    numpy_dtype,
)
from trtcore.trt import load_trt

REPO = Path(__file__).resolve().parents[1]
STUB_FILES = ["tensorrt/__init__.pyi", "tensorrt_bindings/__init__.pyi", "tensorrt_bindings/tensorrt.pyi"]


# --- helpers ------------------------------------------------------------------------------


def _cuda_device_count() -> int:
    err, count = cudart.cudaGetDeviceCount()
    return int(count) if err == cudart.cudaError_t.cudaSuccess else 0


def _compute_capability(device: int = 0) -> tuple[int, int]:
    props = cuda_check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    return int(props.major), int(props.minor)


def _trt_module(backend: str) -> Any:
    """``load_trt(backend)`` if it is a real TensorRT module, else skip."""
    try:
        module = load_trt(backend)
    except BackendNotAvailableError as exc:
        pytest.skip(f"{backend} is not installed: {exc}")
    if not hasattr(module, "Builder"):  # e.g. tensorrt-stubs' bare `tensorrt` namespace package
        pytest.skip(f"{backend} imports but is no TensorRT runtime ({module!r})")
    return module


def _build_matmul_engine(trt: Any, weight: np.ndarray, *, compute_capability: str | None = "SM89") -> bytes:
    """y[b, s, :] = x[b, s, :] @ weight, with x of shape (-1, -1, K): strongly typed, one profile."""
    k, n = weight.shape
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    x = network.add_input("x", trt.float32, (-1, -1, k))
    w = network.add_constant((1, k, n), trt.Weights(np.ascontiguousarray(weight.reshape(1, k, n))))
    mm = network.add_matrix_multiply(x, trt.MatrixOperation.NONE, w.get_output(0), trt.MatrixOperation.NONE)
    y = mm.get_output(0)
    y.name = "y"
    network.mark_output(y)
    config = builder.create_builder_config()
    if compute_capability is not None:  # TensorRT-RTX: ahead of time, no GPU needed
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, compute_capability), 0)
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 1, k), (2, 4, k), (4, 16, k))
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    assert serialized is not None, "build_serialized_network returned None"
    return bytes(serialized)


# --- mypy against tensorrt-stubs ------------------------------------------------------------


def _split_params(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return parts


def _repair_def_line(line: str) -> str:
    # a parameter named after a keyword (`in`) -> `in_`
    line = re.sub(r"([(,]\s*)(in|from|is|lambda|def|class|for|with|as|not|and|or|if|else|pass|return)(\s*:)", r"\1\2_\3", line)
    m = re.match(r"^(\s*def \w+\()(.*)(\)\s*(?:->.*)?:\s*)$", line)
    if m:  # a parameter without a default after one with a default -> `= ...`
        params = _split_params(m.group(2))
        seen_default = False
        for i, param in enumerate(params):
            bare = param.strip()
            if bare.startswith("*"):
                break
            if "=" in bare.split(":")[-1]:
                seen_default = True
            elif seen_default and bare != "/":
                params[i] = param + " = ..."
        line = m.group(1) + ",".join(params) + m.group(3)
    return line


def _unshadow_bool(lines: list[str]) -> list[str]:
    # tensorrt_bindings/tensorrt.pyi declares `bool: DataType`, which shadows the builtin in
    # every `-> bool` annotation (mypy then treats them as errors / Any)
    out = [
        line if re.match(r"^bool\s*:", line) else re.sub(r"(?<![\w.'\"`])bool(?![\w'\"`])", "builtins.bool", line)
        for line in lines
    ]
    first_import = next(i for i, line in enumerate(out) if line.startswith("import "))
    return out[:first_import] + ["import builtins"] + out[first_import:]


_SEQUENCE = "tuple[int, ...] | list[int]"


def _accept_sequences(lines: list[str]) -> list[str]:
    # "Dims and all derived classes behave like Python tuples; the TensorRT API implicitly
    # converts Python iterables to Dims" (the stubs' own docstring), and so for Permutation:
    # parameters and attribute setters take tuples and lists, and both types iterate.
    out: list[str] = []
    for line in lines:
        m = re.match(r"^(\s+)(\w+): (Dims|Permutation)\s*$", line)
        if m:
            ind, name, typ = m.groups()
            out += [
                f"{ind}@property",
                f"{ind}def {name}(self) -> {typ}: ...",
                f"{ind}@{name}.setter",
                f"{ind}def {name}(self, value: {typ} | {_SEQUENCE}) -> None: ...",
            ]
            continue
        if re.match(r"^\s*def ", line):
            line = re.sub(r"(\w+: )(Dims|Permutation)(?=[,)=\s])", rf"\1\2 | {_SEQUENCE}", line)
        out.append(line)
        if re.match(r"^class (Dims|Permutation)\b.*:\s*$", line):
            out.append("    def __iter__(self) -> typing.Iterator[int]: ...")
    return out


def _repair_stubs(site: Path, dst: Path) -> None:
    """Copy tensorrt-stubs 10.13 to ``dst`` and repair what keeps mypy from reading them.

    Installed as they are, the stubs are ``tensorrt/__init__.pyi`` without ``py.typed``, so
    mypy skips them (and with ``ignore_missing_imports`` every TensorRT type is silently
    ``Any``); put on MYPYPATH, their syntax errors (parameters named ``in``, a non-default
    parameter after defaults) stop mypy. Two more repairs keep mypy from false alarms: the
    module's ``bool: DataType`` shadows the builtin in every ``-> bool``, and ``Dims`` /
    ``Permutation`` are declared without the tuple/list conversions TensorRT performs.
    """
    for rel in STUB_FILES:
        lines = (site / rel).read_text().splitlines()
        for _ in range(1000):
            try:
                ast.parse("\n".join(lines), filename=rel)
                break
            except SyntaxError as exc:
                n = (exc.lineno or 1) - 1
                fixed = _repair_def_line(lines[n])
                if fixed == lines[n]:
                    raise AssertionError(f"cannot repair {site / rel}:{n + 1} ({exc.msg}): {lines[n]!r}") from exc
                lines[n] = fixed
        if rel == "tensorrt_bindings/tensorrt.pyi":
            lines = _accept_sequences(_unshadow_bool(lines))
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def trt_stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        dist = importlib.metadata.distribution("tensorrt-stubs")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tensorrt-stubs is not installed (pip install tensorrt-stubs)")
    site = Path(str(dist.locate_file("")))
    missing = [rel for rel in STUB_FILES if not (site / rel).is_file()]
    assert not missing, f"tensorrt-stubs {dist.version} lacks {missing} under {site}"
    dst = tmp_path_factory.mktemp("trt_stubs")
    _repair_stubs(site, dst)
    return dst


def _mypy(stubs: Path, cache: Path, *files: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MYPYPATH": str(stubs)}
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
           "--cache-dir", str(cache), "--no-error-summary", "--show-error-codes", *map(str, files)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_mypy_checks_trt_calls_against_the_stubs(trt_stubs: Path, tmp_path: Path) -> None:
    files = ["trtcore/runtime/executor.py", "trtcore/runtime/trt_executor.py"]
    if (REPO / "trtcore/ops.py").is_file():
        files.append("trtcore/ops.py")
    result = _mypy(trt_stubs, tmp_path / "cache", *files)
    assert result.returncode == 0, f"mypy {' '.join(files)}:\n{result.stdout}{result.stderr}"


def test_mypy_really_sees_the_stubs(trt_stubs: Path, tmp_path: Path) -> None:
    """A canary: misuse of the TensorRT API must be reported (the stubs are not ``Any``)."""
    canary = tmp_path / "canary.py"
    canary.write_text(textwrap.dedent("""
        from __future__ import annotations
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            import tensorrt as trt_types

        def f(context: trt_types.IExecutionContext, engine: trt_types.ICudaEngine) -> None:
            context.execute_async_v3("not a stream handle")
            engine.no_such_method()
            wrong: str = context.set_tensor_address("x", 0)

        def g(network: trt_types.INetworkDefinition, shuffle: trt_types.IShuffleLayer) -> None:
            network.add_input("x", trt_types.float32, (1, -1))  # tuples are fine
            shuffle.reshape_dims = [2, 3]
            network.add_input("x", trt_types.float32, "not a shape")
    """))
    result = _mypy(trt_stubs, tmp_path / "cache", canary)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert 'Argument 1 to "execute_async_v3" of "IExecutionContext" has incompatible type "str"' in out, out
    assert '"ICudaEngine" has no attribute "no_such_method"' in out, out
    # `-> bool` is the builtin, not the stubs' `bool: DataType`
    assert 'canary.py:10: error: Incompatible types in assignment (expression has type "bool"' in out, out
    assert 'canary.py:15: error: Argument 3 to "add_input" of "INetworkDefinition" has incompatible type "str"' in out, out
    assert "canary.py:13" not in out and "canary.py:14" not in out, out


# --- CPU-side pieces ------------------------------------------------------------------------


class _DataType:
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.mark.parametrize(
    ("name", "expected"),
    [("FLOAT", np.float32), ("HALF", np.float16), ("BF16", ml_dtypes.bfloat16), ("FP8", ml_dtypes.float8_e4m3fn),
     ("INT8", np.int8), ("UINT8", np.uint8), ("INT32", np.int32), ("INT64", np.int64), ("BOOL", np.bool_)],
)
def test_numpy_dtype(name: str, expected: Any) -> None:
    assert numpy_dtype(_DataType(name)) == np.dtype(expected)  # type: ignore[arg-type]


def test_numpy_dtype_of_the_real_enums() -> None:
    trt = _trt_module("tensorrt_rtx")
    assert numpy_dtype(trt.DataType.BF16) == np.dtype(ml_dtypes.bfloat16)
    assert numpy_dtype(trt.float32) == np.dtype(np.float32)
    with pytest.raises(TypeError, match="INT4 has no NumPy equivalent"):
        numpy_dtype(trt.DataType.INT4)


def test_check_input_casts_and_validates() -> None:
    f32 = np.dtype(np.float32)
    out = check_input("x", np.ones((2, 3, 4), np.float64), (-1, -1, 4), f32)
    assert out.dtype == f32 and out.flags.c_contiguous and out.shape == (2, 3, 4)
    fortran = np.asfortranarray(np.ones((2, 4), np.float32))
    assert check_input("x", fortran, (-1, 4), f32).flags.c_contiguous
    assert check_input("ids", [[1, 2, 3]], (1, -1), np.dtype(np.int32)).dtype == np.int32
    bf16 = check_input("h", np.arange(4, dtype=np.float32).reshape(1, 4), (-1, 4), np.dtype(ml_dtypes.bfloat16))
    assert bf16.dtype == ml_dtypes.bfloat16
    with pytest.raises(ValueError, match=r"input 'x': expected shape \(-1, -1, 4\) \(-1 = any size\), found \(2, 4\)"):
        check_input("x", np.ones((2, 4)), (-1, -1, 4), f32)
    with pytest.raises(ValueError, match=r"input 'x': expected shape \(-1, 4\) .*found \(2, 5\)"):
        check_input("x", np.ones((2, 5)), (-1, 4), f32)
    with pytest.raises(ValueError, match="input 'ids': cannot cast float64 to the engine's int32"):
        check_input("ids", np.ones((1, 3)), (1, -1), np.dtype(np.int32))


def test_cuda_check_names_the_error() -> None:
    assert cuda_check((cudart.cudaError_t.cudaSuccess,), "x") is None
    assert cuda_check((cudart.cudaError_t.cudaSuccess, 7), "x") == 7
    assert cuda_check((cudart.cudaError_t.cudaSuccess, 7, 8), "x") == (7, 8)
    with pytest.raises(CudaError, match=r"cudaMalloc\(16\) failed: cudaErrorNoDevice \(no CUDA-capable device"):
        cuda_check((cudart.cudaError_t.cudaErrorNoDevice, None), "cudaMalloc(16)")
    assert issubclass(CudaError, RuntimeError)


def test_reference_backend_is_refused_clearly() -> None:
    with pytest.raises(TypeError, match="has no TensorRT runtime"):
        TensorRTExecutor(object(), b"")


def test_executor_interface() -> None:
    assert issubclass(TensorRTExecutor, Executor)
    with pytest.raises(TypeError):
        Executor()  # type: ignore[abstract]


# --- the engine, built with tensorrt_rtx on the CPU ------------------------------------------


@pytest.fixture(scope="module")
def weight() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)


def test_rtx_engine_without_gpu_fails_clearly(weight: np.ndarray) -> None:
    trt = _trt_module("tensorrt_rtx")
    engine = _build_matmul_engine(trt, weight)
    assert len(engine) > 0
    if _cuda_device_count() > 0:
        pytest.skip("a CUDA GPU is present; test_rtx_engine_on_gpu runs the engine")
    with pytest.raises(CudaError, match=r"TensorRTExecutor needs a CUDA GPU: cudaGetDeviceCount failed: cudaError\w+"):
        TensorRTExecutor(trt, engine)


def _expect_numpy(executor: TensorRTExecutor, weight: np.ndarray, shapes: list[tuple[int, int]]) -> None:
    rng = np.random.default_rng(1)
    for batch, seq in shapes:
        x = rng.standard_normal((batch, seq, weight.shape[0])).astype(np.float32)
        out = executor.run({"x": x})
        assert set(out) == {"y"} and out["y"].shape == (batch, seq, weight.shape[1])
        np.testing.assert_allclose(out["y"], x @ weight, rtol=1e-2, atol=1e-2)  # TF32 matmul allowed


@pytest.mark.gpu
def test_rtx_engine_on_gpu(weight: np.ndarray) -> None:
    trt = _trt_module("tensorrt_rtx")
    if _cuda_device_count() == 0:
        pytest.skip("no CUDA GPU")
    major, minor = _compute_capability()
    sm = f"SM{major}{minor}"
    if not hasattr(trt.ComputeCapability, sm):  # e.g. SM90 (H100/H200): TensorRT-RTX refuses it
        engine = _build_matmul_engine(trt, weight, compute_capability="SM89")
        with pytest.raises(RuntimeError, match=rf"could not deserialize the engine .*compute capability {major}\.{minor}"):
            TensorRTExecutor(trt, engine)
        pytest.skip(f"TensorRT-RTX cannot run on compute capability {major}.{minor}; checked its error only")
    with TensorRTExecutor(trt, _build_matmul_engine(trt, weight, compute_capability=sm)) as executor:
        assert executor.input_names == ["x"] and executor.output_names == ["y"]
        _expect_numpy(executor, weight, [(2, 4), (1, 1), (4, 16), (3, 5)])


@pytest.mark.gpu
def test_executor_end_to_end_gpu(weight: np.ndarray) -> None:
    """The full path on the first TensorRT runtime that accepts this GPU."""
    if _cuda_device_count() == 0:
        pytest.skip("no CUDA GPU")
    major, minor = _compute_capability()
    for backend in ("tensorrt", "tensorrt_rtx"):
        try:
            trt = load_trt(backend)
        except BackendNotAvailableError:
            continue
        if not hasattr(trt, "Builder"):
            continue
        sm = f"SM{major}{minor}"
        if hasattr(trt, "ComputeCapability"):  # TensorRT-RTX: only its RTX-class capabilities
            if not hasattr(trt.ComputeCapability, sm):
                continue
            engine = _build_matmul_engine(trt, weight, compute_capability=sm)
        else:
            engine = _build_matmul_engine(trt, weight, compute_capability=None)
        break
    else:
        pytest.skip(f"no installed TensorRT runtime runs on compute capability {major}.{minor}")

    executor = TensorRTExecutor(trt, engine)
    _expect_numpy(executor, weight, [(4, 16)])
    held = executor._pool.nbytes
    _expect_numpy(executor, weight, [(1, 3), (2, 8)])  # smaller: the pool is reused
    assert executor._pool.nbytes == held
    with pytest.raises(ValueError, match=r"input 'x': shape \(8, 16, 8\) .*optimization profile 0: min \(1, 1, 8\)"):
        executor.run({"x": np.zeros((8, 16, 8), np.float32)})
    with pytest.raises(ValueError, match="missing \\['x'\\], unknown \\['z'\\]"):
        executor.run({"z": np.zeros((1, 1, 8), np.float32)})
    executor.close()
    executor.close()
    with pytest.raises(RuntimeError, match="closed"):
        executor.run({"x": np.zeros((1, 1, 8), np.float32)})


# --- the CUDA plumbing with a fake TensorRT module --------------------------------------------


class _FakeTRTModule:
    """Just enough of a TensorRT module: one engine ``y = x`` (float32, shape (-1, 3))."""

    __name__ = "fake_trt"
    __version__ = "0"

    class ILogger:
        def __init__(self) -> None:
            pass

    class TensorIOMode:
        INPUT = "INPUT"
        OUTPUT = "OUTPUT"

    class Runtime:
        def __init__(self, logger: Any) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, blob: bytes) -> Any:
            if blob != b"identity":
                self.logger.log(_DataType("ERROR"), "bad engine blob")
                return None
            return _FakeEngine()


_FAKE_TRT = _FakeTRTModule()


class _FakeEngine:
    num_io_tensors = 2

    def get_tensor_name(self, i: int) -> str:
        return ["x", "y"][i]

    def get_tensor_mode(self, name: str) -> str:
        return "INPUT" if name == "x" else "OUTPUT"

    def get_tensor_dtype(self, name: str) -> _DataType:
        return _DataType("FLOAT")

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (-1, 3)

    def is_shape_inference_io(self, name: str) -> bool:
        return False

    def get_tensor_profile_shape(self, name: str, profile: int) -> list[tuple[int, ...]]:
        return [(1, 3), (2, 3), (8, 3)]

    def create_execution_context(self) -> Any:
        return _FakeContext()


class _FakeContext:
    def __init__(self) -> None:
        self.shape: tuple[int, ...] = (-1, 3)
        self.addresses: dict[str, int] = {}

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        if not 1 <= shape[0] <= 8:
            return False
        self.shape = tuple(shape)
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shape

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream: int) -> bool:
        nbytes = int(np.prod(self.shape)) * 4
        kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        err, = cudart.cudaMemcpyAsync(self.addresses["y"], self.addresses["x"], nbytes, kind, stream)
        return bool(err == cudart.cudaError_t.cudaSuccess)


def test_fake_engine_without_gpu_fails_clearly() -> None:
    if _cuda_device_count() > 0:
        pytest.skip("a CUDA GPU is present; test_cuda_plumbing_gpu runs instead")
    with pytest.raises(CudaError, match="TensorRTExecutor needs a CUDA GPU"):
        TensorRTExecutor(_FAKE_TRT, b"identity")


@pytest.mark.gpu
def test_cuda_plumbing_gpu() -> None:
    """Pool, H2D, binding, D2H and stream sync on a real GPU, no TensorRT needed."""
    if _cuda_device_count() == 0:
        pytest.skip("no CUDA GPU")
    with pytest.raises(RuntimeError, match=r"fake_trt 0 could not deserialize the engine on device 0 \(.*compute capability \d+\.\d+\); TensorRT said: bad engine blob"):
        TensorRTExecutor(_FAKE_TRT, b"garbage")
    with TensorRTExecutor(_FAKE_TRT, b"identity") as executor:
        for rows in (4, 1, 8, 2):
            x = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3)  # cast to float32 on the way in
            out = executor.run({"x": x})
            assert out["y"].dtype == np.float32
            np.testing.assert_array_equal(out["y"], x.astype(np.float32))
        assert executor._pool.nbytes == 2 * 256  # 8 x 3 x 4 bytes fits the first 256-byte buffers
        with pytest.raises(ValueError, match=r"shape \(9, 3\) is not accepted .*max \(8, 3\)"):
            executor.run({"x": np.zeros((9, 3), np.float32)})
        big = np.ones((8, 3), np.float32)
        np.testing.assert_array_equal(executor.run({"x": big})["y"], big)


@pytest.mark.gpu
def test_device_buffer_pool_grows_only_gpu() -> None:
    if _cuda_device_count() == 0:
        pytest.skip("no CUDA GPU")
    pool = DeviceBufferPool()
    try:
        a = pool.get("a", 100)
        assert pool.get("a", 256) == a and pool.nbytes == 256
        pool.get("a", 1000)
        assert pool.nbytes == 1024
        pool.get("a", 10)
        assert pool.nbytes == 1024
    finally:
        pool.free()
    assert pool.nbytes == 0
