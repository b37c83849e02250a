"""Load CUBINs and launch their kernels with ``cuda.bindings`` (driver API), without CuPy.

Works the same inside a TensorRT plugin's ``enqueue`` and on trtcore's CuPy backend: the
module is loaded into the CUDA *runtime's* primary context of the current device (the one
TensorRT, CuPy and PyTorch use), which :func:`ensure_context` creates and makes current
(``cudaFree(0)``) first. Modules are cached per (CUBIN key, device, context) and never
unloaded; functions per symbol as well.

Launch arguments are typed explicitly -- a kernel's parameters have no run-time type
information, and a wrong size silently corrupts the following arguments::

    fn = kernels.compile_kernel("saxpy", defines={"T": "float"}).function("saxpy")
    fn.launch((blocks,), (256,), [(y_ptr, "ptr"), (x_ptr, "ptr"), (2.5, "f32"), (n, "i32")], stream=s)

Argument types (:data:`ARG_TYPES`): ``"ptr"`` (device pointer: ``int``, ``None`` for NULL, an
object with ``__cuda_array_interface__`` such as a CuPy array, or with an int ``.ptr`` such as
:class:`trtcore.plugins.base.DeviceTensor` or a CuPy ``MemoryPointer``), ``"i8" "i16" "i32"
"i64" "u8" "u16" "u32" "u64"`` (range-checked), ``"f32" "f64"``, ``"f16"``/``"bf16"`` (a Python
float rounded to nearest even, passed as the 16-bit pattern), ``"bool"``. A ``ctypes``
instance (``ctypes.c_int32(5)``, a ``ctypes.Structure`` passed by value) may be given alone
instead of a ``(value, type)`` pair. Where the driver reports the kernel's parameter layout
(``cuFuncGetParamInfo``, CUDA 12.4+), the count and sizes of the arguments are checked
before launching.
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trtcore.errors import InvalidArgumentError
from trtcore.gpu import call as _call
from trtcore.gpu import check as _check
from trtcore.gpu import compute_capability, cuda_bindings, result_name
from trtcore.gpu import device_count as gpu_count

from .errors import CUDAError

if TYPE_CHECKING:
    from .nvrtc import CompiledKernel

__all__ = [
    "ARG_TYPES",
    "KernelFunction",
    "compute_capability",
    "ensure_context",
    "gpu_count",
    "load_function",
    "programmatic_config",
]

_INT_TYPES: dict[str, tuple[type, int, int]] = {
    "i8": (ctypes.c_int8, -(2**7), 2**7 - 1),
    "i16": (ctypes.c_int16, -(2**15), 2**15 - 1),
    "i32": (ctypes.c_int32, -(2**31), 2**31 - 1),
    "i64": (ctypes.c_int64, -(2**63), 2**63 - 1),
    "u8": (ctypes.c_uint8, 0, 2**8 - 1),
    "u16": (ctypes.c_uint16, 0, 2**16 - 1),
    "u32": (ctypes.c_uint32, 0, 2**32 - 1),
    "u64": (ctypes.c_uint64, 0, 2**64 - 1),
}
_ALIASES = {
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "int": "i32",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "size_t": "u64",
    "float32": "f32", "float": "f32", "float64": "f64", "double": "f64",
    "float16": "f16", "half": "f16", "bfloat16": "bf16", "pointer": "ptr", "void*": "ptr",
}  # fmt: skip
#: The type names :meth:`KernelFunction.launch` accepts (aliases such as ``"int32"``,
#: ``"float"``, ``"half"``, ``"size_t"`` map onto these).
ARG_TYPES: tuple[str, ...] = ("ptr", *_INT_TYPES, "f32", "f64", "f16", "bf16", "bool")

_lock = threading.RLock()
_modules: dict[tuple[str, int, int], Any] = {}
_functions: dict[tuple[str, int, int, str], KernelFunction] = {}


# ---------------------------------------------------------------------------------------
# CUDA plumbing
# ---------------------------------------------------------------------------------------


def _cudart() -> Any:
    return cuda_bindings("runtime")


def _driver() -> Any:
    return cuda_bindings("driver")


def ensure_context() -> tuple[int, Any]:
    """Make sure the CUDA runtime's primary context of the current device exists and is
    current on this thread (``cudaFree(0)``); return ``(device ordinal, CUcontext)``.

    Raises:
        NoGPUError: no usable GPU.
        CUDAError: another CUDA error.
    """
    rt, drv = _cudart(), _driver()
    _call("cudaFree(0)", rt.cudaFree, 0)
    device = _call("cudaGetDevice", rt.cudaGetDevice)
    ctx = _call("cuCtxGetCurrent", drv.cuCtxGetCurrent)
    if int(ctx) == 0:
        raise CUDAError("no current CUDA context after cudaFree(0)", call="cuCtxGetCurrent")
    return int(device), ctx


def _check_compatible(kernel: CompiledKernel, device: int) -> None:
    major, minor = compute_capability(device)
    num = int("".join(ch for ch in kernel.arch if ch.isdigit()))
    k_major, k_minor = num // 10, num % 10
    exact_only = kernel.arch[-1] in "af"
    ok = (k_major, k_minor) == (major, minor) if exact_only else (k_major == major and k_minor <= minor)
    if not ok:
        raise InvalidArgumentError(
            f"kernel {kernel.name} was compiled for {kernel.arch}, which cannot run on device {device} "
            f"(compute capability {major}.{minor}); compile it with arch=None (the current GPU) or arch='sm_{major}{minor}'"
        )


def load_function(kernel: CompiledKernel, symbol: str) -> KernelFunction:
    """Load ``kernel``'s CUBIN into the current device's primary context (cached) and return
    its kernel ``symbol``. :meth:`CompiledKernel.function` calls this.

    Raises:
        InvalidArgumentError: no kernel ``symbol`` in the CUBIN, or the CUBIN's arch cannot
            run on the current GPU.
        NoGPUError: no usable GPU.
        CUDAError: ``cuModuleLoadData`` / ``cuModuleGetFunction`` failed.
    """
    names = kernel.symbols
    if symbol not in names:
        raise InvalidArgumentError(
            f'kernel {kernel.name} ({kernel.arch}) has no kernel {symbol!r}; it has {", ".join(names) or "none"} (declare kernels extern "C" __global__)'
        )
    drv = _driver()
    with _lock:
        device, ctx = ensure_context()
        fkey = (kernel.key, device, int(ctx), symbol)
        fn = _functions.get(fkey)
        if fn is not None:
            return fn
        mkey = (kernel.key, device, int(ctx))
        module = _modules.get(mkey)
        if module is None:
            _check_compatible(kernel, device)
            module = _call(f"cuModuleLoadData({kernel.name}, {kernel.arch})", drv.cuModuleLoadData, kernel.cubin)
            _modules[mkey] = module
        handle = _call(f"cuModuleGetFunction({kernel.name}, {symbol!r})", drv.cuModuleGetFunction, module, symbol.encode())
        fn = KernelFunction(kernel, symbol, device, ctx, handle)
        _functions[fkey] = fn
        return fn


# ---------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------


def _pointer(value: Any, index: int) -> int:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        p = value
    elif hasattr(value, "__cuda_array_interface__"):
        p = value.__cuda_array_interface__["data"][0]
    elif hasattr(value, "ptr"):
        p = value.ptr
    else:
        try:
            p = int(value)  # cuda.bindings CUdeviceptr and friends
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"argument {index}: {type(value).__name__} is not a device pointer (int, None, __cuda_array_interface__ or .ptr)"
            ) from None
    p = int(p)
    if not 0 <= p < 2**64:
        raise InvalidArgumentError(f"argument {index}: pointer {p:#x} out of range")
    return p


def _bf16_bits(x: float) -> int:
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    if math.isnan(x):
        return 0x7FC0
    bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
    return (bits >> 16) & 0xFFFF


def _pack(arg: Any, index: int) -> Any:
    """One launch argument as a ctypes object (its bytes are what the kernel receives)."""
    if isinstance(arg, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)):
        return arg
    if not (isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[1], str)):
        raise InvalidArgumentError(
            f"argument {index}: give a (value, type) pair such as (ptr, 'ptr'), (n, 'i32'), (x, 'f32'), or a ctypes instance; got {arg!r}"
        )
    value, tname = arg
    t = _ALIASES.get(tname, tname)
    if t == "ptr":
        return ctypes.c_void_p(_pointer(value, index))
    if t in _INT_TYPES:
        ctype, lo, hi = _INT_TYPES[t]
        if isinstance(value, bool) or not isinstance(value, int):
            try:
                import operator

                value = operator.index(value)  # NumPy integers
            except TypeError:
                raise InvalidArgumentError(f"argument {index}: {value!r} is not an integer ({t})") from None
        if not lo <= value <= hi:
            raise InvalidArgumentError(f"argument {index}: {value} out of range for {t} [{lo}, {hi}]")
        return ctype(value)
    if t in ("f32", "f64", "f16", "bf16"):
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"argument {index}: {value!r} is not a number ({t})") from None
        if t == "f32":
            return ctypes.c_float(x)
        if t == "f64":
            return ctypes.c_double(x)
        if t == "f16":
            try:
                (bits,) = struct.unpack("<H", struct.pack("<e", x))
            except (OverflowError, struct.error):
                raise InvalidArgumentError(f"argument {index}: {x} does not fit in float16") from None
            return ctypes.c_uint16(bits)
        return ctypes.c_uint16(_bf16_bits(x))
    if t == "bool":
        return ctypes.c_bool(bool(value))
    raise InvalidArgumentError(f"argument {index}: unknown type {tname!r}; use one of {', '.join(ARG_TYPES)}")


def _dims(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3:
        raise InvalidArgumentError(f"{what} must have 1 to 3 dimensions, got {value!r}")
    out = []
    for d in dims:
        try:
            import operator

            d = operator.index(d)
        except TypeError:
            raise InvalidArgumentError(f"{what} {value!r}: {d!r} is not an integer") from None
        if not 1 <= d < 2**32:
            raise InvalidArgumentError(f"{what} {value!r}: every dimension must be >= 1")
        out.append(d)
    while len(out) < 3:
        out.append(1)
    return out[0], out[1], out[2]


def _stream_handle(stream: Any) -> int:
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    if hasattr(stream, "ptr"):  # cupy.cuda.Stream
        return int(stream.ptr)
    try:
        return int(stream)  # CUstream / cudaStream_t
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"stream must be an int handle, a cuda.bindings stream or have .ptr; got {type(stream).__name__}") from None


# ---------------------------------------------------------------------------------------
# KernelFunction
# ---------------------------------------------------------------------------------------


def programmatic_config(grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int, stream: Any) -> Any:
    """The ``CUlaunchConfig`` of a programmatic dependent launch (one attribute,
    ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` = 1) with these dimensions,
    dynamic shared memory (bytes) and ``CUstream``."""
    drv = _driver()
    attr = drv.CUlaunchAttribute()
    attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes = shared_mem
    cfg.hStream = stream
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    return cfg


class KernelFunction:
    """One ``__global__`` function of a loaded CUBIN on one device. Get it from
    :meth:`CompiledKernel.function`; thread-safe to launch.

    Attributes:
        kernel: the :class:`CompiledKernel` it comes from.
        name: the kernel's symbol.
        device: the device ordinal it was loaded on.
        handle: the ``CUfunction``.
    """

    def __init__(self, kernel: CompiledKernel, name: str, device: int, context: Any, handle: Any) -> None:
        self.kernel = kernel
        self.name = name
        self.device = device
        self.handle = handle
        self._context = context
        self._ctx_int = int(context)
        # the dynamic shared memory the function's attribute admits: without it 48 KiB less the
        # kernel's static shared memory, which is not known here, so any amount sets it once
        self._dyn_smem_set = 0
        self._param_sizes: list[int] | None | bool = False  # False: not queried yet
        self._programmatic: bool | None = None

    def __repr__(self) -> str:
        return f"KernelFunction({self.kernel.name}:{self.name}, {self.kernel.arch}, device {self.device})"

    def attribute(self, name: str) -> int:
        """A function attribute by its ``CUfunction_attribute`` name without prefix, e.g.
        ``"NUM_REGS"``, ``"MAX_THREADS_PER_BLOCK"``, ``"SHARED_SIZE_BYTES"`` (static shared
        memory, bytes), ``"LOCAL_SIZE_BYTES"``.

        Raises:
            InvalidArgumentError: unknown attribute name.
            CUDAError: ``cuFuncGetAttribute`` failed.
        """
        drv = _driver()
        try:
            attr = getattr(drv.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name.upper()}")
        except AttributeError:
            raise InvalidArgumentError(f"unknown function attribute {name!r}") from None
        value = _call("cuFuncGetAttribute", drv.cuFuncGetAttribute, attr, self.handle)
        return int(value)

    def param_sizes(self) -> list[int] | None:
        """Sizes in bytes of the kernel's parameters, from ``cuFuncGetParamInfo`` (CUDA 12.4+
        driver); ``None`` where the driver cannot tell."""
        if self._param_sizes is False:
            drv = _driver()
            sizes: list[int] | None = []
            if not hasattr(drv, "cuFuncGetParamInfo"):
                sizes = None
            else:
                i = 0
                while sizes is not None and i < 4096:
                    try:
                        err, _offset, size = drv.cuFuncGetParamInfo(self.handle, i)
                    except Exception:
                        sizes = None
                        break
                    if int(err) != 0:
                        if result_name(err) != "CUDA_ERROR_INVALID_VALUE":  # past the last parameter
                            sizes = None
                        break
                    sizes.append(int(size))
                    i += 1
            self._param_sizes = sizes
        return self._param_sizes  # type: ignore[return-value]

    @property
    def programmatic_capable(self) -> bool:
        """Whether :meth:`launch` makes programmatic dependent launches on this device
        (compute capability 9.0+)."""
        if self._programmatic is None:
            self._programmatic = compute_capability(self.device) >= (9, 0)
        return self._programmatic

    def _make_current(self) -> None:
        drv = _driver()
        cur = int(_call("cuCtxGetCurrent", drv.cuCtxGetCurrent))
        if cur == self._ctx_int:
            return
        if cur == 0:  # a fresh thread: adopt the primary context, as the runtime would
            _call("cuCtxSetCurrent", drv.cuCtxSetCurrent, self._context)
            return
        raise CUDAError(
            f"{self!r} belongs to another CUDA context than the current one (was the device changed?); "
            "call CompiledKernel.function() again under the current device",
            call="cuLaunchKernel",
            result="CUDA_ERROR_INVALID_CONTEXT",
        )

    def launch(
        self,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        args: Sequence[Any] = (),
        *,
        shared_mem: int = 0,
        stream: Any = 0,
        programmatic: bool = False,
    ) -> None:
        """Launch the kernel asynchronously (``cuLaunchKernel``) on ``stream``.

        Args:
            grid: blocks per grid, ``int`` or 1-3 ints ``(x, y, z)``.
            block: threads per block, ``int`` or 1-3 ints.
            args: the kernel's parameters in order, each a ``(value, type)`` pair with type
                one of :data:`ARG_TYPES` (e.g. ``[(y, "ptr"), (x, "ptr"), (a, "f32"),
                (n, "i32")]``) or a ``ctypes`` instance; see the module docstring. The values
                are copied at launch, so nothing needs to outlive the call.
            shared_mem: dynamic shared memory per block, bytes. The function's
                ``MAX_DYNAMIC_SHARED_SIZE_BYTES`` attribute is raised to it first (once per new
                largest amount: without it the limit is 48 KiB less the kernel's static shared
                memory).
            stream: ``cudaStream_t``/``CUstream`` as int (0: legacy default stream), a
                ``cuda.bindings`` stream, or an object with ``.ptr`` (CuPy stream).
            programmatic: programmatic dependent launch (``cuLaunchKernelEx`` with
                ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``; compute capability
                9.0+, a plain launch below or with ``TRTCORE_CUDA_PDL=0``): the kernel may
                start while the previous kernel on ``stream`` still runs, so it must execute
                ``griddepcontrol.wait`` (``PDL_WAIT()`` of ``kernels/pdl.cuh``) before it
                reads or writes anything that kernel touches (CUDA Programming Guide,
                "Programmatic Dependent Launch and Synchronization").

        Raises:
            InvalidArgumentError: bad grid/block/argument, or the arguments do not match the
                kernel's parameter count/sizes (where the driver reports them).
            CUDAError: a driver error, named (e.g. ``CUDA_ERROR_INVALID_VALUE`` for a block
                too large, or an earlier asynchronous error such as
                ``CUDA_ERROR_ILLEGAL_ADDRESS``).
        """
        gx, gy, gz = _dims(grid, "grid")
        bx, by, bz = _dims(block, "block")
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, int) or shared_mem < 0:
            raise InvalidArgumentError(f"shared_mem must be a non-negative int (bytes), got {shared_mem!r}")
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise InvalidArgumentError(f"args must be a sequence of (value, type) pairs, got {type(args).__name__}")
        packed = [_pack(a, i) for i, a in enumerate(args)]
        sizes = self.param_sizes()
        if sizes is not None:
            if len(sizes) != len(packed):
                raise InvalidArgumentError(f"{self.name} takes {len(sizes)} parameters, {len(packed)} given")
            for i, (obj, size) in enumerate(zip(packed, sizes)):
                if ctypes.sizeof(obj) != size:
                    raise InvalidArgumentError(
                        f"{self.name}: argument {i} is {ctypes.sizeof(obj)} bytes ({type(obj).__name__}), the kernel's parameter {i} is {size} bytes"
                    )
        drv = _driver()
        self._make_current()
        if shared_mem > self._dyn_smem_set:
            with _lock:
                if shared_mem > self._dyn_smem_set:
                    _call(
                        f"cuFuncSetAttribute({self.name}, MAX_DYNAMIC_SHARED_SIZE_BYTES={shared_mem})",
                        drv.cuFuncSetAttribute,
                        self.handle,
                        drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        shared_mem,
                    )
                    self._dyn_smem_set = shared_mem
        if packed:
            ptrs = (ctypes.c_void_p * len(packed))(*[ctypes.addressof(o) for o in packed])
            params: Any = ctypes.addressof(ptrs)
        else:
            params = None
        stream_h = drv.CUstream(_stream_handle(stream))
        call = "cuLaunchKernel"
        try:
            if programmatic and self.programmatic_capable and os.environ.get("TRTCORE_CUDA_PDL", "1") != "0":
                call = "cuLaunchKernelEx"
                result = drv.cuLaunchKernelEx(programmatic_config((gx, gy, gz), (bx, by, bz), shared_mem, stream_h), self.handle, params, 0)
            else:
                result = drv.cuLaunchKernel(self.handle, gx, gy, gz, bx, by, bz, shared_mem, stream_h, params, 0)
        except Exception as exc:
            raise CUDAError(f"{call}({self.name}) failed: {exc}", call=call) from exc
        _check(result, f"{call}({self.name}, grid=({gx}, {gy}, {gz}), block=({bx}, {by}, {bz}), shared_mem={shared_mem})")

    __call__ = launch
