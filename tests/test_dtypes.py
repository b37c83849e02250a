"""The one dtype table (trtcore.dtypes) against independent references, and its users.

References: TensorRT-RTX's own ``nptype`` and ``DataType.itemsize``; the dtype codes that
``safetensors.torch`` writes for torch tensors; NVRTC's ``sizeof`` of the CUDA C types;
``kernels/dtype.cuh``'s ``DTYPE`` numbering. Then: no module but trtcore/dtypes.py holds a
dtype table (an AST scan for dict literals mapping dtypes), and the former tables' names are
now the table's.
"""

from __future__ import annotations

import ast
import json
import re
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from trtcore import dtypes
from trtcore.errors import InvalidArgumentError, UnsupportedDTypeError

REPO = Path(__file__).resolve().parents[1]


def _rtx():
    trt = pytest.importorskip("tensorrt_rtx")
    if not hasattr(trt, "Builder"):
        pytest.skip("tensorrt_rtx type stubs only")
    return trt


def test_tensorrt_types_match_tensorrt() -> None:
    trt = _rtx()
    for member in trt.DataType.__members__.values():
        try:
            expected = np.dtype(trt.nptype(member))
        except TypeError:  # TensorRT's nptype knows no bfloat16/FP8 (NumPy has none)
            expected = None
        if member.name in ("INT4", "FP4", "E8M0"):
            with pytest.raises(UnsupportedDTypeError, match=f"{member.name} has no NumPy equivalent"):
                dtypes.numpy_dtype(member)
            continue
        row = dtypes.lookup(member)
        assert row.trt == member.name
        assert row.itemsize == member.itemsize, member
        if expected is not None:
            assert row.numpy == expected, member
        assert dtypes.trt_dtype(trt, row.numpy) == member
    assert dtypes.numpy_dtype(trt.DataType.BF16) == np.dtype(ml_dtypes.bfloat16)
    assert dtypes.numpy_dtype(trt.DataType.FP8) == np.dtype(ml_dtypes.float8_e4m3fn)  # TensorRT's FP8 is E4M3


def test_reference_types_match_the_table() -> None:
    import trtcore.reference as ref

    for member in ref.DataType:
        assert dtypes.trt_dtype(ref, dtypes.numpy_dtype(member)) is member
        assert ref.nptype(member) == dtypes.numpy_dtype(member).type
        assert ref.from_numpy_dtype(dtypes.numpy_dtype(member)) is member
    with pytest.raises(TypeError, match="float64 has no TensorRT data type"):
        ref.from_numpy_dtype(np.float64)


def test_safetensors_codes_match_what_safetensors_writes(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    names = [r.name for r in dtypes.DTYPES if hasattr(torch, r.name)]
    assert {"float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "uint8", "int64", "bool"} <= set(names)
    tensors = {n: torch.zeros(2, dtype=getattr(torch, n)) for n in names}
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path))
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    for name in names:
        row = dtypes.lookup(name)
        assert row.safetensors == header[name]["dtype"], name
        assert dtypes.SAFETENSORS_DTYPES[header[name]["dtype"]] == row.numpy
        assert torch.zeros(1, dtype=getattr(torch, name)).element_size() == row.itemsize


def test_device_storage_holds_the_same_bits() -> None:
    """Each type's device storage has its size and carries its bit patterns both ways."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(64).astype(np.float32) * 100
    fake_cupy = object()  # any array module but NumPy keeps the storage form
    for row in dtypes.DTYPES:
        assert row.storage.itemsize == row.numpy.itemsize, row.name
        assert dtypes.storage_dtype(row.name, np) == row.numpy
        stored = dtypes.storage_dtype(row.name, fake_cupy)
        if row.numpy.kind in "fV" and row.numpy.name not in ("float16", "float32", "float64"):
            assert stored.kind == "u", row.name  # ml_dtypes types: unsigned bits on the device
        host = x.astype(row.numpy)
        bits = host.view(stored)
        back = dtypes.host_view(bits, row.name)
        assert back.dtype == row.numpy and back.tobytes() == host.tobytes(), row.name
    bf16 = dtypes.lookup("bf16")
    assert bf16.storage == np.uint16 and dtypes.storage_dtype(ml_dtypes.bfloat16, fake_cupy) == np.uint16


def test_cuda_types_have_the_right_size(tmp_path: Path) -> None:
    """NVRTC checks sizeof(CUDA C type) == itemsize for every row with a CUDA type."""
    from trtcore import kernels

    rows = [r for r in dtypes.DTYPES if r.cuda]
    src = tmp_path / "sizes.cu"
    src.write_text(
        "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cuda_fp8.h>\n"
        + "".join(f'static_assert(sizeof({r.cuda}) == {r.itemsize}, "{r.name}");\n' for r in rows)
        + 'extern "C" __global__ void k() {}\n'
    )
    try:
        ck = kernels.compile_kernel(src, arch="sm_90")
    except kernels.CUDAToolchainError as exc:
        pytest.skip(f"no NVRTC here: {exc}")
    assert ck.symbols == ["k"]
    assert {r.name: r.cuda for r in rows}["bfloat16"] == "__nv_bfloat16"


def test_kernel_codes_match_dtype_cuh() -> None:
    text = (REPO / "kernels" / "dtype.cuh").read_text()
    declared = dict(re.findall(r"(\d) \(?(float32|float16|bfloat16)\)?", text.splitlines()[0] + text.splitlines()[1]))
    assert {int(k): v for k, v in declared.items()} == {0: "float32", 1: "float16", 2: "bfloat16"}
    assert dtypes.KERNEL_DTYPE_CODES == {dtypes.numpy_dtype(v): int(k) for k, v in declared.items()}


@pytest.mark.parametrize(
    ("spelling", "name"),
    [("bfloat16", "bfloat16"), ("BF16", "bfloat16"), ("bf16", "bfloat16"), ("half", "float16"), ("HALF", "float16"),
     ("F16", "float16"), ("fp32", "float32"), ("FLOAT", "float32"), ("fp8", "float8_e4m3fn"), ("F8_E4M3", "float8_e4m3fn"),
     (np.int32, "int32"), (np.dtype(np.bool_), "bool"), (ml_dtypes.bfloat16, "bfloat16"), ("U16", "uint16")],
)  # fmt: skip
def test_lookup_spellings(spelling: object, name: str) -> None:
    assert dtypes.lookup(spelling).name == name
    assert dtypes.lookup(dtypes.lookup(spelling)) is dtypes.lookup(name)


@pytest.mark.parametrize("bad", ["float128", "complex64", np.complex64, object(), "int4"])
def test_unknown_types_are_named(bad: object) -> None:
    with pytest.raises(UnsupportedDTypeError) as info:
        dtypes.lookup(bad)
    assert isinstance(info.value, InvalidArgumentError) and isinstance(info.value, TypeError)
    assert repr(bad) in str(info.value) and "bfloat16" in str(info.value)


def test_no_type_without_tensorrt_gets_one() -> None:
    import trtcore.reference as ref

    with pytest.raises(UnsupportedDTypeError, match="float64 has no TensorRT equivalent"):
        dtypes.trt_dtype(ref, np.float64)


# --- one table: the users ------------------------------------------------------------------

_DTYPE_ATTRS = {"float16", "float32", "bfloat16", "BF16", "HALF", "FLOAT", "float8_e4m3fn"}
_DTYPE_STRS = {"BF16", "HALF", "F16", "F32", "FLOAT"}


def _dtypeish(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in _DTYPE_ATTRS  # np.float16, ml_dtypes.bfloat16, trt.float16, DataType.BF16
    if isinstance(node, ast.Constant):
        return node.value in _DTYPE_STRS  # TensorRT names, safetensors codes
    if isinstance(node, ast.Call):
        return any(_dtypeish(a) for a in node.args)  # np.dtype(np.float16)
    return False


def test_no_dtype_table_outside_dtypes_py() -> None:
    """A dict literal with two or more dtypes among its keys/values is a dtype table (there
    were nine on main: ops, checkpoint (2), trt_executor, reference/types, plugins (3)...)."""
    tables = []
    for folder in ("trtcore", "plugins", "kernels", "models"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == REPO / "trtcore" / "dtypes.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Dict) and sum(_dtypeish(x) for x in [*node.keys, *node.values] if x is not None) >= 2:
                    tables.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert tables == []


def test_former_tables_are_the_table() -> None:
    from trtcore import checkpoint, ops
    from trtcore.plugins import base, paged_attention, rope
    from trtcore.runtime import trt_executor

    assert checkpoint.SAFETENSORS_DTYPES is dtypes.SAFETENSORS_DTYPES
    assert ops._NP_DTYPES is dtypes.ENGINE_DTYPES
    assert rope.DTYPE_CODES is paged_attention.DTYPE_CODES is dtypes.KERNEL_DTYPE_CODES
    assert trt_executor.numpy_dtype is dtypes.numpy_dtype
    assert base.np_dtype is dtypes.numpy_dtype and base.trt_dtype is dtypes.trt_dtype


def test_cuda_data_type_codes_are_cuda_python_s() -> None:
    """Each row's ``cudaDataType_t`` code (what cuBLAS takes) is the CUDA runtime's own
    enum value, read from cuda-python (``cuda.bindings.runtime.cudaDataType``)."""
    from cuda.bindings import runtime as cudart

    names = {"float32": "CUDA_R_32F", "float16": "CUDA_R_16F", "bfloat16": "CUDA_R_16BF", "int8": "CUDA_R_8I",
             "uint8": "CUDA_R_8U", "int32": "CUDA_R_32I", "float64": "CUDA_R_64F"}
    for row in dtypes.DTYPES:
        if row.name in names:
            assert row.cuda_data_type == int(getattr(cudart.cudaDataType, names[row.name])), row.name
        else:
            assert row.cuda_data_type is None, row.name
