"""Calibration text written by the model itself (CPU, transformers), for
``bench/results/cpu-2026-12-05-calibration-size``.

Self-calibration (Williams et al., "Self-calibration for Language Model Quantization and
Pruning", NAACL 2025, arXiv:2410.17170) calibrates on text the float model generates instead of
web text. This script asks the chat model for a few paragraphs on each of 16 everyday topics
(temperature 0.8, top-p 0.95, seed 0; the paper instead samples from the first token with a
temperature schedule) and writes the answers, a blank line apart::

    python bench/self_generated_text.py --model ~/.cache/trtcore/models/SmolLM2-135M-Instruct \\
        --max-new-tokens 320 --out bench/data/calibration-smollm2-generated.txt

Sampling on another torch build may draw other tokens; the committed file is what the run of
2026-12-05 wrote (4,276 tokens with SmolLM2's tokenizer).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

TOPICS = [
    "the history of trade routes", "how bread is made", "the life of bees", "a walk through an old city",
    "the science of weather", "learning to play the piano", "the building of bridges", "how ships navigate",
    "a village market in the morning", "the invention of paper", "the planets of the solar system",
    "keeping a vegetable garden", "the story of a lighthouse keeper", "how the human heart works",
    "the rules of chess", "a winter journey across mountains",
]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face chat model folder")
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    torch.manual_seed(0)
    texts = []
    for topic in TOPICS:
        msgs = [{"role": "user", "content": f"Write a few paragraphs about {topic}."}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=True, temperature=0.8, top_p=0.95)
        texts.append(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip())
        print(f"{topic}: {out.shape[1] - ids.shape[1]} tokens", flush=True)
    # written whole, then renamed: no half-written file is left behind
    with tempfile.NamedTemporaryFile("w", dir=args.out.parent, delete=False, suffix=".tmp") as f:
        f.write("\n\n".join(texts) + "\n")
    os.replace(f.name, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
