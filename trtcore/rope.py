"""Rotary position embedding (RoPE) frequencies, as Hugging Face transformers computes them.

RoPE (Su et al., "RoFormer", arXiv:2104.09864) rotates pairs of query/key features by the
angle ``position * inv_freq[i]``. The scaling variants and their formulas follow
transformers' ``modeling_rope_utils.py`` (``_compute_default_rope_parameters``,
``_compute_linear_scaling_rope_parameters``, ``_compute_dynamic_ntk_parameters``,
``_compute_llama3_parameters``, ``_compute_yarn_parameters``):

* ``linear``: ``inv_freq / factor`` (Chen et al., arXiv:2306.15595);
* ``dynamic`` (NTK-aware, /u/bloc97 and /u/emozilla): the base grows with the current
  sequence length ``s > max_position_embeddings`` as
  ``base * (factor * s / max_position_embeddings - (factor - 1)) ** (dim / (dim - 2))``;
  because it depends on ``s`` it is evaluated inside the network (see :mod:`trtcore.ops`);
* ``llama3``: wavelength-dependent interpolation between ``inv_freq`` and
  ``inv_freq / factor`` (Llama 3.1 reference code);
* ``yarn`` (Peng et al., arXiv:2309.00071): ramp between interpolation and extrapolation,
  plus an attention factor that scales cos and sin;
* ``longrope`` (Ding et al., "LongRoPE", arXiv:2402.13753; Phi-3 / Phi-3.5,
  ``_compute_longrope_parameters``): per-frequency rescale factors,
  ``inv_freq[i] = 1 / (ext_factor[i] * base ** (2i / dim))`` with ``ext_factor`` the
  ``short_factor`` list, or the ``long_factor`` list for a sequence longer than
  ``original_max_position_embeddings``, and an attention factor on cos and sin (see
  :func:`longrope_uses_long`).

All arrays here are float64; the network casts to float32 as transformers computes in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The RoPE types trtcore builds (besides ``"default"``) and the keys ``rope_scaling`` must
#: carry for each (from ``transformers.modeling_rope_utils`` ``_validate_*_rope_parameters``).
#: The one list: config parsing rejects any other type at load time, :func:`rope_spec`
#: computes exactly these.
ROPE_TYPES: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}

#: RoPE types whose frequencies depend on the length of each token's sequence in the current
#: forward call (the network then takes each token's sequence length, ``rope_seq_lens``).
PER_SEQUENCE_ROPE_TYPES: tuple[str, ...] = ("dynamic", "longrope")

SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", *ROPE_TYPES)


@dataclass(frozen=True)
class RopeSpec:
    """Everything a RoPE implementation needs, derived from a model config.

    Attributes:
        rotary_dim: number of rotated features per head (``head_dim * partial_rotary_factor``).
        head_dim: features per head.
        base: ``rope_theta``.
        rope_type: one of :data:`SUPPORTED_ROPE_TYPES`.
        inv_freq: float64 ``[rotary_dim // 2]`` inverse frequencies (for ``dynamic``: those
            at ``seq_len <= max_position_embeddings``; for ``longrope``: the short ones).
        attention_scaling: factor applied to cos and sin (YaRN's and LongRoPE's attention
            factor, else 1).
        dynamic_factor: the ``factor`` of dynamic NTK scaling, 0 for other types.
        max_position_embeddings: the length beyond which dynamic NTK scaling starts.
        long_inv_freq: ``longrope`` only: float64 ``[rotary_dim // 2]``, the inverse
            frequencies of a sequence longer than ``original_max_position_embeddings``.
        original_max_position_embeddings: ``longrope`` only: the length beyond which
            ``long_inv_freq`` is used (:func:`longrope_uses_long`); 0 otherwise.
    """

    rotary_dim: int
    head_dim: int
    base: float
    rope_type: str
    inv_freq: np.ndarray
    attention_scaling: float = 1.0
    dynamic_factor: float = 0.0
    max_position_embeddings: int = 0
    long_inv_freq: np.ndarray | None = None
    original_max_position_embeddings: int = 0

    @property
    def per_sequence(self) -> bool:
        """Whether the frequencies depend on each sequence's length in the current forward
        call (``dynamic``, ``longrope``; :data:`PER_SEQUENCE_ROPE_TYPES`)."""
        return self.rope_type in PER_SEQUENCE_ROPE_TYPES


def default_inv_freq(base: float, dim: int) -> np.ndarray:
    """``1 / base ** (arange(0, dim, 2) / dim)`` in float64, shape ``[dim // 2]``."""
    return 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def dynamic_ntk_base(base: float, factor: float, seq_len: float, max_position_embeddings: int, dim: int) -> float:
    """The dynamic-NTK base for a sequence of ``seq_len`` tokens (unchanged up to the max length)."""
    s = max(seq_len, max_position_embeddings)
    return base * ((factor * s / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))


def _llama3(inv_freq: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    factor = float(p["factor"])
    low, high = float(p["low_freq_factor"]), float(p["high_freq_factor"])
    old_len = float(p["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def _yarn(base: float, dim: int, p: dict[str, Any], max_position_embeddings: int) -> tuple[np.ndarray, float]:
    original = int(p.get("original_max_position_embeddings") or max_position_embeddings)
    factor = p.get("factor")
    factor = float(factor) if factor is not None else max_position_embeddings / original

    def mscale_of(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attention_factor = mscale_of(factor, m) / mscale_of(factor, m_all) if m and m_all else mscale_of(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attention_factor)


def longrope_uses_long(seq_len: Any, original_max_position_embeddings: int) -> Any:
    """Whether LongRoPE rotates a token with the ``long_factor`` frequencies: its sequence's
    length in the current forward call ``seq_len`` (the largest position + 1) exceeds
    ``original_max_position_embeddings`` (a bool, or a bool array for an array ``seq_len``).

    This is transformers' rule (``dynamic_rope_update`` -> ``longrope_frequency_update``,
    ``seq_len = max(position_ids) + 1`` of each call) and therefore its behaviour with a KV
    cache: a prompt of ``n <= L`` tokens is rotated with the short factors, and so are
    the decode steps at positions ``< L``; the step at position ``L`` and every later
    one use the long factors, while the keys already in the cache keep the short rotation
    they were written with (transformers does not recompute them; neither does trtcore).
    A prompt longer than ``L`` is rotated with the long factors throughout. trtcore applies
    the rule per sequence (transformers takes the maximum over the whole padded batch, which
    is the same for one sequence or when all sequences are on the same side of ``L``).
    """
    return np.asarray(seq_len) > int(original_max_position_embeddings)


def _longrope(base: float, dim: int, p: dict[str, Any], max_position_embeddings: int) -> tuple[np.ndarray, np.ndarray, float, int]:
    """(short inv_freq, long inv_freq, attention factor, original length) of ``_compute_longrope_parameters``."""
    from .errors import ConfigError

    original = int(p["original_max_position_embeddings"])
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    inv = []
    for key in ("short_factor", "long_factor"):
        f = np.asarray(p[key], dtype=np.float64)
        if f.shape != (dim // 2,) or not np.all(np.isfinite(f)) or not np.all(f > 0):
            raise ConfigError(f"rope_scaling field {key!r} is {p[key]!r}, expected {dim // 2} positive numbers (rotary_dim // 2)")
        inv.append(1.0 / (f * base**exponents))
    factor = p.get("factor")
    factor = float(factor) if factor is not None else max_position_embeddings / original  # Phi-3: the ratio of the lengths
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return inv[0], inv[1], float(attention_factor), original


def rope_spec(config: Any, partial_rotary_factor: float | None = None) -> RopeSpec:
    """The :class:`RopeSpec` of a :class:`trtcore.config.ModelConfig`.

    Args:
        config: the model config.
        partial_rotary_factor: the fraction of ``head_dim`` to rotate; None for the
            config's (a model family whose modeling code ignores the field passes 1.0).

    Raises:
        ConfigError: the ``rope_type`` is not supported, or a field it needs is missing.
    """
    from .errors import ConfigError

    head_dim = int(config.head_dim)
    scaling = dict(config.rope_scaling or {})
    if partial_rotary_factor is None:
        partial = float(scaling.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0) or 1.0))
    else:
        partial = float(partial_rotary_factor)
    dim = int(head_dim * partial)
    base = float(config.rope_theta)
    rope_type = scaling.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(f"rope_scaling rope_type {rope_type!r} is not supported; expected one of {SUPPORTED_ROPE_TYPES}")
    try:
        inv = default_inv_freq(base, dim)
        scale, dyn, long_inv, original = 1.0, 0.0, None, 0
        if rope_type == "linear":
            inv = inv / float(scaling["factor"])
        elif rope_type == "llama3":
            inv = _llama3(inv, scaling)
        elif rope_type == "yarn":
            inv, scale = _yarn(base, dim, scaling, int(config.max_position_embeddings))
        elif rope_type == "dynamic":
            dyn = float(scaling["factor"])
        elif rope_type == "longrope":
            inv, long_inv, scale, original = _longrope(base, dim, scaling, int(config.max_position_embeddings))
    except KeyError as exc:
        raise ConfigError(f"rope_scaling of type {rope_type!r} needs the field {exc.args[0]!r}") from None
    return RopeSpec(
        rotary_dim=dim,
        head_dim=head_dim,
        base=base,
        rope_type=rope_type,
        inv_freq=inv,
        attention_scaling=scale,
        dynamic_factor=dyn,
        max_position_embeddings=int(config.max_position_embeddings),
        long_inv_freq=long_inv,
        original_max_position_embeddings=original,
    )
