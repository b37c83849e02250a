"""Engine files: an engine built once (``trtcore build``) and loaded many times
(``LLM(engine="model.engine")``, ``trtcore generate --engine model.engine``).

An engine file ``NAME`` comes with its sidecar ``NAME.json`` (:func:`sidecar`), which holds
what a load needs to trust the engine and to run it without the checkpoint's weights:

* ``engine_sha256`` / ``engine_bytes``: the engine file's SHA-256 and size;
* ``trtcore_version`` and ``tensorrt_version`` (the backend module's ``__version__``:
  TensorRT, TensorRT-RTX, or trtcore's own ``trtcore.cuda`` / ``trtcore.reference``);
* ``target.compute_capability``: the GPU the engine was built for (``"sm90"``; ``"cpu"`` on
  the reference backend; ``"any"`` for an engine built without a GPU and without a chosen
  target, e.g. a cuda engine whose kernels compile at load) and ``device`` (its name, for
  people);
* ``plugins``: ``{plugin_name: plugin_version}`` of every plugin layer in the network;
* ``plan``: the resolved :class:`~trtcore.plan.BuildPlan`; ``model_config``: the model's
  config; ``model``: the model folder the engine was built from (where the tokenizer,
  ``config.json`` and ``generation_config.json`` are found) and the SHA-256 of each of
  those files (:data:`MODEL_FILES`).

:func:`load_engine_file` checks all of them against the engine file and this process, in
the order above, and refuses the first that differs with an
:class:`~trtcore.errors.EngineFileError` that names the field, the value the engine was
built with and the value found. Both files are written atomically
(:func:`trtcore.fileio.write_atomic`), the engine first: a build killed half-way leaves the
old pair or a new engine beside an old sidecar, which the SHA-256 check refuses.

Engines are pickles on the reference and cuda backends: load only engine files you built.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import ModelConfig, load_config
from .errors import EngineFileError, InvalidArgumentError
from .fileio import write_atomic
from .plan import BuildConfig, BuildPlan

if TYPE_CHECKING:
    from .builder import DefinedNetwork

__all__ = [
    "ANY_TARGET",
    "FORMAT",
    "MODEL_FILES",
    "EngineFile",
    "current_target",
    "installed_plugins",
    "load_engine_file",
    "network_plugins",
    "save_engine",
    "sidecar",
    "sidecar_path",
]

#: the sidecar's ``format``; bumped when a field a load relies on changes
FORMAT = "trtcore-engine/2"
#: ``target.compute_capability`` of an engine that runs on any GPU of its backend
ANY_TARGET = "any"
#: the model folder's files an engine run reads (config, generation defaults, tokenizer, chat template)
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def sidecar_path(engine: str | os.PathLike[str]) -> Path:
    """The sidecar of the engine file ``engine``: ``engine + ".json"``."""
    engine = Path(engine)
    return engine.with_name(engine.name + ".json")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def current_target(backend: str, compute_capability: str | None = None) -> str:
    """The target an engine of ``backend`` built (or loaded) here has: ``compute_capability``
    normalized (``"sm89"``) when given; ``"cpu"`` for the reference backend; else the current
    GPU's ``"sm<major><minor>"``, or ``"no GPU"`` when none is usable. Never raises."""
    if compute_capability is not None:
        return "sm" + compute_capability.lower().removeprefix("sm").removeprefix("_")
    if backend == "reference":
        return "cpu"
    from . import gpu

    try:
        major, minor = gpu.compute_capability()
    except Exception:  # noqa: BLE001 - no driver, no device, no cuda-python: all mean "no GPU"
        return "no GPU"
    return f"sm{major}{minor}"


def _device_name(backend: str) -> str:
    if backend == "reference":
        return "cpu"
    from . import gpu

    try:
        return gpu.describe_device()
    except Exception:  # noqa: BLE001 - informational only
        return "no GPU"


def network_plugins(network: Any, trt: Any = None) -> dict[str, str]:
    """``{plugin_name: plugin_version}`` of the plugin layers of ``network`` (any backend's
    ``INetworkDefinition``: a reference / cuda layer holds the plugin as ``layer.plugin``; a
    TensorRT one gives it through ``get_plugin()``, whose name and version are those of its
    ``IPluginV3OneCore`` capability when the object itself has none; ``trt``: the module)."""
    found: dict[str, str] = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        plugin = getattr(layer, "plugin", None)
        if plugin is None and hasattr(layer, "get_plugin"):
            plugin = layer.get_plugin()
        if plugin is not None and not getattr(plugin, "plugin_name", None) and hasattr(plugin, "get_capability_interface"):
            plugin = plugin.get_capability_interface(trt.PluginCapabilityType.CORE)
        name = getattr(plugin, "plugin_name", None)
        if name and plugin is not None:
            found[str(name)] = str(plugin.plugin_version)
    return found


def installed_plugins() -> dict[str, str]:
    """``{plugin_name: plugin_version}`` of the plugins this installation has: trtcore's own
    and those published under the entry-point group ``trtcore.plugins``."""
    from importlib.metadata import entry_points

    from .plugins import builtin_plugins
    from .plugins.base import ENTRY_POINT_GROUP

    classes = builtin_plugins() + [ep.load() for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return {cls.plugin_name: cls.plugin_version for cls in classes}


def _model_files(model_dir: Path) -> dict[str, str]:
    return {name: _sha256((model_dir / name).read_bytes()) for name in MODEL_FILES if (model_dir / name).is_file()}


def sidecar(
    d: DefinedNetwork,
    engine: bytes,
    *,
    backend: str,
    engine_file: str,
    compute_capability: str | None,
    model_dir: str | os.PathLike[str] | None = None,
    digest: bool = True,
) -> dict[str, Any]:
    """The JSON description written beside an engine file (the module docstring lists the
    fields a load checks).

    Args:
        d: the defined network the engine was built from.
        engine: the serialized engine.
        backend: the backend that built it.
        engine_file: the engine file's name (recorded, not read).
        compute_capability: the chosen target (tensorrt_rtx), or None for the GPU here.
        model_dir: the model folder (config, tokenizer) a load reads by default; None when
            the engine was built from weights without a folder (a load then needs ``model=``).
        digest: compute ``engine_sha256`` (None otherwise: an engine kept in memory, whose
            bytes nothing can change between build and load, skips hashing gigabytes).
    """
    from . import __version__

    target = current_target(backend, compute_capability)
    if target == "no GPU":  # built without a GPU and without a target: runs on any
        target = ANY_TARGET
    model = None if model_dir is None else Path(model_dir).resolve()
    return {
        "format": FORMAT,
        "trtcore_version": __version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "engine_file": engine_file,
        "engine_sha256": _sha256(engine) if digest else None,
        "engine_bytes": len(engine),
        "backend": backend,
        "tensorrt_version": getattr(d.trt, "__version__", "unknown"),
        "target": {"compute_capability": target},
        "device": _device_name(backend) if target != ANY_TARGET else None,
        "plugins": network_plugins(d.network, d.trt),
        "dtype": d.plan.dtype,
        "kv_cache": d.plan.kv_cache,
        "attention": d.plan.implementations.get("attention"),
        "implementations": d.plan.implementations,
        "plan": d.plan.to_dict(),
        "build_config": d.plan.to_dict(),
        "optimization_profiles": [{name: {"min": list(lo), "opt": list(opt), "max": list(hi)} for name, (lo, opt, hi) in _profile(d).items()}],
        "model_config": d.config.to_dict(),
        "model": None if model is None else {"path": str(model), "files": _model_files(model)},
    }


def _profile(d: DefinedNetwork) -> dict[str, Any]:
    assert d.graph.kv_mode is not None
    return d.graph.kv_mode.profile_shapes()


def save_engine(
    d: DefinedNetwork,
    engine: bytes,
    output: str | os.PathLike[str],
    *,
    backend: str,
    compute_capability: str | None,
    model_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the engine to ``output`` and its sidecar (:func:`sidecar`) to ``output + '.json'``,
    each atomically, the engine first; return the sidecar's path.

    Raises:
        InvalidArgumentError: a file cannot be written.
    """
    output = Path(output)
    meta = sidecar(d, engine, backend=backend, engine_file=output.name, compute_capability=compute_capability, model_dir=model_dir)
    side = sidecar_path(output)
    write_atomic(output, engine)
    write_atomic(side, (json.dumps(meta, indent=2, default=_json_default) + "\n").encode())
    return side


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer, np.floating)):
        return o.item()
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _mismatch(where: str, field: str, expected: Any, found: Any, fix: str) -> EngineFileError:
    return EngineFileError(
        f"{where}: {field} differs: the engine was built with {expected!r}, found {found!r}; {fix}", field=field, expected=expected, found=found
    )


REBUILD = "rebuild the engine here with `trtcore build`"


@dataclass
class EngineFile:
    """A serialized engine and its sidecar, checked (:func:`load_engine_file`) or just built
    (:meth:`from_network`, in memory).

    Attributes:
        serialized: the engine's bytes, for the backend's ``Runtime.deserialize_cuda_engine``.
        sidecar: the sidecar's fields (the module docstring).
        model_dir: the folder of ``config.json`` and the tokenizer the engine runs with.
        path: the engine file, or None for an engine made in memory.
    """

    serialized: bytes
    sidecar: dict[str, Any]
    model_dir: Path
    path: Path | None = None

    @property
    def plan(self) -> BuildPlan:
        """The resolved build plan the engine was built with."""
        return BuildPlan.from_dict(self.sidecar["plan"])

    @classmethod
    def from_network(cls, d: DefinedNetwork, serialized: bytes, model_dir: str | os.PathLike[str]) -> EngineFile:
        """An engine built in this process (the sidecar it would be saved with); ``model_dir``
        holds the config (and tokenizer, if any) it runs with."""
        meta = sidecar(d, serialized, backend=d.plan.backend, engine_file="", compute_capability=None, model_dir=model_dir, digest=False)
        return cls(serialized, json.loads(json.dumps(meta, default=_json_default)), Path(model_dir))

    @property
    def quantization(self) -> str | None:
        """The quantization method the engine was built with (its sidecar's
        ``model_config.quantization_config.quant_method``), or None."""
        q = self.sidecar.get("model_config", {}).get("quantization_config")
        return str(q.get("quant_method")).lower() if isinstance(q, dict) and q.get("quant_method") else None

    def quantization_for(self, quantization: str | None) -> str | None:
        """The ``quantization`` an LLM runs this engine with: the engine's where ``quantization``
        is None.

        Raises:
            InvalidArgumentError: ``quantization`` names another method than the engine's.
        """
        built = self.quantization
        if quantization is None or quantization.lower() == built:
            return built
        raise InvalidArgumentError(
            f"quantization={quantization!r}, but {self.path or 'the engine'} was built "
            f"{f'with quantization {built!r}' if built else 'without quantization'}; "
            "leave quantization out or rebuild with `trtcore build --quantization`"
        )

    def plan_for(self, options: BuildConfig, backend: str | None) -> BuildPlan:
        """The engine's plan, after checking that the caller's build options (``LLM``'s
        arguments) do not ask for something else; options left at their defaults take the
        engine's values.

        Raises:
            InvalidArgumentError: a backend or option that differs from the engine's (named,
                with both values).
        """
        from .trt import normalize_backend

        plan = self.plan
        where = self.path or "the engine"
        if backend is not None and normalize_backend(backend) == "reference" != plan.backend:
            raise InvalidArgumentError(f"backend={backend!r}, but {self.cpu_advice()}")
        if backend is not None and normalize_backend(backend) != plan.backend:
            raise InvalidArgumentError(f"backend={backend!r}, but {where} was built for backend {plan.backend!r}; leave backend out")
        default = BuildConfig()
        for f in fields(BuildConfig):
            asked = getattr(options, f.name)
            if asked != getattr(default, f.name) and asked != getattr(plan, f.name):
                raise InvalidArgumentError(
                    f"{f.name}={asked!r}, but {where} was built with {f.name}={getattr(plan, f.name)!r}; leave {f.name} out or rebuild"
                )
        return plan

    def cpu_advice(self) -> str:
        """Why this GPU backend's engine does not run on the CPU, and what does: the model
        folder on the reference backend (an engine file holds no reference network)."""
        return (
            f"{self.path or 'the engine'} was built for backend {self.plan.backend!r}, and an engine file of a GPU backend "
            f"runs on a CUDA GPU only, never on the CPU; on the CPU run the model folder instead: "
            f"--model {self.model_dir} --backend reference (LLM({str(self.model_dir)!r}, backend='reference'))"
        )

    def check(self) -> None:
        """Check the sidecar against the engine bytes and this process (module docstring).

        Raises:
            EngineFileError: the first field that differs (named, with both values).
            BackendNotAvailableError: the engine's backend is not installed.
        """
        from . import __version__
        from .trt import load_trt

        s, where = self.sidecar, str(self.path or "the engine")
        if s.get("format") != FORMAT:
            raise _mismatch(where, "format", s.get("format"), FORMAT, REBUILD + " (the sidecar is of another trtcore)")
        if self.path is not None:
            if s.get("engine_bytes") != len(self.serialized):
                raise _mismatch(
                    where, "engine_bytes", s.get("engine_bytes"), len(self.serialized), "the engine file is truncated or replaced; " + REBUILD
                )
            found = _sha256(self.serialized)
            if s.get("engine_sha256") != found:
                raise _mismatch(where, "engine_sha256", s.get("engine_sha256"), found, "the engine file is corrupted or replaced; " + REBUILD)
        if s.get("trtcore_version") != __version__:
            raise _mismatch(where, "trtcore_version", s.get("trtcore_version"), __version__, REBUILD)
        backend = s.get("backend")
        version = getattr(load_trt(str(backend)), "__version__", "unknown")
        if s.get("tensorrt_version") != version:
            raise _mismatch(
                where,
                "tensorrt_version",
                s.get("tensorrt_version"),
                version,
                f"{backend} engines run only on the version that built them; " + REBUILD,
            )
        target = s.get("target", {}).get("compute_capability")
        here = current_target(str(backend))
        if target != ANY_TARGET and target != here and here == "no GPU":
            raise _mismatch(where, "target.compute_capability", target, here, f"no usable CUDA GPU here: {self.cpu_advice()}")
        if target != ANY_TARGET and target != here:
            raise _mismatch(where, "target.compute_capability", target, here, f"the engine runs only on its target ({s.get('device')}); " + REBUILD)
        installed = installed_plugins()
        for name, version in sorted(s.get("plugins", {}).items()):
            if installed.get(name) != version:
                raise _mismatch(where, f"plugins.{name}", version, installed.get(name, "not installed"), REBUILD)
        self._check_model(where)

    def _check_model(self, where: str) -> None:
        from .errors import TrtcoreError
        from .quant_formats import resolve_quantization

        recorded = ModelConfig.from_dict(self.sidecar["model_config"], source=f"{where} (sidecar)")
        folder = load_config(self.model_dir)
        try:  # the folder's config as the build saw it (``--quantization`` fp8, AutoGPTQ's own file)
            config, _ = resolve_quantization(self.model_dir, folder, self.quantization)
        except TrtcoreError as e:
            field = "model_config.quantization_config"
            raise _mismatch(
                where, field, recorded.quantization_config, folder.quantization_config, f"{self.model_dir} does not give it: {e}"
            ) from None
        if config.quantization_config != recorded.quantization_config:  # not in ModelConfig's equality
            raise _mismatch(
                where, "model_config.quantization_config", recorded.quantization_config, config.quantization_config,
                f"{self.model_dir}'s quantization config (config.json, or AutoGPTQ's / AutoAWQ's own file) is not the engine's",
            )  # fmt: skip
        if config != recorded:
            here, then = config.to_dict(), recorded.to_dict()
            key = next((k for k in sorted(set(here) | set(then)) if here.get(k) != then.get(k)), "?")
            raise _mismatch(where, f"model_config.{key}", then.get(key), here.get(key), f"{self.model_dir} holds another model's config")
        model = self.sidecar.get("model")
        if model is None:
            return
        then_files, here_files = model["files"], _model_files(self.model_dir)
        for name in MODEL_FILES:
            if then_files.get(name) != here_files.get(name):
                raise _mismatch(
                    where, f"model.files.{name}", then_files.get(name, "absent"), here_files.get(name, "absent"),
                    f"{self.model_dir / name} is not the file the engine was built with (SHA-256)",
                )  # fmt: skip


def load_engine_file(path: str | os.PathLike[str], model: str | os.PathLike[str] | None = None) -> EngineFile:
    """Read the engine file ``path`` and its sidecar and check them (:meth:`EngineFile.check`).

    Args:
        path: the engine file ``trtcore build`` wrote (its sidecar is ``path + ".json"``).
        model: the folder of ``config.json`` and the tokenizer; default: the folder the
            sidecar records.

    Raises:
        EngineFileError: the engine or its sidecar is missing or unreadable, or a field
            differs (named, with the value the engine was built with and the value found);
            no model folder is recorded and none is given, or the recorded one is gone.
        BackendNotAvailableError: the engine's backend is not installed.
    """
    path = Path(path)
    side = sidecar_path(path)
    try:
        serialized = path.read_bytes()
    except OSError as exc:
        raise EngineFileError(f"cannot read the engine file {path}: {exc.strerror or exc}") from exc
    try:
        meta = json.loads(side.read_text())
    except OSError as exc:
        raise EngineFileError(f"cannot read the sidecar {side} of {path} (written by `trtcore build`): {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise EngineFileError(f"the sidecar {side} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise EngineFileError(f"the sidecar {side} is not a JSON object")
    if model is None:
        recorded = (meta.get("model") or {}).get("path")
        if recorded is None:
            raise EngineFileError(f"the sidecar {side} records no model folder; pass model= (the folder of config.json and the tokenizer)")
        if not Path(recorded).is_dir():
            raise EngineFileError(
                f"{path} was built from {recorded}, which is not here; pass model= (a folder with its config.json and tokenizer files)"
            )
        model = recorded
    ef = EngineFile(serialized, meta, Path(model), path)
    ef.check()
    return ef
