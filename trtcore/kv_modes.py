"""The KV cache contract, in one place for every KV cache mode.

Per mode (``paged``; ``contiguous`` with composed-layers attention; ``contiguous`` with
TensorRT's native ``IAttention`` + ``IKVCacheUpdateLayer`` over a fixed-size cache) this
module owns: the network's cache inputs and outputs, their optimization-profile shapes,
the per-step feeds the runtime gives the engine, and the cache buffers it allocates.
Model files never name a KV mode; the runtime never reads tensor names to find one.

Look a mode up from the build plan: ``mode = kv_mode(plan, config)``. Every mode object
answers the same questions (:class:`KVMode`):

* ``mode.inputs`` / ``mode.outputs``: every network input / output as :class:`TensorSpec`
  (name, NumPy dtype, shape with -1 for dynamic dimensions), in declaration order;
* ``mode.profile_shapes()``: ``{input name: (min, opt, max)}`` of every input (one
  optimization profile; static dimensions are equal in all three);
* what the runtime must feed: ``mode.token_layout`` (``"packed"`` ``[T]`` or ``"padded"``
  ``[B, S]``), ``mode.takes_rope_seq_lens``, ``mode.mask_inputs`` (per attention kind of
  ``config.layer_types``, its mask input), ``mode.cache_inputs`` / ``mode.cache_outputs``
  (per layer), ``mode.aliases`` (outputs written in place into an input), ``mode.cache_len``
  (the fixed slots per sequence of the native cache).

The names of the inputs every mode shares are the constants below (:data:`INPUT_IDS`, ...).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import ml_dtypes
import numpy as np

from .config import ModelConfig
from .dtypes import ENGINE_DTYPES, storage_dtype
from .errors import InvalidArgumentError
from .plan import ROPE_IN_ATTENTION, BuildPlan
from .rope import PER_SEQUENCE_ROPE_TYPES

# ---------------------------------------------------------------------------------------
# network side: cache inputs / outputs and profile shapes (used by ops and the builder)
# ---------------------------------------------------------------------------------------

#: int32 token ids of this step (``[T]`` packed or ``[B, S]`` padded)
INPUT_IDS = "input_ids"
#: int32 position of each token in its sequence, the shape of :data:`INPUT_IDS`
POSITION_IDS = "position_ids"
#: int32 ``[B]``: index of each sequence's last token in the flattened tokens (its logits are returned)
LAST_TOKEN_IDS = "last_token_ids"
#: int32 ``[T]`` (paged, ``dynamic`` RoPE only): each token's sequence length in this step
ROPE_SEQ_LENS = "rope_seq_lens"
#: float32 ``[B, vocab_size]``: the logits of each sequence's last token
LOGITS = "logits"
#: mask input of each attention kind (``config.layer_types``), contiguous modes
MASK_NAMES: dict[str, str] = {"full_attention": "attention_mask", "sliding_attention": "sliding_attention_mask"}
#: paged mode's inputs (vLLM / FlashInfer terms)
KV_CACHE_POOL, BLOCK_TABLES, SEQ_LENS, QUERY_START_LOC = "kv_cache_pool", "block_tables", "seq_lens", "query_start_loc"
#: paged mode: rows of a step beyond ``max_batch_size`` the profile admits (a padding row, :class:`PagedKV`)
SPARE_ROWS = 1
#: native mode: int32 ``[B]``, the slot of each sequence's first new token
CACHE_WRITE_POSITIONS = "cache_write_positions"
#: the two halves of each layer's cache
KV_KINDS: tuple[str, str] = ("key", "value")

Shape = tuple[int, ...]
Profile = tuple[Shape, Shape, Shape]


@dataclass(frozen=True)
class TensorSpec:
    """One network input or output.

    Attributes:
        name: the tensor's name in the network and the engine.
        dtype: its NumPy dtype (bfloat16: ``ml_dtypes.bfloat16``).
        shape: its dimensions, -1 where dynamic (set per step within the profile).
    """

    name: str
    dtype: np.dtype
    shape: Shape


class KVMode:
    """The network I/O of one KV cache mode for one model and plan (base class; get one with
    :func:`kv_mode`).

    Attributes:
        name: ``"paged"``, ``"contiguous"`` or ``"native"`` (contiguous, native attention).
        kv_cache / attention: the plan's choices this mode implements.
        plan / config: what it was made from.
        dtype: the engine dtype (NumPy), that of the caches.
        token_layout: ``"packed"`` (tokens ``[T]`` of all sequences, no padding) or
            ``"padded"`` (``[B, S]``, each sequence padded to the step's longest).
        takes_rope_seq_lens: the network has the :data:`ROPE_SEQ_LENS` input.
        mask_inputs: ``{attention kind: mask input}`` for each kind in ``config.layer_types``
            (empty in paged mode, whose plugin applies causality and the window itself).
        cache_len: native mode: slots per sequence (``plan.max_seq_len``); else None.
    """

    name: ClassVar[str]
    kv_cache: ClassVar[str]
    attention: ClassVar[str]
    token_layout: ClassVar[str]

    def __init__(self, plan: BuildPlan, config: ModelConfig, num_kv_heads: int | None = None):
        self.plan = plan
        self.config = config
        #: KV heads in the cache: ``config.num_key_value_heads``, or one tensor-parallel
        #: rank's share (:func:`trtcore.parallel.local_kv_heads`), or all ranks' side by side
        self.num_kv_heads = int(config.num_key_value_heads if num_kv_heads is None else num_kv_heads)
        self.dtype = ENGINE_DTYPES[plan.dtype]
        #: the KV cache's element type: the engine dtype (the paged mode's FP8 KV cache: E4M3)
        self.pool_dtype: np.dtype = self.dtype
        self.takes_rope_seq_lens = False
        self.cache_len: int | None = None

    # names --------------------------------------------------------------------------------
    def cache_input(self, layer: int, kind: str) -> str:
        """Name of layer ``layer``'s ``kind`` (``"key"``/``"value"``) cache input.

        Raises:
            InvalidArgumentError: the mode has no per-layer cache inputs (paged: one pool).
        """
        raise InvalidArgumentError(f"the {self.name} KV cache mode has no per-layer cache inputs")

    @staticmethod
    def cache_output(layer: int, kind: str) -> str:
        """Name of layer ``layer``'s updated ``kind`` cache output (contiguous modes)."""
        return f"present.{layer}.{kind}"

    @property
    def mask_inputs(self) -> dict[str, TensorSpec]:
        """``{attention kind: mask input}`` (see the class docstring)."""
        return {kind: spec for spec in self.inputs for kind, name in MASK_NAMES.items() if spec.name == name}

    @property
    def cache_inputs(self) -> list[TensorSpec]:
        """The per-layer cache inputs, layer by layer, key then value (empty in paged mode)."""
        if self.kv_cache == "paged":
            return []
        return [TensorSpec(self.cache_input(i, kind), self.dtype, self._cache_shape()) for i in self._layers() for kind in KV_KINDS]

    @property
    def cache_outputs(self) -> list[TensorSpec]:
        """The per-layer updated cache outputs, in the order of :attr:`cache_inputs`."""
        if self.kv_cache == "paged":
            return []
        return [TensorSpec(self.cache_output(i, kind), self.dtype, self._cache_shape()) for i in self._layers() for kind in KV_KINDS]

    @property
    def aliases(self) -> dict[str, str]:
        """``{output: input}`` for outputs the engine writes in place into an input (bind both
        to one buffer; ``ICudaEngine.get_aliased_input_tensor``)."""
        return {}

    # I/O ------------------------------------------------------------------------------------
    @property
    def inputs(self) -> list[TensorSpec]:
        """Every network input, in declaration order."""
        raise NotImplementedError

    @property
    def outputs(self) -> list[TensorSpec]:
        """Every network output: :data:`LOGITS` then the cache outputs, in order."""
        return [TensorSpec(LOGITS, np.dtype(np.float32), (-1, self.config.vocab_size)), *self.cache_outputs]

    def profile_shapes(self) -> dict[str, Profile]:
        """``(min, opt, max)`` of every input (one optimization profile; a static dimension
        has the same size in all three)."""
        raise NotImplementedError

    # helpers -------------------------------------------------------------------------------
    def _layers(self) -> range:
        return range(self.config.num_hidden_layers)

    def _cache_shape(self) -> Shape:
        c = self.config
        return (-1, self.num_kv_heads, -1 if self.cache_len is None else self.cache_len, c.head_dim)

    def _padded_inputs(self, mask_dtype: Any, mask_shape: Shape) -> list[TensorSpec]:
        """Token ids, positions, the masks of the model's attention kinds, last token ids."""
        i32 = np.dtype(np.int32)
        specs = [TensorSpec(INPUT_IDS, i32, (-1, -1)), TensorSpec(POSITION_IDS, i32, (-1, -1))]
        specs += [TensorSpec(MASK_NAMES[kind], np.dtype(mask_dtype), mask_shape) for kind in MASK_NAMES if kind in self.config.layer_types]
        specs.append(TensorSpec(LAST_TOKEN_IDS, i32, (-1,)))
        return specs

    def _padded_profile(self, mask: tuple[Shape, Shape, Shape]) -> dict[str, Profile]:
        """The padded-batch inputs both contiguous modes share: token ids, positions, last
        token ids, and ``mask`` (min, opt, max) for each attention kind the model has."""
        p = self.plan
        B, L, b, s = p.max_batch_size, p.max_seq_len, p.opt_batch_size, p.opt_seq_len
        shapes: dict[str, Profile] = {
            INPUT_IDS: ((1, 1), (b, s), (B, L)),
            POSITION_IDS: ((1, 1), (b, s), (B, L)),
            LAST_TOKEN_IDS: ((1,), (b,), (B,)),
        }
        for kind, name in MASK_NAMES.items():
            if kind in self.config.layer_types:
                shapes[name] = mask
        return shapes

    def _cache_profile(self, lo: Shape, opt: Shape, hi: Shape) -> dict[str, Profile]:
        return {self.cache_input(i, kind): (lo, opt, hi) for i in self._layers() for kind in KV_KINDS}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config.architecture}, {self.plan.dtype}, max_seq_len={self.plan.max_seq_len})"


class PagedKV(KVMode):
    """``kv_cache="paged"`` (DESIGN.md, "KV cache modes"): ``T`` packed tokens of ``B``
    sequences, no padding.

    Inputs:

    * ``input_ids``, ``position_ids`` int32 ``[T]``;
    * ``kv_cache_pool`` ``[num_layers, num_blocks, 2, num_key_value_heads, block_size,
      head_dim]`` of :attr:`pool_dtype`: the engine dtype, or E4M3 codes
      (``ml_dtypes.float8_e4m3fn``, TensorRT ``FP8``) with ``kv_cache_dtype="fp8_e4m3"`` (written in
      place by the attention plugins);
    * ``block_tables`` int32 ``[B, max_blocks_per_seq]``, ``seq_lens`` int32 ``[B]`` (cached +
      new tokens), ``query_start_loc`` int32 ``[B + 1]`` (offsets of each sequence's tokens);
    * ``last_token_ids`` int32 ``[B]``: packed index of each sequence's last token;
    * with ``dynamic`` or ``longrope`` RoPE scaling, ``rope_seq_lens`` int32 ``[T]``: each
      token's sequence length in this step (transformers recomputes the frequencies per
      forward call, :func:`trtcore.rope.longrope_uses_long`).

    Output: ``logits`` float32 ``[B, vocab_size]``.

    Profile: ``T`` in [1, max_num_tokens], ``B`` in [1, max_batch_size + 1], block tables up
    to ``ceil(max_seq_len / block_size)`` wide, a pool of up to ``max_num_blocks`` blocks. The
    one row beyond ``max_batch_size`` is never a sequence: it is the padding row that lets a
    prefill or mixed step of ``max_batch_size`` sequences still pad its tokens to a token
    bucket (:func:`trtcore.runtime.device_runner.padded_step_shape`), so that it replays a
    graph captured at start-up instead of running eagerly.
    """

    name = "paged"
    kv_cache = "paged"
    attention = "plugin"
    token_layout = "packed"

    def __init__(self, plan: BuildPlan, config: ModelConfig, num_kv_heads: int | None = None):
        super().__init__(plan, config, num_kv_heads)
        # the RoPE plugin reads each token's sequence length; LongRoPE fused into the attention
        # plugin reads the plugin's own seq_lens instead (ops.fuses_rope)
        rope_type = (config.rope_scaling or {}).get("rope_type")
        self.takes_rope_seq_lens = rope_type == "dynamic" or (rope_type in PER_SEQUENCE_ROPE_TYPES and plan.rope != ROPE_IN_ATTENTION)
        #: the pool's element type: the engine dtype, or E4M3 codes (the plan's FP8 KV cache)
        self.pool_dtype = np.dtype(ml_dtypes.float8_e4m3fn) if plan.kv_fp8 else self.dtype

    @property
    def pool_shape(self) -> Shape:
        """``[num_layers, -1 (blocks), 2, num_key_value_heads, block_size, head_dim]``."""
        c = self.config
        return (c.num_hidden_layers, -1, 2, self.num_kv_heads, self.plan.block_size, c.head_dim)

    @property
    def inputs(self) -> list[TensorSpec]:
        i32 = np.dtype(np.int32)
        specs = [
            TensorSpec(INPUT_IDS, i32, (-1,)),
            TensorSpec(POSITION_IDS, i32, (-1,)),
            TensorSpec(KV_CACHE_POOL, self.pool_dtype, self.pool_shape),
            TensorSpec(BLOCK_TABLES, i32, (-1, -1)),
            TensorSpec(SEQ_LENS, i32, (-1,)),
            TensorSpec(QUERY_START_LOC, i32, (-1,)),
            TensorSpec(LAST_TOKEN_IDS, i32, (-1,)),
        ]
        if self.takes_rope_seq_lens:
            specs.append(TensorSpec(ROPE_SEQ_LENS, i32, (-1,)))
        return specs

    def profile_shapes(self) -> dict[str, Profile]:
        p = self.plan
        B, T, BS = p.max_batch_size + SPARE_ROWS, p.max_num_tokens, p.block_size
        b, t = p.opt_batch_size, min(p.opt_batch_size * p.opt_seq_len, T)
        mb = -(-p.max_seq_len // BS)
        ob = min(-(-p.opt_seq_len // BS), mb)
        nb = p.max_num_blocks
        layers, _, *rest = self.pool_shape
        shapes: dict[str, Profile] = {
            INPUT_IDS: ((1,), (t,), (T,)),
            POSITION_IDS: ((1,), (t,), (T,)),
            KV_CACHE_POOL: tuple((layers, n, *rest) for n in (1, min(b * ob, nb), nb)),  # type: ignore[dict-item]
            BLOCK_TABLES: ((1, 1), (b, ob), (B, mb)),
            SEQ_LENS: ((1,), (b,), (B,)),
            QUERY_START_LOC: ((2,), (b + 1,), (B + 1,)),
            LAST_TOKEN_IDS: ((1,), (b,), (B,)),
        }
        if self.takes_rope_seq_lens:
            shapes[ROPE_SEQ_LENS] = shapes[INPUT_IDS]
        return shapes


class ContiguousKV(KVMode):
    """``kv_cache="contiguous"``, ``attention="layers"``: ``B`` batch, ``S`` new tokens per
    sequence (padded), ``P`` cached tokens, ``T = P + S``.

    Inputs:

    * ``input_ids`` int32 ``[B, S]``, ``position_ids`` int32 ``[B, S]``;
    * ``attention_mask`` float32 ``[B, 1, 1, S, T]``: 0 where query may attend, else a large
      negative number (causal and padding folded in by the runtime), when some layer is
      ``full_attention`` in ``config.layer_types``; ``sliding_attention_mask``, the same with
      the sliding window, when some layer is ``sliding_attention``;
    * ``last_token_ids`` int32 ``[B]``: flat index (``b * S + s``) of each sequence's last
      token, whose logits are returned;
    * ``past_key_values.{i}.key`` / ``.value`` ``[B, num_key_value_heads, P, head_dim]``.

    Outputs: ``logits`` float32 ``[B, vocab_size]``; ``present.{i}.key`` / ``.value``
    ``[B, num_key_value_heads, T, head_dim]`` (past then new, in the engine dtype); the
    runtime feeds them back as the next step's ``past_key_values``.

    Profile: ``S`` in [1, max_seq_len], ``P`` in [0, max_seq_len - 1], so ``T`` in
    [1, 2 * max_seq_len - 1] for the masks.
    """

    name = "contiguous"
    kv_cache = "contiguous"
    attention = "layers"
    token_layout = "padded"

    def cache_input(self, layer: int, kind: str) -> str:
        return f"past_key_values.{layer}.{kind}"

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._padded_inputs(np.float32, (-1, 1, 1, -1, -1)) + self.cache_inputs

    def profile_shapes(self) -> dict[str, Profile]:
        p = self.plan
        B, L, b, s = p.max_batch_size, p.max_seq_len, p.opt_batch_size, p.opt_seq_len
        o = min(s, L - 1)  # opt cached length
        Hkv, D = self.num_kv_heads, self.config.head_dim
        shapes = self._padded_profile(((1, 1, 1, 1, 1), (b, 1, 1, s, o + s), (B, 1, 1, L, 2 * L - 1)))
        return shapes | self._cache_profile((1, Hkv, 0, D), (b, Hkv, o, D), (B, Hkv, L - 1, D))


class NativeKV(KVMode):
    """``kv_cache="contiguous", attention="native"`` (TensorRT's ``IKVCacheUpdateLayer`` +
    ``IAttention``): a fixed-size cache of ``L = max_seq_len`` slots per sequence (static in
    the network, as ``IKVCacheUpdateLayer`` requires), ``B`` batch, ``S`` new tokens (padded).

    Inputs:

    * ``input_ids``, ``position_ids`` int32 ``[B, S]``; ``last_token_ids`` int32 ``[B]`` as in
      :class:`ContiguousKV`;
    * ``attention_mask`` bool ``[B, 1, S, L]``: True where query ``s`` may read slot ``j``
      (the slot holds a real token at a position not after the query's; padding and
      unwritten slots False), when some layer is ``full_attention``; ``sliding_attention_mask``,
      the same with the sliding window, when some layer is ``sliding_attention``. The mask
      covers the slots written in this step (the cache is updated before attending);
    * ``cache_write_positions`` int32 ``[B]``: the slot where sequence ``b``'s first new token
      is written; its ``S`` tokens go to slots ``w[b] .. w[b] + S - 1`` (``w[b] + S <= L``);
    * ``kv_cache.{i}.key`` / ``.value`` ``[B, num_key_value_heads, L, head_dim]`` (engine dtype).

    Outputs: ``logits`` as above; ``present.{i}.key`` / ``.value``, the updated caches,
    ``[B, num_key_value_heads, L, head_dim]``. They alias ``kv_cache.{i}.*`` (:attr:`aliases`):
    TensorRT writes the cache in place, and so does the reference backend.

    Profile: only the batch of the caches and masks varies, and the masks' query axis (``S``).
    """

    name = "native"
    kv_cache = "contiguous"
    attention = "native"
    token_layout = "padded"

    def __init__(self, plan: BuildPlan, config: ModelConfig, num_kv_heads: int | None = None):
        super().__init__(plan, config, num_kv_heads)
        self.cache_len = plan.max_seq_len

    def cache_input(self, layer: int, kind: str) -> str:
        return f"kv_cache.{layer}.{kind}"

    @property
    def aliases(self) -> dict[str, str]:
        return {self.cache_output(i, kind): self.cache_input(i, kind) for i in self._layers() for kind in KV_KINDS}

    @property
    def inputs(self) -> list[TensorSpec]:
        L = self.cache_len
        assert L is not None
        specs = self._padded_inputs(np.bool_, (-1, 1, -1, L))
        specs.append(TensorSpec(CACHE_WRITE_POSITIONS, np.dtype(np.int32), (-1,)))
        return specs + self.cache_inputs

    def profile_shapes(self) -> dict[str, Profile]:
        p = self.plan
        B, L, b, s = p.max_batch_size, p.max_seq_len, p.opt_batch_size, p.opt_seq_len
        Hkv, D = self.num_kv_heads, self.config.head_dim
        shapes = self._padded_profile(((1, 1, 1, L), (b, 1, s, L), (B, 1, L, L)))
        shapes[CACHE_WRITE_POSITIONS] = ((1,), (b,), (B,))
        return shapes | self._cache_profile((1, Hkv, L, D), (b, Hkv, L, D), (B, Hkv, L, D))


#: the mode classes, keyed by ``(plan.kv_cache, plan.attention)``
MODES: dict[tuple[str, str], type[KVMode]] = {(m.kv_cache, m.attention): m for m in (PagedKV, ContiguousKV, NativeKV)}


def kv_mode(plan: BuildPlan, config: ModelConfig, num_kv_heads: int | None = None) -> KVMode:
    """The KV cache mode of ``plan`` for ``config``'s model; ``num_kv_heads``: the cache's KV
    heads when not ``config.num_key_value_heads`` (a tensor-parallel rank's share).

    Raises:
        InvalidArgumentError: the plan's ``(kv_cache, attention)`` pair has no mode.
    """
    key = (plan.kv_cache, plan.attention)
    if key not in MODES:
        raise InvalidArgumentError(f"no KV cache mode for kv_cache={plan.kv_cache!r}, attention={plan.attention!r}; expected one of {sorted(MODES)}")
    return MODES[key](plan, config, num_kv_heads)


# ---------------------------------------------------------------------------------------
# runtime side: per-step feeds and cache buffers (used by trtcore.runtime)
# ---------------------------------------------------------------------------------------

#: additive mask value for disallowed (query, key) pairs; finite, so no NaN even if a row
#: were fully masked, and exp() of it underflows to exactly 0 in float32.
MASK_VALUE = np.float32(-1e30)


def allowed_slots(key_pos: np.ndarray, query_pos: np.ndarray, sliding_window: int | None) -> np.ndarray:
    """bool ``[B, S, T]``: query ``s`` may read cache slot ``t``.

    Query ``q`` sees slot ``k`` exactly when the slot is real, ``pos(k) <= pos(q)``
    (causal) and, with a sliding window ``W``, ``pos(q) - pos(k) < W`` (transformers'
    sliding-window mask).

    Args:
        key_pos: int ``[B, T]``, each cache slot's position, -1 for padding (or unwritten).
        query_pos: int ``[B, S]``, each query's position (padding queries: 0).
        sliding_window: ``W`` or None.
    """
    k = key_pos[:, None, :]
    q = query_pos[:, :, None]
    allowed = (k >= 0) & (k <= q)
    if sliding_window:
        allowed &= (q - k) < sliding_window
    return allowed


def attention_mask(key_pos: np.ndarray, query_pos: np.ndarray, sliding_window: int | None) -> np.ndarray:
    """Additive float32 mask ``[B, 1, 1, S, T]`` from slot positions (see :func:`allowed_slots`)."""
    mask = np.where(allowed_slots(key_pos, query_pos, sliding_window), np.float32(0), MASK_VALUE).astype(np.float32)
    return mask[:, None, None, :, :]


def mask_feeds(config: ModelConfig, key_pos: np.ndarray, query_pos: np.ndarray, native: bool = False) -> dict[str, np.ndarray]:
    """The mask inputs of one contiguous step: ``attention_mask`` (causal) when some layer
    is ``full_attention``, ``sliding_attention_mask`` (``config.sliding_window``) when some
    layer is ``sliding_attention`` (``config.layer_types``, as the network defines them).

    ``native=False``: additive float32 ``[B, 1, 1, S, T]`` (composed-layers attention);
    ``native=True``: bool ``[B, 1, S, T]``, True where allowed (``IAttention``'s mask over
    all ``T = max_seq_len`` cache slots)."""
    feeds = {}
    windows = {"full_attention": None, "sliding_attention": config.sliding_window}
    for kind, name in MASK_NAMES.items():
        window = windows[kind]
        if kind in config.layer_types:
            if native:
                feeds[name] = allowed_slots(key_pos, query_pos, window)[:, None, :, :]
            else:
                feeds[name] = attention_mask(key_pos, query_pos, window)
    return feeds


class StepSequence(Protocol):
    """One scheduled sequence, as the KV modes read it
    (:class:`trtcore.runtime.scheduler.ScheduledSequence`)."""

    request_id: Hashable
    token_ids: list[int]
    positions: list[int]
    num_cached_tokens: int

    @property
    def num_new_tokens(self) -> int: ...


class StepBatch(Protocol):
    """One step's work, as the KV modes read it (:class:`trtcore.runtime.scheduler.SchedulerOutput`)."""

    @property
    def seqs(self) -> Sequence[StepSequence]: ...

    def input_ids(self) -> np.ndarray: ...
    def positions(self) -> np.ndarray: ...
    def block_tables(self) -> np.ndarray: ...
    def seq_lens(self) -> np.ndarray: ...
    def query_start_loc(self) -> np.ndarray: ...
    def last_token_indices(self) -> np.ndarray: ...


class PagedKVCache:
    """The paged mode's buffers and feeds: one pool of KV blocks for every layer, written
    in place by the attention plugins; each step gets the packed tokens and block tables.

    Args:
        mode: the network's paged KV contract (:class:`PagedKV`; the plan's block size, the
            engine dtype, whether the network takes :data:`ROPE_SEQ_LENS`).
        num_blocks: blocks in the pool (sized once by the caller).
        xp: the executor's array module (``numpy`` or ``cupy``); the pool lives there for
            the whole run.

    Attributes:
        pool: ``[num_hidden_layers, num_blocks, 2, num_key_value_heads, block_size, head_dim]``.
    """

    kind = "paged"

    def __init__(self, mode: PagedKV, num_blocks: int, xp: Any = np):
        self.mode = mode
        self.config = mode.config
        self.block_size = int(mode.plan.block_size)
        self.num_blocks = int(num_blocks)
        self.dtype = mode.pool_dtype
        layers, _, *rest = mode.pool_shape
        self.pool = xp.zeros((layers, self.num_blocks, *rest), dtype=storage_dtype(self.dtype, xp))
        if xp is np:
            # touch every page once now: the block manager hands out all free blocks in
            # turn, so a lazily zeroed pool would page-fault through the first generate calls
            self.pool.fill(0)

    def feeds(self, batch: StepBatch) -> dict[str, Any]:
        """The network inputs of one step of ``batch``."""
        feeds: dict[str, Any] = {
            INPUT_IDS: batch.input_ids(),
            POSITION_IDS: batch.positions(),
            KV_CACHE_POOL: self.pool,
            BLOCK_TABLES: batch.block_tables(),
            SEQ_LENS: batch.seq_lens(),
            QUERY_START_LOC: batch.query_start_loc(),
            LAST_TOKEN_IDS: batch.last_token_indices(),
        }
        if self.mode.takes_rope_seq_lens:
            # each token's sequence length in this call: transformers' dynamic RoPE input
            feeds[ROPE_SEQ_LENS] = np.repeat(batch.seq_lens(), [s.num_new_tokens for s in batch.seqs]).astype(np.int32)
        return feeds

    def update(self, outputs: Mapping[str, Any]) -> None:
        """After a step: nothing (the plugins wrote the pool in place)."""


class ContiguousKVCache:
    """The contiguous mode's buffers and feeds: one cache row per sequence of a padded batch.

    Prompts of different lengths are right-padded; every cache slot remembers its token's
    position (``-1`` for padding) and the mask (:func:`mask_feeds`) lets each sequence
    compute what it would compute alone. Two variants:

    * ``native=False`` (composed-layers attention): ``past_key_values.{i}.*`` in,
      ``present.{i}.*`` out, the cache growing by each step's tokens; columns no live
      sequence uses are dropped, so it never grows past the longest live sequence;
    * ``native=True`` (TensorRT's ``IKVCacheUpdateLayer`` + ``IAttention``): a fixed cache of
      ``max_seq_len`` slots per sequence (``kv_cache.{i}.*``), slot ``j`` holding the token
      at position ``j``; the engine writes each step's tokens at ``cache_write_positions``
      in place, and a bool mask over all slots selects what each query reads. Prompt
      padding writes junk into slots past a prompt's end; they stay masked until that
      sequence's own tokens overwrite them.

    A batch whose sequences all start at position 0 starts a new cache; otherwise the rows
    of sequences no longer scheduled (finished) are dropped. On a device (``xp`` is CuPy)
    the cache stays there: dropping rows and columns is a device-side ``take`` with index
    arrays computed on the host (no boolean mask indexing, which would read its count back).

    Args:
        mode: the network's contiguous KV contract (:class:`ContiguousKV`, or :class:`NativeKV`
            for the fixed-size cache of ``mode.cache_len`` slots): its cache and mask inputs.
        xp: the executor's array module.
    """

    kind = "contiguous"

    def __init__(self, mode: ContiguousKV | NativeKV, xp: Any = np):
        self.mode = mode
        self.config = mode.config
        self.dtype = mode.dtype
        self.xp = xp
        self.native = mode.cache_len is not None
        self.max_seq_len = int(mode.plan.max_seq_len)
        #: (cache input, updated-cache output) of every layer, key then value
        self.names = [(i.name, o.name) for i, o in zip(mode.cache_inputs, mode.cache_outputs)]
        self.request_ids: list[Hashable] = []
        self.cache: dict[str, Any] = {}
        self.key_pos = np.zeros((0, 0), np.int64)

    def reset(self, n: int) -> None:
        """Start an empty cache of ``n`` rows."""
        c = self.config
        if self.native:
            shape = (n, self.mode.num_kv_heads, self.max_seq_len, c.head_dim)
            self.cache = {p: self.xp.zeros(shape, storage_dtype(self.dtype, self.xp)) for p, _ in self.names}
            self.key_pos = np.full((n, self.max_seq_len), -1, np.int64)
        else:
            empty = np.zeros((n, self.mode.num_kv_heads, 0, c.head_dim), self.dtype)
            self.cache = {p: empty for p, _ in self.names}
            self.key_pos = np.zeros((n, 0), np.int64)

    def keep(self, rows: list[int]) -> None:
        """Keep cache rows ``rows``; for the growing cache also drop the columns no kept row uses."""
        key_pos = self.key_pos[rows]
        used = None if self.native else (key_pos >= 0).any(axis=0)
        cols = None if used is None or used.all() else np.flatnonzero(used)
        index: tuple[Any, Any] | None = None  # device index arrays, copied once per compaction
        for k, v in self.cache.items():
            if isinstance(v, np.ndarray):
                self.cache[k] = v[rows][:, :, cols] if cols is not None else v[rows]
                continue
            if index is None:
                xp = self.xp
                index = (xp.asarray(np.asarray(rows, np.int64)), None if cols is None else xp.asarray(cols.astype(np.int64)))
            v = self.xp.take(v, index[0], axis=0)
            self.cache[k] = v if index[1] is None else self.xp.take(v, index[1], axis=2)
        self.key_pos = key_pos if cols is None else key_pos[:, cols]

    def feeds(self, batch: StepBatch) -> dict[str, Any]:
        """The network inputs of one step of ``batch`` (a new cache, or the live rows of the last)."""
        seqs = batch.seqs
        ids = [s.request_id for s in seqs]
        if all(s.num_cached_tokens == 0 for s in seqs):
            self.reset(len(seqs))
        elif ids != self.request_ids:
            where = {r: i for i, r in enumerate(self.request_ids)}
            self.keep([where[r] for r in ids])
        self.request_ids = ids
        lens = np.array([s.num_new_tokens for s in seqs])
        S = int(lens.max())
        tokens = np.zeros((len(seqs), S), np.int64)
        qpos = np.zeros((len(seqs), S), np.int64)
        key_pos = np.full((len(seqs), S), -1, np.int64)
        for b, s in enumerate(seqs):
            tokens[b, : lens[b]] = s.token_ids
            qpos[b, : lens[b]] = s.positions
            key_pos[b, : lens[b]] = s.positions
        return self.step_feeds(tokens, qpos, key_pos, lens - 1)

    def step_feeds(self, ids: np.ndarray, qpos: np.ndarray, new_key_pos: np.ndarray, last: np.ndarray) -> dict[str, Any]:
        """The inputs of a step that runs tokens ``ids`` ``[n, S]`` at positions ``qpos``
        (padding: 0) over the current cache rows; their slots get positions ``new_key_pos``
        (-1: padding); logits are taken at column ``last`` ``[n]`` of each row.
        Native: the tokens go to slots ``qpos[:, 0] + s``."""
        native_extra: dict[str, Any] = {}
        if self.native:
            write = qpos[:, 0]
            n, S = ids.shape
            self.key_pos[np.arange(n)[:, None], write[:, None] + np.arange(S)[None, :]] = new_key_pos
            native_extra[CACHE_WRITE_POSITIONS] = write.astype(np.int32)
        else:
            self.key_pos = np.concatenate([self.key_pos, new_key_pos], axis=1)
        return {
            INPUT_IDS: ids.astype(np.int32),
            POSITION_IDS: qpos.astype(np.int32),
            **mask_feeds(self.config, self.key_pos, qpos, native=self.native),
            # the network picks logits rows from the flattened [n * S] tokens
            LAST_TOKEN_IDS: (np.arange(ids.shape[0]) * ids.shape[1] + np.asarray(last)).astype(np.int32),
            **native_extra,
            **self.cache,
        }

    def update(self, outputs: Mapping[str, Any]) -> None:
        """After a step: the ``present.*`` outputs are the next step's cache (native: the
        same memory, written in place)."""
        self.cache = {p: outputs[o] for p, o in self.names}
