// One batched sampling step on the GPU: logits [batch, row_stride] (DTYPE) already on the
// device -> one token id per row (+ its raw logprob, rank and top-k logprobs on request).
//
// The contract is trtcore.runtime.sampling.sample_rows (the NumPy reference; its module
// docstring lists the pipeline and its sources): per row, in vLLM v1's order,
//   sanitize (NaN -> -inf; +inf or no finite value: unusable -> fallback, status 1; any NaN
//   or infinity also sets status bit 4, for callers that refuse such rows)
//   -> min_tokens ban (EOS / stop ids -> -inf) -> repetition, frequency, presence penalties
//   -> greedy argmax | temperature -> min-p -> top-k -> top-p -> inverse-CDF draw
// with the draw's uniform from Philox4x32-10 keyed by (seed, step) (Salmon, Moraes, Dror,
// Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3", SC11 2011): a row's token depends on
// its own logits, parameters, seed and step only, never on the other rows of the batch.
//
// Numerics: everything after the logit load is float64 with one IEEE rounding per
// operation (__dadd_rn & co.: no FMA contraction), in the reference's order, so ranks,
// thresholds and ties are those of the reference; only sums (softmax normalizers, the
// draw's CDF) are associated differently, a ~1e-16 relative difference that changes a
// token only when the uniform falls within that distance of a CDF step.
//
// Work decomposition: one block of BLOCK threads per row. Ranking thresholds are found
// without sorting: the k-th largest value by an MSB-first radix select over the order-
// preserving 64-bit key of the double (up to 8 passes of 8 bits; a pass whose chosen bin
// holds one value -- its smallest and largest keys equal -- ends the descent with that value,
// after 2-3 passes on typical rows), the top-p cut by the same radix descent over
// probability mass per bin; the draw and top-p's tie cut by a block scan over contiguous
// per-thread chunks (id order). Passes re-read the row (it sits in L2) instead of keeping a
// [batch, vocab] scratch buffer, and compute a token's weight (an exp) only where the pass
// needs it.
//
// Buffers (all preallocated by trtcore.runtime.sampling_gpu.GpuSampler; nothing is
// allocated here, no host synchronisation: capturable in a CUDA graph):
//   logits        DTYPE [batch, row_stride], columns >= vocab_size never read
//   params        RowParams [batch] (layout: the struct below; checked by sampling_layout),
//                 in pinned host memory: each row's block reads its record once, into shared
//                 memory, before the PDL wait (the host wrote it before the launch)
//   counts        int32 [num_slots, vocab_size]: output-token counts of each slot
//                 (incremented here by the sampled token of rows with penalties)
//   prompt_mask   uint8 [num_slots, vocab_size]: 1 where the token is in the prompt
//   results       RowResult [batch] on the device (what sampling_stage_inputs reads) and
//   host_results  the same in pinned host memory (what the host reads): no copy back
//   top_ids       int32 [batch, MAX_LOGPROBS], top_logprobs float32 [batch, MAX_LOGPROBS],
//                 pinned host memory, written for the rows that ask for logprobs
//   dynamic shared memory: 4 * ceil(vocab_size / 32) bytes (the banned-id bitmap)
//
// Defines: DTYPE (0 float32, 1 float16, 2 bfloat16; dtype.cuh), BLOCK (threads per block,
// a multiple of 32, <= 1024), MAX_LOGPROBS, MAX_BANNED.
//
// trtcore-variants: [{"DTYPE": 0}, {"DTYPE": 1}, {"DTYPE": 2}]

#include "pdl.cuh"  // PDL_WAIT / PDL_LAUNCH: each kernel starts with them
#include "dtype.cuh"

#ifndef BLOCK
#define BLOCK 1024
#endif
#ifndef MAX_LOGPROBS
#define MAX_LOGPROBS 20
#endif
#ifndef MAX_BANNED
#define MAX_BANNED 32
#endif

#define NWARPS (BLOCK / 32)
#define FULL_MASK 0xffffffffu
#define INT_MAX_ 2147483647

#define FLAG_ACTIVE 1
#define FLAG_RANDOM 2
#define FLAG_PENALTIES 4
#define FLAG_BAN 8
#define FLAG_LOGPROBS 16

#define STATUS_OK 0
#define STATUS_FALLBACK 1
#define STATUS_INACTIVE 2
// or-ed into a result's status when the row held a NaN or an infinity (the caller refuses the row)
#define STATUS_NONFINITE_BIT 4

// Field order: 8-byte fields first, so the C layout equals NumPy's aligned structured dtype.
struct RowParams {
    double temperature;
    double top_p;
    double min_p;
    double repetition_penalty;
    double presence_penalty;
    double frequency_penalty;
    unsigned long long seed;
    unsigned long long step;
    int top_k;
    int slot;
    int flags;
    int num_logprobs;
    int num_banned;
    int reserved;
    int banned[MAX_BANNED];
};

struct RowResult {
    int token;
    int status;
    float logprob;
    int rank;
};

__device__ __forceinline__ double neg_inf() { return __longlong_as_double(0xfff0000000000000LL); }
__device__ __forceinline__ double dbl_max() { return __longlong_as_double(0x7fefffffffffffffLL); }
__device__ __forceinline__ double clamp_finite(double v) { return fmin(fmax(v, -dbl_max()), dbl_max()); }

// Order-preserving map double -> uint64 (no NaN here; -0.0 was turned into +0.0).
__device__ __forceinline__ unsigned long long okey(double d) {
    unsigned long long u = (unsigned long long)__double_as_longlong(d);
    return (u >> 63) ? ~u : (u | 0x8000000000000000ULL);
}
__device__ __forceinline__ double unkey(unsigned long long k) {
    return __longlong_as_double((long long)((k >> 63) ? (k & 0x7fffffffffffffffULL) : ~k));
}

// ---- Philox4x32-10 ---------------------------------------------------------------------------

__device__ __forceinline__ double philox_uniform(unsigned long long seed, unsigned long long step) {
    unsigned int c0 = (unsigned int)step, c1 = (unsigned int)(step >> 32), c2 = 0u, c3 = 0u;
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
    #pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    unsigned long long x = ((unsigned long long)c1 << 32) | c0;
    return (double)(x >> 11) * 1.1102230246251565e-16;  // 2**-53
}

// ---- block reductions (every thread gets the result) ----------------------------------------

struct Scratch {
    double d[NWARPS];
    int i[NWARPS];
    double bd;
    int bi;
};

__device__ double block_sum(double v, Scratch& s) {
    for (int o = 16; o; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(FULL_MASK, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.d[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < NWARPS; ++w) t = __dadd_rn(t, s.d[w]);
        s.bd = t;
    }
    __syncthreads();
    return s.bd;
}

__device__ int block_sum_int(int v, Scratch& s) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.i[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = 0;
        for (int w = 0; w < NWARPS; ++w) t += s.i[w];
        s.bi = t;
    }
    __syncthreads();
    return s.bi;
}

__device__ int block_max_int(int v, Scratch& s) {
    for (int o = 16; o; o >>= 1) v = max(v, __shfl_xor_sync(FULL_MASK, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) s.i[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int t = s.i[0];
        for (int w = 1; w < NWARPS; ++w) t = max(t, s.i[w]);
        s.bi = t;
    }
    __syncthreads();
    return s.bi;
}

// (value, id) with the largest value, the lowest id on ties; id INT_MAX_ for "none".
__device__ __forceinline__ bool better(double v, int i, double bv, int bi) { return v > bv || (v == bv && i < bi); }

__device__ void block_argmax(double& v, int& i, Scratch& s) {
    for (int o = 16; o; o >>= 1) {
        double ov = __shfl_xor_sync(FULL_MASK, v, o);
        int oi = __shfl_xor_sync(FULL_MASK, i, o);
        if (better(ov, oi, v, i)) { v = ov; i = oi; }
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { s.d[threadIdx.x >> 5] = v; s.i[threadIdx.x >> 5] = i; }
    __syncthreads();
    if (threadIdx.x == 0) {
        double bv = s.d[0];
        int bi = s.i[0];
        for (int w = 1; w < NWARPS; ++w)
            if (better(s.d[w], s.i[w], bv, bi)) { bv = s.d[w]; bi = s.i[w]; }
        s.bd = bv;
        s.bi = bi;
    }
    __syncthreads();
    v = s.bd;
    i = s.bi;
}

// Exclusive prefix sum over threads in thread order; the block total in *total.
__device__ double block_exclusive_scan(double v, Scratch& s, double* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        double n = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl = __dadd_rn(incl, n);
    }
    double excl = __shfl_up_sync(FULL_MASK, incl, 1);
    if (lane == 0) excl = 0.0;
    __syncthreads();
    if (lane == 31) s.d[warp] = incl;
    __syncthreads();
    if (threadIdx.x == 0) {
        double run = 0.0;
        for (int w = 0; w < NWARPS; ++w) {
            double t = s.d[w];
            s.d[w] = run;  // warp offsets, exclusive
            run = __dadd_rn(run, t);
        }
        s.bd = run;
    }
    __syncthreads();
    *total = s.bd;
    return __dadd_rn(s.d[warp], excl);
}

// ---- the row's values -----------------------------------------------------------------------

struct Row {
    const elem_t* x;
    const int* cnt;
    const unsigned char* pm;
    const unsigned int* ban;
    double rep, pres, freq, temperature, zmax, min_p;
    int flags;
};

// sanitized raw logit: NaN and +inf -> -inf (a +inf makes the row unusable, see pass A)
__device__ __forceinline__ double raw_at(const Row& r, int i) {
    float f = to_f32(r.x[i]);
    return (f != f || f == __int_as_float(0x7f800000)) ? neg_inf() : (double)f;
}

// steps 2-3: min_tokens ban, repetition / frequency / presence penalties (see the reference)
__device__ __forceinline__ double pen_of(const Row& r, double l, int i) {
    if (l == neg_inf()) return l;
    if (r.flags & FLAG_PENALTIES) {
        int c = r.cnt[i];
        if (r.rep != 1.0 && (c > 0 || r.pm[i])) l = l > 0.0 ? __ddiv_rn(l, r.rep) : __dmul_rn(l, r.rep);
        double pen = __dadd_rn(__dmul_rn(r.freq, (double)c), __dmul_rn(r.pres, c > 0 ? 1.0 : 0.0));
        l = clamp_finite(__dsub_rn(l, pen));
    }
    if ((r.flags & FLAG_BAN) && ((r.ban[i >> 5] >> (i & 31)) & 1u)) l = neg_inf();
    return l;
}

// step 5: z = l / temperature (clamped; -0.0 -> +0.0 so that equal values have equal keys)
__device__ __forceinline__ double z_at(const Row& r, int i) {
    double l = pen_of(r, raw_at(r, i), i);
    if (l == neg_inf()) return l;
    // l / 1.0 is l exactly (and l is finite here): the default temperature skips the division
    return __dadd_rn(r.temperature == 1.0 ? l : clamp_finite(__ddiv_rn(l, r.temperature)), 0.0);
}

__device__ __forceinline__ double w_of(const Row& r, double z) { return exp(__dsub_rn(z, r.zmax)); }

// step 6: min-p (and "not removed")
__device__ __forceinline__ bool keep0(const Row& r, double z, double w) {
    return z != neg_inf() && (r.min_p <= 0.0 || w >= r.min_p);
}

// keep0 computing the weight only where min-p needs it (the radix passes of top-k, where an
// exp per token and pass was most of the work)
__device__ __forceinline__ bool keep0_lazy(const Row& r, double z) {
    return z != neg_inf() && (r.min_p <= 0.0 || w_of(r, z) >= r.min_p);
}

// step 7 on top: what min-p and top-k keep (kth: the k-th largest remaining z, or -inf)
__device__ __forceinline__ bool keep1(const Row& r, double z, double w, double kth) { return keep0(r, z, w) && z >= kth; }

// step 8 on top: the top-p cut keeps values above v* and the tied tokens at v* up to id cut
__device__ __forceinline__ bool keep2(const Row& r, double z, double w, double kth, double vstar, int i, int cut) {
    return keep1(r, z, w, kth) && (z > vstar || (z == vstar && i <= cut));
}

// A row's result, into the device buffer (read by the next step's sampling_stage_inputs) and
// the host's pinned buffer (one 16-byte store each); the host reads it after the step's event.
__device__ __forceinline__ void write_result(RowResult* dev, RowResult* host, int token, int status, float logprob, int rank) {
    RowResult r;
    r.token = token;
    r.status = status;
    r.logprob = logprob;
    r.rank = rank;
    *dev = r;
    *host = r;
}

// One logit of pass A's raw scan: +inf / NaN flags, then the sanitized value (NaN and +inf ->
// -inf, as raw_at) against the thread's running maximum. A thread sees its ids in increasing
// order, so the strict > keeps the lowest id of a tie (block_argmax breaks ties across
// threads the same way) and a row of -inf keeps id INT_MAX_ ("none").
__device__ __forceinline__ void scan_raw_one(float f, int i, float& m, int& arg, int& posinf, int& nonfinite) {
    const unsigned int u = __float_as_uint(f);
    const bool special = (u & 0x7f800000u) == 0x7f800000u;  // NaN or +-inf
    nonfinite |= special;
    posinf |= u == 0x7f800000u;
    if (!special && f > m) { m = f; arg = i; }
}

// Pass A's scan of one row x[0:V] for this thread: the thread's raw maximum (float32, -inf
// if none) and its lowest id, and the +inf / non-finite flags. The row is read in 16-byte
// vectors (a scalar head up to the first 16-byte boundary, a scalar tail), SCAN_UNROLL of
// them in flight per thread: one load of 2 bytes per thread at a time left a 128K-token
// vocabulary latency-bound on the row's one block. Thread tid takes head id tid, then the
// vectors tid, tid + BLOCK, ..., then tail ids tid, tid + BLOCK, ...: increasing ids.
#define SCAN_UNROLL 4
__device__ void scan_raw_row(const elem_t* __restrict__ x, int V, float& m, int& arg, int& posinf, int& nonfinite) {
    constexpr int E = 16 / (int)sizeof(elem_t);  // elements per vector
    const int tid = threadIdx.x;
    m = __int_as_float(0xff800000);
    arg = INT_MAX_;
    const int mis = (int)(((unsigned long long)x & 15ULL) / sizeof(elem_t));
    const int head = min(V, mis ? E - mis : 0);
    if (tid < head) scan_raw_one(to_f32(x[tid]), tid, m, arg, posinf, nonfinite);
    const int nvec = (V - head) / E;
    const uint4* xv = reinterpret_cast<const uint4*>(x + head);
    union Vec { uint4 v; elem_t e[E]; };
    int vi = tid;
    for (; vi + (SCAN_UNROLL - 1) * BLOCK < nvec; vi += SCAN_UNROLL * BLOCK) {
        Vec w[SCAN_UNROLL];
#pragma unroll
        for (int u = 0; u < SCAN_UNROLL; ++u) w[u].v = xv[vi + u * BLOCK];
#pragma unroll
        for (int u = 0; u < SCAN_UNROLL; ++u)
#pragma unroll
            for (int j = 0; j < E; ++j) scan_raw_one(to_f32(w[u].e[j]), head + (vi + u * BLOCK) * E + j, m, arg, posinf, nonfinite);
    }
    for (; vi < nvec; vi += BLOCK) {
        Vec w;
        w.v = xv[vi];
#pragma unroll
        for (int j = 0; j < E; ++j) scan_raw_one(to_f32(w.e[j]), head + vi * E + j, m, arg, posinf, nonfinite);
    }
    for (int i = head + nvec * E + tid; i < V; i += BLOCK) scan_raw_one(to_f32(x[i]), i, m, arg, posinf, nonfinite);
}

// One digit of an MSB-first radix descent: extend the key prefix by the chosen bin.
__device__ __forceinline__ void radix_extend(unsigned long long& prefix, unsigned long long& mask, int shift, int bin) {
    prefix |= (unsigned long long)bin << shift;
    mask |= 0xffULL << shift;
}

// The shared histograms of one radix pass: per bin the count of keys, their mass (top-p only)
// and their smallest and largest key (a bin whose two are equal holds one value: the
// descent can stop there, since every further digit follows that one key).
struct Hist {
    unsigned int count[256];
    double mass[256];
    unsigned long long kmin[256], kmax[256];
};

__device__ __forceinline__ void hist_clear(Hist& h) {
    for (int b = threadIdx.x; b < 256; b += BLOCK) {
        h.count[b] = 0u;
        h.mass[b] = 0.0;
        h.kmin[b] = ~0ULL;
        h.kmax[b] = 0ULL;
    }
}

// Adds each lane's key kk (with weight w, top-p's mass) to bin `bin` of h, bin -1 adding
// nothing; every lane of the warp calls it (the passes' loops run whole warps: __syncwarp).
// Counts and key bounds take one integer atomic per lane. The first digits put most of a row's
// tokens in a few bins, and one double atomic add per token (in shared memory a compare-and-
// swap loop) serialized the block there: so the lanes of a warp stage their weights and each
// bin's first lane sums its bin's and adds once. Chosen on an H100 over shuffle reductions per
// bin and over one atomic per lane (bench/results/h100-2026-12-05-session30). The sums are
// associated differently from the reference's, as before.
__device__ __forceinline__ void hist_add(Hist& h, double* stage, int bin, unsigned long long kk, double w, bool with_mass) {
    if (bin >= 0) {
        atomicAdd(&h.count[bin], 1u);
        atomicMin(&h.kmin[bin], kk);
        atomicMax(&h.kmax[bin], kk);
    }
    if (!with_mass) return;
    const int lane = threadIdx.x & 31;
    const unsigned int peers = __match_any_sync(FULL_MASK, bin);
    stage[lane] = w;
    __syncwarp();
    if (bin >= 0 && (__ffs(peers) - 1) == lane) {
        double m = 0.0;
        for (unsigned int g = peers; g; g &= g - 1) m = __dadd_rn(m, stage[__ffs(g) - 1]);
        atomicAdd(&h.mass[bin], m);
    }
    __syncwarp();
}

extern "C" __global__ void __launch_bounds__(BLOCK) sampling_step(
    const elem_t* __restrict__ logits, long long row_stride, int vocab_size, const RowParams* __restrict__ params,
    int* __restrict__ counts, const unsigned char* __restrict__ prompt_mask, RowResult* __restrict__ results,
    RowResult* __restrict__ host_results, int* __restrict__ top_ids, float* __restrict__ top_logprobs) {
    // the row's record, one read of host memory (every word in flight at once) while the
    // kernel before finishes: it does not depend on the device's work
    __shared__ RowParams rp;
    {
        const int* src = reinterpret_cast<const int*>(params + blockIdx.x);
        int* dst = reinterpret_cast<int*>(&rp);
        for (int w = threadIdx.x; w < (int)(sizeof(RowParams) / 4); w += BLOCK) dst[w] = src[w];
    }
    PDL_WAIT();
    PDL_LAUNCH();
    __syncthreads();
    extern __shared__ unsigned int ban_bits[];
    __shared__ Scratch s;
    __shared__ Hist hist;
    __shared__ double hist_stage[NWARPS][32];  // hist_add's per-warp staging
    __shared__ int sel_bin, sel_rem, sel_done, choice;
    __shared__ double sel_above;
    __shared__ unsigned long long sel_key;

    const int row = blockIdx.x, tid = threadIdx.x, V = vocab_size;
    const RowParams* p = &rp;
    const int flags = p->flags;
    if (!(flags & FLAG_ACTIVE)) {
        if (tid == 0) write_result(results + row, host_results + row, 0, STATUS_INACTIVE, 0.0f, 0);
        return;
    }
    const int slot = p->slot;
    Row r;
    r.x = logits + (long long)row * row_stride;
    r.flags = flags;
    r.cnt = (flags & FLAG_PENALTIES) ? counts + (long long)slot * V : nullptr;
    r.pm = (flags & FLAG_PENALTIES) ? prompt_mask + (long long)slot * V : nullptr;
    r.ban = ban_bits;
    r.rep = p->repetition_penalty;
    r.pres = p->presence_penalty;
    r.freq = p->frequency_penalty;
    r.temperature = p->temperature;
    r.min_p = p->min_p;
    r.zmax = 0.0;

    if (flags & FLAG_BAN) {
        const int words = (V + 31) / 32;
        for (int w = tid; w < words; w += BLOCK) ban_bits[w] = 0u;
        __syncthreads();
        const int nb = min(p->num_banned, MAX_BANNED);
        for (int j = tid; j < nb; j += BLOCK) {
            int id = p->banned[j];
            if (id >= 0 && id < V) atomicOr(&ban_bits[id >> 5], 1u << (id & 31));
        }
        __syncthreads();
    }

    // pass A: +inf, the raw argmax (fallback, logprobs) and the penalized argmax (greedy, zmax)
    int posinf = 0, nonfinite = 0, rarg = INT_MAX_, larg = INT_MAX_;
    double rmax = neg_inf(), lmax = neg_inf();
    if (!(flags & (FLAG_PENALTIES | FLAG_BAN))) {
        // no penalty, no ban: the penalized row is the raw one, so one scan gives both
        // argmaxes, in float32 (float -> double is exact: floats rank as their doubles do)
        // with 16-byte loads (scan_raw_row); this is the whole kernel of a greedy step
        float fmax;
        scan_raw_row(r.x, V, fmax, rarg, posinf, nonfinite);
        rmax = (double)fmax;
        posinf = block_max_int(posinf, s);
        nonfinite = block_max_int(nonfinite, s);
        block_argmax(rmax, rarg, s);
        lmax = rmax;
        larg = rarg;
    } else {
        for (int i = tid; i < V; i += BLOCK) {
            float f = to_f32(r.x[i]);
            if (f == __int_as_float(0x7f800000)) posinf = 1;
            if ((__float_as_uint(f) & 0x7f800000u) == 0x7f800000u) nonfinite = 1;  // NaN or +-inf
            double xr = raw_at(r, i);
            if (xr > rmax) { rmax = xr; rarg = i; }
            double l = pen_of(r, xr, i);
            if (l > lmax) { lmax = l; larg = i; }
        }
        posinf = block_max_int(posinf, s);
        nonfinite = block_max_int(nonfinite, s);
        block_argmax(rmax, rarg, s);
        block_argmax(lmax, larg, s);
    }

    int token, status = STATUS_OK;
    if (posinf || rarg == INT_MAX_ || larg == INT_MAX_) {  // unusable, or everything banned
        status = STATUS_FALLBACK;
        token = rarg == INT_MAX_ ? 0 : rarg;
    } else if (!(flags & FLAG_RANDOM)) {
        token = larg;
    } else {
        r.zmax = __dadd_rn(clamp_finite(__ddiv_rn(lmax, r.temperature)), 0.0);
        const int top_k = p->top_k;
        const double top_p = p->top_p;

        // step 7: top-k threshold = the k-th largest of y = keep0 ? z : -inf (radix select; it
        // stops at the first digit whose chosen bin holds one value, which is then the answer)
        double kth = neg_inf();
        if (top_k > 0 && top_k < V) {
            unsigned long long prefix = 0ULL, mask = 0ULL;
            int rem = top_k;
            for (int shift = 56; shift >= 0; shift -= 8) {
                hist_clear(hist);
                __syncthreads();
                for (int base = 0; base < V; base += BLOCK) {  // whole warps: hist_add
                    const int i = base + tid;
                    int bin = -1;
                    unsigned long long kk = 0ULL;
                    if (i < V) {
                        const double z = z_at(r, i);
                        kk = okey(keep0_lazy(r, z) ? z : neg_inf());
                        if ((kk & mask) == prefix) bin = (int)((kk >> shift) & 255ULL);
                    }
                    hist_add(hist, hist_stage[tid >> 5], bin, kk, 0.0, false);
                }
                __syncthreads();
                if (tid == 0) {
                    int cum = 0, b = 255;
                    for (; b > 0; --b) {
                        if (cum + (int)hist.count[b] >= rem) break;
                        cum += (int)hist.count[b];
                    }
                    sel_bin = b;
                    sel_rem = rem - cum;
                    sel_done = hist.kmin[b] == hist.kmax[b];
                    sel_key = hist.kmin[b];
                }
                __syncthreads();
                if (sel_done) {
                    prefix = sel_key;
                    break;
                }
                radix_extend(prefix, mask, shift, sel_bin);
                rem = sel_rem;
            }
            kth = unkey(prefix);
        }

        // W1: total weight of what min-p and top-k keep (the weight computed only past top-k)
        double local = 0.0;
        for (int i = tid; i < V; i += BLOCK) {
            const double z = z_at(r, i);
            if (z == neg_inf() || z < kth) continue;
            const double w = w_of(r, z);
            if (keep1(r, z, w, kth)) local = __dadd_rn(local, w);
        }
        const double W1 = block_sum(local, s);

        // step 8: top-p cut = the lowest value v* whose strictly-above mass / W1 < top_p
        // (radix descent over mass per bin), then the tied tokens at v* in id order
        double vstar = neg_inf();
        int cut = INT_MAX_;
        const int chunk = (V + BLOCK - 1) / BLOCK, c0 = min(V, tid * chunk), c1 = min(V, c0 + chunk);
        if (top_p < 1.0) {
            unsigned long long prefix = 0ULL, mask = 0ULL;
            double above = 0.0;
            for (int shift = 56; shift >= 0; shift -= 8) {
                hist_clear(hist);
                __syncthreads();
                for (int base = 0; base < V; base += BLOCK) {  // whole warps: hist_add
                    const int i = base + tid;
                    int bin = -1;
                    unsigned long long kk = 0ULL;
                    double w = 0.0;
                    if (i < V) {
                        // keep1, its weight (an exp) computed only for keys under the prefix
                        const double z = z_at(r, i);
                        if (z != neg_inf() && z >= kth) {
                            kk = okey(z);
                            if ((kk & mask) == prefix) {
                                w = w_of(r, z);
                                if (keep1(r, z, w, kth)) bin = (int)((kk >> shift) & 255ULL);
                            }
                        }
                    }
                    hist_add(hist, hist_stage[tid >> 5], bin, kk, w, true);
                }
                __syncthreads();
                if (tid == 0) {
                    double acc = above, at = above;
                    int sel = -1;
                    for (int b = 255; b >= 0; --b) {
                        if (hist.count[b] == 0u) continue;
                        if (!(__ddiv_rn(acc, W1) < top_p)) break;
                        sel = b;
                        at = acc;
                        acc = __dadd_rn(acc, hist.mass[b]);
                    }
                    sel_bin = sel < 0 ? 0 : sel;  // sel >= 0: the first non-empty bin always qualifies
                    sel_above = at;
                    // one value in the bin: v* is it, and `at` the mass strictly above it
                    sel_done = hist.kmin[sel_bin] == hist.kmax[sel_bin];
                    sel_key = hist.kmin[sel_bin];
                }
                __syncthreads();
                above = sel_above;
                if (sel_done) {
                    prefix = sel_key;
                    break;
                }
                radix_extend(prefix, mask, shift, sel_bin);
            }
            vstar = unkey(prefix);
            // tied tokens at v*, in id order: kept while (above + their lower-id mass) / W1 < top_p
            double tl = 0.0;
            for (int i = c0; i < c1; ++i) {
                const double z = z_at(r, i);
                if (z != vstar) continue;
                const double w = w_of(r, z);
                if (keep1(r, z, w, kth)) tl = __dadd_rn(tl, w);
            }
            double tot;
            double run = __dadd_rn(above, block_exclusive_scan(tl, s, &tot));
            int mine = -1;
            for (int i = c0; i < c1; ++i) {
                const double z = z_at(r, i);
                if (z != vstar) continue;
                const double w = w_of(r, z);
                if (!keep1(r, z, w, kth)) continue;
                if (__ddiv_rn(run, W1) < top_p) mine = i;
                run = __dadd_rn(run, w);
            }
            cut = block_max_int(mine, s);
        }

        // step 9: inverse-CDF draw in id order over the final set
        const double u = philox_uniform(p->seed, p->step);
        double wl = 0.0;
        int last = -1;
        for (int i = c0; i < c1; ++i) {
            const double z = z_at(r, i);
            if (z == neg_inf() || z < vstar || z < kth) continue;  // keep2 fails: no exp
            const double w = w_of(r, z);
            if (keep2(r, z, w, kth, vstar, i, cut) && w > 0.0) { wl = __dadd_rn(wl, w); last = i; }
        }
        double total;
        const double excl = block_exclusive_scan(wl, s, &total);
        const double target = __dmul_rn(u, total);
        const int last_all = block_max_int(last, s);
        if (tid == 0) choice = INT_MAX_;
        __syncthreads();
        if (wl > 0.0 && excl <= target && target < __dadd_rn(excl, wl)) {
            double run = excl;
            int got = last;
            for (int i = c0; i < c1; ++i) {
                const double z = z_at(r, i);
                if (z == neg_inf() || z < vstar || z < kth) continue;  // keep2 fails: no exp
                const double w = w_of(r, z);
                if (!(keep2(r, z, w, kth, vstar, i, cut) && w > 0.0)) continue;
                run = __dadd_rn(run, w);
                if (run > target) { got = i; break; }
            }
            atomicMin(&choice, got);
        }
        __syncthreads();
        token = choice != INT_MAX_ ? choice : last_all;  // last_all: rounding left no claimant
        if (token < 0) { token = larg; }  // unreachable: the max token always has weight 1
    }

    // raw logprobs of the sanitized, unpenalized row (vLLM raw_logprobs)
    float chosen_lp = 0.0f;
    int rank = 0;
    if (flags & FLAG_LOGPROBS) {
        double logsum = 0.0;
        if (rarg != INT_MAX_) {
            double se = 0.0;
            for (int i = tid; i < V; i += BLOCK) se = __dadd_rn(se, exp(__dsub_rn(raw_at(r, i), rmax)));
            logsum = log(block_sum(se, s));
        }
        #define LP(i) (rarg == INT_MAX_ ? neg_inf() : __dsub_rn(__dsub_rn(raw_at(r, (i)), rmax), logsum))
        const double lt = LP(token);
        int ge = 0;
        for (int i = tid; i < V; i += BLOCK) ge += LP(i) >= lt ? 1 : 0;
        rank = block_sum_int(ge, s);
        chosen_lp = (float)lt;
        const int k = min(min(p->num_logprobs, MAX_LOGPROBS), V);
        double prev_v = 0.0;
        int prev_i = -1;
        for (int j = 0; j < k; ++j) {
            double bv = neg_inf();
            int bi = INT_MAX_;
            for (int i = tid; i < V; i += BLOCK) {
                double v = LP(i);
                bool after = prev_i < 0 || v < prev_v || (v == prev_v && i > prev_i);
                if (after && better(v, i, bv, bi)) { bv = v; bi = i; }
            }
            block_argmax(bv, bi, s);
            if (tid == 0) {
                top_ids[(long long)row * MAX_LOGPROBS + j] = bi;
                top_logprobs[(long long)row * MAX_LOGPROBS + j] = (float)bv;
            }
            prev_v = bv;
            prev_i = bi;
        }
        #undef LP
    }

    if (tid == 0) {
        write_result(results + row, host_results + row, token, status | (nonfinite ? STATUS_NONFINITE_BIT : 0), chosen_lp, rank);
        if ((flags & FLAG_PENALTIES) && status == STATUS_OK && slot >= 0) counts[(long long)slot * V + token] += 1;
    }
}

// Penalty data of one slot: zero it (sampling_clear_slot), then mark the prompt's tokens and
// count the output tokens given (sampling_fill_slot; ids[0:num_prompt] are the prompt).
extern "C" __global__ void sampling_clear_slot(int* __restrict__ counts, unsigned char* __restrict__ prompt_mask, int vocab_size, int slot) {
    PDL_WAIT();
    PDL_LAUNCH();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < vocab_size; i += (long long)gridDim.x * blockDim.x) {
        counts[(long long)slot * vocab_size + i] = 0;
        prompt_mask[(long long)slot * vocab_size + i] = 0;
    }
}

extern "C" __global__ void sampling_fill_slot(int* __restrict__ counts, unsigned char* __restrict__ prompt_mask, int vocab_size, int slot,
                                              const int* __restrict__ ids, int num_prompt, int num_ids) {
    PDL_WAIT();
    PDL_LAUNCH();
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < num_ids; j += gridDim.x * blockDim.x) {
        int id = ids[j];
        if (id < 0 || id >= vocab_size) continue;
        if (j < num_prompt) prompt_mask[(long long)slot * vocab_size + id] = 1;
        else atomicAdd(&counts[(long long)slot * vocab_size + id], 1);
    }
}

// A step's staged int32 inputs (trtcore.runtime.device_runner.StepLayout), num_words of them,
// from pinned host memory src into the device staging buffer dst: read by the kernel itself
// (no copy-engine node in the step's graph), 16 bytes a thread where they are aligned.
// Asynchronous scheduling: a step scheduled before the previous step's tokens reached the host
// stages, for each such token, -(row + 1) in place of its id, row = its sequence's row in the
// previous step's results; the words [ids_word, ids_word + num_tokens) of dst are the step's
// input_ids, and each such placeholder is written as that row's sampled token (0 for a row
// that sampled none, so the embedding is never read out of range: that sequence's step is
// discarded). num_tokens 0: a plain copy.
__device__ __forceinline__ int staged_word(int v, int w, int ids_word, int num_tokens, const RowResult* __restrict__ results, int vocab_size) {
    if (v >= 0 || w < ids_word || w >= ids_word + num_tokens) return v;
    const int t = results[-(v + 1)].token;
    return (t >= 0 && t < vocab_size) ? t : 0;
}

extern "C" __global__ void sampling_stage_inputs(int* __restrict__ dst, const int* __restrict__ src, int num_words, int ids_word,
                                                 int num_tokens, const RowResult* __restrict__ results, int vocab_size) {
    PDL_WAIT();  // the step before reads dst and writes results
    PDL_LAUNCH();
    const bool vec = ((((unsigned long long)dst) | ((unsigned long long)src)) & 15ULL) == 0ULL;
    const int nvec = vec ? num_words / 4 : 0;
    const int n = nvec + (num_words - 4 * nvec);  // vectors, then the words after them
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        if (i < nvec) {
            int4 v = reinterpret_cast<const int4*>(src)[i];
            const int w = 4 * i;
            v.x = staged_word(v.x, w, ids_word, num_tokens, results, vocab_size);
            v.y = staged_word(v.y, w + 1, ids_word, num_tokens, results, vocab_size);
            v.z = staged_word(v.z, w + 2, ids_word, num_tokens, results, vocab_size);
            v.w = staged_word(v.w, w + 3, ids_word, num_tokens, results, vocab_size);
            reinterpret_cast<int4*>(dst)[i] = v;
        } else {
            const int w = 4 * nvec + (i - nvec);
            dst[w] = staged_word(src[w], w, ids_word, num_tokens, results, vocab_size);
        }
    }
}

// The struct layouts, for the host's check: sizeof and every field offset.
extern "C" __global__ void sampling_layout(int* out) {
    PDL_WAIT();
    PDL_LAUNCH();
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int k = 0;
    const RowParams rp{};
    const RowResult rr{};
#define FIELD_OFFSET(obj, f) ((int)(reinterpret_cast<const char*>(&obj.f) - reinterpret_cast<const char*>(&obj)))
    out[k++] = (int)sizeof(RowParams);
    out[k++] = FIELD_OFFSET(rp, temperature);
    out[k++] = FIELD_OFFSET(rp, top_p);
    out[k++] = FIELD_OFFSET(rp, min_p);
    out[k++] = FIELD_OFFSET(rp, repetition_penalty);
    out[k++] = FIELD_OFFSET(rp, presence_penalty);
    out[k++] = FIELD_OFFSET(rp, frequency_penalty);
    out[k++] = FIELD_OFFSET(rp, seed);
    out[k++] = FIELD_OFFSET(rp, step);
    out[k++] = FIELD_OFFSET(rp, top_k);
    out[k++] = FIELD_OFFSET(rp, slot);
    out[k++] = FIELD_OFFSET(rp, flags);
    out[k++] = FIELD_OFFSET(rp, num_logprobs);
    out[k++] = FIELD_OFFSET(rp, num_banned);
    out[k++] = FIELD_OFFSET(rp, reserved);
    out[k++] = FIELD_OFFSET(rp, banned);
    out[k++] = (int)sizeof(RowResult);
    out[k++] = FIELD_OFFSET(rr, token);
    out[k++] = FIELD_OFFSET(rr, status);
    out[k++] = FIELD_OFFSET(rr, logprob);
    out[k++] = FIELD_OFFSET(rr, rank);
#undef FIELD_OFFSET
}

// The draws themselves, for the tests against trtcore.runtime.sampling.philox_uniform.
extern "C" __global__ void sampling_philox(const unsigned long long* __restrict__ seeds, const unsigned long long* __restrict__ steps,
                                           double* __restrict__ out, int n) {
    PDL_WAIT();
    PDL_LAUNCH();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = philox_uniform(seeds[i], steps[i]);
}
