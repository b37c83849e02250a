"""The generate loop over the paged KV cache: continuous batching of packed tokens.

Each step the :class:`~trtcore.runtime.scheduler.Scheduler` picks the sequences to run
(decodes first, then prefill chunks of waiting requests, within a token budget), the
network runs once on their packed tokens (:func:`trtcore.models.llama.io_spec`,
``kv_cache="paged"``), the attention plugins write the new keys/values into the one KV
pool in place, and a token is sampled for every sequence whose chunk reached its end.
New requests join while others decode; when the pool runs out the most recently admitted
request is preempted and later recomputed (vLLM's recompute preemption), so no request
ever corrupts another.

The pool stays in the array module of the executor (NumPy, or CuPy on the GPU) for the
whole run; per step only the small index arrays go to the executor and the logits of the
sampled rows come back.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..dtypes import storage_dtype
from .executor import Executor
from .generate import Request, TokenEvent
from .kv_cache import BlockManager, KVCacheSpec
from .sampling import Sampler
from .scheduler import RequestState, Scheduler


class PagedGenerator:
    """Runs :class:`~trtcore.runtime.generate.Request` s with continuous batching.

    Args:
        executor: runs the paged network.
        config: the model config.
        kv_spec: the pool's layout (layers, KV heads, head_dim, block_size, dtype).
        num_blocks: blocks in the pool (sized once; see :meth:`KVCacheSpec.num_blocks_for_budget`).
        max_num_seqs: most sequences per step (the profile's max batch).
        max_num_tokens: token budget per step (the profile's max packed tokens).
        max_seq_len: most tokens (prompt + generated) per sequence.
        xp: the executor's array module (``numpy`` or ``cupy``); the pool lives there.
    """

    def __init__(
        self,
        executor: Executor,
        config: ModelConfig,
        kv_spec: KVCacheSpec,
        num_blocks: int,
        max_num_seqs: int,
        max_num_tokens: int,
        max_seq_len: int,
        xp: Any = np,
    ):
        self.executor = executor
        self.config = config
        self.kv_spec = kv_spec
        self.num_blocks = int(num_blocks)
        self.max_num_seqs = int(max_num_seqs)
        self.max_num_tokens = int(max_num_tokens)
        self.max_seq_len = int(max_seq_len)
        self.xp = xp
        storage = storage_dtype(kv_spec.dtype, xp)  # on CuPy bfloat16 is kept as its bit patterns
        self.pool = xp.zeros(kv_spec.pool_shape(self.num_blocks), dtype=storage)
        self.max_blocks_per_seq = -(-self.max_seq_len // kv_spec.block_size)
        self._params: dict[Any, Any] = {}
        self._pending_logprobs: dict[Any, Any] = {}
        self.sampler = Sampler()
        self.scheduler = Scheduler(
            BlockManager(self.num_blocks, kv_spec.block_size),
            max_num_batched_tokens=self.max_num_tokens,
            max_num_seqs=self.max_num_seqs,
            chunked_prefill=True,
            finish_predicate=self._stop_token,
        )

    def _stop_token(self, state: RequestState, token: int) -> str | None:
        stop = self._params[state.request_id].stop_token_ids
        return "stop" if stop and token in stop else None

    def _feeds(self, out: Any) -> dict[str, Any]:
        feeds = {
            "input_ids": out.input_ids(),
            "position_ids": out.positions(),
            "kv_cache_pool": self.pool,
            "block_tables": out.block_tables(),
            "seq_lens": out.seq_lens(),
            "query_start_loc": out.query_start_loc(),
            "last_token_ids": out.last_token_indices(),
        }
        if "rope_seq_lens" in self.executor.input_names:
            # each token's sequence length in this call: transformers' dynamic RoPE input
            feeds["rope_seq_lens"] = np.repeat(out.seq_lens(), [s.num_new_tokens for s in out.seqs]).astype(np.int32)
        return feeds

    def add_request(self, request: Request) -> TokenEvent | None:
        """Queue ``request``; it joins the running batch at the next :meth:`step` that has
        room (continuous batching).

        Returns:
            None, or — for a request that can never fit the pool — a :class:`TokenEvent`
            with ``finish_reason="error"``, ``token_id=-1`` and the reason in ``error``.
        """
        r = request
        room = self.max_seq_len - len(r.prompt_token_ids)
        eos = () if r.params.ignore_eos else tuple(r.eos_token_ids)
        self._params[r.request_id] = r.params
        state = self.scheduler.add_request(r.request_id, r.prompt_token_ids, max(1, min(r.params.max_tokens, room)), eos)
        if state.error is not None:
            del self._params[r.request_id]
            return TokenEvent(r.request_id, -1, None, "error", error=state.error)
        self.sampler.add_request(r.request_id, r.params)
        return None

    def has_unfinished_requests(self) -> bool:
        """Whether some request still waits or runs."""
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[TokenEvent]:
        """Run one engine step (schedule, execute, sample) and return the new tokens."""
        sched = self.scheduler
        out = sched.schedule()
        ids = out.sampling_request_ids
        sampled: dict[Any, int] = {}
        if ids:
            logits = np.asarray(self.executor.to_host(self.executor.run(self._feeds(out))["logits"], "logits"), dtype=np.float32)
            result = self.sampler.sample(logits[out.sampling_indices()], ids)
            for row, rid in enumerate(ids):
                sampled[rid] = int(result.token_ids[row])
                self._pending_logprobs[rid] = result.logprobs[row]
        elif not out.is_empty:
            self.executor.run(self._feeds(out))  # prefill chunks that end inside prompts
        events: list[TokenEvent] = []
        for ev in sched.update(sampled):
            if not ev.new_token_ids:
                continue  # a rejection, reported by add_request
            tok = ev.new_token_ids[0]
            stops = self._params[ev.request_id].stop_token_ids
            stop = tok if ev.finish_reason == "stop" and stops and tok in stops else None
            events.append(TokenEvent(ev.request_id, tok, self._pending_logprobs.pop(ev.request_id, None), ev.finish_reason, stop))
            if ev.finished:
                self.sampler.remove_request(ev.request_id)
                del self._params[ev.request_id]
        return events

    def generate(self, requests: Sequence[Request]) -> Iterator[TokenEvent]:
        """Add ``requests`` and step until all are done, yielding one :class:`TokenEvent` per
        generated token as the steps produce them (rejected requests: one error event).

        Raises:
            SchedulerError: requests added with :meth:`add_request` are still unfinished.
        """
        from .scheduler import SchedulerError

        if self.has_unfinished_requests():
            raise SchedulerError("generate() while requests added with add_request() are unfinished; step() them first")
        for r in requests:
            error = self.add_request(r)
            if error is not None:
                yield error
        while self.has_unfinished_requests():
            yield from self.step()
