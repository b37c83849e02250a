"""The two FP8 checkpoints of the default model (``trtcore quantize --method fp8 --strategy
tensor`` and ``--strategy channel``, static activations) against the float16 weights and each
other, every decoder linear: relative Frobenius error of each dequantized weight, the relative
difference between the two, and whether their calibrated input scales are equal.

    python compare_checkpoints.py SRC_FLOAT_DIR FP8_TENSOR_DIR FP8_CHANNEL_DIR
"""

import sys

import numpy as np

from trtcore.checkpoint import Checkpoint
from trtcore.fp8 import from_e4m3


def dequantized(ck: Checkpoint, name: str) -> np.ndarray:
    w = from_e4m3(np.asarray(ck.get(f"{name}.weight")).view(np.uint8)).astype(np.float64)
    return w * np.asarray(ck.get(f"{name}.weight_scale"), np.float64).reshape(-1, 1)


with Checkpoint(sys.argv[1]) as fl, Checkpoint(sys.argv[2]) as t, Checkpoint(sys.argv[3]) as c:
    names = sorted(n.removesuffix(".weight_scale") for n in t.names if n.endswith(".weight_scale"))
    err_t, err_c, diff, same_scales = [], [], [], 0
    for n in names:
        w = np.asarray(fl.get(f"{n}.weight"), np.float64)
        wt, wc = dequantized(t, n), dequantized(c, n)
        err_t.append(np.linalg.norm(wt - w) / np.linalg.norm(w))
        err_c.append(np.linalg.norm(wc - w) / np.linalg.norm(w))
        diff.append(np.linalg.norm(wt - wc) / np.linalg.norm(wt))
        same_scales += bool(np.array_equal(np.asarray(t.get(f"{n}.input_scale")), np.asarray(c.get(f"{n}.input_scale"))))
    print(f"{len(names)} linears")
    print(f"relative error to the float16 weights, mean (min-max): per tensor {np.mean(err_t):.4f} ({min(err_t):.4f}-{max(err_t):.4f}), per channel {np.mean(err_c):.4f} ({min(err_c):.4f}-{max(err_c):.4f})")
    print(f"per channel closer on {sum(c_ < t_ for c_, t_ in zip(err_c, err_t))} of {len(names)}")
    print(f"relative difference between the two, mean (min-max): {np.mean(diff):.4f} ({min(diff):.4f}-{max(diff):.4f})")
    print(f"input scales equal: {same_scales} of {len(names)}")
