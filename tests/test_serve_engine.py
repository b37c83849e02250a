"""The server's engine loop and its streaming fast path, without HTTP or a model.

* :class:`~trtcore.serve.engine.AsyncEngine` over bench/bench_serve_overhead.py's time-based
  stand-in LLM, in an engine process and in-process (the same engine-core loop in a thread):
  the engine goes on stepping while the event loop's thread is busy (it does not wait for the
  dispatch of the step before), a stream that fell behind gets what accumulated in one
  :meth:`~trtcore.serve.engine.RequestStream.drain`, and every token arrives once, in order,
  counted in the metrics.
* Errors: a request the engine refuses fails alone; an exception out of a step fails the live
  requests and the engine goes on; an engine whose loop dies fails the live streams and turns
  not ready.
* A ``make_llm`` that cannot reach an engine process is refused, naming it.
* :class:`~trtcore.serve.app._ChunkTemplate`'s events are the bytes the pydantic models give.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trtcore.errors import InvalidArgumentError, InvalidRequestError
from trtcore.llm import StreamOutput
from trtcore.runtime.sampling import SamplingParams
from trtcore.serve.app import _chunk_dict, _ChunkTemplate, _sse
from trtcore.serve.engine import AsyncEngine, EngineDeadError, RequestStream
from trtcore.serve.metrics import ServerMetrics
from trtcore.serve.protocol import ChatCompletionChunk, ChatResponseMessage, ChatStreamChoice, CompletionChoice, CompletionResponse


def _stand_in_class() -> Any:
    """bench_serve_overhead.StandInLLM, imported by its module's name (bench/ on sys.path, which
    an engine process inherits) so that a partial of it pickles."""
    bench = str(Path(__file__).parents[1] / "bench")
    if bench not in sys.path:
        sys.path.append(bench)
    from bench_serve_overhead import StandInLLM

    return StandInLLM


def _sample(metrics: ServerMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, {"model_name": "m", **labels}) or 0.0


def test_the_engine_steps_on_while_the_loop_is_busy() -> None:
    """In-process (the engine-core loop in a thread, over the same socket): the steps are counted."""
    steps = []
    stand_in = _stand_in_class()(step_s=1e-3, host_s=0.0, max_batch_size=4)
    step = stand_in.step
    stand_in.step = lambda: steps.append(time.perf_counter()) or step()
    metrics = ServerMetrics("m")
    n = 300

    async def scenario() -> list[list[Any]]:
        engine = AsyncEngine(lambda: stand_in, metrics, in_process=True)
        await engine.start()
        assert engine.engine_pid == os.getpid()
        stream = engine.submit([1, 2, 3], SamplingParams(max_tokens=n, ignore_eos=True))
        batches = [await stream.drain()]
        before = len(steps)
        time.sleep(0.5)  # the loop's thread is busy: no dispatch for 0.5 s
        during = len(steps) - before
        batches.append(await stream.drain())
        while batch := await stream.drain():
            batches.append(batch)
        await engine.shutdown()
        # 1 ms steps: ~500 in 0.5 s (a loop that waits for each dispatch makes at most 1); 30 leaves room for a loaded machine
        assert during >= 30, f"the engine made {during} steps while the loop was busy"
        return batches

    batches = asyncio.run(scenario())
    assert len(batches[1]) >= 30  # what accumulated comes in one drain
    outs = [o for b in batches for o in b]
    assert len(outs) == n and [o.finish_reason for o in outs] == [None] * (n - 1) + ["length"]
    assert _sample(metrics, "trtcore:generation_tokens_total") == n
    assert _sample(metrics, "trtcore:request_success_total", finished_reason="length") == 1
    assert _sample(metrics, "trtcore:inter_token_latency_seconds_count") == n - 1
    assert _sample(metrics, "trtcore:time_to_first_token_seconds_count") == 1


def test_the_engine_process_steps_on_while_the_loop_is_busy() -> None:
    """In an engine process of its own: another pid; the tokens made while the loop's thread
    was blocked arrive together; a shutdown ends the process."""
    metrics = ServerMetrics("m")
    n = 300

    async def scenario() -> tuple[list[list[Any]], AsyncEngine]:
        engine = AsyncEngine(functools.partial(_stand_in_class(), step_s=1e-3, host_s=0.0, max_batch_size=4), metrics)
        await engine.start()
        assert engine.engine_pid not in (None, os.getpid())
        assert engine.model is not None and engine.model.max_batch_size == 4
        stream = engine.submit([1, 2, 3], SamplingParams(max_tokens=n, ignore_eos=True))
        batches = [await stream.drain()]
        time.sleep(0.5)  # the loop's thread is busy: the engine process steps on (1 ms steps: ~500 tokens)
        while batch := await stream.drain():
            batches.append(batch)
        await engine.shutdown()
        return batches, engine

    batches, engine = asyncio.run(scenario())
    assert len(batches[1]) >= 30, [len(b) for b in batches]  # what accumulated comes in one drain
    outs = [o for b in batches for o in b]
    assert len(outs) == n and [o.finish_reason for o in outs] == [None] * (n - 1) + ["length"]
    assert _sample(metrics, "trtcore:generation_tokens_total") == n
    assert _sample(metrics, "trtcore:inter_token_latency_seconds_count") == n - 1
    assert not engine._worker.is_alive() and engine._worker.exitcode == 0


def test_the_engine_process_outlives_sigterm_but_not_its_server() -> None:
    """The engine process ignores SIGTERM (a signal to the server's whole process group must
    not kill it before the drain), so the server's exit handler ends it instead: it closes the
    socket (the engine loop ends) and kills what is left, before multiprocessing's handler
    (SIGTERM, then an endless join) runs."""
    import atexit
    import signal

    async def scenario() -> AsyncEngine:
        engine = AsyncEngine(functools.partial(_stand_in_class(), step_s=1e-3, host_s=0.0, max_batch_size=4), ServerMetrics("m"))
        await engine.start()
        return engine

    engine = asyncio.run(scenario())  # no shutdown: as when the server dies of an exception
    worker = engine._worker
    try:
        os.kill(worker.pid, signal.SIGTERM)
        worker.join(1.0)
        assert worker.is_alive()  # ignored
        t0 = time.monotonic()
        engine._reap_at_exit()
        assert not worker.is_alive() and time.monotonic() - t0 < 10
        assert worker.exitcode == 0  # it left its loop when the socket closed: not killed
    finally:
        atexit.unregister(engine._reap_at_exit)
        if worker.is_alive():
            worker.kill()


def test_max_waiting_counts_only_what_waits_beyond_the_free_batch_slots() -> None:
    """max_batch_size 4, max_waiting 2: 4 requests submitted at once (none scheduled yet)
    take the free slots and wait for nobody; 2 more wait; the 7th is refused (429)."""
    from trtcore.serve.engine import QueueFullError

    stand_in = _stand_in_class()(step_s=1e-3, host_s=0.0, max_batch_size=4)

    async def scenario() -> None:
        engine = AsyncEngine(lambda: stand_in, ServerMetrics("m"), max_waiting=2, in_process=True)
        await engine.start()
        streams = [engine.submit([1], SamplingParams(max_tokens=50, ignore_eos=True)) for _ in range(6)]
        with pytest.raises(QueueFullError, match="--max-waiting 2"):
            engine.submit([1], SamplingParams(max_tokens=2))
        for s in streams:  # every admitted request runs to its end
            outs = [o async for o in s]
            assert len(outs) == 50 and outs[-1].finish_reason == "length"
        await engine.shutdown()

    asyncio.run(scenario())


def test_a_batch_is_queued_whole_or_not_at_all() -> None:
    """submit_batch: K requests count K against max_waiting (max_batch_size 4, max_waiting 2):
    7 at once can never be queued (InvalidRequestError, not a retry), none queued; 6 fit; then
    with 6 waiting or running, a batch of 2 is refused for now (QueueFullError, none queued),
    as submit's single request is."""
    from trtcore.errors import InvalidRequestError
    from trtcore.serve.engine import QueueFullError

    stand_in = _stand_in_class()(step_s=1e-3, host_s=0.0, max_batch_size=4)

    async def scenario() -> None:
        engine = AsyncEngine(lambda: stand_in, ServerMetrics("m"), max_waiting=2, in_process=True)
        await engine.start()
        params = SamplingParams(max_tokens=20, ignore_eos=True)
        with pytest.raises(InvalidRequestError, match="7 prompts can never be queued together.*at most 6"):
            engine.submit_batch([([1], params)] * 7)
        assert not engine._streams and not engine._waiting
        streams = engine.submit_batch([([1], params)] * 6)
        with pytest.raises(QueueFullError, match="2 prompts do not fit.*none was queued"):
            engine.submit_batch([([1], params)] * 2)
        assert len(engine._streams) == 6
        with pytest.raises(QueueFullError):
            engine.submit_batch([([1], params)])
        for s in streams:
            outs = [o async for o in s]
            assert len(outs) == 20 and outs[-1].finish_reason == "length"
        await engine.shutdown()

    asyncio.run(scenario())


def _failing_stand_in(fail: list[str]) -> Any:
    """A stand-in that refuses a prompt starting with 666 and whose steps raise what ``fail`` holds."""

    class Failing(_stand_in_class()):  # type: ignore[misc]
        def add_request(self, prompt: list[int], params: Any) -> int:
            if prompt[0] == 666:
                raise InvalidRequestError(f"prompt {prompt[:1]} refused")
            return int(super().add_request(prompt, params))

        def step(self) -> list[StreamOutput]:
            if fail:
                raise RuntimeError(fail.pop())
            return list(super().step())

    return Failing(step_s=1e-3, host_s=0.0, max_batch_size=4)


def test_a_refused_request_or_a_failing_step_ends_only_the_streams_it_concerns() -> None:
    fail: list[str] = []
    metrics = ServerMetrics("m")

    async def scenario() -> None:
        engine = AsyncEngine(lambda: _failing_stand_in(fail), metrics, in_process=True)
        await engine.start()
        ok = engine.submit([1], SamplingParams(max_tokens=50, ignore_eos=True))
        bad = engine.submit([666], SamplingParams(max_tokens=5))
        with pytest.raises(InvalidRequestError, match="666"):
            await bad.drain()
        first = await ok.drain()
        assert first and first[-1].finish_reason is None
        fail.append("the device fell over")  # the next step raises: the live request fails
        with pytest.raises(RuntimeError, match="fell over"):
            while await ok.drain():
                pass
        again = engine.submit([2], SamplingParams(max_tokens=3, ignore_eos=True))  # the engine goes on
        assert [o.finish_reason for o in [o async for o in again]] == [None, None, "length"]
        await engine.shutdown()

    asyncio.run(scenario())
    assert _sample(metrics, "trtcore:request_failure_total") == 2
    assert _sample(metrics, "trtcore:request_success_total", finished_reason="length") == 1


def test_a_failing_prompt_of_a_list_aborts_the_others() -> None:
    """A list of prompts (app's ``_collect`` for a whole response, ``_events_batch`` for a
    stream): when the engine refuses one, the others are aborted (not left running), the whole
    response is a 400 with its error, the stream gets one error event, then ``[DONE]``."""
    from trtcore.serve.app import ApiError, _collect, _events_batch

    class Connected:
        async def is_disconnected(self) -> bool:
            return False

    metrics = ServerMetrics("m")

    async def scenario() -> None:
        engine = AsyncEngine(lambda: _failing_stand_in([]), metrics, in_process=True)
        await engine.start()
        params = SamplingParams(max_tokens=10_000, ignore_eos=True)
        streams = engine.submit_batch([([1], params), ([666], params), ([2], params)])
        with pytest.raises(ApiError, match="666") as e:
            await _collect(streams, lambda i, out: None, Connected())  # type: ignore[arg-type]
        assert e.value.status == 400
        assert [s.aborted for s in streams] == [True, False, True] and all(s.finished for s in streams)
        streams = engine.submit_batch([([1], params), ([2], params), ([666], params)])
        events = [e async for e in _events_batch(streams, [lambda out, i=i: f"{i}," for i in range(3)], lambda: [])]
        assert "666" in events[-2] and '"error"' in events[-2] and events[-1] == "data: [DONE]\n\n"
        assert [s.aborted for s in streams] == [True, True, False] and all(s.finished for s in streams)
        assert not engine._streams
        await engine.shutdown()

    asyncio.run(scenario())
    assert _sample(metrics, "trtcore:request_failure_total") == 2
    assert _sample(metrics, "trtcore:request_success_total", finished_reason="abort") == 4


def test_an_engine_process_that_dies_fails_the_live_streams_and_turns_not_ready() -> None:
    """An engine process killed under a live stream: the stream fails at once, the engine is
    not ready, submit refuses, and the shutdown does not wait for it."""

    async def scenario() -> None:
        engine = AsyncEngine(functools.partial(_stand_in_class(), step_s=1e-3, host_s=0.0), ServerMetrics("m"))
        await engine.start()
        live = engine.submit([1], SamplingParams(max_tokens=10_000, ignore_eos=True))
        assert await live.drain()
        os.kill(engine.engine_pid, signal.SIGKILL)  # type: ignore[arg-type]
        with pytest.raises(EngineDeadError, match="engine process .* exited unexpectedly"):
            while await asyncio.wait_for(live.drain(), 10):
                pass
        assert not engine.ready
        with pytest.raises(EngineDeadError):
            engine.submit([1], SamplingParams())
        await asyncio.wait_for(engine.shutdown(), 10)  # does not hang

    asyncio.run(scenario())


def test_a_factory_that_cannot_be_pickled_is_refused_naming_it() -> None:
    def make() -> Any:
        return None

    with pytest.raises(InvalidArgumentError, match="make_llm=.*make.*cannot be pickled.*in_process=True"):
        AsyncEngine(make, ServerMetrics("m"))


def test_drain_hands_out_the_outputs_before_an_error_then_raises_it() -> None:
    async def scenario() -> None:
        stream = RequestStream(engine=None, prompt_token_ids=[1], params=SamplingParams())  # type: ignore[arg-type]
        a, b = StreamOutput(0, 5, "a"), StreamOutput(0, 6, "b")
        stream._put(a)
        stream._put(b)
        err = RuntimeError("boom")
        stream._put(err)
        assert await stream.drain() == [a, b]
        with pytest.raises(RuntimeError, match="boom"):
            await stream.drain()
        assert await stream.drain() == []

    asyncio.run(scenario())


_ALPHABET = ['"', "\\", "\n", "\t", "\x00", "\x1f", "é", "漢", "😀", "\ue000", "a", " ", "/", "\u2028"]


@pytest.mark.parametrize("include_usage", [False, True])
def test_chunk_template_gives_the_bytes_of_the_pydantic_chunk(include_usage: bool) -> None:
    rng = random.Random()
    created, rid, name = int(time.time()), f"cmpl-{rng.getrandbits(128):032x}", 'model/"x"é'
    m = _ChunkTemplate.mark
    completion = _ChunkTemplate(
        _chunk_dict(
            CompletionResponse(id=rid, created=created, model=name, choices=[CompletionChoice(text=m(0), finish_reason=m(1), stop_reason=m(2))]),
            include_usage,
        )
    )
    delta = ChatStreamChoice(delta=ChatResponseMessage(content=m(0)), finish_reason=m(1), stop_reason=m(2))
    chat = _ChunkTemplate(_chunk_dict(ChatCompletionChunk(id=rid, created=created, model=name, choices=[delta]), include_usage))
    for _ in range(200):
        text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(0, 6)))
        finish = rng.choice([None, "stop", "length"])
        stop = rng.choice([None, rng.randrange(0, 50000), "".join(rng.choice(_ALPHABET) for _ in range(3))])
        want = _sse(
            _chunk_dict(
                CompletionResponse(
                    id=rid, created=created, model=name, choices=[CompletionChoice(text=text, finish_reason=finish, stop_reason=stop)]
                ),
                include_usage,
            )
        )
        assert completion.fill(text, finish, stop) == want
        choice = ChatStreamChoice(delta=ChatResponseMessage(content=text), finish_reason=finish, stop_reason=stop)
        want = _sse(_chunk_dict(ChatCompletionChunk(id=rid, created=created, model=name, choices=[choice]), include_usage))
        assert chat.fill(text, finish, stop) == want
        event = json.loads(chat.fill(text, finish, stop)[len("data: ") :])
        assert event["choices"][0]["delta"]["content"] == text and ("usage" in event) == include_usage
