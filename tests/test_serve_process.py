"""``trtcore serve``'s engine process, as a client and the operating system see it (a real
server on 127.0.0.1, the tiny llama of test_serve on the reference backend): the engine runs in
a child process of the server; an abort frees its KV blocks there (the metrics, which come from
the engine's step messages, show the blocks in use, then none); a killed engine process fails
the live streams at once (an error event, a 503), then the server shuts down by itself and
exits with status 1 and one stderr line naming the cause (a supervisor restarts it). The tests
run in file order; the kill is the last.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_serve import NAME, metrics, model, value  # noqa: F401  (fixture)

from trtcore.serve.process import ServerProcess


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``Z``: a zombie), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="module")
def server(model: Path) -> Any:  # noqa: F811
    args = ["--model", str(model), "--backend", "reference", "--max-seq-len", "256", "--served-model-name", NAME]
    s = ServerProcess(args).start()
    yield s
    s.stop()


def test_the_engine_runs_in_a_child_process(server: Any) -> None:
    assert server.engine_pid is not None, "".join(server.stderr_lines)
    assert server.engine_pid != server.process.pid
    assert parent_pid(server.engine_pid) == server.process.pid
    assert process_state(server.engine_pid) not in (None, "Z")


def test_an_abort_frees_the_blocks_in_the_engine_process(server: Any) -> None:
    body = {"model": NAME, "prompt": "the theory of", "max_tokens": 240, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as h, h.stream("POST", server.url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        for _ in range(3):
            assert next(line for line in lines if line).startswith("data: {")
        m = metrics(server)
        assert value(m, "trtcore:num_requests_running") == 1 and value(m, "trtcore:kv_cache_usage_perc") > 0
    deadline = time.monotonic() + 30
    while True:  # closed: the engine aborts it before its next step and reports the freed blocks
        m = metrics(server)
        if value(m, "trtcore:kv_cache_usage_perc") == 0 and value(m, "trtcore:num_requests_running") == 0:
            break
        assert time.monotonic() < deadline, "the engine process did not free the aborted request's blocks"
        time.sleep(0.02)
    assert value(m, "trtcore:request_success_total", finished_reason="abort") >= 1


def test_a_killed_engine_fails_the_live_streams_then_the_server_exits_1(server: Any) -> None:
    body = {"model": NAME, "prompt": "the theory of", "max_tokens": 240, "ignore_eos": True, "temperature": 0}
    with concurrent.futures.ThreadPoolExecutor(1) as pool, httpx.Client(timeout=30) as h:
        whole = pool.submit(h.post, server.url + "/v1/completions", json=body)  # a non-streamed request
        with h.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}) as r:
            lines = (line for line in r.iter_lines() if line)
            assert next(lines).startswith("data: {")
            deadline = time.monotonic() + 30
            while value(metrics(server), "trtcore:num_requests_running") < 2:
                assert time.monotonic() < deadline, "the two requests never ran together"
                time.sleep(0.01)
            killed = time.monotonic()
            os.kill(server.engine_pid, signal.SIGKILL)
            rest = list(lines)  # ends: an error event, then [DONE]
        assert time.monotonic() - killed < 10
        assert rest[-1] == "data: [DONE]" and '"error"' in rest[-2] and "engine process" in rest[-2], rest[-3:]
        r = whole.result()
        assert r.status_code == 503 and "engine process" in r.json()["error"]["message"], r.text
    assert server.health() in (503, None)  # 503 while it shuts down, then nothing answers
    try:  # exits by itself (no SIGTERM), non-zero, soon: docker run --restart / Kubernetes restart it
        status = server.process.wait(10)
    except subprocess.TimeoutExpired:
        pytest.fail("the server did not exit after its engine process died:\n" + "".join(server.stderr_lines))
    assert status == 1 and time.monotonic() - killed < 15, "".join(server.stderr_lines)
    deadline = time.monotonic() + 5
    while not (errors := [line for line in server.stderr_lines if line.startswith("trtcore: error: ")]) and time.monotonic() < deadline:
        time.sleep(0.05)  # the stderr reader thread takes the last lines
    assert len(errors) == 1 and f"engine process (pid {server.engine_pid}" in errors[0] and "exited unexpectedly" in errors[0], errors
    assert "Traceback" not in "".join(server.stderr_lines), "".join(server.stderr_lines)
    assert process_state(server.engine_pid) is None  # reaped
