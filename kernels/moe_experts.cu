// Mixture-of-experts: the routed experts' SwiGLU MLPs as grouped GEMMs over the tokens routed
// to each expert (the computation of transformers' MixtralExperts / Qwen2MoeExperts).
//
// x [T, E] (elem_t), topk_ids int32 [T, K], topk_weights float32 [T, K], gate_up [X, 2 I, E]
// (each expert's gate rows, then its up rows), down [X, E, I]; out [T, E] (elem_t).
// Assignment a = t * K + r is token t's r-th chosen expert ids[a]; an id outside [0, X) adds
// nothing.
//
// Four launches (trtcore.plugins.moe_experts.MoeExpertsPlugin.enqueue):
//   trtcore_moe_route    one block: counts the assignments per expert, offsets [X + 1] (exclusive
//                        prefix sums) and perm [A] (the assignments grouped by expert);
//   trtcore_moe_gate_up  grid (ceil(I / WARPS), X): warp w of block (b, e) owns column n = b WARPS + w
//                        of expert e and walks e's assignments MT at a time, reading the gate and up
//                        rows n once per MT tokens: h[a, n] = silu(x[t] . Wg[n]) * (x[t] . Wu[n]);
//   trtcore_moe_down     grid (ceil(E / WARPS), X): likewise y[a, n] = w[a] * (h[a] . Wd[n]);
//   trtcore_moe_reduce   grid T: out[t, n] = sum over r = 0..K-1 (in that order) of y[t K + r, n].
// The workspace holds offsets, perm, h float32 [A, I] and y float32 [A, E]. Each assignment's
// sums are its own (no atomics on values), so two runs give identical bits whatever order the
// route kernel lists an expert's assignments in.
//
// Numerics (the contract of MoeExpertsPlugin.reference, float64 rounded once): products and sums
// in float32 (lane-strided partial sums, then a warp tree), silu(g) = g / (1 + exp(-g)) in
// float32, h and y kept in float32, one rounding to elem_t at the end.
//
// Defines: DTYPE (0 float32, 1 float16, 2 bfloat16); VEC elements per load (16 bytes: 4 for
// float32, 8 for 16-bit types; or 1), which must divide E and I (the host picks it); MT tokens
// per pass (default 8).
//
// trtcore-variants: [{"DTYPE": 0, "VEC": 4}, {"DTYPE": 0, "VEC": 1}, {"DTYPE": 1, "VEC": 8}, {"DTYPE": 1, "VEC": 1}]
// trtcore-variants: [{"DTYPE": 2, "VEC": 8}, {"DTYPE": 2, "VEC": 1}]

#include "pdl.cuh"  // PDL_WAIT / PDL_LAUNCH: every kernel starts with PDL_WAIT (launched programmatically)
#include "dtype.cuh"  // DTYPE (default 2, bfloat16), elem_t, to_f32 / from_f32

#ifndef VEC
#define VEC 1
#endif
#ifndef MT
#define MT 8
#endif
#define WARPS 4
#define MOE_MAX_EXPERTS 1024

#if VEC != 1 && VEC * 4 != 16 && VEC * 2 != 16
#error "VEC must be 1 or fill 16 bytes"
#endif

// VEC consecutive elem_t as float (16-byte aligned when VEC > 1)
__device__ __forceinline__ void load_elems(const elem_t* __restrict__ p, float* v) {
#if VEC == 1
    v[0] = to_f32(p[0]);
#else
    uint4 raw = *reinterpret_cast<const uint4*>(p);
    const elem_t* e = reinterpret_cast<const elem_t*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = to_f32(e[i]);
#endif
}

// VEC consecutive float (16-byte aligned when VEC > 1)
__device__ __forceinline__ void load_floats(const float* __restrict__ p, float* v) {
#if VEC == 1
    v[0] = p[0];
#else
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
        float4 q = *reinterpret_cast<const float4*>(p + i);
        v[i] = q.x;
        v[i + 1] = q.y;
        v[i + 2] = q.z;
        v[i + 3] = q.w;
    }
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void __launch_bounds__(256) trtcore_moe_route(
    const int* __restrict__ ids, int num_assign, int num_experts, int* __restrict__ offsets, int* __restrict__ perm) {
    PDL_WAIT();
    __shared__ int start[MOE_MAX_EXPERTS + 1];
    __shared__ int cursor[MOE_MAX_EXPERTS];
    for (int e = threadIdx.x; e <= num_experts; e += blockDim.x) start[e] = 0;
    __syncthreads();
    for (int a = threadIdx.x; a < num_assign; a += blockDim.x) {
        int e = ids[a];
        if (e >= 0 && e < num_experts) atomicAdd(&start[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // exclusive prefix sums (X is at most a few hundred)
        int s = 0;
        for (int e = 0; e < num_experts; ++e) {
            int c = start[e];
            start[e] = s;
            cursor[e] = s;
            s += c;
        }
        start[num_experts] = s;
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= num_experts; e += blockDim.x) offsets[e] = start[e];
    for (int a = threadIdx.x; a < num_assign; a += blockDim.x) {
        int e = ids[a];
        if (e >= 0 && e < num_experts) perm[atomicAdd(&cursor[e], 1)] = a;
    }
    PDL_LAUNCH();
}

extern "C" __global__ void __launch_bounds__(32 * WARPS) trtcore_moe_gate_up(
    const elem_t* __restrict__ x, const elem_t* __restrict__ gate_up, const int* __restrict__ offsets, const int* __restrict__ perm,
    float* __restrict__ h, int hidden, int inter, int top_k) {
    PDL_WAIT();
    const int e = blockIdx.y;
    const int n = blockIdx.x * WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int begin = offsets[e], end = offsets[e + 1];
    PDL_LAUNCH();
    if (n >= inter || begin == end) return;
    const elem_t* wg = gate_up + ((size_t)e * 2 * inter + n) * hidden;
    const elem_t* wu = wg + (size_t)inter * hidden;
    for (int m0 = begin; m0 < end; m0 += MT) {
        const int count = min(MT, end - m0);
        const elem_t* xs[MT];
        float ag[MT], au[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            xs[m] = x + (size_t)(perm[m0 + min(m, count - 1)] / top_k) * hidden;
            ag[m] = 0.f;
            au[m] = 0.f;
        }
#pragma unroll 2
        for (int k = lane * VEC; k < hidden; k += 32 * VEC) {
            float g[VEC], u[VEC];
            load_elems(wg + k, g);
            load_elems(wu + k, u);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if (m < count) {
                    float xv[VEC];
                    load_elems(xs[m] + k, xv);
#pragma unroll
                    for (int i = 0; i < VEC; ++i) {
                        ag[m] = fmaf(g[i], xv[i], ag[m]);
                        au[m] = fmaf(u[i], xv[i], au[m]);
                    }
                }
            }
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            float gs = warp_sum(ag[m]), us = warp_sum(au[m]);
            if (lane == 0 && m < count) h[(size_t)perm[m0 + m] * inter + n] = gs / (1.f + expf(-gs)) * us;
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * WARPS) trtcore_moe_down(
    const float* __restrict__ h, const elem_t* __restrict__ down, const int* __restrict__ offsets, const int* __restrict__ perm,
    const float* __restrict__ topk_weights, float* __restrict__ y, int hidden, int inter) {
    PDL_WAIT();
    const int e = blockIdx.y;
    const int n = blockIdx.x * WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int begin = offsets[e], end = offsets[e + 1];
    PDL_LAUNCH();
    if (n >= hidden || begin == end) return;
    const elem_t* wd = down + ((size_t)e * hidden + n) * inter;
    for (int m0 = begin; m0 < end; m0 += MT) {
        const int count = min(MT, end - m0);
        const float* hs[MT];
        float acc[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            hs[m] = h + (size_t)perm[m0 + min(m, count - 1)] * inter;
            acc[m] = 0.f;
        }
#pragma unroll 2
        for (int k = lane * VEC; k < inter; k += 32 * VEC) {
            float w[VEC];
            load_elems(wd + k, w);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if (m < count) {
                    float hv[VEC];
                    load_floats(hs[m] + k, hv);
#pragma unroll
                    for (int i = 0; i < VEC; ++i) acc[m] = fmaf(w[i], hv[i], acc[m]);
                }
            }
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            float s = warp_sum(acc[m]);
            if (lane == 0 && m < count) {
                const int a = perm[m0 + m];
                y[(size_t)a * hidden + n] = topk_weights[a] * s;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) trtcore_moe_reduce(
    const float* __restrict__ y, const int* __restrict__ ids, elem_t* __restrict__ out, int hidden, int top_k, int num_experts) {
    PDL_WAIT();
    const size_t t = blockIdx.x;
    PDL_LAUNCH();
    for (int n = threadIdx.x; n < hidden; n += blockDim.x) {
        float s = 0.f;
        for (int r = 0; r < top_k; ++r) {
            const size_t a = t * top_k + r;
            const int e = ids[a];
            if (e >= 0 && e < num_experts) s += y[a * hidden + n];
        }
        out[t * hidden + n] = from_f32(s);
    }
}
