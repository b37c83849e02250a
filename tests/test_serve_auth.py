"""``trtcore serve --api-key`` / ``TRTCORE_API_KEY`` (:mod:`trtcore.serve.auth`).

* The application in this process (httpx's ASGI transport, an engine never started: the
  model "loads" forever, so a request that passes the check gets 503, one that does not 401):
  every ``/v1`` route needs ``Authorization: Bearer KEY``, else 401 with OpenAI's error body
  (``invalid_request_error`` / ``invalid_api_key``) that never echoes a key; ``/health`` (GET
  and HEAD), ``/metrics`` and ``/version`` stay open; the key is compared with
  :func:`hmac.compare_digest`; no key, no check.
* Where the key comes from: ``--api-key``, else the environment variable; an empty
  ``--api-key`` is refused.
* A real server process with the key in its environment and the official ``openai`` client:
  the right key is served, a wrong one is ``openai.AuthenticationError``; the key is nowhere
  in the server's stderr (``--log-level info``).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from test_serve import NAME, model  # noqa: F401  (fixture)

import trtcore
from trtcore.cli import main
from trtcore.errors import InvalidArgumentError
from trtcore.serve import auth
from trtcore.serve.app import CorsPolicy, build_app
from trtcore.serve.engine import AsyncEngine
from trtcore.serve.metrics import ServerMetrics
from trtcore.serve.process import ServerProcess
from trtcore.serve.server import api_key_of, cors_policy_of

KEY = "sk-test-7f3a9c2e-not-a-real-key"
V1 = [
    ("GET", "/v1/models"),
    ("GET", f"/v1/models/{NAME}"),
    ("GET", "/v1/models/other"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/no-such-route"),
    ("GET", "/v1"),
]
BODY = {"model": NAME, "prompt": "x", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}


def _app(api_key: str | None) -> Any:
    engine = AsyncEngine(lambda: None, ServerMetrics(NAME), in_process=True)  # never started: "loading"
    return build_app(engine, NAME, api_key=api_key)


def _request(app: Any, method: str, path: str, authorization: str | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        headers = {"Authorization": authorization} if authorization is not None else {}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.request(method, path, headers=headers, json=BODY if method == "POST" else None)

    return asyncio.run(go())


@pytest.mark.parametrize(("method", "path"), V1)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Bearer {KEY}x", f"Basic {KEY}", KEY, "Bearer ", f"Bearer{KEY}"])
def test_a_v1_route_without_the_key_is_401_in_openais_shape(method: str, path: str, authorization: str | None) -> None:
    r = _request(_app(KEY), method, path, authorization)
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key" and error["param"] is None
    assert "API key" in error["message"] and KEY not in r.text and "wrong" not in r.text
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path"), V1)
@pytest.mark.parametrize("authorization", [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER  {KEY} "])
def test_the_right_key_passes(method: str, path: str, authorization: str) -> None:
    r = _request(_app(KEY), method, path, authorization)
    assert r.status_code != 401, r.text  # 503 (loading), 404 (another model, no route)
    assert r.status_code in (404, 503), r.text


@pytest.mark.parametrize("api_key", [KEY, None])
def test_health_metrics_and_version_stay_open(api_key: str | None) -> None:
    app = _app(api_key)
    for method in ("GET", "HEAD"):
        r = _request(app, method, "/health")
        assert r.status_code == 503 and r.content == b""  # loading
    r = _request(app, "GET", "/metrics")
    assert r.status_code == 200 and "trtcore:" in r.text
    r = _request(app, "GET", "/version")
    assert r.status_code == 200 and r.json() == {"version": trtcore.__version__}


def test_no_key_no_check() -> None:
    app = _app(None)
    assert _request(app, "GET", "/v1/models").status_code == 503
    assert _request(app, "GET", "/v1/models", "Bearer anything").status_code == 503
    assert _request(_app(""), "GET", "/v1/models").status_code == 503


def test_the_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", compare)
    app = _app(KEY)
    assert _request(app, "GET", "/v1/models", f"Bearer {KEY}").status_code == 503
    assert _request(app, "GET", "/v1/models", "Bearer short").status_code == 401
    assert len(calls) == 2 and all(len(a) == len(b) == 32 for a, b in calls)  # SHA-256 digests: the length leaks nothing


def _send(app: Any, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.request(method, path, headers=headers)

    return asyncio.run(go())


@pytest.mark.parametrize("api_key", [None, KEY])
def test_browser_clients_get_cors_answers(api_key: str | None) -> None:
    """A browser's preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-*``) is
    answered 200 with the allow headers, before any key is asked for, and every answer (a 401
    too) allows the origin: vLLM's defaults (a helper's trial: the preflight got 405 and no
    answer had an ``Access-Control-*`` header, so Open WebUI's direct connections failed)."""
    app = _app(api_key)
    origin = "http://localhost:3000"
    pre = _send(app, "OPTIONS", "/v1/chat/completions", {
        "Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type",
    })  # fmt: skip
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] in ("*", origin)
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    r = _send(app, "GET", "/v1/models", {"Origin": origin})
    assert r.status_code == (401 if api_key else 503) and r.headers["access-control-allow-origin"] in ("*", origin)
    narrow = build_app(AsyncEngine(lambda: None, ServerMetrics(NAME), in_process=True), NAME, cors=CorsPolicy(allowed_origins=("https://ui.example",)))
    other = _send(narrow, "OPTIONS", "/v1/models", {"Origin": origin, "Access-Control-Request-Method": "GET"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_cors_options_from_the_command_line() -> None:
    ns = argparse.Namespace(allowed_origins=["https://ui.example"], allow_credentials=True, allowed_methods=["GET", "POST"], allowed_headers=["*"])
    assert cors_policy_of(ns) == CorsPolicy(("https://ui.example",), True, ("GET", "POST"), ("*",))
    with pytest.raises(InvalidArgumentError, match="--allowed-origins must be a JSON list of strings"):
        cors_policy_of(argparse.Namespace(allowed_origins="*", allow_credentials=False, allowed_methods=["*"], allowed_headers=["*"]))


def test_where_the_key_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auth.API_KEY_ENV, raising=False)
    assert api_key_of(argparse.Namespace(api_key=None)) is None
    assert api_key_of(argparse.Namespace(api_key=KEY)) == KEY
    monkeypatch.setenv(auth.API_KEY_ENV, "from-env")
    assert api_key_of(argparse.Namespace(api_key=None)) == "from-env"
    assert api_key_of(argparse.Namespace(api_key=KEY)) == KEY  # the option wins
    monkeypatch.setenv(auth.API_KEY_ENV, "")
    assert api_key_of(argparse.Namespace(api_key=None)) is None  # empty: unset
    for empty in ("", "  "):
        with pytest.raises(InvalidArgumentError, match="--api-key is empty"):
            api_key_of(argparse.Namespace(api_key=empty))


def test_an_empty_api_key_option_is_refused_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--api-key", "", "--port", "0"]) == 2
    assert capsys.readouterr().err.startswith("trtcore: error: --api-key is empty")


@pytest.fixture(scope="module")
def server(model: Path) -> Any:  # noqa: F811
    args = ["--model", str(model), "--backend", "reference", "--max-seq-len", "256", "--served-model-name", NAME, "--log-level", "info"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(auth.API_KEY_ENV, KEY)  # the key from the environment (as from a Kubernetes Secret)
        s = ServerProcess(args).start()  # its readiness probe, /health, needs no key
    yield s
    assert s.stop() == 0, "".join(s.stderr_lines)


def test_the_openai_client_with_the_right_key_is_served_a_wrong_key_is_refused(server: Any) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    r = client.completions.create(model=NAME, prompt="the theory of", max_tokens=3, temperature=0)
    assert r.usage is not None and r.usage.completion_tokens == 3
    chunks = list(client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True))
    assert chunks and chunks[0].choices[0].delta.role == "assistant"
    assert client.models.retrieve(NAME).id == NAME
    for bad in ("wrong", KEY + "x", KEY[:-1]):
        wrong = openai.OpenAI(base_url=server.url + "/v1", api_key=bad, max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError) as e:
            wrong.completions.create(model=NAME, prompt="x", max_tokens=1)
        assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"  # type: ignore[index]
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
    r2 = httpx.post(server.url + "/v1/completions", json={"model": NAME, "prompt": "x", "max_tokens": 1})  # no header at all
    assert r2.status_code == 401 and r2.json()["error"]["code"] == "invalid_api_key"
    assert server.health() == 200
    assert httpx.head(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200
    assert httpx.get(server.url + "/version").json() == {"version": trtcore.__version__}


def test_the_key_is_not_in_the_servers_output(server: Any) -> None:
    httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    text = "".join(server.stderr_lines)
    assert "Application startup complete" in text, text  # --log-level info: uvicorn logs
    assert KEY not in text and KEY[:12] not in text
