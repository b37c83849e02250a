"""``trtcore check``: run a checkpoint through trtcore and through Hugging Face transformers.

:func:`compare_with_transformers` (``trtcore check``) compares the final logits; the
bisection :func:`compare` (``trtcore check --bisect``) compares module by module, see below.

For the logits check both run in float32 (trtcore on the reference backend on the CPU with the contiguous KV
cache, whose per-layer cache it feeds step by step; transformers with eager
attention) on the same token ids: the prompt, then ``steps`` greedy tokens chosen by
trtcore. The error reported is ``max |trtcore - hf| / max |hf|`` over the logits of the
last prompt position and of every decode step.

The bisection aligns transformers' module outputs (forward hooks) with trtcore's network
tensors (``capture=``: read at run time on the reference backend, kept as extra engine outputs
on a GPU backend) through a per-family table,
:data:`BISECT_POINTS` (Hugging Face module path -> trtcore tensor name, both following
the checkpoint's module names), and reports the relative L2 error of each, in forward
order, marking the first beyond the tolerance: a conversion, a quantization or a port
that goes wrong shows at the module where it starts.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .checkout import drop_checkout_root
from .errors import CheckpointError, ConfigError, InvalidArgumentError, TrtcoreError, UnsupportedArchitectureError


def _transformers() -> tuple[Any, Any]:
    """``(torch, AutoModelForCausalLM)``, or a TrtcoreError naming what to install."""
    drop_checkout_root()  # trtcore's kernels/ would shadow the package transformers imports
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise TrtcoreError(f"trtcore check needs torch and transformers ({exc}); install them with: pip install 'trtcore[test]'") from exc
    return torch, AutoModelForCausalLM


def decompressing_config() -> Any:
    """The ``CompressedTensorsConfig`` that has transformers read a compressed-tensors checkpoint
    as float weights (its packed ints dequantized at load): ``dequantize=True`` where this
    transformers has the argument (5.25 does, and warns that ``run_compressed`` is deprecated),
    else ``run_compressed=False``, its older name."""
    from transformers.utils.quantization_config import CompressedTensorsConfig

    if "dequantize" in inspect.signature(CompressedTensorsConfig.__init__).parameters:
        return CompressedTensorsConfig(dequantize=True)
    return CompressedTensorsConfig(run_compressed=False)


def _load_hf(auto_model: Any, torch: Any, folder: str | Path) -> Any:
    """transformers' float32 model of ``folder`` with eager attention, in eval mode. A
    compressed-tensors checkpoint of int weights (what ``trtcore quantize`` writes for rtn / awq
    / gptq) is read decompressed (:func:`decompressing_config`: its packed int weights as float
    weights), the form transformers runs on the CPU; an FP8 one (float weights,
    ``float-quantized`` or ``naive-quantized``) as it is, so that its linears quantize their
    inputs (static ``input_scale`` or dynamic) too, with the per-tensor scales of each packed
    module (q/k/v, gate/up) made one, the largest, as trtcore and vLLM run them
    (:func:`share_hf_fp8_scales`). The ``quant_method: "fp8"`` layout, which transformers runs
    on the CPU only as dequantized weights (its ``weight_scale_inv``; it drops ``weight_scale``
    and ``input_scale``), is read through a ``float-quantized`` copy (:func:`_fp8_as_float_quantized`).
    GGUF blocks kept by ``trtcore convert --gguf --keep-quantized`` (trtcore's own
    ``quant_method: "gguf"``, which transformers cannot read) run as their dequantized float
    weights (:func:`_load_hf_gguf`).

    Raises:
        TrtcoreError: the checkpoint needs a package that is not installed (named).
        CheckpointError: transformers cannot load the checkpoint."""
    kwargs: dict[str, Any] = {}
    try:
        quant = json.loads((Path(folder) / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, ValueError):
        quant = {}  # transformers says what is wrong with the folder
    from .quant_formats.fp8 import check_hf_fp8

    method = str(quant.get("quant_method") or "").lower()
    if method == "gguf":
        return _load_hf_gguf(auto_model, torch, folder, quant)
    if method == "fp8" and check_hf_fp8(quant) is None:  # a layout trtcore reads (block-wise scales: transformers' own)
        with tempfile.TemporaryDirectory(prefix="trtcore-check-fp8-") as tmp:
            # the copy's files may go once loaded: transformers holds the tensors in memory
            try:
                return _load_hf(auto_model, torch, _fp8_as_float_quantized(Path(folder), quant, Path(tmp)))
            except CheckpointError as exc:  # name the user's folder, not the copy
                raise CheckpointError(str(exc).replace(tmp, f"{folder} (as compressed-tensors float-quantized)")) from exc
    # FP8 (float weights) is read as it is: transformers then fake-quantizes each linear's
    # input as trtcore does; decompressed it would run float inputs and ignore input_scale
    if method == "compressed-tensors" and not _float_weights(quant):
        kwargs["quantization_config"] = decompressing_config()
    with _transformers_quiet() as report:
        try:
            model = auto_model.from_pretrained(
                str(folder), dtype=torch.float32, attn_implementation="eager", experts_implementation="eager", **kwargs
            )
        except ImportError as exc:  # e.g. compressed-tensors, gptqmodel
            raise TrtcoreError(f"transformers cannot read {folder} here: {exc}") from exc
        except Exception as exc:  # a config its loader refuses, tensors that do not fit it: not trtcore's fault
            telling = [line for line in report if any(w in line.lower() for w in ("error", "divisible", "mismatch", "must", "expected"))]
            cause = "; ".join(telling or report[-2:])[:600]
            raise CheckpointError(
                f"transformers cannot load {folder}, so there is nothing to compare with: {_first_line(exc)}"
                + (f" (its load report: {cause})" if cause else "")
            ) from exc
    share_hf_fp8_scales(model, torch)
    return model.eval()


def _float_weights(quantization_config: dict[str, Any]) -> bool:
    """Whether a compressed-tensors config's groups quantize weights to floats (FP8)."""
    from .quant_formats.compressed_tensors import weight_args, with_defaults
    from .quant_formats.fp8 import fp8_weight_args

    return fp8_weight_args(weight_args(with_defaults(quantization_config)))


def _fp8_as_float_quantized(folder: Path, quantization_config: dict[str, Any], dst: Path) -> Path:
    """A copy of the ``quant_method: "fp8"`` checkpoint ``folder`` in compressed-tensors'
    ``float-quantized`` layout, in ``dst``: each FP8 linear as trtcore reads it
    (:class:`~trtcore.fp8.Fp8Weight`: its E4M3 codes, ``weight_scale`` per tensor or per
    channel, the static ``input_scale``), the other tensors as they are, and a config group per
    weight-scale strategy whose targets are those linears (by name), so that transformers
    quantizes their inputs as the checkpoint says (static or dynamic per tensor). Returns ``dst``.

    Raises:
        CheckpointError: the checkpoint's tensors do not read (named), or its FP8 linears mix
            static and dynamic inputs."""
    import ml_dtypes
    from safetensors.numpy import save_file

    from .checkpoint import Checkpoint
    from .quant_formats import quantized_weights

    tensors: dict[str, np.ndarray] = {}
    linears: dict[str, list[str]] = {"tensor": [], "channel": []}  # by weight-scale strategy: a config group each
    static = set()
    with Checkpoint(folder) as ck:
        weights = quantized_weights(ck, quantization_config)
        for name in weights:
            if not weights.is_quantized(name):
                tensors[name] = np.ascontiguousarray(weights.get(name))
                continue
            w = weights.quantized(name)
            prefix = name[: -len(".weight")]
            channel = w.weight_scale.size > 1
            linears["channel" if channel else "tensor"].append(prefix)
            tensors[name] = w.weight.view(ml_dtypes.float8_e4m3fn)
            tensors[f"{prefix}.weight_scale"] = w.weight_scale.reshape(-1, 1) if channel else w.weight_scale.reshape(1)
            static.add(w.input_scale is not None)
            if w.input_scale is not None:
                tensors[f"{prefix}.input_scale"] = w.input_scale.reshape(1)
    if len(static) > 1:
        raise CheckpointError(f"{folder}: its FP8 linears mix static and dynamic input scales; one kind is read")
    activations = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": static != {True}}
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        # per-tensor linears keep their one scale, so share_hf_fp8_scales gives each packed
        # module one as trtcore does
        "config_groups": {
            f"group_{strategy}": {
                "targets": [f"re:^{re.escape(p)}$" for p in sorted(names)],
                "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": False},
                "input_activations": activations,
            }
            for strategy, names in linears.items()
            if names
        },
        "ignore": [],
    }
    save_file(tensors, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(config))
    if (folder / "generation_config.json").is_file():
        shutil.copy2(folder / "generation_config.json", dst / "generation_config.json")
    return dst


def _load_hf_gguf(auto_model: Any, torch: Any, folder: str | Path, quantization_config: dict[str, Any]) -> Any:
    """transformers' float32 model (eager attention, eval mode) of a folder of kept GGUF blocks
    (``quantization_config``: its config.json's),
    its quantized linears as :meth:`QuantizedWeight.dequantize` gives them (float64, rounded
    once to float32; tested against gguf-py and llama.cpp's formulas in tests/test_quant_gguf.py):
    what the weight-only plugin computes with, so check compares the network, not the format.

    Raises:
        CheckpointError: the config or the tensors do not make the model (named)."""
    from transformers import AutoConfig

    from .checkpoint import Checkpoint
    from .quant_formats import quantized_weights

    with _transformers_quiet():
        try:
            config = AutoConfig.from_pretrained(str(folder))
            if hasattr(config, "quantization_config"):  # the float model; its weights come below
                del config.quantization_config
            model = auto_model.from_config(config, dtype=torch.float32, attn_implementation="eager")
        except Exception as exc:
            raise CheckpointError(f"transformers cannot make the model of {folder}, so there is nothing to compare with: {_first_line(exc)}") from exc
    target = model.state_dict()  # the model's own tensors: each weight is copied in as it is read
    unexpected = []
    with Checkpoint(folder) as ck, torch.no_grad():
        weights = quantized_weights(ck, quantization_config)
        for name in weights:
            if name not in target:
                unexpected.append(name)
                continue
            a = weights.quantized(name).dequantize() if weights.is_quantized(name) else weights.get(name)
            t = torch.from_numpy(np.asarray(a, np.float32))
            if tuple(t.shape) != tuple(target[name].shape):
                raise CheckpointError(f"{folder}: {name} is {tuple(t.shape)}, transformers' {type(model).__name__} wants {tuple(target[name].shape)}")
            target[name].copy_(t)
        given = set(weights)
    model.tie_weights()
    tied = getattr(config, "tie_word_embeddings", False)
    missing = [n for n in target if n not in given and not (n == "lm_head.weight" and tied)]
    if missing or unexpected:
        raise CheckpointError(f"{folder}: transformers' {type(model).__name__} misses {missing[:4]} and does not know {unexpected[:4]}")
    return model.eval()


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[list[str]]:
    """While inside: transformers' log lines (its load report) are kept in the yielded list
    instead of printed (a failing load printed some 40 lines before trtcore's one), and the
    warning that check's own quantization_config overrides the checkpoint's is not shown."""
    logger = logging.getLogger("transformers")
    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.extend(line.strip() for line in record.getMessage().splitlines() if line.strip())

    handler, propagate, level = Keep(logging.WARNING), logger.propagate, logger.level
    saved = list(logger.handlers)
    # its report is a warning: kept whatever verbosity was set before (set_verbosity_error drops it)
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You passed `quantization_config`")
            yield kept
    finally:
        logger.handlers, logger.propagate = saved, propagate
        logger.setLevel(level)


def _first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (pydantic's and torch's run to pages)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


#: how many of each side's most likely tokens the other's greedy token must be among, at a step
#: where the two greedy tokens differ (vLLM's tests/models/utils.py check_logprobs_close, which
#: compares a model with transformers so, with its top 5 logprobs)
GREEDY_TOP_K = 5
#: the largest relative logit error (max |trtcore - transformers| / max |transformers|) a
#: checkpoint with FP8 activations may show and still pass on its greedy tokens: moved E4M3
#: codes gave 0.06-0.12 on the default model; a fault that rescales or reorders logits more
#: does not pass on its ranks alone
FP8_LOGIT_TOLERANCE = 0.25


def greedy_close(ours: np.ndarray, ref: np.ndarray, top_k: int = GREEDY_TOP_K) -> tuple[bool, list[dict[str, Any]]]:
    """Whether two implementations' greedy tokens on the same prefix agree up to one flipped
    near-tie (after vLLM's check_logprobs_close, which stops at the first divergence): at most
    one step's argmax tokens differ, and there each is among the other's ``top_k`` tokens and
    transformers' margin between the two (``ref[b] - ref[a]``) is within twice the two
    implementations' largest logit difference at that step, so that the difference explains the
    swap. A fault that reorders the logits at every step, or swaps tokens far apart, fails.

    Args:
        ours, ref: logits ``[steps, vocab]`` of both on the same token prefix at each step.

    Returns:
        ``(close, differing)``: the verdict, and each step whose argmax differs:
        ``{"step", "trtcore", "transformers", "margin", "difference", "near_tie"}``.
    """
    differing: list[dict[str, Any]] = []
    top_ours = np.argsort(-ours, axis=-1)[:, :top_k]
    top_ref = np.argsort(-ref, axis=-1)[:, :top_k]
    for step, (a, b) in enumerate(zip(np.argmax(ours, -1), np.argmax(ref, -1))):
        if a != b:
            margin = float(ref[step, b] - ref[step, a])
            diff = float(np.abs(ours[step] - ref[step]).max())
            near = bool(a in top_ref[step] and b in top_ours[step] and margin <= 2 * diff)
            differing.append({"step": step, "trtcore": int(a), "transformers": int(b), "margin": margin, "difference": diff, "near_tie": near})
    return len(differing) <= 1 and all(d["near_tie"] for d in differing), differing


def share_hf_fp8_scales(model: Any, torch: Any) -> int:
    """Give the per-tensor FP8 linears of each packed module of a transformers model (loaded
    from a compressed-tensors ``float-quantized`` checkpoint: E4M3 ``weight``, ``weight_scale``,
    ``input_scale``) one weight scale and one input scale, the largest, requantizing the codes
    as trtcore does at build (:func:`trtcore.fp8.share_tensor_scale`, vLLM's requantization with
    the max scale), so that transformers judges the numbers trtcore computes. The family's
    packed modules come from ``model.config.model_type`` (none for a family trtcore does not
    know). Per-channel and unquantized linears are left as they are.

    Returns:
        how many linears were changed.
    """
    from .families import family_of
    from .fp8 import Fp8Weight, share_tensor_scale
    from .quant_formats import packed_siblings

    try:
        packed = family_of(model.config.model_type).packed_modules
    except ConfigError:  # a family trtcore does not build: nothing is packed
        return 0
    fp8 = {
        f"{name}.weight": m
        for name, m in model.named_modules()
        if getattr(m, "weight_scale", None) is not None and getattr(m, "weight", None) is not None and m.weight.dtype == torch.float8_e4m3fn
    }
    changed = 0
    seen: set[str] = set()
    for name in fp8:
        if name in seen:
            continue
        group = [n for n in packed_siblings(name, packed) if n in fp8]
        seen.update(group)
        if len(group) < 2 or any(fp8[n].weight_scale.numel() != 1 for n in group):
            continue
        mods = [fp8[n] for n in group]
        parts = [
            Fp8Weight(
                m.weight.detach().view(torch.uint8).numpy().copy(),
                m.weight_scale.detach().float().reshape(1).numpy().copy(),
                None if getattr(m, "input_scale", None) is None else m.input_scale.detach().float().reshape(1).numpy().copy(),
            )
            for m in mods
        ]
        for m, old, new in zip(mods, parts, share_tensor_scale(parts)):
            if new is old:
                continue
            changed += 1
            with torch.no_grad():
                m.weight.copy_(torch.from_numpy(new.weight).view(torch.float8_e4m3fn))
                m.weight_scale.copy_(torch.from_numpy(new.weight_scale).reshape(m.weight_scale.shape))
                if new.input_scale is not None:
                    m.input_scale.copy_(torch.from_numpy(new.input_scale).reshape(m.input_scale.shape))
    return changed


def compare_with_transformers(model_dir: str | Path, prompt: str | list[int], steps: int = 8) -> dict[str, Any]:
    """Compare trtcore's and transformers' logits for ``prompt``.

    Returns:
        dict with ``architecture``, ``num_tokens`` (prompt length), ``max_rel_error``,
        ``trtcore_token`` / ``transformers_token`` (greedy next token after the prompt),
        ``greedy_equal`` (all ``steps`` greedy tokens equal), ``greedy_close`` and
        ``greedy_differing`` (:func:`greedy_close`: at most one flipped near-tie),
        ``fp8_activations`` (the checkpoint quantizes activations to
        FP8: a last-bit float32 difference before a linear can move one of its E4M3 codes by a
        1/16 step, so the logits may differ by far more than float32 rounding without a fault).
        transformers runs trtcore's greedy tokens (teacher-forced), so both logits of a step
        follow the same prefix.

    Raises:
        TrtcoreError: torch / transformers are not installed.
        CheckpointError: transformers cannot load or run the checkpoint (its first line).
        InvalidArgumentError: an empty prompt.
    """
    if not prompt:  # before the build
        raise InvalidArgumentError(f"compare_with_transformers needs a prompt of at least one token, got {prompt!r}")
    torch, AutoModelForCausalLM = _transformers()
    from .llm import LLM
    from .runtime.sampling import SamplingParams

    llm = LLM(model_dir, backend="reference", dtype="float32", max_batch_size=1, kv_cache="contiguous", device="cpu")
    ids = llm.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise InvalidArgumentError(f"compare_with_transformers: the prompt {prompt!r} encodes to no token")
    [out] = llm.generate([ids], SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True, logprobs=0))
    ours_tokens = out.outputs[0].token_ids
    hf = _load_hf(AutoModelForCausalLM, torch, model_dir)
    # step by step through transformers' KV cache, as trtcore runs: one call per step, so that
    # dynamic per-tensor activation scales (FP8) cover the same tokens in both
    # (the cache argument is ``cache`` in transformers >= 5.x's latest, ``past_key_values`` before)
    cache_arg = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    rows = []
    try:
        with torch.no_grad():
            res = hf(torch.tensor([ids]), position_ids=torch.arange(len(ids))[None], use_cache=True)
            rows.append(res.logits[0, -1].double().numpy())
            for k, t in enumerate(ours_tokens[:-1]):
                step = {cache_arg: getattr(res, cache_arg), "position_ids": torch.tensor([[len(ids) + k]])}
                res = hf(torch.tensor([[t]]), use_cache=True, **step)
                rows.append(res.logits[0, -1].double().numpy())
    except Exception as exc:  # e.g. a quantization_config whose group size does not fit the tensors
        raise CheckpointError(f"transformers cannot run {model_dir}, so there is nothing to compare with: {_first_line(exc)}") from exc
    ref = np.stack(rows)
    ours = _trtcore_logits(llm, ids, ours_tokens[:-1])
    err = float(np.abs(ours - ref).max() / np.abs(ref).max())
    close, differing = greedy_close(ours, ref)
    return {
        "architecture": llm.config.architecture,
        "num_tokens": len(ids),
        "max_rel_error": err,
        "trtcore_token": int(np.argmax(ours[0])),
        "transformers_token": int(np.argmax(ref[0])),
        "greedy_equal": bool((np.argmax(ref, -1) == np.array(ours_tokens)).all()),
        "greedy_close": close,
        "greedy_differing": differing,
        "fp8_activations": _quantizes_activations(llm),
    }


def _quantizes_activations(llm: Any) -> bool:
    """Whether the LLM's checkpoint is FP8 (every FP8 scheme trtcore reads quantizes activations)."""
    from .quant_formats import detect_quantization

    scheme = detect_quantization(llm.config.quantization_config)
    return scheme is not None and scheme.fp8


def _trtcore_logits(llm: Any, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """Logits ``[1 + len(continuation), vocab]`` at the last prompt position and each step,
    fed step by step through the LLM's contiguous KV cache (``llm.engine.kv_cache``)."""
    kv = llm.engine.kv_cache
    kv.reset(1)
    rows = []
    start = 0
    for chunk in [prompt] + [[t] for t in continuation]:
        pos = np.arange(start, start + len(chunk))[None]
        out = llm.executor.run(kv.step_feeds(np.array([chunk]), pos, pos, np.array([len(chunk) - 1])))
        kv.update(out)
        rows.append(np.asarray(llm.executor.to_host(out["logits"], "logits")[0], np.float64))
        start += len(chunk)
    return np.stack(rows)


# --- trtcore check --bisect: the first module where trtcore leaves transformers ----------


@dataclass(frozen=True)
class BisectPoint:
    """One module compared by :func:`compare`.

    Attributes:
        hf_module: the transformers module path whose forward output is hooked
            (``{i}``: the decoder layer index), e.g. ``model.layers.{i}.self_attn``; a module
            that returns a tuple is read at its first element.
        tensor: the trtcore network tensor of the same value (``{i}`` likewise), named by the
            ops' scopes (:class:`trtcore.ops.Graph`), e.g. ``model.layers.{i}.self_attn.o_proj``.
        last_only: trtcore computes it at the last prompt position only (the final norm and
            the logits follow :func:`trtcore.ops.last_token_hidden`); transformers' value is
            then read at that position.
    """

    hf_module: str
    tensor: str
    last_only: bool = False


#: The Llama-style families' points, in forward order: the embeddings, per decoder layer
#: the attention output (after ``o_proj``), the MLP output (after ``down_proj``) and the
#: residual stream leaving the layer, then the final norm and the logits.
LLAMA_BISECT_POINTS: tuple[BisectPoint, ...] = (
    BisectPoint("model.embed_tokens", "model.embed_tokens"),
    BisectPoint("model.layers.{i}.self_attn", "model.layers.{i}.self_attn.o_proj"),
    BisectPoint("model.layers.{i}.mlp", "model.layers.{i}.mlp.down_proj"),
    BisectPoint("model.layers.{i}", "model.layers.{i}.mlp_residual"),
    BisectPoint("model.norm", "model.norm", last_only=True),
    BisectPoint("lm_head", "logits", last_only=True),
)

#: The mixture-of-experts families (models/moe.py): as Llama, the MLP point being the sparse MoE
#: block's output (routed experts, plus Qwen2-MoE's gated shared expert); a dense layer of a Qwen
#: MoE model (``mlp_only_layers``, ``decoder_sparse_step``) has ``mlp.down_proj`` instead and shows
#: as not captured there.
MOE_BISECT_POINTS: tuple[BisectPoint, ...] = tuple(
    BisectPoint(p.hf_module, "model.layers.{i}.mlp.output") if p.hf_module == "model.layers.{i}.mlp" else p for p in LLAMA_BISECT_POINTS
)

#: Gemma's points: as Llama's (the attention and MLP outputs are read before Gemma 2/3's norms
#: after them, as transformers' ``self_attn`` / ``mlp`` modules return them), the embeddings
#: after their ``sqrt(hidden_size)`` scaling, and the logits before the final soft-capping
#: (transformers' ``lm_head`` output; trtcore's ``lm_head`` tensor).
GEMMA_BISECT_POINTS: tuple[BisectPoint, ...] = (*LLAMA_BISECT_POINTS[:-1], BisectPoint("lm_head", "lm_head", last_only=True))

#: ``model_type`` -> the modules :func:`compare` aligns (points with ``{i}`` repeat for every
#: decoder layer, in the order given). A new family adds its entry here.
BISECT_POINTS: dict[str, tuple[BisectPoint, ...]] = {
    **{t: LLAMA_BISECT_POINTS for t in ("llama", "mistral", "qwen2", "qwen3")},
    **{t: MOE_BISECT_POINTS for t in ("mixtral", "qwen2_moe", "qwen3_moe")},
    # Phi-3: the Llama decoder over its split fused projections (trtcore.models.phi3), same module paths
    "phi3": LLAMA_BISECT_POINTS,
    **{t: GEMMA_BISECT_POINTS for t in ("gemma", "gemma2", "gemma3_text")},
}

#: :attr:`ModuleError.status` values
OK, BEYOND, FIRST_DIVERGENCE, NOT_CAPTURED = "ok", "beyond", "FIRST DIVERGENCE", "not captured"


@dataclass(frozen=True)
class ModuleError:
    """The comparison of one module.

    Attributes:
        module: the transformers module path (``model.layers.1.self_attn``).
        tensor: the trtcore tensor compared with it.
        rel_error: ``||trtcore - hf||_2 / ||hf||_2`` in float64 over every compared
            position (None: not captured).
        status: ``"ok"``, ``"FIRST DIVERGENCE"`` (the first beyond the tolerance),
            ``"beyond"`` (a later one beyond it) or ``"not captured"`` (the backend's
            network has no such tensor, e.g. fused away: nothing is guessed).
    """

    module: str
    tensor: str
    rel_error: float | None
    status: str


@dataclass(frozen=True)
class CompareReport:
    """What :func:`compare` found.

    Attributes:
        architecture: the checkpoint's architecture.
        num_tokens: prompt length (the tokens of the prefill compared).
        tolerance: the relative L2 error allowed per module.
        modules: one :class:`ModuleError` per point, in forward order.
        fp8_activations: the checkpoint quantizes activations to FP8 (E4M3), where a last-bit
            float32 difference can move a code by a 1/16 step: a divergence need not be a fault.
    """

    architecture: str
    num_tokens: int
    tolerance: float
    modules: tuple[ModuleError, ...]
    fp8_activations: bool = False

    @property
    def first_divergence(self) -> ModuleError | None:
        """The first module beyond the tolerance (None: every captured one is within it)."""
        return next((m for m in self.modules if m.status == FIRST_DIVERGENCE), None)

    @property
    def ok(self) -> bool:
        """Every captured module within the tolerance."""
        return self.first_divergence is None

    def table(self) -> str:
        """The report as a text table: module, trtcore tensor, relative error, status."""
        rows = [("module", "trtcore tensor", "rel err", "status")]
        rows += [(m.module, m.tensor, "-" if m.rel_error is None else f"{m.rel_error:.3g}", m.status) for m in self.modules]
        widths = [max(len(r[k]) for r in rows) for k in range(3)]
        return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}  {d}" for a, b, c, d in rows)


def bisect_points(model_type: str, num_hidden_layers: int) -> list[BisectPoint]:
    """The points of :data:`BISECT_POINTS` for ``model_type``, ``{i}`` expanded per layer.

    Raises:
        UnsupportedArchitectureError: no entry for ``model_type``.
    """
    if model_type not in BISECT_POINTS:
        raise UnsupportedArchitectureError(
            f"trtcore check --bisect has no module table for model_type {model_type!r} (known: {sorted(BISECT_POINTS)}); add one to trtcore.check.BISECT_POINTS"
        )
    out: list[BisectPoint] = []
    layer_points: list[BisectPoint] = []

    def flush() -> None:
        out.extend(BisectPoint(p.hf_module.format(i=i), p.tensor.format(i=i), p.last_only) for i in range(num_hidden_layers) for p in layer_points)
        layer_points.clear()

    for p in BISECT_POINTS[model_type]:
        if "{i}" in p.hf_module:
            layer_points.append(p)
        else:
            flush()
            out.append(p)
    flush()
    return out


def compare(
    model: str | Path,
    prompt: str | list[int],
    *,
    reference: str | Path | None = None,
    backend: str = "reference",
    dtype: str = "float32",
    tolerance: float = 1e-4,
    kv_cache: str = "contiguous",
) -> CompareReport:
    """Bisect trtcore against transformers module by module on the prefill of ``prompt``.

    transformers (float32, eager attention) runs the prompt with a forward hook on each
    module of :func:`bisect_points`; trtcore runs the same token ids through its prefill
    (``kv_cache`` ``"contiguous"`` or ``"paged"``) with ``capture=`` of the matching
    tensors. Each pair is compared by relative L2 error in float64; the first beyond
    ``tolerance`` is marked ``FIRST DIVERGENCE``.

    Args:
        model: the folder trtcore runs.
        prompt: text (tokenized by ``model``'s tokenizer) or token ids.
        reference: the folder transformers loads (default: ``model``), e.g. the original
            of a converted or quantized checkpoint.
        backend: trtcore's backend: ``"reference"`` (tensors read at run time, CPU) or a GPU
            backend (``"cuda"``: the engine is built with ``capture=`` of the points' tensors,
            which its fusions then write out, so a fused kernel is compared at its outputs;
            ``"tensorrt"``: marked as network outputs). A GPU backend needs
            ``kv_cache="contiguous"``.
        dtype: trtcore's dtype (``"float32"``, ``"float16"``, ``"bfloat16"``).
        tolerance: the relative L2 error allowed per module (> 0).
        kv_cache: ``"contiguous"`` or ``"paged"``.

    Raises:
        TrtcoreError: torch / transformers are missing.
        InvalidArgumentError: a tolerance <= 0, an empty prompt, the paged cache on a GPU
            backend.
        BackendNotAvailableError / trtcore.gpu.NoGPUError: a GPU backend that cannot run here.
        UnsupportedArchitectureError: the family has no module table.
    """
    if not tolerance > 0:
        raise InvalidArgumentError(f"tolerance must be > 0, got {tolerance!r}")
    torch, auto_model = _transformers()
    from .calibration import capture_prefill, network_tensor_names
    from .config import load_config
    from .llm import LLM

    config = load_config(Path(model))
    points = bisect_points(config.model_type, config.num_hidden_layers)
    on_host = backend == "reference"
    llm = LLM(
        model,
        backend=backend,
        dtype=dtype,
        max_batch_size=1,
        kv_cache=kv_cache,
        device="cpu" if on_host else None,
        progress=False,
        capture=() if on_host else [p.tensor for p in points],  # a GPU engine keeps what it is told to
    )
    ids = llm.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise InvalidArgumentError("compare needs a prompt of at least one token")
    present = network_tensor_names(llm)  # reference: every tensor of the network; GPU: those captured
    wanted = [p.tensor for p in points if p.tensor in present]
    ours = capture_prefill(llm, ids, wanted)
    llm.close()

    hf = _load_hf(auto_model, torch, reference or model)
    theirs: dict[str, np.ndarray] = {}

    def hook(path: str) -> Any:
        def keep(_module: Any, _args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, tuple) else output
            theirs[path] = out.detach().double().numpy()

        return keep

    handles = [hf.get_submodule(p.hf_module).register_forward_hook(hook(p.hf_module)) for p in points]
    try:
        with torch.no_grad():
            hf(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()

    rows: list[ModuleError] = []
    diverged = False
    for p in points:
        if p.tensor not in ours:
            rows.append(ModuleError(p.hf_module, p.tensor, None, NOT_CAPTURED))
            continue
        ref = theirs[p.hf_module]
        ref = ref.reshape(-1, ref.shape[-1])
        if p.last_only:
            ref = ref[-1:]
        got = np.asarray(ours[p.tensor], np.float64).reshape(ref.shape)
        err = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), np.finfo(np.float64).tiny))
        status = OK if err <= tolerance else (BEYOND if diverged else FIRST_DIVERGENCE)
        diverged = diverged or status != OK
        rows.append(ModuleError(p.hf_module, p.tensor, err, status))
    return CompareReport(llm.config.architecture, len(ids), float(tolerance), tuple(rows), _quantizes_activations(llm))
