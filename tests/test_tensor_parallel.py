"""Tensor parallelism on the CPU (issue 13): ``LLM(..., tensor_parallel_size=N)`` simulates N
ranks in one process on the reference backend (:mod:`trtcore.runtime.tensor_parallel`).

* N = 2 and 4 give the log-probabilities of N = 1 (every vocabulary entry, 1e-5 relative, float32)
  and the same greedy tokens, in both KV cache modes (and with RoPE fused into the paged
  attention plugin), on tiny checkpoints covering GQA 2:1
  (KV heads replicated at N = 4), MQA, MHA with Qwen3's head norms, q/k/v biases, tied
  embeddings and a vocabulary N does not divide (that one also against transformers);
* each rank reads only its slice of each sharded tensor from the checkpoint (bytes counted);
* a bad N, another family, another backend are refused with the reason;
* ``tensorrt_rtx`` builds a rank's network, the collectives as ``IDistCollectiveLayer``.

The 2-GPU NCCL run is not here (no such machine in CI); tests/cuda/test_collective_gpu.py
runs the NCCL plugin on the GPUs there are.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, Variant, hf_logits, hf_models, load_hf, log_softmax, random_prompt, write_checkpoint  # noqa: F401

from trtcore import LLM, SamplingParams
from trtcore.builder import check_tensor_parallel_family
from trtcore.checkpoint import Checkpoint
from trtcore.errors import ConfigError, InvalidArgumentError
from trtcore.parallel import Mapping, check_tensor_parallel

RTOL = 1e-5
#: a vocabulary neither 2 nor 4 divides (the last rank's rows are padded)
ODD_VOCAB = Variant("llama_vocab157", vocab_size=157, num_attention_heads=4, num_key_value_heads=2, seed=11)


@pytest.fixture(scope="module")
def odd_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(ODD_VOCAB, tmp_path_factory.mktemp("tp") / ODD_VOCAB.name)


def _llm(model: Path, n: int, **kw: Any) -> LLM:
    return LLM(model, backend="reference", dtype="float32", progress=False, tensor_parallel_size=n, **kw)


def _run(llm: LLM, prompt: list[int], vocab: int, steps: int = 6) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and every vocabulary log-probability at each step."""
    [out] = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True, logprobs=vocab))
    c = out.outputs[0]
    return c.token_ids, np.array([[d[t].logprob for t in range(vocab)] for d in c.logprobs])


def _assert_same(got: tuple[list[int], np.ndarray], want: tuple[list[int], np.ndarray]) -> None:
    assert got[0] == want[0]
    err = np.abs(got[1] - want[1]) / np.maximum(1.0, np.abs(want[1]))
    assert err.max() <= RTOL, f"largest relative log-probability error {err.max():.3g}"


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("llama3_rope", {"kv_cache": "paged"}),  # GQA 2:1: KV heads split at N=2, replicated at N=4
        ("llama3_rope", {"kv_cache": "contiguous"}),
        ("llama3_rope", {"kv_cache": "paged", "rope": "attention"}),  # one fused qkv_proj per rank, RoPE in the plugin
        ("qwen2_bias", {"kv_cache": "paged"}),  # MQA (1 KV head, replicated), q/k/v bias, tied embeddings
        ("qwen3_qknorm", {"kv_cache": "paged"}),  # MHA, q/k head norms, head_dim 24
        ("qwen3_qknorm", {"kv_cache": "contiguous"}),
        ("mistral_sw8", {"kv_cache": "paged"}),  # sliding window
    ],
    ids=lambda o: o if isinstance(o, str) else "-".join(o.values()),
)
def test_ranks_give_the_log_probabilities_of_one(hf_models: Any, name: str, options: dict[str, str]) -> None:
    v = VARIANTS[name]
    prompt = random_prompt(np.random.default_rng([v.seed, 13]), 12, v.vocab_size)
    one = _run(_llm(hf_models.dir(name), 1, **options), prompt, v.vocab_size)
    for n in (2, 4):
        llm = _llm(hf_models.dir(name), n, **options)
        try:
            _assert_same(_run(llm, prompt, v.vocab_size), one)
        finally:
            llm.close()


def test_padded_vocabulary_matches_transformers(odd_vocab: Path) -> None:
    """157 tokens over 2 and 4 ranks (79 / 40 rows each, zero rows padding the last rank):
    the same log-probabilities as transformers in float64 and as one rank."""
    prompt = random_prompt(np.random.default_rng(5), 10, ODD_VOCAB.vocab_size)
    one = _run(_llm(odd_vocab, 1), prompt, ODD_VOCAB.vocab_size)
    hf = load_hf(odd_vocab)
    want = log_softmax(hf_logits(hf, prompt + one[0][:-1])[len(prompt) - 1 :])
    for n in (2, 4):
        got = _run(_llm(odd_vocab, n), prompt, ODD_VOCAB.vocab_size)
        assert np.abs(got[1] - want).max() <= 1e-4 * max(1.0, np.abs(want).max())
        _assert_same(got, one)


def test_batched_requests_on_ranks(hf_models: Any) -> None:
    """Several prompts of different lengths at once (continuous batching over the paged pool,
    each rank with its own KV heads of every sequence)."""
    name = "llama3_rope"
    v = VARIANTS[name]
    prompts = [random_prompt(np.random.default_rng([3, k]), 5 + 4 * k, v.vocab_size) for k in range(3)]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    one = [o.outputs[0].token_ids for o in _llm(hf_models.dir(name), 1).generate(prompts, params)]
    two = [o.outputs[0].token_ids for o in _llm(hf_models.dir(name), 2).generate(prompts, params)]
    assert two == one


# -- weights read per rank ------------------------------------------------------------------


def test_each_rank_reads_only_its_slice(hf_models: Any) -> None:
    """llama3_rope: hidden 64, 4 heads of 16, 2 KV heads, intermediate 96, vocabulary 160,
    float32. At N=2 every sharded tensor is read half by each rank and wholly by the two
    together; at N=4 a quarter, except k/v: each rank reads its one (replicated) KV head of 2."""
    d = hf_models.dir("llama3_rope")
    full = {"q_proj": 64 * 64, "k_proj": 32 * 64, "v_proj": 32 * 64, "o_proj": 64 * 64, "gate_proj": 96 * 64, "up_proj": 96 * 64, "down_proj": 64 * 96}
    full = {k: 4 * v for k, v in full.items()}  # float32 bytes
    full_embed = 4 * 160 * 64

    def per_role(read: dict[str, int], layer: int) -> dict[str, int]:
        return {name.split(".")[-2]: b for name, b in read.items() if name.startswith(f"model.layers.{layer}.")}

    for n in (2, 4):
        llm = _llm(d, n)
        reads = llm.bytes_read
        assert len(reads) == n
        for r, read in enumerate(reads):
            for layer in range(2):
                got = per_role(read, layer)
                want = {k: b // n for k, b in full.items()}
                if n == 4:
                    want["k_proj"] = want["v_proj"] = full["k_proj"] // 2  # one of the 2 KV heads
                assert got == want, f"rank {r} of {n}, layer {layer}"
            assert read["model.embed_tokens.weight"] == full_embed // n and read["lm_head.weight"] == full_embed // n
            # about 1/N of the sharded tensors (the replicated KV heads above 1/N at N=4)
            assert sum(read.values()) <= 1.2 * (2 * sum(full.values()) + 2 * full_embed) / n
        if n == 2:  # the ranks' slices tile each tensor: every byte read once in all
            with Checkpoint(d) as ck:
                for name in reads[0]:
                    assert reads[0][name] + reads[1][name] == ck.get(name).nbytes, name
        llm.close()


# -- refusals ----------------------------------------------------------------------------


def _fake_config(**fields: Any) -> Any:
    base = dict(architecture="LlamaForCausalLM", num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, quantization_config=None)
    return types.SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "n", "error", "match"),
    [
        ({}, 3, ConfigError, "tensor_parallel_size 3 does not divide num_attention_heads 4"),
        ({"intermediate_size": 90}, 4, ConfigError, "does not divide intermediate_size 90"),
        ({"num_attention_heads": 6, "num_key_value_heads": 3}, 2, ConfigError, "num_key_value_heads 3"),
        ({}, 0, InvalidArgumentError, "must be an int >= 1, got 0"),
        ({}, 2.0, InvalidArgumentError, "must be an int >= 1, got 2.0"),
        ({"architecture": "GPTNeoXForCausalLM"}, 2, InvalidArgumentError, "GPTNeoXForCausalLM family does not support tensor parallelism"),
        ({"architecture": "MixtralForCausalLM"}, 2, InvalidArgumentError, "MixtralForCausalLM family does not support tensor parallelism"),
        ({"architecture": "GemmaForCausalLM"}, 2, InvalidArgumentError, "GemmaForCausalLM family does not support tensor parallelism"),
        ({"architecture": "Phi3ForCausalLM"}, 2, InvalidArgumentError, "Phi3ForCausalLM family does not support tensor parallelism"),
        ({"quantization_config": {"quant_method": "gptq"}}, 2, InvalidArgumentError, "quantized checkpoints"),
    ],
)
def test_bad_tensor_parallel_size_is_refused(fields: dict[str, Any], n: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        check_tensor_parallel_family(_fake_config(**fields), n)


def test_llm_refuses_a_bad_size_and_other_backends(hf_models: Any) -> None:
    d = hf_models.dir("llama3_rope")
    with pytest.raises(ConfigError, match="tensor_parallel_size 3 does not divide num_attention_heads 4"):
        _llm(d, 3)
    with pytest.raises(InvalidArgumentError, match="reference backend only"):
        LLM(d, backend="tensorrt_rtx", progress=False, tensor_parallel_size=2)


def test_mapping_kv_heads_and_vocab() -> None:
    # 2 KV heads over 4 ranks: ranks 0, 1 read head 0, ranks 2, 3 head 1 (their query heads' group)
    assert [Mapping(4, r).kv_heads(2) for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [Mapping(2, r).kv_heads(4) for r in range(2)] == [(0, 2), (2, 4)]
    assert [Mapping(4, r).vocab(13) for r in range(4)] == [(0, 4, 4), (4, 8, 4), (8, 12, 4), (12, 13, 4)]
    check_tensor_parallel(_fake_config(), 1)  # one rank: anything goes
    with pytest.raises(InvalidArgumentError, match="rank 2 is outside"):
        Mapping(2, 2)


# -- tensorrt_rtx builds a rank ------------------------------------------------------------


def test_tensorrt_rtx_builds_a_rank_network(hf_models: Any) -> None:
    """Rank 1 of 2 with TensorRT-RTX ahead of time (sm89): TensorRT-RTX takes no plugins, so
    the collectives are its own IDistCollectiveLayer (an all-reduce after the embedding, o_proj
    and down_proj of each layer, an all-gather of the logits); the cache holds 1 of 2 KV heads."""
    rtx = pytest.importorskip("tensorrt_rtx")
    from trtcore.builder import build_engine, define_network
    from trtcore.config import load_config
    from trtcore.plan import BuildConfig

    d = hf_models.dir("llama3_rope")
    with Checkpoint(d) as ck:
        net = define_network(rtx, load_config(d), ck, BuildConfig(max_batch_size=2, max_seq_len=64), Mapping(2, 1))
        layers = [net.network.get_layer(i) for i in range(net.network.num_layers)]
        assert sum(layer.type == rtx.LayerType.DIST_COLLECTIVE for layer in layers) == 2 * 2 + 2
        assert net.graph.kv_mode is not None and net.graph.kv_mode.num_kv_heads == 1
        assert len(build_engine(net, "sm89")) > 0
