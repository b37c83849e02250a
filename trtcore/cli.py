"""The ``trtcore`` command: ``generate``, ``build``, ``bench``, ``serve``, ``convert``, ``check``.

Every trtcore error (bad model folder, bad request, missing backend) is printed as one
line ``trtcore: error: ...`` on stderr with exit status 2; no traceback.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import stat
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .checkout import drop_checkout_root
from .errors import InvalidArgumentError, InvalidRequestError, TrtcoreError
from .plan import IMPLEMENTATIONS, KV_CACHE_DTYPES

DEFAULT_PROMPT = "Once upon a time"


def _model_dir(model: str | None) -> Path:
    if model:
        return Path(model)
    from .default_model import default_model_dir

    return default_model_dir(progress=True)


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 disables")
    p.add_argument("--top-p", type=float, default=1.0, help="1 disables")
    p.add_argument("--seed", type=int, default=None, help="per-request random seed (same seed, same text)")


def _add_kv_cache_dtype(p: argparse.ArgumentParser) -> None:
    """``--kv-cache-dtype`` (vLLM's name and values): the KV cache's element type."""
    p.add_argument(
        "--kv-cache-dtype",
        type=str.lower,  # as LLM(kv_cache_dtype=...): FP8 is fp8
        choices=KV_CACHE_DTYPES,
        help="KV cache element type: auto (the model dtype, default) or fp8 / fp8_e4m3 (E4M3 with per-layer scales from the "
        "checkpoint, else 1.0; paged KV cache, float16/bfloat16 model; twice the tokens in the same memory)",
    )


def _add_quantization(p: argparse.ArgumentParser, engine: bool) -> None:
    """``--quantization`` (vLLM's name); ``engine``: the command also runs engine files."""
    from .quant_formats import QUANTIZATION_METHODS

    p.add_argument(
        "--quantization",
        type=str.lower,  # as LLM(quantization=...): FP8 is fp8
        choices=QUANTIZATION_METHODS,
        help="the checkpoint's quantization (default: config.json's quantization_config"
        + (", or with --engine the engine's" if engine else "")
        + "); fp8 on a float checkpoint quantizes its linears to FP8 at load; gptq / awq read AutoGPTQ's quantize_config.json / "
        "AutoAWQ's quant_config.json where config.json has none",
    )


def _add_engine(p: argparse.ArgumentParser) -> None:
    """``--engine``, ``--quantization`` and ``--kv-cache-dtype`` (vLLM's names): what the LLM runs."""
    p.add_argument("--engine", help="run this engine file from `trtcore build` (checked against its sidecar) instead of building")
    _add_quantization(p, engine=True)
    _add_kv_cache_dtype(p)


def _llm(args: argparse.Namespace) -> Any:
    """The ``LLM`` of ``--model`` / ``--engine`` and the plan options of ``args``."""
    from .llm import LLM

    model = args.model if args.engine else _model_dir(args.model)  # an engine's sidecar names its model folder
    tp = getattr(args, "tensor_parallel_size", 1)
    return LLM(
        model,
        engine=args.engine,
        backend=args.backend,
        device=args.device,
        tensor_parallel_size=tp,
        quantization=args.quantization,
        **_plan_choices(args),
        **_runtime_choices(args),
    )


def _add_implementations(p: argparse.ArgumentParser, attention_default: str | None = None) -> None:
    """``--rope``, ``--kv-cache``, ``--attention``: the plan's implementation choices
    (:data:`trtcore.plan.IMPLEMENTATIONS`)."""
    p.add_argument(
        "--rope",
        choices=IMPLEMENTATIONS["rope"],
        help="RoPE implementation: plugin, layers, or inside the attention plugin (default: plugin where the backend hosts plugins)",
    )
    p.add_argument("--kv-cache", choices=IMPLEMENTATIONS["kv_cache"], help="KV cache mode (default: paged where the backend hosts plugins)")
    p.add_argument(
        "--attention",
        choices=IMPLEMENTATIONS["attention"],
        default=attention_default,
        help="contiguous cache: composed layers or TensorRT's IAttention + IKVCacheUpdateLayer (default layers)",
    )


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    ap = argparse.ArgumentParser(prog="trtcore", description="LLM inference through TensorRT's network-definition API")
    ap.add_argument("--version", action="version", version=f"trtcore {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text from a prompt (streams to stdout)")
    g.add_argument(
        "prompt",
        nargs="?",
        help=f"prompt text, or '-' to read it from standard input (default {DEFAULT_PROMPT!r})",
    )
    g.add_argument("--model", help="Hugging Face model folder (default: SmolLM2-135M-Instruct; with --engine: the folder its sidecar names)")
    _add_engine(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    _add_sampling(g)
    g.add_argument("--backend", help="reference | tensorrt | tensorrt_rtx | cuda")
    g.add_argument("--dtype", choices=("float32", "float16", "bfloat16"))
    _add_implementations(g)
    g.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="a check: the reference backend runs on the CPU, the others on the GPU (use --backend cuda on a GPU)",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    g.add_argument(
        "--kv-cache-memory",
        type=int,
        help="bytes of the paged KV block pool (default 256 MiB on the CPU; on a GPU, the free memory the engine leaves)",
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="split each layer over N ranks (Llama family; simulated in this process on the reference backend)",
    )

    b = sub.add_parser("build", help="build a serialized TensorRT engine and its JSON sidecar")
    b.add_argument("--model", help="Hugging Face model folder (default: SmolLM2-135M-Instruct)")
    b.add_argument("--output", required=True, help="engine file to write; the sidecar is OUTPUT.json")
    b.add_argument(
        "--backend",
        default=None,
        choices=("tensorrt", "tensorrt_rtx", "cuda"),
        help="default: $TRTCORE_BACKEND, else tensorrt where it runs on this GPU, else cuda with a GPU, CuPy and nvmath-python, else tensorrt_rtx",
    )
    b.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), help="default: the checkpoint's float16/bfloat16, else float16")
    b.add_argument("--compute-capability", help="tensorrt_rtx only: target such as sm89 (no GPU needed)")
    b.add_argument("--max-batch-size", type=int, default=8)
    b.add_argument("--max-seq-len", type=int, help="default: the model's max_position_embeddings")
    _add_implementations(b, attention_default="layers")
    _add_quantization(b, engine=False)
    _add_kv_cache_dtype(b)

    from .bench import add_bench_parsers
    from .bench_serve import add_bench_serve_parser

    add_bench_serve_parser(
        add_bench_parsers(sub.add_parser("bench", help="latency / throughput of generation, load test of a server (vllm bench style)"), _add_engine)
    )

    from .serve.server import add_serve_parser

    add_serve_parser(sub.add_parser("serve", help="an OpenAI-compatible HTTP server (completions, chat, metrics)"), _add_engine)

    c = sub.add_parser("convert", help="convert a GGUF file into a Hugging Face model folder")
    c.add_argument("--gguf", required=True, help="GGUF file (llama or qwen2 architecture)")
    c.add_argument("--output", required=True, help="folder to create")
    c.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it is a model folder (holds config.json)")
    c.add_argument(
        "--keep-quantized",
        action="store_true",
        help="keep Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K linear weights in their GGUF blocks (quantization 'gguf') instead of float16",
    )

    q = sub.add_parser("quantize", help="quantize a checkpoint's linears into a compressed-tensors (pack-quantized / float-quantized) checkpoint")
    q.add_argument("--model", required=True, help="Hugging Face model folder (float safetensors; Llama-family architecture)")
    q.add_argument("--output", required=True, help="folder to create")
    q.add_argument(
        "--method",
        default="rtn",
        type=str.lower,  # as --quantization: RTN is rtn
        choices=["rtn", "awq", "gptq", "fp8"],
        help="rtn: round to nearest; awq: activation-aware scales from calibration text, then RTN; "
        "gptq: each column rounded in turn, its error spread over the rest by calibration statistics (GPTQ); "
        "fp8: E4M3 weights and activations (compressed-tensors float-quantized)",
    )
    q.add_argument(
        "--calibration",
        help="awq, gptq, and fp8 with static activations or --kv-cache-scales: calibration text file (default: trtcore's own, "
        "about 3,700 words of English)",
    )
    q.add_argument(
        "--calibration-tokens",
        type=int,
        default=None,
        help="awq, gptq, and fp8 with static activations or --kv-cache-scales: calibration tokens in all (default 4096, or all of the built-in text where it gives fewer; fewer tokens "
        "quantize faster and with less memory)",
    )
    q.add_argument(
        "--strategy",
        type=str.lower,
        choices=["channel", "tensor"],
        default=None,
        help="fp8: weight scales per output channel (default) or per tensor",
    )
    q.add_argument(
        "--activations",
        type=str.lower,  # as --method: STATIC is static
        choices=["static", "dynamic", "token"],
        default=None,
        help="fp8: input scales calibrated (amax / 448 over the calibration text; the default), computed per call, or per token per call",
    )
    q.add_argument(
        "--kv-cache-scales",
        action="store_true",
        help="fp8: also calibrate the FP8 KV cache's k_scale / v_scale per layer (kv_cache_scheme, as llm-compressor; "
        "read with --kv-cache-dtype fp8)",
    )
    q.add_argument("--bits", type=int, default=None, choices=[4, 8], help="rtn, awq, gptq: bits per weight (default 4)")
    q.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="input features per scale; 0 for one scale per output channel (default: the largest of 128/64/32 dividing the K of every linear)",
    )
    q.add_argument("--symmetric", action="store_true", help="no zero points")
    q.add_argument(
        "--observer",
        type=str.lower,
        choices=["minmax", "mse"],
        default=None,
        help="rtn, awq, gptq: each group's range as it is (minmax), or shrunk to minimize its error (mse: GPTQ's / llm-compressor's grid search); default minmax",
    )
    q.add_argument(
        "--dampening-frac",
        type=float,
        default=None,
        help="gptq: damping added to the Hessian's diagonal, as a fraction of its mean (llm-compressor's dampening_frac; default 0.01)",
    )
    q.add_argument(
        "--first-token-weight",
        type=float,
        default=None,
        help="gptq: how many times each calibration sequence's first token counts in the Hessian (default 4; 1: the GPTQ paper's unweighted one)",
    )
    q.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it is a model folder (holds config.json)")

    k = sub.add_parser("check", help="compare trtcore's logits with Hugging Face transformers'")
    k.add_argument("--model", help="Hugging Face model folder (default: SmolLM2-135M-Instruct)")
    k.add_argument("--prompt", default=DEFAULT_PROMPT)
    k.add_argument("--tolerance", type=float, default=1e-4, help="max relative logit error; with --bisect per module, relative L2 (default 1e-4)")
    k.add_argument("--bisect", action="store_true", help="compare module by module and name the first divergence")
    k.add_argument("--reference", help="with --bisect: the folder transformers loads (default: --model), e.g. the original of a converted checkpoint")
    k.add_argument(
        "--backend",
        default="reference",
        choices=("reference", "tensorrt", "cuda"),
        help="with --bisect: trtcore's backend; a GPU backend's engine keeps the compared tensors as outputs (default: reference)",
    )
    k.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"), help="with --bisect: trtcore's dtype (default float32)")
    k.add_argument(
        "--kv-cache",
        default="contiguous",
        choices=("contiguous", "paged"),
        help="with --bisect: KV cache mode (paged: reference backend only; default contiguous)",
    )
    return ap


def _plan_choices(args: argparse.Namespace) -> dict[str, Any]:
    """The plan options ``generate`` and ``build`` both take (``--dtype``, ``--rope``,
    ``--kv-cache``, ``--attention``, ``--kv-cache-dtype``), as keywords of ``LLM`` and
    ``BuildConfig``; those not given are left out (their defaults; with ``--engine``, the engine's)."""
    names = ("dtype", "rope", "kv_cache", "attention", "kv_cache_dtype")
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _runtime_choices(args: argparse.Namespace) -> dict[str, Any]:
    """The LLM's runtime options ``generate`` takes (``--kv-cache-memory``; serve has its own),
    those not given left out."""
    return {"kv_cache_memory": args.kv_cache_memory} if getattr(args, "kv_cache_memory", None) is not None else {}


def _read_prompt(prompt: str | None) -> str:
    """generate's prompt: the argument; all of standard input for ``-`` (one trailing newline
    dropped, as ``echo`` adds it); :data:`DEFAULT_PROMPT` for none, with a note on stderr when
    input is a pipe or a redirected file (it is read only with ``-``: an open pipe with nothing
    in it would block).

    Raises:
        InvalidRequestError: ``-`` and standard input cannot be read."""
    if prompt is None:
        try:  # a pipe or a redirected file; not a terminal, /dev/null or a closed input
            mode = os.fstat(sys.stdin.fileno()).st_mode if sys.stdin is not None else 0
        except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
            mode = 0
        piped = stat.S_ISFIFO(mode) or stat.S_ISREG(mode)
        if piped:
            print(f"trtcore: no PROMPT given, so {DEFAULT_PROMPT!r}; give '-' to read the prompt from standard input", file=sys.stderr)
        return DEFAULT_PROMPT
    if prompt != "-":
        return prompt
    try:
        text = sys.stdin.read() if sys.stdin is not None else ""
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"PROMPT '-' reads standard input, which cannot be read here: {exc}") from exc
    return text[:-1] if text.endswith("\n") else text


def _generate(args: argparse.Namespace) -> int:
    from .runtime.sampling import SamplingParams

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, max_tokens=args.max_tokens)
    args.prompt = _read_prompt(args.prompt)
    if not args.prompt and not args.chat:  # before the engine build, which can take minutes
        raise InvalidRequestError("PROMPT is empty; give some text to continue (or --chat for a chat turn)")
    t0 = time.perf_counter()
    llm = _llm(args)
    load_s = time.perf_counter() - t0
    prompt = args.prompt
    request: Any = prompt
    if args.chat:  # the rendered template holds its BOS: encoded without the tokenizer's (LLM.chat)
        prompt = llm.apply_chat_template([{"role": "user", "content": prompt}])
        request = {"prompt_token_ids": llm.encode(prompt, add_special_tokens=False)}
    if args.json:
        [out] = llm.generate(request, params)
        comp = out.outputs[0]
        print(
            json.dumps(
                {
                    "model": str(llm.model_dir),
                    "engine": args.engine,
                    "backend": llm.backend,
                    "dtype": llm.build_config.dtype,
                    "prompt": prompt,
                    "prompt_token_ids": out.prompt_token_ids,
                    "token_ids": comp.token_ids,
                    "text": comp.text,
                    "finish_reason": comp.finish_reason,
                    "timings": {
                        "load_s": load_s,
                        **out.metrics,
                        "tokens_per_s": len(comp.token_ids) / out.metrics["e2e_s"] if out.metrics.get("e2e_s") else None,
                    },
                }
            )
        )
        return 0
    pieces = llm.stream(request, params)
    first = next(pieces, None)  # the prompt is checked (and prefilled) before it is echoed
    if not args.chat:
        sys.stdout.write(prompt)
    for piece in itertools.chain([first] if first is not None else [], pieces):
        sys.stdout.write(piece.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _build(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from .builder import build_engine, check_writable, define_network, save_engine
    from .checkpoint import Checkpoint
    from .config import load_config
    from .plan import BuildConfig, resolve_plan
    from .quant_formats import resolve_quantization
    from .trt import load_trt

    model = _model_dir(args.model)
    config, _ = resolve_quantization(model, load_config(model), args.quantization)  # as LLM(quantization=...)
    options = BuildConfig(max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len, **_plan_choices(args))
    plan = resolve_plan(config, options, args.backend, engine=True)  # the same rules as LLM(...)
    if args.max_seq_len is not None and plan.max_seq_len < args.max_seq_len:
        print(f"trtcore: note: --max-seq-len {args.max_seq_len} capped at the model's max_position_embeddings ({plan.max_seq_len})", file=sys.stderr)
    check_writable(Path(args.output))
    trt = load_trt(plan.backend)
    with Checkpoint(model) as weights, tqdm(total=3, desc="build") as bar:
        bar.set_postfix_str("defining network")
        d = define_network(trt, config, weights, plan)
        bar.update()
        bar.set_postfix_str(f"building engine ({plan.backend})")
        engine = build_engine(d, args.compute_capability)
        bar.update()
        bar.set_postfix_str("writing")
        side = save_engine(d, engine, Path(args.output), backend=plan.backend, compute_capability=args.compute_capability, model_dir=model)
        bar.update()
    print(f"wrote {args.output} ({len(engine)} bytes) and {side}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    return int(args.handler(args))  # trtcore.bench's subcommand


def _serve(args: argparse.Namespace) -> int:
    from .serve.server import serve

    return serve(args)


def _convert(args: argparse.Namespace) -> int:
    from .gguf_convert import convert_gguf

    out = convert_gguf(args.gguf, args.output, progress=True, overwrite=args.overwrite, keep_quantized=args.keep_quantized)
    print(f"wrote {out}")
    return 0


def _quantize(args: argparse.Namespace) -> int:
    from .quantizer import quantize_checkpoint

    out = quantize_checkpoint(
        args.model,
        args.output,
        method=args.method,
        bits=args.bits,
        group_size=args.group_size,
        symmetric=args.symmetric,
        observer=args.observer,
        dampening_frac=args.dampening_frac,
        first_token_weight=args.first_token_weight,
        overwrite=args.overwrite,
        calibration=args.calibration,
        calibration_tokens=args.calibration_tokens,
        strategy=args.strategy,
        activations=args.activations,
        kv_cache_scales=args.kv_cache_scales,
        progress=True,
    )
    if args.group_size is None and args.method != "fp8":  # say which default group size was chosen
        weights = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]["weights"]
        print(f"group size {weights['group_size']} (the largest of 128/64/32 dividing the K of every linear)")
    print(f"wrote {out}")
    return 0


#: why trtcore and transformers differ on FP8 activations without a fault (check's notes)
_FP8_ROUNDING = (
    "FP8 activations: trtcore and transformers round in float32 differently in their last bit, which can move an activation's "
    "E4M3 code by a 1/16 step"
)


def _check(args: argparse.Namespace) -> int:
    from .check import compare, compare_with_transformers

    if not args.tolerance >= 0:  # NaN or negative: every run would FAIL
        raise InvalidArgumentError(f"--tolerance must be a number >= 0, got {args.tolerance:g}")
    if args.bisect:
        bisect = compare(
            _model_dir(args.model),
            args.prompt,
            reference=args.reference,
            tolerance=args.tolerance,
            backend=args.backend,
            dtype=args.dtype,
            kv_cache=args.kv_cache,
        )
        print(bisect.table())
        first = bisect.first_divergence
        print(
            f"{bisect.architecture}: {bisect.num_tokens} prompt tokens; "
            + (f"first divergence: {first.module}" if first else f"every module within {args.tolerance:g}")
        )
        if first is not None and bisect.fp8_activations:
            print(
                f"  {_FP8_ROUNDING}, so a module can leave the tolerance without a fault; `trtcore check` without --bisect gives the verdict (the greedy tokens)"
            )
        return 0 if first is None else 1
    given = [
        f"--{n.replace('_', '-')}"
        for n, default in (("reference", None), ("backend", "reference"), ("dtype", "float32"), ("kv_cache", "contiguous"))
        if getattr(args, n) != default
    ]
    if given:
        raise InvalidArgumentError(f"{', '.join(given)} needs --bisect")
    report = compare_with_transformers(_model_dir(args.model), args.prompt)
    within = report["max_rel_error"] <= args.tolerance
    # FP8 activations: a last-bit float32 difference moves an E4M3 code by a 1/16 step, so the
    # logits may leave any float tolerance without a fault; within a loose cap the greedy tokens
    # are the verdict (check.greedy_close: equal, or one flipped near-tie)
    from .check import FP8_LOGIT_TOLERANCE

    ok = within or (report["fp8_activations"] and report["max_rel_error"] <= FP8_LOGIT_TOLERANCE and report["greedy_close"])
    print(
        f"{report['architecture']}: {report['num_tokens']} prompt tokens; max relative logit error "
        f"{report['max_rel_error']:.3g} (tolerance {args.tolerance:g}); greedy next token "
        f"trtcore {report['trtcore_token']} vs transformers {report['transformers_token']} -> {'OK' if ok else 'FAIL'}"
    )
    if report["fp8_activations"] and not within:
        steps = "; ".join(
            f"step {d['step']}: trtcore {d['trtcore']} vs transformers {d['transformers']} "
            f"(transformers' margin {d['margin']:.3g}, logit difference {d['difference']:.3g}: "
            + ("a near-tie)" if d["near_tie"] else "not a near-tie)")
            for d in report["greedy_differing"]
        )
        print(
            f"  {_FP8_ROUNDING}; such a checkpoint passes with a logit error up to {FP8_LOGIT_TOLERANCE:g} "
            "if the greedy tokens (transformers fed trtcore's) are equal or differ at one near-tie: "
            + (steps or "they are equal")
            + " (--bisect names the layer where a code moved, not a fault)"
        )
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trtcore`` console script; returns the exit status."""
    drop_checkout_root()  # before a command imports transformers (trtcore.checkout)
    args = _parser().parse_args(argv)
    handlers: dict[str, Any] = {
        "generate": _generate,
        "build": _build,
        "convert": _convert,
        "quantize": _quantize,
        "check": _check,
        "bench": _bench,
        "serve": _serve,
    }
    format_warning = warnings.formatwarning
    import trtcore.kernels
    import trtcore.plugins

    # trtcore's code: its package and the kernels / plugins folders it maps in
    ours = [Path(m.__file__).resolve().parent for m in (sys.modules[__package__ or "trtcore"], trtcore.kernels, trtcore.plugins) if m.__file__]

    def one_line(message: Any, category: Any, filename: str, lineno: int, line: str | None = None) -> str:
        # trtcore's warnings are one line, as its errors are; other packages' keep Python's format
        where = Path(filename).resolve()
        if any(where.is_relative_to(root) for root in ours):
            return f"trtcore: warning: {message}\n"
        return format_warning(message, category, filename, lineno, line)

    warnings.formatwarning = one_line
    on_term = _terminate_as_exception()
    try:
        return int(handlers[args.command](args))
    except TrtcoreError as exc:
        print(f"trtcore: error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        print(f"trtcore: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trtcore: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("trtcore: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        warnings.formatwarning = format_warning
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)


class _Terminated(BaseException):
    """SIGTERM, raised where the command is (what ``timeout``, ``kill`` and ``docker stop``
    send): the ``with`` blocks and ``except BaseException`` clean-ups on the way out run, as
    for Ctrl-C -- a half-written output folder is removed (:func:`trtcore.fileio.atomic_folder`)."""


def _terminate_as_exception() -> Any:
    """Make SIGTERM raise :class:`_Terminated` in the main thread; returns the handler it
    replaced (for ``main`` to put back), or None where signals cannot be set (another thread)."""

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated(signum)

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
