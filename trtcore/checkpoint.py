"""Read safetensors checkpoints tensor by tensor, through mmap, without torch.

A :class:`Checkpoint` opens ``model.safetensors``, a sharded checkpoint
(``model.safetensors.index.json`` + shards) or a directory holding one other
``*.safetensors`` file. Only the JSON headers are read up front; each :meth:`Checkpoint.get`
maps the tensor's bytes with :class:`numpy.memmap`, so loading a 16 GB checkpoint never
needs more RAM than the largest tensor (plus its converted copy).

The file format (https://github.com/huggingface/safetensors, "Format"): 8 bytes
little-endian unsigned header length ``N``; ``N`` bytes of UTF-8 JSON mapping each tensor
name to ``{"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}`` (offsets
relative to the byte after the header) plus an optional ``"__metadata__"`` string map; then
the data, little-endian, C order.

The header is parsed here rather than by ``safetensors.safe_open(framework="numpy")``: that
reader copies every tensor (no zero-copy view), can only produce bfloat16 when
``ml_dtypes`` happens to be imported first, and its errors do not say which file or tensor
is damaged.

bfloat16 (``"BF16"``) is returned as ``ml_dtypes.bfloat16``; ``F8_E4M3`` / ``F8_E5M2`` /
``F8_E8M0`` as the matching ``ml_dtypes`` float8 types.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtcore.dtypes import NAMES as _DTYPE_ALIASES
from trtcore.dtypes import SAFETENSORS_DTYPES
from trtcore.errors import CheckpointError, InvalidArgumentError, MissingTensorError, TensorShapeError

__all__ = ["KV_SCALE_MIN", "Checkpoint", "LazyTensor", "LoadReport", "SAFETENSORS_DTYPES", "kv_cache_scales", "read_safetensors_header"]

SINGLE_FILE_NAME = "model.safetensors"
INDEX_FILE_NAME = "model.safetensors.index.json"

# SAFETENSORS_DTYPES (safetensors code -> NumPy dtype) and _DTYPE_ALIASES (names accepted by
# Checkpoint.get(dtype=...) besides anything np.dtype() understands) come from trtcore.dtypes


@dataclass(frozen=True)
class _TensorInfo:
    file: Path
    dtype_code: str  # safetensors code, e.g. "BF16"
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def _fmt_shape(shape: Sequence[int]) -> str:
    return str(tuple(int(s) for s in shape))


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """Read and validate a safetensors file's JSON header.

    Args:
        path: the ``.safetensors`` file.

    Returns:
        ``(header, data_start)``: the decoded header (including ``"__metadata__"`` if
        present) and the absolute byte offset where the data section begins (``8 + N``).

    Raises:
        CheckpointError (naming the file): the file is unreadable, shorter than 8 bytes,
            its header length exceeds the file, the header is not a UTF-8 JSON object,
            an entry lacks/mistypes ``dtype``/``shape``/``data_offsets``, an entry's
            offsets lie outside the data section, or (for known dtypes) the byte span
            does not match ``prod(shape) * itemsize``.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(
                    f"corrupted safetensors file {path}: it has {size} bytes, fewer than the "
                    "8-byte header length that starts every safetensors file (truncated?)"
                )
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise CheckpointError(
                    f"corrupted safetensors header in {path}: the header length field says "
                    f"{n} bytes but the file has only {size - 8} bytes after it (truncated or "
                    "not a safetensors file)"
                )
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"cannot read safetensors file {path}: {e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"corrupted safetensors header in {path}: the {n}-byte header is not valid UTF-8 JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"corrupted safetensors header in {path}: expected a JSON object, got {type(header).__name__}")
    data_start = 8 + n
    data_size = size - data_start
    for name, info in header.items():
        if name == "__metadata__":
            if info is not None and not isinstance(info, dict):
                raise CheckpointError(f"corrupted safetensors header in {path}: '__metadata__' is {info!r}, expected an object")
            continue
        bad = f"corrupted safetensors header in {path}: tensor '{name}'"
        if not isinstance(info, dict):
            raise CheckpointError(f"{bad} has entry {info!r}, expected an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str):
            raise CheckpointError(f"{bad} has dtype {dtype!r}, expected a string such as 'BF16'")
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise CheckpointError(f"{bad} has shape {shape!r}, expected a list of integers >= 0")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise CheckpointError(f"{bad} has data_offsets {offsets!r}, expected [begin, end] with 0 <= begin <= end")
        if offsets[1] > data_size:
            raise CheckpointError(
                f"{bad} has data_offsets {offsets} beyond the end of the data section "
                f"({data_size} bytes; file size {size}): the file is truncated or corrupted"
            )
        np_dtype = SAFETENSORS_DTYPES.get(dtype)
        if np_dtype is not None:
            want = math.prod(shape) * np_dtype.itemsize
            if offsets[1] - offsets[0] != want:
                raise CheckpointError(
                    f"{bad} ({dtype}, shape {_fmt_shape(shape)}) needs {want} bytes, but its "
                    f"data_offsets {offsets} span {offsets[1] - offsets[0]} bytes"
                )
    return header, data_start


class Checkpoint:
    """Lazy, mmap-backed reader of a (possibly sharded) safetensors checkpoint.

    Args:
        model_dir: a model directory, or directly a ``.safetensors`` file or a
            ``*.safetensors.index.json``. In a directory, the first that exists is used
            (Hugging Face's order): ``model.safetensors``; ``model.safetensors.index.json``;
            a single other ``*.safetensors.index.json``; a single other ``*.safetensors``.

    Raises:
        CheckpointError: the path does not exist; no safetensors file is found (names the
            directory and what was looked for); several candidate files and no index; the
            index is invalid or names a missing shard or a tensor its shard lacks; a
            header is corrupted (see :func:`read_safetensors_header`).

    Use as a context manager or call :meth:`close`. Not thread-safe to close while reading.
    """

    def __init__(self, model_dir: str | os.PathLike[str]):
        path = Path(model_dir)
        self.model_dir: Path = path if path.is_dir() else path.parent
        self._infos: dict[str, _TensorInfo] = {}
        self._maps: dict[Path, np.memmap] = {}
        self._metadata: dict[Path, dict[str, str]] = {}
        self._closed = False
        self.index_file: Path | None = None
        if not path.exists():
            raise CheckpointError(f"checkpoint path {path} does not exist")
        if path.is_file():
            if path.name.endswith(".safetensors.index.json"):
                self._load_index(path)
            elif path.name.endswith(".safetensors"):
                self._load_file(path)
            else:
                raise CheckpointError(f"{path} is neither a .safetensors file nor a .safetensors.index.json")
        else:
            self._discover(path)
        self._names = sorted(self._infos)

    # -- opening ----------------------------------------------------------------------------

    def _discover(self, d: Path) -> None:
        single, index = d / SINGLE_FILE_NAME, d / INDEX_FILE_NAME
        if single.is_file():
            self._load_file(single)
            return
        if index.is_file():
            self._load_index(index)
            return
        indexes = sorted(p for p in d.glob("*.safetensors.index.json") if p.is_file())
        if len(indexes) == 1:
            self._load_index(indexes[0])
            return
        files = sorted(p for p in d.glob("*.safetensors") if p.is_file())
        if len(indexes) > 1 or len(files) > 1:
            found = [p.name for p in (indexes if len(indexes) > 1 else files)]
            raise CheckpointError(
                f"checkpoint directory {d} has no {SINGLE_FILE_NAME} or {INDEX_FILE_NAME} "
                f"but several candidates {found}; pass one file, or add an index"
            )
        if not files:
            raise CheckpointError(
                f"no safetensors checkpoint in {d}: looked for {SINGLE_FILE_NAME}, {INDEX_FILE_NAME}, and any other *.safetensors[.index.json] file"
            )
        self._load_file(files[0])

    def _load_file(self, path: Path, only: set[str] | None = None) -> dict[str, Any]:
        header, data_start = read_safetensors_header(path)
        meta = header.pop("__metadata__", None) or {}
        self._metadata[path] = meta
        for name, info in header.items():
            if only is not None and name not in only:
                continue
            b, e = info["data_offsets"]
            self._infos[name] = _TensorInfo(path, info["dtype"], tuple(info["shape"]), data_start + b, data_start + e)
        return header

    def _load_index(self, index: Path) -> None:
        self.index_file = index
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"cannot read checkpoint index {index}: {e}") from None
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
            raise CheckpointError(
                f"invalid checkpoint index {index}: expected an object with a 'weight_map' mapping tensor names to shard file names"
            )
        by_shard: dict[str, list[str]] = {}
        for name, shard in wm.items():
            by_shard.setdefault(shard, []).append(name)
        for shard, names in sorted(by_shard.items()):
            shard_path = index.parent / shard
            if not shard_path.is_file():
                raise CheckpointError(
                    f"shard '{shard}' named in {index} is missing from {index.parent} ({len(names)} tensors map to it, e.g. '{names[0]}')"
                )
            header = self._load_file(shard_path, only=set(names))
            absent = [n for n in names if n not in header]
            if absent:
                raise CheckpointError(
                    f"checkpoint index {index} maps {len(absent)} tensors to shard '{shard}' but that shard does not contain them, e.g. '{absent[0]}'"
                )

    # -- queries ----------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """All tensor names, sorted (a new list each call)."""
        return list(self._names)

    @property
    def files(self) -> list[Path]:
        """The safetensors files backing this checkpoint, sorted."""
        return sorted(self._metadata)

    @property
    def metadata(self) -> dict[str, str]:
        """The merged ``__metadata__`` string maps of all files (e.g. ``{"format": "pt"}``)."""
        out: dict[str, str] = {}
        for p in self.files:
            out.update(self._metadata[p])
        return out

    def __contains__(self, name: object) -> bool:
        return name in self._infos

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.model_dir)!r}, {len(self)} tensors in {len(self._metadata)} files)"

    def _info(self, name: str) -> _TensorInfo:
        info = self._infos.get(name)
        if info is None:
            close = difflib.get_close_matches(name, self._names, n=3, cutoff=0.75)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise MissingTensorError(f"tensor '{name}' not found in checkpoint {self.model_dir} ({len(self._names)} tensors){hint}")
        return info

    def _np_dtype(self, name: str, info: _TensorInfo) -> np.dtype:
        dt = SAFETENSORS_DTYPES.get(info.dtype_code)
        if dt is None:
            raise CheckpointError(
                f"tensor '{name}' in {info.file} has safetensors dtype {info.dtype_code!r}, which "
                f"trtcore cannot read (supported: {sorted(SAFETENSORS_DTYPES)})"
            )
        return dt

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape, from the header (no data read).

        Raises:
            MissingTensorError: no such tensor (names the checkpoint, suggests near misses).
        """
        return self._info(name).shape

    def dtype(self, name: str) -> np.dtype:
        """The tensor's stored dtype as a NumPy dtype (``BF16`` -> ``ml_dtypes.bfloat16``).

        Raises:
            MissingTensorError: no such tensor.
            CheckpointError: a safetensors dtype trtcore has no NumPy type for (e.g. F4).
        """
        info = self._info(name)
        return self._np_dtype(name, info)

    def file_of(self, name: str) -> Path:
        """The file (shard) that holds ``name``.

        Raises:
            MissingTensorError: no such tensor.
        """
        return self._info(name).file

    def get(
        self,
        name: str,
        shape: Sequence[int] | None = None,
        dtype: Any = None,
        *,
        copy: bool = True,
    ) -> np.ndarray:
        """Read one tensor.

        Args:
            name: the tensor's name, e.g. ``"model.layers.0.self_attn.q_proj.weight"``.
            shape: if given, the expected shape; checked against the header *before* any
                data is read.
            dtype: if given, convert to it (anything ``np.dtype`` accepts, or ``"bf16"``,
                ``"bfloat16"``, ``"fp16"``, ``"fp32"``, or a safetensors code like ``"BF16"``).
                Conversions are NumPy/ml_dtypes ``astype``: exact when widening
                (bf16/f16 -> f32), round-to-nearest-even when narrowing.
            copy: True (default) returns a writable array owned by the caller. False
                returns a read-only view into the memory-mapped file when no conversion is
                needed (zero copy; it stays valid after :meth:`close`).

        Returns:
            ``np.ndarray`` of the tensor's shape; dtype the stored one (see :meth:`dtype`)
            unless ``dtype`` is given.

        Raises:
            MissingTensorError: no such tensor (names the tensor and the checkpoint dir,
                suggests close names).
            TensorShapeError: ``"tensor 'X' has shape (a, b) in FILE, expected (c, d)"``.
            CheckpointError: the checkpoint is closed, the stored dtype is unsupported, or
                ``dtype`` is not a dtype.
        """
        info = self._info(name)
        if shape is not None:
            want = tuple(int(s) for s in shape)
            if want != info.shape:
                raise TensorShapeError(f"tensor '{name}' has shape {_fmt_shape(info.shape)} in {info.file}, expected {_fmt_shape(want)}")
        src = self._np_dtype(name, info)
        target = None if dtype is None else self._resolve_dtype(dtype)
        view = self._view(info, src)
        if target is not None and target != src:
            return view.astype(target)
        return np.array(view) if copy else view

    @staticmethod
    def _resolve_dtype(dtype: Any) -> np.dtype:
        if isinstance(dtype, str) and dtype.lower() in _DTYPE_ALIASES:
            return _DTYPE_ALIASES[dtype.lower()]
        try:
            return np.dtype(dtype)
        except TypeError:
            raise CheckpointError(f"dtype {dtype!r} is not a NumPy dtype") from None

    def _view(self, info: _TensorInfo, dt: np.dtype) -> np.ndarray:
        """A read-only zero-copy view of the tensor's bytes in the mapped file."""
        if self._closed:
            raise CheckpointError(f"checkpoint {self.model_dir} is closed")
        count = info.end - info.start
        if count == 0:
            return np.zeros(info.shape, dt)
        mm = self._maps.get(info.file)
        if mm is None:
            try:
                mm = np.memmap(info.file, dtype=np.uint8, mode="r")
            except (OSError, ValueError) as e:
                raise CheckpointError(f"cannot map safetensors file {info.file}: {e}") from None
            self._maps[info.file] = mm
        if info.end > mm.size:
            raise CheckpointError(f"safetensors file {info.file} shrank to {mm.size} bytes after it was opened")
        arr = np.frombuffer(mm, dtype=dt, count=count // dt.itemsize, offset=info.start)
        return arr.reshape(info.shape)

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the file mappings; later :meth:`get` calls raise CheckpointError.

        Views returned with ``copy=False`` keep their mapping alive until they are freed.
        """
        self._closed = True
        self._maps.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LazyTensor:
    """A checkpoint tensor not read yet: its name, shape and dtype from the header; reading a
    slice (:meth:`read`) copies only that slice's bytes out of the memory-mapped file.

    ``numpy.asarray(t)`` reads the whole tensor. Every read is counted in the owning
    :class:`LoadReport`'s :attr:`~LoadReport.bytes_read` (tensor-parallel ranks read only
    their slice of each sharded tensor).

    Attributes:
        name: the checkpoint tensor's name.
        shape: its shape.
        dtype: its stored NumPy dtype.
    """

    def __init__(self, report: LoadReport, name: str, shape: tuple[int, ...], dtype: np.dtype):
        self._report = report
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self._cache: dict[tuple[int, int, int], np.ndarray] = {}

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def read(self, axis: int = 0, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The slice ``[start, stop)`` along ``axis`` (whole tensor by default), read-only;
        the same slice asked twice is the same array (read once).

        Raises:
            InvalidArgumentError: the range is outside the tensor.
        """
        axis = axis % max(1, self.ndim)
        stop = self.shape[axis] if stop is None else stop
        if not 0 <= start <= stop <= (self.shape[axis] if self.ndim else 1):
            raise InvalidArgumentError(f"slice [{start}, {stop}) of axis {axis} is outside tensor '{self.name}' of shape {self.shape}")
        key = (axis, start, stop)
        if key not in self._cache:
            self._cache[key] = self._report._read(self, axis, start, stop)
        return self._cache[key]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.read()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"LazyTensor({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class LoadReport:
    """Which checkpoint tensors a network build read: a reader over a :class:`Checkpoint`
    that records every name asked for, then reports, as transformers' load report does,
    the *missing* tensors (asked for, absent: an error listing all of them) and the
    *unexpected* ones (present, never read: a warning listing them).

    Args:
        checkpoint: the checkpoint (anything with ``get(name, shape=, copy=)`` and names).
        ignored: predicate for tensors that are neither read nor unexpected (buffers such
            as ``rotary_emb.inv_freq``; :meth:`trtcore.families.ModelFamily.is_ignored`).

    A missing tensor does not stop the build at once: :meth:`get` returns zeros of the
    asked shape (float32) so that every missing name is collected; :meth:`check` raises.
    """

    def __init__(self, checkpoint: Any, ignored: Any = None):
        self.checkpoint = checkpoint
        self.ignored = ignored or (lambda name: False)
        self.used: set[str] = set()
        self.missing: list[str] = []
        #: bytes copied out of the checkpoint per tensor name by :class:`LazyTensor` reads
        self.bytes_read: dict[str, int] = {}

    def get(self, name: str, shape: Sequence[int] | None = None, dtype: Any = None) -> np.ndarray:
        """The tensor ``name`` (see :meth:`Checkpoint.get`), read-only and zero-copy where
        no conversion is needed (the ops layer converts to the engine dtype once).

        Raises:
            TensorShapeError: the tensor exists with another shape.
        """
        self.used.add(name)
        if name not in self.checkpoint:
            if name not in self.missing:
                self.missing.append(name)
            return np.zeros(tuple(shape or (1,)), np.float32)
        return self.checkpoint.get(name, shape=shape, dtype=dtype, copy=False)

    def lazy(self, name: str, shape: Sequence[int] | None = None) -> LazyTensor:
        """The tensor ``name`` unread (:class:`LazyTensor`): the ops read the slice they need.

        Raises:
            TensorShapeError: the tensor exists with another shape (checked before any data is read).
        """
        self.used.add(name)
        if name not in self.checkpoint:
            if name not in self.missing:
                self.missing.append(name)
            return LazyTensor(self, name, tuple(shape or (1,)), np.dtype(np.float32))
        view = self.checkpoint.get(name, shape=shape, copy=False)  # a zero-copy view: its shape checked, nothing read
        return LazyTensor(self, name, view.shape, view.dtype)

    def _read(self, t: LazyTensor, axis: int, start: int, stop: int) -> np.ndarray:
        """Copy ``t``'s slice out of the (memory-mapped) checkpoint, counting its bytes."""
        if t.name in self.missing:
            shape = list(t.shape)
            if shape:
                shape[axis] = stop - start
            return np.zeros(shape, np.float32)
        view = self.checkpoint.get(t.name, shape=t.shape, copy=False)  # a zero-copy view: nothing read yet
        index = tuple(slice(start, stop) if i == axis else slice(None) for i in range(view.ndim))
        out = np.array(view[index])  # copies (reads) only the slice's bytes
        out.flags.writeable = False
        self.bytes_read[t.name] = self.bytes_read.get(t.name, 0) + out.nbytes
        return out

    def quantized(self, name: str) -> Any:
        """The :class:`~trtcore.quantization.QuantizedWeight` ``name`` when the checkpoint
        holds it quantized (a :class:`trtcore.quant_formats.QuantizedCheckpoint`), else None
        (read it with :meth:`get`)."""
        is_quantized = getattr(self.checkpoint, "is_quantized", None)
        if is_quantized is None or not is_quantized(name):
            return None
        self.used.add(name)
        return self.checkpoint.quantized(name)

    def __contains__(self, name: object) -> bool:
        return name in self.checkpoint

    @property
    def unexpected(self) -> list[str]:
        """Checkpoint tensors no layer read, in name order (ignored buffers left out)."""
        return [n for n in sorted(self.checkpoint) if n not in self.used and not self.ignored(n)]

    def check(self, what: str = "the network") -> None:
        """Raise for missing tensors, warn for unexpected ones.

        Raises:
            MissingTensorError: tensors ``what`` needs are absent; the message lists them all.

        Warns:
            UserWarning: tensors no layer reads, listed by name.
        """
        where = getattr(self.checkpoint, "model_dir", "the checkpoint")
        if self.missing:
            raise MissingTensorError(f"{len(self.missing)} tensors that {what} needs are missing from {where}: {', '.join(self.missing)}")
        extra = self.unexpected
        if extra:
            import warnings

            kv = sum(1 for n in extra if _KV_SCALE_NAME.match(n))
            hint = f"; {kv} of them are FP8 KV cache scales, which kv_cache_dtype='fp8' (--kv-cache-dtype fp8) reads" if kv else ""
            warnings.warn(
                f"{len(extra)} tensors in {where} are not used by {what} (unexpected{hint}): {', '.join(extra)}",
                UserWarning,
                stacklevel=3,
            )


#: checkpoint names of a layer's FP8 KV cache scales, as vLLM reads them: ``...layers.N.self_attn.k_scale``
#: / ``v_scale`` (llm-compressor, ModelOpt exports), ``...k_proj.output_scale`` / ``v_proj.output_scale``
#: (compressed-tensors' output activations), and the older single ``kv_scale`` for both
_KV_SCALE_NAME = re.compile(
    r"^(?:.*\.)?layers\.(\d+)\.(?:self_attn|attention|attn)\.(k_scale|v_scale|kv_scale|k_proj\.output_scale|v_proj\.output_scale)$"
)
#: the smallest FP8 KV cache scale: float32's smallest normal number (below it ``x / scale``, as the
#: kernels compute it, overflows for ordinary keys and every code saturates)
KV_SCALE_MIN = float(np.finfo(np.float32).tiny)
_KV_SCALE_ROLE = {"k_scale": "k", "k_proj.output_scale": "k", "v_scale": "v", "v_proj.output_scale": "v", "kv_scale": "kv"}
_log = logging.getLogger("trtcore.checkpoint")


def kv_cache_scales(weights: Any, num_layers: int, warn: bool = True) -> dict[int, tuple[float, float]]:
    """The FP8 KV cache's per-layer scales ``{layer: (k_scale, v_scale)}`` (float32 values as
    Python floats) from the checkpoint tensors vLLM reads for its ``fp8_e4m3`` KV cache
    (``model.layers.N.self_attn.k_scale`` / ``v_scale``; also ``...k_proj.output_scale`` /
    ``v_proj.output_scale``, and ``...self_attn.kv_scale`` for both; vLLM docs, "Quantized KV
    Cache"). A layer without a scale uses 1.0, vLLM's default; when no layer has one, one warning
    is logged (as vLLM's: accuracy may suffer), unless ``warn`` is False.

    Args:
        weights: a :class:`Checkpoint` or :class:`LoadReport` (iterable names, ``get(name)``); the
            report marks the scales it reads as used.
        num_layers: the model's ``num_hidden_layers`` (scales of other layers are refused).

    Raises:
        CheckpointError: a scale tensor with more than one element, or one that is not a
            finite float32 normal number > 0 (a subnormal scale overflows ``x / scale``), or of a
            layer outside ``[0, num_layers)``; two tensors giving one layer's k (or v) scale
            different values (e.g. ``k_scale`` and ``kv_scale``).
    """
    names = getattr(weights, "checkpoint", weights)
    found: dict[int, dict[str, tuple[float, str]]] = {}  # layer -> role -> (scale, the tensor's name)
    for name in sorted(names):
        m = _KV_SCALE_NAME.match(name)
        if m is None:
            continue
        layer, role = int(m.group(1)), _KV_SCALE_ROLE[m.group(2)]
        value = np.asarray(weights.get(name), dtype=np.float32)
        if value.size != 1 or not (np.isfinite(value).all() and float(value.reshape(-1)[0]) >= KV_SCALE_MIN):
            raise CheckpointError(
                f"KV cache scale {name} must be one finite number >= {KV_SCALE_MIN} (float32's smallest normal: x / scale "
                f"must not overflow), got shape {value.shape} values {value.reshape(-1)[:4].tolist()}"
            )
        if not 0 <= layer < num_layers:
            raise CheckpointError(f"KV cache scale {name} names layer {layer}, but the model has {num_layers} layers")
        for r in ("k", "v") if role == "kv" else (role,):
            scale, layer_found = float(value.reshape(-1)[0]), found.setdefault(layer, {})
            if r in layer_found and layer_found[r][0] != scale:
                raise CheckpointError(
                    f"KV cache scales {layer_found[r][1]} ({layer_found[r][0]}) and {name} ({scale}) both give layer {layer}'s "
                    f"{r}_scale with different values; keep one of them"
                )
            layer_found[r] = (scale, name)
    if not found and warn:
        _log.warning(
            "Using KV cache scaling factor 1.0 for fp8_e4m3: the checkpoint has no k_scale / v_scale tensors. "
            "This may cause accuracy issues; give a checkpoint with calibrated KV cache scales (trtcore quantize --method fp8 "
            "--kv-cache-scales, or llm-compressor)."
        )
    return {layer: (s.get("k", (1.0, ""))[0], s.get("v", (1.0, ""))[0]) for layer, s in found.items()}
