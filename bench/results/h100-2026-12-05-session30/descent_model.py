# Model of kernels/sampling.cu's radix descents (top-k count, top-p mass) with the early stop (a
# chosen bin whose smallest and largest keys are equal ends the descent), against the full
# 8-pass descent and a sort, on 300 random rows; prints the mean passes with the early stop.
#   python bench/results/h100-2026-12-05-session30/descent_model.py
import numpy as np
def okey(d):
    u = np.asarray(d, np.float64).view(np.uint64)
    neg = (u >> np.uint64(63)) == 1
    return np.where(neg, ~u, u | np.uint64(1 << 63))
def unkey(k):
    k = np.uint64(k)
    u = (k & np.uint64(0x7fffffffffffffff)) if (k >> np.uint64(63)) else ~k
    return np.array([u], np.uint64).view(np.float64)[0]
def kth_model(y, k, early=True):
    keys = okey(y); prefix = 0; mask = 0; rem = k; passes = 0
    for shift in range(56, -1, -8):
        passes += 1
        m = (keys & np.uint64(mask)) == np.uint64(prefix)
        bins = ((keys[m] >> np.uint64(shift)) & np.uint64(255)).astype(int)
        cnt = np.bincount(bins, minlength=256)
        cum = 0; b = 255
        while b > 0:
            if cum + cnt[b] >= rem: break
            cum += cnt[b]; b -= 1
        inb = keys[m][bins == b]
        if early and len(inb) and inb.min() == inb.max():
            return unkey(int(inb.min())), passes
        prefix |= b << shift; mask |= 0xff << shift; rem -= cum
    return unkey(prefix), passes
def vstar_model(z, w, W1, top_p, early=True):
    keys = okey(z); prefix = 0; mask = 0; above = 0.0; passes = 0
    for shift in range(56, -1, -8):
        passes += 1
        m = (keys & np.uint64(mask)) == np.uint64(prefix)
        bins = ((keys[m] >> np.uint64(shift)) & np.uint64(255)).astype(int)
        cnt = np.bincount(bins, minlength=256); mass = np.bincount(bins, weights=w[m], minlength=256)
        acc = above; at = above; sel = -1
        for b in range(255, -1, -1):
            if cnt[b] == 0: continue
            if not (acc / W1 < top_p): break
            sel = b; at = acc; acc = acc + mass[b]
        sel = max(sel, 0); above = at
        inb = keys[m][bins == sel]
        if early and len(inb) and inb.min() == inb.max():
            return unkey(int(inb.min())), above, passes
        prefix |= sel << shift; mask |= 0xff << shift
    return unkey(prefix), above, passes
rng = np.random.default_rng(1)
import ml_dtypes
npass = []
for t in range(300):
    V = int(rng.integers(5, 5000))
    z = (rng.standard_normal(V) * rng.choice([0.5, 3, 30])).astype(ml_dtypes.bfloat16 if t % 2 else np.float32).astype(np.float64)
    T = rng.choice([1.0, 0.7, 1.3]); z = z / T
    z[rng.random(V) < 0.05] = -np.inf
    k = int(rng.integers(1, V + 3))
    k = min(k, V)
    a, pa = kth_model(z, k); b, _ = kth_model(z, k, early=False)
    ref = np.sort(z)[::-1][k - 1]
    assert a == b == ref, (a, b, ref)
    zmax = z.max(); w = np.where(np.isfinite(z), np.exp(z - zmax), 0.0); W1 = w.sum()
    kept = np.isfinite(z)
    p = float(rng.choice([0.1, 0.5, 0.9, 0.999]))
    v1, ab1, pp = vstar_model(z[kept], w[kept], W1, p); v2, ab2, _ = vstar_model(z[kept], w[kept], W1, p, early=False)
    assert v1 == v2 and ab1 == ab2, (v1, v2, ab1, ab2)
    npass.append((pa, pp))
print("ok", np.mean([a for a, _ in npass]), np.mean([b for _, b in npass]))
