// E4M3 (OCP OFP8 rev. 1.0: 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; 448 = S.1111.110
// the largest finite value, 2^-9 the smallest subnormal, S.1111.111 NaN) conversions shared by
// trtcore's kernels (fp8_gemm.cu, paged_attention.cu's KV_FP8 pool). Written out bit by bit: no
// cuda_fp8.h (NVRTC cannot find it without the full toolkit headers), the same code on every
// architecture; the contract is trtcore.fp8 (NumPy / ml_dtypes float8_e4m3fn).
#pragma once

#define E4M3_MAX 448.0f

// E4M3 bits of float32 v, saturating (|v| > 448 -> 448), round to nearest even; NaN -> 0x7f.
__device__ __forceinline__ unsigned char e4m3_of(float v) {
    unsigned int sign = (__float_as_uint(v) >> 24) & 0x80u;
    float a = fabsf(v);
    if (a != a) return (unsigned char)(sign | 0x7fu);
    if (a >= E4M3_MAX) return (unsigned char)(sign | 0x7eu);
    unsigned int code;
    if (a < 0.015625f) {  // below 2^-6: subnormal, steps of 2^-9 (code 8 is 2^-6, the first normal)
        code = (unsigned int)__float2int_rn(a * 512.0f);
    } else {
        int e = ((__float_as_uint(a) >> 23) & 0xff) - 127;  // floor(log2 a), -6 .. 8
        float m = a * __uint_as_float((unsigned int)(127 - e + 3) << 23);  // a / 2^(e-3): 8 <= m < 16, exact
        unsigned int r = (unsigned int)__float2int_rn(m);                 // 8 .. 16 (16 carries)
        code = (unsigned int)(e + 7) * 8u + (r - 8u);
        if (code > 0x7eu) code = 0x7eu;
    }
    return (unsigned char)(sign | code);
}

// The exact float32 value of E4M3 bits b (every E4M3 value is a float32; NaN for S.1111.111).
__device__ __forceinline__ float e4m3_to_f32(unsigned int b) {
    const unsigned int e = (b >> 3) & 0xfu, m = b & 7u;
    float a;
    if ((b & 0x7fu) == 0x7fu) {
        a = __uint_as_float(0x7fc00000u);
    } else if (e == 0u) {
        a = (float)m * 0.001953125f;  // m * 2^-9, exact
    } else {
        a = __uint_as_float(((e + 120u) << 23) | (m << 20));  // 2^(e-7) * (1 + m/8)
    }
    return (b & 0x80u) ? -a : a;
}
