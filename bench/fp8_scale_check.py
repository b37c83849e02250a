"""Is per-channel FP8's larger log-probability loss on the default model a fault of the per-channel
path, or the rounding its scales draw? (CPU, reference backend.)

The per-tensor FP8 checkpoint (``trtcore quantize --method fp8 --strategy tensor --activations
dynamic``) is rewritten as a per-channel one whose every row scale is the tensor's scale: the
same E4M3 codes, read through the per-channel path (the compressed-tensors ``channel`` strategy,
``[N, 1]`` scales). A correct per-channel path scores each passage exactly as the per-tensor
checkpoint does. The per-channel checkpoint quantized with its own row scales is scored beside
them, with the bfloat16 baseline (mean natural-log probability per token, as
``quant_quality.py``).

    python bench/fp8_scale_check.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out DIR [PASSAGE ...]

Writes ``fp8_scale_check.json`` under ``--out``: passage file name -> variant -> mean log-prob.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_quality import PASSAGE, mean_logprob  # noqa: E402


def equal_scales_channel_copy(tensor_dir: Path, out_dir: Path) -> Path:
    """``tensor_dir`` (a per-tensor FP8 compressed-tensors checkpoint) copied to ``out_dir`` as a
    per-channel one: each ``*.weight_scale`` ``[1]`` becomes ``[N, 1]`` of the same value, the
    config's weight strategy ``"channel"``; codes unchanged."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(tensor_dir, out_dir)
    tensors = load_file(str(out_dir / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(".weight_scale")]:
        rows = tensors[name.removesuffix("_scale")].shape[0]
        tensors[name] = torch.full((rows, 1), float(tensors[name].reshape(-1)[0]), dtype=tensors[name].dtype)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out_dir / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "channel"
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default=".")
    ap.add_argument("passages", nargs="*", type=Path, help="more texts to score beside tests/data/passage.txt")
    args = ap.parse_args()
    from trtcore import LLM
    from trtcore.gguf_convert import convert_gguf
    from trtcore.quantizer import quantize_checkpoint

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dense = convert_gguf(args.gguf, root / "float16", progress=False)
        tensor = quantize_checkpoint(dense, root / "tensor", method="fp8", strategy="tensor", activations="dynamic")
        channel = quantize_checkpoint(dense, root / "channel", method="fp8", strategy="channel", activations="dynamic")
        equal = equal_scales_channel_copy(tensor, root / "channel-equal-scales")
        variants = {"bfloat16": dense, "fp8-tensor-dynamic": tensor, "fp8-channel-equal-scales": equal, "fp8-channel-dynamic": channel}
        for name, d in variants.items():
            llm = LLM(d, backend="reference", dtype="bfloat16", max_batch_size=1, max_seq_len=512, progress=False, kv_cache="contiguous")
            for p in [PASSAGE, *args.passages]:
                t0 = time.perf_counter()
                lp = mean_logprob(llm, list(llm.tokenizer.encode(p.read_text().strip()).ids))
                row = results.setdefault(p.name, {})
                row[name] = lp
                rel = abs(lp - row["bfloat16"]) / abs(row["bfloat16"])
                print(f"{p.name:22} {name:26} {lp:.6f}  {rel * 100:.2f}%  ({time.perf_counter() - t0:.0f} s)", flush=True)
            llm.close()
    (out / "fp8_scale_check.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
