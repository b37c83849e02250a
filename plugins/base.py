"""Plugin authoring: one Python class becomes a TensorRT ``IPluginV3`` plugin.

A kernel developer writes a dataclass deriving from :class:`Plugin`: its fields are the
plugin's attributes (serialized through ``PluginFieldCollection``), and it implements

* :meth:`Plugin.output_dtypes` and :meth:`Plugin.output_shapes` (symbolic: :class:`Dim`),
* :meth:`Plugin.supports` (which dtype combinations it accepts; formats are linear),
* :meth:`Plugin.enqueue` (launch the kernel on the given stream: no host sync, no allocation),
* :meth:`Plugin.reference` (the same computation in NumPy).

:func:`register` generates the ``IPluginCreatorV3One`` and registers it in the TensorRT
module's plugin registry (namespace ``trtcore``, versioned); :func:`create` instantiates a
plugin through that creator from its field collection — the same path TensorRT takes when
it deserializes an engine — and returns the object ``network.add_plugin_v3`` takes. With
``tensorrt`` that object is an adapter implementing ``IPluginV3OneCore`` /
``IPluginV3OneBuild`` / ``IPluginV3OneRuntime`` (TensorRT "Python plugins" API, TensorRT 10
Developer Guide, "Extending TensorRT with Custom Layers"); with :mod:`trtcore.reference` it
is the plugin itself, which the reference executes with ``reference`` (NumPy) or
``enqueue`` (CuPy).

Plugins from other packages register the same way: expose the class under the
entry-point group ``trtcore.plugins`` and call :func:`load_entry_point_plugins`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from trtcore.dims import Dim
from trtcore.dtypes import numpy_dtype as np_dtype
from trtcore.dtypes import trt_dtype
from trtcore.errors import TrtcoreError

ENTRY_POINT_GROUP = "trtcore.plugins"
NAMESPACE = "trtcore"


class PluginError(TrtcoreError, ValueError):
    """A plugin's fields or inputs are invalid, or it is not registered."""


@dataclass(frozen=True)
class DeviceTensor:
    """An input or output given to :meth:`Plugin.enqueue`: device pointer, shape, dtype."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


# ---------------------------------------------------------------------------------------
# fields
# ---------------------------------------------------------------------------------------

# Python annotation -> (PluginFieldType member name, NumPy dtype of the serialized data)
_FIELD_KINDS: dict[Any, tuple[str, Any]] = {
    int: ("INT32", np.int32),
    float: ("FLOAT32", np.float32),
    bool: ("INT8", np.int8),
    str: ("CHAR", np.int8),
    list[int]: ("INT32", np.int32),
    list[float]: ("FLOAT32", np.float32),
    tuple[int, ...]: ("INT32", np.int32),
    tuple[float, ...]: ("FLOAT32", np.float32),
    np.ndarray: ("FLOAT32", np.float32),
}


_T = TypeVar("_T")


@dataclass
class Plugin:
    """Base class of trtcore plugins; subclasses are dataclasses whose fields are attributes.

    Class attributes to set: ``plugin_name`` (unique in the namespace), ``plugin_version``
    (bump when fields or semantics change), ``num_outputs``. Field types: ``int``,
    ``float``, ``bool``, ``str``, ``list[int]``, ``list[float]``, ``tuple[int, ...]``,
    ``tuple[float, ...]`` or ``np.ndarray`` (float32).
    """

    plugin_name: ClassVar[str] = ""
    plugin_version: ClassVar[str] = "1"
    plugin_namespace: ClassVar[str] = NAMESPACE
    num_outputs: ClassVar[int] = 1

    # --- to implement --------------------------------------------------------------------
    def output_dtypes(self, input_dtypes: Sequence[np.dtype]) -> list[np.dtype]:
        """Output dtypes from input dtypes (NumPy dtypes; bfloat16 is ``ml_dtypes.bfloat16``)."""
        raise NotImplementedError

    def output_shapes(self, input_shapes: Sequence[Sequence[Dim]]) -> list[list[Dim]]:
        """Output shapes from input shapes, with :class:`Dim` arithmetic only."""
        raise NotImplementedError

    def supports(self, pos: int, dtypes: Sequence[np.dtype], num_inputs: int) -> bool:
        """Whether I/O ``pos`` (inputs first, then outputs) may have ``dtypes[pos]`` given
        ``dtypes[:pos]`` (TensorRT's ``supports_format_combination``). Default: outputs have
        the dtype of input 0, inputs anything."""
        return pos < num_inputs or dtypes[pos] == dtypes[0]

    def workspace_size(self, inputs: Sequence[tuple[tuple[int, ...], np.dtype]], outputs: Sequence[tuple[tuple[int, ...], np.dtype]]) -> int:
        """Device scratch bytes :meth:`enqueue` needs for the largest shapes (default 0)."""
        return 0

    def enqueue(self, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor], workspace: int, stream: int) -> None:
        """Launch the kernel(s) on ``stream`` (a ``cudaStream_t`` as int). No host
        synchronisation and no allocation, so that the step can be captured in a CUDA Graph."""
        raise NotImplementedError

    def reference(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """The same computation in NumPy (the numerical contract of :meth:`enqueue`)."""
        raise NotImplementedError

    def validate(self) -> None:
        """Check field values; raise :class:`PluginError` naming the field (default: nothing)."""

    # --- optional: horizontal fusion (the cuda engine builder, q/k/v and gate/up) -----------
    def row_fusion_key(self, constants: Sequence[np.ndarray]) -> Any:
        """For a plugin computing ``y = x @ W^T`` with ``W`` in its constant inputs 1..
        (``constants``): a hashable key, equal for plugins that :meth:`fuse_rows` can run as
        one plugin over their weights stacked along the output features (the same ``x``
        given); None, the default, is never fused."""
        return None

    @classmethod
    def fuse_rows(cls, parts: Sequence[tuple[Plugin, Sequence[np.ndarray]]]) -> tuple[Plugin, list[np.ndarray]]:
        """One plugin and its constant inputs whose output is the ``parts``' outputs
        (plugin, constants; equal :meth:`row_fusion_key`) side by side along the last axis, in
        order. Only called where :meth:`row_fusion_key` is not None."""
        raise NotImplementedError

    # --- for references: a value made from the constant inputs, kept while they come back ---
    def from_constants(self, constants: Sequence[np.ndarray], make: Callable[[list[np.ndarray]], _T]) -> _T:
        """``make(arrays)`` of the constant inputs ``constants``, made once while the same
        arrays come back (the reference backend passes its constants' own arrays on every
        call): e.g. a :meth:`reference`'s dequantized weight, not made again per token. The
        arrays are held with it (their ids stay theirs); it stays out of pickles."""
        arrays = [np.asarray(c) for c in constants]
        key = tuple((id(a), a.__array_interface__["data"][0], a.shape) for a in arrays)
        cached = self.__dict__.get("_from_constants")
        if cached is not None and cached[0] == key:
            return typing.cast(_T, cached[1])
        value = make(arrays)
        self.__dict__["_from_constants"] = (key, value, arrays)
        return value

    def __getstate__(self) -> dict[str, Any]:
        """The fields only (:meth:`from_constants`' value stays out of pickled plans)."""
        return {k: v for k, v in self.__dict__.items() if k != "_from_constants"}

    def __post_init__(self) -> None:
        self.validate()

    # --- fields ----------------------------------------------------------------------------
    @classmethod
    def field_specs(cls) -> list[tuple[str, str, Any, Any]]:
        """``(name, PluginFieldType name, NumPy dtype, Python type)`` of every field."""
        hints = typing.get_type_hints(cls)
        specs = []
        for f in dataclasses.fields(cls):
            t = hints[f.name]
            if t not in _FIELD_KINDS:
                raise PluginError(f"{cls.__name__}.{f.name}: field type {t!r} cannot be serialized; use one of {list(_FIELD_KINDS)}")
            kind, dt = _FIELD_KINDS[t]
            specs.append((f.name, kind, dt, t))
        return specs

    #: fields added after a plugin's first version -> their defaults: left out of the field
    #: collection at their default, and taken at their default when a serialized plugin lacks
    #: them, so that engines serialized before the field existed still load
    _OPTIONAL_FIELDS: ClassVar[dict[str, Any]] = {}

    def field_values(self) -> list[tuple[str, str, np.ndarray]]:
        """``(name, PluginFieldType name, data)`` with data a 1-D NumPy array (optional
        fields at their defaults left out)."""
        out = []
        for name, kind, dt, t in self.field_specs():
            v = getattr(self, name)
            if name in self._OPTIONAL_FIELDS and self._OPTIONAL_FIELDS[name] == v:
                continue
            if t is str:
                data = np.frombuffer(v.encode("utf-8"), dtype=np.int8).copy()
            else:
                data = np.atleast_1d(np.asarray(v, dtype=dt)).ravel().copy()
            out.append((name, kind, data))
        return out

    @classmethod
    def from_field_data(cls, data: dict[str, Any]) -> Plugin:
        """Rebuild a plugin from ``{field name: serialized data}`` (what a creator receives).

        Raises:
            PluginError: a field is missing or does not parse, or a field this class does not
                know is given (a plugin serialized by a newer trtcore, whose field would change
                what it computes: refused rather than dropped).
        """
        kwargs: dict[str, Any] = {}
        known = [name for name, _, _, _ in cls.field_specs()]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise PluginError(f"plugin {cls.plugin_name}: unknown field(s) {unknown} (serialized by a newer trtcore?); this version knows {known}")
        defaults = {name: np.asarray(cls._OPTIONAL_FIELDS[name], dtype=dt) for name, _, dt, _ in cls.field_specs() if name in cls._OPTIONAL_FIELDS}
        data = {**defaults, **data}
        for name, _, _dt, t in cls.field_specs():
            if name not in data:
                raise PluginError(f"plugin {cls.plugin_name}: field {name!r} missing from the field collection")
            raw = np.asarray(data[name])
            if t is str:
                kwargs[name] = raw.astype(np.int8).tobytes().decode("utf-8")
            elif t in (int, float, bool):
                if raw.size != 1:
                    raise PluginError(f"plugin {cls.plugin_name}: field {name!r} has {raw.size} values, expected 1")
                kwargs[name] = t(raw.reshape(-1)[0])
            elif t in (list[int], tuple[int, ...]):
                vals = [int(x) for x in raw.reshape(-1)]
                kwargs[name] = vals if t == list[int] else tuple(vals)
            elif t in (list[float], tuple[float, ...]):
                fvals = [float(x) for x in raw.reshape(-1)]
                kwargs[name] = fvals if t == list[float] else tuple(fvals)
            else:
                kwargs[name] = raw.astype(np.float32).reshape(-1).copy()
        return cls(**kwargs)

    def field_collection(self, trt: Any) -> Any:
        """This plugin's fields as ``trt.PluginFieldCollection``.

        TensorRT's collection only points at the ``PluginField`` objects (and they at their
        NumPy data), so the fields and data are kept alive on this plugin until the next
        call; the collection is valid while the plugin lives.
        """
        values = self.field_values()
        fields = [trt.PluginField(name, data, getattr(trt.PluginFieldType, kind)) for name, kind, data in values]
        fc = trt.PluginFieldCollection(fields)
        object.__setattr__(self, "_field_keepalive", (values, fields, fc))
        return fc

    @classmethod
    def from_field_collection(cls, fc: Any) -> Plugin:
        """Rebuild from a ``PluginFieldCollection`` (TensorRT's or the reference's)."""
        data = {}
        for f in fc:
            data[f.name] = np.asarray(f.data)
        return cls.from_field_data(data)


# ---------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------

_REGISTERED: dict[tuple[int, str, str, str], Any] = {}


def _trt_adapter_class(trt: Any, plugin_cls: type[Plugin]) -> type:
    """A ``trt.IPluginV3`` implementation wrapping ``plugin_cls`` for the module ``trt``."""

    class Adapter(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):  # type: ignore[misc, name-defined]
        def __init__(self, plugin: Plugin, phase: Any = None):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.plugin = plugin
            self.phase = phase
            self.plugin_name = plugin_cls.plugin_name
            self.plugin_version = plugin_cls.plugin_version
            self.plugin_namespace = plugin_cls.plugin_namespace
            self.num_outputs = plugin_cls.num_outputs
            self.timing_cache_id = ""

        # IPluginV3
        def get_capability_interface(self, type: Any) -> Any:  # noqa: A002
            return self

        def clone(self) -> Any:
            return Adapter(dataclasses.replace(self.plugin), self.phase)

        # IPluginV3OneCore / Build
        def get_fields_to_serialize(self) -> Any:
            return self.plugin.field_collection(trt)

        def get_output_data_types(self, input_types: Sequence[Any]) -> list[Any]:
            return [trt_dtype(trt, d) for d in self.plugin.output_dtypes([np_dtype(t) for t in input_types])]

        def get_output_shapes(self, inputs: Sequence[Any], shape_inputs: Sequence[Any], expr_builder: Any) -> list[Any]:
            shapes = [[Dim(expr=e, builder=expr_builder, trt=trt) for e in dims] for dims in inputs]
            outs = self.plugin.output_shapes(shapes)
            result = []
            for dims in outs:
                de = trt.DimsExprs(len(dims))
                for i, d in enumerate(dims):
                    de[i] = d.expr if isinstance(d, Dim) else expr_builder.constant(int(d))
                result.append(de)
            return result

        def supports_format_combination(self, pos: int, in_out: Sequence[Any], num_inputs: int) -> bool:
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            try:
                dtypes = [np_dtype(io.desc.type) for io in in_out[: pos + 1]]
            except KeyError:
                return False
            return bool(self.plugin.supports(pos, dtypes, num_inputs))

        def configure_plugin(self, inp: Any, out: Any) -> None:
            pass

        def get_workspace_size(self, inp: Sequence[Any], out: Sequence[Any]) -> int:
            def desc(d: Any) -> tuple[tuple[int, ...], np.dtype]:
                return tuple(int(x) for x in d.max), np_dtype(d.desc.type)

            return int(self.plugin.workspace_size([desc(d) for d in inp], [desc(d) for d in out]))

        # IPluginV3OneRuntime
        def on_shape_change(self, inp: Any, out: Any) -> None:
            pass

        def set_tactic(self, tactic: int) -> None:
            pass

        def attach_to_context(self, context: Any) -> Any:
            return self.clone()

        def enqueue(
            self, input_desc: Sequence[Any], output_desc: Sequence[Any], inputs: Sequence[int], outputs: Sequence[int], workspace: int, stream: int
        ) -> None:
            def tensors(descs: Sequence[Any], ptrs: Sequence[int]) -> list[DeviceTensor]:
                return [DeviceTensor(int(p), tuple(int(x) for x in d.dims), np_dtype(d.type)) for d, p in zip(descs, ptrs)]

            self.plugin.enqueue(tensors(input_desc, inputs), tensors(output_desc, outputs), int(workspace), int(stream))

    Adapter.__name__ = f"{plugin_cls.__name__}TRTPlugin"
    return Adapter


def _trt_creator(trt: Any, plugin_cls: type[Plugin]) -> Any:
    adapter = _trt_adapter_class(trt, plugin_cls)

    class Creator(trt.IPluginCreatorV3One):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IPluginCreatorV3One.__init__(self)
            self.name = plugin_cls.plugin_name
            self.plugin_namespace = plugin_cls.plugin_namespace
            self.plugin_version = plugin_cls.plugin_version
            self.field_names = trt.PluginFieldCollection(
                [trt.PluginField(n, np.zeros(0, dt), getattr(trt.PluginFieldType, k)) for n, k, dt, _ in plugin_cls.field_specs()]
            )

        def create_plugin(self, name: str, fc: Any, phase: Any) -> Any:
            return adapter(plugin_cls.from_field_collection(fc), phase)

    Creator.__name__ = f"{plugin_cls.__name__}Creator"
    return Creator()


def register(plugin_cls: type[Plugin], trt: Any) -> Any:
    """Register ``plugin_cls``'s creator in ``trt``'s plugin registry (once); return it.

    Raises:
        PluginError: ``plugin_cls`` has no ``plugin_name`` or a field type that cannot be
            serialized; or ``trt`` cannot host plugins (``tensorrt_rtx`` has no
            ``add_plugin_v3`` in Python).
    """
    if not plugin_cls.plugin_name:
        raise PluginError(f"{plugin_cls.__name__} has no plugin_name")
    plugin_cls.field_specs()  # validates field types
    key = (id(trt), plugin_cls.plugin_name, plugin_cls.plugin_version, plugin_cls.plugin_namespace)
    if key in _REGISTERED:
        return _REGISTERED[key]
    if not hosts_plugins(trt):
        raise PluginError(f"TensorRT module {trt.__name__!r} cannot host IPluginV3 plugins from Python")
    if hasattr(trt, "IPluginCreatorV3One"):
        creator = _trt_creator(trt, plugin_cls)
    else:  # trtcore.reference: its registry creates the plugin object itself
        creator = trt.PluginCreator(plugin_cls)
    registry = trt.get_plugin_registry()
    existing = registry.get_creator(plugin_cls.plugin_name, plugin_cls.plugin_version, plugin_cls.plugin_namespace)
    if existing is None and not registry.register_creator(creator, plugin_cls.plugin_namespace):
        raise PluginError(f"could not register plugin {plugin_cls.plugin_name} v{plugin_cls.plugin_version} with {trt.__name__}")
    _REGISTERED[key] = existing or creator
    return _REGISTERED[key]


def hosts_plugins(trt: Any) -> bool:
    """Whether networks of module ``trt`` can take Python ``IPluginV3`` plugins."""
    if getattr(trt, "__name__", "") == "trtcore.reference":
        return True
    return hasattr(trt, "IPluginV3") and hasattr(trt, "INetworkDefinition") and hasattr(trt.INetworkDefinition, "add_plugin_v3")


def create(plugin: Plugin, trt: Any, name: str | None = None) -> Any:
    """The object to pass to ``network.add_plugin_v3``: created by the registered creator
    from ``plugin``'s field collection (so serialization is exercised on every build)."""
    creator = register(type(plugin), trt)
    phase = trt.TensorRTPhase.BUILD
    made = creator.create_plugin(name or plugin.plugin_name, plugin.field_collection(trt), phase)
    if made is None:
        raise PluginError(f"creator of {plugin.plugin_name} returned no plugin")
    return made


def load_entry_point_plugins(trt: Any) -> list[type[Plugin]]:
    """Register every plugin class published under the entry-point group ``trtcore.plugins``."""
    from importlib.metadata import entry_points

    loaded = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, Plugin)):
            raise PluginError(f"entry point {ep.name!r} ({ep.value}) is not a trtcore Plugin subclass")
        register(cls, trt)
        loaded.append(cls)
    return loaded


class LinearShapes:
    """Shapes and types of a linear-layer plugin, ``y[..., out_features] = x[..., in_features] @ W^T``
    (the weight-only and FP8 GEMM plugins): input 0 is x (float16 / bfloat16 / float32), y has x's
    dtype, and the constant inputs after x have the dtypes of ``_constant_dtypes()``. A subclass
    of :class:`Plugin` mixes it in ahead of ``Plugin`` and provides ``in_features``,
    ``out_features``, ``num_inputs``, ``_check_count(n)`` and ``_constant_dtypes()``.

    Raises (from the methods):
        PluginError: x's dtype is not a kernel dtype, x has rank 0 or a last dimension other
            than ``in_features``, or the input count is wrong (``_check_count``).
    """

    in_features: int
    out_features: int
    num_inputs: int

    def _check_count(self, n: int) -> None:
        raise NotImplementedError

    def _constant_dtypes(self) -> list[np.dtype]:
        raise NotImplementedError

    def output_dtypes(self, input_dtypes: Sequence[np.dtype]) -> list[np.dtype]:
        from trtcore.dtypes import KERNEL_DTYPE_CODES

        self._check_count(len(input_dtypes))
        d = np.dtype(input_dtypes[0])
        if d not in KERNEL_DTYPE_CODES:
            raise PluginError(f"{type(self).__name__}: x must be float16, bfloat16 or float32, got {d}")
        return [d]

    def output_shapes(self, input_shapes: Sequence[Sequence[Dim]]) -> list[list[Dim]]:
        self._check_count(len(input_shapes))
        x = list(input_shapes[0])
        if not x:
            raise PluginError(f"{type(self).__name__}: x must have rank >= 1 ([..., in_features])")
        last = getattr(x[-1], "value", x[-1])
        if isinstance(last, int) and last >= 0 and last != self.in_features:
            raise PluginError(f"{type(self).__name__}: x's last dimension is {last}, expected in_features={self.in_features}")
        return [x[:-1] + [Dim(self.out_features)]]

    def supports(self, pos: int, dtypes: Sequence[np.dtype], num_inputs: int) -> bool:
        from trtcore.dtypes import KERNEL_DTYPE_CODES

        if num_inputs != self.num_inputs:
            return False
        d = np.dtype(dtypes[pos])
        if pos == 0:
            return d in KERNEL_DTYPE_CODES
        if pos >= num_inputs:
            return d == np.dtype(dtypes[0])
        return d == self._constant_dtypes()[pos - 1]
