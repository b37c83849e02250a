"""Host time per output token of streaming detokenization: decoding the whole output again after
every token (what ``LLM.step`` did before ``trtcore.runtime.detokenizer``) against
:class:`~trtcore.runtime.detokenizer.IncrementalDetokenizer`, side by side, at output lengths
128 to 4096, with a real tokenizer (the default model's SmolLM2 byte-level BPE, or ``--tokenizer``).

The tokens are the fixed English passage of the tests (tests/data/passage.txt) repeated, so both
methods produce the same text (checked). Per length: microseconds per token, mean over the
whole output (the full-decode cost grows with the position; its mean is half its last).

    python bench/bench_detokenize.py [--tokenizer DIR_OR_JSON] [--out DIR]

Writes ``detokenize.json`` under ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", help="tokenizer.json or a model folder (default: the default model's)")
    ap.add_argument("--lengths", default="128,512,1024,4096")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    from trtcore.runtime.detokenizer import IncrementalDetokenizer

    path = Path(args.tokenizer) if args.tokenizer else None
    if path is None:
        from trtcore.default_model import default_model_dir

        path = Path(default_model_dir(progress=False))
    tok = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    passage = tok.encode((ROOT / "tests" / "data" / "passage.txt").read_text()).ids
    rows = []
    for n in (int(x) for x in args.lengths.split(",")):
        ids = (passage * (n // len(passage) + 1))[:n]
        t0 = time.perf_counter()
        shown = ""
        for i in range(1, n + 1):  # the old way: the whole text, then its new tail
            text = tok.decode(ids[:i], skip_special_tokens=True)
            shown = text
        full_us = (time.perf_counter() - t0) / n * 1e6
        d = IncrementalDetokenizer(tok)
        t0 = time.perf_counter()
        pieces = [d.step(t, final=i == n - 1) for i, t in enumerate(ids)]
        inc_us = (time.perf_counter() - t0) / n * 1e6
        assert "".join(pieces) == shown, "the two methods disagree"
        rows.append({"output_tokens": n, "full_decode_us_per_token": full_us, "incremental_us_per_token": inc_us, "speedup": full_us / inc_us})
        print(f"{n:>6} tokens: full decode {full_us:8.1f} us/token, incremental {inc_us:6.2f} us/token ({full_us / inc_us:.0f}x)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "detokenize.json").write_text(json.dumps({"tokenizer": str(path), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
