"""``trtcore serve`` as a client sees it: a real server process on 127.0.0.1 (ephemeral port),
the official ``openai`` client, a tiny llama with a real BPE tokenizer and chat template on
the reference backend (one server for the module).

Expectations come from :meth:`trtcore.LLM.generate` in this process for the same parameters
(greedy and seeded sampling: a request's seed makes its tokens independent of the batch), from
the requests the test sent (the metrics' counters), and from the documented error statuses.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_gguf import write_synthetic_gguf

from trtcore import LLM, SamplingParams
from trtcore.serve.process import ServerProcess
from trtcore.token_bytes import token_bytes, token_text

NAME = "tiny"
MAX_SEQ_LEN = 256


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtcore.gguf_convert import convert_gguf

    root = tmp_path_factory.mktemp("serve")
    # no BOS (llama-bpe's default without the key is one, as llama.cpp): the chat tests build their
    # reference with generate() on the templated text, which would add it where the chat endpoint
    # does not (vLLM's add_special_tokens=False for chat)
    write_synthetic_gguf(root / "tiny.gguf", "llama", tokenizer="gpt2", pre="llama-bpe", tied=False, seed=3, add_bos=False)
    return Path(convert_gguf(root / "tiny.gguf", root / "hf", progress=False))


@pytest.fixture(scope="module")
def llm(model: Path) -> LLM:
    return LLM(model, backend="reference", kv_cache="paged", max_seq_len=MAX_SEQ_LEN, progress=False)


@pytest.fixture(scope="module")
def server(model: Path) -> Any:
    args = ["--model", str(model), "--backend", "reference", "--max-seq-len", str(MAX_SEQ_LEN), "--max-waiting", "64", "--served-model-name", NAME]
    with ServerProcess(args) as s:
        yield s
    assert s.process is not None and s.process.returncode == 0, "".join(s.stderr_lines)


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def metrics(server: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` parsed by prometheus-client's parser: ``{(sample name, labels): value}``."""
    with urllib.request.urlopen(server.url + "/metrics") as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(m: dict[Any, float], name: str, **labels: str) -> float:
    return m[(name, tuple(sorted({"model_name": NAME, **labels}.items())))]


GREEDY = {"temperature": 0.0, "max_tokens": 12}
SEEDED = {
    "temperature": 0.9,
    "top_p": 0.9,
    "top_k": 40,
    "min_p": 0.02,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.3,
    "repetition_penalty": 1.2,
    "seed": 1234,
    "max_tokens": 12,
}
EXTENSIONS = ("top_k", "min_p", "repetition_penalty")  # vLLM's, not the openai client's own arguments


def _call(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The openai client's keywords: vLLM's extension fields go in ``extra_body``."""
    extra = {k: kwargs[k] for k in EXTENSIONS if k in kwargs}
    return {**{k: v for k, v in kwargs.items() if k not in EXTENSIONS}, "extra_body": extra}


def _params(kwargs: dict[str, Any]) -> SamplingParams:
    return SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_equal_generate(client: openai.OpenAI, llm: LLM, kwargs: dict[str, Any], stream: bool) -> None:
    prompt = "the theory of everything"
    [ref] = llm.generate(prompt, _params(kwargs))
    want = ref.outputs[0]
    if stream:
        chunks = list(client.completions.create(model=NAME, prompt=prompt, stream=True, stream_options={"include_usage": True}, **_call(kwargs)))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        usage = chunks[-1].usage
        assert all(c.usage is None for c in chunks[:-1]) and not chunks[-1].choices
    else:
        r = client.completions.create(model=NAME, prompt=prompt, **_call(kwargs))
        text, finish, usage = r.choices[0].text, [r.choices[0].finish_reason], r.usage
    assert text == want.text
    assert finish == [want.finish_reason]
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        len(ref.prompt_token_ids),
        len(want.token_ids),
        len(ref.prompt_token_ids) + len(want.token_ids),
    )


def _requests_counted(before: dict[Any, float], after: dict[Any, float]) -> float:
    """Requests that ended between two ``/metrics`` readings (finished, aborted or failed)."""
    names = [("trtcore:request_success_total", {"finished_reason": r}) for r in ("stop", "length", "abort")]
    names.append(("trtcore:request_failure_total", {}))
    return sum(value(after, n, **lb) - value(before, n, **lb) for n, lb in names)


BATCH = ["the theory of everything", "once upon a time", "x"]


@pytest.mark.parametrize("kind", ["strings", "token-ids"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_list_of_prompts_gets_each_prompts_own_completion(server: Any, client: openai.OpenAI, llm: LLM, kind: str, stream: bool) -> None:
    """OpenAI's list of prompts: one choice per prompt (``index`` its position) whose text is
    what the prompt gives alone, usage summed; streamed, the prompts' chunks interleave (they
    run together) and the usage chunk comes once, last; each prompt is one request in the metrics."""
    prompts: list[Any] = BATCH if kind == "strings" else [llm.encode(t) for t in BATCH]
    kwargs = {"temperature": 0.0, "max_tokens": 12}
    refs = [llm.generate(p, SamplingParams(**kwargs, ignore_eos=True))[0] for p in prompts]
    want = [(r.outputs[0].text, [r.outputs[0].finish_reason]) for r in refs]
    assert len({t for t, _ in want}) == len(want)  # distinct texts: a choice under the wrong index shows
    before = metrics(server)
    call: dict[str, Any] = {"model": NAME, "prompt": prompts, "extra_body": {"ignore_eos": True}, **kwargs}
    if stream:
        *chunks, last = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **call))
        assert not last.choices and all(c.usage is None and len(c.choices) == 1 for c in chunks)
        order = [c.choices[0].index for c in chunks]
        assert sorted(set(order)) == [0, 1, 2]
        assert order.index(2) < max(i for i, x in enumerate(order) if x == 0)  # interleaved, not one after another
        got = [
            (
                "".join(c.choices[0].text for c in chunks if c.choices[0].index == i),
                [c.choices[0].finish_reason for c in chunks if c.choices[0].index == i and c.choices[0].finish_reason],
            )
            for i in range(3)
        ]
        usage = last.usage
    else:
        r = client.completions.create(**call)
        assert [c.index for c in r.choices] == [0, 1, 2]
        got = [(c.text, [c.finish_reason]) for c in r.choices]
        usage = r.usage
    assert got == want
    p = sum(len(r.prompt_token_ids) for r in refs)
    n = sum(len(r.outputs[0].token_ids) for r in refs)
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (p, n, p + n)
    after = metrics(server)
    assert (
        value(after, "trtcore:request_success_total", finished_reason="length")
        - value(before, "trtcore:request_success_total", finished_reason="length")
        == 3
    )
    assert _requests_counted(before, after) == 3
    assert value(after, "trtcore:prompt_tokens_total") - value(before, "trtcore:prompt_tokens_total") == p


def test_a_streamed_list_of_prompts_ends_with_one_done(server: Any) -> None:
    """The SSE body of a list: ``[DONE]`` once, after every prompt finished and the usage chunk."""
    body = {"model": NAME, "prompt": BATCH, "max_tokens": 4, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=60) as h, h.stream("POST", server.url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        events = [line[len("data: ") :] for line in r.iter_lines() if line]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == sum(1 for c in chunks[:-1])
    assert sorted(c["choices"][0]["index"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]) == [0, 1, 2]


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "param", "says"),
    [
        ([], 2, "prompt", "empty"),
        ([[5], []], 2, "prompt", "prompt[1] is empty"),
        (["x", 5], 2, "prompt", "mixes"),
        ([[5], "x"], 2, "prompt", "mixes"),
        ([[5], 7], 2, "prompt", "mixes"),
        (["x", "y", "the " * MAX_SEQ_LEN], 2, "prompt", "prompt[2]"),
        ([[5], [10**6]], 2, "prompt", "prompt[1]"),
        ([[5], [5] * 200], 100, "max_tokens", "max_tokens=100"),
    ],
    ids=["empty-list", "empty-item", "str-and-int", "list-and-str", "list-and-int", "one-over-context", "one-bad-token", "one-over-max-tokens"],
)
def test_a_bad_prompt_in_a_list_refuses_the_list_and_submits_nothing(
    server: Any, client: openai.OpenAI, prompt: list[Any], max_tokens: int, param: str, says: str
) -> None:
    before = metrics(server)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0)
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == param and says in err["message"], err  # type: ignore[index]
    nxt = client.completions.create(model=NAME, prompt=["the theory of", "a b c"], max_tokens=2, temperature=0)
    assert nxt.usage is not None and nxt.usage.completion_tokens == 4
    after = metrics(server)
    assert _requests_counted(before, after) == 2  # the next request's two prompts only
    assert value(after, "trtcore:prompt_tokens_total") - value(before, "trtcore:prompt_tokens_total") == nxt.usage.prompt_tokens
    assert value(after, "trtcore:num_requests_running") == 0


def test_more_than_20_logprobs_are_refused_on_every_backend(client: openai.OpenAI) -> None:
    """vLLM's ``max_logprobs`` (20, the GPU sampler kernel's): a 400 from the server before
    the engine sees the request, so every backend answers the same (the reference backend
    would return any number); 20 is served."""
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=NAME, prompt="x", max_tokens=2, logprobs=21)
    err = e.value.body
    assert err["param"] == "logprobs" and "logprobs=21" in err["message"] and "20" in err["message"], err  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], max_tokens=2, logprobs=True, top_logprobs=21)
    err = e.value.body
    assert err["param"] == "top_logprobs" and "top_logprobs=21" in err["message"] and "20" in err["message"], err  # type: ignore[index]
    r = client.completions.create(model=NAME, prompt="x", max_tokens=2, logprobs=20, temperature=0)
    assert r.choices[0].logprobs is not None and all(len(t) >= 20 for t in r.choices[0].logprobs.top_logprobs or [])
    c = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], max_tokens=2, logprobs=True, top_logprobs=20)
    assert c.choices[0].logprobs is not None and all(len(t.top_logprobs) == 20 for t in c.choices[0].logprobs.content or [])


@pytest.mark.parametrize("kwargs", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_completions_equal_generate(client: openai.OpenAI, llm: LLM, kwargs: dict[str, Any], stream: bool) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is the theory of"}]
    [ref] = llm.generate(llm.apply_chat_template(messages), _params(kwargs))
    want = ref.outputs[0]
    call = _call({**kwargs, "max_completion_tokens": kwargs["max_tokens"]})
    del call["max_tokens"]
    if stream:
        chunks = list(client.chat.completions.create(model=NAME, messages=messages, stream=True, **call))  # type: ignore[call-overload]
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        assert all(c.usage is None for c in chunks)  # no include_usage
    else:
        r = client.chat.completions.create(model=NAME, messages=messages, **call)  # type: ignore[call-overload]
        assert r.choices[0].message.role == "assistant"
        text, finish = r.choices[0].message.content, [r.choices[0].finish_reason]
        assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ref.prompt_token_ids), len(want.token_ids))
    assert text == want.text
    assert finish == [want.finish_reason]


def test_logprobs_and_stop_strings_equal_generate(client: openai.OpenAI, llm: LLM) -> None:
    prompt = "the theory of"
    [ref] = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, logprobs=3))
    want = ref.outputs[0]
    r = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=8, logprobs=3)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.token_logprobs == pytest.approx([d[t].logprob for d, t in zip(want.logprobs, want.token_ids)], abs=1e-9)
    # keyed by token text, which is never lossy ("bytes:\xNN" for part of a character), so
    # no two tokens share a key: the reference's entries, one for one
    for top, d in zip(lp.top_logprobs, want.logprobs):
        assert top == pytest.approx({token_text(llm.tokenizer, t): x.logprob for t, x in d.items()}, abs=1e-9)
        # generate's decoded_token is the same text: the tokenizer's own decoding of the one
        # id (" in"), not the vocabulary's byte-level spelling ("Ġin")
        for t, x in d.items():
            assert x.decoded_token == llm.tokenizer.decode([t], skip_special_tokens=False) or x.decoded_token.startswith("bytes:")
    c = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=4, logprobs=True, top_logprobs=2)
    [cref] = llm.generate(llm.apply_chat_template([{"role": "user", "content": prompt}]), SamplingParams(temperature=0, max_tokens=4, logprobs=2))
    content = c.choices[0].logprobs.content
    assert [e.logprob for e in content] == pytest.approx([d[t].logprob for d, t in zip(cref.outputs[0].logprobs, cref.outputs[0].token_ids)], abs=1e-9)
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in content)
    for e, t in zip(content, cref.outputs[0].token_ids):  # the token's own bytes, not its lone decoding's
        assert e.bytes == list(token_bytes(llm.tokenizer, t)) and e.token == token_text(llm.tokenizer, t)
    # a prompt whose greedy tokens include part of a character (the bug report's case)
    x = client.completions.create(model=NAME, prompt="x", temperature=0, max_tokens=3, logprobs=2)
    [xref] = llm.generate("x", SamplingParams(temperature=0, max_tokens=3, logprobs=2))
    assert x.choices[0].logprobs is not None
    for top, d in zip(x.choices[0].logprobs.top_logprobs, xref.outputs[0].logprobs):
        assert top == pytest.approx({token_text(llm.tokenizer, t): v.logprob for t, v in d.items()}, abs=1e-9)
    # a stop string taken from the greedy text ends it there, as in generate
    [long] = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24))
    stop = long.outputs[0].text[6:9]
    [sref] = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24, stop=[stop]))
    s = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=24, stop=[stop])
    assert (s.choices[0].text, s.choices[0].finish_reason) == (sref.outputs[0].text, "stop")
    assert s.usage is not None and s.usage.completion_tokens == len(sref.outputs[0].token_ids)


def test_64_concurrent_streams_get_what_they_get_alone(server: Any, llm: LLM) -> None:
    prompts = [f"number {i} of the theory" for i in range(64)]
    kwargs = [{"temperature": 0.8, "seed": i, "max_tokens": 10} if i % 2 else {"temperature": 0.0, "max_tokens": 10} for i in range(64)]
    alone = [llm.generate(p, SamplingParams(**k))[0].outputs[0].text for p, k in zip(prompts, kwargs)]

    async def one(c: openai.AsyncOpenAI, p: str, k: dict[str, Any]) -> str:
        parts = [ch.choices[0].text async for ch in await c.completions.create(model=NAME, prompt=p, stream=True, **k)]
        return "".join(parts)

    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as c:
            return list(await asyncio.gather(*(one(c, p, k) for p, k in zip(prompts, kwargs))))

    assert asyncio.run(run()) == alone


def _wait_aborted(server: Any, before: dict[Any, float], n: int = 1) -> dict[Any, float]:
    """The metrics once ``n`` more requests than in ``before`` were aborted and nothing runs
    or holds KV blocks (at most 30 s)."""
    aborts = value(before, "trtcore:request_success_total", finished_reason="abort") + n
    deadline = time.monotonic() + 30
    while True:
        m = metrics(server)
        freed = value(m, "trtcore:num_requests_running") == 0 and value(m, "trtcore:kv_cache_usage_perc") == 0.0
        if freed and value(m, "trtcore:request_success_total", finished_reason="abort") == aborts:
            return m
        assert time.monotonic() < deadline, "the disconnected request was not aborted"
        time.sleep(0.02)


@pytest.mark.parametrize("prompts", [1, 3], ids=["one-prompt", "three-prompts"])
def test_a_client_gone_mid_stream_frees_its_blocks(server: Any, prompts: int) -> None:
    before = metrics(server)
    prompt = "the theory of" if prompts == 1 else BATCH
    body = {"model": NAME, "prompt": prompt, "max_tokens": 240, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as h, h.stream("POST", server.url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(3):
            assert next(line for line in lines if line).startswith("data: {")
    # closed: the server aborts them before its next step, which frees their blocks
    m = _wait_aborted(server, before, prompts)
    generated = value(m, "trtcore:generation_tokens_total") - value(before, "trtcore:generation_tokens_total")
    assert 3 <= generated < 240 * prompts


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/completions batch"])
def test_a_client_gone_before_a_whole_response_frees_its_blocks(server: Any, path: str) -> None:
    """A non-streamed request whose client closes its connection while the request runs is
    aborted as soon as the server sees the disconnect, not generated to its end. (The request
    is sent on a raw socket, which is closed once the metrics show the request running.) A
    list of 3 prompts runs its 3 requests at once, and all 3 are aborted."""
    import socket
    from urllib.parse import urlsplit

    before = metrics(server)
    body: dict[str, Any] = {"model": NAME, "max_tokens": 200, "ignore_eos": True, "temperature": 0}  # the chat template's tokens fit too
    path, batch = path.split()[0], len(path.split()) > 1
    n = 3 if batch else 1
    if path == "/v1/completions":
        body["prompt"] = BATCH if batch else "the theory of"
    else:
        body["messages"] = [{"role": "user", "content": "the theory of"}]
    data = json.dumps(body).encode()
    url = urlsplit(server.url)
    head = f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(head.encode() + data)
        deadline = time.monotonic() + 30
        while value(metrics(server), "trtcore:num_requests_running") < n:  # a list's prompts run together
            assert time.monotonic() < deadline, "the requests never ran together"
            time.sleep(0.01)
    m = _wait_aborted(server, before, n)
    generated = value(m, "trtcore:generation_tokens_total") - value(before, "trtcore:generation_tokens_total")
    assert generated < 200 * n
    assert value(m, "trtcore:request_success_total", finished_reason="length") == value(before, "trtcore:request_success_total", finished_reason="length")


def _post(server: Any, path: str, content: bytes | None = None, **body: Any) -> httpx.Response:
    data = content if content is not None else json.dumps(body).encode()
    return httpx.post(server.url + path, content=data, headers={"content-type": "application/json"}, timeout=60)


@pytest.mark.parametrize(
    ("content", "body", "status", "param"),
    [
        (b'{"model": "tiny", "prompt": "x", ', None, 400, None),
        (None, {"model": NAME, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
        (None, {"model": NAME, "prompt": "x", "max_tokens": [3]}, 400, "max_tokens"),
        (None, {"model": NAME, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        (None, {"model": NAME, "prompt": "the " * MAX_SEQ_LEN}, 400, "prompt"),
        (None, {"model": NAME, "prompt": "x", "max_tokens": MAX_SEQ_LEN}, 400, "max_tokens"),
        (None, {"model": NAME, "prompt": "x", "n": 2}, 400, "n"),
        (None, {"model": NAME, "prompt": [10**6]}, 400, "prompt"),
        (None, {"model": "other", "prompt": "x"}, 404, "model"),
        (None, {"model": NAME, "prompt": "x", "stream": "yes"}, 400, "stream"),
        (None, {"model": NAME, "prompt": "x", "max_tokens": "2"}, 400, "max_tokens"),
        (None, {"model": NAME, "prompt": {"a": 1}}, 400, "prompt"),
        (None, {"model": NAME, "prompt": "x", "stop": 5}, 400, "stop"),
        (None, {"model": NAME, "prompt": "x", "logit_bias": {"5": 100}}, 400, "logit_bias"),
        (None, {"model": NAME, "prompt": "x", "best_of": 2}, 400, "best_of"),
        (None, {"model": NAME, "prompt": "x", "response_format": {"type": "json_object"}}, 400, "response_format"),
        (None, {"model": NAME, "prompt": "x", "stop_token_ids": [3, -1]}, 400, "stop_token_ids.1"),
        (None, {"model": NAME, "prompt": "x", "stop": [f"s{i}" for i in range(1025)]}, 400, "stop"),
        (None, {"model": NAME, "prompt": "x", "stop": ["y" * 70_000]}, 400, "stop"),
        (None, {"model": NAME, "prompt": "x", "stop_token_ids": list(range(1025))}, 400, "stop_token_ids"),
        (None, {"model": NAME, "prompt": "x", "stop_token_ids": [10**6]}, 400, "stop_token_ids"),
        # past int64 it broke the sampler's ban list, and every later request got a 500
        (None, {"model": NAME, "prompt": "x", "stop_token_ids": [2**63], "min_tokens": 2}, 400, "stop_token_ids"),
    ],
    ids=[
        "malformed-json",
        "wrong-type",
        "wrong-type-list",
        "max-tokens-0",
        "over-context",
        "max-tokens-over-context",
        "n-2",
        "bad-token",
        "unknown-model",
        "string-for-bool",
        "string-for-int",
        "object-for-prompt",
        "int-for-stop",
        "logit-bias",
        "best-of-2",
        "json-mode",
        "negative-stop-token-id",
        "stop-strings-beyond-the-bound",
        "stop-characters-beyond-the-bound",
        "stop-token-ids-beyond-the-bound",
        "stop-token-id-outside-the-vocabulary",
        "stop-token-id-past-int64",
    ],
)
def test_bad_requests_get_their_status_and_the_server_goes_on(server: Any, client: openai.OpenAI, content: Any, body: Any, status: int, param: Any) -> None:
    r = _post(server, "/v1/completions", content, **(body or {}))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    if param:
        assert param in err["message"] or status == 404
    nxt = client.completions.create(model=NAME, prompt="the theory of", max_tokens=2, temperature=0)
    assert nxt.usage is not None and nxt.usage.completion_tokens == 2


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]},
            "messages.0.content",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content"),
    ],
    ids=["tools", "tool-choice", "top-logprobs-without-logprobs", "json-schema", "image-part", "text-part-without-text"],
)
def test_chat_options_this_server_lacks_are_refused_not_ignored(server: Any, body: dict[str, Any], param: str) -> None:
    """A chat option that would change the answer and is not implemented is a 400 naming it;
    the neutral values pass (``tool_choice: none``, ``response_format: text``, empty ``tools``)."""
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = _post(server, "/v1/chat/completions", **{**chat, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and param in r.json()["error"]["message"]
    ok = _post(server, "/v1/chat/completions", **chat, tools=[], tool_choice="none", response_format={"type": "text"}, logprobs=True, top_logprobs=1)
    assert ok.status_code == 200, ok.text
    # text parts: one a line, the same prompt as "h\ni" (vLLM's and llama.cpp's join; they were glued into "hi")
    parts = [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]
    as_parts = _post(server, "/v1/chat/completions", **{**chat, "messages": [{"role": "user", "content": parts}]}, temperature=0)
    plain = _post(server, "/v1/chat/completions", **{**chat, "messages": [{"role": "user", "content": "h\ni"}]}, temperature=0)
    assert as_parts.status_code == 200 and as_parts.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    glued = _post(server, "/v1/chat/completions", **chat, temperature=0)  # "hi": another prompt
    assert as_parts.json()["usage"] == plain.json()["usage"] != glued.json()["usage"]


def test_unknown_model_through_the_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_metrics_count_the_requests_sent(server: Any, client: openai.OpenAI) -> None:
    before = metrics(server)
    sent = [("the theory of", 3), ("a b c", 5), ("once upon a time", 1), ("hello", 7)]
    usage = [client.completions.create(model=NAME, prompt=p, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}).usage for p, n in sent]
    _post(server, "/v1/completions", model=NAME, prompt="x", max_tokens=0)  # refused: counted nowhere
    after = metrics(server)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("trtcore:request_success_total", finished_reason="length") == len(sent)
    assert delta("trtcore:request_success_total", finished_reason="stop") == 0
    assert delta("trtcore:prompt_tokens_total") == sum(u.prompt_tokens for u in usage)  # type: ignore[union-attr]
    assert delta("trtcore:generation_tokens_total") == sum(n for _, n in sent)
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert delta(f"trtcore:{hist}_count") == len(sent)
    assert delta("trtcore:inter_token_latency_seconds_count") == sum(n - 1 for _, n in sent)
    assert value(after, "trtcore:num_requests_waiting") == 0 and value(after, "trtcore:num_preemptions_total") == 0


def test_models_and_health(server: Any, client: openai.OpenAI, model: Path) -> None:
    [card] = client.models.list().data
    assert card.id == NAME and card.model_extra is not None and card.model_extra["max_model_len"] == MAX_SEQ_LEN
    assert card.model_extra["root"] == str(model) and card.model_extra["version"] is None  # built at start-up: no engine file
    assert server.health() == 200


def test_retrieve_model_head_health_and_version(server: Any, client: openai.OpenAI, model: Path) -> None:
    """OpenAI's ``GET /v1/models/{model}`` (the card ``/v1/models`` lists; another id: 404
    ``model_not_found``), ``HEAD /health`` (the status, no body), ``GET /version`` (vLLM's)."""
    import trtcore

    card = client.models.retrieve(NAME)
    assert card.id == NAME and card.model_extra is not None and card.model_extra["max_model_len"] == MAX_SEQ_LEN
    listed = client.models.list().data[0].model_dump()
    # the same card but ``created``: stamped per request (as vLLM's ModelCard), so a second may pass
    assert card.model_extra["root"] == str(model) and 0 <= listed.pop("created") - card.model_dump().pop("created") <= 2
    assert {k: v for k, v in card.model_dump().items() if k != "created"} == listed
    for other in ("gpt-4", "org/some-model"):
        with pytest.raises(openai.NotFoundError) as e:
            client.models.retrieve(other)
        assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"  # type: ignore[index]
    # "model": "" is the served one, as in vLLM (it was a 404); "GET /v1/models/" names none
    assert _post(server, "/v1/completions", model="", prompt="x", max_tokens=1).status_code == 200
    assert httpx.get(server.url + "/v1/models/", timeout=30).status_code == 404
    head = httpx.head(server.url + "/health")
    assert head.status_code == 200 and head.content == b""
    version = httpx.get(server.url + "/version")
    assert version.status_code == 200 and version.json() == {"version": trtcore.__version__}


def test_bench_serve_against_this_server_prints_its_table(server: Any, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``trtcore bench serve`` (the load generator) against the real server: every request
    completes, output tokens come from the server's usage (12 requests x 8 tokens), and the
    table names vLLM's metrics."""
    from trtcore.cli import main

    out = tmp_path / "bench.json"
    argv = ["bench", "serve", "--base-url", server.url, "--model", NAME, "--num-prompts", "12", "--max-concurrency", "4"]
    argv += ["--input-len", "16", "--output-len", "8", "--ignore-eos", "--tokenizer", str(model), "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["completed"] == 12 and report["failed"] == 0
    assert report["total_output_tokens"] == 12 * 8
    assert report["median_ttft_ms"] <= report["p99_ttft_ms"]
    table = capsys.readouterr().out
    assert "Output token throughput (tok/s):" in table and "Successful requests:" in table, table


# ---- clients of public bug reports: nulls, vLLM's extras, offsets, deltas ------------------------------------------


def test_null_means_the_default(server: Any, llm: LLM) -> None:
    """Clients that send every field send ``null`` for the unset ones (OpenAI's schema marks
    them nullable): the answer is the one of the field left out."""
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    plain = _post(server, "/v1/chat/completions", **chat)
    nulls = _post(server, "/v1/chat/completions", **chat, n=None, stream=None, logprobs=None, stop=None, seed=None, ignore_eos=None, min_tokens=None)
    assert plain.status_code == 200 and nulls.status_code == 200, nulls.text
    assert nulls.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    r = _post(server, "/v1/completions", model=NAME, prompt="the", max_tokens=2, temperature=0, echo=None, n=None, stream=None, suffix=None)
    assert r.status_code == 200, r.text
    assert _post(server, "/v1/completions", model=NAME, prompt=None, max_tokens=2).json()["error"]["param"] == "prompt"  # required stays required


@pytest.mark.parametrize(
    ("path", "field", "val"),
    [
        ("/v1/chat/completions", "guided_choice", ["yes", "no"]),
        ("/v1/chat/completions", "guided_json", {"type": "object"}),
        ("/v1/completions", "guided_regex", "a+"),
        ("/v1/chat/completions", "structured_outputs", {"choice": ["a"]}),
        ("/v1/completions", "prompt_logprobs", 1),
        ("/v1/chat/completions", "functions", [{"name": "f", "parameters": {}}]),
        ("/v1/chat/completions", "function_call", "auto"),
        ("/v1/chat/completions", "echo", True),
        ("/v1/chat/completions", "chat_template", "{{ messages }}"),
        ("/v1/completions", "skip_special_tokens", False),
        ("/v1/completions", "use_beam_search", True),
        ("/v1/completions", "allowed_token_ids", [1, 2]),
        ("/v1/chat/completions", "reasoning_effort", "high"),
    ],
)
def test_vllm_extras_that_would_change_the_answer_are_refused(server: Any, path: str, field: str, val: Any) -> None:
    body = {"model": NAME, "max_tokens": 2, field: val}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "the"})
    r = _post(server, path, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and field in r.json()["error"]["message"]
    neutral = {**body, field: None}  # and the neutral values pass
    assert _post(server, path, **neutral).status_code == 200


@pytest.mark.parametrize(
    ("sent", "message", "param"),
    [
        ({"echo": True}, "echo=True: not supported by this server; leave it out", "echo"),
        ({"suffix": "end"}, "suffix='end': not supported by this server; leave it out", "suffix"),
        ({"echo": True, "suffix": "end"}, "echo=True and suffix='end': not supported by this server; leave them out", "echo"),
    ],
)
def test_echo_or_suffix_is_refused_naming_what_was_sent(server: Any, sent: dict[str, Any], message: str, param: str) -> None:
    r = _post(server, "/v1/completions", model=NAME, prompt="the", max_tokens=2, **sent)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == message and r.json()["error"]["param"] == param


def test_include_stop_str_in_output(server: Any, client: openai.OpenAI) -> None:
    """vLLM's ``include_stop_str_in_output``: the text ends with the matched stop string
    instead of before it; the rest is the same."""
    free = client.completions.create(model=NAME, prompt="the theory of", max_tokens=12, temperature=0).choices[0].text
    stop = free[len(free) // 2 : len(free) // 2 + 3]
    assert stop.strip(), free
    cut = client.completions.create(model=NAME, prompt="the theory of", max_tokens=12, temperature=0, stop=[stop])
    kept = client.completions.create(model=NAME, prompt="the theory of", max_tokens=12, temperature=0, stop=[stop], extra_body={"include_stop_str_in_output": True})
    head = free[: free.index(stop)]
    assert cut.choices[0].text == head and kept.choices[0].text == head + stop
    assert kept.choices[0].finish_reason == "stop"


def test_completion_text_offsets_count_every_token(server: Any, client: openai.OpenAI) -> None:
    """``logprobs.text_offset[i]`` is where token i starts in the completion's text (vLLM: the
    token texts' lengths summed), also while the stream holds text back (a stop string that
    may complete, a character split over tokens): every whole-text token is found at its
    offset in the final text; streamed and not, with and without a stop string."""
    free = client.completions.create(model=NAME, prompt="the theory of", max_tokens=12, temperature=0).choices[0].text
    for stop in (None, [free[len(free) // 2 :]]):
        for stream in (False, True):
            kw = {"model": NAME, "prompt": "the theory of", "max_tokens": 12, "temperature": 0, "stop": stop, "logprobs": 0}
            text, tokens, offsets = "", [], []
            chunks = client.completions.create(stream=True, **kw) if stream else [client.completions.create(**kw)]  # type: ignore[call-overload]
            for chunk in chunks:
                text += chunk.choices[0].text
                lp = chunk.choices[0].logprobs
                if lp is not None:
                    tokens += lp.tokens
                    offsets += lp.text_offset
            assert len(tokens) == len(offsets) > 1 and offsets[0] == 0 and offsets == sorted(offsets)
            whole = [(i, t) for i, t in enumerate(tokens) if not t.startswith("bytes:")]
            found = [(i, t) for i, t in whole if offsets[i] + len(t) <= len(text)]
            assert len(found) >= 3 and (stop is not None or found == whole), (tokens, offsets, text)  # all shown without a stop string
            for i, t in found:
                assert text[offsets[i] : offsets[i] + len(t)] == t, (stop, stream, i, tokens, offsets, text)


def test_streamed_chat_deltas_leave_an_unset_role_out(server: Any) -> None:
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, "stream": True}
    lines = [ln for ln in _post(server, "/v1/chat/completions", **body).text.splitlines() if ln.startswith("data: {")]
    deltas = [json.loads(ln[6:])["choices"][0]["delta"] for ln in lines]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all("role" not in d for d in deltas[1:]), deltas


def test_stream_options_need_stream(server: Any) -> None:
    r = _post(server, "/v1/chat/completions", model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream_options={"include_usage": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"


def test_a_negative_seed_is_its_value_mod_2_64(client: openai.OpenAI) -> None:
    """vLLM takes any int64 seed; -1 draws what 2**64 - 1 draws."""
    kw = {"model": NAME, "prompt": "the theory of", "max_tokens": 6, "temperature": 1.0}
    neg = client.completions.create(seed=-1, **kw).choices[0].text  # type: ignore[call-overload]
    assert neg == client.completions.create(seed=(1 << 64) - 1, **kw).choices[0].text  # type: ignore[call-overload]


def test_a_sampling_params_error_names_its_field(server: Any) -> None:
    r = _post(server, "/v1/completions", model=NAME, prompt="the", max_tokens=2, min_tokens=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
    r = _post(server, "/v1/completions", model=NAME, prompt="the", max_tokens=2, stop=[""])
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"


def test_a_body_that_is_no_json_object_says_so_briefly(server: Any) -> None:
    big = b'{"prompt": "' + b"x" * 100_000 + b'"}'
    r = httpx.post(server.url + "/v1/completions", content=big, headers={"Content-Type": "text/plain"}, timeout=30)
    assert r.status_code == 400 and "application/json" in r.json()["error"]["message"]
    assert len(r.content) < 2000  # the body is not echoed back


@pytest.mark.parametrize(
    ("path", "field", "param"),
    [
        ("/v1/completions", "prompt", "prompt"),
        ("/v1/completions", "model", "model"),
        ("/v1/completions", "stop", "stop.1"),
        ("/v1/chat/completions", "content", "messages.0.content"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_where_it_is(server: Any, client: openai.OpenAI, path: str, field: str, param: str) -> None:
    """JSON's ``"\\ud800"`` escape parses to a lone UTF-16 surrogate, which neither the tokenizer
    nor a UTF-8 response can take: it was a 500 (a TypeError in the tokenizer; for ``model``,
    the 404's own body failed to encode). Now a 400 naming the field, and the server goes on."""
    bad = "ab\ud800c"
    body: dict[str, Any] = {"model": NAME, "max_tokens": 2}
    if "chat" in path:
        body["messages"] = [{"role": "user", "content": bad}]
    else:
        body |= {"prompt": bad if field == "prompt" else "the", **({"model": bad} if field == "model" else {})}
        body |= {"stop": ["x", bad]} if field == "stop" else {}
    r = _post(server, path, json.dumps(body).encode())  # json.dumps writes the escape (ensure_ascii)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "lone UTF-16 surrogate '\\ud800' at character 2" in err["message"], err
    nxt = client.completions.create(model=NAME, prompt="the theory of", max_tokens=2, temperature=0)
    assert nxt.usage is not None and nxt.usage.completion_tokens == 2


def test_too_many_prompts_are_refused_before_tokenizing(server: Any) -> None:
    """A list of more prompts than the server could ever queue together is a 400 at once: every
    prompt was tokenized first, on the event loop (100,000 held every stream and /health for
    seconds)."""
    t = time.perf_counter()
    r = _post(server, "/v1/completions", model=NAME, prompt=["the theory of relativity"] * 100_000, max_tokens=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "can never be queued together" in r.json()["error"]["message"]
    assert time.perf_counter() - t < 5.0


def test_chat_history_fields_reach_the_template_and_running_usage_is_refused(server: Any) -> None:
    """A message's ``name``, ``tool_calls`` and ``tool_call_id`` go to the chat template as vLLM
    passes them (they were dropped); ``stream_options.continuous_usage_stats`` (vLLM's usage in
    every chunk) is a 400 instead of being ignored."""
    from trtcore.serve.protocol import ChatMessage

    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    m = ChatMessage.model_validate({"role": "assistant", "content": None, "tool_calls": call, "name": "bot"})
    parsed = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]  # the JSON string as the object
    assert m.template_message() == {"role": "assistant", "content": "", "tool_calls": parsed, "name": "bot"}
    assert ChatMessage.model_validate({"role": "user", "content": "hi"}).template_message() == {"role": "user", "content": "hi"}
    history = [
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": call},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    r = _post(server, "/v1/chat/completions", model=NAME, messages=history, max_tokens=2)
    assert r.status_code == 200, r.text
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    r = _post(server, "/v1/chat/completions", **chat, stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.continuous_usage_stats", r.text


def test_tool_call_arguments_reach_the_template_as_objects(tmp_path: Path, server: Any) -> None:
    """OpenAI's tool-call ``arguments`` is a JSON string; templates read an object (Qwen3-Coder's
    ``arguments|items`` raised TypeError, a 500; Qwen2.5's ``arguments | tojson`` encoded it
    twice): parsed as vLLM does, with transformers' ``tojson`` arguments; a template that fails on
    the messages' data is a 400 naming messages, and arguments that are not JSON are refused."""
    from pydantic import ValidationError

    from trtcore.chat import render_chat_template
    from trtcore.errors import InvalidRequestError
    from trtcore.serve.protocol import ChatMessage

    template = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name }}:{% for k, v in c.function.arguments|items %}"
        "{{ k }}={{ v|tojson(sort_keys=True, separators=(',', ':')) }};{% endfor %}{% endfor %}{% endfor %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    args = '{"city": "Paris", "opts": {"b": 1, "a": [1, 2]}}'
    call = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]
    msgs = [ChatMessage.model_validate({"role": "assistant", "content": None, "tool_calls": call}).template_message()]
    assert render_chat_template(tmp_path, msgs, add_generation_prompt=False) == 'get_weather:city="Paris";opts={"a":[1,2],"b":1};'
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for k, v in messages[0].content|items %}{{ k }}{% endfor %}"}))
    with pytest.raises(InvalidRequestError, match="chat template failed on these messages: TypeError"):
        render_chat_template(tmp_path, [{"role": "user", "content": "hi"}])
    bad = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{city: Paris}"}}]
    with pytest.raises(ValidationError, match=r"tool_calls\[0\].function.arguments is not JSON"):
        ChatMessage.model_validate({"role": "assistant", "content": None, "tool_calls": bad})
    r = _post(server, "/v1/chat/completions", model=NAME, messages=[{"role": "assistant", "content": None, "tool_calls": bad}], max_tokens=2)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages"), r.text
    deep = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 100_000 + "]" * 100_000}}]  # past the parser's depth: a 500 before
    r = _post(server, "/v1/chat/completions", model=NAME, messages=[{"role": "assistant", "content": None, "tool_calls": deep}], max_tokens=2)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages"), r.text


def test_a_prompt_far_beyond_the_context_is_refused_before_tokenizing(server: Any) -> None:
    """A text of more characters than the context's tokens could ever hold is a 400 at once,
    and the server answers its probes meanwhile (the tokenizer never runs on it)."""
    t = time.perf_counter()
    r = _post(server, "/v1/completions", model=NAME, prompt="hello world " * 400_000, max_tokens=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "characters" in r.json()["error"]["message"]
    assert time.perf_counter() - t < 5.0


def test_continue_final_message(server: Any, client: openai.OpenAI, model: Path) -> None:
    """vLLM's ``continue_final_message``: the prompt is the chat rendered without a generation
    prompt and cut after the last message's content (transformers'
    ``apply_chat_template(continue_final_message=True)``, the judge), so the answer continues it."""
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "The color is"}]
    want = AutoTokenizer.from_pretrained(model).apply_chat_template(messages, tokenize=False, continue_final_message=True)
    ids = AutoTokenizer.from_pretrained(model)(want, add_special_tokens=False)["input_ids"]
    ref = client.completions.create(model=NAME, prompt=ids, max_tokens=4, temperature=0).choices[0].text
    body = {"add_generation_prompt": False, "continue_final_message": True}
    got = client.chat.completions.create(model=NAME, messages=messages, max_tokens=4, temperature=0, extra_body=body)  # type: ignore[arg-type]
    assert got.choices[0].message.content == ref
    bad = _post(server, "/v1/chat/completions", model=NAME, messages=messages, max_tokens=2, continue_final_message=True)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "continue_final_message"
