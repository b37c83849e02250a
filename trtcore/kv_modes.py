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

from dataclasses import dataclass
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from .config import ModelConfig
from .errors import InvalidArgumentError
from .plan import BuildPlan
from .rope import rope_spec

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
#: native mode: int32 ``[B]``, the slot of each sequence's first new token
CACHE_WRITE_POSITIONS = "cache_write_positions"
#: the two halves of each layer's cache
KV_KINDS: tuple[str, str] = ("key", "value")

Shape = tuple[int, ...]
Profile = tuple[Shape, Shape, Shape]

_NP_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


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

    def __init__(self, plan: BuildPlan, config: ModelConfig):
        self.plan = plan
        self.config = config
        self.dtype = _NP_DTYPES[plan.dtype]
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
        return (-1, c.num_key_value_heads, -1 if self.cache_len is None else self.cache_len, c.head_dim)

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
      head_dim]`` of the engine dtype (written in place by the attention plugins);
    * ``block_tables`` int32 ``[B, max_blocks_per_seq]``, ``seq_lens`` int32 ``[B]`` (cached +
      new tokens), ``query_start_loc`` int32 ``[B + 1]`` (offsets of each sequence's tokens);
    * ``last_token_ids`` int32 ``[B]``: packed index of each sequence's last token;
    * with ``dynamic`` RoPE scaling, ``rope_seq_lens`` int32 ``[T]``: each token's sequence
      length in this step (transformers recomputes the frequencies per forward call).

    Output: ``logits`` float32 ``[B, vocab_size]``.

    Profile: ``T`` in [1, max_num_tokens], ``B`` in [1, max_batch_size], block tables up to
    ``ceil(max_seq_len / block_size)`` wide, a pool of up to ``max_num_blocks`` blocks.
    """

    name = "paged"
    kv_cache = "paged"
    attention = "plugin"
    token_layout = "packed"

    def __init__(self, plan: BuildPlan, config: ModelConfig):
        super().__init__(plan, config)
        self.takes_rope_seq_lens = rope_spec(config).rope_type == "dynamic"

    @property
    def pool_shape(self) -> Shape:
        """``[num_layers, -1 (blocks), 2, num_key_value_heads, block_size, head_dim]``."""
        c = self.config
        return (c.num_hidden_layers, -1, 2, c.num_key_value_heads, self.plan.block_size, c.head_dim)

    @property
    def inputs(self) -> list[TensorSpec]:
        i32 = np.dtype(np.int32)
        specs = [
            TensorSpec(INPUT_IDS, i32, (-1,)),
            TensorSpec(POSITION_IDS, i32, (-1,)),
            TensorSpec(KV_CACHE_POOL, self.dtype, self.pool_shape),
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
        B, T, BS = p.max_batch_size, p.max_num_tokens, p.block_size
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
        Hkv, D = self.config.num_key_value_heads, self.config.head_dim
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

    def __init__(self, plan: BuildPlan, config: ModelConfig):
        super().__init__(plan, config)
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
        Hkv, D = self.config.num_key_value_heads, self.config.head_dim
        shapes = self._padded_profile(((1, 1, 1, L), (b, 1, s, L), (B, 1, L, L)))
        shapes[CACHE_WRITE_POSITIONS] = ((1,), (b,), (B,))
        return shapes | self._cache_profile((1, Hkv, L, D), (b, Hkv, L, D), (B, Hkv, L, D))


#: the mode classes, keyed by ``(plan.kv_cache, plan.attention)``
MODES: dict[tuple[str, str], type[KVMode]] = {(m.kv_cache, m.attention): m for m in (PagedKV, ContiguousKV, NativeKV)}


def kv_mode(plan: BuildPlan, config: ModelConfig) -> KVMode:
    """The KV cache mode of ``plan`` for ``config``'s model.

    Raises:
        InvalidArgumentError: the plan's ``(kv_cache, attention)`` pair has no mode.
    """
    key = (plan.kv_cache, plan.attention)
    if key not in MODES:
        raise InvalidArgumentError(f"no KV cache mode for kv_cache={plan.kv_cache!r}, attention={plan.attention!r}; expected one of {sorted(MODES)}")
    return MODES[key](plan, config)


# ---------------------------------------------------------------------------------------
# runtime side: per-step feeds and cache buffers (used by trtcore.runtime)
# ---------------------------------------------------------------------------------------
