"""The one-of-each low-level helpers (issue 7, Build 4): trtcore.gpu (error class, status
check, GPU probe), trtcore.log (TensorRT logger), trtcore.fileio (atomic writer),
trtcore.dims (symbolic dimension). Each test also checks that the former duplicates are now
these objects.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import stat
import sys
import types
from pathlib import Path

import pytest
from cuda.bindings import driver as cudrv
from cuda.bindings import runtime as cudart

from trtcore import dims, fileio, gpu, log
from trtcore.errors import InvalidArgumentError, NetworkError, TrtcoreError

# --- trtcore.gpu ---------------------------------------------------------------------------


def test_one_cuda_error_class() -> None:
    from trtcore import kernels
    from trtcore.runtime import trt_executor

    assert kernels.CUDAError is trt_executor.CudaError is gpu.CudaError
    assert kernels.NoGPUError is gpu.NoGPUError and issubclass(gpu.NoGPUError, gpu.CudaError)
    assert kernels.CUDAToolchainError is gpu.CUDAToolchainError
    assert issubclass(gpu.CudaError, TrtcoreError) and issubclass(gpu.CudaError, RuntimeError)
    assert trt_executor.cuda_check is gpu.check


def test_check_returns_the_values() -> None:
    ok = cudart.cudaError_t.cudaSuccess
    assert gpu.check((ok,), "x") is None
    assert gpu.check((ok, 7), "x") == 7
    assert gpu.check((ok, 7, 8), "x") == (7, 8)
    assert gpu.check((cudrv.CUresult.CUDA_SUCCESS, 5), "x") == 5


def test_check_names_runtime_and_driver_errors() -> None:
    """The message carries CUDA's own name and description of the code (the bindings' tables)."""
    err = cudart.cudaError_t.cudaErrorInvalidValue
    text = cudart.cudaGetErrorString(err)[1].decode()
    with pytest.raises(gpu.CudaError) as info:
        gpu.check((err, None), "cudaMemcpyAsync of input 'x'")
    assert str(info.value) == f"cudaMemcpyAsync of input 'x' failed: cudaErrorInvalidValue ({text})"
    assert (info.value.call, info.value.result) == ("cudaMemcpyAsync", "cudaErrorInvalidValue")
    assert type(info.value) is gpu.CudaError

    derr = cudrv.CUresult.CUDA_ERROR_INVALID_VALUE
    try:
        dtext = cudrv.cuGetErrorString(derr)[1].decode()
    except Exception:  # no libcuda here: the driver cannot describe its codes
        dtext = "?"
    with pytest.raises(gpu.CudaError) as dinfo:
        gpu.check((derr,), "cuLaunchKernel(k)")
    assert str(dinfo.value) == f"cuLaunchKernel(k) failed: CUDA_ERROR_INVALID_VALUE ({dtext})"
    assert dinfo.value.call == "cuLaunchKernel"


@pytest.mark.parametrize("err", [cudart.cudaError_t.cudaErrorNoDevice, cudart.cudaError_t.cudaErrorInsufficientDriver, cudrv.CUresult.CUDA_ERROR_NO_DEVICE])
def test_no_gpu_results_raise_no_gpu_error(err: object) -> None:
    with pytest.raises(gpu.NoGPUError) as info:
        gpu.check((err,), "cudaGetDeviceCount")
    assert info.value.result == err.name  # type: ignore[attr-defined]
    # the insufficient-driver text also says what it means on a machine with no driver at all
    assert ("no NVIDIA driver is installed" in str(info.value)) == (err == cudart.cudaError_t.cudaErrorInsufficientDriver)
    clone = pickle.loads(pickle.dumps(info.value))
    assert type(clone) is gpu.NoGPUError and (clone.call, clone.result, str(clone)) == (info.value.call, info.value.result, str(info.value))


def test_call_turns_a_raising_binding_into_no_gpu_error() -> None:
    def broken() -> None:
        raise RuntimeError("libcuda.so.1: cannot open shared object file")

    with pytest.raises(gpu.NoGPUError, match=r"cuInit failed: libcuda\.so\.1: cannot open") as info:
        gpu.call("cuInit", broken)
    assert info.value.call == "cuInit" and info.value.result is None


def _real_count() -> int:
    err, n = cudart.cudaGetDeviceCount()
    return int(n) if err == cudart.cudaError_t.cudaSuccess else 0


def test_the_probe_agrees_with_the_cuda_runtime() -> None:
    n = _real_count()
    assert gpu.device_count() == n
    ok, why = gpu.gpu_status()
    assert ok == (n > 0)
    if n:
        assert why == f"{n} CUDA device(s)"
        assert gpu.require_gpu(0) == n
        major, minor = gpu.compute_capability(0)
        assert f"compute capability {major}.{minor}" in gpu.describe_device(0)
    else:
        assert "cudaGetDeviceCount" in why
        with pytest.raises(gpu.NoGPUError, match=r"^TensorRT needs a GPU: cudaGetDeviceCount failed: cudaError\w+"):
            gpu.require_gpu(0, "TensorRT needs a GPU")


def _fake_cupy(count: int | Exception) -> types.ModuleType:
    def get_device_count() -> int:
        if isinstance(count, Exception):
            raise count
        return count

    m = types.ModuleType("cupy")
    m.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=get_device_count))  # type: ignore[attr-defined]
    return m


@pytest.mark.parametrize(
    ("cupy", "expected"),
    [(None, (False, "CuPy is not installed")), (_fake_cupy(2), (True, "2 CUDA device(s)")), (_fake_cupy(0), (False, "CuPy finds no CUDA device")),
     (_fake_cupy(RuntimeError("cudaErrorNoDevice")), (False, "CuPy finds no usable CUDA device (RuntimeError: cudaErrorNoDevice)"))],
)  # fmt: skip
def test_one_probe_for_cupy(monkeypatch: pytest.MonkeyPatch, cupy: object, expected: tuple[bool, str]) -> None:
    """The CuPy probe of the plugin harness is gpu_status(cupy=True)."""
    from trtcore import testing

    monkeypatch.setitem(sys.modules, "cupy", cupy)
    for probe in (lambda: gpu.gpu_status(cupy=True), testing.gpu_status):
        ok, why = probe()
        assert ok == expected[0] and why.startswith(expected[1]), (probe, why)


# --- trtcore.log ---------------------------------------------------------------------------


def _rtx():
    trt = pytest.importorskip("tensorrt_rtx")
    if not hasattr(trt, "ILogger"):
        pytest.skip("tensorrt_rtx type stubs only")
    return trt


def test_one_logger_per_module(caplog: pytest.LogCaptureFixture) -> None:
    from trtcore import builder
    from trtcore.runtime import trt_executor

    assert builder.trt_logger is trt_executor.trt_logger is log.trt_logger
    trt = _rtx()
    logger = log.trt_logger(trt)
    assert log.trt_logger(trt) is logger and isinstance(logger, trt.ILogger)
    seen = len(logger.errors)
    logger.messages.clear()
    with caplog.at_level(logging.DEBUG, logger=log.LOGGER_NAME):
        logger.log(trt.ILogger.Severity.ERROR, "bad things")
        logger.log(trt.ILogger.Severity.WARNING, "odd things")
        logger.log(trt.ILogger.Severity.INFO, "chatter")
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == log.LOGGER_NAME]
    assert got == [(logging.ERROR, "[TensorRT] bad things"), (logging.WARNING, "[TensorRT] odd things"), (logging.DEBUG, "[TensorRT] chatter")]
    assert list(logger.messages) == ["bad things", "odd things"]
    assert logger.errors[seen:] == ["bad things"]


def test_tensorrt_itself_logs_through_it(caplog: pytest.LogCaptureFixture) -> None:
    """A builder error raised inside TensorRT-RTX reaches logging and the logger's errors."""
    trt = _rtx()
    logger = log.trt_logger(trt)
    seen = len(logger.errors)
    with caplog.at_level(logging.DEBUG, logger=log.LOGGER_NAME):
        runtime = trt.Runtime(logger)
        assert runtime.deserialize_cuda_engine(b"not an engine") is None
    assert len(logger.errors) > seen
    assert any(r.name == log.LOGGER_NAME and r.levelno >= logging.ERROR for r in caplog.records)


def test_reference_module_keeps_its_logger() -> None:
    import trtcore.reference as ref

    assert isinstance(log.trt_logger(ref), ref.Logger) and log.trt_logger(ref) is log.trt_logger(ref)


# --- trtcore.fileio ------------------------------------------------------------------------


def test_one_atomic_writer() -> None:
    from trtcore import builder
    from trtcore.kernels import nvrtc

    assert builder.write_atomic is nvrtc.write_atomic is fileio.write_atomic
    assert builder.check_writable is fileio.check_writable


def test_write_atomic_writes_and_replaces(tmp_path: Path) -> None:
    data = random.Random(0).randbytes(10_000)
    target = tmp_path / "a" / "b" / "engine.bin"
    fileio.write_atomic(target, data)
    assert target.read_bytes() == data
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    fileio.write_atomic(target, b"second", mode=0o600)
    assert target.read_bytes() == b"second" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["engine.bin"]  # no temporaries left


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def no_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_replace)
    with pytest.raises(InvalidArgumentError, match=rf"cannot write {target}: No space left on device"):
        fileio.write_atomic(target, b"new")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f"]


def test_write_atomic_names_the_unwritable_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InvalidArgumentError, match=f"cannot create the folder of {blocker / 'x.bin'}"):
        fileio.write_atomic(blocker / "x.bin", b"1")
    with pytest.raises(InvalidArgumentError, match="is a folder"):
        fileio.write_atomic(tmp_path, b"1")


# --- trtcore.dims --------------------------------------------------------------------------


def test_one_dimension_class() -> None:
    from trtcore.plugins import base
    from trtcore.reference import network

    assert base.Dim is network.Dim is dims.Dim  # (the evaluator, NumPy only now, needs none)


def test_value_arithmetic_matches_python() -> None:
    rng = random.Random(1)
    for _ in range(200):
        a, b = rng.randint(300, 10_000), rng.randint(1, 300)  # a negative size is TensorRT's "unknown"
        d = dims.Dim(a)
        assert int(d + b) == a + b and int(d - b) == a - b and int(d * b) == a * b
        assert int(d // b) == a // b and int(d.cdiv(b)) == -(-a // b) and int(d.cdiv(dims.Dim(b))) == (a + b - 1) // b


def test_unknown_dimensions_stay_unknown() -> None:
    for unknown in (dims.Dim(None), dims.Dim(-1)):
        assert unknown.value is None
        assert (unknown + 1).value is None and (dims.Dim(4) * unknown).value is None
        with pytest.raises(NetworkError, match="only known at run time"):
            int(unknown.cdiv(2))
    assert dims.Dim.of(5) == 5 and dims.Dim.of(dims.Dim(-1)) is None


def test_expressions_go_to_the_expr_builder() -> None:
    """Inside TensorRT a Dim builds IDimensionExpr operations (a recording stand-in)."""
    calls: list[tuple] = []

    class Builder:
        def constant(self, v: int) -> str:
            calls.append(("constant", v))
            return f"c{v}"

        def operation(self, op: str, a: str, b: str) -> str:
            calls.append((op, a, b))
            return f"({a} {op} {b})"

    trt = types.SimpleNamespace(DimensionOperation=types.SimpleNamespace(SUM="SUM", SUB="SUB", PROD="PROD", FLOOR_DIV="FLOOR_DIV", CEIL_DIV="CEIL_DIV"))
    x = dims.Dim(expr="x", builder=Builder(), trt=trt)
    out = ((x * 2 + x) // 3 - 1).cdiv(x)
    assert out.expr == "(((((x PROD c2) SUM x) FLOOR_DIV c3) SUB c1) CEIL_DIV x)"
    assert [c[0] for c in calls] == ["constant", "PROD", "SUM", "constant", "FLOOR_DIV", "constant", "SUB", "CEIL_DIV"]


def test_the_probe_without_cuda_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", None)  # import -> ImportError
    ok, why = gpu.gpu_status()
    assert not ok and why.startswith("cuda.bindings.runtime is not available: cuda-python is not installed") and "pip install cuda-python" in why
    assert gpu.device_count() == 0
    with pytest.raises(gpu.NoGPUError, match="^TensorRT needs a GPU: cuda.bindings.runtime is not available"):
        gpu.require_gpu(0, "TensorRT needs a GPU")


@pytest.mark.parametrize("module", ["trtcore.reference", "trtcore.cuda"])
def test_reference_and_cuda_loggers_keep_messages(module: str) -> None:
    """The executors quote ``logger.messages`` and count ``logger.errors`` for every backend
    (TensorRTExecutor drives the cuda engine too): the reference Logger keeps both."""
    import importlib

    trt = importlib.import_module(module)
    logger = log.trt_logger(trt)
    logger.messages.clear()
    seen = len(logger.errors)
    logger.log(trt.Logger.INFO, "info is not kept")
    logger.log(trt.Logger.WARNING, "a warning")
    logger.log(trt.Logger.ERROR, "an error")
    assert list(logger.messages) == ["a warning", "an error"]
    assert logger.errors[seen:] == ["an error"]


def test_atomic_folder_removes_a_killed_run_s_staging_folder(tmp_path: Path) -> None:
    """A run killed outright (SIGKILL) leaves its hidden ``.<name>.partial-<pid>-<hex>``; the
    next run removes it (its process is gone) and keeps a live process's and other folders."""
    import os
    import subprocess
    import sys

    from trtcore.fileio import atomic_folder

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead = int(done.stdout)  # that process has exited
    stale = tmp_path / f".out.partial-{dead}-0123abcd"
    live = tmp_path / f".out.partial-{os.getpid()}-89abcdef"
    other = tmp_path / ".out.partial-notours"
    for d in (stale, live, other):
        d.mkdir()
        (d / "f").write_text("x")
    with atomic_folder(tmp_path / "out") as t:
        (t / "f").write_text("new")
    assert (tmp_path / "out" / "f").read_text() == "new"
    assert not stale.exists() and live.exists() and other.exists()


def test_the_early_folder_check_leaves_nothing_and_refuses_what_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check_folder_free (quantize's and convert's check before any work) probes a deep new
    output without leaving its parent folders behind; refuses "", the current folder and a
    folder holding it, and a relative output once the current folder is gone, each with a
    trtcore error naming it (found by new-user and adversarial trials)."""
    from trtcore.errors import InvalidArgumentError
    from trtcore.fileio import check_folder_free

    check_folder_free(tmp_path / "a" / "b" / "out", False)
    assert list(tmp_path.iterdir()) == []
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for out in ("", ".", work, tmp_path):
        with pytest.raises(InvalidArgumentError, match="empty|is the current folder or holds it"):
            check_folder_free(out, True)
    check_folder_free("relative/out", False)  # below the current folder: fine
    work.rmdir()
    with pytest.raises(InvalidArgumentError, match=r"the current folder no longer exists, so the output 'out' is nowhere"):
        check_folder_free("out", False)
    check_folder_free(tmp_path / "abs", False)
    assert list(tmp_path.iterdir()) == []


def test_atomic_folder_that_cannot_be_created_names_it(tmp_path: Path) -> None:
    """An output whose parent is a file (or any folder the OS refuses) fails before any work
    with the folder and the OS's reason in a trtcore error, not a bare OSError about the
    hidden staging folder, and leaves nothing behind."""
    from trtcore.errors import InvalidArgumentError
    from trtcore.fileio import atomic_folder

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = blocker / "out"
    with pytest.raises(InvalidArgumentError, match=rf"cannot create the folder {re.escape(str(out))}: .*a-file"):
        with atomic_folder(out):
            raise AssertionError("the block must not run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
