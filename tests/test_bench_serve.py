"""``trtcore bench serve`` (trtcore.bench_serve) against a fake OpenAI-compatible server.

The fake server (asyncio streams in a thread of this process, so its ``time.perf_counter``
is the client's clock) answers every streaming request after a known delay with known
chunks at known gaps, and records when it received each request, when it sent each chunk
and how many requests were in flight: the client's metrics are checked against those times
and against their definitions computed here with NumPy.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

from trtcore import bench_serve as bs
from trtcore.cli import main
from trtcore.errors import InvalidArgumentError

# the client's timestamps trail the server's by scheduling and socket latency (2 shared cores)
SLACK_S = 0.1


@dataclass
class Fake:
    """Settings and records of the fake server."""

    first_delay: float = 0.05  # seconds from receiving a request to its first content chunk
    gap: float = 0.02  # seconds between content chunks
    chunks: int = 5
    tokens_per_chunk: int = 1  # usage.completion_tokens = chunks * tokens_per_chunk
    usage: bool = True
    slow_every: int = 0  # every slow_every-th request (0: none) waits slow_delay instead
    slow_delay: float = 0.6
    model: str = "fake-model"
    records: list[dict] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    port: int = 0


async def _handle(fake: Fake, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    method, path, _ = head.split("\r\n", 1)[0].split(" ")
    length = next((int(h.split(":")[1]) for h in head.split("\r\n") if h.lower().startswith("content-length:")), 0)
    body = json.loads(await reader.readexactly(length)) if length else {}
    recv = time.perf_counter()

    async def send(status: str, ctype: str, payload: bytes) -> None:
        writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        await writer.drain()

    if method == "GET" and path == "/v1/models":
        await send("200 OK", "application/json", json.dumps({"object": "list", "data": [{"id": fake.model, "object": "model"}]}).encode())
    elif method != "POST" or path not in bs.ENDPOINTS:
        await send("404 Not Found", "application/json", b'{"error": {"message": "no such route"}}')
    elif "FAIL" in (body.get("prompt") or body.get("messages", [{}])[0].get("content", "")):
        await send("400 Bad Request", "application/json", b'{"error": {"message": "bad prompt", "type": "invalid_request_error"}}')
    else:
        index = len(fake.records)
        record = {"recv": recv, "sent": [], "body": body, "head": head}
        fake.records.append(record)
        fake.in_flight += 1
        fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        chat = path == "/v1/chat/completions"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")

        async def event(obj: dict | str) -> None:
            writer.write(f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode())
            await writer.drain()

        if chat:  # the role chunk comes at once and carries no content: not a token
            await event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        slow = fake.slow_every and index % fake.slow_every == 0
        await asyncio.sleep(fake.slow_delay if slow else fake.first_delay)
        for k in range(fake.chunks):
            if k:
                await asyncio.sleep(fake.gap)
            piece = {"delta": {"content": f" t{k}"}} if chat else {"text": f" t{k}"}
            await event({"choices": [{"index": 0, **piece}]})
            record["sent"].append(time.perf_counter())
        if fake.usage:
            n = fake.chunks * fake.tokens_per_chunk
            await event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}})
        await event("[DONE]")
        fake.in_flight -= 1  # before any await: the client cannot have sent its next request yet
    writer.close()


@pytest.fixture
def fake():
    """A running fake server (:class:`Fake`; change its settings before sending)."""
    state = Fake()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    async def start() -> None:
        box["server"] = await asyncio.start_server(lambda r, w: _handle(state, r, w), "127.0.0.1", 0)
        state.port = box["server"].sockets[0].getsockname()[1]
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    yield state

    async def stop() -> None:
        box["server"].close()
        await box["server"].wait_closed()

    asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _url(fake: Fake) -> str:
    return f"http://127.0.0.1:{fake.port}"


def _run(fake: Fake, n: int = 6, **kw) -> dict:
    prompts = kw.pop("prompts", None) or bs.random_prompts(n, 16, fake.chunks, np.random.default_rng(1))
    return asyncio.run(bs.benchmark(_url(fake), prompts, **kw))


def _reference_summary(values_s, name, percentiles=(90, 99)) -> dict:
    ms = np.asarray(values_s, dtype=np.float64) * 1e3
    out = {f"mean_{name}_ms": ms.mean(), f"median_{name}_ms": np.median(ms)}
    out.update({f"p{q}_{name}_ms": np.percentile(ms, q) for q in percentiles})
    return out


@pytest.mark.parametrize(("endpoint", "workers"), [(bs.ENDPOINTS[0], 1), (bs.ENDPOINTS[1], 1), (bs.ENDPOINTS[0], 3)])
def test_times_match_the_servers_chunks(fake, endpoint, workers):
    """TTFT, ITL and E2EL equal the server's send times (within the socket's latency); the
    chat role chunk (no content) is not the first token; usage gives the token counts. With
    3 load-generating processes the same (their clock is this process's: CLOCK_MONOTONIC)."""
    fake.tokens_per_chunk = 2  # usage says twice the chunks: TPOT divides by usage tokens - 1
    r = _run(fake, 6, endpoint=endpoint, num_workers=workers)
    assert r["num_workers"] == workers and 0 < r["client_cpu_s"] < r["duration"] * workers + 1
    assert r["completed"] == 6 and r["failed"] == 0 and len(fake.records) == 6
    assert r["model_id"] == "fake-model"  # from GET /v1/models
    assert r["output_lens"] == [10] * 6 and r["input_lens"] == [7] * 6  # usage, not chunk or word counts
    assert r["total_output_tokens"] == 60 and r["total_input_tokens"] == 42
    # pair client and server records by the prompt sent
    by_prompt = {json.dumps(rec["body"].get("prompt") or rec["body"]["messages"]): rec for rec in fake.records}
    assert len(by_prompt) == 6
    for rec in fake.records:
        assert rec["body"]["stream"] is True and rec["body"]["stream_options"] == {"include_usage": True}
        assert rec["body"].get("max_tokens" if endpoint == "/v1/completions" else "max_completion_tokens") == fake.chunks
    for i in range(6):
        ttft, e2el, itl = r["ttfts"][i], r["e2els"][i], r["itls"][i]
        rec = min(fake.records, key=lambda rec: abs(rec["sent"][0] - (r["start_times"][i] + ttft)))  # the stream it read
        sent = np.array(rec["sent"])
        # sent at start, received after the server's first chunk: TTFT >= the server's delay
        assert ttft >= fake.first_delay
        assert ttft <= sent[0] - rec["recv"] + SLACK_S
        assert len(itl) == fake.chunks - 1
        np.testing.assert_allclose(itl, np.diff(sent), atol=SLACK_S)
        assert math.isclose(sum(itl), e2el - ttft, rel_tol=1e-9, abs_tol=1e-12)  # ITLs tile the decode time
    tpots = [(e - t) / (10 - 1) for e, t in zip(r["e2els"], r["ttfts"])]
    for q, v in _reference_summary(tpots, "tpot").items():
        assert math.isclose(r[q], v, rel_tol=1e-9), q


@pytest.mark.parametrize("workers", [1, 2])
def test_aggregates_follow_their_definitions(fake, workers):
    """Means, medians and percentiles of the per-request arrays (NumPy, here); throughputs over
    the duration; percentiles ordered."""
    r = _run(fake, 8, max_concurrency=4, num_workers=workers)
    itl = [x for xs in r["itls"] for x in xs]
    per = {"ttft": r["ttfts"], "itl": itl, "e2el": r["e2els"]}
    for name, values in per.items():
        ref = _reference_summary(values, name)
        for q, v in ref.items():
            assert math.isclose(r[q], v, rel_tol=1e-9), q
        assert r[f"median_{name}_ms"] <= r[f"p90_{name}_ms"] <= r[f"p99_{name}_ms"] <= 1e3 * max(values)
    assert math.isclose(r["request_throughput"], 8 / r["duration"])
    assert math.isclose(r["output_throughput"], sum(r["output_lens"]) / r["duration"])
    assert math.isclose(r["total_token_throughput"], (sum(r["output_lens"]) + sum(r["input_lens"])) / r["duration"])
    # the run lasts at least from the first send to the last response
    ends = [s + e for s, e in zip(r["start_times"], r["e2els"])]
    assert max(ends) <= r["duration"] < max(ends) + SLACK_S + 0.5
    assert r["request_goodput"] is None


def test_calculate_metrics_random_records():
    """calculate_metrics on random request records against the definitions in NumPy."""
    rng = np.random.default_rng(7)
    outs = []
    for _ in range(50):
        n = int(rng.integers(1, 20))
        itl = rng.exponential(0.02, size=n - 1).tolist()
        ttft = float(rng.exponential(0.2))
        outs.append(
            bs.RequestOutput(prompt_len=int(rng.integers(1, 100)), output_tokens=n, ttft=ttft, itl=itl, latency=ttft + sum(itl), success=True)
        )
    outs.append(bs.RequestOutput(prompt_len=5, error="HTTP 500"))
    slo = {"ttft": 200.0, "tpot": 25.0}
    m = bs.calculate_metrics(outs, 3.0, slo, percentiles=(50, 90, 99))
    ok = outs[:-1]
    tpot = np.array([(o.latency - o.ttft) / (o.output_tokens - 1) if o.output_tokens > 1 else 0.0 for o in ok])
    ttft = np.array([o.ttft for o in ok])
    good = int(np.sum((ttft * 1e3 <= 200.0) & (tpot * 1e3 <= 25.0)))
    assert 0 < good < 50
    assert m["completed"] == 50 and m["failed"] == 1
    assert m["request_goodput"] == pytest.approx(good / 3.0)
    assert m["total_input_tokens"] == sum(o.prompt_len for o in ok)
    multi = [o for o in ok if o.output_tokens > 1]
    ref = _reference_summary([(o.latency - o.ttft) / (o.output_tokens - 1) for o in multi], "tpot", (50, 90, 99))
    ref |= _reference_summary(ttft, "ttft", (50, 90, 99)) | _reference_summary([x for o in ok for x in o.itl], "itl", (50, 90, 99))
    for q, v in ref.items():
        assert m[q] == pytest.approx(v, rel=1e-12), q
    assert m["p50_tpot_ms"] == pytest.approx(m["median_tpot_ms"])


def test_goodput_counts_requests_within_the_slos(fake):
    """Every third request waits 0.6 s before its first chunk (the others 0.05 s): with a
    300 ms TTFT SLO exactly the others are good."""
    fake.slow_every = 3
    r = _run(fake, 9, max_concurrency=3, goodput=bs.parse_goodput(["ttft:300"]))
    slow = sum(1 for i in range(9) if i % 3 == 0)
    assert r["request_goodput"] * r["duration"] == pytest.approx(9 - slow)
    assert sorted(r["ttfts"])[-slow] >= fake.slow_delay


@pytest.mark.parametrize("workers", [1, 2])
def test_max_concurrency_is_respected(fake, workers):
    """The server never sees more than --max-concurrency requests at once, and sees that many
    (2 workers: shares of 2 and 1)."""
    r = _run(fake, 12, max_concurrency=3, num_workers=workers)
    assert r["completed"] == 12 and len(fake.records) == 12
    assert fake.max_in_flight == 3 and r["max_concurrent_requests"] == 3


def test_unbounded_rate_sends_all_at_once(fake):
    r = _run(fake, 10)
    assert fake.max_in_flight == 10
    assert max(r["start_times"]) < SLACK_S + 0.2  # nothing waited for an arrival or a slot


@pytest.mark.parametrize("workers", [1, 3])
def test_requests_follow_the_arrival_schedule(fake, workers):
    """Each request is sent at its Poisson arrival time (seeded), not before; spread over 3
    processes, each keeps its own time and comes back in its place."""
    rate, n, seed = 20.0, 12, 5
    r = _run(fake, n, request_rate=rate, seed=seed, num_workers=workers)
    expected = bs.arrival_times(n, rate, 1.0, np.random.default_rng(seed))
    starts = np.array(r["start_times"])
    assert np.all(starts >= expected - 1e-3)
    np.testing.assert_allclose(starts, expected, atol=SLACK_S)


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_arrival_intervals_have_the_mean_rate_and_burstiness(burstiness):
    """Gamma(shape=burstiness, scale=1/(rate*burstiness)) intervals: mean 1/rate, squared
    coefficient of variation 1/burstiness (1 for Poisson), each within 5 standard errors."""
    rate, n = 8.0, 40000
    t = bs.arrival_times(n + 1, rate, burstiness, np.random.default_rng(11))
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    mean, var = 1 / rate, 1 / (rate**2 * burstiness)
    assert abs(gaps.mean() - mean) < 5 * math.sqrt(var / n)
    cv2 = gaps.var() / gaps.mean() ** 2
    # var of the sample variance of a gamma(k): (mu4 - var^2) / n, mu4 = (3k^2 + 6k) scale^4
    k, scale = burstiness, 1 / (rate * burstiness)
    se_var = math.sqrt(((3 * k**2 + 6 * k) * scale**4 - var**2) / n)
    assert abs(cv2 - 1 / burstiness) < 5 * se_var / mean**2 + 0.02
    # Poisson: the count of arrivals in unit windows has variance = mean
    if burstiness == 1.0:
        counts = np.bincount(t.astype(int))[:-1]
        assert abs(counts.var() / counts.mean() - 1) < 0.1


def test_arrival_times_bad_input():
    assert np.all(bs.arrival_times(4, math.inf) == 0)
    with pytest.raises(InvalidArgumentError, match="request-rate"):
        bs.arrival_times(4, 0.0)
    with pytest.raises(InvalidArgumentError, match="burstiness"):
        bs.arrival_times(4, 1.0, -1.0)


def test_failed_requests_and_dataset(fake, tmp_path):
    """Dataset prompts are sent in order (cycled); a 400 is a failed request with its message;
    output tokens are the content chunks when the server sends no usage."""
    fake.usage = False
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps(e) for e in [{"prompt": "a b c", "output_len": 3}, {"prompt": "FAIL now"}, {"prompt": "x y"}]))
    prompts = bs.load_dataset(str(data), 6, output_len=9)
    assert [(p.text, p.prompt_len, p.output_len) for p in prompts[:3]] == [("a b c", 3, 3), ("FAIL now", 2, 9), ("x y", 2, 9)]
    r = _run(fake, prompts=prompts)
    assert r["completed"] == 4 and r["failed"] == 2 and len(fake.records) == 4
    assert [e.startswith("HTTP 400") and "bad prompt" in e for e in r["errors"]] == [False, True, False] * 2
    assert r["output_lens"][0] == fake.chunks and r["input_lens"][0] == 3  # chunk and word counts
    assert r["total_output_tokens"] == 4 * fake.chunks


def test_sharegpt_dataset(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello"}]}]))
    assert [(p.text, p.output_len) for p in bs.load_dataset(str(f), 2, 4)] == [("hi there", 4)] * 2
    f.write_text(json.dumps([{"text": 1}]))
    with pytest.raises(InvalidArgumentError, match="entry 0"):
        bs.load_dataset(str(f), 1, 4)


def test_parse_goodput():
    assert bs.parse_goodput(["ttft:500", "tpot:50", "e2el:2000"]) == {"ttft": 500.0, "tpot": 50.0, "e2el": 2000.0}
    for bad in ("itl:5", "ttft", "ttft:-1", "ttft:x"):
        with pytest.raises(InvalidArgumentError, match="goodput"):
            bs.parse_goodput([bad])


def test_cli_prints_table_and_writes_json_and_plot(fake, tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    argv = ["bench", "serve", "--base-url", _url(fake), "--num-prompts", "5", "--max-concurrency", "2", "--input-len", "8"]
    argv += ["--output-len", "5", "--goodput", "ttft:1000", "tpot:1000", "--json", str(out), "--plot", str(png), "--endpoint", "/v1/chat/completions"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "Serving Benchmark Result" in text and "Successful requests:" in text and "P99 TTFT (ms):" in text and "P90 ITL (ms):" in text
    report = json.loads(out.read_text())
    assert report["completed"] == 5 and report["request_goodput"] == pytest.approx(5 / report["duration"])
    assert report["endpoint"] == "/v1/chat/completions" and report["max_concurrency"] == 2
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert all(len(rec["body"]["messages"][0]["content"].split()) == 8 for rec in fake.records)


def test_cli_errors(fake, capsys):
    fake.model = "m"
    assert main(["bench", "serve", "--base-url", _url(fake), "--num-prompts", "0"]) == 2
    assert "--num-prompts" in capsys.readouterr().err
    for bad in ("90,x", "101"):
        assert main(["bench", "serve", "--base-url", _url(fake), "--metric-percentiles", bad]) == 2
        assert "--metric-percentiles" in capsys.readouterr().err
    assert main(["bench", "serve", "--base-url", _url(fake), "--max-concurrency", "0"]) == 2
    assert "--max-concurrency" in capsys.readouterr().err
    assert main(["bench", "serve", "--base-url", _url(fake), "--num-workers", "0"]) == 2
    assert "--num-workers" in capsys.readouterr().err
    # nothing listens on port 1: every request fails, the run is an error naming the first
    assert main(["bench", "serve", "--base-url", "http://127.0.0.1:1", "--model", "m", "--num-prompts", "2"]) == 2
    assert "no request completed" in capsys.readouterr().err


def test_a_dataset_line_that_is_not_json_is_one_error_line(fake, tmp_path, capsys):
    """A JSON Lines file with a broken line: ``trtcore: error:`` naming the file and the line
    (1-based, blank lines counted), no traceback; a broken JSON document names its line too."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a b"}\n\n{"prompt": "c d"\n{"prompt": "e"}\n')
    with pytest.raises(InvalidArgumentError, match=r"d\.jsonl.*line 3"):
        bs.load_dataset(str(data), 2, 4)
    assert main(["bench", "serve", "--base-url", _url(fake), "--model", "m", "--dataset", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trtcore: error: --dataset ") and "line 3" in err and str(data) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    doc = tmp_path / "s.json"
    doc.write_text('[\n  {"conversations": [{"value": "hi"}]},\n  {"conversations": ]\n]\n')
    with pytest.raises(InvalidArgumentError, match=r"s\.json.*line 3"):
        bs.load_dataset(str(doc), 1, 4)


@pytest.mark.parametrize("suffix", ["/v1", "/v1/", "/"])
def test_a_base_url_ending_in_v1_works_as_the_bare_one(fake, suffix):
    """``--base-url http://host:port/v1`` (as OpenAI clients take it) sends to the same routes."""
    r = asyncio.run(bs.benchmark(_url(fake) + suffix, bs.random_prompts(2, 8, fake.chunks, np.random.default_rng(1))))
    assert r["completed"] == 2 and r["failed"] == 0 and r["model_id"] == fake.model
    assert r["base_url"] == _url(fake)


def test_openai_api_key_goes_as_the_bearer_token(fake, monkeypatch):
    """``OPENAI_API_KEY`` (a server with ``--api-key``) goes with every request, as vllm bench serve sends it."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-bench")
    r = _run(fake, n=2)
    assert r["completed"] == 2 and all("\r\nauthorization: bearer sk-bench\r\n" in rec["head"].lower() for rec in fake.records)
    monkeypatch.delenv("OPENAI_API_KEY")
    fake.records.clear()
    _run(fake, n=1)
    assert "authorization:" not in fake.records[0]["head"].lower()
