"""Build choices, resolved once: the user's options (:class:`BuildConfig`, None = default)
become one immutable :class:`BuildPlan` through :func:`resolve_plan`.

``LLM(...)``, ``trtcore build`` and :func:`trtcore.builder.define_network` all call
:func:`resolve_plan`, so the same arguments give the same backend, dtype, RoPE, KV cache
mode and attention everywhere. The runtime reads the plan (and the KV cache contract of
:func:`trtcore.kv_modes.kv_mode`), never the engine's tensor names. The engine sidecar
records the plan (:meth:`BuildPlan.to_dict`).

One rule per default:

* ``backend``: ``$TRTCORE_BACKEND``, else ``tensorrt`` when its runtime starts on a GPU here,
  else ``cuda`` (trtcore's own engine) when a CUDA GPU, CuPy and nvmath-python are there,
  else ``reference`` (``engine=True``, a serialized engine file: ``tensorrt_rtx`` instead of
  ``reference``, which cannot write one);
* ``dtype``: float32 on the reference backend; on TensorRT backends the checkpoint's dtype
  when it is float16 or bfloat16, else float16. A float16 plan from a bfloat16 checkpoint
  warns (float16 overflows above 65504, bfloat16 does not);
* ``rope``: the plugin where the backend's module hosts plugins, else composed layers;
  ``attention`` (RoPE inside the paged attention plugin, on a packed qkv input: no RoPE launch,
  no q/k/v copies) is opt-in: measured slower than plugin + attention on the H200;
* ``kv_cache``: ``paged`` on every backend that hosts plugins (reference, tensorrt, cuda; on a
  GPU backend when the model's ``head_dim`` is a multiple of 32, what the paged kernels take)
  and whenever ``rope="attention"``; else ``contiguous`` (``tensorrt_rtx``, whose Python network
  has no ``add_plugin_v3``), and whenever ``attention="native"``;
* ``attention``: ``layers``; the paged mode always attends with its plugin (``"plugin"``);
* ``kv_cache_dtype``: ``"auto"`` (vLLM's name: the engine dtype); ``"fp8"`` / ``"fp8_e4m3"``
  (resolved to ``"fp8_e4m3"``) stores the paged pool as E4M3 codes with per-layer scales (vLLM's
  quantized KV cache) and needs ``kv_cache="paged"`` and a float16 / bfloat16 engine;
* ``max_seq_len``: the model's ``max_position_embeddings``, and capped at it;
* the profile bounds (``max_batch_size`` ...): the :class:`BuildConfig` defaults; the opt
  point is clamped to the maxima.
"""

from __future__ import annotations

import numbers
import os
import warnings
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .config import ModelConfig
from .dtypes import ENGINE_DTYPES
from .errors import InvalidArgumentError

DTYPES: tuple[str, ...] = tuple(ENGINE_DTYPES)

#: implementations of each fused op (DESIGN.md, "Fused ops have several implementations");
#: ``attention`` chooses within the contiguous KV cache mode (paged mode uses its plugin):
#: ``"layers"`` (``ops.attention`` over concat(past, new)) or ``"native"``
#: (``ops.native_attention``: TensorRT's ``IKVCacheUpdateLayer`` + ``IAttention``)
#: ``rope``: ``"plugin"`` (the RoPE plugin), ``"layers"`` or ``"attention"`` (fused into the paged
#: attention plugin where the model allows it -- no dynamic scaling; else the RoPE plugin)
IMPLEMENTATIONS: dict[str, tuple[str, ...]] = {
    "rope": ("plugin", "layers", "attention"),
    "kv_cache": ("paged", "contiguous"),
    "attention": ("layers", "native"),
}

#: ``kv_cache_dtype`` values (vLLM's ``--kv-cache-dtype`` names): ``"auto"`` = the engine dtype;
#: ``"fp8"`` is an alias of ``"fp8_e4m3"`` (E4M3 codes with per-layer float32 scales)
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8", "fp8_e4m3")
#: the resolved FP8 KV cache dtype (BuildPlan.kv_cache_dtype)
FP8_KV_CACHE = "fp8_e4m3"


def normalize_kv_cache_dtype(value: Any) -> str:
    """``value`` as a :attr:`BuildPlan.kv_cache_dtype`: ``"auto"`` or ``"fp8_e4m3"``
    (``"fp8"`` is its alias; case-insensitive).

    Raises:
        InvalidArgumentError: not one of :data:`KV_CACHE_DTYPES` (the message names the value
            and the accepted ones).
    """
    name = value.lower() if isinstance(value, str) else None
    if name not in KV_CACHE_DTYPES:
        raise InvalidArgumentError(f"kv_cache_dtype {value!r} is not supported; expected one of {', '.join(KV_CACHE_DTYPES)}")
    return FP8_KV_CACHE if name == "fp8" else name


#: ``BuildPlan.attention`` of the paged KV cache mode: the paged attention plugin
PAGED_ATTENTION = "plugin"

#: ``BuildPlan.rope`` for RoPE inside the paged attention plugin (its fused RoPE, packed qkv)
ROPE_IN_ATTENTION = "attention"

#: float16's largest finite value (IEEE 754 binary16)
FLOAT16_MAX = 65504.0


def check_int(name: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an int, or InvalidArgumentError naming ``name`` (not an integer -- a bool,
    float or string is refused -- or below ``minimum`` when given)."""
    if type(value) is int and (minimum is None or value >= minimum):  # the common case, without the ABC check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _choice(what: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise InvalidArgumentError(f"{what} {value!r} is not supported; expected one of {', '.join(allowed)}")


@dataclass(frozen=True)
class BuildConfig:
    """Engine build options as the user gives them; None means "the default" (the module
    docstring lists the rules, applied by :func:`resolve_plan`).

    Attributes:
        dtype: engine precision, one of :data:`DTYPES`, or None.
        max_batch_size: largest batch (sequences per step) the profile admits.
        max_seq_len: largest number of tokens (cached + new) per sequence; None for the
            model's ``max_position_embeddings`` (and capped at it).
        opt_batch_size / opt_seq_len: the profile's ``opt`` point (TensorRT tunes for it);
            clamped to the maxima.
        rope: RoPE implementation, ``"plugin"`` (fused kernel), ``"layers"`` (composed
            standard layers) or ``"attention"`` (inside the paged attention plugin; needs
            the paged KV cache), or None.
        kv_cache: ``"paged"`` (packed tokens, one block pool, the paged attention plugin) or
            ``"contiguous"`` (padded batch, per-layer cache as engine I/O), or None.
        block_size: tokens per KV block (paged).
        max_num_tokens: most packed tokens per step (paged; the scheduler's token budget).
        max_num_blocks: most blocks in the KV pool (paged; the profile's bound).
        attention: attention of the contiguous KV cache mode: ``"layers"`` (composed
            matmul/softmax over ``concat(past, new)``) or ``"native"`` (TensorRT's
            ``IKVCacheUpdateLayer`` + ``IAttention`` over a fixed-size cache of
            ``max_seq_len`` slots). ``"native"`` needs ``kv_cache="contiguous"`` (None
            resolves to it); paged mode attends with its plugin.
        kv_cache_dtype: the KV cache's element type, vLLM's names: ``"auto"`` (the engine
            dtype) or ``"fp8"`` / ``"fp8_e4m3"`` (normalised to ``"fp8_e4m3"``: E4M3 codes with a
            float32 scale per layer for keys and one for values; paged mode, float16/bfloat16).

    Raises:
        InvalidArgumentError: an unknown choice or a bound below its minimum (the message
            names the value and what is expected).
    """

    dtype: str | None = None
    max_batch_size: int = 8
    max_seq_len: int | None = None
    opt_batch_size: int = 1
    opt_seq_len: int = 128
    rope: str | None = None
    kv_cache: str | None = None
    block_size: int = 16
    max_num_tokens: int = 2048
    max_num_blocks: int = 65536
    attention: str = "layers"
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_seq_len", "opt_batch_size", "opt_seq_len", "block_size", "max_num_tokens", "max_num_blocks"):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value)  # the type here; each bound below, with its own message
        _choice("attention", self.attention, IMPLEMENTATIONS["attention"])
        if self.attention == "native" and self.kv_cache == "paged":
            raise InvalidArgumentError(
                "attention='native' (IAttention + IKVCacheUpdateLayer) is only valid with kv_cache='contiguous'; "
                "the paged KV cache attends with its plugin"
            )
        _choice("kv_cache", self.kv_cache, IMPLEMENTATIONS["kv_cache"])
        if self.rope == ROPE_IN_ATTENTION and (self.kv_cache == "contiguous" or self.attention == "native"):
            raise InvalidArgumentError(
                "rope='attention' (RoPE inside the paged attention plugin) needs kv_cache='paged'; "
                f"got kv_cache={self.kv_cache!r}, attention={self.attention!r}"
            )
        if self.block_size < 1 or self.max_num_tokens < 1 or self.max_num_blocks < 1:
            raise InvalidArgumentError(
                f"block_size, max_num_tokens and max_num_blocks must be >= 1, got {self.block_size}, {self.max_num_tokens}, {self.max_num_blocks}"
            )
        _choice("rope", self.rope, IMPLEMENTATIONS["rope"])
        _choice("dtype", self.dtype, DTYPES)
        object.__setattr__(self, "kv_cache_dtype", normalize_kv_cache_dtype(self.kv_cache_dtype))
        if self.kv_cache_dtype == FP8_KV_CACHE and (self.kv_cache == "contiguous" or self.attention == "native"):
            raise InvalidArgumentError(
                "the FP8 KV cache (kv_cache_dtype='fp8') needs kv_cache='paged' (the FP8 pool is the paged attention plugin's); "
                f"got kv_cache={self.kv_cache!r}, attention={self.attention!r}"
            )
        if self.kv_cache_dtype == FP8_KV_CACHE and self.dtype == "float32":
            raise InvalidArgumentError(
                "the FP8 KV cache (kv_cache_dtype='fp8') needs a float16 or bfloat16 engine (dtype='float16' or 'bfloat16'), got dtype='float32'"
            )
        if self.max_batch_size < 1 or (self.max_seq_len is not None and self.max_seq_len < 2):
            raise InvalidArgumentError(f"max_batch_size must be >= 1 and max_seq_len >= 2, got {self.max_batch_size} and {self.max_seq_len}")
        if self.opt_batch_size < 1 or self.opt_seq_len < 1:
            raise InvalidArgumentError(f"opt_batch_size and opt_seq_len must be >= 1, got {self.opt_batch_size}, {self.opt_seq_len}")
        # the opt point lies inside [min, max]
        object.__setattr__(self, "opt_batch_size", min(self.opt_batch_size, self.max_batch_size))
        if self.max_seq_len is not None:
            object.__setattr__(self, "opt_seq_len", min(self.opt_seq_len, self.max_seq_len))

    def for_model(self, config: ModelConfig) -> BuildConfig:
        """A copy whose lengths fit ``config`` (max_seq_len <= max_position_embeddings)."""
        limit = config.max_position_embeddings
        return replace(self, max_seq_len=min(self.max_seq_len or limit, limit))


@dataclass(frozen=True)
class BuildPlan:
    """Every build choice, resolved (:func:`resolve_plan`); immutable.

    Attributes:
        backend: ``"tensorrt"``, ``"tensorrt_rtx"``, ``"reference"`` or ``"cuda"``.
        dtype: engine precision (weights, activations, KV cache), one of :data:`DTYPES`.
        rope: ``"plugin"``, ``"layers"`` or ``"attention"``.
        kv_cache: ``"paged"`` or ``"contiguous"``.
        attention: ``"plugin"`` (paged mode: the paged attention plugin), ``"layers"`` or
            ``"native"`` (contiguous mode).
        block_size: tokens per KV block (paged).
        max_batch_size: most sequences per step.
        max_seq_len: most tokens (cached + new) per sequence, <= ``max_position_embeddings``;
            the slots per sequence of the native fixed-size cache.
        opt_batch_size / opt_seq_len: the optimization profile's ``opt`` point (<= maxima).
        max_num_tokens: most packed tokens per step (paged).
        max_num_blocks: most blocks in the KV pool (paged; the profile's bound).
        kv_cache_dtype: ``"auto"`` (the KV cache in :attr:`dtype`) or ``"fp8_e4m3"`` (the paged
            pool holds E4M3 codes, per-layer scales; :attr:`kv_pool_dtype`).
    """

    backend: str
    dtype: str
    rope: str
    kv_cache: str
    attention: str
    block_size: int
    max_batch_size: int
    max_seq_len: int
    opt_batch_size: int
    opt_seq_len: int
    max_num_tokens: int
    max_num_blocks: int
    kv_cache_dtype: str = "auto"

    @property
    def kv_fp8(self) -> bool:
        """Whether the paged pool holds E4M3 codes (``kv_cache_dtype == "fp8_e4m3"``)."""
        return self.kv_cache_dtype == FP8_KV_CACHE

    @property
    def kv_pool_dtype(self) -> str:
        """The KV cache's element type name (:mod:`trtcore.dtypes`): ``"float8_e4m3fn"`` with
        the FP8 KV cache, else :attr:`dtype`."""
        return "float8_e4m3fn" if self.kv_fp8 else self.dtype

    @property
    def implementations(self) -> dict[str, str]:
        """Per fused op, its implementation (:data:`IMPLEMENTATIONS`): ``rope``, ``kv_cache``
        and, in the contiguous mode only, ``attention``."""
        return _implementation_dict(self.rope, self.kv_cache, self.attention)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready ``{field: value}`` (the sidecar's ``"plan"``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BuildPlan:
        """Inverse of :meth:`to_dict`.

        A plan written before ``kv_cache_dtype`` existed (no such key) reads as ``"auto"``.

        Raises:
            InvalidArgumentError: a field is missing or unknown.
        """
        d = {"kv_cache_dtype": "auto", **d}
        names = {f.name for f in fields(cls)}
        if set(d) != names:
            raise InvalidArgumentError(
                f"a build plan has the fields {sorted(names)}; got missing {sorted(names - set(d))}, unknown {sorted(set(d) - names)}"
            )
        return cls(**d)


def tensorrt_usable() -> bool:
    """Whether the ``tensorrt`` backend can run here: the module imports (not type stubs), a
    CUDA GPU is visible, and TensorRT creates a ``Builder`` on it (TensorRT refuses to when
    no GPU it supports is there). Never raises."""
    from . import gpu
    from .trt import is_available, load_trt

    if not is_available("tensorrt") or gpu.device_count() < 1:
        return False
    try:
        trt = load_trt("tensorrt")
        return trt.Builder(trt.Logger(trt.Logger.ERROR)) is not None
    except Exception:  # noqa: BLE001 - any failure to start TensorRT means "not usable"
        return False


def cuda_usable() -> bool:
    """Whether the ``cuda`` backend can execute here (:func:`trtcore.gpu.cuda_backend_status`:
    a CUDA GPU, CuPy and nvmath-python). Never raises."""
    from . import gpu

    return gpu.cuda_backend_status()[0]


def default_backend(engine: bool = False) -> str:
    """``$TRTCORE_BACKEND``; else ``tensorrt`` when :func:`tensorrt_usable`; else ``cuda``
    when :func:`cuda_usable`; else ``reference``, or ``tensorrt_rtx`` when ``engine`` (a
    serialized engine file is wanted, which the reference backend cannot write; TensorRT-RTX
    builds ahead of time on a CPU-only machine).

    Raises:
        InvalidArgumentError: ``$TRTCORE_BACKEND`` names no backend.
    """
    from .trt import normalize_backend

    env = os.environ.get("TRTCORE_BACKEND")
    if env:
        return normalize_backend(env)
    if tensorrt_usable():
        return "tensorrt"
    if cuda_usable():
        return "cuda"
    return "tensorrt_rtx" if engine else "reference"


def default_dtype(backend: str, checkpoint_dtype: str | None) -> str:
    """float32 on the reference backend; on TensorRT the checkpoint's float16/bfloat16,
    else float16 (float32 checkpoints run in half precision on the GPU by default)."""
    if backend == "reference":
        return "float32"
    return checkpoint_dtype if checkpoint_dtype in ("float16", "bfloat16") else "float16"


def resolve_plan(
    config: ModelConfig,
    options: BuildConfig | None = None,
    backend: str | None = None,
    *,
    engine: bool = False,
    trt: Any = None,
    fit_model: bool = True,
) -> BuildPlan:
    """Resolve the user's ``options`` (None fields = defaults, see the module docstring)
    for ``config``'s model on ``backend`` into a :class:`BuildPlan`.

    Args:
        config: the model config (``max_position_embeddings``, the checkpoint ``dtype``).
        options: the user's choices; None for all defaults.
        backend: ``"tensorrt"``, ``"tensorrt_rtx"``, ``"reference"``, ``"cuda"`` (or an alias), or None.
        engine: a serialized engine file is wanted (``trtcore build``): the reference
            backend is refused and the default falls back on ``tensorrt_rtx``.
        trt: the backend's module when already loaded (else :func:`trtcore.trt.load_trt`);
            whether it hosts plugins decides ``rope``'s default.
        fit_model: cap ``max_seq_len`` at ``max_position_embeddings`` (the rule); False
            takes a given ``options.max_seq_len`` literally (:func:`trtcore.builder.define_network`
            handed options directly, as it always has).

    Warns:
        UserWarning: a float16 plan for a bfloat16 checkpoint (range limit 65504).

    Raises:
        InvalidArgumentError: a plugin was asked for on a module that cannot host plugins,
            or ``engine`` with the reference backend, or an unknown backend, or
            ``kv_cache_dtype="fp8_e4m3"`` with a contiguous KV cache or a float32 engine.
        BackendNotAvailableError: the backend's module is not installed.
    """
    from .trt import normalize_backend

    o = options or BuildConfig()
    name = normalize_backend(backend) if backend else default_backend(engine)
    if engine and name == "reference":
        raise InvalidArgumentError("backend 'reference' cannot write an engine file; use backend 'tensorrt' or 'tensorrt_rtx'")
    rope, kv_cache, attention = _implementations(o, name, trt, config.head_dim)
    dtype = o.dtype or default_dtype(name, config.dtype)
    if o.kv_cache_dtype == FP8_KV_CACHE and (kv_cache != "paged" or dtype not in ("float16", "bfloat16")):
        # name only what is missing (the paged cache, or a 16-bit engine)
        missing = ([f"the paged KV cache (this plan has kv_cache={kv_cache!r})"] if kv_cache != "paged" else []) + (
            [f"a float16 or bfloat16 engine (this plan has dtype={dtype!r})"] if dtype not in ("float16", "bfloat16") else []
        )
        # why the plan lacks it: a backend without plugins has no paged cache; the reference
        # backend's default dtype is float32
        why = (
            [f"backend {name!r} has no paged KV cache (its TensorRT module hosts no plugins): use backend 'tensorrt', 'cuda' or 'reference'"]
            if kv_cache != "paged" and o.kv_cache is None and not _hosts_plugins(name, trt)[1]
            else []
        ) + (
            ["the reference backend defaults to float32: pass dtype='bfloat16', on the command line --dtype bfloat16"]
            if o.dtype is None and name == "reference" and dtype not in ("float16", "bfloat16")
            else []
        )
        raise InvalidArgumentError("the FP8 KV cache (kv_cache_dtype='fp8') needs " + " and ".join(missing) + "".join(f" ({w})" for w in why))
    if dtype == "float16" and config.dtype == "bfloat16":
        warnings.warn(
            f"building a float16 engine from a bfloat16 checkpoint: float16 overflows above {FLOAT16_MAX:g} "
            "(bfloat16 does not), so large activations may become inf/NaN; prefer dtype='bfloat16'",
            UserWarning,
            stacklevel=2,
        )
    bounded = o.for_model(config) if fit_model or o.max_seq_len is None else o
    assert bounded.max_seq_len is not None
    return BuildPlan(
        backend=name,
        dtype=dtype,
        rope=rope,
        kv_cache=kv_cache,
        attention=attention,
        block_size=o.block_size,
        max_batch_size=o.max_batch_size,
        max_seq_len=bounded.max_seq_len,
        opt_batch_size=bounded.opt_batch_size,
        opt_seq_len=bounded.opt_seq_len,
        max_num_tokens=o.max_num_tokens,
        max_num_blocks=o.max_num_blocks,
        kv_cache_dtype=o.kv_cache_dtype,
    )


#: the paged attention plugin's CUDA kernels take head dims that are multiples of this
PAGED_KERNEL_HEAD_DIM_MULTIPLE = 32


def _hosts_plugins(backend: str, trt: Any) -> tuple[Any, bool]:
    """``backend``'s TensorRT module (``trt``, loaded when None) and whether it hosts plugins."""
    from .plugins.base import hosts_plugins
    from .trt import load_trt

    module = trt if trt is not None else load_trt(backend)
    return module, hosts_plugins(module)


def _implementations(o: BuildConfig, backend: str, trt: Any, head_dim: int | None = None) -> tuple[str, str, str]:
    """``(rope, kv_cache, attention)`` of :func:`resolve_plan`'s rules for the module ``trt``
    of ``backend`` (loaded when None) and a model of ``head_dim`` (None: not known)."""
    module, plugins = _hosts_plugins(backend, trt)
    for op, value, plugin_values in (("rope", o.rope, ("plugin", ROPE_IN_ATTENTION)), ("kv_cache", o.kv_cache, ("paged",))):
        if value in plugin_values and not plugins:
            other = next(v for v in IMPLEMENTATIONS[op] if v not in plugin_values)
            raise InvalidArgumentError(
                f"{op}={value!r} needs a TensorRT module that hosts plugins; {getattr(module, '__name__', module)} does not "
                f"(tensorrt_rtx's Python network has no add_plugin_v3); use {op}={other!r}"
            )
    # paged wherever the plugin runs (on a GPU: a head_dim its kernels take); native attention
    # has a fixed-size cache
    kernels_fit = backend == "reference" or head_dim is None or head_dim % PAGED_KERNEL_HEAD_DIM_MULTIPLE == 0
    paged = (plugins and kernels_fit and o.attention != "native") or o.rope == ROPE_IN_ATTENTION
    kv_cache = o.kv_cache or ("paged" if paged else "contiguous")
    # RoPE inside attention saves a launch but its kernels are slower than the two launches on the
    # H200 (bench/results/h200-2026-12-01-tactics; batch-1 decode 13.3 us against 7.6 + 2.8 in
    # h200-2026-12-04-session18): opt-in until they are tuned
    rope = o.rope or ("plugin" if plugins else "layers")
    return rope, kv_cache, PAGED_ATTENTION if kv_cache == "paged" else o.attention


def implementations(options: BuildConfig, backend: str, trt: Any = None) -> dict[str, str]:
    """:attr:`BuildPlan.implementations` that :func:`resolve_plan` picks for ``options`` on
    ``backend`` (whose module is ``trt``, loaded when None); the model is not needed.

    Raises:
        InvalidArgumentError: a plugin was asked for on a module that cannot host plugins.
    """
    return _implementation_dict(*_implementations(options, backend, trt))


def _implementation_dict(rope: str, kv_cache: str, attention: str) -> dict[str, str]:
    chosen = {"rope": rope, "kv_cache": kv_cache}
    if kv_cache == "contiguous":  # paged mode always attends with its plugin
        chosen["attention"] = attention
    return chosen
