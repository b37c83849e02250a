// Fused rotary position embedding (RoPE) on packed q and k.
//
// q [num_tokens, num_q_heads, HEAD_DIM], k [num_tokens, num_k_heads, HEAD_DIM] (contiguous;
// any leading dimensions flattened into num_tokens), position_ids int32 [num_tokens],
// inv_freq float32 [ROTARY_DIM / 2], seq_lens int32 [num_tokens] (read only when DYNAMIC);
// q_out, k_out: the shapes and dtype of q and k (distinct buffers: the pointers are
// __restrict__).
//
// Numerics (the contract that trtcore.plugins.rope.RopePlugin.reference reproduces; the
// rotation itself is kernels/rope.cuh, shared with paged_attention.cu):
//   freq   = inv_freq[i]                                                 (float32)
//            DYNAMIC and seq_len > max_position_embeddings (dynamic NTK, as transformers):
//            base' = base * (factor * s / L - (factor - 1)) ** (d / (d - 2)),
//            freq  = float32(1 / base' ** (2i / d))      evaluated in float64, rounded once
//            LONGROPE (Phi-3's LongRoPE, as transformers' longrope_frequency_update):
//            freq  = inv_freq[ROTARY_DIM / 2 + i] (the long factors) if seq_len >
//            original_max_position_embeddings, else inv_freq[i] (the short factors)
//   angle  = float32(pos) * freq                          one float32 product, as transformers
//   cos, sin = float32(cos/sin(double(angle))) * attention_scaling     (float32 product)
//   neox:  out[i] = x[i] * cos[i] - x[i + d/2] * sin[i],  out[i + d/2] = x[i + d/2] * cos[i] + x[i] * sin[i]
//   gptj:  out[2i] = x[2i] * cos[i] - x[2i + 1] * sin[i], out[2i + 1] = x[2i + 1] * cos[i] + x[2i] * sin[i]
//   each product and the sum rounded in float32 (__fmul_rn/__fadd_rn: never contracted into
//   an FMA), the result rounded once to the I/O dtype (round to nearest even);
//   features >= ROTARY_DIM are copied through unchanged.
// cos/sin come from the float64 sincos of the float32 angle, rounded to float32: the
// correctly rounded value (bar a double-rounding tie, probability ~1e-8), which is also
// what NumPy's float64 cos rounded to float32 gives, so the kernel and the reference agree
// bit for bit (sincosf is within 2 ulp only). It is computed once per token (ROTARY_DIM / 2
// values) into shared memory and reused by every head, so its cost is negligible.
//
// Work decomposition (memory bound): one block per token. A "unit" is what one thread
// moves at a time: for neox rotated features a pair of VEC-element vectors (x1 chunk and
// its partner x2 chunk, d/2 apart), for gptj rotated features one vector (the pairs are
// inside it), for pass-through features one vector. Threads take units with stride
// blockDim.x over all heads of q then k, so a warp's loads are contiguous 16-byte vectors
// (coalesced). The first UNROLL units of each thread are loaded before cos/sin are computed
// so the loads overlap the sincos and the barrier.
//
// Defines (compile-time specialisation; no run-time branches on them):
//   DTYPE       0 float32, 1 float16, 2 bfloat16
//   HEAD_DIM    features per head
//   ROTARY_DIM  rotated features per head (even, <= HEAD_DIM)
//   NEOX        1 half-split pairing (i, i + ROTARY_DIM/2); 0 interleaved (2i, 2i+1), GPT-J
//   DYNAMIC     1 dynamic NTK scaling (reads seq_lens); 0 none
//   LONGROPE    1 LongRoPE (reads seq_lens; inv_freq holds ROTARY_DIM values, short then
//               long); 0 none (inv_freq holds ROTARY_DIM / 2). Not together with DYNAMIC.
//   VEC         elements per vector access (VEC * element size <= 16 bytes, a power of 2);
//               must divide HEAD_DIM - ROTARY_DIM and ROTARY_DIM / 2 (neox) or ROTARY_DIM
//               (gptj, VEC even); the host picks the largest that also fits the pointers'
//               alignment
//   UNROLL      units per thread loaded before they are used (default 4)
//
// trtcore-variants: [{"DTYPE": 0, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 1, "DYNAMIC": 0, "VEC": 4}, {"DTYPE": 0, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 1, "DYNAMIC": 1, "VEC": 4}, {"DTYPE": 0, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 0, "DYNAMIC": 0, "VEC": 4}, {"DTYPE": 0, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 0, "DYNAMIC": 1, "VEC": 4}, {"DTYPE": 0, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 1, "DYNAMIC": 0, "VEC": 4}, {"DTYPE": 0, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 1, "DYNAMIC": 1, "VEC": 4}, {"DTYPE": 0, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 0, "DYNAMIC": 0, "VEC": 4}, {"DTYPE": 0, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 0, "DYNAMIC": 1, "VEC": 4}]
// trtcore-variants: [{"DTYPE": 1, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 1, "DYNAMIC": 0, "VEC": 8}, {"DTYPE": 1, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 1, "DYNAMIC": 1, "VEC": 8}, {"DTYPE": 1, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 0, "DYNAMIC": 0, "VEC": 8}, {"DTYPE": 1, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 0, "DYNAMIC": 1, "VEC": 8}, {"DTYPE": 1, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 1, "DYNAMIC": 0, "VEC": 8}, {"DTYPE": 1, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 1, "DYNAMIC": 1, "VEC": 8}, {"DTYPE": 1, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 0, "DYNAMIC": 0, "VEC": 8}, {"DTYPE": 1, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 0, "DYNAMIC": 1, "VEC": 8}]
// trtcore-variants: [{"DTYPE": 2, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 1, "DYNAMIC": 0, "VEC": 8}, {"DTYPE": 2, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 1, "DYNAMIC": 1, "VEC": 8}, {"DTYPE": 2, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 0, "DYNAMIC": 0, "VEC": 8}, {"DTYPE": 2, "HEAD_DIM": 64, "ROTARY_DIM": 64, "NEOX": 0, "DYNAMIC": 1, "VEC": 8}, {"DTYPE": 2, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 1, "DYNAMIC": 0, "VEC": 8}, {"DTYPE": 2, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 1, "DYNAMIC": 1, "VEC": 8}, {"DTYPE": 2, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 0, "DYNAMIC": 0, "VEC": 8}, {"DTYPE": 2, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 0, "DYNAMIC": 1, "VEC": 8}]
// trtcore-variants: [{"DTYPE": 0, "HEAD_DIM": 96, "ROTARY_DIM": 96, "NEOX": 1, "DYNAMIC": 0, "VEC": 4, "LONGROPE": 1}, {"DTYPE": 0, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 1, "DYNAMIC": 0, "VEC": 4, "LONGROPE": 1}, {"DTYPE": 1, "HEAD_DIM": 96, "ROTARY_DIM": 96, "NEOX": 1, "DYNAMIC": 0, "VEC": 8, "LONGROPE": 1}, {"DTYPE": 1, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 1, "DYNAMIC": 0, "VEC": 8, "LONGROPE": 1}, {"DTYPE": 2, "HEAD_DIM": 96, "ROTARY_DIM": 96, "NEOX": 1, "DYNAMIC": 0, "VEC": 8, "LONGROPE": 1}, {"DTYPE": 2, "HEAD_DIM": 128, "ROTARY_DIM": 128, "NEOX": 1, "DYNAMIC": 0, "VEC": 8, "LONGROPE": 1}]

#include "pdl.cuh"  // PDL_WAIT / PDL_LAUNCH: the kernel starts with them (launched programmatically)
#include "dtype.cuh"  // DTYPE (default 2, bfloat16), elem_t, to_f32 / from_f32
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef ROTARY_DIM
#define ROTARY_DIM HEAD_DIM
#endif
#ifndef NEOX
#define NEOX 1
#endif
#ifndef DYNAMIC
#define DYNAMIC 0
#endif
#ifndef LONGROPE
#define LONGROPE 0
#endif
#ifndef VEC
#define VEC (DTYPE == 0 ? 4 : 8)
#endif
#ifndef UNROLL
#define UNROLL 4
#endif

#define ROPE_MAX_BLOCK 256

#include "rope.cuh"  // rope_cos_sin / rope_rotate: the rotation, shared with paged_attention.cu

// ---- element types and conversions ------------------------------------------------------

#define VEC_BYTES (VEC * (int)sizeof(elem_t))

template <int BYTES> struct raw_vec;
template <> struct raw_vec<16> { typedef uint4 type; };
template <> struct raw_vec<8> { typedef uint2 type; };
template <> struct raw_vec<4> { typedef unsigned int type; };
template <> struct raw_vec<2> { typedef unsigned short type; };
typedef raw_vec<VEC_BYTES>::type vec_t;

union pack_t {
    vec_t v;
    elem_t e[VEC];
};

// ---- compile-time checks -------------------------------------------------------------------

#define HALF_ROT (ROTARY_DIM / 2)
#define PASS_DIM (HEAD_DIM - ROTARY_DIM)
#if NEOX
#define ROT_UNITS (HALF_ROT / VEC)
#else
#define ROT_UNITS (ROTARY_DIM / VEC)
#endif
#define UNITS_PER_HEAD (ROT_UNITS + PASS_DIM / VEC)

static_assert(!(DYNAMIC && LONGROPE), "DYNAMIC and LONGROPE are exclusive");
static_assert(ROTARY_DIM % 2 == 0 && ROTARY_DIM >= 2 && ROTARY_DIM <= HEAD_DIM, "ROTARY_DIM must be even, in [2, HEAD_DIM]");
static_assert(VEC_BYTES <= 16 && (VEC_BYTES & (VEC_BYTES - 1)) == 0, "VEC * element size must be a power of 2 <= 16");
static_assert(PASS_DIM % VEC == 0, "VEC must divide HEAD_DIM - ROTARY_DIM");
#if NEOX
static_assert(HALF_ROT % VEC == 0, "neox: VEC must divide ROTARY_DIM / 2");
#else
static_assert(ROTARY_DIM % VEC == 0 && VEC % 2 == 0, "gptj: VEC must be even and divide ROTARY_DIM");
#endif

// ---- kernel ------------------------------------------------------------------------------

struct unit_t {
    const elem_t* src;  // first vector (x1 chunk / gptj vector / pass vector)
    elem_t* dst;
    int w;              // unit index within the head
};

__device__ __forceinline__ unit_t locate(int u, int nq_units, size_t tok, int num_q_heads, int num_k_heads,
                                         const elem_t* __restrict__ q, const elem_t* __restrict__ k,
                                         elem_t* __restrict__ q_out, elem_t* __restrict__ k_out) {
    unit_t r;
    const bool is_q = u < nq_units;
    const int uu = is_q ? u : u - nq_units;
    const int head = uu / UNITS_PER_HEAD;
    r.w = uu - head * UNITS_PER_HEAD;
    int feat;
    if (r.w < ROT_UNITS) {
        feat = r.w * VEC;
    } else {
        feat = ROTARY_DIM + (r.w - ROT_UNITS) * VEC;
    }
    const size_t off = (tok * (size_t)(is_q ? num_q_heads : num_k_heads) + (size_t)head) * HEAD_DIM + feat;
    r.src = (is_q ? q : k) + off;
    r.dst = (is_q ? q_out : k_out) + off;
    return r;
}

__device__ __forceinline__ void rotate_store(const unit_t& t, const pack_t& a, const pack_t& b,
                                             const float* s_cos, const float* s_sin) {
    if (t.w >= ROT_UNITS) {  // pass-through features
        *reinterpret_cast<vec_t*>(t.dst) = a.v;
        return;
    }
#if NEOX
    const int c = t.w * VEC;  // cos/sin index of element 0
    pack_t o1, o2;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
        float r1, r2;
        rope_rotate(to_f32(a.e[j]), to_f32(b.e[j]), s_cos[c + j], s_sin[c + j], r1, r2);
        o1.e[j] = from_f32(r1);
        o2.e[j] = from_f32(r2);
    }
    *reinterpret_cast<vec_t*>(t.dst) = o1.v;
    *reinterpret_cast<vec_t*>(t.dst + HALF_ROT) = o2.v;
#else
    const int c = t.w * (VEC / 2);
    pack_t o;
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) {
        float r1, r2;
        rope_rotate(to_f32(a.e[2 * j]), to_f32(a.e[2 * j + 1]), s_cos[c + j], s_sin[c + j], r1, r2);
        o.e[2 * j] = from_f32(r1);
        o.e[2 * j + 1] = from_f32(r2);
    }
    (void)b;
    *reinterpret_cast<vec_t*>(t.dst) = o.v;
#endif
}

__device__ __forceinline__ void load_unit(const unit_t& t, pack_t& a, pack_t& b) {
    a.v = *reinterpret_cast<const vec_t*>(t.src);
#if NEOX
    if (t.w < ROT_UNITS) b.v = *reinterpret_cast<const vec_t*>(t.src + HALF_ROT);
#endif
}

extern "C" __global__ void __launch_bounds__(ROPE_MAX_BLOCK)
trtcore_rope(const elem_t* __restrict__ q, const elem_t* __restrict__ k,
             const int* __restrict__ position_ids, const float* __restrict__ inv_freq,
             const int* __restrict__ seq_lens, elem_t* __restrict__ q_out, elem_t* __restrict__ k_out,
             int num_q_heads, int num_k_heads, float attention_scaling, float base,
             float dynamic_factor, int max_position_embeddings, int original_max_position_embeddings) {
    PDL_WAIT();
    PDL_LAUNCH();
    __shared__ float s_cos[HALF_ROT];
    __shared__ float s_sin[HALF_ROT];

    const size_t tok = blockIdx.x;
    const int nq_units = num_q_heads * UNITS_PER_HEAD;
    const int total = nq_units + num_k_heads * UNITS_PER_HEAD;
    const int stride = blockDim.x;

    // 1. issue this thread's first UNROLL loads
    unit_t t[UNROLL];
    pack_t a[UNROLL], b[UNROLL];
#pragma unroll
    for (int r = 0; r < UNROLL; ++r) {
        const int u = threadIdx.x + r * stride;
        if (u < total) {
            t[r] = locate(u, nq_units, tok, num_q_heads, num_k_heads, q, k, q_out, k_out);
            load_unit(t[r], a[r], b[r]);
        }
    }

    // 2. this token's cos/sin, once, into shared memory
    const float pos = (float)position_ids[tok];
#if DYNAMIC
    const int seq_len = seq_lens[tok];
    const bool scaled = seq_len > max_position_embeddings;
    double dyn_base = 0.0;
    if (scaled) {
        const double f = (double)dynamic_factor;
        dyn_base = (double)base * pow(f * (double)seq_len / (double)max_position_embeddings - (f - 1.0),
                                      (double)ROTARY_DIM / (double)(ROTARY_DIM - 2));
    }
#else
    (void)base; (void)dynamic_factor; (void)max_position_embeddings;
#endif
#if LONGROPE
    const float* freqs = inv_freq + (seq_lens[tok] > original_max_position_embeddings ? HALF_ROT : 0);
#else
    const float* freqs = inv_freq;
    (void)original_max_position_embeddings;
#if !DYNAMIC
    (void)seq_lens;
#endif
#endif
    for (int i = threadIdx.x; i < HALF_ROT; i += stride) {
        float freq;
#if DYNAMIC
        if (scaled) {
            freq = (float)(1.0 / pow(dyn_base, (double)(2 * i) / (double)ROTARY_DIM));
        } else {
            freq = freqs[i];
        }
#else
        freq = freqs[i];
#endif
        rope_cos_sin(pos, freq, attention_scaling, s_cos[i], s_sin[i]);
    }
    __syncthreads();

    // 3. rotate and store the preloaded units, then the rest in batches of UNROLL
#pragma unroll
    for (int r = 0; r < UNROLL; ++r) {
        if (threadIdx.x + r * stride < total) rotate_store(t[r], a[r], b[r], s_cos, s_sin);
    }
    for (int u0 = threadIdx.x + UNROLL * stride; u0 < total; u0 += UNROLL * stride) {
#pragma unroll
        for (int r = 0; r < UNROLL; ++r) {
            const int u = u0 + r * stride;
            if (u < total) {
                t[r] = locate(u, nq_units, tok, num_q_heads, num_k_heads, q, k, q_out, k_out);
                load_unit(t[r], a[r], b[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < UNROLL; ++r) {
            if (u0 + r * stride < total) rotate_store(t[r], a[r], b[r], s_cos, s_sin);
        }
    }
}
