// Paged attention over a mixed batch of causal prefills (including chunked prefills that
// continue a cached sequence) and decodes, on packed tokens. The plugin that launches these
// kernels, and the full statement of the semantics, is trtcore.plugins.paged_attention.
//
// Tensors (row-major):
//   q            [T, Hq, HEAD_DIM]       the step's new queries, Hq = Hkv * G; token t's row
//                                        starts at q + t * q_stride (q_stride = Hq * HEAD_DIM,
//                                        or (Hq + 2 Hkv) * HEAD_DIM for a packed qkv input)
//   k, v         [T, Hkv, HEAD_DIM]      the step's new keys / values, token stride kv_stride
//                                        (packed qkv: k = qkv + Hq * HEAD_DIM, v = k + Hkv *
//                                        HEAD_DIM, kv_stride = q_stride)
//   position_ids int32 [T], inv_freq float32 [ROTARY_DIM / 2] (LONGROPE: [ROTARY_DIM], the short
//                                        then the long frequencies): read only when ROTARY_DIM > 0
//   pool         [L, NB, 2, Hkv, BLOCK_SIZE, HEAD_DIM]   one KV pool for all layers;
//                                        index 0 = K, 1 = V; "HND" inside a block, so the
//                                        BLOCK_SIZE rows of one head are one contiguous run
//   block_tables int32 [B, max_blocks]   block ids of each sequence, in token order
//   seq_lens     int32 [B]               tokens of each sequence including this step's
//   qsl          int32 [B + 1]           query_start_loc (cu_seqlens of the packed queries)
//   out          [T, Hq * HEAD_DIM]
// Sequence b has qlen = qsl[b+1] - qsl[b] new tokens and cached = seq_lens[b] - qlen cached
// ones; its new token j sits at position cached + j, in slot
// block_tables[b][pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE of layer `layer`.
// Query head hq reads KV head hq / G. Key k is visible to a query at position p iff
// k <= p and (window == 0 or p - k < window). Scores and softmax in float32 with float32
// accumulation; the output is rounded once to DTYPE. With SOFTCAP, each score scale * q.k
// becomes softcap * tanh(scale * q.k / softcap) before masking (attention logit soft-capping,
// Gemma 2/3): the kernels get scale / softcap and the cap (see pa_score). Block-table entries < 0 (padding) are
// never written and read as zeros.
//
// Fused RoPE (ROTARY_DIM > 0): q and the new k arrive unrotated; every kernel rotates them
// where it loads them (kernels/rope.cuh, the contract of trtcore.plugins.rope: cos/sin of
// float32(position_ids[t]) * inv_freq[i], scaled by attention_scaling, the rotated value
// rounded once to DTYPE before use), so the pool holds exactly what the RoPE plugin followed
// by the unfused kernels writes, and q is exactly what they read. LONGROPE (Phi-3's LongRoPE):
// the tokens of sequence b take the long frequencies inv_freq[ROTARY_DIM / 2 + i] when
// seq_lens[b] (its length after this step, the largest position + 1) exceeds
// original_max_position_embeddings, else the short ones inv_freq[i] (rope_args_of), as the
// RoPE plugin does given rope_seq_lens = seq_lens[b] for each of them:
//   paged_kv_write     k before it is written to the pool;
//   paged_attn_decode  the token's q rows and its own k (through a shared-memory row);
//   paged_attn_prefill, paged_attn_simple   q when it is loaded into registers.
//
// Kernels (all launched on one stream, in this order):
//   paged_kv_write      one CTA per new token: copies its k and v rows into the pool
//                       (skip_decode: only tokens of sequences with qlen > 1; not launched
//                       at all for a batch of decodes).
//   paged_attn_decode   flash-decoding for sequences with qlen == 1: grid (splits, Hkv * RT,
//                       B); CTA (s, h, b) handles the s-th slice of b's key range for the
//                       G query heads of KV head h (RT = ceil(G / 16) row tiles of 16 heads),
//                       so each K/V block is read once for the whole GQA group. The
//                       sequence's new token is read from k/v directly, and split 0 writes
//                       it into the pool (no separate write launch for decodes). With one
//                       split it writes `out`; otherwise unnormalised partial outputs plus
//                       (max, sum) per row go to the workspace and...
//   paged_attn_reduce   ...combines the splits of each (decode sequence, query head).
//   paged_attn_prefill  sequences with qlen > 1: one CTA per (64-row query tile, KV head);
//                       a row is a (token, query head of the group) pair, row = j * G + g,
//                       so GQA groups share every K/V tile. Causal + window masking per row.
//   paged_attn_simple   float32 (and any head_dim that is a multiple of 32): one CTA per
//                       (token, query head), warp-per-key dot products on CUDA cores.
// decode and prefill (float16 / bfloat16 only) run on tensor cores: mma.sync m16n8k16 with
// float32 accumulation; K/V tiles of 64 keys are gathered through the block table with
// cp.async (16-byte, coalesced: a key row of one head is HEAD_DIM contiguous elements) into a
// PA_STAGES-deep shared-memory ring, read back with ldmatrix (XOR-swizzled 16-byte chunks, no
// bank conflicts). Probabilities are rounded to DTYPE for the P*V product (as FlashAttention);
// scores, the running max/sum and the output accumulator stay float32.
//
// Defines:
//   DTYPE       0 float32, 1 float16, 2 bfloat16
//   HEAD_DIM    features per head (multiple of 32; tensor-core kernels: 64 or 128)
//   BLOCK_SIZE  tokens per KV block
//   PA_STAGES   shared-memory stages of the K/V ring (default 2)
//   PA_DECODE_MIN_CTAS  resident decode CTAs per SM the register budget is cut for (default
//               3: 168 registers; 3 x 64 KiB of shared memory fit an SM of sm_80/90)
//   ROTARY_DIM  0 (default): q and k arrive rotated; > 0: fused RoPE on this many features
//               of each head (even, <= HEAD_DIM)
//   NEOX        fused RoPE pairing: 1 (default) half-split (i, i + ROTARY_DIM/2), 0 GPT-J (2i, 2i+1)
//   LONGROPE    fused RoPE with LongRoPE's short / long frequencies (needs ROTARY_DIM > 0); 0 default
//   SOFTCAP     0 (default): score = q.k * scale; 1: score = cap * tanh(q.k * scale), where the
//               plugin passes scale = softmax scale / softcap and cap = softcap (log2-domain
//               kernels: cap = softcap * log2(e))
//   KV_FP8      0 (default): the pool holds DTYPE elements; 1 (DTYPE 1 or 2 only): the pool holds
//               E4M3 codes (one byte each, vLLM's fp8_e4m3 KV cache) with the float32 scales
//               k_scale / v_scale (the last two parameters of paged_kv_write, paged_attn_simple,
//               paged_attn_decode and paged_attn_prefill; ignored without KV_FP8):
//                 stored code  = e4m3(x / scale)       float32 division (__fdiv_rn), round to
//                                nearest even, saturating to +-448 (kernels/fp8.cuh's e4m3_of)
//                 value read   = float(code) * scale  in float32, never rounded to DTYPE (as
//                                FlashInfer's k_scale / v_scale): the tensor-core kernels multiply
//                                the codes themselves (E4M3 values are exact float16 values) and
//                                apply k_scale to the scores and v_scale to the output; the CUDA-core
//                                kernel forms the float32 product
//               Every key/value attention uses is a value read, the step's own new token's
//               included: the decode kernel, which takes that token from k/v instead of the
//               pool, sends it through the same code (kv_quant8), so prefill, decode and a later
//               step see the same numbers. The tensor-core kernels copy a tile's codes with
//               cp.async into a (2 PA_STAGES - 1)-deep ring of raw tiles beside one float16 V
//               tile (PA_SMEM_BYTES, as without KV_FP8, with twice the tiles in flight): S = Q K^T
//               converts its K codes straight from the raw tile into mma fragments (q_dim), and
//               each iteration converts its raw V tile into the float16 tile P * V reads
//               (sm_89+: cvt.rn.f16x2.e4m3x2, two codes per instruction, nothing else). Their mma
//               type is float16 throughout: a bfloat16 q is scaled per row by a power of two that
//               puts its largest element in [2^14, 2^15) (no overflow; exact down to 2^-29 of
//               that element) and rounded to float16 once, the inverse power going into that
//               row's score scale; the probabilities are rounded to float16 for P * V (bfloat16
//               without KV_FP8).
//
// trtcore-variants: [{"DTYPE": 1, "HEAD_DIM": 64, "BLOCK_SIZE": 16}, {"DTYPE": 1, "HEAD_DIM": 128, "BLOCK_SIZE": 16}, {"DTYPE": 1, "HEAD_DIM": 128, "BLOCK_SIZE": 32}, {"DTYPE": 1, "HEAD_DIM": 128, "BLOCK_SIZE": 64}]
// trtcore-variants: [{"DTYPE": 2, "HEAD_DIM": 64, "BLOCK_SIZE": 16}, {"DTYPE": 2, "HEAD_DIM": 128, "BLOCK_SIZE": 16}, {"DTYPE": 2, "HEAD_DIM": 128, "BLOCK_SIZE": 32}, {"DTYPE": 2, "HEAD_DIM": 128, "BLOCK_SIZE": 64}]
// trtcore-variants: [{"DTYPE": 0, "HEAD_DIM": 64, "BLOCK_SIZE": 16}, {"DTYPE": 0, "HEAD_DIM": 128, "BLOCK_SIZE": 16}]
// trtcore-variants: [{"DTYPE": 1, "HEAD_DIM": 64, "BLOCK_SIZE": 16, "ROTARY_DIM": 64, "NEOX": 1}, {"DTYPE": 1, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "ROTARY_DIM": 128, "NEOX": 1}]
// trtcore-variants: [{"DTYPE": 2, "HEAD_DIM": 64, "BLOCK_SIZE": 16, "ROTARY_DIM": 64, "NEOX": 1}, {"DTYPE": 2, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "ROTARY_DIM": 128, "NEOX": 1}]
// trtcore-variants: [{"DTYPE": 2, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "ROTARY_DIM": 64, "NEOX": 0}, {"DTYPE": 0, "HEAD_DIM": 64, "BLOCK_SIZE": 16, "ROTARY_DIM": 64, "NEOX": 1}]
// trtcore-variants: [{"DTYPE": 1, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "ROTARY_DIM": 128, "NEOX": 1, "LONGROPE": 1}, {"DTYPE": 2, "HEAD_DIM": 96, "BLOCK_SIZE": 16, "ROTARY_DIM": 96, "NEOX": 1, "LONGROPE": 1}, {"DTYPE": 0, "HEAD_DIM": 96, "BLOCK_SIZE": 16, "ROTARY_DIM": 48, "NEOX": 1, "LONGROPE": 1}]
// trtcore-variants: [{"DTYPE": 2, "HEAD_DIM": 256, "BLOCK_SIZE": 16, "SOFTCAP": 1}, {"DTYPE": 1, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "SOFTCAP": 1}, {"DTYPE": 2, "HEAD_DIM": 64, "BLOCK_SIZE": 16, "SOFTCAP": 1, "ROTARY_DIM": 64, "NEOX": 1}]
// trtcore-variants: [{"DTYPE": 0, "HEAD_DIM": 256, "BLOCK_SIZE": 16, "SOFTCAP": 1}, {"DTYPE": 1, "HEAD_DIM": 256, "BLOCK_SIZE": 16, "ROTARY_DIM": 256, "NEOX": 1}]
// trtcore-variants: [{"DTYPE": 1, "HEAD_DIM": 64, "BLOCK_SIZE": 16, "KV_FP8": 1}, {"DTYPE": 1, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "KV_FP8": 1}, {"DTYPE": 2, "HEAD_DIM": 64, "BLOCK_SIZE": 16, "KV_FP8": 1}, {"DTYPE": 2, "HEAD_DIM": 128, "BLOCK_SIZE": 16, "KV_FP8": 1}]
// trtcore-variants: [{"DTYPE": 2, "HEAD_DIM": 64, "BLOCK_SIZE": 16, "KV_FP8": 1, "ROTARY_DIM": 64, "NEOX": 1}, {"DTYPE": 2, "HEAD_DIM": 96, "BLOCK_SIZE": 16, "KV_FP8": 1}]

#include "pdl.cuh"  // PDL_WAIT / PDL_LAUNCH: each kernel starts with them (launched programmatically)
#include "dtype.cuh"  // DTYPE (default 2, bfloat16), elem_t, to_f32 / from_f32
#include "cp_async.cuh"  // cp_async16 / cp_async_commit / cp_async_wait: the K/V tiles' loads
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 16
#endif
#ifndef PA_STAGES
#define PA_STAGES 2
#endif
#ifndef PA_DECODE_MIN_CTAS
#define PA_DECODE_MIN_CTAS 3
#endif
#ifndef ROTARY_DIM
#define ROTARY_DIM 0
#endif
#ifndef NEOX
#define NEOX 1
#endif
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
#ifndef KV_FP8
#define KV_FP8 0
#endif
#if ROTARY_DIM > 0
#include "rope.cuh"  // the rotation of the RoPE plugin (one implementation of its contract)
static_assert(ROTARY_DIM % 2 == 0 && ROTARY_DIM <= HEAD_DIM, "ROTARY_DIM must be even, <= HEAD_DIM");
#endif

#define PA_NT 64          // keys per K/V tile
#define PA_THREADS 128    // threads per CTA of every attention kernel

static_assert(HEAD_DIM % 32 == 0 && HEAD_DIM >= 32, "HEAD_DIM must be a multiple of 32");
static_assert(BLOCK_SIZE >= 1, "BLOCK_SIZE must be >= 1");

#define PA_NEG_INF __int_as_float(0xff800000)

// ---- the pool element (KV_FP8: E4M3 codes) -------------------------------------------------

#if KV_FP8
#include "fp8.cuh"  // e4m3_of / e4m3_to_f32
static_assert(DTYPE == 1 || DTYPE == 2, "KV_FP8 needs DTYPE 1 (float16) or 2 (bfloat16)");
typedef unsigned char kv_t;
#else
typedef elem_t kv_t;
#endif

// A pool element as the float32 value attention reads (KV_FP8: float(code) * scale, in float32)
__device__ __forceinline__ float kv_read(kv_t c, float scale) {
#if KV_FP8
    return __fmul_rn(e4m3_to_f32(c), scale);
#else
    (void)scale;
    return to_f32(c);
#endif
}
#if KV_FP8
union PaVec8 {  // 8 DTYPE elements, one 16-byte vector
    uint4 u;
    elem_t e[8];
};
// 8 DTYPE values -> 8 E4M3 codes (x / scale, RN, saturating), byte j = element j
__device__ __forceinline__ unsigned long long kv_quant8(uint4 x, float scale) {
    PaVec8 a;
    a.u = x;
    unsigned long long r = 0ull;
#pragma unroll
    for (int j = 0; j < 8; ++j) r |= (unsigned long long)e4m3_of(__fdiv_rn(to_f32(a.e[j]), scale)) << (8 * j);
    return r;
}
// 4 E4M3 codes (byte j = code j) -> their exact float16 values, codes 0, 1 in lo, codes 2, 3 in hi
// (the lower code in the lower half)
__device__ __forceinline__ void kv_f16x4(unsigned int w, unsigned int& lo, unsigned int& hi) {
#if __CUDA_ARCH__ >= 890
    // sm_89+: cvt.rn.f16x2.e4m3x2 converts a pair exactly (every E4M3 value, NaN included, is a
    // float16; the upper byte goes to the upper half)
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}" : "=r"(lo), "=r"(hi) : "r"(w));
#else
    float f[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) f[j] = e4m3_to_f32((w >> (8 * j)) & 0xffu);
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(f[1]), "f"(f[0]));
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(f[3]), "f"(f[2]));
#endif
}
// 8 E4M3 codes -> their 8 exact float16 values (one 16-byte vector, element j = code j): what the
// tensor-core kernels multiply (the scale is applied to the scores / the output)
__device__ __forceinline__ uint4 kv_f16x8(uint2 c) {
    uint4 r;
    kv_f16x4(c.x, r.x, r.y);
    kv_f16x4(c.y, r.z, r.w);
    return r;
}
#endif

// ---- element types and conversions ------------------------------------------------------

#if DTYPE == 1
#define PA_ELEM_TYPE "f16"
#elif DTYPE == 2
#define PA_ELEM_TYPE "bf16"
#endif
#if KV_FP8
#define PA_MMA_TYPE "f16"  // the tensor cores' operand type: E4M3 codes are exact float16 values
#elif defined(PA_ELEM_TYPE)
#define PA_MMA_TYPE PA_ELEM_TYPE
#endif
#ifdef PA_MMA_TYPE
// two floats -> one register of the mma type (pack2) or of DTYPE (pack2_elem); lo goes to the
// low 16 bits (the lower column index)
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn." PA_MMA_TYPE "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ unsigned pack2_elem(float lo, float hi) {
    unsigned r;
    asm("cvt.rn." PA_ELEM_TYPE "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif
#define PA_VEC (16 / (int)sizeof(elem_t))  // elements per 16-byte vector

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

// A score in the kernel's units from the dot product qk: qk * scale, or with SOFTCAP the
// soft-capped cap * tanh(qk * scale) (scale and cap as the plugin passes them, see SOFTCAP)
__device__ __forceinline__ float pa_score(float qk, float scale, float cap) {
#if SOFTCAP
    return cap * tanhf(qk * scale);
#else
    (void)cap;
    return qk * scale;
#endif
}
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

// Sequence of packed token t: the largest b with qsl[b] <= t (binary search).
__device__ __forceinline__ int find_seq(const int* __restrict__ qsl, int B, int t) {
    int lo = 0, hi = B - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (__ldg(qsl + mid) <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// The K rows of one KV head of one sequence in one layer; V rows are v_offset further.
struct PoolView {
    const kv_t* base;      // pool + layer slab + head offset
    const int* bt;         // the sequence's block-table row
    long long block_stride;
    long long v_offset;
    // K row of `key`, or nullptr where the block-table entry is padding (< 0)
    __device__ __forceinline__ const kv_t* k_row(int key) const {
        const int blk = __ldg(bt + key / BLOCK_SIZE);
        if (blk < 0) return nullptr;
        return base + (long long)blk * block_stride + (long long)(key % BLOCK_SIZE) * HEAD_DIM;
    }
};

__device__ __forceinline__ PoolView make_pool_view(const kv_t* pool, const int* bt_row, int layer, int num_blocks, int Hkv, int h) {
    PoolView p;
    const long long hs = (long long)BLOCK_SIZE * HEAD_DIM;
    p.block_stride = 2LL * Hkv * hs;
    p.v_offset = (long long)Hkv * hs;
    p.base = pool + (long long)layer * num_blocks * p.block_stride + (long long)h * hs;
    p.bt = bt_row;
    return p;
}

// RoPE arguments of every kernel (position_ids, inv_freq, attention_scaling,
// original_max_position_embeddings: the last four parameters of each; unused when
// ROTARY_DIM == 0)
struct RopeArgs {
    const int* position_ids;
    const float* inv_freq;  // the frequencies of this CTA's sequence
    float attention_scaling;
};

#ifndef LONGROPE
#define LONGROPE 0
#endif
#if LONGROPE && !(ROTARY_DIM > 0)
#error "LONGROPE needs ROTARY_DIM > 0"
#endif

// The RoPE arguments of sequence b: LONGROPE picks its short or long frequencies by its length
__device__ __forceinline__ RopeArgs rope_args_of(const int* position_ids, const float* inv_freq, float attention_scaling,
                                                 int original_max_position_embeddings, const int* seq_lens, int b) {
#if LONGROPE
    return RopeArgs{position_ids, inv_freq + (__ldg(seq_lens + b) > original_max_position_embeddings ? ROPE_HALF : 0), attention_scaling};
#else
    (void)original_max_position_embeddings; (void)seq_lens; (void)b;
    return RopeArgs{position_ids, inv_freq, attention_scaling};
#endif
}

#if ROTARY_DIM > 0
// rope_cos_sin as a call (x: cos, y: sin). The loads below run unrolled, 64 times per thread
// for the q fragments: with the double-precision sincos inlined at each site, paged_attn_decode
// grew from 41 KB of SASS to 160 KB and its instruction-cache misses made a batch-1 decode step
// 26 us instead of 8 (H200, bench/results/h200-2026-12-04-session18). Kernels with one token's
// table (rope_load_tab) have no sincos per element at all; the others call this one copy.
__device__ __noinline__ float2 rope_cos_sin_call(float pos, float freq, float attention_scaling) {
    float2 r;
    rope_cos_sin(pos, freq, attention_scaling, r.x, r.y);
    return r;
}

// Feature d of `row` (one head of a token) rotated with cos/sin (x, partner p) and rounded to
// DTYPE (as the RoPE plugin's output), returned as float
__device__ __forceinline__ float rope_round(int d, float x, float p, float cs, float sn) { return to_f32(from_f32(rope_feature(d, x, p, cs, sn))); }

// feature d of `row` rotated with cos/sin from `tab` ([2][ROTARY_DIM / 2], cos then sin: the
// table of the row's token, rope_table)
__device__ __forceinline__ float rope_load_tab(const elem_t* row, int d, const float* tab) {
    const float x = to_f32(row[d]);
    if (d >= ROTARY_DIM) return x;
    const int i = rope_pair_index(d);
    return rope_round(d, x, to_f32(row[rope_partner(d)]), tab[i], tab[ROPE_HALF + i]);
}

// feature d of `row`, a token at `pos`, rotated with cos/sin computed here
__device__ __forceinline__ float rope_load(const elem_t* row, int d, float pos, const RopeArgs& ra) {
    const float x = to_f32(row[d]);
    if (d >= ROTARY_DIM) return x;
    const int i = rope_pair_index(d);
    const float2 c = rope_cos_sin_call(pos, __ldg(ra.inv_freq + i), ra.attention_scaling);
    return rope_round(d, x, to_f32(row[rope_partner(d)]), c.x, c.y);
}

// tab[0..ROTARY_DIM/2) = cos, tab[ROTARY_DIM/2..ROTARY_DIM) = sin of the token at pos
// (all threads of the CTA take part; the caller synchronises before reading)
__device__ __forceinline__ void rope_table(float* tab, float pos, const RopeArgs& ra) {
    for (int i = threadIdx.x; i < ROPE_HALF; i += blockDim.x) {
        const float2 c = rope_cos_sin_call(pos, __ldg(ra.inv_freq + i), ra.attention_scaling);
        tab[i] = c.x;
        tab[ROPE_HALF + i] = c.y;
    }
}
#endif

// ---- 1. write the step's k/v into the pool -----------------------------------------------

extern "C" __global__ void __launch_bounds__(256) paged_kv_write(
    const elem_t* __restrict__ k, const elem_t* __restrict__ v, kv_t* __restrict__ pool,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens, const int* __restrict__ qsl,
    int B, int max_blocks, int num_blocks, int layer, int Hkv, int skip_decode, int kv_stride,
    const int* __restrict__ position_ids, const float* __restrict__ inv_freq, float attention_scaling,
    int original_max_position_embeddings, float k_scale, float v_scale) {
    PDL_WAIT();
    PDL_LAUNCH();
    const int t = blockIdx.x;
    const int b = find_seq(qsl, B, t);
    const RopeArgs ra = rope_args_of(position_ids, inv_freq, attention_scaling, original_max_position_embeddings, seq_lens, b);
    const int q0 = __ldg(qsl + b);
    const int qlen = __ldg(qsl + b + 1) - q0;
    if (skip_decode && qlen == 1) return;  // paged_attn_decode writes it
    const int pos = __ldg(seq_lens + b) - qlen + (t - q0);
    if (t >= q0 + qlen || pos < 0 || pos / BLOCK_SIZE >= max_blocks) return;  // malformed inputs: write nothing
    const int blk = __ldg(block_tables + (long long)b * max_blocks + pos / BLOCK_SIZE);
    if (blk < 0 || blk >= num_blocks) return;  // padding slot
    const int row = pos % BLOCK_SIZE;
    const long long hs = (long long)BLOCK_SIZE * HEAD_DIM;
    kv_t* dst0 = pool + ((long long)layer * num_blocks + blk) * 2 * Hkv * hs + (long long)row * HEAD_DIM;
#if ROTARY_DIM > 0
    __shared__ float s_tab[ROTARY_DIM];
    rope_table(s_tab, (float)__ldg(ra.position_ids + t), ra);
    __syncthreads();
#else
    (void)ra;
#endif
    constexpr int CH = HEAD_DIM / PA_VEC;  // 16-byte chunks per head row
    const int n = Hkv * CH;
    for (int c = threadIdx.x; c < 2 * n; c += blockDim.x) {
        const int kv = c >= n;
        const int cc = c - kv * n;
        const int h = cc / CH, d = (cc % CH) * PA_VEC;
        const elem_t* src = (kv ? v : k) + (long long)t * kv_stride + (long long)h * HEAD_DIM + d;
        kv_t* dst = dst0 + (long long)kv * Hkv * hs + (long long)h * hs + d;
        union { uint4 u; elem_t e[PA_VEC]; } o;
#if ROTARY_DIM > 0
        if (!kv && d < ROTARY_DIM) {  // a key chunk with rotated features
#pragma unroll
            for (int j = 0; j < PA_VEC; ++j)
                o.e[j] = d + j < ROTARY_DIM ? from_f32(rope_load_tab(src - d, d + j, s_tab)) : src[j];
        } else
#endif
        {
            o.u = __ldg(reinterpret_cast<const uint4*>(src));
        }
#if KV_FP8
        *reinterpret_cast<unsigned long long*>(dst) = kv_quant8(o.u, kv ? v_scale : k_scale);  // 8 codes, 8-byte aligned
#else
        (void)k_scale; (void)v_scale;
        *reinterpret_cast<uint4*>(dst) = o.u;
#endif
    }
}

// ---- 2. simple kernel (float32; also any HEAD_DIM multiple of 32) -------------------------

extern "C" __global__ void __launch_bounds__(PA_THREADS) paged_attn_simple(
    const elem_t* __restrict__ q, const kv_t* __restrict__ pool, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, const int* __restrict__ qsl, elem_t* __restrict__ out,
    int B, int max_blocks, int num_blocks, int layer, int Hkv, int G, int window, float scale, float cap, int q_stride,
    const int* __restrict__ position_ids, const float* __restrict__ inv_freq, float attention_scaling,
    int original_max_position_embeddings, float k_scale, float v_scale) {
    PDL_WAIT();
    PDL_LAUNCH();
    constexpr int NWARP = PA_THREADS / 32;
    constexpr int PER = HEAD_DIM / 32;
    __shared__ float s_m[NWARP], s_l[NWARP];
    __shared__ float s_o[NWARP][HEAD_DIM];
    const int t = blockIdx.x, hq = blockIdx.y;
    const int Hq = Hkv * G, h = hq / G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int b = find_seq(qsl, B, t);
    const RopeArgs ra = rope_args_of(position_ids, inv_freq, attention_scaling, original_max_position_embeddings, seq_lens, b);
    const int q0 = __ldg(qsl + b);
    const int qlen = __ldg(qsl + b + 1) - q0;
    const int pos = __ldg(seq_lens + b) - qlen + (t - q0);
    const int klo = window > 0 ? imax(0, pos - window + 1) : 0;
    const int khi = pos + 1;
    const PoolView pv = make_pool_view(pool, block_tables + (long long)b * max_blocks, layer, num_blocks, Hkv, h);

    float qv[PER], acc[PER];
    const elem_t* qrow = q + (long long)t * q_stride + (long long)hq * HEAD_DIM;
#if ROTARY_DIM > 0
    const float qpos = (float)__ldg(ra.position_ids + t);
#else
    (void)ra;
#endif
#pragma unroll
    for (int i = 0; i < PER; ++i) {
#if ROTARY_DIM > 0
        qv[i] = rope_load(qrow, lane + 32 * i, qpos, ra);
#else
        qv[i] = to_f32(qrow[lane + 32 * i]);
#endif
        acc[i] = 0.f;
    }
    float m = PA_NEG_INF, l = 0.f;
    for (int key = klo + warp; key < khi; key += NWARP) {
        const kv_t* kr = pv.k_row(key);
        float kf[PER], vf[PER];
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            kf[i] = kr ? kv_read(kr[lane + 32 * i], k_scale) : 0.f;
            vf[i] = kr ? kv_read(kr[pv.v_offset + lane + 32 * i], v_scale) : 0.f;
        }
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < PER; ++i) s = fmaf(qv[i], kf[i], s);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        s = pa_score(s, scale, cap);
        const float mn = fmaxf(m, s);
        const float alpha = expf(m - mn);
        const float p = expf(s - mn);
        l = l * alpha + p;
#pragma unroll
        for (int i = 0; i < PER; ++i) acc[i] = fmaf(p, vf[i], acc[i] * alpha);
        m = mn;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) s_o[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float mt = PA_NEG_INF;
#pragma unroll
    for (int w = 0; w < NWARP; ++w) mt = fmaxf(mt, s_m[w]);
    float lt = 0.f;
    float f[NWARP];
#pragma unroll
    for (int w = 0; w < NWARP; ++w) {
        f[w] = s_l[w] > 0.f ? expf(s_m[w] - mt) : 0.f;
        lt += f[w] * s_l[w];
    }
    const float inv = 1.f / lt;
    elem_t* orow = out + ((long long)t * Hq + hq) * HEAD_DIM;
    for (int d = threadIdx.x; d < HEAD_DIM; d += PA_THREADS) {
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < NWARP; ++w) o += f[w] * s_o[w][d];
        orow[d] = from_f32(o * inv);
    }
}

// ---- 3. tensor-core kernels (float16 / bfloat16) -------------------------------------------

#if DTYPE != 0 && HEAD_DIM % 64 == 0 && HEAD_DIM <= 128

#define PA_CHUNKS (HEAD_DIM / 8)               // 16-byte chunks per K/V row
#define PA_TILE_ELEMS (PA_NT * HEAD_DIM)       // one K (or V) tile
#define PA_SMEM_BYTES (PA_STAGES * 2 * PA_TILE_ELEMS * 2)

// element offset of (row, 16-byte chunk) in a swizzled tile: chunk ^ (row % 8) spreads the 8
// rows an ldmatrix reads over all 32 banks
__device__ __forceinline__ int swz(int row, int chunk) { return row * HEAD_DIM + ((chunk ^ (row & 7)) << 3); }

// The head dimension of q (and K) behind the mma's k index 16 ks + 8 h + 2 c (+ 1) of lane c's
// A / B fragments. A dot product does not depend on the order of its terms, so KV_FP8 permutes
// it: lane c's codes of every k-step of a key are then 4 KSTEPS contiguous bytes of the raw K
// row (two bytes of h = 0, two of h = 1 per k-step), read as 16-byte chunks; q is loaded in
// the same order. Without KV_FP8 the natural order (ldmatrix reads the 16-bit K tile).
__device__ __forceinline__ int q_dim(int ks, int h, int c) {
#if KV_FP8
    return 4 * (HEAD_DIM / 16) * c + 4 * ks + 2 * h;
#else
    return 16 * ks + 8 * h + 2 * c;
#endif
}

#if KV_FP8
// byte offset of (row, 16-byte chunk) in a raw (E4M3) tile: chunk ^ (row % chunks per row), so
// that the 8 keys of an S = Q K^T fragment read chunk 2c + x (or c) in different banks
__device__ __forceinline__ int raw_off(int row, int chunk) { return row * HEAD_DIM + ((chunk ^ (row & (HEAD_DIM / 16 - 1))) << 4); }
#endif

__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// a 16-byte shared-memory load, volatile: it stays in order with the mma around it, so the
// codes are loaded as they are used (register pressure)
__device__ __forceinline__ void lds128(unsigned* r, unsigned addr) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// c[16x8, f32] += a[16x16] * b[16x8]
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PA_MMA_TYPE "." PA_MMA_TYPE ".f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Attention of CTA-tile rows [R0, R0 + 16 * WARPS_M) of one sequence and KV head over keys
// [key_lo, key_hi). Row R is the (token R / G, query head h * G + R % G) pair; rows >= nrows
// are padding. Warps are WARPS_M (rows, 16 each) x WARPS_N (keys: each warp takes
// PA_NT / WARPS_N keys of every tile); the WARPS_N partial softmaxes are merged at the end.
// Key new_key (-1: none) is read from k_new / v_new (the step's k/v rows of this KV head)
// instead of the pool (from k_new_smem instead, a shared-memory row, when that is given: the
// rotated key of fused RoPE). Query rows start q_stride elements apart per token; with fused
// RoPE they are rotated as they are loaded, or with ROPE_TAB (decode: one token) read rotated
// from q_smem (row R - R0 of [16 WARPS_M][HEAD_DIM], made by the caller). part_o == nullptr: write normalised rows to out; else write the unnormalised float32 output
// to part_o[hq * HEAD_DIM + d] and (max in log2 units, sum) to part_ml[2 * hq + {0, 1}].
template <int WARPS_M, int WARPS_N, bool ROPE_TAB>
__device__ __forceinline__ void attention_rows(
    const elem_t* __restrict__ q, const PoolView& pv, int q_tok0, int cached, int nrows, int R0, int G, int Hq, int h,
    int key_lo, int key_hi, int window, float scale_log2, float cap, elem_t* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_ml, char* smem, int new_key, const elem_t* __restrict__ k_new,
    const elem_t* __restrict__ v_new, int q_stride, const RopeArgs& ra, const elem_t* q_smem, const elem_t* k_new_smem,
    float k_scale, float v_scale) {
    constexpr int M = 16 * WARPS_M;
    constexpr int NTHREADS = 32 * WARPS_M * WARPS_N;
    constexpr int NW = PA_NT / WARPS_N;  // keys per warp per tile
    constexpr int KSTEPS = HEAD_DIM / 16;
    constexpr int DTILES = HEAD_DIM / 8;
    static_assert(NTHREADS == PA_THREADS, "CTA size");
    static_assert(NW % 16 == 0, "each warp needs a multiple of 16 keys per tile");
    static_assert(PA_NT * PA_CHUNKS % NTHREADS == 0, "tile loads");
    static_assert(PA_SMEM_BYTES >= (WARPS_N * M * HEAD_DIM + 2 * WARPS_N * M) * 4, "epilogue does not fit in the K/V ring");

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    const int g = lane >> 2, c = lane & 3;
    elem_t* sbuf = reinterpret_cast<elem_t*>(smem);  // [PA_STAGES][K, V][PA_NT][HEAD_DIM], swizzled

    // this thread's two rows: R0 + 16 * wm + g + 8 * i
    int kmin[2], kmax[2];
    unsigned qa[KSTEPS][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int R = R0 + 16 * wm + g + 8 * i;
        const elem_t* qrow = nullptr;
        if (R < nrows) {
            const int pos = cached + R / G;
            kmin[i] = imax(key_lo, window > 0 ? pos - window + 1 : 0);
            kmax[i] = imin(key_hi - 1, pos);
            qrow = q + (long long)(q_tok0 + R / G) * q_stride + (long long)(h * G + R % G) * HEAD_DIM;
        } else {
            kmin[i] = 1;
            kmax[i] = 0;  // no key
        }
#if ROTARY_DIM > 0
        const float qpos = qrow ? (float)__ldg(ra.position_ids + q_tok0 + R / G) : 0.f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int d = q_dim(ks, hf, c);
                if constexpr (ROPE_TAB)  // rotated by the caller: row R - R0 of q_smem
                    qa[ks][2 * hf + i] = qrow ? *reinterpret_cast<const unsigned*>(q_smem + (R - R0) * HEAD_DIM + d) : 0u;
                else
                    qa[ks][2 * hf + i] = qrow ? pack2_elem(rope_load(qrow, d, qpos, ra), rope_load(qrow, d + 1, qpos, ra)) : 0u;
            }
        }
#else
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            qa[ks][i] = qrow ? __ldg(reinterpret_cast<const unsigned*>(qrow + q_dim(ks, 0, c))) : 0u;
            qa[ks][2 + i] = qrow ? __ldg(reinterpret_cast<const unsigned*>(qrow + q_dim(ks, 1, c))) : 0u;
        }
#endif
    }
#if ROTARY_DIM == 0
    (void)ra; (void)q_smem;
#endif
    // each row's score scale (log2 units): KV_FP8 multiplies the codes, so k_scale joins it
    float row_scale[2] = {scale_log2, scale_log2};
#if KV_FP8
    row_scale[0] = row_scale[1] = scale_log2 * k_scale;
#if DTYPE == 2
    // bfloat16 q -> float16 (the mma type with KV_FP8): each row times 2^e, its largest |element|
    // then in [2^14, 2^15) (no overflow; exact down to 2^-29 of it), 2^-e into the row's scale
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float mx = 0.f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const unsigned w = qa[ks][2 * hf + i];
                mx = fmaxf(mx, fmaxf(fabsf(__uint_as_float(w << 16)), fabsf(__uint_as_float(w & 0xffff0000u))));
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of the row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // biased exponent eb of mx: mx * 2^(141 - eb) lies in [2^14, 2^15); clamped to a normal
        // float32 power (a zero row stays zero, NaN / inf stay what they are)
        const int fb = imin(254, imax(1, 268 - (int)(__float_as_uint(mx) >> 23)));
        const float f = __uint_as_float((unsigned)fb << 23);
        row_scale[i] = row_scale[i] / f;  // exact: f is a power of two
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const unsigned w = qa[ks][2 * hf + i];
                qa[ks][2 * hf + i] = pack2(__uint_as_float(w << 16) * f, __uint_as_float(w & 0xffff0000u) * f);
            }
    }
#endif
#endif

    float o[DTILES][4];
#pragma unroll
    for (int dt = 0; dt < DTILES; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m[2] = {PA_NEG_INF, PA_NEG_INF}, l[2] = {0.f, 0.f};

    const int ntiles = (key_hi - key_lo + PA_NT - 1) / PA_NT;
    const kv_t* zero_src = pv.base;  // any valid address: cp.async with 0 source bytes reads nothing
#if KV_FP8
    // Shared memory: one float16 V tile, then a RING-deep ring of raw tiles ([RING][K, V][PA_NT]
    // [HEAD_DIM] codes, 16-byte chunks swizzled by raw_off) filled by cp.async: twice the tiles of
    // the 16-bit pool in flight in the same bytes. S = Q K^T reads its codes straight from the
    // raw K tile (fragment layout of q_dim); each iteration converts the raw V tile into the
    // float16 one, which P V reads with ldmatrix.trans.
    constexpr int RING = 2 * PA_STAGES - 1;
    static_assert(PA_TILE_ELEMS * (int)sizeof(elem_t) + RING * 2 * PA_TILE_ELEMS <= PA_SMEM_BYTES, "FP8 raw ring");
    constexpr int RCH = HEAD_DIM / 16;  // 16-byte chunks per raw (one byte a code) K/V row
    static_assert(PA_NT * RCH % NTHREADS == 0, "raw tile loads");
    static_assert(KSTEPS % 4 == 0, "a lane's K codes of a key are whole 16-byte chunks");
    unsigned char* raw = reinterpret_cast<unsigned char*>(smem) + PA_TILE_ELEMS * sizeof(elem_t);
#else
    constexpr int RING = PA_STAGES;
    const long long new_v_delta = v_new - k_new;
    (void)k_scale; (void)v_scale;
#endif

    auto load_tile = [&](int it, int stage) {
        const int kt = key_lo + it * PA_NT;
#if KV_FP8
        // the tile's codes, 16 per cp.async: keys past key_hi, in no block, or the step's own
        // token (its codes are written from k/v below) read nothing and stay code 0
        const unsigned rK = smem_u32(raw + stage * 2 * PA_TILE_ELEMS);
        const unsigned rV = rK + PA_TILE_ELEMS;
#pragma unroll
        for (int j = 0; j < PA_NT * RCH / NTHREADS; ++j) {
            const int i = tid + j * NTHREADS;
            const int r = i / RCH, ch = i % RCH;
            const int key = kt + r;
            const kv_t* src = key != new_key && key < key_hi ? pv.k_row(key) : nullptr;
            const int bytes = src ? 16 : 0;
            const kv_t* ks = src ? src + ch * 16 : zero_src;
            const kv_t* vs = src ? ks + pv.v_offset : zero_src;
            const unsigned off = (unsigned)raw_off(r, ch);
            cp_async16(rK + off, ks, bytes);
            cp_async16(rV + off, vs, bytes);
        }
#else
        const unsigned sK = smem_u32(sbuf + stage * 2 * PA_TILE_ELEMS);
        const unsigned sV = sK + PA_TILE_ELEMS * 2;
#pragma unroll
        for (int j = 0; j < PA_NT * PA_CHUNKS / NTHREADS; ++j) {
            const int i = tid + j * NTHREADS;
            const int r = i / PA_CHUNKS, ch = i % PA_CHUNKS;
            const int key = kt + r;
            // this step's key comes straight from the k/v inputs, the others from the pool
            const bool is_new = key == new_key;
            const elem_t* src = is_new ? k_new : (key < key_hi ? pv.k_row(key) : nullptr);
            const long long vdelta = is_new ? new_v_delta : pv.v_offset;
            const int bytes = src ? 16 : 0;
            const elem_t* ks = src ? src + ch * 8 : zero_src;
            const elem_t* vs = src ? ks + vdelta : zero_src;
            const unsigned off = (unsigned)swz(r, ch) * 2u;
            if (is_new && k_new_smem != nullptr) {  // the rotated new key, from shared memory
                *reinterpret_cast<uint4*>(sbuf + stage * 2 * PA_TILE_ELEMS + swz(r, ch)) =
                    *reinterpret_cast<const uint4*>(k_new_smem + ch * 8);
            } else {
                cp_async16(sK + off, ks, bytes);
            }
            cp_async16(sV + off, vs, bytes);
        }
#endif
    };
#if KV_FP8
    // raw V tile `stage` (tile it, landed and visible to the CTA) -> the float16 V tile: 8 codes
    // -> their 8 exact float16 values (sm_89+: four cvt.rn.f16x2.e4m3x2) -> one 16-byte store
    // into the swizzled layout. The step's own token gets its k/v's codes (what the pool slot
    // holds once written): its V codes converted here, its K codes written into the raw K tile.
    auto convert_tile = [&](int it, int stage) {
        const int kt = key_lo + it * PA_NT;
        unsigned char* rK = raw + stage * 2 * PA_TILE_ELEMS;
#pragma unroll 2  // not fully: its hoisted offsets made the decode kernel spill (sm_90, head_dim 128)
        for (int j = 0; j < PA_NT * PA_CHUNKS / NTHREADS; ++j) {
            const int i = tid + j * NTHREADS;
            const int r = i / PA_CHUNKS, ch = i % PA_CHUNKS;
            const int off = raw_off(r, ch >> 1) + (ch & 1) * 8;
            uint2 vc;
            if (kt + r == new_key) {
                const unsigned long long k8 = kv_quant8(k_new_smem != nullptr ? *reinterpret_cast<const uint4*>(k_new_smem + ch * 8)
                                                                              : __ldg(reinterpret_cast<const uint4*>(k_new + ch * 8)), k_scale);
                const unsigned long long v8 = kv_quant8(__ldg(reinterpret_cast<const uint4*>(v_new + ch * 8)), v_scale);
                *reinterpret_cast<unsigned long long*>(rK + off) = k8;
                vc = make_uint2((unsigned)v8, (unsigned)(v8 >> 32));
            } else {  // code 0 reads +0
                vc = *reinterpret_cast<const uint2*>(rK + PA_TILE_ELEMS + off);
            }
            *reinterpret_cast<uint4*>(sbuf + swz(r, ch)) = kv_f16x8(vc);
        }
    };
#endif

#pragma unroll
    for (int s = 0; s < RING - 1; ++s) {
        if (s < ntiles) load_tile(s, s);
        cp_async_commit();
    }

    for (int it = 0; it < ntiles; ++it) {
        {
            const int nx = it + RING - 1;
            if (nx < ntiles) load_tile(nx, nx % RING);
            cp_async_commit();
        }
        cp_async_wait<RING - 1>();
        __syncthreads();
#if KV_FP8
        convert_tile(it, it % RING);
        __syncthreads();
        const unsigned char* rK = raw + (it % RING) * 2 * PA_TILE_ELEMS;
        const elem_t* sV = sbuf;  // the float16 V tile
#else
        const elem_t* sK = sbuf + (it % PA_STAGES) * 2 * PA_TILE_ELEMS;
        const elem_t* sV = sK + PA_TILE_ELEMS;
#endif
        const int kt = key_lo + it * PA_NT;

        // S = Q K^T over this warp's NW keys
        float s[NW / 8][4];
#pragma unroll
        for (int nt = 0; nt < NW / 8; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#if KV_FP8
            // the B fragments of key r (column g): lane c's codes of k-step ks are the 4 bytes at
            // q_dim(ks, 0, c), KSTEPS / 4 consecutive 16-byte chunks for all its k-steps
            const int r = wn * NW + nt * 8 + g;
#pragma unroll
            for (int x = 0; x < KSTEPS / 4; ++x) {
                unsigned wv[4];
                lds128(wv, smem_u32(rK + raw_off(r, (KSTEPS / 4) * c + x)));
#pragma unroll
                for (int y = 0; y < 4; ++y) {
                    unsigned b0, b1;
                    kv_f16x4(wv[y], b0, b1);
                    mma16816(s[nt], qa[4 * x + y], b0, b1);
                }
            }
#else
            const int r = wn * NW + nt * 8 + (lane & 7);
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks += 2) {
                unsigned bk[4];
                ldmatrix_x4(bk, smem_u32(sK + swz(r, 2 * ks + (lane >> 3))));
                mma16816(s[nt], qa[ks], bk[0], bk[1]);
                mma16816(s[nt], qa[ks + 1], bk[2], bk[3]);
            }
#endif
        }
        // mask, online softmax (log2 domain)
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < NW / 8; ++nt) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int i = j >> 1;
                const int key = kt + wn * NW + nt * 8 + 2 * c + (j & 1);
                const float x = (key >= kmin[i] && key <= kmax[i]) ? pa_score(s[nt][j], row_scale[i], cap) : PA_NEG_INF;
                s[nt][j] = x;
                mx[i] = fmaxf(mx[i], x);
            }
        }
        float mu[2], alpha[2], rs[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            mu[i] = mx[i] == PA_NEG_INF ? 0.f : mx[i];
            alpha[i] = exp2f(m[i] - mu[i]);
            m[i] = mx[i];
        }
#pragma unroll
        for (int nt = 0; nt < NW / 8; ++nt) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float p = exp2f(s[nt][j] - mu[j >> 1]);
                s[nt][j] = p;
                rs[j >> 1] += p;
            }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + rs[i];
#pragma unroll
        for (int dt = 0; dt < DTILES; ++dt) {
            o[dt][0] *= alpha[0];
            o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1];
            o[dt][3] *= alpha[1];
        }
        // O += P V
#pragma unroll
        for (int kk = 0; kk < NW / 16; ++kk) {
            unsigned pa[4];
            pa[0] = pack2(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = pack2(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            const int r = wn * NW + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int dt = 0; dt < DTILES; dt += 2) {
                unsigned bv[4];
                ldmatrix_x4_trans(bv, smem_u32(sV + swz(r, dt + (lane >> 4))));
                mma16816(o[dt], pa, bv[0], bv[1]);
                mma16816(o[dt + 1], pa, bv[2], bv[3]);
            }
        }
        __syncthreads();  // the stage (KV_FP8: the float16 tile) is overwritten by the next iteration
    }
    cp_async_wait<0>();
    __syncthreads();

    // epilogue: merge the WARPS_N partial softmaxes through shared memory
    float* so = reinterpret_cast<float*>(smem);  // [WARPS_N][M][HEAD_DIM]
    float* sm = so + WARPS_N * M * HEAD_DIM;     // [WARPS_N][M]
    float* sl = sm + WARPS_N * M;                // [WARPS_N][M]
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    const int rl = 16 * wm + g;
    if (c == 0) {
        sm[wn * M + rl] = m[0];
        sm[wn * M + rl + 8] = m[1];
        sl[wn * M + rl] = l[0];
        sl[wn * M + rl + 8] = l[1];
    }
#pragma unroll
    for (int dt = 0; dt < DTILES; ++dt) {
        float* r0 = so + (wn * M + rl) * HEAD_DIM + dt * 8 + 2 * c;
        r0[0] = o[dt][0];
        r0[1] = o[dt][1];
        r0[8 * HEAD_DIM] = o[dt][2];
        r0[8 * HEAD_DIM + 1] = o[dt][3];
    }
    __syncthreads();
    for (int idx = tid; idx < M * HEAD_DIM; idx += NTHREADS) {
        const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
        const int R = R0 + r;
        if (R >= nrows) continue;
        float mt = PA_NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS_N; ++w) mt = fmaxf(mt, sm[w * M + r]);
        const float mref = mt == PA_NEG_INF ? 0.f : mt;
        float lt = 0.f, ot = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS_N; ++w) {
            const float f = exp2f(sm[w * M + r] - mref);
            lt += f * sl[w * M + r];
            ot += f * so[(w * M + r) * HEAD_DIM + d];
        }
        const int hq = h * G + R % G;
#if KV_FP8
        ot *= v_scale;  // P * codes, times v_scale: the values read (linear, so partial outputs too)
#endif
        if (part_o == nullptr) {
            out[((long long)(q_tok0 + R / G) * Hq + hq) * HEAD_DIM + d] = from_f32(ot / lt);
        } else {
            part_o[(long long)hq * HEAD_DIM + d] = ot;
            if (d == 0) {
                part_ml[2 * hq] = mt;
                part_ml[2 * hq + 1] = lt;
            }
        }
    }
}

// Decode (qlen == 1): grid (num_splits, Hkv * ceil(G / 16), B), PA_THREADS threads,
// PA_SMEM_BYTES dynamic shared memory. Sequences with qlen != 1 return at once.
extern "C" __global__ void __launch_bounds__(PA_THREADS, PA_DECODE_MIN_CTAS) paged_attn_decode(
    const elem_t* __restrict__ q, const elem_t* __restrict__ k, const elem_t* __restrict__ v, kv_t* __restrict__ pool, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, const int* __restrict__ qsl, elem_t* __restrict__ out, float* __restrict__ ws_o,
    float* __restrict__ ws_ml, int B, int max_blocks, int num_blocks, int layer, int Hkv, int G, int num_splits,
    int window, float scale_log2, float cap, int q_stride, int kv_stride,
    const int* __restrict__ position_ids, const float* __restrict__ inv_freq, float attention_scaling,
    int original_max_position_embeddings, float k_scale, float v_scale) {
    PDL_WAIT();
    PDL_LAUNCH();
    extern __shared__ __align__(128) char smem[];
    const int split = blockIdx.x, b = blockIdx.z;
    const RopeArgs ra = rope_args_of(position_ids, inv_freq, attention_scaling, original_max_position_embeddings, seq_lens, b);
    const int RT = (G + 15) / 16;
    const int h = blockIdx.y / RT, rt = blockIdx.y % RT;
    const int q0 = __ldg(qsl + b), q1 = __ldg(qsl + b + 1), seq = __ldg(seq_lens + b);  // one round trip
    if (q1 - q0 != 1) return;
    const int pos = seq - 1;
    const int klo = window > 0 ? imax(0, pos - window + 1) : 0, khi = seq;
    const int per = ((khi - klo + num_splits - 1) / num_splits + PA_NT - 1) / PA_NT * PA_NT;
    const int lo = klo + split * per, hi = imin(khi, lo + per);
    const int Hq = Hkv * G;
    float* po = nullptr;
    float* pml = nullptr;
    if (num_splits > 1) {
        const long long base = (long long)split * B + b;
        po = ws_o + base * Hq * HEAD_DIM;
        pml = ws_ml + base * Hq * 2;
    }
    if (lo >= hi) {  // nothing in this slice (a short sequence): an empty partial
        if (pml != nullptr && threadIdx.x < 16 && 16 * rt + (int)threadIdx.x < G) {
            const int hq = h * G + 16 * rt + threadIdx.x;
            pml[2 * hq] = PA_NEG_INF;
            pml[2 * hq + 1] = 0.f;
        }
        return;
    }
    const int* bt_row = block_tables + (long long)b * max_blocks;
    const elem_t* k_new = k + (long long)q0 * kv_stride + (long long)h * HEAD_DIM;
    const elem_t* v_new = v + (long long)q0 * kv_stride + (long long)h * HEAD_DIM;
#if ROTARY_DIM > 0
    // this token's cos/sin table (for its q rows) and its rotated key row of head h
    __shared__ float s_tab[ROTARY_DIM];
    __shared__ __align__(16) elem_t s_knew[HEAD_DIM];
    rope_table(s_tab, (float)__ldg(ra.position_ids + q0), ra);
    __syncthreads();
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) s_knew[d] = d < ROTARY_DIM ? from_f32(rope_load_tab(k_new, d, s_tab)) : k_new[d];
    // this CTA's q rows (query heads h * G + 16 rt ..), rotated once here: each warp then reads
    // its fragments from shared memory, as the unfused kernel reads them from q
    __shared__ __align__(16) elem_t s_q[16 * HEAD_DIM];
    for (int e = threadIdx.x; e < 16 * HEAD_DIM; e += blockDim.x) {
        const int r = e / HEAD_DIM, d = e % HEAD_DIM;
        if (16 * rt + r < G) s_q[e] = from_f32(rope_load_tab(q + (long long)q0 * q_stride + (long long)(h * G + 16 * rt + r) * HEAD_DIM, d, s_tab));
    }
    __syncthreads();
    const elem_t* k_src = s_knew;
    const elem_t* q_src = s_q;
#else
    const elem_t* k_src = nullptr;
    const elem_t* q_src = nullptr;
#endif
    if (split == 0 && rt == 0 && threadIdx.x < 2 * HEAD_DIM / PA_VEC && pos / BLOCK_SIZE < max_blocks) {
        // this token's k/v row of head h into its pool slot (the CTAs of this sequence read
        // the token from k/v, never from the slot, so there is no ordering to respect)
        const int blk = __ldg(bt_row + pos / BLOCK_SIZE);
        if (blk >= 0 && blk < num_blocks) {
            const int kv = threadIdx.x >= HEAD_DIM / PA_VEC;
            const int d = (threadIdx.x - kv * (HEAD_DIM / PA_VEC)) * PA_VEC;
            const long long hs = (long long)BLOCK_SIZE * HEAD_DIM;
            kv_t* dst = pool + (((long long)layer * num_blocks + blk) * 2 + kv) * Hkv * hs + h * hs + (long long)(pos % BLOCK_SIZE) * HEAD_DIM + d;
            const uint4 x = kv ? __ldg(reinterpret_cast<const uint4*>(v_new + d))
                               : k_src != nullptr ? *reinterpret_cast<const uint4*>(k_src + d)
                                                  : __ldg(reinterpret_cast<const uint4*>(k_new + d));
#if KV_FP8
            *reinterpret_cast<unsigned long long*>(dst) = kv_quant8(x, kv ? v_scale : k_scale);
#else
            *reinterpret_cast<uint4*>(dst) = x;
#endif
        }
    }
    const PoolView pv = make_pool_view(pool, bt_row, layer, num_blocks, Hkv, h);
    attention_rows<1, 4, true>(q, pv, q0, pos, G, 16 * rt, G, Hq, h, lo, hi, window, scale_log2, cap, out, po, pml, smem, pos, k_new,
                         v_new, q_stride, ra, q_src, k_src, k_scale, v_scale);
}

// Prefill (qlen > 1): grid (tiles, Hkv), where tiles >= sum over sequences with qlen > 1 of
// ceil(qlen * G / 64); extra CTAs return at once. PA_SMEM_BYTES dynamic shared memory.
extern "C" __global__ void __launch_bounds__(PA_THREADS) paged_attn_prefill(
    const elem_t* __restrict__ q, const kv_t* __restrict__ pool, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, const int* __restrict__ qsl, elem_t* __restrict__ out, int B, int max_blocks,
    int num_blocks, int layer, int Hkv, int G, int window, float scale_log2, float cap, int q_stride,
    const int* __restrict__ position_ids, const float* __restrict__ inv_freq, float attention_scaling,
    int original_max_position_embeddings, float k_scale, float v_scale) {
    PDL_WAIT();
    PDL_LAUNCH();
    extern __shared__ __align__(128) char smem[];
    constexpr int M = 64;
    const int x = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31;
    // find the sequence and tile of CTA x: a warp-wide scan over the tile counts (every warp
    // does it, so no barrier is needed)
    int b = -1, tile = 0, ntiles_b = 0, base = 0;
    for (int b0 = 0; b0 < B; b0 += 32) {
        const int bb = b0 + lane;
        int nt = 0;
        if (bb < B) {
            const int ql = __ldg(qsl + bb + 1) - __ldg(qsl + bb);
            nt = ql > 1 ? (ql * G + M - 1) / M : 0;
        }
        int inc = nt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += y;
        }
        const int total = __shfl_sync(0xffffffffu, inc, 31);
        if (x < base + total) {
            const unsigned hit = __ballot_sync(0xffffffffu, base + inc > x);
            const int src = __ffs(hit) - 1;
            const int excl = __shfl_sync(0xffffffffu, inc - nt, src);
            ntiles_b = __shfl_sync(0xffffffffu, nt, src);
            b = b0 + src;
            tile = x - base - excl;
            break;
        }
        base += total;
    }
    if (b < 0) return;
    const RopeArgs ra = rope_args_of(position_ids, inv_freq, attention_scaling, original_max_position_embeddings, seq_lens, b);
    tile = ntiles_b - 1 - tile;  // the longest tiles of a sequence first
    const int q0 = __ldg(qsl + b);
    const int qlen = __ldg(qsl + b + 1) - q0;
    const int cached = __ldg(seq_lens + b) - qlen;
    const int nrows = qlen * G;
    const int R0 = tile * M, Rlast = imin(R0 + M, nrows) - 1;
    const int pos_min = cached + R0 / G, pos_max = cached + Rlast / G;
    const int klo = window > 0 ? imax(0, pos_min - window + 1) : 0, khi = pos_max + 1;
    const PoolView pv = make_pool_view(pool, block_tables + (long long)b * max_blocks, layer, num_blocks, Hkv, h);
    attention_rows<4, 1, false>(q, pv, q0, cached, nrows, R0, G, Hkv * G, h, klo, khi, window, scale_log2, cap, out, nullptr,
                         nullptr, smem, -1, nullptr, nullptr, q_stride, ra, nullptr, nullptr, k_scale, v_scale);
}

// Combine the decode splits: grid (B, Hq), HEAD_DIM threads. Sequences with qlen != 1 return.
extern "C" __global__ void __launch_bounds__(HEAD_DIM) paged_attn_reduce(
    const float* __restrict__ ws_o, const float* __restrict__ ws_ml, const int* __restrict__ qsl,
    elem_t* __restrict__ out, int B, int Hq, int num_splits) {
    PDL_WAIT();
    PDL_LAUNCH();
    const int b = blockIdx.x, hq = blockIdx.y, d = threadIdx.x;
    const int t = __ldg(qsl + b);
    if (__ldg(qsl + b + 1) - t != 1) return;
    // one pass, online (the loads of all splits are independent of the running max)
    float mt = PA_NEG_INF, lt = 0.f, ot = 0.f;
#pragma unroll 4
    for (int s = 0; s < num_splits; ++s) {
        const long long row = ((long long)s * B + b) * Hq + hq;
        const float2 ml = __ldg(reinterpret_cast<const float2*>(ws_ml) + row);
        const float os = __ldg(ws_o + row * HEAD_DIM + d);  // unwritten (garbage) for an empty split: not used
        if (ml.y > 0.f) {
            const float mn = fmaxf(mt, ml.x);
            const float a = exp2f(mt - mn), f = exp2f(ml.x - mn);
            lt = lt * a + f * ml.y;
            ot = ot * a + f * os;
            mt = mn;
        }
    }
    out[((long long)t * Hq + hq) * HEAD_DIM + d] = from_f32(ot / lt);
}

#endif  // tensor-core kernels
