"""gemv2_main's slot schedule (kernels/wq_gemm.cu) modelled in Python: with EARLY_REFILL 0 and 1,
UNROLL 1-3, 1-39 units and 1-16 warps, every unit of a warp is computed once, in order, from the
slot its load went to, and no refill overwrites a slot not yet computed. A model of the index
arithmetic, not of the kernel: the GPU tests check the kernel."""

import itertools
def run(units, warps, warp, UNROLL, EARLY):
    SLOTS = UNROLL + (1 if EARLY else 0)
    buf = [None] * SLOTS
    # prologue (gemv2_body): units warp + u*warps into slots u < UNROLL
    for u in range(UNROLL):
        c = warp + u * warps
        if c < units: buf[u] = c
    computed = []
    nxt = warp + UNROLL * warps
    base = warp
    while base < units:
        for u in range(SLOTS):
            if base + u * warps >= units: break
            def refill(slot):
                if nxt >= units: return
                buf[slot] = nxt
            if EARLY: refill((u + UNROLL) % SLOTS)
            assert buf[u] == base + u * warps, (units, warps, warp, UNROLL, EARLY, u, buf, base)
            computed.append(buf[u]); buf[u] = "used"
            if not EARLY: refill(u)
            nxt += warps
        base += SLOTS * warps
    assert computed == list(range(warp, units, warps)), (computed,)
n = 0
for units, warps, UNROLL, EARLY in itertools.product(range(1, 40), range(1, 17), (1, 2, 3), (0, 1)):
    for warp in range(warps):
        run(units, warps, warp, UNROLL, EARLY); n += 1
print("ok", n)
