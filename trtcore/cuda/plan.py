"""The serialized form of a cuda engine: a :class:`Plan`.

A plan holds everything another process needs to run the engine: the compiled graph (its
constants are the weights, in the engine's types), the optimization profile, each generated
kernel's source and NVRTC compile key, the GEMM tactic choices, the memory plan, and the
build log. ``Builder.build_serialized_network`` serializes it (:func:`dumps`: a pickle with the
arrays' bytes beside it) and ``Runtime.deserialize_cuda_engine`` loads it (:func:`loads`; load
only plans you built yourself, as with any pickle).
"""

from __future__ import annotations

import io
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import NetworkError
from .codegen import KernelSource
from .ir import Graph

#: bump when the plan's layout changes
FORMAT = "trtcore-cuda-plan-1"


@dataclass
class KernelInfo:
    """One launch of the engine: ``name``, ``kind`` (``pointwise_group``, ``row_group``,
    ``gemm``, ``plugin``, ``copy``, ...), the network ``layers`` it came from, and the source
    ``key`` of a generated kernel (empty for GEMMs and plugins)."""

    name: str
    kind: str
    layers: list[str]
    key: str


@dataclass
class Plan:
    """A compiled engine: ``graph`` (after every pass; constants in the engine's types),
    ``profile`` (input -> (min, opt, max)), ``sources`` (node name -> generated kernel),
    ``compile_keys`` (node name -> NVRTC cache key, where compiled at build), ``arch``,
    ``kernels`` (the launches, with their layers), ``offsets`` / ``sizes`` (bytes, per planned
    buffer), ``device_memory_size`` (bytes), ``tactics`` (per GEMM), ``build_log``, ``stats``."""

    format: str
    graph: Graph
    profile: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
    sources: dict[str, KernelSource]
    compile_keys: dict[str, str]
    arch: str | None
    kernels: list[KernelInfo]
    offsets: dict[str, int]
    sizes: dict[str, int]
    device_memory_size: int
    tactics: dict[str, dict[str, Any]]
    build_log: list[str]
    stats: dict[str, Any]


#: the first bytes of a plan serialized by :func:`dumps`
MAGIC = b"TRTCPLN2"
#: arrays' bytes start at multiples of this offset in the serialized plan
_ALIGN = 64
_HEADER = struct.Struct("<8sQQ")  # MAGIC, pickle bytes, number of buffers; then (offset, length) each


def _from_bits(bits: np.ndarray, scalar_type: Any) -> np.ndarray:
    return bits.view(scalar_type)


class _Pickler(pickle.Pickler):
    """Protocol 5 with out-of-band buffers. NumPy pickles arrays of extension dtypes
    (ml_dtypes' bfloat16 and float8) in band, element-wise slow (0.24 GB/s on this project's
    CI machine, where a uint16 view goes at memory speed), and never out of band: such an
    array travels as an unsigned view of the same bytes and its scalar type."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is np.ndarray and obj.dtype.isbuiltin != 1 and obj.dtype.kind == "V" and obj.dtype.names is None and not obj.dtype.hasobject:
            if obj.dtype.itemsize in (1, 2, 4, 8):
                return _from_bits, (np.ascontiguousarray(obj).view(f"u{obj.dtype.itemsize}"), obj.dtype.type)
        return NotImplemented


def dumps(plan: Plan) -> bytes:
    """``plan`` serialized: a header (:data:`MAGIC`, the pickle's length, the number of buffers,
    then each buffer's offset and length, little-endian uint64), the pickle (protocol 5), then
    the arrays' bytes out of band, each at an offset that is a multiple of 64 (the weights are
    copied once, not pickled element by element)."""
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(plan)
    body = stream.getbuffer()
    raws = [b.raw() for b in buffers]
    table = bytearray()
    parts: list[Any] = []
    at = _HEADER.size + 16 * len(raws) + len(body)
    for r in raws:
        pad = -at % _ALIGN
        parts += [bytes(pad), r]
        table += struct.pack("<QQ", at + pad, r.nbytes)
        at += pad + r.nbytes
    # one join: the weights are copied once, into memory not zeroed first
    return b"".join([_HEADER.pack(MAGIC, len(body), len(raws)), table, body, *parts])


def loads(data: bytes | bytearray | memoryview) -> Any:
    """The object :func:`dumps` wrote (or, without :data:`MAGIC`, one plain pickle: plans built
    before the format had it), a :class:`Plan` unless the bytes came from elsewhere
    (``ICudaEngine`` checks its ``format``). The arrays are views of ``data``, not copies:
    read-only when it is ``bytes``, and ``data`` stays in memory while any of them does.

    Raises:
        NetworkError: ``data`` is no serialized plan (truncated, or another file).
    """
    view = memoryview(data).cast("B")
    try:
        if bytes(view[:8]) != MAGIC:
            return pickle.loads(view)
        _, n_body, n_buf = _HEADER.unpack_from(view, 0)
        table = [struct.unpack_from("<QQ", view, _HEADER.size + 16 * i) for i in range(n_buf)]
        body_at = _HEADER.size + 16 * n_buf
        if body_at + n_body > len(view) or any(off + n > len(view) for off, n in table):
            raise ValueError(f"{len(view)} bytes, the header describes more")
        return pickle.loads(view[body_at : body_at + n_body], buffers=[view[off : off + n] for off, n in table])
    except Exception as exc:
        raise NetworkError(f"not a trtcore cuda plan: {exc}") from exc
