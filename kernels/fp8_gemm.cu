// FP8 (E4M3) linear, the parts around cuBLASLt's FP8 GEMM (trtcore_fp8_gemm plugin):
// quantize the activations x [M, K] to E4M3 with one per-tensor scale (or one scale per row:
// per-token dynamic activations), and (per-channel weight scales, per-token activations) scale
// the GEMM's float32 result per output channel / row into the output type.
//
// Numerics (trtcore.fp8, the contract of Fp8GemmPlugin.reference):
//   scale s: the static input scale, or (dynamic) amax / 448 in float32 (amax = max |x|; 1 when
//            amax is 0);
//   q = e4m3(clip(float32(x) / s, -448, 448)): IEEE float32 division (__fdiv_rn), then round to
//       nearest, ties to even (OCP OFP8 rev. 1.0: 1 sign, 4 exponent bits of bias 7, 3 mantissa
//       bits; 448 = S.1111.110 the largest finite value, 2^-9 the smallest subnormal).
// The conversion (e4m3_of) is kernels/fp8.cuh's, shared with paged_attention.cu's FP8 KV cache.
//
// Kernels (each starts with PDL_WAIT(); none triggers its dependents early; amax and quantize
// read 8 elements per thread and step where alignment allows, the same numbers either way):
//   trtcore_fp8_zero        amax = 0 (before trtcore_fp8_amax)
//   trtcore_fp8_amax        amax = max |x| (atomicMax on the float's bits: non-negative floats
//                           order as their unsigned bit patterns)
//   trtcore_fp8_quantize    q = e4m3(x / s); the scale s written to scale_out[0], and cuBLASLt's
//                           device alpha and beta (CUBLASLT_POINTER_MODE_DEVICE, no A/B scale
//                           pointers: cuBLASLt 13.1 refused every FP8 matmul with them on the
//                           H200) to alpha_out[0] = s * s_w (float32 product; s_w the weight's
//                           per-tensor scale, or 1 for a per-channel weight -- w_scale null --
//                           whose scales are applied after the GEMM) and alpha_out[1] = 0
//   trtcore_fp8_scale_rows  out[m, n] = round(d[m, n] * w_scale[n]) to the output type
// Per-token dynamic activations (compressed-tensors strategy "token", dynamic: true; the scale of
// row m is s[m] = max_k |x[m, k]| / 448 in float32, 1 for an all-zero row):
//   trtcore_fp8_quantize_tokens  one block per row m: s[m] (block max reduction) to
//                                row_scale[m], q[m, :] = e4m3(x[m, :] / s[m]); block 0 also
//                                writes cuBLASLt's alpha = 1 and beta = 0 (the scales are
//                                applied after the GEMM, which writes float32 d)
//   trtcore_fp8_scale_tokens     out[m, n] = round(d[m, n] * (s[m] * s_w)) to the output type,
//                                s_w = w_scale[n] (per_channel) or w_scale[0]
#include "dtype.cuh"
#include "pdl.cuh"
#include "fp8.cuh"  // e4m3_of: float32 -> E4M3 bits, saturating, round to nearest even

// trtcore-variants: [{"DTYPE": 0}, {"DTYPE": 1}, {"DTYPE": 2}]

extern "C" __global__ void trtcore_fp8_zero(unsigned int* amax) {
    PDL_WAIT();
    if (threadIdx.x == 0 && blockIdx.x == 0) *amax = 0u;
}

// Elements per thread and step of the vectorized loops: one 16-byte load of x (two for float32)
// and one 8-byte store of q; taken when x and q are aligned to that and n is a multiple of 8
// (the engines' activations and workspaces are), else the scalar loop does all.
#define VEC 8
struct __align__(16) Vec8 {
    elem_t v[VEC];
};

__device__ __forceinline__ bool vectorizable(const void* x, const void* q, long long n) {
    return n % VEC == 0 && ((unsigned long long)x % sizeof(Vec8)) == 0 && ((unsigned long long)q % 8) == 0;
}

extern "C" __global__ void trtcore_fp8_amax(const elem_t* __restrict__ x, long long n, unsigned int* amax) {
    PDL_WAIT();
    float m = 0.0f;
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    const long long n8 = vectorizable(x, x, n) ? n / VEC : 0;
    for (long long i = start; i < n8; i += stride) {
        const Vec8 in = reinterpret_cast<const Vec8*>(x)[i];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            float v = fabsf(to_f32(in.v[j]));
            m = v > m ? v : m;  // a NaN never wins (max|x| of finite activations)
        }
    }
    for (long long i = n8 * VEC + start; i < n; i += stride) {
        float v = fabsf(to_f32(x[i]));
        m = v > m ? v : m;
    }
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if ((threadIdx.x & 31) == 0) atomicMax(amax, __float_as_uint(m));
}

// static_scale: the input scale (float32 [1]) or null; then amax (from trtcore_fp8_amax) gives it.
// w_scale: the weight's per-tensor scale (float32 [1]) or null (per-channel: alpha = s).
extern "C" __global__ void trtcore_fp8_quantize(const elem_t* __restrict__ x, long long n, const float* static_scale,
                                                const unsigned int* amax, const float* w_scale, float* scale_out,
                                                float* alpha_out, unsigned char* __restrict__ q) {
    PDL_WAIT();
    float s;
    if (static_scale != nullptr) {
        s = *static_scale;
    } else {
        float a = __uint_as_float(*amax);
        s = a > 0.0f ? __fdiv_rn(a, E4M3_MAX) : 1.0f;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        scale_out[0] = s;
        alpha_out[0] = w_scale != nullptr ? __fmul_rn(s, *w_scale) : s;  // cuBLASLt's alpha
        alpha_out[1] = 0.0f;                                             // cuBLASLt's beta
    }
    const long long start = (long long)blockIdx.x * blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    const long long n8 = vectorizable(x, q, n) ? n / VEC : 0;
    for (long long i = start; i < n8; i += stride) {
        const Vec8 in = reinterpret_cast<const Vec8*>(x)[i];
        unsigned long long out = 0ull;
#pragma unroll
        for (int j = 0; j < VEC; ++j) out |= (unsigned long long)e4m3_of(__fdiv_rn(to_f32(in.v[j]), s)) << (8 * j);
        reinterpret_cast<unsigned long long*>(q)[i] = out;  // little-endian: element j at byte j
    }
    for (long long i = n8 * VEC + start; i < n; i += stride) q[i] = e4m3_of(__fdiv_rn(to_f32(x[i]), s));
}

extern "C" __global__ void trtcore_fp8_scale_rows(const float* __restrict__ d, const float* __restrict__ w_scale, long long total, int n,
                                                  elem_t* __restrict__ out) {
    PDL_WAIT();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
        out[i] = from_f32(d[i] * w_scale[i % n]);
}

// Per-token dynamic quantization: grid (M), any block size that is a multiple of 32 up to 1024;
// x [M, K] row-major, q [M, K] E4M3 bits, row_scale [M] float32, alpha_out [2] (alpha, beta).
extern "C" __global__ void trtcore_fp8_quantize_tokens(const elem_t* __restrict__ x, int k, float* __restrict__ row_scale,
                                                       float* alpha_out, unsigned char* __restrict__ q) {
    PDL_WAIT();
    __shared__ float warp_max[32];
    __shared__ float row_s;
    const long long row = blockIdx.x;
    const elem_t* xr = x + row * k;
    unsigned char* qr = q + row * k;
    const int n8 = vectorizable(xr, qr, k) ? k / VEC : 0;
    float m = 0.0f;
    for (int i = threadIdx.x; i < n8; i += blockDim.x) {
        const Vec8 in = reinterpret_cast<const Vec8*>(xr)[i];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            float v = fabsf(to_f32(in.v[j]));
            m = v > m ? v : m;
        }
    }
    for (int i = n8 * VEC + threadIdx.x; i < k; i += blockDim.x) {
        float v = fabsf(to_f32(xr[i]));
        m = v > m ? v : m;
    }
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        const int warps = (blockDim.x + 31) >> 5;
        float a = threadIdx.x < warps ? warp_max[threadIdx.x] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
        if (threadIdx.x == 0) {
            const float s = a > 0.0f ? __fdiv_rn(a, E4M3_MAX) : 1.0f;
            row_s = s;
            row_scale[row] = s;
            if (row == 0) {
                alpha_out[0] = 1.0f;  // cuBLASLt's alpha: the scales come after the GEMM
                alpha_out[1] = 0.0f;  // cuBLASLt's beta
            }
        }
    }
    __syncthreads();
    const float s = row_s;
    for (int i = threadIdx.x; i < n8; i += blockDim.x) {
        const Vec8 in = reinterpret_cast<const Vec8*>(xr)[i];
        unsigned long long out = 0ull;
#pragma unroll
        for (int j = 0; j < VEC; ++j) out |= (unsigned long long)e4m3_of(__fdiv_rn(to_f32(in.v[j]), s)) << (8 * j);
        reinterpret_cast<unsigned long long*>(qr)[i] = out;
    }
    for (int i = n8 * VEC + threadIdx.x; i < k; i += blockDim.x) qr[i] = e4m3_of(__fdiv_rn(to_f32(xr[i]), s));
}

// d [M, N] float32 (the GEMM of the E4M3 codes), row_scale [M], w_scale [N] (per_channel != 0) or [1].
extern "C" __global__ void trtcore_fp8_scale_tokens(const float* __restrict__ d, const float* __restrict__ row_scale,
                                                    const float* __restrict__ w_scale, int per_channel, long long total, int n,
                                                    elem_t* __restrict__ out) {
    PDL_WAIT();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const float sw = w_scale[per_channel ? i % n : 0];
        out[i] = from_f32(d[i] * __fmul_rn(row_scale[i / n], sw));
    }
}
