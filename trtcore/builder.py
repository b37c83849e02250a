"""From a checkpoint to a TensorRT network, and from a network to a serialized engine.

One code path for every backend: :func:`define_network` builds the model's
``INetworkDefinition`` with whichever TensorRT module it is given (``tensorrt``,
``tensorrt_rtx`` or :mod:`trtcore.reference`), and :func:`build_engine` hands it to that
module's ``Builder.build_serialized_network`` with one optimization profile. Engines are
strongly typed (TensorRT 10.12+ / 11); TF32 is cleared for float32 engines so that float32
means float32.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import ops
from .config import ModelConfig
from .dtypes import ENGINE_DTYPES
from .errors import EngineBuildError, InvalidArgumentError
from .fileio import check_writable, write_atomic  # noqa: F401 - check_writable: the CLI imports it from here
from .log import trt_logger
from .models import family_for

DTYPES = tuple(ENGINE_DTYPES)


@dataclass(frozen=True)
class BuildConfig:
    """Engine build options.

    Attributes:
        dtype: engine precision, one of :data:`DTYPES`.
        max_batch_size: largest batch (sequences per step) the profile admits.
        max_seq_len: largest number of tokens (cached + new) per sequence; capped at the
            model's ``max_position_embeddings`` by :meth:`for_model`.
        opt_batch_size / opt_seq_len: the profile's ``opt`` point (TensorRT tunes for it);
            clamped to the maxima.
        rope: RoPE implementation, ``"plugin"`` (fused kernel) or ``"layers"`` (composed
            standard layers); None picks the plugin where the TensorRT module hosts plugins.
        kv_cache: ``"paged"`` (packed tokens, one block pool, the paged attention plugin) or
            ``"contiguous"`` (padded batch, per-layer cache as engine I/O); None picks paged
            where the TensorRT module hosts plugins.
        block_size: tokens per KV block (paged).
        max_num_tokens: most packed tokens per step (paged; the scheduler's token budget).
        max_num_blocks: most blocks in the KV pool (paged; the profile's bound).
        attention: attention of the contiguous KV cache mode: ``"layers"`` (composed
            matmul/softmax over ``concat(past, new)``) or ``"native"`` (TensorRT's
            ``IKVCacheUpdateLayer`` + ``IAttention`` over a fixed-size cache of
            ``max_seq_len`` slots). ``"native"`` needs ``kv_cache="contiguous"`` (None
            resolves to it); paged mode attends with its plugin.
    """

    dtype: str = "float32"
    max_batch_size: int = 8
    max_seq_len: int = 2048
    opt_batch_size: int = 1
    opt_seq_len: int = 128
    rope: str | None = None
    kv_cache: str | None = None
    block_size: int = 16
    max_num_tokens: int = 2048
    max_num_blocks: int = 65536
    attention: str = "layers"

    def __post_init__(self) -> None:
        if self.attention not in ops.IMPLEMENTATIONS["attention"]:
            raise InvalidArgumentError(
                f"attention {self.attention!r} is not supported; expected one of {', '.join(ops.IMPLEMENTATIONS['attention'])}"
            )
        if self.attention == "native" and self.kv_cache == "paged":
            raise InvalidArgumentError(
                "attention='native' (IAttention + IKVCacheUpdateLayer) is only valid with kv_cache='contiguous'; "
                "the paged KV cache attends with its plugin"
            )
        if self.kv_cache is not None and self.kv_cache not in ops.IMPLEMENTATIONS["kv_cache"]:
            raise InvalidArgumentError(f"kv_cache {self.kv_cache!r} is not supported; expected one of {', '.join(ops.IMPLEMENTATIONS['kv_cache'])}")
        if self.block_size < 1 or self.max_num_tokens < 1 or self.max_num_blocks < 1:
            raise InvalidArgumentError(
                f"block_size, max_num_tokens and max_num_blocks must be >= 1, got {self.block_size}, {self.max_num_tokens}, {self.max_num_blocks}"
            )
        if self.rope is not None and self.rope not in ops.IMPLEMENTATIONS["rope"]:
            raise InvalidArgumentError(f"rope {self.rope!r} is not supported; expected one of {', '.join(ops.IMPLEMENTATIONS['rope'])}")
        if self.dtype not in DTYPES:
            raise InvalidArgumentError(f"dtype {self.dtype!r} is not supported; expected one of {', '.join(DTYPES)}")
        if self.max_batch_size < 1 or self.max_seq_len < 2:
            raise InvalidArgumentError(
                f"max_batch_size must be >= 1 and max_seq_len >= 2, got {self.max_batch_size} and {self.max_seq_len}"
            )
        if self.opt_batch_size < 1 or self.opt_seq_len < 1:
            raise InvalidArgumentError(f"opt_batch_size and opt_seq_len must be >= 1, got {self.opt_batch_size}, {self.opt_seq_len}")
        # the opt point lies inside [min, max]
        object.__setattr__(self, "opt_batch_size", min(self.opt_batch_size, self.max_batch_size))
        object.__setattr__(self, "opt_seq_len", min(self.opt_seq_len, self.max_seq_len))

    def for_model(self, config: ModelConfig) -> "BuildConfig":
        """A copy whose lengths fit ``config`` (max_seq_len <= max_position_embeddings)."""
        max_len = min(self.max_seq_len, config.max_position_embeddings)
        return BuildConfig(
            dtype=self.dtype,
            max_batch_size=self.max_batch_size,
            max_seq_len=max_len,
            opt_batch_size=self.opt_batch_size,
            opt_seq_len=self.opt_seq_len,
            rope=self.rope,
            kv_cache=self.kv_cache,
            block_size=self.block_size,
            max_num_tokens=self.max_num_tokens,
            max_num_blocks=self.max_num_blocks,
            attention=self.attention,
        )


def profile_shapes(
    config: ModelConfig, bc: BuildConfig, kv_cache: str = "contiguous", attention: str = "layers"
) -> dict[str, tuple[tuple[int, ...], ...]]:
    """min / opt / max shape of every dynamic network input (one optimization profile).

    New tokens per step ``S`` range over [1, max_seq_len], cached tokens ``P`` over
    [0, max_seq_len - 1], so ``T = P + S`` over [1, 2 * max_seq_len - 1] for the mask.
    With ``attention="native"`` the cache has a fixed ``L = max_seq_len`` slots, so only
    the batch of the caches and masks varies, and the masks' query axis (``S``).
    """
    B, L = bc.max_batch_size, bc.max_seq_len
    b, s = bc.opt_batch_size, bc.opt_seq_len
    if kv_cache == "paged":
        return _paged_profile_shapes(config, bc)
    if attention == "native":
        return _native_profile_shapes(config, bc)
    p = min(s, L - 1)  # opt cached length
    Hkv, D = config.num_key_value_heads, config.head_dim
    shapes = _padded_token_shapes(config, bc, ((1, 1, 1, 1, 1), (b, 1, 1, s, p + s), (B, 1, 1, L, 2 * L - 1)))
    for i in range(config.num_hidden_layers):
        for kind in ("key", "value"):
            shapes[f"past_key_values.{i}.{kind}"] = ((1, Hkv, 0, D), (b, Hkv, p, D), (B, Hkv, L - 1, D))
    return shapes


def _padded_token_shapes(
    config: ModelConfig, bc: BuildConfig, mask: tuple[tuple[int, ...], ...]
) -> dict[str, tuple[tuple[int, ...], ...]]:
    """The padded-batch inputs both contiguous variants share: token ids, positions, last
    token ids, and ``mask`` (min, opt, max) for each attention kind the model has."""
    B, L, b, s = bc.max_batch_size, bc.max_seq_len, bc.opt_batch_size, bc.opt_seq_len
    shapes: dict[str, tuple[tuple[int, ...], ...]] = {
        "input_ids": ((1, 1), (b, s), (B, L)),
        "position_ids": ((1, 1), (b, s), (B, L)),
        "last_token_ids": ((1,), (b,), (B,)),
    }
    if "full_attention" in config.layer_types:
        shapes["attention_mask"] = mask
    if "sliding_attention" in config.layer_types:
        shapes["sliding_attention_mask"] = mask
    return shapes


def _native_profile_shapes(config: ModelConfig, bc: BuildConfig) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Contiguous mode with ``attention="native"`` (:func:`trtcore.models.llama.io_spec`)."""
    B, L = bc.max_batch_size, bc.max_seq_len
    b, s = bc.opt_batch_size, bc.opt_seq_len
    Hkv, D = config.num_key_value_heads, config.head_dim
    shapes = _padded_token_shapes(config, bc, ((1, 1, 1, L), (b, 1, s, L), (B, 1, L, L)))
    shapes["cache_write_positions"] = ((1,), (b,), (B,))
    for i in range(config.num_hidden_layers):
        for kind in ("key", "value"):
            shapes[f"kv_cache.{i}.{kind}"] = ((1, Hkv, L, D), (b, Hkv, L, D), (B, Hkv, L, D))
    return shapes


def _paged_profile_shapes(config: ModelConfig, bc: BuildConfig) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Paged mode: ``T`` packed tokens in [1, max_num_tokens], ``B`` sequences in
    [1, max_batch_size], block tables up to ``ceil(max_seq_len / block_size)`` wide, a pool of
    up to ``max_num_blocks`` blocks."""
    B, T, BS = bc.max_batch_size, bc.max_num_tokens, bc.block_size
    b, t = bc.opt_batch_size, min(bc.opt_batch_size * bc.opt_seq_len, T)
    mb = -(-bc.max_seq_len // BS)
    ob = min(-(-bc.opt_seq_len // BS), mb)
    nb = bc.max_num_blocks
    pool = (config.num_hidden_layers, 2, config.num_key_value_heads, BS, config.head_dim)
    shapes: dict[str, tuple[tuple[int, ...], ...]] = {
        "input_ids": ((1,), (t,), (T,)),
        "position_ids": ((1,), (t,), (T,)),
        "kv_cache_pool": tuple((pool[0], n, *pool[1:]) for n in (1, min(b * ob, nb), nb)),  # type: ignore[misc]
        "block_tables": ((1, 1), (b, ob), (B, mb)),
        "seq_lens": ((1,), (b,), (B,)),
        "query_start_loc": ((2,), (b + 1,), (B + 1,)),
        "last_token_ids": ((1,), (b,), (B,)),
    }
    from .rope import rope_spec

    if rope_spec(config).rope_type == "dynamic":
        shapes["rope_seq_lens"] = shapes["input_ids"]
    return shapes


@dataclass
class DefinedNetwork:
    """A network defined from a checkpoint: its builder, network and graph (keep all alive)."""

    trt: Any
    builder: Any
    network: Any
    graph: ops.Graph
    config: ModelConfig
    build_config: BuildConfig


def implementations(trt: Any, build_config: BuildConfig) -> dict[str, str]:
    """The implementation of each fused op for this module and build config.

    ``attention`` is recorded for the contiguous KV cache mode only (paged mode attends
    with its plugin); ``attention="native"`` without a ``kv_cache`` picks ``"contiguous"``.

    Raises:
        InvalidArgumentError: a plugin was asked for on a module that cannot host plugins.
    """
    from .plugins.base import hosts_plugins

    chosen = ops.default_implementations(trt)
    kv_cache = build_config.kv_cache
    if kv_cache is None and build_config.attention == "native":
        kv_cache = "contiguous"
    for op, value, plugin_value in (("rope", build_config.rope, "plugin"), ("kv_cache", kv_cache, "paged")):
        if value is None:
            continue
        if value == plugin_value and not hosts_plugins(trt):
            raise InvalidArgumentError(
                f"{op}={value!r} needs a TensorRT module that hosts plugins; {getattr(trt, '__name__', trt)} does not "
                f"(tensorrt_rtx's Python network has no add_plugin_v3); use {op}={[v for v in ops.IMPLEMENTATIONS[op] if v != value][0]!r}"
            )
        chosen[op] = value
    if chosen["kv_cache"] == "contiguous":
        chosen["attention"] = build_config.attention
    return chosen


def define_network(trt: Any, config: ModelConfig, weights: Any, build_config: BuildConfig) -> DefinedNetwork:
    """Define ``config``'s model in a strongly typed network of the module ``trt``.

    Args:
        trt: the TensorRT module (see :func:`trtcore.trt.load_trt`).
        config: the model config.
        weights: a :class:`trtcore.checkpoint.Checkpoint` (or anything with ``get(name, shape=)``).
        build_config: precision and limits.

    Raises:
        UnsupportedArchitectureError: the architecture has no model family.
        MissingTensorError / TensorShapeError: the checkpoint does not fit the config.
    """
    family = family_for(config.architecture)
    builder = trt.Builder(trt_logger(trt))
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    network.name = config.architecture
    graph = ops.Graph(
        trt, network, build_config.dtype, implementations(trt, build_config), build_config.block_size, build_config.max_seq_len
    )
    family.build(graph, config, weights)
    return DefinedNetwork(trt, builder, network, graph, config, build_config)


def _profile(d: DefinedNetwork) -> dict[str, tuple[tuple[int, ...], ...]]:
    impl = d.graph.implementations
    return profile_shapes(d.config, d.build_config, impl["kv_cache"], impl.get("attention", "layers"))


def _builder_config(d: DefinedNetwork, compute_capability: str | None) -> Any:
    trt = d.trt
    cfg = d.builder.create_builder_config()
    profile = d.builder.create_optimization_profile()
    for name, (lo, opt, hi) in _profile(d).items():
        profile.set_shape(name, lo, opt, hi)
    cfg.add_optimization_profile(profile)
    if d.build_config.dtype == "float32" and hasattr(trt, "BuilderFlag") and hasattr(trt.BuilderFlag, "TF32"):
        cfg.clear_flag(trt.BuilderFlag.TF32)
    if compute_capability is not None:
        if not hasattr(trt, "ComputeCapability"):
            raise InvalidArgumentError(
                f"compute capability {compute_capability!r} can only be chosen with tensorrt_rtx; "
                "TensorRT builds for the GPU it runs on"
            )
        key = "SM" + compute_capability.lower().removeprefix("sm").removeprefix("_")
        if key not in trt.ComputeCapability.__members__:
            choices = [m.lower() for m in trt.ComputeCapability.__members__ if m.startswith("SM")]
            raise InvalidArgumentError(f"compute capability {compute_capability!r} is not supported; expected one of {choices}")
        cfg.num_compute_capabilities = 1
        cfg.set_compute_capability(trt.ComputeCapability.__members__[key], 0)
    return cfg


def build_engine(d: DefinedNetwork, compute_capability: str | None = None) -> bytes:
    """Build ``d.network`` into a serialized engine with one optimization profile.

    Args:
        d: from :func:`define_network`.
        compute_capability: ``"sm89"`` etc., tensorrt_rtx only (ahead-of-time, no GPU needed).

    Raises:
        EngineBuildError: the TensorRT builder returned no engine (its log says why).
        InvalidArgumentError: a compute capability was given where it cannot be used.
    """
    cfg = _builder_config(d, compute_capability)
    logger = trt_logger(d.trt)
    errors = getattr(logger, "errors", [])
    seen = len(errors)
    serialized = d.builder.build_serialized_network(d.network, cfg)
    if serialized is None:
        why = "; ".join(errors[seen:]) or "see TensorRT's log above"
        raise EngineBuildError(f"TensorRT failed to build the {d.config.architecture} network: {why}")
    return bytes(memoryview(serialized))


def build_reference_engine(d: DefinedNetwork) -> Any:
    """Validate ``d`` (a :mod:`trtcore.reference` network) with the same builder config and
    optimization profile a TensorRT build gets, without serializing; returns its ``ICudaEngine``."""
    return d.builder.build_engine(d.network, _builder_config(d, None))


def sidecar(d: DefinedNetwork, engine: bytes, *, backend: str, engine_file: str, compute_capability: str | None) -> dict[str, Any]:
    """The JSON description written beside an engine file."""
    from . import __version__

    return {
        "format": "trtcore-engine/1",
        "trtcore_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "engine_file": engine_file,
        "engine_sha256": hashlib.sha256(engine).hexdigest(),
        "engine_bytes": len(engine),
        "backend": backend,
        "tensorrt_version": getattr(d.trt, "__version__", "unknown"),
        "target": {"compute_capability": compute_capability or "native"},
        "dtype": d.build_config.dtype,
        "kv_cache": d.graph.implementations["kv_cache"],
        "attention": d.graph.implementations.get("attention"),
        "implementations": d.graph.implementations,
        "build_config": asdict(d.build_config),
        "optimization_profiles": [
            {name: {"min": list(lo), "opt": list(opt), "max": list(hi)} for name, (lo, opt, hi) in _profile(d).items()}
        ],
        "model_config": d.config.to_dict(),
    }


def save_engine(d: DefinedNetwork, engine: bytes, output: Path, *, backend: str, compute_capability: str | None) -> Path:
    """Write the engine to ``output`` and its sidecar to ``output + '.json'``; return the sidecar path."""
    output = Path(output)
    meta = sidecar(d, engine, backend=backend, engine_file=output.name, compute_capability=compute_capability)
    side = output.with_name(output.name + ".json")
    write_atomic(output, engine)
    write_atomic(side, (json.dumps(meta, indent=2, default=_json_default) + "\n").encode())
    return side


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer, np.floating)):
        return o.item()
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
