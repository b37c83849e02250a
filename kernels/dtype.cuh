// Element types of trtcore's kernels, chosen by the DTYPE define: 0 float32, 1 float16,
// 2 bfloat16 (16-bit types travel as their bit patterns, so no CUDA headers are needed).
// elem_t is the storage type; to_f32 / from_f32 convert (from_f32 rounds to nearest even).
#pragma once

#ifndef DTYPE
#define DTYPE 2  // bfloat16, the kernels' default
#endif

#if DTYPE == 0
typedef float elem_t;
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float from_f32(float x) { return x; }
#elif DTYPE == 1
typedef unsigned short elem_t;  // IEEE binary16 bits
__device__ __forceinline__ float to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short from_f32(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#elif DTYPE == 2
typedef unsigned short elem_t;  // bfloat16 bits
__device__ __forceinline__ float to_f32(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short from_f32(float f) {
    // round to nearest even; NaN stays a quiet NaN (as cvt.rn.bf16.f32 and ml_dtypes)
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
#else
#error "DTYPE must be 0 (float32), 1 (float16) or 2 (bfloat16)"
#endif
