// Weight-only quantized GEMM: y[M, N] = x[M, K] @ dequant(W)^T with int4 / int8 weight codes,
// float16 / bfloat16 (or float32) activations and float32 accumulation.
//
// Dequantization (trtcore.quantization.QuantizedWeight): w[n, k] = (q[n, k] - z[n, g]) * s[n, g],
// g = k / group_size, q the unsigned code; symmetric weights have z = 2^(BITS-1). With HAS_PERM
// the stored column k multiplies input feature perm[k] (act-order): the kernels gather
// x[m, perm[k]].
//
// Weight layout (made once, at build, by trtcore.plugins.weight_only_gemm.pack_codes):
//   a "unit" is 8 consecutive codes along K (k = 8b .. 8b+7 of unit b), packed little-end
//   first into 32-bit words: int4 one word (code e at bits 4e..4e+3), int8 two words (the
//   first holds codes 0..3, code e at bits 8e..8e+7). Each row is padded with zero codes to a
//   multiple of TILE = 32 * UNITS * 8 codes (1024 int4, 512 int8: one warp-wide 16-byte load
//   each); within tile t, the 16-byte vector `t * 32 + lane` holds the units
//   b = t * 32 * UNITS + lane + 32 * u, u = 0 .. UNITS-1 (UNITS = 4 int4, 2 int8), so one
//   coalesced uint4 load per lane brings a whole tile into the warp, and the lanes' units are
//   consecutive in K (their activation loads coalesce too).
//   scales, zeros: float32 [N, K / group_size] as QuantizedWeight holds them.
//
// Numerics (the contract of WeightOnlyGemmPlugin.reference, within float32 rounding):
//   w = fmaf(float(q), s, -z * s) (float32), acc += w * float(x) in float32 (FMA), in K order
//   per lane then a fixed warp-tree (decode) or in K order per output (prefill); one rounding
//   to the output type. Split-K partials are summed in split order by the reduce kernel, so
//   every result is deterministic.
//
// Kernels:
//   trtcore_wq_gemv           decode, M <= DECODE_MAX_M: one warp per output row n, all M rows of
//                             x in registers' accumulators (each code is dequantized once);
//                             grid (ceil(N / DECODE_WARPS), splits); with splits > 1 it writes
//                             float32 partials [splits, M, N] and trtcore_wq_splitk_reduce sums them.
//   trtcore_wq_splitk_reduce  out[i] = sum over splits of partial[s * M * N + i].
//   trtcore_wq_gemm           prefill: 64 x 64 output tiles, K in chunks of 32, the dequantized
//                             weight chunk and the activation chunk in shared memory (float32),
//                             4 x 4 outputs per thread.
//
// Defines: DTYPE (dtype.cuh), BITS 4 | 8, HAS_ZEROS 0 | 1, HAS_PERM 0 | 1.
// Run-time: K a multiple of 8, group_size a multiple of 8 dividing K.
//
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 1}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 1}]
// trtcore-variants: [{"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 1}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 1}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 1}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 1}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 1}]

#include "pdl.cuh"    // PDL_WAIT / PDL_LAUNCH: every kernel starts with them (launched programmatically)
#include "dtype.cuh"  // DTYPE, elem_t, to_f32 / from_f32

#ifndef BITS
#define BITS 4
#endif
#ifndef HAS_ZEROS
#define HAS_ZEROS 0
#endif
#ifndef HAS_PERM
#define HAS_PERM 0
#endif
#if BITS != 4 && BITS != 8
#error "BITS must be 4 or 8"
#endif

#define CODES_PER_WORD (32 / BITS)
#define WORDS_PER_UNIT (8 / CODES_PER_WORD)
#define UNITS (4 / WORDS_PER_UNIT)            // units per 16-byte vector
#define TILE (32 * UNITS * 8)                 // codes per row per warp-wide load
#define CODE_MASK ((1u << BITS) - 1u)
#define SYM_ZERO ((float)(1 << (BITS - 1)))

#define DECODE_WARPS 4
#define DECODE_MAX_M 8

// code e (0..7) of a unit whose words are w[0 .. WORDS_PER_UNIT-1], as an exact float: the code
// is placed in the low mantissa bits of 2^23 (0x4B000000), then 2^23 is subtracted
__device__ __forceinline__ float code_f32(const unsigned int* w, int e) {
    unsigned int q = (w[e / CODES_PER_WORD] >> (BITS * (e % CODES_PER_WORD))) & CODE_MASK;
    return __int_as_float(0x4B000000 | q) - 8388608.0f;
}

// the 8 dequantized weights of a unit starting at column k of row n
__device__ __forceinline__ void dequant_unit(const unsigned int* w, const float* __restrict__ scales,
                                             const float* __restrict__ zeros, int n, int k, int groups,
                                             int group_size, float* out) {
    const int idx = n * groups + k / group_size;
    const float s = __ldg(scales + idx);
#if HAS_ZEROS
    const float z = __ldg(zeros + idx);
#else
    const float z = SYM_ZERO;
#endif
    const float b = -z * s;
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = fmaf(code_f32(w, e), s, b);
}

// x[row, k .. k+7] (or x[row, perm[k .. k+7]]) as float32; k is a multiple of 8
__device__ __forceinline__ void load_x8(const elem_t* __restrict__ xrow, const int* __restrict__ perm, int k, float* out) {
#if HAS_PERM
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = to_f32(xrow[__ldg(perm + k + e)]);
#elif DTYPE == 0
    const float4 a = *reinterpret_cast<const float4*>(xrow + k);
    const float4 c = *reinterpret_cast<const float4*>(xrow + k + 4);
    out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
    out[4] = c.x; out[5] = c.y; out[6] = c.z; out[7] = c.w;
#else
    const uint4 v = *reinterpret_cast<const uint4*>(xrow + k);
    const unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = to_f32((elem_t)(u[i] & 0xffffu));
        out[2 * i + 1] = to_f32((elem_t)(u[i] >> 16));
    }
#endif
}

extern "C" __global__ void __launch_bounds__(DECODE_WARPS * 32)
trtcore_wq_gemv(const elem_t* __restrict__ x, const uint4* __restrict__ w, const float* __restrict__ scales,
                const float* __restrict__ zeros, const int* __restrict__ perm, elem_t* __restrict__ out,
                float* __restrict__ partial, int M, int N, int K, int group_size, int tiles_per_split) {
    PDL_WAIT();
    PDL_LAUNCH();
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * DECODE_WARPS + (threadIdx.x >> 5);
    if (n >= N) return;  // whole warps only: no barrier below
    const int tiles = (K + TILE - 1) / TILE;
    const int groups = K / group_size;
    const int t0 = blockIdx.y * tiles_per_split;
    const int t1 = min(tiles, t0 + tiles_per_split);
    const uint4* wrow = w + (size_t)n * tiles * 32;

    float acc[DECODE_MAX_M];
#pragma unroll
    for (int m = 0; m < DECODE_MAX_M; ++m) acc[m] = 0.0f;

    for (int t = t0; t < t1; ++t) {
        const uint4 v = __ldg(wrow + t * 32 + lane);
        const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int u = 0; u < UNITS; ++u) {
            const int k = t * TILE + (u * 32 + lane) * 8;
            if (k >= K) continue;  // zero-code padding at the row's end
            float wv[8];
            dequant_unit(words + u * WORDS_PER_UNIT, scales, zeros, n, k, groups, group_size, wv);
#pragma unroll
            for (int m = 0; m < DECODE_MAX_M; ++m) {
                if (m < M) {
                    float xv[8];
                    load_x8(x + (size_t)m * K, perm, k, xv);
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[m] = fmaf(wv[e], xv[e], acc[m]);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < DECODE_MAX_M; ++m) {
        if (m < M) {
            float a = acc[m];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
            if (lane == 0) {
                if (gridDim.y == 1) out[(size_t)m * N + n] = from_f32(a);
                else partial[((size_t)blockIdx.y * M + m) * N + n] = a;
            }
        }
    }
}

extern "C" __global__ void trtcore_wq_splitk_reduce(const float* __restrict__ partial, elem_t* __restrict__ out,
                                                    int MN, int splits) {
    PDL_WAIT();
    PDL_LAUNCH();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= MN) return;
    float s = 0.0f;
    for (int p = 0; p < splits; ++p) s += partial[(size_t)p * MN + i];
    out[i] = from_f32(s);
}

#define BM 64
#define BN 64
#define BK 32

extern "C" __global__ void __launch_bounds__(256)
trtcore_wq_gemm(const elem_t* __restrict__ x, const unsigned int* __restrict__ w, const float* __restrict__ scales,
                const float* __restrict__ zeros, const int* __restrict__ perm, elem_t* __restrict__ out,
                int M, int N, int K, int group_size) {
    PDL_WAIT();
    PDL_LAUNCH();
    __shared__ float xs[BK][BM + 1];
    __shared__ float ws[BK][BN + 1];
    const int tid = threadIdx.x;
    const int tx = tid & 15, ty = tid >> 4;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int tiles = (K + TILE - 1) / TILE;
    const int groups = K / group_size;
    const int r = tid >> 2;          // the tile row this thread loads (x row m0 + r, weight row n0 + r)
    const int kk = (tid & 3) * 8;    // its unit within the chunk

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += BK) {
        const int k = k0 + kk;
        float v[8];
        const int m = m0 + r;
        if (m < M && k < K) {
            load_x8(x + (size_t)m * K, perm, k, v);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.0f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) xs[kk + e][r] = v[e];

        const int n = n0 + r;
        if (n < N && k < K) {
            const int b = k / 8;                         // unit index along the row
            const int bt = b % (32 * UNITS);             // within its tile
            const int word = (b / (32 * UNITS)) * 128 + (bt % 32) * 4 + (bt / 32) * WORDS_PER_UNIT;
            const unsigned int* src = w + (size_t)n * tiles * 128 + word;
            unsigned int uw[WORDS_PER_UNIT];
#pragma unroll
            for (int i = 0; i < WORDS_PER_UNIT; ++i) uw[i] = __ldg(src + i);
            dequant_unit(uw, scales, zeros, n, k, groups, group_size, v);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.0f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) ws[kk + e][r] = v[e];
        __syncthreads();

#pragma unroll 8
        for (int c = 0; c < BK; ++c) {
            float a[4], bb[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = xs[c][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bb[j] = ws[c][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], bb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + ty + 16 * i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tx + 16 * j;
            if (n < N) out[(size_t)m * N + n] = from_f32(acc[i][j]);
        }
    }
}
