"""Compile ``kernels/*.cu`` with NVRTC into CUBINs, through an on-disk cache.

Use it through the facade :mod:`trtcore.kernels`::

    from trtcore import kernels
    ck = kernels.compile_kernel("rope", defines={"HEAD_DIM": 128, "DTYPE": "__half"}, arch="sm_90")
    ck.cubin            # bytes: an ELF CUBIN for sm_90
    fn = ck.function("rope_neox")   # needs a GPU; see trtcore.kernels.launch

NVRTC needs no GPU: with ``arch`` given, CUBINs for any architecture NVRTC supports are
built on a CPU-only machine (CI compiles every kernel variant for sm_80, sm_89 and sm_90).

Compilation options, always::

    --gpu-architecture=sm_XY --std=c++17 -default-device
    -I<dir of the .cu>  -I<trtcore/kernels>  -I<CUDA include dir>
    -DNAME=VALUE ...    (defines, sorted by name)
    <options given by the caller>

``-default-device`` makes unannotated functions (e.g. ``constexpr`` helpers) device
functions. The CUDA include dir (for ``<cuda_fp16.h>``, ``<cuda_bf16.h>``) is the first of:
the ``nvidia-cuda-runtime`` wheel (``site-packages/nvidia/cu13/include``, older layout
``nvidia/cuda_runtime/include``), ``$CUDA_HOME/include``, ``$CUDA_PATH/include``,
``/usr/local/cuda/include`` that has ``cuda_fp16.h``.

Cache: ``$TRTCORE_CACHE/kernels`` (default ``platformdirs.user_cache_dir("trtcore")/kernels``,
see :func:`trtcore.cache_dir.cache_dir`), one file ``<name>.<arch>.<key>.cubin`` per
compile. The key is the SHA-256 of: the source; the name and content of every local header it
includes, recursively (``#include "x.cuh"`` or ``<x.cuh>`` found in the including file's
folder, the .cu's folder, ``kernels/`` or a ``-I`` folder given in ``options``; CUDA's own
headers are covered by their version and a hash of the fp16/bf16 headers); the full option
list (defines sorted; the three folders above enter by role, not by path, so the cache
survives moving the installation); the arch; and the NVRTC version (:func:`nvrtc_version`).
Files are written by :func:`trtcore.fileio.write_atomic` (a temporary file in the cache
folder, renamed into place), so concurrent processes never see a partial file; a file that is not a
complete CUBIN for the arch is ignored and rebuilt. A cache folder that cannot be written only
warns (:class:`RuntimeWarning`); the kernel is compiled all the same.

Variants: a ``.cu`` file declares the define-sets :func:`compile_all` builds in comment lines
``// trtcore-variants: <JSON list of objects>``; several such lines are concatenated before
parsing, e.g.::

    // trtcore-variants: [{"HEAD_DIM": 64, "DTYPE": "__half"},
    // trtcore-variants:  {"HEAD_DIM": 128, "DTYPE": "__nv_bfloat16"}]

Several complete lists one after another are joined (one list per line is fine too). A file
without such a line has one variant, ``{}`` (no defines); ``[]`` means none.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import struct
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtcore.cache_dir import cache_dir
from trtcore.errors import InvalidArgumentError
from trtcore.fileio import write_atomic
from trtcore.gpu import NoGPUError, compute_capability

from .errors import CUDAToolchainError, NVRTCError, cuda_bindings, result_name

if TYPE_CHECKING:
    from .launch import KernelFunction

__all__ = [
    "KERNEL_DIR",
    "CompiledKernel",
    "DefineValue",
    "compile_all",
    "compile_kernel",
    "cubin_arch",
    "cubin_kernel_names",
    "cuda_include_dir",
    "current_arch",
    "kernel_cache_dir",
    "list_kernels",
    "normalize_arch",
    "nvrtc_version",
    "supported_archs",
    "variants",
]

#: The folder of trtcore's kernel sources (installed as package data of ``trtcore.kernels``).
KERNEL_DIR = Path(__file__).resolve().parent

#: A define's value: ``bool`` becomes 0/1, ``int``/``float`` their decimal form, ``str`` verbatim.
DefineValue = int | float | str | bool

#: Options every compile gets (before ``-I``, defines and the caller's options).
BASE_OPTIONS: tuple[str, ...] = ("--std=c++17", "-default-device")

#: Bump when the cache file format or key recipe changes.
_CACHE_FORMAT = 1

_ELF_MAGIC = b"\x7fELF"
_EM_CUDA = 190
_STO_CUDA_ENTRY = 0x10


# ---------------------------------------------------------------------------------------
# NVRTC and CUDA headers
# ---------------------------------------------------------------------------------------


def _nvrtc() -> Any:
    """``cuda.bindings.nvrtc``, with a loadable NVRTC library behind it."""
    return cuda_bindings("nvrtc", "cuda-python nvidia-cuda-nvrtc")


@functools.lru_cache(maxsize=1)
def _nvrtc_version_cached() -> tuple[int, int]:
    nvrtc = _nvrtc()
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # libnvrtc not found / not loadable
        raise CUDAToolchainError(f"NVRTC library cannot be loaded ({exc}); pip install nvidia-cuda-nvrtc") from exc
    if int(err) != 0:
        raise CUDAToolchainError(f"nvrtcVersion failed: {result_name(err)}")
    return int(major), int(minor)


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's ``(major, minor)`` version, e.g. ``(13, 5)``. Part of every cache key.

    Raises:
        CUDAToolchainError: cuda-python is missing or the NVRTC library cannot be loaded.
    """
    return _nvrtc_version_cached()


@functools.lru_cache(maxsize=1)
def _supported_arch_numbers() -> tuple[int, ...]:
    nvrtc = _nvrtc()
    try:
        err, archs = nvrtc.nvrtcGetSupportedArchs()
    except Exception as exc:
        raise CUDAToolchainError(f"NVRTC library cannot be loaded ({exc}); pip install nvidia-cuda-nvrtc") from exc
    if int(err) != 0:
        raise CUDAToolchainError(f"nvrtcGetSupportedArchs failed: {result_name(err)}")
    return tuple(sorted(int(a) for a in archs))


def supported_archs() -> list[str]:
    """The real architectures this NVRTC can build CUBINs for, e.g. ``["sm_75", ..., "sm_90", ...]``.

    Raises:
        CUDAToolchainError: NVRTC is not available.
    """
    return [f"sm_{a}" for a in _supported_arch_numbers()]


def _include_candidates() -> list[Path]:
    out: list[Path] = []
    try:
        import nvidia  # namespace package of the nvidia-* wheels

        roots = [Path(p) for p in getattr(nvidia, "__path__", [])]
    except ImportError:
        roots = []
    for root in roots:
        for sub in ("cu13/include", "cuda_runtime/include", "cu12/include"):
            out.append(root / sub)
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            out.append(Path(os.environ[env]) / "include")
    out.append(Path("/usr/local/cuda/include"))
    return out


@functools.lru_cache(maxsize=4)
def _find_cuda_include(env_key: tuple[str | None, str | None]) -> Path:
    candidates = _include_candidates()
    for d in candidates:
        if (d / "cuda_fp16.h").is_file():
            return d.resolve()
    looked = ", ".join(str(d) for d in candidates)
    raise CUDAToolchainError(
        f"CUDA headers not found (no cuda_fp16.h in {looked}); pip install nvidia-cuda-runtime, or set CUDA_HOME to a CUDA toolkit"
    )


def cuda_include_dir() -> Path:
    """The CUDA include directory given to NVRTC (``-I``): see the module docstring for the
    search order.

    Raises:
        CUDAToolchainError: no candidate directory contains ``cuda_fp16.h``.
    """
    return _find_cuda_include((os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")))


@functools.lru_cache(maxsize=4)
def _cuda_headers_fingerprint(include_dir: Path) -> str:
    """CUDART_VERSION of the headers plus a hash of the headers kernels include most."""
    h = hashlib.sha256()
    version = "unknown"
    api = include_dir / "cuda_runtime_api.h"
    if api.is_file():
        m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", api.read_text(errors="replace"))
        if m:
            version = m.group(1)
    for name in ("cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h", "cuda_bf16.hpp", "cuda_fp8.h", "cuda_fp8.hpp"):
        p = include_dir / name
        if p.is_file():
            h.update(name.encode() + b"\0" + p.read_bytes() + b"\0")
    return f"{version}:{h.hexdigest()[:16]}"


def kernel_cache_dir() -> Path:
    """Where CUBINs are cached: ``$TRTCORE_CACHE/kernels``, default
    ``platformdirs.user_cache_dir("trtcore")/kernels`` (:func:`trtcore.cache_dir.cache_dir`).
    Not created by this call."""
    return cache_dir() / "kernels"


# ---------------------------------------------------------------------------------------
# arch strings
# ---------------------------------------------------------------------------------------

_ARCH_RE = re.compile(r"^(?:sm_?)?(\d{2,3})([af]?)$", re.IGNORECASE)
_ARCH_DOT_RE = re.compile(r"^(\d{1,2})\.(\d)([af]?)$", re.IGNORECASE)


def normalize_arch(arch: str | int | tuple[int, int]) -> str:
    """Canonical ``"sm_XY"`` for an architecture given as ``"sm_90"``, ``"sm90"``, ``"90"``,
    ``"9.0"``, ``90`` or ``(9, 0)`` (an ``a``/``f`` suffix is kept: ``"sm_90a"``).

    Raises:
        InvalidArgumentError: the string cannot be parsed, or this NVRTC cannot build CUBINs
            for that architecture (the message lists the ones it can).
        CUDAToolchainError: NVRTC is not available (needed to check the arch).
    """
    suffix = ""
    if isinstance(arch, tuple) and len(arch) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in arch):
        number = arch[0] * 10 + arch[1]
    elif isinstance(arch, int) and not isinstance(arch, bool):
        number = arch
    elif isinstance(arch, str):
        s = arch.strip()
        m = _ARCH_RE.match(s)
        if m:
            number, suffix = int(m.group(1)), m.group(2).lower()
        elif (m := _ARCH_DOT_RE.match(s)) is not None:
            number, suffix = int(m.group(1)) * 10 + int(m.group(2)), m.group(3).lower()
        else:
            number = -1
    else:
        number = -1
    if number < 10:
        raise InvalidArgumentError(f"bad CUDA arch {arch!r}: expected e.g. 'sm_90', 'sm90', '90' or '9.0'")
    supported = _supported_arch_numbers()
    if number not in supported:
        v = ".".join(map(str, nvrtc_version()))
        raise InvalidArgumentError(
            f"NVRTC {v} cannot build CUBINs for sm_{number} (from {arch!r}); it supports {', '.join(f'sm_{a}' for a in supported)}"
        )
    return f"sm_{number}{suffix}"


def current_arch() -> str:
    """The ``"sm_XY"`` to compile for on the current GPU: its compute capability, or where
    this NVRTC cannot target it exactly, the highest SM of the same major and a minor not
    above the GPU's (CUBINs run on later minors of their major).

    Raises:
        NoGPUError: no usable GPU -- pass ``arch="sm_90"`` (etc.) to compile without one.
        InvalidArgumentError: NVRTC supports no SM this GPU can run.
        CUDAToolchainError: NVRTC is not available.
    """
    try:
        major, minor = compute_capability()
    except NoGPUError as exc:
        raise NoGPUError(
            f"no GPU to compile for ({exc}); pass arch='sm_90' (or sm_80, sm_89, ...) to compile without one", call=exc.call, result=exc.result
        ) from exc
    want = major * 10 + minor
    usable = [a for a in _supported_arch_numbers() if a // 10 == major and a <= want]
    if not usable:
        v = ".".join(map(str, nvrtc_version()))
        raise InvalidArgumentError(f"NVRTC {v} cannot build CUBINs for this GPU (compute capability {major}.{minor}); upgrade nvidia-cuda-nvrtc")
    return f"sm_{max(usable)}"


def _arch_number(arch: str) -> int:
    return int(re.sub(r"[^0-9]", "", arch))


# ---------------------------------------------------------------------------------------
# CUBIN (ELF) inspection
# ---------------------------------------------------------------------------------------


def _elf_header(cubin: bytes) -> tuple[int, int, int, int, int, int]:
    """(osabi, e_machine, e_flags, e_shoff, e_shentsize, e_shnum) of a 64-bit little-endian ELF."""
    if len(cubin) < 64 or cubin[:4] != _ELF_MAGIC or cubin[4] != 2 or cubin[5] != 1:
        raise InvalidArgumentError("not a CUBIN: no 64-bit little-endian ELF header")
    (machine,) = struct.unpack_from("<H", cubin, 18)
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    (flags,) = struct.unpack_from("<I", cubin, 0x30)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    return cubin[7], machine, flags, shoff, shentsize, shnum


def cubin_arch(cubin: bytes) -> str:
    """The SM a CUBIN was built for, read from its ELF header, e.g. ``"sm_90"``.

    CUDA ELF files have ``e_machine == EM_CUDA (190)``; the SM number sits in ``e_flags``:
    bits 8-15 for ABI version 8 (``EI_OSABI == 0x41``, CUDA 12.8+ toolchains), bits 0-7 for
    the older ABI (``EI_OSABI == 0x33``). (Checked against ``nvcc -cubin -arch=sm_XY``.)

    Raises:
        InvalidArgumentError: ``cubin`` is not a CUDA ELF file.
    """
    osabi, machine, flags, *_ = _elf_header(cubin)
    if machine != _EM_CUDA:
        raise InvalidArgumentError(f"not a CUBIN: ELF e_machine is {machine}, not EM_CUDA (190)")
    sm = (flags >> 8) & 0xFF if osabi == 0x41 else flags & 0xFF
    return f"sm_{sm}"


def _sections(cubin: bytes) -> list[tuple[str, int, int, int, int]]:
    """(name, type, offset, size, link) of every ELF section."""
    _, _, _, shoff, shentsize, shnum = _elf_header(cubin)
    raw = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    (shstrndx,) = struct.unpack_from("<H", cubin, 0x3E)
    strtab_off = raw[shstrndx][4]

    def name_at(off: int) -> str:
        end = cubin.index(b"\0", strtab_off + off)
        return cubin[strtab_off + off : end].decode(errors="replace")

    return [(name_at(r[0]), r[1], r[4], r[5], r[6]) for r in raw]


def cubin_kernel_names(cubin: bytes) -> list[str]:
    """The kernel entry points (``__global__`` functions) in a CUBIN, sorted: ELF function
    symbols marked ``STO_CUDA_ENTRY``. ``extern "C"`` kernels appear under their source name,
    others mangled.

    Raises:
        InvalidArgumentError: ``cubin`` is not an ELF file.
    """
    names: list[str] = []
    sections = _sections(cubin)
    for _, typ, off, size, link in sections:
        if typ != 2:  # SHT_SYMTAB
            continue
        str_off = sections[link][2]
        for j in range(size // 24):
            st_name, st_info, st_other = struct.unpack_from("<IBB", cubin, off + j * 24)
            if (st_info & 0xF) == 2 and (st_other & _STO_CUDA_ENTRY):  # STT_FUNC, entry
                end = cubin.index(b"\0", str_off + st_name)
                names.append(cubin[str_off + st_name : end].decode(errors="replace"))
    return sorted(set(names))


#: ``.nv.info`` attribute formats (the size of what follows the format and attribute bytes) and
#: the attribute holding a function's registers per thread (EIATTR_REGCOUNT: symbol index, count)
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
_EIATTR_REGCOUNT = 0x2F


def cubin_register_counts(cubin: bytes) -> dict[str, int]:
    """Registers per thread of each function in a CUBIN (``{name: count}``), read from its
    ``.nv.info`` section (``EIATTR_REGCOUNT``, what ``cuobjdump --dump-resource-usage`` prints as
    REG), no GPU needed. The count sets how many blocks an SM keeps resident: 65,536 registers
    per SM on compute capability 8.0-9.0 (CUDA C++ Programming Guide, "Technical
    Specifications").

    Raises:
        InvalidArgumentError: ``cubin`` is not an ELF file.
    """
    sections = _sections(cubin)
    by_symbol: dict[int, int] = {}
    symtab = None
    for name, typ, off, size, link in sections:
        if typ == 2:  # SHT_SYMTAB
            symtab = (off, size, sections[link][2])
        if name != ".nv.info":
            continue
        p, end = off, off + size
        while p + 2 <= end:
            fmt, attr = cubin[p], cubin[p + 1]
            if fmt == _EIFMT_SVAL:
                (n,) = struct.unpack_from("<H", cubin, p + 2)
                if attr == _EIATTR_REGCOUNT and n == 8:
                    sym, count = struct.unpack_from("<II", cubin, p + 4)
                    by_symbol[sym] = count
                p += 4 + n
            elif fmt in (_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL):
                p += 4  # format, attribute and a value of up to two bytes, padded to four
            else:
                break  # an unknown format: the rest cannot be read
    out: dict[str, int] = {}
    if symtab is not None:
        off, _, str_off = symtab
        for sym, count in by_symbol.items():
            (st_name,) = struct.unpack_from("<I", cubin, off + sym * 24)
            end = cubin.index(b"\0", str_off + st_name)
            out[cubin[str_off + st_name : end].decode(errors="replace")] = count
    return out


def _is_complete_cubin(data: bytes, arch: str) -> bool:
    try:
        _, machine, _, shoff, shentsize, shnum = _elf_header(data)
        return machine == _EM_CUDA and shoff + shentsize * shnum <= len(data) and _arch_number(cubin_arch(data)) == _arch_number(arch)
    except (InvalidArgumentError, struct.error):
        return False


# ---------------------------------------------------------------------------------------
# the compiled kernel
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CompiledKernel:
    """A kernel source compiled (or taken from the cache) for one arch and define-set.

    Attributes:
        name: the kernel file's stem (``"rope"`` for ``kernels/rope.cu``).
        arch: canonical target, e.g. ``"sm_90"``.
        defines: the defines it was compiled with (a copy).
        key: the cache key (64 hex digits, SHA-256).
        cubin: the ELF CUBIN (bytes).
        from_cache: ``True`` when the CUBIN was read from the disk cache, ``False`` when NVRTC
            compiled it in this call.
        log: NVRTC's log (warnings) of this compile; empty when ``from_cache``.
        source: absolute path of the ``.cu`` file.
        options: the complete NVRTC option list used.
        seconds: wall time of this call (compile or cache read), in seconds.
    """

    name: str
    arch: str
    defines: Mapping[str, DefineValue]
    key: str
    cubin: bytes = field(repr=False)
    from_cache: bool
    log: str
    source: Path
    options: tuple[str, ...] = field(repr=False)
    seconds: float = field(default=0.0, repr=False)

    @property
    def symbols(self) -> list[str]:
        """Names of the kernels (``__global__`` entry points) in :attr:`cubin`, sorted."""
        return cubin_kernel_names(self.cubin)

    def function(self, symbol: str) -> KernelFunction:
        """Load this CUBIN into the current device's primary context (once per device) and
        return the kernel ``symbol`` (an ``extern "C" __global__`` name) ready to launch.

        Needs a GPU of a compatible compute capability (same major, minor >= the CUBIN's).
        See :class:`trtcore.kernels.KernelFunction`.

        Raises:
            InvalidArgumentError: the CUBIN has no kernel ``symbol`` (the message lists those it
                has), or it was built for an arch the current GPU cannot run.
            NoGPUError: no usable GPU.
            CUDAError: the driver refused to load the module.
        """
        from .launch import load_function

        return load_function(self, symbol)


# ---------------------------------------------------------------------------------------
# sources, headers, keys
# ---------------------------------------------------------------------------------------


def _resolve_source(name: str | os.PathLike[str]) -> Path:
    p = Path(name)
    if p.is_absolute():
        if p.suffix != ".cu" or not p.is_file():
            raise InvalidArgumentError(f"kernel source {p} is not an existing .cu file")
        return p.resolve()
    stem = p.name[:-3] if p.name.endswith(".cu") else p.name
    if p.parent != Path(".") or not stem or not re.fullmatch(r"[A-Za-z0-9_.\-]+", stem):
        raise InvalidArgumentError(f"bad kernel name {str(name)!r}: give a file name from kernels/ (e.g. 'rope') or an absolute path to a .cu file")
    src = KERNEL_DIR / f"{stem}.cu"
    if not src.is_file():
        raise InvalidArgumentError(f"no kernel {stem!r} in {KERNEL_DIR} (kernels: {', '.join(list_kernels()) or 'none'})")
    return src


_DEFINE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _define_options(defines: Mapping[str, DefineValue]) -> list[str]:
    out = []
    for k in sorted(defines):
        v = defines[k]
        if not isinstance(k, str) or not _DEFINE_NAME.fullmatch(k):
            raise InvalidArgumentError(f"bad define name {k!r}: must be a C identifier")
        if isinstance(v, bool):
            text = "1" if v else "0"
        elif isinstance(v, int):
            text = str(v)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise InvalidArgumentError(f"define {k}={v!r}: not a finite number")
            text = repr(v)
        elif isinstance(v, str):
            if any(c in v for c in "\r\n\0"):
                raise InvalidArgumentError(f"define {k}={v!r}: value contains a line break or NUL")
            text = v
        else:
            raise InvalidArgumentError(f"define {k}={v!r}: value must be int, float, str or bool, not {type(v).__name__}")
        out.append(f"-D{k}={text}")
    return out


def _user_include_dirs(options: Sequence[str]) -> list[Path]:
    dirs: list[Path] = []
    it = iter(options)
    for o in it:
        if o in ("-I", "--include-path"):
            nxt = next(it, None)
            if nxt is not None:
                dirs.append(Path(nxt))
        elif o.startswith("--include-path="):
            dirs.append(Path(o.split("=", 1)[1]))
        elif o.startswith("-I"):
            dirs.append(Path(o[2:]))
    return dirs


_INCLUDE_RE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^">\r\n]+)[">]', re.MULTILINE)


def _local_headers(source: Path, text: bytes, search: Sequence[Path]) -> list[tuple[str, str]]:
    """``(name as included, sha256 of content)`` of every local header reachable from the
    source, depth-first in include order; headers not found locally (CUDA's) are skipped."""
    seen: set[Path] = set()
    out: list[tuple[str, str]] = []

    def visit(path: Path, content: bytes) -> None:
        for m in _INCLUDE_RE.finditer(content):
            kind, name = m.group(1).decode(), m.group(2).decode(errors="replace").strip()
            dirs = ([path.parent] if kind == '"' else []) + list(search)
            for d in dirs:
                cand = d / name
                if cand.is_file():
                    real = cand.resolve()
                    if real not in seen:
                        seen.add(real)
                        data = real.read_bytes()
                        out.append((name, hashlib.sha256(data).hexdigest()))
                        visit(real, data)
                    break

    seen.add(source)
    visit(source, text)
    return out


def _cache_key(
    source: Path, text: bytes, options: Sequence[str], key_options: Sequence[str], arch: str, search: Sequence[Path], include_dir: Path
) -> str:
    recipe = {
        "format": _CACHE_FORMAT,
        "file": source.name,
        "source": hashlib.sha256(text).hexdigest(),
        "headers": _local_headers(source, text, search),
        "options": list(key_options),
        "arch": arch,
        "nvrtc": list(nvrtc_version()),  # module-level lookup: tests monkeypatch it
        "cuda_headers": _cuda_headers_fingerprint(include_dir),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------------------
# compile
# ---------------------------------------------------------------------------------------


def _run_nvrtc(source: Path, text: bytes, options: Sequence[str], arch: str, defines: Mapping[str, DefineValue]) -> tuple[bytes, str]:
    nvrtc = _nvrtc()
    nvrtc_version()  # fails clearly if the library is missing
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(text, str(source).encode(), 0, [], [])
    if err != ok:
        raise NVRTCError(str(source), arch, defines, options, result_name(err), "")
    try:
        opts = [o.encode() for o in options]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = ""
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        if err == ok and size > 1:
            buf = b" " * size
            (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
            log = buf.rstrip(b"\0").decode(errors="replace")
        if res != ok:
            raise NVRTCError(str(source), arch, defines, options, result_name(res), log)
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        if err != ok or size == 0:
            raise NVRTCError(str(source), arch, defines, options, f"nvrtcGetCUBINSize: {result_name(err)} (size {size})", log)
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        if err != ok:
            raise NVRTCError(str(source), arch, defines, options, f"nvrtcGetCUBIN: {result_name(err)}", log)
        return bytes(cubin), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_kernel(
    name: str | os.PathLike[str],
    *,
    defines: Mapping[str, DefineValue] | None = None,
    arch: str | int | tuple[int, int] | None = None,
    options: Sequence[str] = (),
) -> CompiledKernel:
    """Compile a kernel source with NVRTC into a CUBIN, or take it from the disk cache.

    Args:
        name: a kernel in ``kernels/`` by stem (``"rope"``; ``"rope.cu"`` works too), or an
            absolute path to a ``.cu`` file anywhere.
        defines: macros, passed as ``-DNAME=VALUE`` sorted by name; ``bool`` -> ``0``/``1``,
            ``int``/``float`` in decimal (floats must be finite), ``str`` verbatim (e.g.
            ``{"DTYPE": "__nv_bfloat16"}``). Names must be C identifiers; CUDA's headers see
            them too, so avoid short names such as ``T`` (template parameter names there).
        arch: target architecture (``"sm_90"``, ``"sm90"``, ``"90"``, ``"9.0"``, see
            :func:`normalize_arch`); ``None`` compiles for the current GPU (the CUDA runtime's
            current device; where this NVRTC lacks that exact SM, the highest one of the same
            major that the GPU can run).
        options: extra NVRTC options, appended after trtcore's (e.g. ``["-lineinfo"]``,
            ``["--use_fast_math"]``). Part of the cache key.

    Returns:
        A :class:`CompiledKernel` (``from_cache`` says whether NVRTC ran).

    Raises:
        InvalidArgumentError: unknown kernel, bad define, or bad/unsupported ``arch``.
        NVRTCError: the source does not compile (NVRTC's full log is in the message).
        CUDAToolchainError: NVRTC or the CUDA headers are missing.
        NoGPUError: ``arch`` is ``None`` and there is no usable GPU.
    """
    t0 = time.perf_counter()
    source = _resolve_source(name)
    defines = dict(defines or {})
    if isinstance(options, str):
        raise InvalidArgumentError("options must be a sequence of strings, not one string")
    options = [str(o) for o in options]
    if arch is None:
        arch_s = current_arch()
    else:
        arch_s = normalize_arch(arch)
    define_opts = _define_options(defines)
    include_dir = cuda_include_dir()

    folders: list[tuple[str, Path]] = [("source-dir", source.parent)]
    if source.parent != KERNEL_DIR:
        folders.append(("kernels", KERNEL_DIR))
    folders.append(("cuda-include", include_dir))
    full = [f"--gpu-architecture={arch_s}", *BASE_OPTIONS, *(f"-I{p}" for _, p in folders), *define_opts, *options]
    key_opts = [f"--gpu-architecture={arch_s}", *BASE_OPTIONS, *(f"-I<{role}>" for role, _ in folders), *define_opts, *options]
    search = [source.parent, KERNEL_DIR, *_user_include_dirs(options)]

    text = source.read_bytes()
    key = _cache_key(source, text, full, key_opts, arch_s, search, include_dir)
    stem = source.name[:-3]
    path = kernel_cache_dir() / f"{stem}.{arch_s}.{key}.cubin"
    try:
        data = path.read_bytes()
    except OSError:
        data = b""
    if data and _is_complete_cubin(data, arch_s):
        return CompiledKernel(stem, arch_s, defines, key, data, True, "", source, tuple(full), time.perf_counter() - t0)

    cubin, log = _run_nvrtc(source, text, full, arch_s, defines)
    try:
        write_atomic(path, cubin, mode=0o644)
    except (OSError, InvalidArgumentError) as exc:
        warnings.warn(
            f"trtcore.kernels: cannot write the kernel cache {path.parent} ({exc}); kernels will be recompiled next time",
            RuntimeWarning,
            stacklevel=2,
        )
    return CompiledKernel(stem, arch_s, defines, key, cubin, False, log, source, tuple(full), time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------
# kernels and variants
# ---------------------------------------------------------------------------------------


def list_kernels(directory: str | os.PathLike[str] | None = None) -> list[str]:
    """Stems of the ``.cu`` files in ``directory`` (default: trtcore's ``kernels/``), sorted."""
    d = Path(directory) if directory is not None else KERNEL_DIR
    return sorted(p.name[:-3] for p in d.glob("*.cu") if p.is_file())


_VARIANTS_RE = re.compile(r"^[ \t]*//[ \t]*trtcore-variants:(.*)$", re.MULTILINE)


def variants(name: str | os.PathLike[str]) -> list[dict[str, DefineValue]]:
    """The define-sets a kernel declares for :func:`compile_all`, from its
    ``// trtcore-variants: <JSON>`` comment lines. The text after the marker of all such lines
    is concatenated and parsed as one JSON list of objects -- or as several lists one after
    another, whose entries are joined (so each line may hold a complete list). Repeated
    define-sets count once. Without such lines: ``[{}]`` (one variant, no defines).

    Args:
        name: as for :func:`compile_kernel` (stem in ``kernels/`` or absolute ``.cu`` path).

    Raises:
        InvalidArgumentError: unknown kernel, or the declaration is not a JSON list of objects
            mapping identifiers to int/float/str/bool.
    """
    source = _resolve_source(name)
    text = source.read_text(errors="replace")
    parts = _VARIANTS_RE.findall(text)
    if not parts:
        return [{}]
    blob = "\n".join(parts)
    decoder = json.JSONDecoder()
    value: list[Any] = []
    pos = 0
    while True:  # one JSON list, or several lists one after another (concatenated)
        while pos < len(blob) and blob[pos].isspace():
            pos += 1
        if pos == len(blob):
            break
        try:
            item, pos = decoder.raw_decode(blob, pos)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{source}: '// trtcore-variants:' is not valid JSON ({exc}): {blob.strip()!r}") from exc
        if not isinstance(item, list) or not all(isinstance(v, dict) for v in item):
            raise InvalidArgumentError(f"{source}: '// trtcore-variants:' must be JSON lists of objects, got {json.dumps(item)[:200]}")
        value.extend(item)
    for v in value:
        for k, x in v.items():
            if not _DEFINE_NAME.fullmatch(k) or not isinstance(x, (int, float, str, bool)):
                raise InvalidArgumentError(f"{source}: variant {v}: {k!r}={x!r} is not identifier -> int/float/str/bool")
    unique: list[dict[str, DefineValue]] = []
    for v in value:  # a define-set listed twice is built once
        if v not in unique:
            unique.append(v)
    return unique


def compile_all(
    arch: str | int | tuple[int, int] | None = None,
    *,
    directory: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
) -> list[CompiledKernel]:
    """Compile every declared variant (:func:`variants`) of every kernel (:func:`list_kernels`).

    Args:
        arch: as for :func:`compile_kernel` (``None``: the current GPU).
        directory: compile the ``.cu`` files of this folder instead of trtcore's ``kernels/``.
        jobs: compile this many in parallel threads (NVRTC releases the GIL); default
            ``min(8, os.cpu_count())``.

    Returns:
        The compiled kernels, in kernel then variant order (cached ones have ``from_cache``).

    Raises:
        NVRTCError: the first variant (in that order) that failed to compile.
        Everything :func:`compile_kernel` raises.
    """
    from concurrent.futures import ThreadPoolExecutor

    d = Path(directory).resolve() if directory is not None else KERNEL_DIR
    arch_s = normalize_arch(arch) if arch is not None else None
    jobs_list = [(d / f"{k}.cu", v) for k in list_kernels(d) for v in variants(d / f"{k}.cu")]
    if not jobs_list:
        return []
    workers = max(1, jobs if jobs is not None else min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(compile_kernel, p, defines=v, arch=arch_s) for p, v in jobs_list]
        return [f.result() for f in futures]
