"""Fused rotary position embedding (RoPE) on q and k: the ``trtcore_rope`` plugin.

One plugin call rotates the queries and keys of every token by the angles
``position * inv_freq`` (Su et al., "RoFormer", arXiv:2104.09864), with the pairing and
scaling variants of Hugging Face transformers (see :mod:`trtcore.rope`):

* pairing: ``is_neox=True`` rotates feature ``i`` with ``i + rotary_dim/2`` (GPT-NeoX /
  Llama, transformers' ``rotate_half``); ``is_neox=False`` rotates ``2i`` with ``2i+1``
  (GPT-J, transformers' ``rotate_every_two``);
* partial rotary: only the first ``rotary_dim`` of ``head_dim`` features are rotated, the
  rest are copied through;
* frequencies: ``inv_freq`` is an input, a float32 network constant computed on the host
  by :func:`trtcore.rope.rope_spec` (default, ``linear``, ``llama3`` and ``yarn`` scaling
  all reduce to a fixed ``inv_freq``), so the kernel and :meth:`RopePlugin.reference` use
  bit-identical frequencies;
* ``dynamic`` (NTK-aware) scaling: the frequencies depend on each sequence's length, given
  per token in ``seq_lens``; see :meth:`RopePlugin.frequencies`;
* ``longrope`` scaling (Phi-3 / Phi-3.5): ``inv_freq`` holds the short and the long
  frequencies, and each token takes the long ones when its sequence length (``seq_lens``)
  exceeds ``original_max_position_embeddings`` (:func:`trtcore.rope.longrope_uses_long`);
* ``attention_scaling`` (YaRN's and LongRoPE's attention factor) multiplies cos and sin.

The CUDA kernel is ``kernels/rope.cu`` (compiled by NVRTC through :mod:`trtcore.kernels`,
specialised by dtype, head_dim, rotary_dim, pairing, dynamic and vector width).

Numerical contract (float32 arithmetic, one rounding to the I/O dtype; the kernel and the
NumPy reference follow it operation by operation)::

    freq   = inv_freq[i]                      (float32; dynamic / longrope: see frequencies())
    angle  = float32(position) * freq         one float32 product, as transformers'
                                              position_ids.float() @ inv_freq
    cos    = float32(cos(float64(angle))) * float32(attention_scaling)   (float32 product)
    sin    = float32(sin(float64(angle))) * float32(attention_scaling)
    out_a  = x_a * cos - x_b * sin            each product and the difference rounded in float32
    out_b  = x_b * cos + x_a * sin            (no fused multiply-add)
    output = round_to_nearest_even(out, dtype of q)

cos and sin are the float64 cosine/sine of the float32 angle rounded to float32, i.e. the
correctly rounded float32 values (up to a double-rounding tie, probability ~1e-8 per value):
the kernel computes them with CUDA's float64 ``sincos`` and the reference with NumPy's
float64 ``cos``/``sin``, so both agree bit for bit, whereas two float32 ``cosf``
implementations (CUDA's ``sincosf`` is within 2 ulp, PyTorch's CPU ``cos`` within 1 ulp)
need not. transformers evaluates the same float32 angle with float32 ``cos``/``sin``, so the
plugin matches it to within one float32 ulp of cos/sin. The angle itself is rounded to
float32 exactly as in transformers (its error grows with the position: ~4e-4 rad at
position 8192 -- that is transformers' numerics, reproduced, not an error of the plugin).

For tests, :meth:`RopePlugin.reference` also runs in **float64 mode**: given float64 q and
k it evaluates the same formula entirely in float64 (angle, cos/sin, rotation and the
dynamic frequencies unrounded), which is compared with transformers evaluated in float64.

Fields are float32 in the serialized plugin (``PluginFieldCollection`` ``FLOAT32``), so
every float field is rounded to float32 when the plugin is made; ``reference`` and the
kernel both use those rounded values, and a plugin rebuilt from its field collection is
equal to the original.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from trtcore.dtypes import KERNEL_DTYPE_CODES

from .base import DeviceTensor, Dim, Plugin, PluginError

__all__ = ["DTYPE_CODES", "RopePlugin"]

_BF16 = np.dtype(ml_dtypes.bfloat16)
#: the kernel's DTYPE define per I/O dtype
DTYPE_CODES = KERNEL_DTYPE_CODES  # the DTYPE define of kernels/dtype.cuh
_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)
_FLOAT64 = np.dtype(np.float64)

#: largest threads per block the kernel is compiled for (``ROPE_MAX_BLOCK`` in rope.cu)
_MAX_BLOCK = 256
#: units each thread loads before using them (``UNROLL`` in rope.cu)
_UNROLL = 4


def _f32(x: float) -> float:
    """``x`` rounded to float32 (what a FLOAT32 plugin field can hold), as a Python float."""
    return float(np.float32(x))


@dataclass
class RopePlugin(Plugin):
    """Fused RoPE on q and k (plugin ``trtcore_rope``, version 1, namespace ``trtcore``).

    Inputs (in this order; any number of leading token dimensions ``T...``, the same for
    every input, e.g. ``[num_tokens]`` for packed tokens or ``[batch, seq]``):

    ===  =============  ========================  ==========================================
    #    name           shape                     dtype
    ===  =============  ========================  ==========================================
    0    q              ``[T..., num_q_heads, head_dim]``   float32, float16 or bfloat16
    1    k              ``[T..., num_k_heads, head_dim]``   the dtype of q
    2    position_ids   ``[T...]``                int32, each token's position
    3    inv_freq       ``[rotary_dim // 2]``     float32, ``float32(RopeSpec.inv_freq)``
                        (longrope:                (longrope: short then long,
                        ``[rotary_dim]``)         :meth:`inv_freq_of`)
    4    seq_lens       ``[T...]``                int32, only when ``dynamic`` or
                                                  ``longrope``: the length of each token's
                                                  sequence in this call (its largest
                                                  position + 1)
    ===  =============  ========================  ==========================================

    Outputs: ``q_out`` and ``k_out``, the shapes and dtype of q and k. ``num_k_heads`` may
    differ from ``num_q_heads`` (GQA/MQA). Build the input list with :meth:`inputs`.

    Fields:
        head_dim: features per head.
        rotary_dim: rotated features per head (even, ``<= head_dim``); the rest pass through.
        is_neox: half-split pairing ``(i, i + rotary_dim/2)`` if True, else interleaved
            ``(2i, 2i+1)`` (GPT-J).
        dynamic: dynamic NTK scaling (adds the ``seq_lens`` input).
        base: ``rope_theta`` (used by dynamic scaling only; inv_freq carries it otherwise).
        dynamic_factor: dynamic scaling's ``factor`` (0 when not dynamic).
        max_position_embeddings: the length beyond which dynamic scaling starts.
        attention_scaling: multiplies cos and sin (YaRN's / LongRoPE's attention factor; 1
            otherwise).
        longrope: LongRoPE scaling (``inv_freq`` is ``[rotary_dim]``: the short frequencies
            then the long ones; adds the ``seq_lens`` input).
        original_max_position_embeddings: longrope: a token whose ``seq_lens`` exceeds it
            takes the long frequencies.
    """

    plugin_name: ClassVar[str] = "trtcore_rope"
    plugin_version: ClassVar[str] = "1"
    num_outputs: ClassVar[int] = 2

    head_dim: int
    rotary_dim: int
    is_neox: bool = True
    dynamic: bool = False
    base: float = 10000.0
    dynamic_factor: float = 0.0
    max_position_embeddings: int = 0
    attention_scaling: float = 1.0
    longrope: bool = False
    original_max_position_embeddings: int = 0

    # added after version 1's first fields: a plugin without longrope serializes the fields
    # it had before, and an engine serialized before them still loads
    _OPTIONAL_FIELDS: ClassVar[dict[str, Any]] = {"longrope": False, "original_max_position_embeddings": 0}

    def __post_init__(self) -> None:
        # the values a serialized plugin holds (FLOAT32 / INT32 / INT8 fields)
        self.head_dim = int(self.head_dim)
        self.rotary_dim = int(self.rotary_dim)
        self.is_neox = bool(self.is_neox)
        self.dynamic = bool(self.dynamic)
        self.base = _f32(self.base)
        self.dynamic_factor = _f32(self.dynamic_factor)
        self.max_position_embeddings = int(self.max_position_embeddings)
        self.attention_scaling = _f32(self.attention_scaling)
        self.longrope = bool(self.longrope)
        self.original_max_position_embeddings = int(self.original_max_position_embeddings)
        super().__post_init__()

    def validate(self) -> None:
        if self.head_dim < 2:
            raise PluginError(f"RopePlugin.head_dim is {self.head_dim}, expected >= 2")
        if self.rotary_dim < 2 or self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise PluginError(f"RopePlugin.rotary_dim is {self.rotary_dim}, expected an even number in [2, head_dim={self.head_dim}]")
        if not self.is_neox and (self.head_dim - self.rotary_dim) % 2:
            raise PluginError(
                f"RopePlugin: interleaved (gptj) pairing needs head_dim - rotary_dim even, got head_dim={self.head_dim}, rotary_dim={self.rotary_dim}"
            )
        if not math.isfinite(self.attention_scaling):
            raise PluginError(f"RopePlugin.attention_scaling is {self.attention_scaling}, expected a finite number")
        if self.dynamic:
            if not (self.base > 0 and math.isfinite(self.base)):
                raise PluginError(f"RopePlugin.base is {self.base}, expected a positive number (dynamic scaling)")
            if not (self.dynamic_factor > 0 and math.isfinite(self.dynamic_factor)):
                raise PluginError(f"RopePlugin.dynamic_factor is {self.dynamic_factor}, expected a positive number (dynamic scaling)")
            if self.max_position_embeddings < 1:
                raise PluginError(f"RopePlugin.max_position_embeddings is {self.max_position_embeddings}, expected >= 1 (dynamic scaling)")
            if self.rotary_dim < 4:
                raise PluginError(f"RopePlugin.rotary_dim is {self.rotary_dim}, dynamic scaling needs >= 4 (exponent d / (d - 2))")
        if self.longrope:
            if self.dynamic:
                raise PluginError("RopePlugin: longrope and dynamic scaling are exclusive, got both")
            if self.original_max_position_embeddings < 1:
                raise PluginError(f"RopePlugin.original_max_position_embeddings is {self.original_max_position_embeddings}, expected >= 1 (longrope)")

    # --- construction ------------------------------------------------------------------------

    @classmethod
    def from_spec(cls, spec: Any, is_neox: bool = True) -> RopePlugin:
        """The plugin for a :class:`trtcore.rope.RopeSpec` (``rope_spec(config)``)."""
        dynamic = spec.rope_type == "dynamic"
        longrope = spec.rope_type == "longrope"
        return cls(
            head_dim=int(spec.head_dim),
            rotary_dim=int(spec.rotary_dim),
            is_neox=bool(is_neox),
            dynamic=dynamic,
            base=float(spec.base),
            dynamic_factor=float(spec.dynamic_factor) if dynamic else 0.0,
            max_position_embeddings=int(spec.max_position_embeddings),
            attention_scaling=float(spec.attention_scaling),
            longrope=longrope,
            original_max_position_embeddings=int(spec.original_max_position_embeddings) if longrope else 0,
        )

    @staticmethod
    def inv_freq_of(spec: Any) -> np.ndarray:
        """The ``inv_freq`` input for a :class:`trtcore.rope.RopeSpec`: float32 ``[rotary_dim // 2]``
        (longrope: ``[rotary_dim]``, ``spec.inv_freq`` then ``spec.long_inv_freq``)."""
        inv = np.asarray(spec.inv_freq, dtype=np.float64)
        if spec.rope_type == "longrope":
            inv = np.concatenate([inv, np.asarray(spec.long_inv_freq, dtype=np.float64)])
        return np.ascontiguousarray(inv.astype(np.float32))

    @property
    def per_sequence(self) -> bool:
        """Whether the frequencies depend on each token's sequence length (dynamic, longrope)."""
        return self.dynamic or self.longrope

    @property
    def num_inv_freq(self) -> int:
        """Values of the ``inv_freq`` input: ``rotary_dim // 2`` (longrope: ``rotary_dim``)."""
        return self.rotary_dim if self.longrope else self.rotary_dim // 2

    @property
    def num_inputs(self) -> int:
        return 5 if self.per_sequence else 4

    def input_names(self) -> list[str]:
        """``["q", "k", "position_ids", "inv_freq"]`` (+ ``"seq_lens"`` when dynamic or longrope)."""
        return ["q", "k", "position_ids", "inv_freq", *(["seq_lens"] if self.per_sequence else [])]

    def inputs(self, q: Any, k: Any, position_ids: Any, inv_freq: Any, seq_lens: Any = None) -> list[Any]:
        """The plugin's input list in order (arrays or network tensors): ``[q, k,
        position_ids, inv_freq]`` plus ``seq_lens`` when ``dynamic`` or ``longrope``.

        ``seq_lens`` must be given exactly when the plugin is dynamic or longrope: for a batch
        of sequences it is, per token, ``max(position_ids of its sequence) + 1``.

        Raises:
            PluginError: ``seq_lens`` given to a plugin with fixed frequencies or missing for
                a dynamic / longrope one.
        """
        if self.per_sequence and seq_lens is None:
            raise PluginError("RopePlugin(dynamic or longrope) needs seq_lens (each token's sequence length)")
        if not self.per_sequence and seq_lens is not None:
            raise PluginError("RopePlugin without dynamic or longrope scaling takes no seq_lens")
        return [q, k, position_ids, inv_freq, *([seq_lens] if self.per_sequence else [])]

    def input_specs(
        self,
        num_tokens: int,
        num_q_heads: int,
        num_k_heads: int,
        dtype: Any,
        *,
        inv_freq: np.ndarray | None = None,
        max_position: int = 8192,
    ) -> list[tuple[Any, ...]]:
        """Random-input specs for :func:`trtcore.testing.check_plugin` / ``benchmark_plugin``:
        standard normal q and k, positions in ``[0, max_position)``, ``inv_freq`` (default:
        plain RoPE with ``base``; longrope: those divided by short factors in [1, 1.5] then by
        long factors in [1, 8]), and for dynamic / longrope plugins sequence lengths in ``[1, 2 *
        threshold]`` (both sides of the scaling threshold)."""
        if inv_freq is None:
            d = self.rotary_dim
            inv_freq = 1.0 / self.base ** (np.arange(0, d, 2, dtype=np.float64) / d)
            if self.longrope:
                factors = np.random.default_rng([d, self.original_max_position_embeddings])
                inv_freq = np.concatenate([inv_freq / factors.uniform(1.0, 1.5, d // 2), inv_freq / factors.uniform(1.0, 8.0, d // 2)])
            inv_freq = inv_freq.astype(np.float32)
        specs: list[tuple[Any, ...]] = [
            ((num_tokens, num_q_heads, self.head_dim), dtype),
            ((num_tokens, num_k_heads, self.head_dim), dtype),
            ((num_tokens,), np.int32, (0, max_position)),
            ((self.num_inv_freq,), np.float32, np.asarray(inv_freq, dtype=np.float32)),
        ]
        if self.per_sequence:
            threshold = self.original_max_position_embeddings if self.longrope else self.max_position_embeddings
            specs.append(((num_tokens,), np.int32, (1, 2 * threshold + 1)))
        return specs

    # --- shapes and types --------------------------------------------------------------------

    def _check_count(self, n: int) -> None:
        if n != self.num_inputs:
            raise PluginError(f"RopePlugin takes {self.num_inputs} inputs ({', '.join(self.input_names())}), got {n}")

    def output_dtypes(self, input_dtypes: Sequence[np.dtype]) -> list[np.dtype]:
        self._check_count(len(input_dtypes))
        dq, dk = np.dtype(input_dtypes[0]), np.dtype(input_dtypes[1])
        if dq not in DTYPE_CODES:
            raise PluginError(f"RopePlugin: q must be float32, float16 or bfloat16, got {dq}")
        if dk != dq:
            raise PluginError(f"RopePlugin: k must have the dtype of q ({dq}), got {dk}")
        return [dq, dq]

    def output_shapes(self, input_shapes: Sequence[Sequence[Dim]]) -> list[list[Dim]]:
        self._check_count(len(input_shapes))
        q, k = list(input_shapes[0]), list(input_shapes[1])
        for name, s in (("q", q), ("k", k)):
            if len(s) < 2:
                raise PluginError(f"RopePlugin: {name} must be [tokens..., heads, head_dim], got rank {len(s)}")
            last = getattr(s[-1], "value", s[-1])
            if isinstance(last, int) and last >= 0 and last != self.head_dim:
                raise PluginError(f"RopePlugin: {name}'s last dimension is {last}, expected head_dim={self.head_dim}")
        if len(q) != len(k):
            raise PluginError(f"RopePlugin: q and k must have the same rank, got {len(q)} and {len(k)}")
        return [q, k]

    def supports(self, pos: int, dtypes: Sequence[np.dtype], num_inputs: int) -> bool:
        if num_inputs != self.num_inputs:
            return False
        d = np.dtype(dtypes[pos])
        if pos == 0:
            return d in DTYPE_CODES
        if pos == 1 or pos >= num_inputs:  # k and both outputs: q's dtype
            return d == np.dtype(dtypes[0])
        if pos == 3:
            return d == _FLOAT32
        return d == _INT32  # position_ids, seq_lens

    # --- numerics (the contract) ----------------------------------------------------------------

    def frequencies(self, inv_freq: np.ndarray, seq_lens: np.ndarray | None = None, dtype: Any = np.float32) -> np.ndarray:
        """Per-token frequencies ``[T..., rotary_dim // 2]`` in ``dtype`` (float32, or float64
        for float64 mode).

        Neither dynamic nor longrope: ``inv_freq`` for every token. Longrope: ``inv_freq[half:]``
        (the long frequencies) for a token whose ``seq_len > original_max_position_embeddings``,
        else ``inv_freq[:half]`` (:func:`trtcore.rope.longrope_uses_long`). Dynamic (transformers'
        ``_compute_dynamic_ntk_parameters`` with ``dynamic_rope_update``): a token whose
        ``seq_len <= max_position_embeddings`` uses ``inv_freq`` (transformers' original
        frequencies); a longer one uses ``1 / base' ** (2i / d)`` with ``base' = base *
        (factor * seq_len / max_position_embeddings - (factor - 1)) ** (d / (d - 2))``,
        ``d = rotary_dim``, evaluated in float64 and rounded once to float32 (float64 mode:
        not rounded). transformers evaluates it in float32 arithmetic, i.e. within a few
        float32 ulps of these values; float64 makes the kernel (CUDA ``pow``) and NumPy agree
        bit for bit, except when the float64 value lies within a few float64 ulps of a
        float32 rounding boundary (probability ~1e-8 per value; then one float32 ulp apart,
        which at large positions moves the angle by ``position * 6e-8 * freq``). Unlike transformers, which keeps the largest length seen so far in the
        module's state, this is a pure function of each token's own sequence length.
        """
        dtype = np.dtype(dtype)
        inv = np.asarray(inv_freq).astype(dtype)
        half = self.rotary_dim // 2
        if inv.shape != (self.num_inv_freq,):
            raise PluginError(f"RopePlugin: inv_freq must have shape ({self.num_inv_freq},), got {inv.shape}")
        if not self.per_sequence:
            return inv
        if seq_lens is None:
            raise PluginError("RopePlugin(dynamic or longrope) needs seq_lens")
        if self.longrope:
            from trtcore.rope import longrope_uses_long

            return np.where(longrope_uses_long(seq_lens, self.original_max_position_embeddings)[..., None], inv[half:], inv[:half])
        s = np.asarray(seq_lens).astype(np.float64)
        d, f, L = self.rotary_dim, self.dynamic_factor, float(self.max_position_embeddings)
        expo = np.arange(0, d, 2, dtype=np.float64) / d
        with np.errstate(all="ignore"):  # only tokens with s > L are used (NaN below 1 - 1/f)
            base = self.base * (f * s / L - (f - 1.0)) ** (d / (d - 2))
            dyn = 1.0 / (base[..., None] ** expo)
        scaled = (np.asarray(seq_lens) > self.max_position_embeddings)[..., None]
        return np.where(scaled, dyn.astype(dtype), inv)

    def cos_sin(
        self, position_ids: np.ndarray, inv_freq: np.ndarray, seq_lens: np.ndarray | None = None, dtype: Any = np.float32
    ) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin ``[T..., rotary_dim // 2]`` (scaled by ``attention_scaling``) as the
        contract says; ``dtype`` float64 evaluates everything in float64 instead."""
        dtype = np.dtype(dtype)
        freq = self.frequencies(inv_freq, seq_lens, dtype)
        pos = np.asarray(position_ids).astype(dtype)[..., None]
        angle = pos * freq  # float32: one rounded product, as transformers
        scale = dtype.type(self.attention_scaling)
        a64 = angle.astype(np.float64)
        cos = np.cos(a64).astype(dtype) * scale
        sin = np.sin(a64).astype(dtype) * scale
        return cos, sin

    def rotate(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate ``x`` ``[T..., heads, head_dim]`` with cos/sin ``[T..., rotary_dim // 2]``
        in the dtype of cos (float32 or float64); the result is in that dtype (not rounded
        to x's dtype)."""
        dt = cos.dtype
        xf = np.asarray(x).astype(dt)
        c, s = cos[..., None, :], sin[..., None, :]
        rot, half = self.rotary_dim, self.rotary_dim // 2
        out = xf.copy()
        if self.is_neox:
            x1, x2 = xf[..., :half], xf[..., half:rot]
            out[..., :half] = x1 * c - x2 * s
            out[..., half:rot] = x2 * c + x1 * s
        else:
            x1, x2 = xf[..., 0:rot:2], xf[..., 1:rot:2]
            out[..., 0:rot:2] = x1 * c - x2 * s
            out[..., 1:rot:2] = x2 * c + x1 * s
        return out

    def reference(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """NumPy RoPE following the contract in the module docstring.

        Inputs as :meth:`inputs` lists them. float32/float16/bfloat16 q and k compute in
        float32 and round once to their dtype; **float64 mode**: float64 q and k (and any
        float inv_freq) compute everything in float64 and return float64 -- for comparing
        the formula with an independent float64 evaluation.
        """
        self._check_count(len(inputs))
        q, k, position_ids, inv_freq = (np.asarray(a) for a in inputs[:4])
        seq_lens = np.asarray(inputs[4]) if self.per_sequence else None
        if q.dtype != k.dtype:
            raise PluginError(f"RopePlugin: q is {q.dtype} but k is {k.dtype}")
        compute = _FLOAT64 if q.dtype == _FLOAT64 else _FLOAT32
        if compute == _FLOAT32 and q.dtype not in DTYPE_CODES:
            raise PluginError(f"RopePlugin: q must be float32, float16, bfloat16 (or float64 for float64 mode), got {q.dtype}")
        lead = q.shape[:-2]
        if q.shape[-1] != self.head_dim or k.shape[-1] != self.head_dim:
            raise PluginError(f"RopePlugin: q {q.shape} and k {k.shape} must end in head_dim={self.head_dim}")
        if k.shape[:-2] != lead or position_ids.shape != lead or (seq_lens is not None and seq_lens.shape != lead):
            raise PluginError(
                f"RopePlugin: q {q.shape}, k {k.shape}, position_ids {position_ids.shape}"
                + (f", seq_lens {seq_lens.shape}" if seq_lens is not None else "")
                + " must share the leading token dimensions"
            )
        cos, sin = self.cos_sin(position_ids, inv_freq, seq_lens, compute)
        return [self.rotate(q, cos, sin).astype(q.dtype), self.rotate(k, cos, sin).astype(k.dtype)]

    # --- kernel ----------------------------------------------------------------------------------

    def vector_width(self, dtype: Any, pointers: Sequence[int] = ()) -> int:
        """Elements per vector access (the kernel's ``VEC``): the largest power of two with
        ``VEC * itemsize <= 16`` bytes that divides the pass-through features and the
        rotated half (neox) or the rotated features (gptj, at least 2), and to whose byte
        size every pointer is aligned.

        Raises:
            PluginError: a gptj plugin gets a pointer not aligned to two elements.
        """
        size = np.dtype(dtype).itemsize
        rot_unit = self.rotary_dim // 2 if self.is_neox else self.rotary_dim
        v = 16 // size
        while v > 1:
            if (self.head_dim - self.rotary_dim) % v == 0 and rot_unit % v == 0 and all(int(p) % (v * size) == 0 for p in pointers):
                return v
            v //= 2
        if not self.is_neox:
            raise PluginError(f"RopePlugin: interleaved pairing needs q/k pointers aligned to {2 * size} bytes")
        return 1

    def defines(self, dtype: Any, vec: int) -> dict[str, int]:
        """The kernel's compile-time defines for I/O ``dtype`` and vector width ``vec``."""
        return {
            "DTYPE": DTYPE_CODES[np.dtype(dtype)],
            "HEAD_DIM": self.head_dim,
            "ROTARY_DIM": self.rotary_dim,
            "NEOX": int(self.is_neox),
            "DYNAMIC": int(self.dynamic),
            "VEC": vec,
            **({"LONGROPE": 1} if self.longrope else {}),  # absent when 0: the variants' keys stay as they were
        }

    def kernel(self, dtype: Any, vec: int | None = None) -> Any:
        """The loaded ``trtcore_rope`` kernel (a :class:`trtcore.kernels.KernelFunction`) for
        ``dtype`` on the current device, compiled once per process (and cached on disk)."""
        if vec is None:
            vec = self.vector_width(dtype)
        return _load_kernel(tuple(sorted(self.defines(dtype, vec).items())))

    def block_size(self, num_q_heads: int, num_k_heads: int, vec: int) -> int:
        """Threads per block: enough for every thread to have ``UNROLL`` units of work, a
        multiple of 32, at most 256."""
        half = self.rotary_dim // 2
        rot_units = half // vec if self.is_neox else self.rotary_dim // vec
        units = (num_q_heads + num_k_heads) * (rot_units + (self.head_dim - self.rotary_dim) // vec)
        threads = -(-units // _UNROLL)
        return int(min(_MAX_BLOCK, max(32, -(-threads // 32) * 32)))

    def enqueue(self, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor], workspace: int, stream: int) -> None:
        """Launch ``trtcore_rope``: one block per token, on ``stream``; no allocation, no sync."""
        self._check_count(len(inputs))
        q, k, pos, inv = inputs[:4]
        seq = inputs[4] if self.per_sequence else None
        q_out, k_out = outputs
        dtype = np.dtype(q.dtype)
        if dtype not in DTYPE_CODES or np.dtype(k.dtype) != dtype:
            raise PluginError(f"RopePlugin.enqueue: q/k dtype {q.dtype}/{k.dtype} not supported")
        num_tokens = int(np.prod(q.shape[:-2], dtype=np.int64))
        if num_tokens == 0:
            return
        if num_tokens >= 2**31:
            raise PluginError(f"RopePlugin: {num_tokens} tokens exceed the kernel's grid limit 2^31 - 1")
        nq, nk = int(q.shape[-2]), int(k.shape[-2])
        vec = self.vector_width(dtype, [q.ptr, k.ptr, q_out.ptr, k_out.ptr])
        defines = tuple(sorted(self.defines(dtype, vec).items()))
        args = [
            (q.ptr, "ptr"),
            (k.ptr, "ptr"),
            (pos.ptr, "ptr"),
            (inv.ptr, "ptr"),
            (seq.ptr if seq is not None else 0, "ptr"),
            (q_out.ptr, "ptr"),
            (k_out.ptr, "ptr"),
            (nq, "i32"),
            (nk, "i32"),
            (self.attention_scaling, "f32"),
            (self.base, "f32"),
            (self.dynamic_factor, "f32"),
            (self.max_position_embeddings, "i32"),
            (self.original_max_position_embeddings, "i32"),
        ]
        grid, block = (num_tokens,), (self.block_size(nq, nk, vec),)
        fn = _load_kernel(defines)
        try:
            fn.launch(grid, block, args, stream=stream, programmatic=True)  # the kernel starts with PDL_WAIT
        except Exception as exc:  # the kernel was loaded in another context: load it here
            if getattr(exc, "result", None) != "CUDA_ERROR_INVALID_CONTEXT":
                raise
            _load_kernel(defines, reload=True).launch(grid, block, args, stream=stream, programmatic=True)


_lock = threading.Lock()
_functions: dict[tuple[tuple[str, int], ...], Any] = {}


@functools.cache
def _compiled(defines: tuple[tuple[str, int], ...]) -> Any:
    from trtcore import kernels

    return kernels.compile_kernel("rope", defines=dict(defines))


def _load_kernel(defines: tuple[tuple[str, int], ...], reload: bool = False) -> Any:
    """Compile (once per process, disk-cached) and load (cached by :mod:`trtcore.kernels`)
    the kernel for ``defines``; the loaded function is kept here so that a launch costs no
    extra driver calls (``reload`` after the current device or context changed)."""
    fn = None if reload else _functions.get(defines)
    if fn is None:
        with _lock:
            fn = _compiled(defines).function("trtcore_rope")
            _functions[defines] = fn
    return fn
