// The rotation of rotary position embedding (RoPE), shared by kernels/rope.cu (the RoPE
// plugin) and kernels/paged_attention.cu (RoPE fused into paged attention), so that both
// follow one implementation of the numerical contract of trtcore.plugins.rope:
//
//   angle    = float32(pos) * freq                    one float32 product, as transformers
//   cos, sin = float32(cos/sin(double(angle))) * attention_scaling      (float32 products)
//   out_a    = x_a * cos - x_b * sin,  out_b = x_b * cos + x_a * sin
//              each product and the sum rounded in float32 (__fmul_rn / __fadd_rn /
//              __fsub_rn: never contracted into an FMA); the caller rounds the result once
//              to its I/O dtype.
//
// Pairing (ROTARY_DIM rotated features of a head, the rest pass through):
//   NEOX 1: feature i < ROTARY_DIM/2 (x_a) pairs with i + ROTARY_DIM/2 (x_b), cos/sin index i;
//   NEOX 0: feature 2i (x_a) pairs with 2i + 1 (x_b) (GPT-J), cos/sin index i.
//
// The including file defines ROTARY_DIM (> 0) and NEOX before including this header.
#pragma once

#if !defined(ROTARY_DIM) || !defined(NEOX)
#error "define ROTARY_DIM and NEOX before including rope.cuh"
#endif

#define ROPE_HALF (ROTARY_DIM / 2)

// cos and sin of the token at `pos` for frequency `freq`, scaled by attention_scaling
__device__ __forceinline__ void rope_cos_sin(float pos, float freq, float attention_scaling, float& cs, float& sn) {
    const float angle = __fmul_rn(pos, freq);
    double sd, cd;
    sincos((double)angle, &sd, &cd);
    cs = __fmul_rn((float)cd, attention_scaling);
    sn = __fmul_rn((float)sd, attention_scaling);
}

// the rotated pair (x_a, x_b) -> (out_a, out_b)
__device__ __forceinline__ void rope_rotate(float xa, float xb, float cs, float sn, float& oa, float& ob) {
    oa = __fsub_rn(__fmul_rn(xa, cs), __fmul_rn(xb, sn));
    ob = __fadd_rn(__fmul_rn(xb, cs), __fmul_rn(xa, sn));
}

// feature d (< ROTARY_DIM) of a head: its cos/sin index, its partner feature, and whether it
// is the pair's first (x_a) element
__device__ __forceinline__ int rope_pair_index(int d) { return NEOX ? (d < ROPE_HALF ? d : d - ROPE_HALF) : (d >> 1); }
__device__ __forceinline__ int rope_partner(int d) { return NEOX ? (d < ROPE_HALF ? d + ROPE_HALF : d - ROPE_HALF) : (d ^ 1); }
__device__ __forceinline__ bool rope_is_first(int d) { return NEOX ? d < ROPE_HALF : (d & 1) == 0; }

// the rotated value of feature d (< ROTARY_DIM) whose value is x and whose partner's is p,
// exactly as rope_rotate computes it
__device__ __forceinline__ float rope_feature(int d, float x, float p, float cs, float sn) {
    float oa, ob;
    if (rope_is_first(d)) {
        rope_rotate(x, p, cs, sn, oa, ob);
        return oa;
    }
    rope_rotate(p, x, cs, sn, oa, ob);
    return ob;
}
