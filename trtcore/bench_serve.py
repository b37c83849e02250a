"""``trtcore bench serve``: a load generator against any OpenAI-compatible server.

It measures what ``vllm bench serve`` measures (``vllm/benchmarks/serve.py``), under the same
names, from the client's side of the HTTP connection:

* arrivals: request ``i`` is sent at ``sum(intervals[:i])`` seconds after the start, the
  intervals drawn from a gamma distribution of shape ``burstiness`` and scale ``1 /
  (request_rate * burstiness)`` (mean ``1 / request_rate``; burstiness 1 is a Poisson
  process, below 1 burstier, above 1 more regular); ``--request-rate inf`` sends all at
  once. ``--max-concurrency C`` lets at most ``C`` requests be in flight (a semaphore taken
  before a request is sent: a request waiting for it has not started);
* every request streams (``"stream": true``, ``"stream_options": {"include_usage": true}``);
  a *content chunk* is a server-sent event whose first choice carries non-empty ``text``
  (``/v1/completions``) or ``delta.content`` (``/v1/chat/completions``);
* per request: ``ttft`` = first content chunk - send time; ``itl`` = the gaps between
  consecutive content chunks; ``e2el`` = last content chunk - send time; ``tpot`` = (e2el -
  ttft) / (output_tokens - 1), for requests of more than one output token. ``output_tokens``
  is the server's ``usage.completion_tokens`` where it sends one, else the count of the
  generated text's tokens with ``--tokenizer``, else the count of content chunks; the input
  tokens likewise come from ``usage.prompt_tokens`` where given;
* over the run (``duration`` = first send to last response, seconds): ``request_throughput``
  (completed requests/s), ``output_throughput`` (output tokens/s), ``total_token_throughput``
  ((input + output tokens)/s), ``request_goodput`` (requests/s meeting every SLO of
  ``--goodput ttft:MS tpot:MS e2el:MS``: DistServe's goodput, as vLLM counts it); ``mean_`` /
  ``median_`` / ``p90_`` / ``p99_`` (``--metric-percentiles``) of ``ttft_ms``, ``tpot_ms``,
  ``itl_ms``, ``e2el_ms`` (:func:`trtcore.bench._summary`).

Prompts: ``--random-prompts`` (the default) of ``--input-len`` tokens: random token ids (of
tokens that are whole, visible text: no special token, no part of a character) decoded by ``--tokenizer`` (a model folder or ``tokenizer.json``) where given, re-drawn
until the text encodes back to ``--input-len`` tokens, else
``--input-len`` random common English words (about one token each: the exact count is the
server's ``usage.prompt_tokens``); or ``--dataset FILE``: JSON Lines of ``{"prompt": ...,
"output_len": N}`` (``output_len`` optional), or a ShareGPT JSON list (each conversation's
first turn is the prompt).

The server: ``--base-url`` its root (``http://host:port``; a trailing ``/v1`` is dropped); the
``OPENAI_API_KEY`` environment variable, where set, goes as ``Authorization: Bearer KEY`` with
every request (a server started with ``--api-key``), as ``vllm bench serve`` sends it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from .bench import QUANTITIES, _summary, pyplot
from .errors import InvalidArgumentError, TrtcoreError

__all__ = [
    "ENDPOINTS",
    "GOODPUT_METRICS",
    "Prompt",
    "RequestOutput",
    "add_bench_serve_parser",
    "base_url_root",
    "arrival_times",
    "benchmark",
    "calculate_metrics",
    "load_dataset",
    "parse_goodput",
    "plot",
    "print_report",
    "random_prompts",
    "serve",
]

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
#: the per-request quantities a ``--goodput`` SLO may bound (milliseconds)
GOODPUT_METRICS = ("ttft", "tpot", "e2el")

# Short, common English words: one token each in the usual BPE vocabularies, so that N of them
# make a prompt of about N tokens without a tokenizer.
_WORDS = (
    "the of and to in is was for on with as by at from that this it be are or an have not but had his her they "
    "which one you were all we she can there their been has when who will more no if out so said what up its about "
    "into than them only other new some could time these two may then do first any my now such like our over man "
    "me even most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work long get here"
).split()


@dataclass
class Prompt:
    """One request to send: its ``text``, its length in tokens where known (else the word
    count, until the server's usage says) and the tokens to generate (``max_tokens``)."""

    text: str
    prompt_len: int
    output_len: int


@dataclass
class RequestOutput:
    """What the client saw of one request (vLLM's ``RequestFuncOutput``); times in seconds
    of ``time.perf_counter()``, ``start`` relative to the benchmark's start."""

    prompt_len: int = 0
    output_tokens: int = 0
    start: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    success: bool = False
    error: str = ""
    generated_text: str = ""


def arrival_times(num_prompts: int, request_rate: float, burstiness: float = 1.0, rng: np.random.Generator | None = None) -> np.ndarray:
    """Send times (seconds after the start, float64, shape ``(num_prompts,)``, the first 0):
    cumulative gamma intervals of shape ``burstiness`` and scale ``1 / (request_rate *
    burstiness)`` (module docstring); all zeros for ``request_rate`` inf.

    Raises:
        InvalidArgumentError: ``request_rate`` or ``burstiness`` is not positive.
    """
    if not request_rate > 0:
        raise InvalidArgumentError(f"--request-rate must be > 0 or inf, got {request_rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise InvalidArgumentError(f"--burstiness must be a positive number, got {burstiness}")
    if math.isinf(request_rate):
        return np.zeros(num_prompts)
    rng = rng or np.random.default_rng()
    intervals = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_prompts)
    intervals[0] = 0.0  # the first request starts the clock
    return np.cumsum(intervals)


def _load_tokenizer(path: str) -> Any:
    from tokenizers import Tokenizer

    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise InvalidArgumentError(f"--tokenizer {path!r}: expected a tokenizer.json or a folder holding one")
    return Tokenizer.from_file(str(file))


def _is_text(raw: bytes) -> bool:
    try:
        return bool(raw.decode("utf-8").strip())
    except UnicodeDecodeError:
        return False


def _exact_length_text(tokenizer: Any, ordinary: np.ndarray, input_len: int, rng: np.random.Generator, tries: int = 16) -> tuple[str, int]:
    """A text of random tokens that encodes to ``input_len`` tokens (decoding random ids and
    encoding the text back merges or splits some, so the ids are re-drawn from the text's own
    encoding, cut or extended, until it holds; vLLM's random dataset does the same), and its
    token count (the closest reached after ``tries`` rounds)."""
    ids = rng.choice(ordinary, size=input_len).tolist()
    best: tuple[str, int] = ("", 0)
    for _ in range(tries):
        text = tokenizer.decode(ids)
        back = tokenizer.encode(text, add_special_tokens=False).ids
        if abs(len(back) - input_len) < abs(best[1] - input_len) or not best[0]:
            best = (text, len(back))
        if len(back) == input_len:
            break
        ids = back[:input_len] + rng.choice(ordinary, size=max(0, input_len - len(back))).tolist()
    return best


def random_prompts(num_prompts: int, input_len: int, output_len: int, rng: np.random.Generator, tokenizer: Any = None) -> list[Prompt]:
    """``num_prompts`` random prompts of ``input_len`` tokens (module docstring); ``tokenizer``
    a :class:`tokenizers.Tokenizer` or None."""
    if input_len < 1 or output_len < 1:
        raise InvalidArgumentError(f"--input-len and --output-len must be >= 1, got {input_len}, {output_len}")
    out = []
    ordinary = None
    if tokenizer is not None:
        # special tokens decode to nothing and part of a character to U+FFFD (which encodes to
        # other tokens): draw only tokens that are whole text
        from .token_bytes import token_bytes

        special = set(tokenizer.get_added_tokens_decoder())
        ordinary = np.array([i for i in range(tokenizer.get_vocab_size()) if i not in special and _is_text(token_bytes(tokenizer, i))])
    for _ in range(num_prompts):
        if ordinary is not None:
            text, n = _exact_length_text(tokenizer, ordinary, input_len, rng)
            out.append(Prompt(text, n, output_len))
        else:
            out.append(Prompt(" ".join(rng.choice(_WORDS, size=input_len).tolist()), input_len, output_len))
    return out


def base_url_root(base_url: str) -> str:
    """The server's root: ``base_url`` without a trailing ``/`` or ``/v1`` (``http://host:port/v1``,
    as OpenAI clients take it, names the same server as ``http://host:port``)."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


def load_dataset(path: str, num_prompts: int, output_len: int, tokenizer: Any = None) -> list[Prompt]:
    """The first ``num_prompts`` prompts of ``path``: JSON Lines of ``{"prompt", "output_len"?}``
    or a ShareGPT JSON list (module docstring); cycled when the file holds fewer.

    Raises:
        InvalidArgumentError: the file holds no prompt, an entry of another shape, or text
            that is not JSON (the message names the file and the line).
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        entries = data if isinstance(data, list) else [data]
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith("["):  # one JSON document (ShareGPT) with an error in it
            raise InvalidArgumentError(f"--dataset {path}: line {exc.lineno} is not valid JSON ({exc.msg})") from None
        entries = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    entries.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise InvalidArgumentError(
                        f"--dataset {path}: line {number} is not JSON ({err.msg}); expected JSON Lines or a JSON list"
                    ) from None
    prompts = []
    for i, e in enumerate(entries):
        if isinstance(e, dict) and isinstance(e.get("prompt"), str):
            prompt, n = e["prompt"], int(e.get("output_len", output_len))
        elif isinstance(e, dict) and e.get("conversations"):
            prompt, n = str(e["conversations"][0]["value"]), output_len
        else:
            raise InvalidArgumentError(f"--dataset {path}: entry {i} has neither a 'prompt' string nor 'conversations'")
        length = len(tokenizer.encode(prompt).ids) if tokenizer is not None else len(prompt.split())
        prompts.append(Prompt(prompt, length, n))
    if not prompts:
        raise InvalidArgumentError(f"--dataset {path}: no prompts")
    return [prompts[i % len(prompts)] for i in range(num_prompts)]


def parse_goodput(items: Sequence[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds).

    Raises:
        InvalidArgumentError: a name outside :data:`GOODPUT_METRICS` or a value that is not a
            non-negative number.
    """
    out: dict[str, float] = {}
    for item in items or ():
        name, _, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = -1.0
        if name not in GOODPUT_METRICS or ms < 0:
            raise InvalidArgumentError(f"--goodput {item!r}: expected NAME:MILLISECONDS with NAME one of {', '.join(GOODPUT_METRICS)}")
        out[name] = ms
    return out


def calculate_metrics(
    outputs: Sequence[RequestOutput], duration: float, goodput: dict[str, float] | None = None, percentiles: Sequence[float] = (90, 99)
) -> dict[str, Any]:
    """vLLM's serving metrics (module docstring) of ``outputs``, a run of ``duration`` seconds.

    Failed requests count in ``failed`` only. ``goodput`` maps names of
    :data:`GOODPUT_METRICS` to SLOs in milliseconds; a request is good when each of its
    values is at most its SLO (a request of one output token has ``tpot`` 0).
    """
    done = [o for o in outputs if o.success]
    per: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    good = 0
    for o in done:
        tpot = (o.latency - o.ttft) / (o.output_tokens - 1) if o.output_tokens > 1 else 0.0
        if o.output_tokens > 1:
            per["tpot"].append(tpot)
        per["ttft"].append(o.ttft)
        per["itl"].extend(o.itl)
        per["e2el"].append(o.latency)
        values = {"ttft": o.ttft, "tpot": tpot, "e2el": o.latency}
        good += all(values[k] * 1e3 <= slo for k, slo in (goodput or {}).items())
    total_input = sum(o.prompt_len for o in done)
    total_output = sum(o.output_tokens for o in done)

    def rate(n: float) -> float:
        return n / duration if duration > 0 else 0.0

    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(done),
        "failed": len(outputs) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": rate(len(done)),
        "request_goodput": rate(good) if goodput else None,
        "output_throughput": rate(total_output),
        "total_token_throughput": rate(total_input + total_output),
    }
    for q in QUANTITIES:
        out.update(_summary(q, per[q], percentiles))
    return out


def _payload(endpoint: str, model: str, prompt: Prompt, ignore_eos: bool, temperature: float) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}, "temperature": temperature}
    if endpoint == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": prompt.text}]
        body["max_completion_tokens"] = prompt.output_len
    else:
        body["prompt"] = prompt.text
        body["max_tokens"] = prompt.output_len
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM's (and trtcore serve's) extension of the OpenAI API
    return body


def _chunk_text(choice: dict[str, Any]) -> str:
    if "delta" in choice:
        return (choice["delta"] or {}).get("content") or ""
    return choice.get("text") or ""


async def _request(client: Any, url: str, body: dict[str, Any], prompt: Prompt, t0: float, tokenizer: Any) -> RequestOutput:
    """Send one streaming request and time its content chunks (module docstring)."""
    out = RequestOutput(prompt_len=prompt.prompt_len)
    chunks = 0
    usage: dict[str, Any] = {}
    text: list[str] = []
    st = time.perf_counter()
    out.start = st - t0
    last = st
    try:
        async with client.post(url, json=body) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.read()).decode(errors='replace')[:500]}"
                return out
            async for line in resp.content:  # one SSE line at a time, as bytes
                if not line.startswith(b"data:"):
                    continue  # blank separators, SSE comments and other fields
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    out.error = f"error event: {chunk['error']}"
                    return out
                if chunk.get("usage"):
                    usage = chunk["usage"]
                piece = _chunk_text(chunk["choices"][0]) if chunk.get("choices") else ""
                if not piece:
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    out.ttft = now - st
                else:
                    out.itl.append(now - last)
                last, chunks = now, chunks + 1
                text.append(piece)
    except Exception as exc:  # any transport or protocol failure is this request's error, not the run's
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    out.generated_text = "".join(text)
    out.latency = last - st
    if usage.get("prompt_tokens") is not None:
        out.prompt_len = int(usage["prompt_tokens"])
    if usage.get("completion_tokens") is not None:
        out.output_tokens = int(usage["completion_tokens"])
    elif tokenizer is not None:
        out.output_tokens = len(tokenizer.encode(out.generated_text, add_special_tokens=False).ids)
    else:
        out.output_tokens = chunks
    out.success = chunks > 0
    if not out.success:
        out.error = "the stream ended without content"
    return out


def _aiohttp() -> Any:
    """aiohttp, the load generator's HTTP client (as vLLM's ``bench serve``: its response
    parser and stream reader are compiled, so one client process keeps up with tens of
    thousands of SSE events a second, where httpx's pure-Python stack used a whole core at
    18k; ``bench/results/cpu-2026-12-02-serve-client/``)."""
    try:
        import aiohttp
    except ImportError as exc:
        raise TrtcoreError(f"trtcore bench serve needs aiohttp ({exc}); install it with: pip install 'trtcore[serve]'") from exc
    return aiohttp


async def _first_model(client: Any, base_url: str) -> str:
    """The first model of ``GET /v1/models``.

    Raises:
        TrtcoreError: nothing answers at ``base_url`` (no server there), or it lists no model.
    """
    try:
        async with client.get(f"{base_url}/v1/models") as resp:
            resp.raise_for_status()
            return str((await resp.json())["data"][0]["id"])
    except OSError as exc:  # aiohttp's ClientConnectorError: nothing listens there
        raise TrtcoreError(f"cannot connect to {base_url} ({type(exc).__name__}: {exc}); is the server running?") from exc
    except Exception as exc:
        raise TrtcoreError(f"{base_url}/v1/models gave no model ({type(exc).__name__}: {exc}); pass --model") from exc


@dataclass
class _Job:
    """What one load-generating process sends (picklable: it travels to worker processes)."""

    url: str
    model: str
    endpoint: str
    prompts: list[Prompt]
    sends: list[float]  # arrival offsets, seconds after the start
    max_concurrency: int | None
    ignore_eos: bool
    temperature: float
    tokenizer: Any
    timeout_s: float

    def share(self, i: int, n: int) -> _Job:
        """Worker ``i`` of ``n``'s part: every ``n``-th request from the ``i``-th, at its own
        arrival time, and its share of ``max_concurrency`` (the shares add up to it)."""
        c = self.max_concurrency
        share = None if c is None else c // n + (i < c % n)
        return dataclasses.replace(self, prompts=self.prompts[i::n], sends=self.sends[i::n], max_concurrency=share)


def _session(aiohttp: Any, timeout_s: float) -> Any:
    connector = aiohttp.TCPConnector(limit=0)  # no pool limit: the concurrency is the semaphore's
    key = os.environ.get("OPENAI_API_KEY")  # a server with an API key (trtcore serve --api-key), as vllm bench serve
    headers = {"Authorization": f"Bearer {key}"} if key else None
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers)


async def _send(client: Any, job: _Job, t0: float) -> tuple[list[RequestOutput], int]:
    """Send ``job``'s requests at ``t0`` plus their arrival times (``time.perf_counter()``
    seconds), at most ``max_concurrency`` in flight; their outputs in order and the most in
    flight at once."""
    semaphore = asyncio.Semaphore(job.max_concurrency) if job.max_concurrency else None
    in_flight, peak = 0, 0

    async def one(prompt: Prompt, at: float) -> RequestOutput:
        nonlocal in_flight, peak
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        body = _payload(job.endpoint, job.model, prompt, job.ignore_eos, job.temperature)
        if semaphore is not None:
            await semaphore.acquire()
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await _request(client, job.url, body, prompt, t0, job.tokenizer)
        finally:
            in_flight -= 1
            if semaphore is not None:
                semaphore.release()

    outputs = await asyncio.gather(*(one(p, at) for p, at in zip(job.prompts, job.sends)))
    return list(outputs), peak


def _worker(job: _Job, index: int, barrier: Any, results: Any) -> None:
    """A load-generating process: its own event loop and HTTP client; starts sending when
    every worker is ready (``barrier``), puts ``(index, t0, end, outputs, peak, cpu)`` or
    ``(index, error)`` on ``results`` (times: ``time.perf_counter()``, one clock for every
    process of the machine: ``CLOCK_MONOTONIC``)."""

    async def main() -> tuple[float, float, list[RequestOutput], int, float]:
        async with _session(_aiohttp(), job.timeout_s) as client:
            barrier.wait(timeout=120)
            t0, cpu0 = time.perf_counter(), time.process_time()
            outputs, peak = await _send(client, job, t0)
            return t0, time.perf_counter(), outputs, peak, time.process_time() - cpu0

    try:
        results.put((index, *asyncio.run(main())))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        results.put((index, f"{type(exc).__name__}: {exc}"))


def _run_workers(job: _Job, n: int) -> tuple[list[RequestOutput], int, float, float]:
    """``job`` over ``n`` worker processes (:meth:`_Job.share`); the outputs in the order of
    ``job.prompts`` with ``start`` relative to the common start (the first worker's), the sum of the workers'
    peaks in flight, the duration (common start to the last response) and the workers' CPU
    seconds while sending (their start-up left out).

    Raises:
        TrtcoreError: a worker failed or did not report within its timeout.
    """
    import multiprocessing as mp
    import queue

    ctx = mp.get_context("spawn")  # no fork of a process that may hold threads or an event loop
    barrier, results = ctx.Barrier(n + 1), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(job.share(i, n), i, barrier, results), daemon=True) for i in range(n)]
    for p in procs:
        p.start()
    try:
        try:
            barrier.wait(timeout=120)
        except Exception as exc:  # BrokenBarrierError: a worker died before it was ready
            raise TrtcoreError(f"a load-generating worker did not start: {type(exc).__name__}") from exc
        got: dict[int, tuple[Any, ...]] = {}
        while len(got) < n:
            try:
                item = results.get(timeout=job.timeout_s + 60)
            except queue.Empty:
                raise TrtcoreError(f"{n - len(got)} load-generating workers did not report in {job.timeout_s + 60:.0f} s") from None
            if len(item) == 2:
                raise TrtcoreError(f"load-generating worker {item[0]} failed: {item[1]}")
            got[item[0]] = item[1:]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    # the common start is the first worker's (the parent may run later than every worker after
    # the barrier on a busy machine: its own clock would date requests before their schedule)
    t0 = min(w[0] for w in got.values())
    outputs: list[RequestOutput | None] = [None] * len(job.prompts)
    peak, end, cpu = 0, t0, 0.0
    for i, (w0, w_end, outs, w_peak, w_cpu) in got.items():
        for k, o in enumerate(outs):
            o.start += w0 - t0
            outputs[i + k * n] = o
        peak += w_peak
        end = max(end, w_end)
        cpu += w_cpu
    return [o for o in outputs if o is not None], peak, end - t0, cpu


async def benchmark(
    base_url: str,
    prompts: Sequence[Prompt],
    *,
    model: str | None = None,
    endpoint: str = "/v1/completions",
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    goodput: dict[str, float] | None = None,
    percentiles: Sequence[float] = (90, 99),
    ignore_eos: bool = False,
    temperature: float = 0.0,
    seed: int = 0,
    tokenizer: Any = None,
    timeout_s: float = 6 * 3600,
    num_workers: int = 1,
) -> dict[str, Any]:
    """Send ``prompts`` to ``base_url + endpoint`` as the module docstring describes and return
    the report: the run's settings, :func:`calculate_metrics`'s metrics, ``max_concurrent_requests``
    (the most in flight at once) and per request ``input_lens``, ``output_lens``, ``start_times``,
    ``ttfts``, ``itls``, ``e2els`` (seconds) and ``errors``; ``client_cpu_s``: the CPU seconds
    the client's process(es) spent while sending (the load generator's own cost).

    ``num_workers`` > 1 spreads the requests over that many load-generating processes (each its
    own event loop and HTTP client; request ``i`` goes to worker ``i % num_workers`` at its
    own arrival time, and ``max_concurrency`` is split between them): one Python client
    process keeps up with about 30k streamed tokens a second per core (33 us of CPU a token,
    ``bench/results/cpu-2026-12-02-serve-client/``), so a faster server needs more than one to
    be measured rather than the client. ``max_concurrent_requests`` is then the sum of the
    workers' peaks.

    Raises:
        InvalidArgumentError: an unknown ``endpoint``, a ``max_concurrency`` or ``num_workers``
            below 1.
        TrtcoreError: aiohttp is missing, no ``model`` and the server lists none, or a worker
            process failed.
    """
    if endpoint not in ENDPOINTS:
        raise InvalidArgumentError(f"--endpoint {endpoint!r}: expected one of {', '.join(ENDPOINTS)}")
    if max_concurrency is not None and max_concurrency < 1:
        raise InvalidArgumentError(f"--max-concurrency must be >= 1, got {max_concurrency}")
    if num_workers < 1:
        raise InvalidArgumentError(f"--num-workers must be >= 1, got {num_workers}")
    aiohttp = _aiohttp()
    base_url = base_url_root(base_url)
    sends = [float(at) for at in arrival_times(len(prompts), request_rate, burstiness, np.random.default_rng(seed))]
    job = _Job(base_url + endpoint, "", endpoint, list(prompts), sends, max_concurrency, ignore_eos, temperature, tokenizer, timeout_s)
    workers = min(num_workers, len(prompts), max_concurrency or len(prompts))
    if workers <= 1:
        async with _session(aiohttp, timeout_s) as client:
            job.model = model or await _first_model(client, base_url)
            t0, cpu0 = time.perf_counter(), time.process_time()
            outputs, peak = await _send(client, job, t0)
            duration, client_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    else:
        async with _session(aiohttp, timeout_s) as client:
            job.model = model or await _first_model(client, base_url)
        outputs, peak, duration, client_cpu = await asyncio.get_running_loop().run_in_executor(None, _run_workers, job, workers)
    model = job.model
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "base_url": base_url,
        "endpoint": endpoint,
        "model_id": model,
        "num_prompts": len(prompts),
        "request_rate": "inf" if math.isinf(request_rate) else request_rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "goodput_slos_ms": goodput or None,
        **calculate_metrics(outputs, duration, goodput, percentiles),
        "max_concurrent_requests": peak,
        "num_workers": max(workers, 1),
        "client_cpu_s": client_cpu,
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": [o.output_tokens for o in outputs],
        "start_times": [o.start for o in outputs],
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "e2els": [o.latency for o in outputs],
        "errors": [o.error for o in outputs],
    }


_LABELS = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}


def print_report(report: dict[str, Any], file: Any = None) -> None:
    """The report as ``vllm bench serve`` prints it: counts, throughputs, then per quantity
    its mean, median and percentiles in milliseconds."""
    file = file or sys.stdout

    def line(label: str, value: Any) -> None:
        print(f"{label:<40}{value:<10.2f}" if isinstance(value, float) else f"{label:<40}{value!s:<10}", file=file)

    print(f"{' Serving Benchmark Result ':=^50}", file=file)
    line("Endpoint:", f"{report['base_url']}{report['endpoint']} ({report['model_id']})")
    line("Request rate (req/s):", report["request_rate"])
    line("Burstiness:", report["burstiness"])
    line("Maximum request concurrency:", report["max_concurrency"])
    line("Successful requests:", report["completed"])
    line("Failed requests:", report["failed"])
    line("Benchmark duration (s):", report["duration"])
    line("Total input tokens:", report["total_input_tokens"])
    line("Total generated tokens:", report["total_output_tokens"])
    line("Request throughput (req/s):", report["request_throughput"])
    if report["request_goodput"] is not None:
        line("Request goodput (req/s):", report["request_goodput"])
    line("Output token throughput (tok/s):", report["output_throughput"])
    line("Total Token throughput (tok/s):", report["total_token_throughput"])
    for q in QUANTITIES:
        print(f"{_LABELS[q]:-^50}", file=file)
        for key, value in report.items():
            if key.endswith(f"_{q}_ms"):
                stat = key.split("_", 1)[0]
                line(f"{stat.capitalize() if stat in ('mean', 'median') else stat.upper()} {q.upper()} (ms):", value * 1.0)
    print("=" * 50, file=file)
    first = next((e for e in report["errors"] if e), None)
    if first:
        print(f"first error: {first}", file=file)


def plot(report: dict[str, Any], path: str) -> None:
    """A latency plot into ``path``: per request TTFT and end-to-end latency against its send
    time, and the empirical CDFs of TTFT, TPOT, ITL and E2EL (milliseconds).

    Raises:
        TrtcoreError: matplotlib is not installed.
    """
    plt = pyplot()
    ok = [i for i, e in enumerate(report["errors"]) if not e]
    start = np.array([report["start_times"][i] for i in ok])
    ttft = np.array([report["ttfts"][i] for i in ok]) * 1e3
    e2el = np.array([report["e2els"][i] for i in ok]) * 1e3
    outs = np.array([report["output_lens"][i] for i in ok])
    series = {
        "TTFT": ttft,
        "TPOT": ((e2el - ttft) / np.maximum(outs - 1, 1))[outs > 1],
        "ITL": np.array([x for i in ok for x in report["itls"][i]]) * 1e3,
        "E2EL": e2el,
    }
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.scatter(start, ttft, s=8, label="TTFT")
    a.scatter(start, e2el, s=8, label="E2EL")
    a.set_xlabel("send time (s)")
    a.set_ylabel("ms")
    a.set_title("per request")
    a.legend()
    for name, v in series.items():
        if v.size:
            b.plot(np.sort(v), np.arange(1, v.size + 1) / v.size, label=name)
    b.set_xscale("log")
    b.set_xlabel("ms")
    b.set_ylabel("fraction")
    b.set_title("CDF")
    b.legend()
    rate = report["request_rate"]
    fig.suptitle(f"{report['model_id']}: {report['completed']} requests, rate {rate}, max concurrency {report['max_concurrency']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _rate(value: str) -> float:
    try:
        return float(value)  # "inf" parses too
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected requests/s or inf, got {value!r}") from None


def serve(args: argparse.Namespace) -> dict[str, Any]:
    """``trtcore bench serve`` (module docstring): runs the benchmark, prints the table, writes
    ``--json`` and ``--plot``; returns the report.

    Raises:
        InvalidArgumentError: a bad option value (named).
        TrtcoreError: no request completed (the first error is in the message).
    """
    if args.num_prompts < 1:
        raise InvalidArgumentError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    try:
        percentiles = [float(p) for p in args.metric_percentiles.split(",") if p.strip()]
    except ValueError:
        percentiles = [-1.0]
    if not all(0 <= p <= 100 for p in percentiles):
        raise InvalidArgumentError(f"--metric-percentiles must lie in [0, 100], got {args.metric_percentiles!r}")
    tokenizer = _load_tokenizer(args.tokenizer) if args.tokenizer else None
    rng = np.random.default_rng(args.seed)
    if args.dataset:
        prompts = load_dataset(args.dataset, args.num_prompts, args.output_len, tokenizer)
    else:
        prompts = random_prompts(args.num_prompts, args.input_len, args.output_len, rng, tokenizer)
    report = asyncio.run(
        benchmark(
            args.base_url,
            prompts,
            model=args.model,
            endpoint=args.endpoint,
            request_rate=args.request_rate,
            burstiness=args.burstiness,
            max_concurrency=args.max_concurrency,
            goodput=parse_goodput(args.goodput),
            percentiles=percentiles,
            ignore_eos=args.ignore_eos,
            temperature=args.temperature,
            seed=args.seed,
            tokenizer=tokenizer,
            num_workers=args.num_workers,
        )
    )
    print_report(report)
    if args.json:
        from .fileio import write_atomic

        write_atomic(args.json, (json.dumps(report, indent=1) + "\n").encode())
    if args.plot:
        plot(report, args.plot)
    if report["completed"] == 0:
        raise TrtcoreError(f"no request completed; first error: {next(e for e in report['errors'] if e)}")
    return report


def add_bench_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to ``trtcore bench``'s subparsers action ``sub`` (its handler is the
    ``handler`` default, returning 0); returns its parser."""
    p = sub.add_parser("serve", help="load-test an OpenAI-compatible server: TTFT / TPOT / ITL / goodput (vllm bench serve)")
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is dropped)")
    p.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    p.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS)
    p.add_argument("--num-prompts", type=int, default=100, help="requests (default 100)")
    p.add_argument("--request-rate", type=_rate, default=math.inf, help="mean requests/s of the arrivals, or inf: all at once (default inf)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival intervals: 1 = Poisson (default 1)")
    p.add_argument("--max-concurrency", type=int, help="at most this many requests in flight")
    p.add_argument("--num-workers", type=int, default=1, help="load-generating processes sharing the requests and --max-concurrency (default 1)")
    p.add_argument("--input-len", type=int, default=128, help="random prompts: tokens each (default 128)")
    p.add_argument("--output-len", type=int, default=128, help="max_tokens of each request (default 128)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--random-prompts", action="store_true", help="random prompts of --input-len tokens (the default)")
    src.add_argument("--dataset", help="JSON Lines of {prompt, output_len?}, or a ShareGPT JSON file")
    p.add_argument("--tokenizer", help="model folder or tokenizer.json: exact random prompt lengths, token counts without usage")
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM's extension): every request generates --output-len tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature sent (default 0: greedy)")
    p.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="SLOs for goodput: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--metric-percentiles", default="90,99", help="comma-separated percentiles reported (default 90,99)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and arrival times")
    p.add_argument("--json", help="write the report (with per-request times) to this JSON file")
    p.add_argument("--plot", help="latency plot into this image file (matplotlib)")
    p.set_defaults(handler=_handler)
    return p


def _handler(args: argparse.Namespace) -> int:
    serve(args)
    return 0
