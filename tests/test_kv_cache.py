"""Paged KV cache: pool layout arithmetic and the block manager's bookkeeping.

The block manager is also driven by a hypothesis state machine through random
admit / append / preempt / re-admit / finish sequences; after every step no block is
shared, nothing leaks, every table has ``ceil(num_tokens / block_size)`` blocks, and
every failed operation left the state exactly as it was.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trtcore.errors import InvalidArgumentError, TrtcoreError
from trtcore.runtime.kv_cache import (
    PAD_SLOT_ID,
    BlockManager,
    KVCacheSpec,
    NoFreeBlocksError,
    UnknownSequenceError,
    kv_cache_dtype,
)

# ---- KVCacheSpec ------------------------------------------------------------------------


def test_spec_sizes_and_shape():
    spec = KVCacheSpec(num_layers=3, num_kv_heads=2, head_dim=8, block_size=4, dtype="float16")
    assert spec.dtype == np.float16
    assert spec.bytes_per_token == 3 * 2 * 2 * 8 * 2
    assert spec.bytes_per_block == spec.bytes_per_token * 4
    assert spec.pool_shape(5) == (3, 5, 2, 2, 4, 8)
    assert spec.pool_nbytes(5) == 5 * spec.bytes_per_block
    pool = np.zeros(spec.pool_shape(5), spec.dtype)
    assert pool.shape == spec.pool_shape(5) and pool.dtype == np.float16 and pool.nbytes == spec.pool_nbytes(5)
    assert tuple(s // pool.itemsize for s in pool.strides) == spec.pool_strides(5)


def test_spec_defaults_and_dtypes():
    spec = KVCacheSpec(2, 4, 64)
    assert spec.block_size == 16 and spec.dtype == np.float16
    assert KVCacheSpec(1, 1, 1, dtype="bf16").dtype == np.dtype(ml_dtypes.bfloat16)
    assert KVCacheSpec(1, 1, 1, dtype=ml_dtypes.bfloat16).dtype.itemsize == 2
    assert KVCacheSpec(1, 1, 1, dtype="fp8").dtype.itemsize == 1
    assert KVCacheSpec(1, 1, 1, dtype=np.float32).bytes_per_token == 2 * 4
    assert kv_cache_dtype("FLOAT32") == np.float32


@pytest.mark.parametrize("bad", ["int4", np.int32, "nope", object()])
def test_spec_rejects_bad_dtype(bad):
    with pytest.raises(InvalidArgumentError):
        KVCacheSpec(1, 1, 1, dtype=bad)


@pytest.mark.parametrize("field", ["num_layers", "num_kv_heads", "head_dim", "block_size"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_spec_rejects_bad_dims(field, value):
    kw = {"num_layers": 1, "num_kv_heads": 1, "head_dim": 1, "block_size": 1}
    kw[field] = value
    with pytest.raises(InvalidArgumentError, match=field):
        KVCacheSpec(**kw)


def test_pool_layout_is_layer_major_and_hnd_within_a_block():
    spec = KVCacheSpec(num_layers=2, num_kv_heads=3, head_dim=4, block_size=5, dtype="float32")
    pool = np.zeros(spec.pool_shape(6), spec.dtype)
    # each layer's slab is contiguous, one block table serves every layer
    assert pool[1].flags.c_contiguous
    assert pool[1].ctypes.data - pool.ctypes.data == 6 * spec.bytes_per_block // 2
    # one head's tile of a block: block_size rows of head_dim, contiguous (HND)
    tile = pool[1, 4, 1, 2]
    assert tile.shape == (5, 4) and tile.flags.c_contiguous
    # K then V of one block sit next to each other
    assert pool[0, 3, 1].ctypes.data - pool[0, 3, 0].ctypes.data == 3 * 5 * 4 * 4


def test_num_blocks_for_budget():
    spec = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype="float16")
    b = spec.bytes_per_block
    assert spec.num_blocks_for_budget(10 * b) == 10
    assert spec.num_blocks_for_budget(10 * b + b - 1) == 10
    with pytest.raises(InvalidArgumentError, match=str(b)):
        spec.num_blocks_for_budget(b - 1)
    with pytest.raises(InvalidArgumentError):
        spec.num_blocks_for_budget(-1)


def test_pad_slot_id_is_negative():
    assert PAD_SLOT_ID < 0


# ---- BlockManager -----------------------------------------------------------------------


def test_allocate_append_free_roundtrip():
    bm = BlockManager(num_blocks=6, block_size=4)
    assert bm.num_free_blocks == 6 and bm.num_slots == 24
    assert bm.allocate("a", 0) == []
    assert bm.append("a", 1) == [0]  # crossing into the first block
    assert bm.append("a", 3) == []  # fills block 0 exactly
    assert bm.append("a") == [1]  # token 5 starts block 1
    assert bm.block_table("a") == [0, 1] and bm.num_tokens("a") == 5
    assert bm.allocate("b", 8) == [2, 3]
    assert bm.slot_mapping("a", 2, 3) == [2, 3, 4]
    assert bm.slot_mapping("b", 3, 2) == [2 * 4 + 3, 3 * 4 + 0]
    assert bm.num_free_blocks == 2 and bm.num_used_blocks == 4 and len(bm) == 2
    assert bm.seq_ids == ["a", "b"] and "a" in bm
    assert bm.seq_lens(["b", "a"]).tolist() == [8, 5]
    assert bm.free("a") == 2
    assert "a" not in bm and bm.num_free_blocks == 4
    # a freed id may be admitted again; freed blocks come back after the never-used ones
    assert bm.allocate("a", 12) == [4, 5, 0]
    bm.check_invariants()


def test_failed_allocation_and_append_change_nothing():
    bm = BlockManager(num_blocks=3, block_size=2)
    bm.allocate(7, 3)  # 2 blocks
    assert not bm.can_allocate(3) and bm.can_allocate(2)
    with pytest.raises(NoFreeBlocksError) as e:
        bm.allocate("big", 4)
    msg = str(e.value)
    assert "'big'" in msg and "needs 2 blocks" in msg and "4 tokens" in msg and "1 of 3" in msg
    assert e.value.seq_id == "big" and e.value.num_needed == 2 and e.value.num_free == 1
    assert isinstance(e.value, TrtcoreError) and "big" not in bm
    assert bm.can_append(7, 3) and not bm.can_append(7, 4)
    with pytest.raises(NoFreeBlocksError, match=r"sequence 7 needs 2 more blocks to grow from 3 to 7 tokens"):
        bm.append(7, 4)
    assert bm.block_table(7) == [0, 1] and bm.num_tokens(7) == 3 and bm.num_free_blocks == 1
    bm.check_invariants()


def test_errors_name_the_sequence():
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.allocate("s", 1)
    with pytest.raises(InvalidArgumentError, match="'s' is already allocated"):
        bm.allocate("s", 1)
    for call in (
        lambda: bm.free("ghost"),
        lambda: bm.append("ghost"),
        lambda: bm.can_append("ghost"),
        lambda: bm.block_table("ghost"),
        lambda: bm.num_tokens("ghost"),
        lambda: bm.slot_mapping("ghost", 0, 1),
    ):
        with pytest.raises(UnknownSequenceError, match="'ghost'") as e:
            call()
        assert isinstance(e.value, KeyError)
    with pytest.raises(UnknownSequenceError):
        bm.free(["unhashable"])
    bm.free("s")
    with pytest.raises(UnknownSequenceError, match="'s'"):
        bm.free("s")  # freed blocks return exactly once
    bm.allocate("s", 3)
    with pytest.raises(InvalidArgumentError, match=r"tokens 2\.\.3 of sequence 's'"):
        bm.slot_mapping("s", 2, 2)
    with pytest.raises(InvalidArgumentError):
        bm.append("s", -1)
    with pytest.raises(InvalidArgumentError):
        bm.allocate("t", -2)
    for bad in ((0, 4), (4, 0), (2.0, 4)):
        with pytest.raises(InvalidArgumentError):
            BlockManager(*bad)
    bm.check_invariants()


def test_any_hashable_id_even_none():
    bm = BlockManager(num_blocks=2, block_size=1)
    bm.allocate(None, 1)
    bm.allocate((1, "x"), 1)
    bm.check_invariants()
    assert bm.free(None) == 1
    bm.check_invariants()


# ---- stateful test ----------------------------------------------------------------------


class BlockManagerMachine(RuleBasedStateMachine):
    """Random admit / append / preempt / re-admit / finish against a plain model."""

    def __init__(self):
        super().__init__()
        self.bm: BlockManager
        self.live: dict[int, int] = {}  # seq id -> num_tokens
        self.preempted: dict[int, int] = {}  # freed, waiting to be recomputed
        self.next_id = 0

    @initialize(num_blocks=st.integers(1, 20), block_size=st.integers(1, 6))
    def setup(self, num_blocks, block_size):
        self.bm = BlockManager(num_blocks, block_size)

    # -- helpers
    def snapshot(self):
        bm = self.bm
        return (
            list(bm._free),
            {s: (bm.block_table(s), bm.num_tokens(s)) for s in bm.seq_ids},
            bm.num_free_blocks,
        )

    def need(self, n):
        return math.ceil(n / self.bm.block_size)

    def _admit(self, sid, n):
        before = self.snapshot()
        free = self.bm.num_free_blocks
        expect_ok = self.need(n) <= free
        assert self.bm.can_allocate(n) == expect_ok
        if expect_ok:
            table = self.bm.allocate(sid, n)
            assert len(table) == self.need(n) and len(set(table)) == len(table)
            assert self.bm.num_free_blocks == free - len(table)
            self.live[sid] = n
            return True
        with pytest.raises(NoFreeBlocksError, match=repr(sid)):
            self.bm.allocate(sid, n)
        assert self.snapshot() == before
        return False

    # -- rules
    @rule(n=st.integers(0, 40))
    def admit(self, n):
        sid = self.next_id
        self.next_id += 1
        self._admit(sid, n)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(0, 12))
    def append(self, data, n):
        sid = data.draw(st.sampled_from(sorted(self.live)))
        before = self.snapshot()
        old_table = self.bm.block_table(sid)
        cur = self.live[sid]
        extra = self.need(cur + n) - len(old_table)
        expect_ok = extra <= self.bm.num_free_blocks
        assert self.bm.can_append(sid, n) == expect_ok
        if expect_ok:
            new = self.bm.append(sid, n)
            assert len(new) == extra
            assert self.bm.block_table(sid) == old_table + new  # earlier blocks never move
            self.live[sid] = cur + n
        else:
            with pytest.raises(NoFreeBlocksError, match=f"sequence {sid} needs {extra} more blocks"):
                self.bm.append(sid, n)
            assert self.snapshot() == before

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def preempt(self, data):
        sid = data.draw(st.sampled_from(sorted(self.live)))
        table = self.bm.block_table(sid)
        free = self.bm.num_free_blocks
        assert self.bm.free(sid) == len(table)
        assert self.bm.num_free_blocks == free + len(table)
        self.preempted[sid] = self.live.pop(sid)

    @precondition(lambda self: self.preempted)
    @rule(data=st.data())
    def readmit(self, data):
        sid = data.draw(st.sampled_from(sorted(self.preempted)))
        if self._admit(sid, self.preempted[sid]):
            del self.preempted[sid]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data):
        sid = data.draw(st.sampled_from(sorted(self.live)))
        self.bm.free(sid)
        del self.live[sid]

    @rule(data=st.data())
    def bad_operations_change_nothing(self, data):
        before = self.snapshot()
        dead = data.draw(st.sampled_from(sorted(self.preempted) + [-1]))
        with pytest.raises(UnknownSequenceError):
            self.bm.free(dead)
        with pytest.raises(UnknownSequenceError):
            self.bm.append(dead)
        if self.live:
            sid = data.draw(st.sampled_from(sorted(self.live)))
            with pytest.raises(InvalidArgumentError):
                self.bm.allocate(sid, 1)
            with pytest.raises(InvalidArgumentError):
                self.bm.slot_mapping(sid, 0, self.live[sid] + 1)
        assert self.snapshot() == before

    # -- invariants
    @invariant()
    def no_sharing_no_leak_exact_tables(self):
        if not hasattr(self, "bm"):
            return
        bm = self.bm
        bm.check_invariants()
        owned = [b for s in bm.seq_ids for b in bm.block_table(s)]
        assert len(owned) == len(set(owned)), "a block is shared between live sequences"
        assert set(owned).isdisjoint(bm._free)
        assert bm.num_free_blocks + len(owned) == bm.num_blocks
        assert sorted(owned + list(bm._free)) == list(range(bm.num_blocks))
        assert set(bm.seq_ids) == set(self.live)
        for s, n in self.live.items():
            assert bm.num_tokens(s) == n
            table = bm.block_table(s)
            assert len(table) == math.ceil(n / bm.block_size)
            slots = bm.slot_mapping(s, 0, n)
            assert len(set(slots)) == n and all(table[p // bm.block_size] == slots[p] // bm.block_size for p in range(n))


BlockManagerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestBlockManagerStateful = BlockManagerMachine.TestCase
