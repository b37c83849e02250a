"""The ``trtcore`` command as a user runs it: convert, generate (streamed, --json, --chat),
build (tensorrt_rtx on the CPU, with its sidecar), check.

The model is a synthetic GGUF (tiny llama, real BPE tokenizer and chat template) written
by the GGUF tests' helper, converted with ``trtcore convert``; expectations come from
transformers or from an independent hash, never from trtcore itself.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_gguf import write_synthetic_gguf


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "trtcore.cli", *args], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    write_synthetic_gguf(root / "tiny.gguf", "llama", tokenizer="gpt2", pre="llama-bpe", tied=False, seed=3)
    proc = _cli("convert", "--gguf", str(root / "tiny.gguf"), "--output", str(root / "hf"))
    assert proc.returncode == 0, proc.stderr
    return root / "hf"


def _hf_greedy(model: Path, ids: list[int], steps: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float64, attn_implementation="eager").eval()
    seq = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


def test_convert_refuses_an_existing_folder(model: Path, tmp_path: Path) -> None:
    proc = _cli("convert", "--gguf", str(tmp_path / "missing.gguf"), "--output", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.startswith("trtcore: error:")
    assert not (tmp_path / "out").exists()


def test_generate_json_matches_transformers(model: Path) -> None:
    from transformers import AutoTokenizer

    proc = _cli("generate", "the theory of", "--model", str(model), "--max-tokens", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    tok = AutoTokenizer.from_pretrained(str(model))
    assert out["prompt"] == "the theory of"
    assert out["prompt_token_ids"] == tok("the theory of")["input_ids"]
    ref = _hf_greedy(model, out["prompt_token_ids"], 8)
    eos = json.loads((model / "generation_config.json").read_text())["eos_token_id"]
    eos = {eos} if isinstance(eos, int) else set(eos)
    cut = next((i + 1 for i, t in enumerate(ref) if t in eos), len(ref))
    assert out["token_ids"] == ref[:cut]
    assert out["text"] == tok.decode(out["token_ids"], skip_special_tokens=True)
    assert out["backend"] == "reference" and out["dtype"] == "float32"
    assert set(out["timings"]) >= {"load_s", "ttft_s", "e2e_s", "tpot_s"}


def test_generate_tensor_parallel_matches_transformers(model: Path) -> None:
    """--tensor-parallel-size 2: two simulated ranks give transformers' greedy tokens; 3 (not
    a divisor of the 4 heads) is refused in one line."""
    proc = _cli("generate", "the theory of", "--model", str(model), "--max-tokens", "6", "--json", "--tensor-parallel-size", "2")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    ref = _hf_greedy(model, out["prompt_token_ids"], 6)
    assert out["token_ids"] == ref[: len(out["token_ids"])] and out["token_ids"]
    bad = _cli("generate", "x", "--model", str(model), "--max-tokens", "1", "--tensor-parallel-size", "3")
    assert bad.returncode == 2 and bad.stderr.startswith("trtcore: error: tensor_parallel_size 3 does not divide num_attention_heads")


def test_generate_streams_prompt_and_continuation(model: Path) -> None:
    js = json.loads(_cli("generate", "the theory of", "--model", str(model), "--max-tokens", "8", "--json").stdout)
    proc = _cli("generate", "the theory of", "--model", str(model), "--max-tokens", "8")
    assert proc.returncode == 0
    assert proc.stdout == "the theory of" + js["text"] + "\n"


def test_generate_chat_applies_the_template(model: Path) -> None:
    proc = _cli("generate", "hello", "--model", str(model), "--chat", "--max-tokens", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    expected = tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    assert out["prompt"] == expected


def test_build_rtx_engine_and_sidecar(model: Path, tmp_path: Path) -> None:
    engine = tmp_path / "tiny.engine"
    proc = _cli(
        "build", "--model", str(model), "--output", str(engine), "--backend", "tensorrt_rtx",
        "--dtype", "float16", "--compute-capability", "sm89", "--max-batch-size", "2", "--max-seq-len", "64",
    )
    assert proc.returncode == 0, proc.stderr
    side = json.loads((tmp_path / "tiny.engine.json").read_text())
    assert side["engine_sha256"] == hashlib.sha256(engine.read_bytes()).hexdigest()
    assert side["dtype"] == "float16" and side["backend"] == "tensorrt_rtx"
    assert side["target"]["compute_capability"] == "sm89"
    import tensorrt_rtx

    assert side["tensorrt_version"] == tensorrt_rtx.__version__
    prof = side["optimization_profiles"][0]
    assert prof["input_ids"]["max"] == [2, 64]
    cfg = json.loads((model / "config.json").read_text())
    assert side["model_config"]["hidden_size"] == cfg["hidden_size"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.engine", "tiny.engine.json"]


def test_build_quantizes_a_float_checkpoint_to_fp8(model: Path, tmp_path: Path) -> None:
    """``trtcore build --quantization fp8`` (vLLM's option) on a float checkpoint builds the FP8
    network (the linears quantized at the build, as LLM(quantization='fp8')) and records that
    quantization in the sidecar; a quantization the checkpoint does not have is refused."""
    from trtcore.quant_formats import FP8_ON_THE_FLY

    engine = tmp_path / "fp8.engine"
    proc = _cli(
        "build", "--model", str(model), "--output", str(engine), "--backend", "tensorrt_rtx", "--quantization", "FP8",
        "--dtype", "bfloat16", "--compute-capability", "sm89", "--max-batch-size", "2", "--max-seq-len", "64",
    )
    assert proc.returncode == 0, proc.stderr
    side = json.loads((tmp_path / "fp8.engine.json").read_text())
    assert side["model_config"]["quantization_config"] == FP8_ON_THE_FLY
    plain = json.loads(_cli_ok_sidecar(model, tmp_path / "plain"))
    assert side["engine_bytes"] != plain["engine_bytes"]  # another network: the Q/DQ linears
    bad = _cli("build", "--model", str(model), "--output", str(tmp_path / "g.engine"), "--backend", "tensorrt_rtx", "--quantization", "gptq",
               "--compute-capability", "sm89")
    assert bad.returncode == 2 and "quantization='gptq', but config.json has no quantization_config and there is no quantize_config.json" in bad.stderr
    assert not (tmp_path / "g.engine").exists()


def _cli_ok_sidecar(model: Path, folder: Path) -> str:
    """The sidecar text of a plain (float) tensorrt_rtx build of ``model`` in ``folder``."""
    folder.mkdir()
    proc = _cli(
        "build", "--model", str(model), "--output", str(folder / "e.engine"), "--backend", "tensorrt_rtx",
        "--dtype", "bfloat16", "--compute-capability", "sm89", "--max-batch-size", "2", "--max-seq-len", "64",
    )
    assert proc.returncode == 0, proc.stderr
    return (folder / "e.engine.json").read_text()


def test_build_rejects_bad_target(model: Path, tmp_path: Path) -> None:
    proc = _cli("build", "--model", str(model), "--output", str(tmp_path / "x.engine"), "--backend", "tensorrt_rtx",
                "--compute-capability", "sm90")
    assert proc.returncode == 2 and "sm90" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_check_reports_agreement(model: Path) -> None:
    proc = _cli("check", "--model", str(model), "--prompt", "the theory of")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout
    err = float(proc.stdout.split("max relative logit error ")[1].split()[0])
    assert np.isfinite(err) and err <= 1e-4


def test_generate_checks_the_prompt_before_echoing_it(model: Path) -> None:
    long_prompt = "the theory of " * 3000  # far more tokens than max_seq_len
    proc = _cli("generate", long_prompt, "--model", str(model), "--max-tokens", "4")
    assert proc.returncode == 2 and "trtcore: error: prompt 0 has" in proc.stderr
    assert proc.stdout == ""


def test_generate_refuses_an_empty_prompt_before_building(tmp_path: Path) -> None:
    """An empty PROMPT is refused before the model is even looked at (an engine build takes
    minutes on a GPU): the model folder here does not exist."""
    proc = _cli("generate", "", "--model", str(tmp_path / "no-such-model"), "--max-tokens", "4")
    assert proc.returncode == 2 and proc.stderr.startswith("trtcore: error: PROMPT is empty"), proc.stderr


def test_generate_reads_the_prompt_from_stdin_with_a_dash(model: Path) -> None:
    """``trtcore generate -`` takes the prompt from standard input (``echo``'s newline dropped)
    and streams as with the same text given as the argument; no PROMPT with piped input runs
    the default prompt and says on stderr how to read it; an empty input is refused."""
    given = _cli("generate", "the theory of", "--model", str(model), "--max-tokens", "6", "--json")
    piped = subprocess.run(
        [sys.executable, "-m", "trtcore.cli", "generate", "-", "--model", str(model), "--max-tokens", "6", "--json"],
        input="the theory of\n", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["token_ids"] == json.loads(given.stdout)["token_ids"]
    assert json.loads(piped.stdout)["prompt"] == "the theory of"
    default = subprocess.run(
        [sys.executable, "-m", "trtcore.cli", "generate", "--model", str(model), "--max-tokens", "2", "--json"],
        input="ignored", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert default.returncode == 0 and json.loads(default.stdout)["prompt"] == "Once upon a time", default.stderr
    assert "give '-' to read the prompt from standard input" in default.stderr
    empty = subprocess.run(
        [sys.executable, "-m", "trtcore.cli", "generate", "-", "--model", str(model)], input="", capture_output=True, text=True, timeout=300
    )
    assert empty.returncode == 2 and "PROMPT is empty" in empty.stderr, empty.stderr


def test_generate_kv_cache_memory_reaches_the_pool(model: Path) -> None:
    """``generate --kv-cache-memory`` (serve had it, generate did not): a budget below one block
    is refused naming the bytes and what a block takes; one that holds the sequence runs."""
    proc = _cli("generate", "the theory of", "--model", str(model), "--max-tokens", "4", "--kv-cache-memory", "1")
    assert proc.returncode == 2 and "KV cache budget of 1 bytes holds no block" in proc.stderr, proc.stderr
    proc = _cli("generate", "the theory of", "--model", str(model), "--max-tokens", "4", "--kv-cache-memory", str(64 << 20), "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["token_ids"]) == 4


def test_check_refuses_an_empty_prompt_before_building(tmp_path: Path) -> None:
    """It was a torch traceback (an empty float tensor of ids) after the build."""
    proc = _cli("check", "--model", str(tmp_path / "no-such-model"), "--prompt", "")
    assert proc.returncode == 2 and proc.stderr.startswith("trtcore: error: compare_with_transformers needs a prompt"), proc.stderr


def test_plan_options_offer_every_implementation_the_plan_knows() -> None:
    """``--rope`` / ``--kv-cache`` / ``--attention`` of generate and build accept exactly the
    plan's implementations (``rope attention``: RoPE inside the paged-attention plugin)."""
    from trtcore.cli import _parser
    from trtcore.plan import IMPLEMENTATIONS

    ap = _parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("generate", "build"):
        opts = {a.dest: a for a in sub.choices[command]._actions}
        for dest in ("rope", "kv_cache", "attention"):
            assert tuple(opts[dest].choices) == IMPLEMENTATIONS[dest], (command, dest)
    assert ap.parse_args(["generate", "--rope", "attention"]).rope == "attention"


def test_python_m_trtcore_runs_the_command() -> None:
    """``python -m trtcore`` is the ``trtcore`` command (for a PATH without the console script)."""
    proc = subprocess.run([sys.executable, "-m", "trtcore", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "quantize" in proc.stdout and "generate" in proc.stdout


#: greedy_differing of the verdict test: none, one near-tie, a swap the difference cannot explain,
#: two near-ties
_NEAR = {"step": 2, "trtcore": 7, "transformers": 9, "margin": 0.01, "difference": 0.3, "near_tie": True}
_DIFFERING = {
    "equal": [],
    "near-tie": [_NEAR],
    "fault": [{**_NEAR, "margin": 2.0, "near_tie": False}],
    "two near-ties": [_NEAR, {**_NEAR, "step": 5}],
}


@pytest.mark.parametrize(
    ("fp8", "greedy", "err", "code"),
    [
        (True, "equal", 0.08, 0), (True, "near-tie", 0.08, 0), (True, "fault", 0.08, 1), (True, "two near-ties", 0.08, 1),
        (True, "equal", 0.3, 1), (False, "equal", 0.08, 1), (False, "near-tie", 0.08, 1), (True, "equal", 1e-6, 0),
        (False, "equal", 1e-6, 0),
    ],
)  # fmt: skip
def test_check_verdict_with_fp8_activations_is_the_greedy_tokens(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fp8: bool, greedy: str, err: float, code: int
) -> None:
    """FP8 activations: a logit error beyond the tolerance but within FP8_LOGIT_TOLERANCE (0.25)
    is OK where the greedy tokens are equal or differ at one near-tie (a float32 last-bit
    difference moves an E4M3 code by 1/16 and can flip a near-tie), and the note names each
    differing step; a swap the logit difference cannot explain, two flips, an error beyond 0.25,
    and any error beyond the tolerance without FP8 activations fail."""
    from trtcore import check, cli

    differing = _DIFFERING[greedy]
    close = len(differing) <= 1 and all(d["near_tie"] for d in differing)
    report = {"architecture": "LlamaForCausalLM", "num_tokens": 3, "max_rel_error": err, "trtcore_token": 5, "transformers_token": 5,
              "greedy_equal": not differing, "greedy_close": close, "greedy_differing": differing, "fp8_activations": fp8}  # fmt: skip
    monkeypatch.setattr(check, "compare_with_transformers", lambda model, prompt: report)
    monkeypatch.setattr(cli, "_model_dir", lambda m: m)
    assert cli.main(["check", "--model", "x", "--prompt", "hi"]) == code
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("OK" if code == 0 else "FAIL")
    assert ("FP8 activations" in out) == (fp8 and err > 1e-4)
    if fp8 and differing and err > 1e-4:
        d = differing[0]
        assert f"step {d['step']}: trtcore 7 vs transformers 9 (transformers' margin {d['margin']:.3g}, logit difference 0.3: " + (
            "a near-tie)" if d["near_tie"] else "not a near-tie)"
        ) in out


@pytest.mark.parametrize(("fp8", "diverged"), [(True, True), (True, False), (False, True)])
def test_check_bisect_notes_fp8_activations_at_a_divergence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fp8: bool, diverged: bool
) -> None:
    """check --bisect on a checkpoint with FP8 activations: a divergence still exits 1 (a module
    left the tolerance), and the note says why that need not be a fault and where the verdict is;
    no note without a divergence or without FP8 activations."""
    from trtcore import check, cli

    status = check.FIRST_DIVERGENCE if diverged else check.OK
    modules = (check.ModuleError("model.layers.0.mlp", "model.layers.0.mlp.down_proj", 3e-3 if diverged else 1e-6, status),)
    report = check.CompareReport("LlamaForCausalLM", 3, 1e-4, modules, fp8)
    monkeypatch.setattr(check, "compare", lambda *a, **k: report)
    monkeypatch.setattr(cli, "_model_dir", lambda m: m)
    assert cli.main(["check", "--bisect", "--model", "x", "--prompt", "hi"]) == (1 if diverged else 0)
    out = capsys.readouterr().out
    assert ("first divergence: model.layers.0.mlp" in out) == diverged
    assert ("FP8 activations" in out) == (fp8 and diverged)
    if fp8 and diverged:
        assert "without --bisect gives the verdict" in out


def test_greedy_close_is_one_flipped_near_tie() -> None:
    """check.greedy_close against the rule written out, on fresh draws: at most one step's
    argmax differs, and there each is among the other's 5 largest logits and transformers'
    margin between them is within twice the step's largest logit difference. And the faults an
    adversarial review injected fail: top-1 and top-2 swapped at every step, top-1 swapped with
    the 5th at every step."""
    from trtcore.check import greedy_close

    rng = np.random.default_rng()
    for _ in range(300):
        ref = rng.standard_normal((4, 12))
        ours = ref + rng.standard_normal((4, 12)) * rng.choice([1e-3, 0.05, 0.3, 3.0])
        close, differing = greedy_close(ours, ref)
        want = []
        for k in range(4):
            a, b = int(ours[k].argmax()), int(ref[k].argmax())
            if a != b:
                in_ref = sorted(ref[k], reverse=True).index(ref[k][a]) < 5
                in_ours = sorted(ours[k], reverse=True).index(ours[k][b]) < 5
                margin, diff = ref[k][b] - ref[k][a], np.abs(ours[k] - ref[k]).max()
                want.append((k, a, b, in_ref and in_ours and margin <= 2 * diff))
        assert [(d["step"], d["trtcore"], d["transformers"], d["near_tie"]) for d in differing] == want
        assert close == (len(want) <= 1 and all(w[3] for w in want))
    ref = rng.standard_normal((8, 50))
    order = np.argsort(-ref, axis=-1)
    for rank in (1, 4):  # swap the top token's logit with the 2nd's / the 5th's, every step
        ours = ref.copy()
        rows = np.arange(8)
        ours[rows, order[:, 0]], ours[rows, order[:, rank]] = ref[rows, order[:, rank]], ref[rows, order[:, 0]]
        assert not greedy_close(ours, ref)[0]


def test_check_names_what_transformers_could_not_load(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """transformers refusing a checkpoint (a hand-edited config whose group size does not fit
    the tensors made it raise a page of torch / pydantic text, and trtcore check print the
    traceback): one line, 'trtcore: error: transformers cannot load ...', exit status 2."""
    from trtcore import check, cli

    class Refusing:
        @staticmethod
        def from_pretrained(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("The size of tensor a (576) must match the size of tensor b (72)\n" + "at dimension 1\n" * 50)

    class Reporting:  # transformers 5's loader: a report in its log, then an exception that points to it
        @staticmethod
        def from_pretrained(*args: Any, **kwargs: Any) -> Any:
            import logging

            log = logging.getLogger("transformers.modeling_utils")
            log.warning("LOAD REPORT\n| key | status |\n| layers.0.q_proj | CONVERSION: 96 is not divisible by the given group_size 64 |")
            raise RuntimeError("We encountered some issues, look at the CONVERSION entries of the above report!")

    torch, _ = check._transformers()
    import transformers

    verbosity = transformers.logging.get_verbosity()
    request.addfinalizer(lambda: transformers.logging.set_verbosity(verbosity))
    transformers.logging.set_verbosity_error()  # as another test may have left it: the report is still kept
    monkeypatch.setattr(check, "_transformers", lambda: (torch, Refusing))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(check.CheckpointError, match=r"^transformers cannot load .*: RuntimeError: The size of tensor a \(576\) must match the size of tensor b \(72\)$"):
        check._load_hf(Refusing, torch, tmp_path)
    capsys.readouterr()
    with pytest.raises(check.CheckpointError, match=r"issues, look at the CONVERSION .* \(its load report: .*96 is not divisible by the given group_size 64 \|\)$"):
        check._load_hf(Reporting, torch, tmp_path)
    assert "LOAD REPORT" not in capsys.readouterr().err  # kept for the message, not printed
    capsys.readouterr()
    assert cli.main(["check", "--model", str(model), "--prompt", "hello"]) == 2
    err = capsys.readouterr().err
    assert "trtcore: error: transformers cannot load" in err and err.endswith("must match the size of tensor b (72)\n"), err
    assert "Traceback" not in err and "at dimension 1" not in err


def test_sigterm_removes_the_half_written_output_and_exits_143(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """SIGTERM (what ``timeout``, ``kill`` and ``docker stop`` send) while a command writes its
    output folder: the hidden partial folder is removed, as for Ctrl-C, the exit status is
    128 + 15 and the process's own SIGTERM handler is back afterwards."""
    import os
    import signal

    from trtcore import cli
    from trtcore.fileio import atomic_folder

    out = tmp_path / "out"
    seen: list[Path] = []

    def writes_then_is_terminated(args: argparse.Namespace) -> int:
        with atomic_folder(out) as tmp:
            (tmp / "model.safetensors").write_bytes(b"x" * 1000)
            seen.append(tmp)
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(cli, "_quantize", writes_then_is_terminated)
    before = signal.getsignal(signal.SIGTERM)
    rc = cli.main(["quantize", "--model", str(tmp_path), "--output", str(out)])
    assert rc == 128 + signal.SIGTERM
    assert "trtcore: terminated" in capsys.readouterr().err
    assert seen and not seen[0].exists() and not out.exists()
    assert list(tmp_path.iterdir()) == []  # no hidden .out.partial-* either
    assert signal.getsignal(signal.SIGTERM) == before
