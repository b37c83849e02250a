"""A chat prompt's token ids: the rendered template holds its own BOS, so it is encoded without
the one the tokenizer's post-processor adds (Llama 3's tokenizer adds ``<|begin_of_text|>`` and
its template starts with ``{{ bos_token }}``: encoding the text with the special tokens gave two).
The reference is transformers' ``apply_chat_template(tokenize=True)`` on the same folder, for
``LLM.chat``, ``trtcore generate --chat`` and the server's ``/v1/chat/completions``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from test_gguf import write_synthetic_gguf

from trtcore import LLM, SamplingParams
from trtcore.errors import InvalidRequestError
from trtcore.serve.process import ServerProcess

#: a template that writes the BOS first, as Llama 3's and Mistral's do (plain text after it:
#: this vocabulary's BOS is also its ``<|im_start|>``)
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
CONVERSATION = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the theory of"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtcore.gguf_convert import convert_gguf

    root = tmp_path_factory.mktemp("chat-bos")
    write_synthetic_gguf(root / "tiny.gguf", "llama", tokenizer="gpt2", pre="llama-bpe", tied=False, add_bos=True, seed=5)
    folder = Path(convert_gguf(root / "tiny.gguf", root / "hf", progress=False))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    return folder


def hf_chat_ids(model: Path, messages: list[dict[str, str]]) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return [int(t) for t in ids]


def test_the_tokenizer_adds_a_bos_and_the_template_writes_one(model: Path) -> None:
    """The premise: plain text gets the post-processor's BOS, and so does the rendered chat."""
    llm = LLM(model, backend="reference", progress=False)
    bos = llm.encode("x")[0]
    assert llm.encode("x", add_special_tokens=False)[0] != bos
    assert llm.encode(llm.apply_chat_template(CONVERSATION))[:2] == [bos, bos]  # what the chat prompt used to be
    want = hf_chat_ids(model, CONVERSATION)
    assert want[0] == bos and want[1] != bos


def test_llm_chat_encodes_as_transformers(model: Path) -> None:
    llm = LLM(model, backend="reference", progress=False)
    want = hf_chat_ids(model, CONVERSATION)
    [out] = llm.chat(CONVERSATION, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert out.prompt_token_ids == want and out.prompt == llm.apply_chat_template(CONVERSATION)
    [alone] = llm.generate({"prompt_token_ids": want}, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert out.outputs[0].token_ids == alone.outputs[0].token_ids
    other = [{"role": "user", "content": "x"}]
    outs = llm.chat([CONVERSATION, other], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    assert [o.prompt_token_ids for o in outs] == [want, hf_chat_ids(model, other)]
    with pytest.raises(InvalidRequestError, match="messages must be a conversation"):
        llm.chat([])  # type: ignore[arg-type]


def test_generate_chat_on_the_command_line_encodes_as_transformers(model: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trtcore.cli",
            "generate",
            "the theory of",
            "--model",
            str(model),
            "--backend",
            "reference",
            "--chat",
            "--max-tokens",
            "2",
            "--json",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompt_token_ids"] == hf_chat_ids(model, [{"role": "user", "content": "the theory of"}])


def test_the_server_encodes_a_chat_as_transformers(model: Path) -> None:
    args = ["--model", str(model), "--backend", "reference", "--max-seq-len", "128", "--served-model-name", "m"]
    with ServerProcess(args) as server:
        client: Any = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model="m", messages=CONVERSATION, max_tokens=1, temperature=0)
        assert r.usage.prompt_tokens == len(hf_chat_ids(model, CONVERSATION))
        c = client.completions.create(model="m", prompt="the theory of", max_tokens=1, temperature=0)
        llm = LLM(model, backend="reference", progress=False)
        assert c.usage.prompt_tokens == len(llm.encode("the theory of"))  # with its BOS
        # vLLM's add_special_tokens (it was ignored): the completion's prompt without the BOS, the
        # chat's with a second one
        bare = client.completions.create(model="m", prompt="the theory of", max_tokens=1, temperature=0, extra_body={"add_special_tokens": False})
        assert bare.usage.prompt_tokens == len(llm.encode("the theory of", add_special_tokens=False)) == c.usage.prompt_tokens - 1
        extra = client.chat.completions.create(model="m", messages=CONVERSATION, max_tokens=1, temperature=0, extra_body={"add_special_tokens": True})
        assert extra.usage.prompt_tokens == r.usage.prompt_tokens + 1


class _Terminal:
    """A standard error that says it is a terminal (tqdm shows its bar only there) and keeps
    what is written."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("use_tqdm", [True, False])
def test_generate_and_chat_show_vllms_progress_bar_on_a_terminal(model: Path, monkeypatch: pytest.MonkeyPatch, use_tqdm: bool) -> None:
    """``use_tqdm`` (vLLM's ``LLM.generate`` / ``LLM.chat`` parameter): on a terminal a bar of the
    prompts processed ends at K/K for K prompts, a refused prompt counted too (one bad prompt of
    three, one stopped by a stop string); with ``use_tqdm=False`` nothing is written; off a
    terminal nothing either (tqdm's ``disable=None``)."""
    llm = LLM(model, backend="reference", progress=False)
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    sp = [SamplingParams(max_tokens=4, temperature=0), SamplingParams(max_tokens=4, temperature=0, stop=["e"]), SamplingParams(max_tokens=2)]
    outs = llm.generate([[5, 6, 7], [5, 9], []], sp, use_tqdm=use_tqdm)
    assert outs[2].error is not None and outs[0].error is None
    if use_tqdm:
        assert "Processed prompts" in term.text and "3/3" in term.text
    else:
        assert term.text == ""
    term.text = ""
    llm.chat([CONVERSATION, CONVERSATION], SamplingParams(max_tokens=2), use_tqdm=use_tqdm)
    assert ("2/2" in term.text) is use_tqdm
    monkeypatch.setattr(term, "isatty", lambda: False)
    term.text = ""
    llm.generate([5, 6], SamplingParams(max_tokens=2))
    assert term.text == ""


#: what published templates use beyond plain Jinja2: Mistral Small 3 / SmolLM3's
#: ``strftime_now`` (today's date in the system turn), TRL fine-tunes' ``{% generation %}``
#: block around the assistant's text, ``raise_exception`` and ``tojson``
HUB_TEMPLATE = (
    "{{ bos_token }}{%- set today = strftime_now('%Y-%m-%d') %}{{ 'date ' + today }}\n"
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}A: {{ m['content'] }}{% endgeneration %}"
    "{% elif m['role'] in ['user', 'system'] %}{{ m['role'] }}: {{ m['content'] | tojson }}{% else %}{{ raise_exception('bad role') }}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
)


def test_hub_template_helpers_render_as_transformers_renders_them(tmp_path: Path) -> None:
    """``strftime_now`` and ``{% generation %}`` made every chat request fail ("'strftime_now' is
    undefined", "unknown tag 'generation'"); the rendered text now equals transformers'
    ``render_jinja_template`` of the same template, and a template's raise_exception is still
    the request's error."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from trtcore.chat import render_chat_template

    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": HUB_TEMPLATE, "bos_token": "<s>"}))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": 'say "hi"'}, {"role": "assistant", "content": "hi"}]
    got = render_chat_template(tmp_path, messages, add_generation_prompt=True)
    rendered, _ = render_jinja_template([messages], chat_template=HUB_TEMPLATE, add_generation_prompt=True, bos_token="<s>")
    assert got == rendered[0]
    assert "A: hi" in got and "date 20" in got
    with pytest.raises(InvalidRequestError, match="chat template failed: bad role"):
        render_chat_template(tmp_path, [{"role": "tool", "content": "x"}])
