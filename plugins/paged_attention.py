"""Paged attention over a mixed batch of prefills and decodes: the ``trtcore_paged_attention`` plugin.

One plugin call per layer computes causal attention for every new token of a step -- causal
prefills, chunked prefills (a prefill that continues a sequence already in the cache) and
decodes, mixed in one batch of packed (unpadded) tokens -- against a paged KV cache
(vLLM's PagedAttention, FlashInfer's page layout; DESIGN.md, "KV cache modes"), and writes
the step's keys and values into that cache.

Inputs (in this order):

===  ===================  ==============================================  =====================
#    name                 shape                                           dtype
===  ===================  ==============================================  =====================
0    q                    ``[T, Hq, head_dim]``                           float32/float16/bf16
1    k                    ``[T, num_kv_heads, head_dim]``                 q's dtype
2    v                    ``[T, num_kv_heads, head_dim]``                 q's dtype
3    kv_pool              ``[num_layers, num_blocks, 2, num_kv_heads,     q's dtype
                          block_size, head_dim]``
4    block_tables         ``[B, max_blocks_per_seq]``                     int32
5    seq_lens             ``[B]``                                         int32
6    query_start_loc      ``[B + 1]``                                     int32
===  ===================  ==============================================  =====================

* q, k, v are the step's new tokens with RoPE applied, packed: sequence ``b``'s new tokens
  are rows ``query_start_loc[b]:query_start_loc[b+1]`` (``cu_seqlens``; ``query_start_loc[0]
  == 0``, ``query_start_loc[B] == T``, every sequence has at least one new token).
* ``seq_lens[b]`` counts sequence ``b``'s tokens *including* this step's, so it has
  ``cached = seq_lens[b] - qlen`` tokens in the cache already (``qlen`` its new tokens), and
  new token ``j`` has position ``cached + j``.
* ``kv_pool`` is the one pool of every layer (:mod:`trtcore.runtime.kv_cache`); index 0 of
  its third axis holds keys, 1 values. Token ``pos`` of sequence ``b`` lives in block
  ``block_tables[b][pos // block_size]`` at row ``pos % block_size``, i.e. slot
  ``block * block_size + pos % block_size``. Inside a block the layout is **HND** (heads,
  then tokens, then features; FlashInfer's ``HND`` page layout): the ``block_size`` rows
  of one KV head are one contiguous run of ``block_size * head_dim`` elements, so a kernel
  that handles one KV head reads a whole block with fully coalesced 16-byte loads, and the
  K and V halves of a block sit next to each other. (``NHD`` would interleave the heads
  and cut every head's run into ``head_dim``-element pieces.)
* Block-table entries past a sequence's last block are never read; entries ``< 0``
  (padding, ``PAD_SLOT_ID``-style) are never written and read as zeros.

Output: ``out [T, Hq * head_dim]`` in q's dtype.

**FP8 KV cache** (field ``kv_fp8``; vLLM's ``kv_cache_dtype="fp8_e4m3"``, the "Quantized KV
Cache" page of vLLM's documentation): q/k/v and the output stay float16/bfloat16, the pool holds
E4M3 codes (``ml_dtypes.float8_e4m3fn``, TensorRT ``DataType.FP8``: TensorRT's plugin I/O takes
FP8 but not UINT8; ``enqueue`` also accepts a device tensor described as ``uint8`` bytes), one byte
per element, with one float32 scale per layer for the keys
(``k_scale``) and one for the values (``v_scale``) -- plugin fields, constants of the engine:

* written: ``code = e4m3(clip(float32(x) / scale, -448, 448))`` -- float32 division, round to
  nearest even, **saturating** to +-448 (a plain ml_dtypes ``float8_e4m3fn`` cast turns a
  magnitude above 464 into NaN; trtcore saturates, as TensorRT's FP8 quantization and
  :func:`trtcore.fp8.quantize`); ``x`` is the key after fused RoPE when there is one;
* read: ``float32(code) * scale`` -- never rounded to q's dtype. This is FlashInfer's contract for
  its ``k_scale`` / ``v_scale`` (the scales fold into the softmax scale and the output): the
  tensor-core kernels multiply the codes themselves, as float16 (every E4M3 value is one, and
  E4M3 -> float16 is one instruction per pair on sm_89+), apply ``k_scale`` to the scores and
  ``v_scale`` to the output, and round the probabilities to float16 for ``P V``. A bfloat16 q
  is scaled per row by a power of two (its largest element then in ``[2^14, 2^15)``, no
  overflow) and rounded to float16 once, exactly down to ``2^-29`` of that element. The
  CUDA-core kernel (head_dim not 64 / 128) forms the float32 products.

Every key and value attention uses is a value *read*, the step's own new tokens included (the
decode kernel, which takes its token from k/v rather than from the pool, rounds it through the
same code), so a token attends to the same numbers in its prefill, its decode and any later step.

**Packed QKV** (field ``packed_qkv``): inputs 0-2 are replaced by one input ``qkv [T, (Hq + 2 *
num_kv_heads) * head_dim]``, each token's q heads, then its k heads, then its v heads -- the
output of the horizontally fused ``q_proj | k_proj | v_proj`` product (TensorRT-LLM's GPT
attention plugin takes the same packed input). The kernels read q/k/v rows with the token
stride ``(Hq + 2 * num_kv_heads) * head_dim``: no copy into separate q/k/v tensors.

**Fused RoPE** (field ``rotary_dim > 0``; FlashInfer's ``pos_encoding_mode="ROPE_LLAMA"``):
q and k arrive *unrotated* and two inputs are appended at the end, ``position_ids [T]`` int32
and ``inv_freq [rotary_dim // 2]`` float32 (as :class:`trtcore.plugins.rope.RopePlugin`
takes them). The plugin rotates q and the new k with RopePlugin's exact numerical contract
(fields ``rotary_dim``, ``is_neox``, ``attention_scaling`` as RopePlugin's; dynamic NTK scaling
is not fused: use the RoPE plugin for it), LongRoPE included (field
``original_max_position_embeddings > 0``: ``inv_freq`` holds ``rotary_dim`` values, the short
then the long frequencies, and the tokens of sequence ``b`` take the long ones when
``seq_lens[b]`` exceeds ``original_max_position_embeddings``: the RoPE plugin's rule with each
token's sequence length ``seq_lens[b]``), each rotated value rounded once to the dtype before
use, so the pool holds bit for bit what the RoPE plugin followed by this plugin without fused
RoPE writes, and the output equals theirs within the kernels' tolerance.
:meth:`PagedAttentionPlugin.reference` calls RopePlugin's reference for it.

**Side effect**: the step's k and v are written into ``kv_pool[layer_idx]`` at the slots of
the new tokens, *in place* -- the pool is an input whose memory the plugin updates, exactly
as TensorRT-LLM's GPT attention plugin writes its KV cache pool (given as an input pointer)
during ``enqueue``. No other slot of the pool changes. The write happens before the
attention kernels read the pool (same stream), so every new token sees the new keys of its
own sequence up to itself. On the reference backend, :meth:`PagedAttentionPlugin.reference`
writes into the NumPy pool array it is given, the same array every step.

Semantics: query head ``hq`` uses KV head ``hq // (Hq // num_kv_heads)`` (GQA/MQA); a query
at position ``p`` attends to keys at positions ``k <= p`` of its own sequence (cached and
new), and with ``sliding_window = W > 0`` only to those with ``p - k < W`` (transformers'
rule); scores ``scale * q.k`` (with ``softcap = c > 0`` soft-capped to ``c * tanh(scale * q.k / c)``
before the mask, Gemma 2's attention logit soft-capping), softmax and the weighted sum of
values are computed in float32 with float32 accumulation, and the output is rounded once to the dtype. The
tensor-core kernels (float16/bfloat16, head_dim 64 or 128) round the softmax
probabilities to the input dtype before the P.V product, as FlashAttention does: a relative
error of at most one unit roundoff of the dtype per probability (see the tests' tolerance).

Kernels (``kernels/paged_attention.cu``, compiled by NVRTC through :mod:`trtcore.kernels`,
specialised by dtype, head_dim and block_size):

1. ``paged_kv_write``: the step's k/v rows into their pool slots -- only for sequences with
   several new tokens (a batch of decodes does not launch it; float32 writes every token);
2. ``paged_attn_decode`` (+ ``paged_attn_reduce``): flash-decoding for sequences with one
   new token -- each (sequence, KV head) is split along its keys into :meth:`num_splits`
   slices handled by separate CTAs (so a few long sequences still fill the GPU); one CTA
   handles all query heads of its KV head (the GQA group as rows of a tensor-core tile), so
   every K/V byte is read once; the token's own key/value come straight from the k/v
   inputs and split 0 writes them into the pool; the reduction kernel merges the slices'
   partial (max, sum, output) from the workspace in one online pass;
3. ``paged_attn_prefill``: sequences with several new tokens, one CTA per 64-row query tile
   (rows = (token, query head of the group) pairs) and KV head, causal and window masking
   per row, on tensor cores (``mma.sync`` m16n8k16, float32 accumulation);
4. ``paged_attn_simple``: float32, and head dims other than 64/128: one CTA per (token,
   query head) on CUDA cores.

Decode bandwidth on an H200 (``bench/bench_paged_attention.py``, results in
``bench/results/paged-attention-h200.json``): K/V bytes read per step time reaches 0.93-1.04
of the device copy bandwidth at batch 64 (4k-32k context), 0.89-0.97 at batch 8 and 16k-32k,
0.72 at batch 8 / 4k, 0.5-0.65 at batch 1 / 16k-32k (a ~10 us fixed cost per step: two
launches and their dependent loads); block size 16/32/64 changes it by < 10%.

``enqueue`` launches these on TensorRT's stream without synchronising the host and without
allocating: the split partials live in the workspace (:meth:`workspace_size`).
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

from trtcore.checkpoint import KV_SCALE_MIN
from trtcore.dtypes import KERNEL_DTYPE_CODES
from trtcore.fp8 import E4M3 as _E4M3
from trtcore.fp8 import quantize as _fp8_quantize

from .base import DeviceTensor, Dim, Plugin, PluginError
from .rope import RopePlugin

__all__ = ["DTYPE_CODES", "INPUT_NAMES", "TUNING", "PagedAttentionPlugin"]

_BF16 = np.dtype(ml_dtypes.bfloat16)
_INT32 = np.dtype(np.int32)
#: the kernel's DTYPE define per I/O dtype
DTYPE_CODES = KERNEL_DTYPE_CODES  # the DTYPE define of kernels/dtype.cuh
#: the plugin's inputs, in order (separate q/k/v, no fused RoPE; see ``input_names``)
INPUT_NAMES = ("q", "k", "v", "kv_pool", "block_tables", "seq_lens", "query_start_loc")
_CACHE_NAMES = INPUT_NAMES[3:]
_ROPE_NAMES = ("position_ids", "inv_freq")
_FLOAT32 = np.dtype(np.float32)
_UINT8 = np.dtype(np.uint8)
#: model dtypes the FP8 KV cache takes (the tensor-core kernels' types)
_FP8_KV_MODEL_DTYPES = (np.dtype(np.float16), _BF16)

#: head dims the tensor-core kernels are built for (others use the simple kernel)
_TC_HEAD_DIMS = (64, 128)
#: keys per K/V tile of the tensor-core kernels (``PA_NT``) and rows of a prefill tile
_TILE_KEYS = 64
_PREFILL_ROWS = 64
_THREADS = 128

#: Work-split knobs of the decode kernel (host side, from shapes only; they change nothing
#: but the float32 rounding of the split merge):
#: ``slots``: decode CTAs resident at once (H100/H200: 132 SMs x 3 CTAs of 64 KiB shared
#: memory and <= 168 registers per thread); the number of splits is the smallest that fills
#: the waves of CTAs within ``wave_efficiency`` of the best (as FlashAttention-2's
#: ``num_splits_heuristic``): a decode CTA streams its keys at the bandwidth share of its slot,
#: so a half-empty last wave costs almost a full one;
#: ``min_keys_per_split``: a slice covers at least this many keys (its fixed cost: Q load,
#: first tile latency, merge);
#: ``max_splits``: at most this many slices per sequence;
#: ``max_partial_rows``: split partials of at most this many (sequence, query head) rows
#: (bounds the workspace: rows * (head_dim + 2) * 4 bytes);
#: ``split_cost_keys``: with at least ``slots`` CTAs unsplit, a slice's fixed cost in keys: the
#: split count minimizes ``waves * (keys per slice + split_cost_keys)`` (fitted to the H200 at
#: batch 256, context 256: 1 split 96 us against 2 splits 120 us; at context 4096 it keeps 3,
#: bench/results/h200-2026-12-03-session10/call5);
#: ``sms``, ``few_cta_splits``: with fewer decode CTAs than ``sms`` (the SMs: 132 on H100/H200), up
#: to ``few_cta_splits`` slices of one key tile (``_TILE_KEYS``) each, as many as keep one CTA per
#: SM, where the rules above give fewer: their slices of ``min_keys_per_split`` keys leave most SMs
#: idle at short contexts. Measured on an H100, block 16, bfloat16 KV (bench_paged_attention.py
#: --sweep-at, bench/results/h100-2026-12-06-session31/call1), us at 1 / 2 / 4 / 8 / 16 splits:
#: context 256 batch 1: 10.38 / 8.62 / **6.92** / 7.26 / 9.06 (the rules above: 2); batch 2:
#: 10.47 / 8.71 / **7.01** / 8.39 / 9.91; batch 4: 10.82 / 9.00 / **8.49** / 10.15 / 11.42;
#: context 1024 batch 1: 30.45 / 18.69 / 11.72 / **8.83** / 9.33 (the rules above: 8, kept: more
#: slices than 4 cost more in the merge than they gain). Batch 8 at context 256 keeps 2 (session
#: 30: 9.51 us against 11.22 for 4). End to end (call 2): a 4-bit Llama-3-8B batch-1 step 2.199
#: against 2.244 ms without it;
#: ``stages``: K/V shared-memory ring depth (the kernel's ``PA_STAGES``);
#: ``splits``: > 0 forces that many splits (benchmark sweeps only).
TUNING: dict[str, Any] = {
    "slots": 396,
    "wave_efficiency": 0.95,
    "min_keys_per_split": 128,
    "max_splits": 64,
    "max_partial_rows": 1 << 17,
    "split_cost_keys": 128,
    "sms": 132,
    "few_cta_splits": 4,
    "stages": 2,
    "splits": 0,
}


def _f32(x: float) -> float:
    return float(np.float32(x))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _dimval(d: Any) -> int | None:
    v = getattr(d, "value", d)
    return v if isinstance(v, int) and v >= 0 else None


@dataclass
class PagedAttentionPlugin(Plugin):
    """Paged attention of one layer (plugin ``trtcore_paged_attention``, version 1).

    See the module docstring for inputs, output, the in-place pool write and the numerics.

    Fields:
        layer_idx: which layer of ``kv_pool`` (its first axis) this plugin reads and writes.
        num_kv_heads: KV heads (``Hkv``); the number of query heads ``Hq`` comes from q's
            shape and must be a multiple of it.
        head_dim: features per head; the CUDA kernels need a multiple of 32 (the NumPy
            reference takes any).
        block_size: tokens per KV block.
        sliding_window: ``W > 0``: a query at position ``p`` sees keys ``k`` with
            ``p - k < W``; 0: no window.
        scale: the score scale; 0 (the default) means ``head_dim ** -0.5``. Stored as float32
            (the serialized field type), so a rebuilt plugin equals the original.
        packed_qkv: input 0 is ``qkv [T, (Hq + 2 * num_kv_heads) * head_dim]`` instead of
            q, k and v (module docstring).
        rotary_dim: fused RoPE on this many features of each q and k head (even, <=
            head_dim; adds the inputs ``position_ids`` and ``inv_freq``); 0: q and k arrive
            rotated.
        is_neox: fused RoPE pairing, as :class:`~trtcore.plugins.rope.RopePlugin`'s.
        attention_scaling: fused RoPE's cos/sin factor, as RopePlugin's (float32).
        original_max_position_embeddings: > 0: the fused RoPE is LongRoPE, with this threshold
            (RopePlugin's ``longrope`` / ``original_max_position_embeddings``); 0: not.
        softcap: attention logit soft-capping ``c > 0``: each score becomes
            ``c * tanh(scale * q.k / c)`` before the mask and the softmax (Gemma 2/3's
            ``attn_logit_softcapping``; transformers' ``eager_attention_forward``); 0: none.
            Stored as float32.
        kv_fp8: the pool holds E4M3 codes (module docstring, "FP8 KV cache"); q must be
            float16 or bfloat16.
        k_scale / v_scale: the layer's float32 scales of the FP8 keys / values (finite, at least
            :data:`trtcore.checkpoint.KV_SCALE_MIN`; vLLM's ``k_scale`` / ``v_scale``, default 1.0); unused without
            ``kv_fp8``.
    """

    plugin_name: ClassVar[str] = "trtcore_paged_attention"
    plugin_version: ClassVar[str] = "1"
    num_outputs: ClassVar[int] = 1

    layer_idx: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    sliding_window: int = 0
    scale: float = 0.0
    packed_qkv: bool = False
    rotary_dim: int = 0
    is_neox: bool = True
    attention_scaling: float = 1.0
    original_max_position_embeddings: int = 0
    softcap: float = 0.0
    kv_fp8: bool = False
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self) -> None:
        self.layer_idx = int(self.layer_idx)
        self.num_kv_heads = int(self.num_kv_heads)
        self.head_dim = int(self.head_dim)
        self.block_size = int(self.block_size)
        self.sliding_window = int(self.sliding_window)
        scale = float(self.scale)
        if scale == 0.0 and self.head_dim > 0:
            scale = self.head_dim**-0.5
        self.scale = _f32(scale)
        self.packed_qkv = bool(self.packed_qkv)
        self.rotary_dim = int(self.rotary_dim)
        self.is_neox = bool(self.is_neox)
        self.attention_scaling = _f32(self.attention_scaling)
        self.original_max_position_embeddings = int(self.original_max_position_embeddings)
        self.softcap = _f32(self.softcap)
        self.kv_fp8 = bool(self.kv_fp8)
        self.k_scale = _f32(self.k_scale)
        self.v_scale = _f32(self.v_scale)
        super().__post_init__()

    def validate(self) -> None:
        if self.layer_idx < 0:
            raise PluginError(f"PagedAttentionPlugin.layer_idx is {self.layer_idx}, expected >= 0")
        if self.num_kv_heads < 1:
            raise PluginError(f"PagedAttentionPlugin.num_kv_heads is {self.num_kv_heads}, expected >= 1")
        if not 1 <= self.head_dim <= 1024:
            raise PluginError(f"PagedAttentionPlugin.head_dim is {self.head_dim}, expected 1..1024")
        if not 1 <= self.block_size <= 4096:
            raise PluginError(f"PagedAttentionPlugin.block_size is {self.block_size}, expected 1..4096")
        if self.sliding_window < 0:
            raise PluginError(f"PagedAttentionPlugin.sliding_window is {self.sliding_window}, expected >= 0 (0 = no window)")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise PluginError(f"PagedAttentionPlugin.scale is {self.scale}, expected a positive finite number")
        if not (math.isfinite(self.softcap) and self.softcap >= 0):
            raise PluginError(f"PagedAttentionPlugin.softcap is {self.softcap}, expected 0 (no soft-capping) or a positive finite number")
        if self.rotary_dim < 0:
            raise PluginError(f"PagedAttentionPlugin.rotary_dim is {self.rotary_dim}, expected 0 (no fused RoPE) or an even number in [2, head_dim]")
        if self.original_max_position_embeddings < 0 or (self.original_max_position_embeddings and not self.rotary_dim):
            raise PluginError(
                f"PagedAttentionPlugin.original_max_position_embeddings is {self.original_max_position_embeddings}, "
                "expected 0 or, with fused RoPE (rotary_dim > 0), the LongRoPE threshold >= 1"
            )
        if self.rotary_dim:
            self.rope()  # RopePlugin's checks of rotary_dim, pairing and attention_scaling
        for name in ("k_scale", "v_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= KV_SCALE_MIN):
                raise PluginError(
                    f"PagedAttentionPlugin.{name} is {value}, expected a finite float32 >= {KV_SCALE_MIN} "
                    "(a normal number: x / scale of a subnormal scale overflows)"
                )

    # the fields packed qkv, fused RoPE and soft-capping added, with the values that mean "not used": a
    # plugin that uses neither serializes exactly the fields it had before them, and a field
    # collection without them (an engine built before) rebuilds that plugin
    _OPTIONAL_FIELDS: ClassVar[dict[str, Any]] = {
        "packed_qkv": False,
        "rotary_dim": 0,
        "is_neox": True,
        "attention_scaling": 1.0,
        "original_max_position_embeddings": 0,
        "softcap": 0.0,
        "kv_fp8": False,
        "k_scale": 1.0,
        "v_scale": 1.0,
    }

    def rope(self) -> RopePlugin:
        """The RoPE plugin whose rotation the fused RoPE applies (``rotary_dim > 0``).

        Raises:
            PluginError: no fused RoPE, or its fields are invalid (RopePlugin's message).
        """
        if self.rotary_dim <= 0:
            raise PluginError(f"PagedAttentionPlugin has no fused RoPE (rotary_dim is {self.rotary_dim})")
        return RopePlugin(
            head_dim=self.head_dim,
            rotary_dim=self.rotary_dim,
            is_neox=self.is_neox,
            attention_scaling=self.attention_scaling,
            longrope=self.original_max_position_embeddings > 0,
            original_max_position_embeddings=self.original_max_position_embeddings,
        )

    # --- shapes and types ---------------------------------------------------------------------

    def input_names(self) -> list[str]:
        """``["q", "k", "v", "kv_pool", "block_tables", "seq_lens", "query_start_loc"]``; with
        ``packed_qkv`` ``"qkv"`` replaces q, k, v; fused RoPE appends ``"position_ids",
        "inv_freq"``."""
        qkv = ["qkv"] if self.packed_qkv else list(INPUT_NAMES[:3])
        return [*qkv, *_CACHE_NAMES, *(_ROPE_NAMES if self.rotary_dim else ())]

    def _canonical(self, items: Sequence[Any]) -> list[Any]:
        """``items`` (one per input: dtypes, shapes or arrays) in the unpacked order ``q, k,
        v, kv_pool, block_tables, seq_lens, query_start_loc[, position_ids, inv_freq]``;
        packed: the qkv item stands for each of q, k and v."""
        self._check_count(len(items))
        items = list(items)
        return [items[0]] * 3 + items[1:] if self.packed_qkv else items

    def num_q_heads(self, qkv_features: int) -> int:
        """Hq of a packed ``qkv`` input with ``qkv_features`` features per token.

        Raises:
            PluginError: ``qkv_features`` is not ``(Hq + 2 * num_kv_heads) * head_dim`` for a
                positive multiple Hq of num_kv_heads.
        """
        hkv, d = self.num_kv_heads, self.head_dim
        hq = qkv_features // d - 2 * hkv if qkv_features % d == 0 else -1
        if hq < hkv or hq % hkv:
            raise PluginError(
                f"PagedAttentionPlugin: qkv has {qkv_features} features per token, expected (Hq + 2 * {hkv}) * {d} with Hq a positive multiple of {hkv}"
            )
        return hq

    def pool_dtype(self, dtype: Any) -> np.dtype:
        """The pool's element type for q/k/v of ``dtype``: E4M3 (``ml_dtypes.float8_e4m3fn``)
        with ``kv_fp8``, else ``dtype`` itself."""
        return _E4M3 if self.kv_fp8 else np.dtype(dtype)

    def pool_shape(self, num_layers: int, num_blocks: int) -> tuple[int, ...]:
        """``(num_layers, num_blocks, 2, num_kv_heads, block_size, head_dim)``."""
        return (int(num_layers), int(num_blocks), 2, self.num_kv_heads, self.block_size, self.head_dim)

    def _check_count(self, n: int) -> None:
        names = self.input_names()
        if n != len(names):
            raise PluginError(f"PagedAttentionPlugin takes {len(names)} inputs ({', '.join(names)}), got {n}")

    def output_dtypes(self, input_dtypes: Sequence[np.dtype]) -> list[np.dtype]:
        input_dtypes = self._canonical(input_dtypes)
        dq = np.dtype(input_dtypes[0])
        if dq not in DTYPE_CODES:
            raise PluginError(f"PagedAttentionPlugin: q must be float32, float16 or bfloat16, got {dq}")
        for i in (1, 2):
            if np.dtype(input_dtypes[i]) != dq:
                raise PluginError(f"PagedAttentionPlugin: {INPUT_NAMES[i]} must have q's dtype {dq}, got {np.dtype(input_dtypes[i])}")
        if self.kv_fp8 and dq not in _FP8_KV_MODEL_DTYPES:
            raise PluginError(f"PagedAttentionPlugin: the FP8 KV cache (kv_fp8) needs q in float16 or bfloat16, got {dq}")
        want = self.pool_dtype(dq)
        if np.dtype(input_dtypes[3]) != want:
            what = "kv_fp8: E4M3 codes" if self.kv_fp8 else "q's dtype"
            raise PluginError(f"PagedAttentionPlugin: kv_pool must be {want} ({what}), got {np.dtype(input_dtypes[3])}")
        for i, name in ((4, "block_tables"), (5, "seq_lens"), (6, "query_start_loc"), (7, "position_ids")):
            if i < len(input_dtypes) and np.dtype(input_dtypes[i]) != _INT32:
                raise PluginError(f"PagedAttentionPlugin: {name} must be int32, got {np.dtype(input_dtypes[i])}")
        if self.rotary_dim and np.dtype(input_dtypes[8]) != _FLOAT32:
            raise PluginError(f"PagedAttentionPlugin: inv_freq must be float32, got {np.dtype(input_dtypes[8])}")
        return [dq]

    def output_shapes(self, input_shapes: Sequence[Sequence[Dim]]) -> list[list[Dim]]:
        names = self.input_names()
        self._check_count(len(input_shapes))
        ranks = {
            "qkv": 2,
            "q": 3,
            "k": 3,
            "v": 3,
            "kv_pool": 6,
            "block_tables": 2,
            "seq_lens": 1,
            "query_start_loc": 1,
            "position_ids": 1,
            "inv_freq": 1,
        }
        for name, shape in zip(names, input_shapes):
            if len(shape) != ranks[name]:
                raise PluginError(f"PagedAttentionPlugin: {name} must have rank {ranks[name]}, got {len(shape)}")
        if self.rotary_dim:
            n, want = _dimval(input_shapes[-1][0]), self.rope().num_inv_freq
            if n is not None and n != want:
                raise PluginError(f"PagedAttentionPlugin: inv_freq has {n} values, expected {want} (rotary_dim // 2, longrope: rotary_dim)")
        if self.packed_qkv:
            qkv, pool = list(input_shapes[0]), list(input_shapes[1])
            self._check_pool(pool)
            t, n = qkv[0], _dimval(qkv[1])
            if n is not None:
                return [[t, self.num_q_heads(n) * self.head_dim]]
            return [[t, qkv[1] - 2 * self.num_kv_heads * self.head_dim]]
        q, k, v, pool = (list(s) for s in input_shapes[:4])
        for name, s in (("q", q), ("k", k), ("v", v), ("kv_pool", pool)):
            d = _dimval(s[-1])
            if d is not None and d != self.head_dim:
                raise PluginError(f"PagedAttentionPlugin: {name}'s last dimension is {d}, expected head_dim={self.head_dim}")
        for name, s in (("k", k), ("v", v)):
            d = _dimval(s[1])
            if d is not None and d != self.num_kv_heads:
                raise PluginError(f"PagedAttentionPlugin: {name} has {d} heads, expected num_kv_heads={self.num_kv_heads}")
        self._check_pool(pool)
        hq = _dimval(q[1])
        if hq is not None and hq % self.num_kv_heads:
            raise PluginError(f"PagedAttentionPlugin: {hq} query heads is not a multiple of num_kv_heads={self.num_kv_heads}")
        t = q[0]
        return [[t, q[1] * self.head_dim]]

    def _check_pool(self, pool: Sequence[Dim]) -> None:
        for axis, want in ((2, 2), (3, self.num_kv_heads), (4, self.block_size), (5, self.head_dim)):
            d = _dimval(pool[axis])
            if d is not None and d != want:
                raise PluginError(
                    f"PagedAttentionPlugin: kv_pool must be [num_layers, num_blocks, 2, {self.num_kv_heads}, {self.block_size}, {self.head_dim}], "
                    f"axis {axis} is {d}"
                )

    def supports(self, pos: int, dtypes: Sequence[np.dtype], num_inputs: int) -> bool:
        names = self.input_names()
        if num_inputs != len(names):
            return False
        d = np.dtype(dtypes[pos])
        if pos == 0:
            return d in DTYPE_CODES
        if names[pos : pos + 1] == ["kv_pool"] and pos < num_inputs:
            return d == self.pool_dtype(dtypes[0])
        if pos >= num_inputs or names[pos] in ("k", "v"):
            return d == np.dtype(dtypes[0])
        if names[pos] == "inv_freq":
            return d == _FLOAT32
        return d == _INT32

    # --- work split and workspace ------------------------------------------------------------

    def uses_tensor_cores(self, dtype: Any) -> bool:
        """Whether ``dtype`` runs on the tensor-core kernels (float16/bfloat16 and head_dim 64/128)."""
        return DTYPE_CODES.get(np.dtype(dtype), 0) != 0 and self.head_dim in _TC_HEAD_DIMS

    def num_splits(self, batch: int, num_q_heads: int, max_blocks_per_seq: int, dtype: Any = _BF16) -> int:
        """Slices along the keys of each decode sequence (flash-decoding), from shapes alone
        (see :data:`TUNING`): with fewer than ``slots`` CTAs unsplit, the fewest whose CTAs fill
        their waves within ``wave_efficiency`` of the best choice; with more, the fewest of the
        least ``waves * (keys per slice + split_cost_keys)``; with at least ``min_keys_per_split`` keys of
        the longest possible sequence per slice, at most ``max_splits``, and what
        ``max_partial_rows`` allows; with fewer CTAs than ``sms``, at least as many slices of one
        key tile as keep a CTA per SM, up to ``few_cta_splits``; 1 means no split (no workspace,
        no reduction kernel)."""
        if not self.uses_tensor_cores(dtype) or batch < 1:
            return 1
        max_keys = max(1, int(max_blocks_per_seq) * self.block_size)
        if self.sliding_window:
            max_keys = min(max_keys, self.sliding_window)
        group = max(1, int(num_q_heads) // self.num_kv_heads)
        ctas = batch * self.num_kv_heads * _cdiv(group, 16)
        rows_cap = max(1, int(TUNING["max_partial_rows"]) // (batch * int(num_q_heads)))  # the workspace's partials
        limit = min(int(TUNING["max_splits"]), max(1, max_keys // int(TUNING["min_keys_per_split"])), rows_cap)
        if TUNING["splits"]:
            return max(1, min(int(TUNING["splits"]), limit))
        slots = int(TUNING["slots"])
        if ctas >= slots:
            # a full wave without splitting: splits only even out the last wave, and each slice
            # costs split_cost_keys more; the fewest of the least waves * (keys + cost)
            def cost(s: int) -> float:
                return math.ceil(ctas * s / slots) * (max_keys / s + float(TUNING["split_cost_keys"]))

            least = min(cost(s) for s in range(1, limit + 1))
            return next(s for s in range(1, limit + 1) if cost(s) == least)

        def efficiency(s: int) -> float:
            waves = ctas * s / slots
            return waves / math.ceil(waves)

        best = max(efficiency(s) for s in range(1, limit + 1))
        chosen = next(s for s in range(1, limit + 1) if efficiency(s) >= float(TUNING["wave_efficiency"]) * best)
        # few CTAs: up to few_cta_splits slices of one key tile, as many as keep one CTA per SM
        fine = min(int(TUNING["few_cta_splits"]), max(1, max_keys // _TILE_KEYS), int(TUNING["sms"]) // ctas, rows_cap)
        return max(chosen, fine)

    def workspace_size(self, inputs: Sequence[tuple[tuple[int, ...], np.dtype]], outputs: Sequence[tuple[tuple[int, ...], np.dtype]]) -> int:
        """Bytes of split partials for the largest shapes (any smaller batch fits too):
        ``splits * B * Hq * (head_dim + 2)`` float32."""
        inputs = self._canonical(inputs)
        (q_shape, dtype), (bt_shape, _), (sl_shape, _) = inputs[0], inputs[4], inputs[5]
        hq = self.num_q_heads(int(q_shape[1])) if self.packed_qkv else int(q_shape[1])
        max_blocks, b_max = int(bt_shape[1]), int(sl_shape[0])
        rows = 0
        for b in range(1, b_max + 1):
            s = self.num_splits(b, hq, max_blocks, dtype)
            if s > 1:
                rows = max(rows, s * b * hq)
        return rows * (self.head_dim + 2) * 4

    # --- numerics (the contract) ----------------------------------------------------------------

    def reference(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """NumPy paged attention: writes the step's k/v into ``kv_pool`` (in place; it must be
        a writable ``numpy.ndarray``) and returns ``[out]``, computed in float32 and rounded
        once to q's dtype. A packed ``qkv`` is split into q, k, v; fused RoPE rotates q and k
        with :meth:`RopePlugin.reference <trtcore.plugins.rope.RopePlugin.reference>` (rounded
        to their dtype) before the attention, exactly as the two plugins in a row compute it.
        With ``kv_fp8`` the pool is E4M3 (``ml_dtypes.float8_e4m3fn``): the step's k/v are
        written as :meth:`quantize_kv` codes and every key/value, the step's own included, is
        read back as :meth:`dequantize_kv` (float32, module docstring, "FP8 KV cache").

        Raises:
            PluginError: inconsistent shapes, dtypes, ``query_start_loc``/``seq_lens`` or a
                block id out of range.
        """
        self._check_count(len(inputs))
        pool = inputs[1 if self.packed_qkv else 3]
        if not isinstance(pool, np.ndarray):
            raise PluginError("PagedAttentionPlugin.reference: kv_pool must be a numpy.ndarray (it is written in place)")
        arrays = [a if a is pool else np.asarray(a) for a in inputs]
        self.output_dtypes([a.dtype for a in arrays])
        self.output_shapes([a.shape for a in arrays])
        if self.packed_qkv:
            qkv = arrays[0]
            hq, hkv, dh = self.num_q_heads(qkv.shape[1]), self.num_kv_heads, self.head_dim
            heads = qkv.reshape(qkv.shape[0], hq + 2 * hkv, dh)
            arrays[:1] = [heads[:, :hq], heads[:, hq : hq + hkv], heads[:, hq + hkv :]]
        q, k, v = arrays[:3]
        bt, seq_lens, qsl = arrays[4:7]
        T, hq, D = q.shape
        hkv, bs = self.num_kv_heads, self.block_size
        g = hq // hkv
        B = seq_lens.shape[0]
        if k.shape != (T, hkv, D) or v.shape != (T, hkv, D):
            raise PluginError(f"PagedAttentionPlugin: k {k.shape} and v {v.shape} must be [{T}, {hkv}, {D}]")
        if qsl.shape != (B + 1,) or bt.shape[0] != B:
            raise PluginError(f"PagedAttentionPlugin: query_start_loc {qsl.shape} must be [B + 1] and block_tables {bt.shape} [B, ...] with B = {B}")
        if not 0 <= self.layer_idx < pool.shape[0]:
            raise PluginError(f"PagedAttentionPlugin: layer_idx {self.layer_idx} out of range for a pool of {pool.shape[0]} layers")
        qlens = np.diff(qsl.astype(np.int64))
        if qsl[0] != 0 or qsl[-1] != T or (qlens < 1).any():
            raise PluginError(f"PagedAttentionPlugin: query_start_loc must rise strictly from 0 to T={T}, got {qsl.tolist()}")
        cached_all = seq_lens.astype(np.int64) - qlens
        if (cached_all < 0).any():
            raise PluginError(f"PagedAttentionPlugin: seq_lens {seq_lens.tolist()} smaller than the sequences' new tokens {qlens.tolist()}")
        if self.rotary_dim:
            rope = self.rope()
            # longrope: each token takes its sequence's length (seq_lens[b], after this step)
            token_seq_lens = [np.repeat(seq_lens, qlens)] if rope.longrope else []
            q, k = rope.reference(q, k, *arrays[7:9], *token_seq_lens)
        num_blocks = pool.shape[1]
        layer = pool[self.layer_idx]  # [num_blocks, 2, Hkv, block_size, D], a view: written in place
        out = np.empty((T, hq, D), np.float32)
        scale = np.float32(self.scale)
        for b in range(B):
            q0, q1 = int(qsl[b]), int(qsl[b + 1])
            qlen, seq, cached = q1 - q0, int(seq_lens[b]), int(cached_all[b])
            nblk = _cdiv(seq, bs)
            if nblk > bt.shape[1]:
                raise PluginError(f"PagedAttentionPlugin: sequence {b} has {seq} tokens, more than its {bt.shape[1]} blocks of {bs} hold")
            blocks = bt[b, :nblk].astype(np.int64)
            if ((blocks < 0) | (blocks >= num_blocks)).any():
                raise PluginError(f"PagedAttentionPlugin: sequence {b} has block ids outside [0, {num_blocks}): {blocks.tolist()}")
            pos = np.arange(cached, seq)
            if self.kv_fp8:
                layer[blocks[pos // bs], 0, :, pos % bs] = self.quantize_kv(k[q0:q1], self.k_scale)
                layer[blocks[pos // bs], 1, :, pos % bs] = self.quantize_kv(v[q0:q1], self.v_scale)
            else:
                layer[blocks[pos // bs], 0, :, pos % bs] = k[q0:q1]
                layer[blocks[pos // bs], 1, :, pos % bs] = v[q0:q1]
            kpos = np.arange(seq)
            keys = layer[blocks[kpos // bs], 0, :, kpos % bs]  # [seq, Hkv, D]
            vals = layer[blocks[kpos // bs], 1, :, kpos % bs]
            if self.kv_fp8:
                keys, vals = self.dequantize_kv(keys, self.k_scale), self.dequantize_kv(vals, self.v_scale)
            keys, vals = keys.astype(np.float32), vals.astype(np.float32)
            qb = q[q0:q1].astype(np.float32).reshape(qlen, hkv, g, D).transpose(1, 2, 0, 3)  # [Hkv, G, qlen, D]
            scores = np.matmul(qb, keys.transpose(1, 2, 0)[:, None]) * scale  # [Hkv, G, qlen, seq]
            if self.softcap:
                cap = np.float32(self.softcap)
                scores = np.tanh(scores / cap) * cap
            allowed = kpos[None, :] <= pos[:, None]
            if self.sliding_window:
                allowed &= (pos[:, None] - kpos[None, :]) < self.sliding_window
            scores = np.where(allowed, scores, np.float32(-np.inf))
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            o = np.matmul(p, vals.transpose(1, 0, 2)[:, None])  # [Hkv, G, qlen, D]
            out[q0:q1] = o.transpose(2, 0, 1, 3).reshape(qlen, hq, D)
        return [out.reshape(T, hq * D).astype(q.dtype)]

    @staticmethod
    def quantize_kv(x: np.ndarray, scale: float) -> np.ndarray:
        """The FP8 KV cache's stored codes of keys or values ``x`` (any shape, float16/bfloat16/
        float32): ``e4m3(clip(float32(x) / float32(scale), -448, 448))``, round to nearest even,
        saturating (:func:`trtcore.fp8.quantize`); vLLM's ``fp8_e4m3`` KV cache stores ``x / scale``.

        Returns:
            ``ml_dtypes.float8_e4m3fn`` array of ``x``'s shape.
        """
        return _fp8_quantize(x, np.float32(scale)).view(_E4M3)

    @staticmethod
    def dequantize_kv(codes: np.ndarray, scale: float) -> np.ndarray:
        """What attention reads from E4M3 ``codes`` (``ml_dtypes.float8_e4m3fn`` or their
        ``uint8`` bytes): ``float32(code) * float32(scale)``, not rounded to the model's dtype
        (FlashInfer's ``k_scale`` / ``v_scale``; module docstring, "FP8 KV cache").

        Returns:
            float32 array of ``codes``' shape.
        """
        c = np.asarray(codes)
        c = c.view(_E4M3) if c.dtype == _UINT8 else c
        return c.astype(np.float32) * np.float32(scale)

    # --- kernels ---------------------------------------------------------------------------------

    def defines(self, dtype: Any) -> dict[str, int]:
        """The kernel's compile-time defines for I/O ``dtype``."""
        d = {"DTYPE": DTYPE_CODES[np.dtype(dtype)], "HEAD_DIM": self.head_dim, "BLOCK_SIZE": self.block_size}
        if self.rotary_dim:
            d.update(ROTARY_DIM=self.rotary_dim, NEOX=int(self.is_neox))
        if self.original_max_position_embeddings:
            d["LONGROPE"] = 1
        if self.softcap:
            d["SOFTCAP"] = 1
        if self.kv_fp8:
            d["KV_FP8"] = 1
        if TUNING["stages"] != 2:
            d["PA_STAGES"] = int(TUNING["stages"])
        return d

    def shared_mem_bytes(self, dtype: Any) -> int:
        """Dynamic shared memory of the tensor-core kernels: the K/V ring."""
        return int(TUNING["stages"]) * 2 * _TILE_KEYS * self.head_dim * np.dtype(dtype).itemsize

    def enqueue(self, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor], workspace: int, stream: int) -> None:
        """Write the step's k/v into the pool, then launch the attention kernels on ``stream``
        (no host synchronisation, no allocation)."""
        if self.head_dim % 32:
            raise PluginError(f"PagedAttentionPlugin: the CUDA kernels need head_dim a multiple of 32, got {self.head_dim}")
        q, k, v, pool, bt, sl, qsl, *rope_inputs = self._canonical(inputs)
        (out,) = outputs
        dtype = np.dtype(q.dtype)
        if self.packed_qkv:  # q, k, v: views of the packed rows, one token stride
            hq_packed = self.num_q_heads(int(q.shape[1]))
            D, T = self.head_dim, int(q.shape[0])
            item = dtype.itemsize
            q = DeviceTensor(q.ptr, (T, hq_packed, D), dtype)
            k = DeviceTensor(q.ptr + hq_packed * D * item, (T, self.num_kv_heads, D), dtype)
            v = DeviceTensor(k.ptr + self.num_kv_heads * D * item, (T, self.num_kv_heads, D), dtype)
            q_stride = kv_stride = (hq_packed + 2 * self.num_kv_heads) * D
        else:
            q_stride, kv_stride = int(np.prod(q.shape[1:])), int(np.prod(k.shape[1:]))
        rope_args = [(rope_inputs[0].ptr, "ptr"), (rope_inputs[1].ptr, "ptr")] if self.rotary_dim else [(0, "ptr"), (0, "ptr")]
        rope_args += [(self.attention_scaling, "f32"), (self.original_max_position_embeddings, "i32")]
        rope_args += [(self.k_scale, "f32"), (self.v_scale, "f32")]  # the kernels' last parameters (read with KV_FP8)
        # soft-capping (SOFTCAP): score = cap * tanh(q.k * scale_arg), scale_arg = scale / softcap
        # (the log2-domain kernels take cap * log2(e)); without it, score = q.k * scale_arg
        cap = self.softcap
        simple_scale, simple_cap = (self.scale / cap, cap) if cap else (self.scale, 0.0)
        tc_scale, tc_cap = (self.scale / cap, cap * math.log2(math.e)) if cap else (self.scale * math.log2(math.e), 0.0)
        pool_ok = np.dtype(pool.dtype) in ((_E4M3, _UINT8) if self.kv_fp8 else (dtype,))
        if (
            dtype not in DTYPE_CODES
            or any(np.dtype(x.dtype) != dtype for x in (k, v, out))
            or not pool_ok
            or (self.kv_fp8 and dtype not in _FP8_KV_MODEL_DTYPES)
        ):
            raise PluginError(f"PagedAttentionPlugin.enqueue: q/k/v/kv_pool/out dtypes {[str(x.dtype) for x in (q, k, v, pool, out)]} not supported")
        if any(np.dtype(x.dtype) != _INT32 for x in (bt, sl, qsl)):
            raise PluginError("PagedAttentionPlugin.enqueue: block_tables, seq_lens and query_start_loc must be int32")
        T, hq, D = (int(x) for x in q.shape)
        hkv = self.num_kv_heads
        B = int(sl.shape[0])
        L, nb = int(pool.shape[0]), int(pool.shape[1])
        max_blocks = int(bt.shape[1])
        if tuple(pool.shape[2:]) != (2, hkv, self.block_size, self.head_dim) or D != self.head_dim:
            raise PluginError(f"PagedAttentionPlugin.enqueue: kv_pool {tuple(pool.shape)} / q {tuple(q.shape)} do not match the fields")
        if hq % hkv or tuple(k.shape) != (T, hkv, D) or tuple(v.shape) != (T, hkv, D) or tuple(qsl.shape) != (B + 1,):
            raise PluginError(
                f"PagedAttentionPlugin.enqueue: shapes q {q.shape}, k {k.shape}, v {v.shape}, query_start_loc {qsl.shape} are inconsistent"
            )
        if not 0 <= self.layer_idx < L:
            raise PluginError(f"PagedAttentionPlugin.enqueue: layer_idx {self.layer_idx} out of range for {L} layers")
        if T == 0 or B == 0:
            return
        g = hq // hkv
        fns = _functions(tuple(sorted(self.defines(dtype).items())))
        common = [(bt.ptr, "ptr"), (sl.ptr, "ptr"), (qsl.ptr, "ptr")]
        sizes = [(B, "i32"), (max_blocks, "i32"), (nb, "i32"), (self.layer_idx, "i32"), (hkv, "i32")]

        tensor_cores = self.uses_tensor_cores(dtype)
        if T > B or not tensor_cores:  # the decode kernel writes its own tokens
            chunks = 2 * hkv * D * dtype.itemsize // 16
            write_threads = min(256, _cdiv(chunks, 32) * 32)
            fns.launch(
                "paged_kv_write", (T,), (write_threads,),
                [(k.ptr, "ptr"), (v.ptr, "ptr"), (pool.ptr, "ptr"), *common, *sizes, (int(tensor_cores), "i32"), (kv_stride, "i32"), *rope_args],
                0, stream,
            )  # fmt: skip

        if not tensor_cores:
            fns.launch(
                "paged_attn_simple", (T, hq), (_THREADS,),
                [(q.ptr, "ptr"), (pool.ptr, "ptr"), *common, (out.ptr, "ptr"), *sizes, (g, "i32"), (self.sliding_window, "i32"), (simple_scale, "f32"),
                 (simple_cap, "f32"), (q_stride, "i32"), *rope_args],
                0, stream,
            )  # fmt: skip
            return

        smem = self.shared_mem_bytes(dtype)
        splits = self.num_splits(B, hq, max_blocks, dtype)
        ws_o = workspace if splits > 1 else 0
        ws_ml = workspace + splits * B * hq * D * 4 if splits > 1 else 0
        if splits > 1 and not workspace:
            raise PluginError("PagedAttentionPlugin.enqueue: no workspace given (see workspace_size)")
        fns.launch(
            "paged_attn_decode", (splits, hkv * _cdiv(g, 16), B), (_THREADS,),
            [(q.ptr, "ptr"), (k.ptr, "ptr"), (v.ptr, "ptr"), (pool.ptr, "ptr"), *common, (out.ptr, "ptr"), (ws_o, "ptr"),
             (ws_ml, "ptr"), *sizes, (g, "i32"), (splits, "i32"), (self.sliding_window, "i32"), (tc_scale, "f32"), (tc_cap, "f32"),
             (q_stride, "i32"), (kv_stride, "i32"), *rope_args],
            smem, stream,
        )  # fmt: skip
        if splits > 1:
            fns.launch(
                "paged_attn_reduce", (B, hq), (D,),
                [(ws_o, "ptr"), (ws_ml, "ptr"), (qsl.ptr, "ptr"), (out.ptr, "ptr"), (B, "i32"), (hq, "i32"), (splits, "i32")],
                0, stream,
            )  # fmt: skip
        if T > B:  # some sequence has several new tokens
            tiles = _cdiv(T * g, _PREFILL_ROWS) + min(B, T // 2)
            fns.launch(
                "paged_attn_prefill", (tiles, hkv), (_THREADS,),
                [(q.ptr, "ptr"), (pool.ptr, "ptr"), *common, (out.ptr, "ptr"), *sizes, (g, "i32"), (self.sliding_window, "i32"), (tc_scale, "f32"),
                 (tc_cap, "f32"), (q_stride, "i32"), *rope_args],
                smem, stream,
            )  # fmt: skip


class _Functions:
    """The loaded kernels of one define-set (reloaded if the CUDA context changes)."""

    def __init__(self, defines: tuple[tuple[str, int], ...]):
        self.defines = defines
        self._fns: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, symbol: str, reload: bool = False) -> Any:
        fn = None if reload else self._fns.get(symbol)
        if fn is None:
            with self._lock:
                fn = _compiled(self.defines).function(symbol)
                self._fns[symbol] = fn
        return fn

    def launch(self, symbol: str, grid: tuple[int, ...], block: tuple[int, ...], args: list[Any], smem: int, stream: int) -> None:
        try:
            self.get(symbol).launch(grid, block, args, shared_mem=smem, stream=stream, programmatic=True)  # kernels start with PDL_WAIT
        except Exception as exc:  # loaded in another context: load it into the current one
            if getattr(exc, "result", None) != "CUDA_ERROR_INVALID_CONTEXT":
                raise
            self.get(symbol, reload=True).launch(grid, block, args, shared_mem=smem, stream=stream, programmatic=True)


@functools.cache
def _compiled(defines: tuple[tuple[str, int], ...]) -> Any:
    from trtcore import kernels

    return kernels.compile_kernel("paged_attention", defines=dict(defines))


_registry_lock = threading.Lock()
_by_defines: dict[tuple[tuple[str, int], ...], _Functions] = {}


def _functions(defines: tuple[tuple[str, int], ...]) -> _Functions:
    f = _by_defines.get(defines)
    if f is None:
        with _registry_lock:
            f = _by_defines.setdefault(defines, _Functions(defines))
    return f
