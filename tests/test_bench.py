"""``trtcore bench latency`` / ``throughput`` (issue 9, point 7) on the CPU with the reference
backend and the tiny checkpoints.

* the streamed weight bytes equal transformers' parameter count (the untied embedding left
  out) times the dtype's size;
* vLLM's request metrics of hand-made timestamps equal their definitions;
* both subcommands, through the CLI: the JSON report's schema; tokens counted equal
  requests x output length (x iterations); mean / median / p99 ordered; throughput equals
  tokens over duration; no copy bandwidth on the CPU; the plot is a PNG;
* ``--random-weights`` + ``--peer transformers``: transformers gets the very weights the
  engine was built from (its greedy tokens equal trtcore's), and the ratios are those of the
  reported numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import ModelStore, hf_models  # noqa: F401

from trtcore import SamplingParams, bench, cli
from trtcore.config import load_config
from trtcore.errors import InvalidArgumentError

QUANTITIES = ("ttft", "tpot", "itl", "e2el")
ROW_KEYS = {"batch_size", "completed", "total_input", "total_output", "duration_s", "request_throughput", "output_throughput",
            "total_token_throughput", "weight_GBps", "weight_streaming_fraction"} | {f"{s}_{q}_ms" for q in QUANTITIES for s in ("mean", "median", "p99")}  # fmt: skip
REPORT_KEYS = {"benchmark", "model", "random_weights", "backend", "device", "dtype", "quantization", "kv_cache", "kv_cache_dtype", "max_batch_size", "max_num_tokens", "input_len",
               "output_len", "num_iters", "streamed_weight_bytes", "copy_GBps", "results"}  # fmt: skip


@pytest.mark.parametrize("name", ["llama3_rope", "qwen2_bias", "qwen3_qknorm", "llama_linear_v4"])
def test_streamed_weight_bytes_count_transformers_parameters(hf_models: ModelStore, name: str) -> None:  # noqa: F811
    hf = hf_models.hf(name)
    params = sum(p.numel() for p in hf.parameters())  # a tied LM head is counted once
    if not hf.config.tie_word_embeddings:
        params -= hf.model.embed_tokens.weight.numel()  # gathered from, not streamed
    config = load_config(hf_models.dir(name))
    assert bench.streamed_weight_bytes(config, "bfloat16") == 2 * params
    assert bench.streamed_weight_bytes(config, "float32") == 4 * params


@pytest.mark.parametrize(
    "quantization, qconfig, bits",
    [
        ("fp8", None, 8.0),
        ("gptq", {"bits": 4, "group_size": 128}, 4 + 20 / 128),  # int4 codes, a float16 scale + a 4-bit zero per 128
        ("gptq", {"bits": 8, "group_size": -1}, 8.0),  # per output channel
        ("awq", {"w_bit": 4, "q_group_size": 64}, 4 + 20 / 64),
        ("compressed-tensors", {"config_groups": {"g": {"weights": {"num_bits": 4, "group_size": 32}}}}, 4 + 20 / 32),
    ],
)
def test_streamed_weight_bytes_of_quantized_projections(hf_models: ModelStore, quantization: str, qconfig: Any, bits: float) -> None:  # noqa: F811
    """The decoder projections (transformers' nn.Linear modules inside the layers) at the
    format's bits per weight, everything else in bfloat16."""
    import torch

    hf = hf_models.hf("llama3_rope")
    linear = sum(m.weight.numel() for m in hf.model.layers.modules() if isinstance(m, torch.nn.Linear))
    params = sum(p.numel() for p in hf.parameters()) - (0 if hf.config.tie_word_embeddings else hf.model.embed_tokens.weight.numel())
    config = load_config(hf_models.dir("llama3_rope"))
    assert bench.linear_weight_bits(quantization, qconfig) == pytest.approx(bits)
    got = bench.streamed_weight_bytes(config, "bfloat16", bench.linear_weight_bits(quantization, qconfig))
    assert got == round(linear * bits / 8) + 2 * (params - linear)


def test_linear_weight_bits_refuses_gguf() -> None:
    assert bench.linear_weight_bits(None, None) is None
    with pytest.raises(InvalidArgumentError, match="gguf"):
        bench.linear_weight_bits("gguf", None)


def test_request_metrics_follow_the_definitions() -> None:
    times = [[1.0, 2.0, 4.0], [3.0, 3.5], [2.0]]
    m = bench.request_metrics(times, 0.0, [5, 6, 7])
    assert (m["completed"], m["total_input"], m["total_output"], m["duration_s"]) == (3, 18, 6, 4.0)
    assert m["output_throughput"] == 6 / 4.0 and m["total_token_throughput"] == 24 / 4.0 and m["request_throughput"] == 3 / 4.0
    ttft, tpot, itl, e2el = [1.0, 3.0, 2.0], [1.5, 0.5], [1.0, 2.0, 0.5], [4.0, 3.5, 2.0]
    for q, v in zip(QUANTITIES, (ttft, tpot, itl, e2el)):
        ms = 1e3 * np.array(v)
        assert m[f"mean_{q}_ms"] == pytest.approx(ms.mean())
        assert m[f"median_{q}_ms"] == pytest.approx(np.median(ms))
        assert m[f"p99_{q}_ms"] == pytest.approx(_percentile(ms, 99))


def _percentile(values: np.ndarray, p: float) -> float:
    """The linear-interpolation percentile (Hyndman & Fan's type 7, NumPy's and vLLM's default)."""
    v = np.sort(values)
    pos = p / 100 * (len(v) - 1)
    lo = int(pos)
    return float(v[lo] + (pos - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo]))


def _check_report(report: dict[str, Any], kind: str, requests: list[int], output_len: int, iters: int) -> None:
    assert set(report) == REPORT_KEYS and report["benchmark"] == kind
    assert report["backend"] == "reference" and report["device"] == "cpu" and report["copy_GBps"] is None
    assert [r["batch_size"] for r in report["results"]] == requests
    for r, n in zip(report["results"], requests):
        assert ROW_KEYS <= set(r)
        assert r["completed"] == n * iters
        assert r["total_output"] == n * output_len * iters
        for q in QUANTITIES:
            assert 0 < r[f"median_{q}_ms"] <= r[f"p99_{q}_ms"], (q, r)
        assert r["median_ttft_ms"] <= r["median_e2el_ms"]
        assert r["p99_e2el_ms"] <= r["duration_s"] * 1e3 * (1 + 1e-9)
        assert r["weight_GBps"] == pytest.approx(report["streamed_weight_bytes"] / (r["median_tpot_ms"] * 1e-3) / 1e9)
        assert r["weight_streaming_fraction"] is None  # no copy bandwidth on the CPU


def test_bench_latency_cli(hf_models: ModelStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    model = hf_models.dir("llama3_rope")
    out, png = tmp_path / "lat.json", tmp_path / "lat.png"
    argv = ["bench", "latency", "--model", str(model), "--backend", "reference", "--batch-sizes", "1,3", "--input-len", "6",
            "--output-len", "5", "--num-iters", "2", "--json", str(out)]  # fmt: skip
    try:
        import matplotlib  # noqa: F401

        plotting = ["--plot", str(png)]
    except ImportError:  # an optional dependency: the rest is checked without it
        plotting = []
    assert cli.main([*argv, *plotting]) == 0
    report = json.loads(out.read_text())
    _check_report(report, "latency", [1, 3], 5, 2)
    assert report["streamed_weight_bytes"] == bench.streamed_weight_bytes(load_config(model), "float32")
    assert (report["input_len"], report["output_len"], report["max_batch_size"]) == (6, 5, 3)
    if plotting:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert "TTFT p50/p99" in text and "n/a (CPU)" in text


def test_bench_throughput_cli(hf_models: ModelStore, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "thr.json"
    argv = ["bench", "throughput", "--model", str(hf_models.dir("qwen2_bias")), "--backend", "reference", "--num-prompts", "5",
            "--max-batch-size", "2", "--input-len", "7", "--output-len", "4", "--max-num-tokens", "9", "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    _check_report(report, "throughput", [5], 4, 1)
    [r] = report["results"]
    # two 7-token prompts do not fit 9 tokens a step: prefill is chunked, the counts hold
    assert report["kv_cache"] == "paged" and report["max_batch_size"] == 2 and report["max_num_tokens"] == 9
    assert r["total_input"] == 5 * 7
    assert r["output_throughput"] == pytest.approx(r["total_output"] / r["duration_s"])
    # 5 requests, 2 at a time: the last ones wait for a free slot
    assert r["p99_ttft_ms"] > r["median_ttft_ms"]


def test_bench_needs_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "latency", "--backend", "reference"]) == 2
    assert "--model, --engine or --random-weights" in capsys.readouterr().err


def test_bench_refuses_a_bad_max_num_tokens(hf_models: ModelStore, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    argv = ["bench", "throughput", "--model", str(hf_models.dir("qwen2_bias")), "--backend", "reference", "--max-num-tokens", "0"]
    assert cli.main(argv) == 2
    assert "--max-num-tokens must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--batch-sizes", "a"], "--batch-sizes must be comma-separated positive integers such as 1,2,4,8; got 'a'"),
        (["--batch-sizes", "0,2"], "--batch-sizes must be"),
        (["--num-iters", "0"], "--num-iters must be >= 1 (timed runs per batch size), got 0"),
        (["--num-iters-warmup", "-1"], "--num-iters-warmup must be >= 0, got -1"),
        (["--random-weights", "SmolLM2-135M"], "--random-weights SmolLM2-135M and --model name two models"),
    ],
)
def test_bench_latency_refuses_bad_options_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """Each is a one-line error (exit 2), not a traceback, and nothing is built: the model
    folder does not even exist."""
    argv = ["bench", "latency", "--model", str(tmp_path / "absent"), "--backend", "reference", *extra]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def _args(**kw: Any) -> argparse.Namespace:
    base = {"model": None, "engine": None, "random_weights": None, "backend": "reference", "dtype": None, "kv_cache": None,
            "input_len": 6, "output_len": 4, "num_iters": 1, "num_iters_warmup": 0, "seed": 0, "peer": None, "batch_sizes": "1,2"}  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_bench_report_names_the_fp8_kv_cache(hf_models: ModelStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    """``--kv-cache-dtype fp8``: the JSON report and the table's title say the KV cache is FP8
    (a bfloat16-KV and an FP8-KV report of one model read the same otherwise)."""
    out = tmp_path / "lat.json"
    argv = ["bench", "latency", "--model", str(hf_models.dir("llama3_rope")), "--backend", "reference", "--dtype", "bfloat16",
            "--batch-sizes", "1", "--input-len", "4", "--output-len", "2", "--num-iters", "1", "--num-iters-warmup", "0", "--json", str(out)]  # fmt: skip
    assert cli.main([*argv, "--kv-cache-dtype", "fp8"]) == 0
    assert json.loads(out.read_text())["kv_cache_dtype"] == "fp8_e4m3"
    assert "(bfloat16, paged fp8_e4m3 KV cache)" in capsys.readouterr().out
    assert cli.main(argv) == 0
    assert json.loads(out.read_text())["kv_cache_dtype"] == "auto"
    assert "(bfloat16, paged KV cache)" in capsys.readouterr().out


@pytest.mark.parametrize(("option", "value", "built"), [("kv_cache_dtype", "fp8", "'auto'"), ("kv_cache", "contiguous", "'paged'")])
def test_bench_with_an_engine_refuses_a_kv_cache_option_the_engine_was_not_built_with(
    hf_models: ModelStore,  # noqa: F811
    tmp_path: Path,
    option: str,
    value: str,
    built: str,
) -> None:
    """``--engine`` with ``--kv-cache-dtype fp8`` (or ``--kv-cache contiguous``) on an engine built
    with the bfloat16 paged KV cache is refused naming both values, as ``generate`` and ``serve``
    do (they were dropped: the benchmark silently measured the engine's own KV cache)."""
    from trtcore.builder import build_engine, define_network, save_engine
    from trtcore.checkpoint import Checkpoint
    from trtcore.plan import BuildConfig, resolve_plan
    from trtcore.trt import load_trt

    model = hf_models.dir("llama3_rope")
    config = load_config(model)
    plan = resolve_plan(config, BuildConfig(dtype="bfloat16", kv_cache="paged", max_batch_size=2, max_seq_len=64), "reference")
    with Checkpoint(model) as weights:
        d = define_network(load_trt("reference"), config, weights, plan)
        engine = build_engine(d)
    path = tmp_path / "e.engine"
    save_engine(d, engine, path, backend="reference", compute_capability=None, model_dir=model)
    with pytest.raises(InvalidArgumentError, match=f"{option}='?{value}.*built with {option}={built}"):
        bench._make_llm(_args(engine=str(path), **{option: value}), 2, 16)
    llm, _ = bench._make_llm(_args(engine=str(path), **{option: None}), 2, 16)  # left out: the engine's
    assert (llm.plan.kv_cache, llm.plan.kv_cache_dtype) == ("paged", "auto")


def test_random_weights_peer_runs_on_the_same_weights(hf_models: ModelStore) -> None:  # noqa: F811
    """The peer's model holds the engine's random weights: float32 greedy tokens agree."""
    import torch

    config_json = str(hf_models.dir("llama3_rope") / "config.json")
    llm, weights = bench._make_llm(_args(random_weights=config_json, dtype="float32"), 2, 32)
    hf = bench._transformers_model(llm, weights)
    prompt = np.random.default_rng(3).integers(0, llm.config.vocab_size, 9).tolist()
    [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.outputs[0].token_ids == ref[0, len(prompt) :].tolist()


def test_bench_peer_transformers_cli(hf_models: ModelStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    out = tmp_path / "peer.json"
    argv = ["bench", "latency", "--random-weights", str(hf_models.dir("llama3_rope") / "config.json"), "--backend", "reference",
            "--batch-sizes", "1,2", "--input-len", "6", "--output-len", "16", "--num-iters", "1", "--peer", "transformers",
            "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["random_weights"] and report["dtype"] == "bfloat16"
    _check_report(report, "latency", [1, 2], 16, 1)
    for r in report["results"]:  # 16 tokens: transformers' TPOT, (t(16) - t(1)) / 15, stays above the timing noise under load
        hf = r["transformers"]
        assert set(hf) == {"ttft_ms", "tpot_ms", "e2el_ms", "output_throughput"} and hf["tpot_ms"] > 0
        assert r["decode_speedup"] == pytest.approx(hf["tpot_ms"] / r["median_tpot_ms"])
        assert r["output_throughput_ratio"] == pytest.approx(r["output_throughput"] / hf["output_throughput"])
    assert "transformers" in capsys.readouterr().out


BENCH_SCRIPTS = sorted(p for p in (Path(__file__).resolve().parent.parent / "bench").glob("*.py") if "argparse" in p.read_text())


@pytest.mark.parametrize("script", BENCH_SCRIPTS, ids=lambda p: p.name)
def test_bench_script_help_shows_its_whole_summary(script: Path) -> None:
    """``--help`` runs on the CPU and its description is the docstring's whole first paragraph
    (its first line alone stopped mid-sentence: "... against transformers' static-cache");
    bench_e2e.py's and profile_host.py's options each say what they are."""
    import ast
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = ast.get_docstring(ast.parse(script.read_text()), clean=False) or ""
    summary = " ".join(doc.split("\n\n")[0].split())
    assert summary in " ".join(proc.stdout.split()), (summary, proc.stdout)
    if script.name in ("bench_e2e.py", "profile_host.py"):
        lines = proc.stdout.split("options:", 1)[1].splitlines()
        for k, ln in enumerate(lines):
            if ln.startswith("  -"):  # "  --flag VALUE   help" or its help on the next line
                inline = "  " in ln.strip()
                below = k + 1 < len(lines) and lines[k + 1].startswith(" " * 8) and not lines[k + 1].lstrip().startswith("-")
                assert inline or below, f"{script.name}: {ln.strip()} has no help"
