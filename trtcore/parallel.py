"""Tensor parallelism's rank arithmetic: which slice of each layer a rank holds.

Megatron-style tensor parallelism (Shoeybi et al., "Megatron-LM", arXiv:1909.08053,
section 3) splits each decoder layer over ``tp_size`` ranks:

* column-parallel linears (q/k/v, gate/up): each rank holds a contiguous block of the
  output features (whole heads for q/k/v) and computes its part of the output, no
  communication;
* row-parallel linears (o_proj, down_proj): each rank holds the matching block of the input
  features, computes a partial sum of the full output, and an all-reduce adds the ranks'
  partial sums (the bias is added once, after it);
* vocabulary-parallel embedding and LM head: each rank holds ``ceil(vocab_size / tp_size)``
  rows of the table (the last rank's padded with zeros); the lookup is masked (ids outside
  the rank's rows give zeros) and all-reduced, the LM head's logit slices all-gathered.

Attention heads are split evenly; KV heads too when ``tp_size`` divides
``num_key_value_heads``, else (fewer KV heads than ranks) each KV head is replicated on the
``tp_size / num_key_value_heads`` ranks whose query heads read it (vLLM's rule).

:class:`Mapping` is the rank's view (TensorRT-LLM's ``Mapping`` has the same role); a
:class:`trtcore.ops.Graph` carries one so that the ops slice the weights themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, InvalidArgumentError

__all__ = ["Mapping", "check_tensor_parallel", "local_kv_heads"]


def local_kv_heads(num_key_value_heads: int, tp_size: int) -> int:
    """KV heads each rank holds: ``num_key_value_heads / tp_size``, at least 1 (replicated)."""
    return max(1, num_key_value_heads // tp_size)


def check_tensor_parallel(config: Any, tp_size: int) -> None:
    """Check that ``config`` (a :class:`trtcore.config.ModelConfig`) splits over ``tp_size`` ranks.

    Raises:
        InvalidArgumentError: ``tp_size`` is not an int >= 1.
        ConfigError: ``tp_size`` does not divide ``num_attention_heads`` or
            ``intermediate_size``, or neither divides ``num_key_value_heads`` nor is divided
            by it (the message names the field, its value and ``tp_size``).
    """
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise InvalidArgumentError(f"tensor_parallel_size must be an int >= 1, got {tp_size!r}")
    if tp_size == 1:
        return
    for field in ("num_attention_heads", "intermediate_size"):
        value = getattr(config, field)
        if value % tp_size:
            raise ConfigError(
                f"tensor_parallel_size {tp_size} does not divide {field} {value} of {config.architecture}; "
                f"choose a tensor_parallel_size that divides it"
            )
    hkv = config.num_key_value_heads
    if hkv % tp_size and tp_size % hkv:
        raise ConfigError(
            f"tensor_parallel_size {tp_size} and num_key_value_heads {hkv} of {config.architecture}: one must divide the other "
            f"(KV heads are split, or replicated when there are fewer than ranks)"
        )


@dataclass(frozen=True)
class Mapping:
    """One rank of a tensor-parallel group.

    Attributes:
        tp_size: ranks in the group (1: no parallelism; every method then returns the whole).
        tp_rank: this rank, ``0 <= tp_rank < tp_size``.
        group: the name of the group's communicator in the running process (the
            collective plugin's ``group`` field, :func:`trtcore.plugins.collective.register_group`).

    Raises:
        InvalidArgumentError: ``tp_size < 1`` or ``tp_rank`` outside ``[0, tp_size)``.
    """

    tp_size: int = 1
    tp_rank: int = 0
    group: str = "tp"

    def __post_init__(self) -> None:
        if isinstance(self.tp_size, bool) or not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise InvalidArgumentError(f"tensor_parallel_size must be an int >= 1, got {self.tp_size!r}")
        if not isinstance(self.tp_rank, int) or not 0 <= self.tp_rank < self.tp_size:
            raise InvalidArgumentError(f"tensor-parallel rank {self.tp_rank!r} is outside [0, {self.tp_size})")

    @property
    def parallel(self) -> bool:
        """Whether there is more than one rank."""
        return self.tp_size > 1

    def split(self, n: int, what: str = "dimension") -> tuple[int, int]:
        """``[start, stop)`` of this rank's even share of ``n`` items.

        Raises:
            ConfigError: ``tp_size`` does not divide ``n``.
        """
        if n % self.tp_size:
            raise ConfigError(f"tensor_parallel_size {self.tp_size} does not divide {what} {n}")
        per = n // self.tp_size
        return self.tp_rank * per, (self.tp_rank + 1) * per

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """``[start, stop)`` of the KV heads this rank holds (one replicated head when
        ``num_kv_heads < tp_size``: that of the rank's query heads)."""
        if num_kv_heads >= self.tp_size:
            return self.split(num_kv_heads, "num_key_value_heads")
        head = self.tp_rank * num_kv_heads // self.tp_size
        return head, head + 1

    def vocab(self, vocab_size: int) -> tuple[int, int, int]:
        """``(start, stop, rows)``: this rank's vocabulary rows ``[start, stop)`` and the
        padded rows per rank ``ceil(vocab_size / tp_size)`` (``stop - start < rows`` on the
        last rank when ``tp_size`` does not divide ``vocab_size``)."""
        rows = -(-vocab_size // self.tp_size)
        start = min(self.tp_rank * rows, vocab_size)
        return start, min(start + rows, vocab_size), rows
