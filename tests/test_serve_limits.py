"""``trtcore serve``'s limits as a client sees them (a real server process, its own options):
the batching window ``--max-queue-delay-ms``, a full waiting queue (429 with ``Retry-After``),
and the SIGTERM drain (a running stream completes, the process exits 0, its engine process is gone).

Server: at most 2 running (``--max-batch-size 2``), 2 waiting (``--max-waiting 2``), a 1 s
window. The tests run in file order; the drain is the last.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from test_serve import NAME, model  # noqa: F401  (fixture)
from test_serve_process import process_state

from trtcore.serve.process import ServerProcess

WINDOW_S = 1.0
LONG = {"max_tokens": 200, "temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(model: Path) -> Any:  # noqa: F811
    args = ["--model", str(model), "--backend", "reference", "--max-seq-len", "256", "--served-model-name", NAME]
    args += ["--max-batch-size", "2", "--max-waiting", "2", "--max-queue-delay-ms", str(WINDOW_S * 1000)]
    s = ServerProcess(args, new_session=True).start()  # its own process group: the drain signals all of it
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _timed(client: openai.OpenAI, prompt: str) -> float:
    t = time.perf_counter()
    client.completions.create(model=NAME, prompt=prompt, max_tokens=1, temperature=0)
    return time.perf_counter() - t


def test_the_window_holds_a_lone_request_and_releases_a_full_batch(client: openai.OpenAI) -> None:
    assert _timed(client, "alone") >= WINDOW_S  # one request of two slots waits out the window
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        times = list(pool.map(lambda p: _timed(client, p), ["one", "two"]))
    assert max(times) < WINDOW_S * 0.9, times  # two fill the batch: admitted at once


def test_a_full_queue_gets_429_and_the_server_goes_on(client: openai.OpenAI) -> None:
    running = [client.completions.create(model=NAME, prompt=p, stream=True, **LONG) for p in ("a", "b")]  # type: ignore[call-overload]
    for s in running:
        next(iter(s))  # both run (they filled the batch)
    waiting = [client.completions.create(model=NAME, prompt=p, stream=True, **LONG) for p in ("c", "d")]  # type: ignore[call-overload]
    with pytest.raises(openai.RateLimitError) as e:
        client.completions.create(model=NAME, prompt="x", max_tokens=2)
    assert e.value.response.status_code == 429 and e.value.response.headers["retry-after"] == "1"
    assert e.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    for s in [*running, *waiting]:
        s.close()  # gone: aborted
    deadline = time.monotonic() + 30
    while True:
        try:
            r = client.completions.create(model=NAME, prompt="e", max_tokens=2, temperature=0)
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert r.usage is not None and r.usage.completion_tokens == 2


def test_a_list_of_prompts_beyond_the_free_queue_gets_429_and_submits_none(server: Any, client: openai.OpenAI) -> None:
    """A list of K prompts is K requests for ``--max-waiting``. More than ``--max-waiting`` +
    ``--max-batch-size`` (5 > 2 + 2) can never be queued: 400 naming ``prompt`` (not a
    retry). With one request running (1 free batch slot, 2 waiting places) 4 prompts do
    not fit now: 429, none submitted; 4 fit and run on an idle server, each one request."""
    from test_serve import metrics, value

    def ended(m: dict[Any, float]) -> float:
        return sum(value(m, "trtcore:request_success_total", finished_reason=r) for r in ("stop", "length", "abort")) + value(
            m, "trtcore:request_failure_total"
        )

    before = metrics(server)
    with pytest.raises(openai.BadRequestError) as never:
        client.completions.create(model=NAME, prompt=["a", "b", "c", "d", "e"], max_tokens=1, temperature=0)
    assert never.value.body["param"] == "prompt" and "can never be queued" in never.value.body["message"]  # type: ignore[index]
    running = client.completions.create(model=NAME, prompt="busy", stream=True, **LONG)  # type: ignore[call-overload]
    next(iter(running))
    with pytest.raises(openai.RateLimitError) as e:
        client.completions.create(model=NAME, prompt=["a", "b", "c", "d"], max_tokens=1, temperature=0)
    assert e.value.response.status_code == 429 and e.value.response.headers["retry-after"] == "1"
    assert e.value.body["code"] == "rate_limit_exceeded" and "none was queued" in e.value.body["message"]  # type: ignore[index]
    running.close()  # aborted: one request ended
    deadline = time.monotonic() + 30
    while True:  # the abort reaches the engine
        try:
            r = client.completions.create(model=NAME, prompt=["a", "b", "c", "d"], max_tokens=1, temperature=0)
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert [c.index for c in r.choices] == [0, 1, 2, 3] and r.usage is not None and r.usage.completion_tokens == 4
    after = metrics(server)
    assert ended(after) - ended(before) == 5  # the refused lists submitted nothing: the busy request + 4
    assert value(after, "trtcore:generation_tokens_total") - value(before, "trtcore:generation_tokens_total") >= 4


def test_sigterm_drains(server: Any, client: openai.OpenAI) -> None:
    """SIGTERM to the server's whole process group (``timeout``, systemd's default
    ``KillMode=control-group``, ``kill -- -PGID``), so the engine process gets it too: the
    running stream still completes and the server exits 0 (the engine process used to die
    of it, failing the stream with a 503 and the server with status 1)."""
    stream = client.completions.create(model=NAME, prompt="drain", stream=True, stream_options={"include_usage": True}, **LONG)  # type: ignore[call-overload]
    chunks = iter(stream)
    got = [next(chunks)]
    engine = server.engine_pid
    assert engine is not None and process_state(engine) not in (None, "Z")
    assert os.getpgid(engine) == server.process.pid  # the engine is in the server's group
    os.killpg(server.process.pid, signal.SIGTERM)
    time.sleep(0.3)
    assert server.health() in (503, None)  # draining, or no longer listening
    got += list(chunks)
    assert [c.choices[0].finish_reason for c in got if c.choices][-1] == "length"
    assert got[-1].usage is not None and got[-1].usage.completion_tokens == 200
    assert server.process.wait(60) == 0, "".join(server.stderr_lines)
    assert process_state(engine) is None  # it exited and the server reaped it


@pytest.mark.parametrize(("flag", "value"), [("--max-waiting", "0"), ("--max-queue-delay-ms", "-1")])
def test_bad_serve_flags_are_refused_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    """``--max-waiting 0`` would refuse every request (a new request waits until the scheduler
    takes it): the command refuses it, naming the flag, without loading anything."""
    from trtcore.cli import main

    assert main(["serve", "--model", str(tmp_path / "absent"), flag, value]) != 0
    assert flag in capsys.readouterr().err


def test_max_tokens_beyond_the_kv_cache_is_refused_before_a_stream_starts() -> None:
    """A request needs up to ``prompt + max_tokens - 1`` KV tokens: one that can never fit
    the pool (here 100 tokens, a context of 256) is a 400 naming ``max_tokens`` (it used to be
    accepted, then fail inside the stream); unset, ``max_tokens`` fills what fits."""
    from types import SimpleNamespace

    from trtcore.serve.app import ApiError, _Served
    from trtcore.serve.core import ServedModel

    described = ServedModel("m", vocab_size=10, max_seq_len=256, max_batch_size=2, kv_cache_tokens=100)
    served = _Served(SimpleNamespace(ready=True, model=described), NAME)  # type: ignore[arg-type]
    assert served.max_tokens(91, None, 10, "max_tokens") == 91  # 10 + 91 - 1 = 100 KV tokens: fits
    with pytest.raises(ApiError) as e:
        served.max_tokens(92, None, 10, "max_tokens")
    assert e.value.status == 400 and e.value.info.param == "max_tokens" and "KV cache holds 100" in str(e.value)
    assert served.max_tokens(None, None, 10, "max_tokens") == 91
    with pytest.raises(ApiError, match="maximum context length is 256"):
        served.max_tokens(247, None, 10, "max_tokens")
    unknown = _Served(SimpleNamespace(ready=True, model=ServedModel("m", 10, 256, 2)), NAME)  # type: ignore[arg-type]
    assert unknown.max_tokens(None, None, 10, "max_tokens") == 246


def test_a_port_in_use_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--port`` that another process listens on: exit 2 with ``trtcore: error: cannot listen
    on ...`` before the engine starts (it was an OSError traceback and exit status 1, the
    status that means "the engine died")."""
    import socket

    from trtcore.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--model", str(tmp_path), "--backend", "reference", "--host", "127.0.0.1", "--port", str(port)]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--model", "--engine"])
def test_a_missing_model_or_engine_fails_before_listening(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """``serve --model absent`` (or ``--engine``): exit 2 with a one-line error naming the flag and
    the path, before any port is taken or address announced (it used to listen, announce the
    address, and only then fail to load in the engine process)."""
    from trtcore.cli import main
    from trtcore.serve.server import LISTENING

    absent = tmp_path / "absent"
    assert main(["serve", flag, str(absent), "--backend", "reference", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} {absent}: no such file or folder" in err and "Traceback" not in err
    assert LISTENING not in err
