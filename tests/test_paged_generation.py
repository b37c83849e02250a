"""Paged KV cache end to end on the reference backend (NumPy): the paged network with the
paged attention plugin and continuous batching gives the same tokens as the contiguous
network, whose outputs are themselves checked against transformers (test_models_hf.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hf_models import VARIANTS, hf_models, random_prompt  # noqa: F401  (fixture)

from trtcore import LLM, SamplingParams


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_paged_equals_contiguous(hf_models, name: str) -> None:  # noqa: F811
    v = VARIANTS[name]
    d = hf_models.dir(name)
    rng = np.random.default_rng()
    prompts = [random_prompt(rng, n, v.vocab_size) for n in (1, 15, 16, 17, 80)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=v.vocab_size)
    paged = LLM(d, backend="reference", kv_cache="paged", block_size=16, max_num_tokens=64, progress=False)
    contiguous = LLM(d, backend="reference", kv_cache="contiguous", progress=False)
    assert paged.kv_cache == "paged" and contiguous.kv_cache == "contiguous"
    for a, b in zip(paged.generate(prompts, params), contiguous.generate(prompts, params)):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for ra, rb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            ids = sorted(rb)
            np.testing.assert_allclose([ra[i].logprob for i in ids], [rb[i].logprob for i in ids], rtol=1e-5, atol=1e-5)


def test_small_pool_preempts_and_every_request_gets_its_solo_tokens(hf_models) -> None:  # noqa: F811
    """64 requests of random lengths through a pool far too small for all of them: requests
    are preempted and recomputed, and each ends with the tokens it gets alone."""
    v = VARIANTS["qwen2_bias"]
    d = hf_models.dir("qwen2_bias")
    rng = np.random.default_rng()
    prompts = [random_prompt(rng, int(rng.integers(1, 60)), v.vocab_size) for _ in range(64)]
    max_tokens = [int(rng.integers(1, 24)) for _ in range(64)]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    spec_bytes = 2 * 2 * 1 * 16 * 16 * 4  # layers * K/V * kv heads * head_dim * block_size * float32
    small = LLM(d, backend="reference", kv_cache="paged", block_size=16, max_batch_size=16, max_num_tokens=48,
                kv_cache_memory=12 * spec_bytes, progress=False)
    assert small.engine.kv_cache.num_blocks == 12
    together = small.generate(prompts, params)
    sched = small.engine.scheduler
    assert sched is not None and sched.num_preemptions > 0
    solo = LLM(d, backend="reference", kv_cache="contiguous", max_batch_size=1, progress=False)
    for p, sp, out in zip(prompts, params, together):
        assert out.error is None
        assert out.outputs[0].token_ids == solo.generate([p], sp)[0].outputs[0].token_ids


def test_request_larger_than_the_pool_fails_alone(hf_models) -> None:  # noqa: F811
    d = hf_models.dir("qwen2_bias")
    spec_bytes = 2 * 2 * 1 * 16 * 16 * 4
    llm = LLM(d, backend="reference", kv_cache="paged", block_size=16, kv_cache_memory=2 * spec_bytes, progress=False)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outs = llm.generate([[5] * 100, [6, 7, 8]], params)
    assert outs[0].error is not None and "block" in str(outs[0].error) and outs[0].outputs[0].finish_reason == "error"
    assert outs[1].error is None and len(outs[1].outputs[0].token_ids) == 4


def test_stream_yields_tokens_and_text(hf_models) -> None:  # noqa: F811
    """The stream gives each request its tokens in order, its text pieces add up to the
    completion's text, and the last piece carries the finish reason."""
    d = hf_models.dir("llama3_rope")
    tok_dir = d.parent / "llama3_rope_with_tokenizer"
    if not tok_dir.exists():
        import shutil

        from tokenizers import Tokenizer, models, pre_tokenizers

        shutil.copytree(d, tok_dir)
        # a byte-level tokenizer over the model's vocabulary: ids 0..159 decode to text
        vocab = {f"<{i}>" if i < 3 else chr(0x20 + i): i for i in range(VARIANTS["llama3_rope"].vocab_size)}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
        tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
        tok.save(str(tok_dir / "tokenizer.json"))
    llm = LLM(tok_dir, backend="reference", progress=False)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 6, 7], [9, 10]]
    pieces = list(llm.stream(prompts, params))
    for i, prompt in enumerate(prompts):
        mine = [p for p in pieces if p.index == i]
        [full] = llm.generate([prompt], params)
        assert [p.token_id for p in mine] == full.outputs[0].token_ids
        assert "".join(p.text for p in mine) == full.outputs[0].text != ""
        assert mine[-1].finish_reason == "length" and all(p.finish_reason is None for p in mine[:-1])


def test_requests_join_while_others_decode(hf_models) -> None:  # noqa: F811
    """Online use (add_request / step): a request added after others started decoding
    joins the batch and every request gets the tokens it gets alone."""
    v = VARIANTS["mistral_sw8"]
    d = hf_models.dir("mistral_sw8")
    rng = np.random.default_rng()
    llm = LLM(d, backend="reference", kv_cache="paged", max_num_tokens=64, progress=False)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [random_prompt(rng, n, v.vocab_size) for n in (30, 5, 50, 9)]
    tokens: dict[int, list[int]] = {}
    ids = [llm.add_request(prompts[0], params), llm.add_request(prompts[1], params)]
    steps = 0
    while llm.has_unfinished_requests():
        for out in llm.step():
            tokens.setdefault(out.index, []).append(out.token_id)
        steps += 1
        if steps == 3:  # the first two are decoding by now
            assert all(len(tokens.get(i, [])) >= 1 for i in ids)
            ids += [llm.add_request(prompts[2], params), llm.add_request(prompts[3], params)]
    solo = LLM(d, backend="reference", kv_cache="contiguous", progress=False)
    for rid, p in zip(ids, prompts):
        assert tokens[rid] == solo.generate([p], params)[0].outputs[0].token_ids
    with pytest.raises(Exception, match="paged"):
        solo.add_request(prompts[0], params)
