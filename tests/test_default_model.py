"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) end to end against transformers.

transformers loads the same GGUF file itself (its own dequantisation and q/k
un-permutation) in float32; trtcore runs the converted checkpoint on the reference
backend in float32. Greedy tokens come from a plain argmax loop over transformers' logits
(no ``generate``: its ``min_new_tokens`` would mask EOS), so both sides ignore EOS.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trtcore import LLM, SamplingParams

PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
]
STEPS = 32

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_gguf(smollm2_gguf: Path):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": smollm2_gguf.name}
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), dtype=torch.float32, **kw).eval()
    tok = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), **kw)
    return model, tok


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> LLM:
    return LLM(smollm2_dir, backend="reference", dtype="float32", progress=False)


def hf_greedy(model, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy continuation and float64 log-probabilities from transformers, with its KV cache."""
    import torch

    out, logps = [], []
    with torch.no_grad():
        res = model(torch.tensor([ids]), use_cache=True)
        for _ in range(steps):
            logits = res.logits[0, -1].double()
            logps.append(torch.log_softmax(logits, -1).numpy())
            tok = int(logits.argmax())
            out.append(tok)
            res = model(torch.tensor([[tok]]), past_key_values=res.past_key_values, use_cache=True)
    return out, np.stack(logps)


def test_tokenizer_matches_transformers(llm: LLM, hf_gguf) -> None:
    _, tok = hf_gguf
    for p in PROMPTS:
        assert llm.encode(p) == tok(p)["input_ids"], p


def test_greedy_tokens_match_transformers(llm: LLM, hf_gguf) -> None:
    model, tok = hf_gguf
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=20))
    for ids, out in zip(prompts, outs):
        ref_tokens, ref_logps = hf_greedy(model, ids, STEPS)
        comp = out.outputs[0]
        assert comp.token_ids == ref_tokens, (tok.decode(ids), tok.decode(comp.token_ids), tok.decode(ref_tokens))
        # the sampled token's log-probability: our weights are float16-rounded GGUF values,
        # transformers' are float32, so allow ~1e-2 absolute (observed ~1e-3)
        ours = np.array([d[t].logprob for d, t in zip(comp.logprobs, comp.token_ids)])
        ref = ref_logps[np.arange(STEPS), ref_tokens]
        np.testing.assert_allclose(ours, ref, atol=2e-2)


def test_cli_generate_once_upon_a_time(smollm2_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trtcore.cli import main

    assert main(["generate", "Once upon a time", "--model", str(smollm2_dir), "--max-tokens", "24"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Once upon a time")
    words = text.split()
    assert len(words) >= 15 and sum(w.isalpha() for w in words) >= 10, text
