// Weight-only quantized GEMM: y[M, N] = x[M, K] @ dequant(W)^T with int4 / int8 weight codes,
// float16 / bfloat16 (or float32) activations and float32 accumulation.
//
// Dequantization (trtcore.quantization.QuantizedWeight): w[n, k] = (q[n, k] - z[n, g]) * s[n, g],
// g = k / group_size, q the unsigned code; symmetric weights have z = 2^(BITS-1). With HAS_PERM
// the stored column k multiplies input feature perm[k] (act-order): the kernels gather
// x[m, perm[k]].
//
// Weight layout (made once, at build, by trtcore.plugins.weight_only_gemm.pack_codes): the
// operand layout of the tensor cores' mma.m16n8k16 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"), so that one 16-byte load per lane brings a warp the
// A fragments of CHUNK_STEPS consecutive 16 x 16 tiles of W with no shuffle:
//   rows are grouped in tiles of 16 (N padded with zero codes), K is cut into chunks of
//   CHUNK codes (64 int4, 32 int8; K padded with zero codes), and uint4 (tile, chunk, lane) of
//   the codes array holds, for lane = 4 gid + tid, the k-steps j = 0 .. CHUNK_STEPS-1 of the
//   chunk (k0 = chunk * CHUNK + 16 j, rows r0 = tile * 16 + gid and r0 + 8, columns
//   c = k0 + 2 tid, c + 1, c + 8, c + 9):
//     int4: word j holds 8 codes, code (row, col) at nibble  reg + 4 e  where the pair
//           reg 0 = (r0, c + e), 1 = (r0 + 8, c + e), 2 = (r0, c + 8 + e), 3 = (r0 + 8, c + 8 + e);
//     int8: words 2j and 2j+1 hold (r0, c), (r0, c+1), (r0+8, c), (r0+8, c+1) and the same
//           at c + 8, one byte each, in that order.
//   The nibble order makes (word >> 4 reg) & 0x000F000F the two codes of A-fragment register
//   reg in the two 16-bit halves, ready for the magic-number conversion below.
//   scales, zeros: float32 [N_pad / 16, groups * 16]: tile, then group, then row in the tile.
//   With CONTIG_X the columns above are *stored* columns: stored column L of a chunk holds the
//   code of weight column  chunk * CHUNK + tid * (CHUNK / 4) + 4 j + 2 hi + e  for
//   L % CHUNK = 16 j + 2 tid + e + 8 hi (a permutation inside each chunk, made at pack time by
//   trtcore.plugins.weight_only_gemm.contiguous_x_order), so the x columns a lane multiplies in
//   a chunk are one contiguous run of CHUNK / 4 (32 bytes int4, 16 int8): two (one) 16-byte
//   loads instead of 2 CHUNK_STEPS 4-byte loads. Groups stay whole (the plugin sets it only where
//   every group is whole chunks, K whole chunks too, and there is no act order).
//
// Numerics (the contract of WeightOnlyGemmPlugin.reference, within float32 rounding):
//   tensor cores (trtcore_wq_gemv / gemv16): per 16-code k-step the codes become exact 16-bit
//   integers (q - z for symmetric weights, q with zero points), the products with x are exact
//   in the mma's float32 accumulator, which sums each group segment; the segment's sum D is
//   scaled in float32: acc += s * D (symmetric) or s * (D - z * X) with X = sum of x over the
//   segment (a second mma against a matrix of ones), so fractional zero points stay exact.
//   tiled (trtcore_wq_gemm, no tensor cores): w = fmaf(float(q), s, -z * s), acc += w * x.
//   One rounding to the output type. Every sum has a fixed order: results are deterministic.
//   dequantize (prefill on cuBLAS): w = (q - z) * s in float32, rounded once to x's dtype (the
//   one extra rounding of this path), then float32 accumulation in cuBLASLt.
//
// Kernels:
//   trtcore_wq_gemv     M <= 8:  one block per 16-row tile, its warps take the tile's chunks
//   trtcore_wq_gemv16   16 rows  round robin (UNROLL 16-byte loads in flight per lane, the first
//                       a block  ones issued before PDL_WAIT: weights are constants), the
//                                warps' partial sums added in shared memory in warp order.
//                                Needs DTYPE 1 or 2 and group_size a multiple of 16 (or K).
//                                gemv16: blockIdx.y is the block's slice of x (any M).
//   trtcore_wq_dequantize        the default from 40 rows of float16 / bfloat16 x (prefill,
//                                weight_only_gemm.CUBLAS_MIN_M; above 16 for other groups):
//   trtcore_wq_gather_x          a block of rows of W dequantized to x's dtype, then cuBLASLt's
//                                GEMM (section "prefill on cuBLAS", at the end); act order
//                                gathers x into the stored column order first.
//   trtcore_wq_gemm     any M:   (float32 x, or groups not a multiple of 16)
//                                64 x 64 output tiles, K in chunks of 32, the dequantized weight
//                                chunk and the activation chunk in shared memory (float32),
//                                4 x 4 outputs per thread.
//   trtcore_wq_swiglu            GATED weights (SwiGLU, section "the output") on the tiled and
//                                cuBLAS paths: silu(gate) * up from their staged output.
//   trtcore_wq_rope              ROPE weights (RoPE, section "the output") on the tiled and cuBLAS
//                                paths: q and k rotated, every row at its place, from their staged
//                                output.
//
// Defines: DTYPE (dtype.cuh), BITS 4 | 8, HAS_ZEROS 0 | 1, HAS_PERM 0 | 1, CONTIG_X 0 | 1 (the
// layout's K order above; not with HAS_PERM), UNROLL (default 2);
// the M <= 8 kernel's variant: WQ_DECODE 1 (default) | 2, and for 2 ROW_TILES, WQ_FOLD, SEG,
// L2_PF, L2_HINT (section "decode v2" below); GATED 0 | 1 (the SwiGLU output, section "the output");
// ROPE 0 | 1 with ROTARY_DIM (RoPE of the q and k rows, section "the output").
// Run-time: K a multiple of 8, group_size a multiple of 8 dividing K.
//
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 1}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 1}]
// trtcore-variants: [{"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 1}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 1}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 1}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 1}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 1}]
// the default v2 decode kernel (plugins/weight_only_gemm.py DEFAULT_DECODE), precompiled too
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1}]
// trtcore-variants: [{"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2}]
// the same with the contiguous-x K order (CONTIG_X: pack_weight's default where groups are whole chunks; TRTCORE_WQ_CONTIGUOUS_X=0 turns it off)
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1}]
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1}]
// trtcore-variants: [{"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1}]
// trtcore-variants: [{"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2}]

// 4-bit without zero points at most DECODE_RULE's unroll2_max_warps warps a block: UNROLL 2 (plain and gated)
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2, "GATED": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2, "GATED": 1}]

// gated (SwiGLU) outputs: the default decode kernels (v2, contiguous x) and the 16-row one, 4-bit
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "GATED": 1}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "GATED": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "GATED": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "GATED": 1}]
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "GATED": 1}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "GATED": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "GATED": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "GATED": 1}]

// the add + norm tail (ADD_NORM): the default decode kernels (v2, contiguous x)
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "ADD_NORM": 1}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "ADD_NORM": 1}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2, "ADD_NORM": 1}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2, "ADD_NORM": 1}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "ADD_NORM": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "ADD_NORM": 1}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2, "ADD_NORM": 1}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2, "ADD_NORM": 1}]

// x normalized in the kernel (NORM_X, the norm_input plugins): the default decode kernels, and 4-bit gated
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "NORM_X": 1}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "NORM_X": 1}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "NORM_X": 1}, {"DTYPE": 1, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "NORM_X": 1}]
// trtcore-variants: [{"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "NORM_X": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "NORM_X": 1}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "NORM_X": 1}, {"DTYPE": 2, "BITS": 8, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "NORM_X": 1}]
// trtcore-variants: [{"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "GATED": 1, "NORM_X": 1}, {"DTYPE": 1, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "GATED": 1, "NORM_X": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "GATED": 1, "NORM_X": 1}, {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1, "GATED": 1, "NORM_X": 1}]

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
#ifndef CONTIG_X
#define CONTIG_X 0
#endif
#ifndef UNROLL
#define UNROLL 2
#endif
#if BITS != 4 && BITS != 8
#error "BITS must be 4 or 8"
#endif
#if CONTIG_X && HAS_PERM
#error "CONTIG_X and HAS_PERM exclude each other"
#endif

#define CHUNK_STEPS (BITS == 4 ? 4 : 2)  // 16-code k-steps per 16-byte vector
#define CHUNK (16 * CHUNK_STEPS)         // codes per tile row per chunk
#define CODE_MASK ((1u << BITS) - 1u)
#define SYM_ZERO ((float)(1 << (BITS - 1)))
#define MAX_WARPS 16

// ---- the layout ---------------------------------------------------------------------------

#include "wq_layout.cuh"  // XOFF_*, b_columns, stored_col: the K order (CONTIG_X)

// code (row r in its tile, weight column kw) of tile tt: the word and the bit offset of the layout above
__device__ __forceinline__ unsigned int code_at(const unsigned int* __restrict__ w, int chunks, int tt, int r, int kw) {
    const int k = stored_col(kw);
    const int chunk = k / CHUNK, j = (k % CHUNK) / 16, kk = k % 16;
    const int lane = (r % 8) * 4 + (kk % 8) / 2, e = kk % 2, h = r / 8, c8 = kk / 8;
    const unsigned int* v = w + (((size_t)tt * chunks + chunk) * 32 + lane) * 4;
#if BITS == 4
    return (__ldg(v + j) >> (4 * ((h + 2 * c8) + 4 * e))) & CODE_MASK;
#else
    return (__ldg(v + 2 * j + c8) >> (8 * (2 * h + e))) & CODE_MASK;
#endif
}

__device__ __forceinline__ int scale_index(int n, int g, int groups) { return ((n / 16) * groups + g) * 16 + n % 16; }

// the scale and zero point at index idx of the per-group arrays (symmetric: 2^(BITS-1))
__device__ __forceinline__ void group_scale_zero(const float* __restrict__ scales, const float* __restrict__ zeros, int idx, float& s, float& z) {
    s = __ldg(scales + idx);
#if HAS_ZEROS
    z = __ldg(zeros + idx);
#else
    (void)zeros;
    z = SYM_ZERO;
#endif
}

// ---- the output: plain, gated (SwiGLU) or rotated (RoPE) -------------------------------------
//
// GATED 1: W's N = 2 I rows are a gate/up pair of linears interleaved by 8 (made at build by
// trtcore.plugins.weight_only_gemm.swiglu_order): rows 16 t .. 16 t + 7 are gate rows 8 t ..
// 8 t + 7 and rows 16 t + 8 .. 16 t + 15 the up rows of the same features, so one thread's D
// fragment holds both halves of an output feature and the kernel writes out[m, I] =
// silu(gate) * up instead of y[m, N] (TensorRT-LLM's gemm + SwiGLU fusion, vLLM's
// MergedColumnParallelLinear + SiluAndMul). The numbers are the unfused graph's: gate and up
// rounded to elem_t as the GEMM writes them, then ops.silu and ops.mul as the pointwise kernel
// computes them (sigmoid as codegen.py's SIGMOID, each layer's output rounded to elem_t).
#ifndef GATED
#define GATED 0
#endif

__device__ __forceinline__ float round_elem(float v) { return to_f32(from_f32(v)); }

// silu(g) * u of a gate / up pair, every layer's rounding but the last (the store's)
__device__ __forceinline__ float swiglu_of(float g, float u) {
    g = round_elem(g);
    const float s = round_elem(1.0f / (1.0f + expf(-g)));
    return round_elem(g * s) * round_elem(u);
}

// ROPE 0 | 1: rotary position embedding in the epilogue (trtcore.cuda.rope_fusion; the plugin's
// rope_rows > 0): the weight's first rope_rows rows are the q and k heads of ROTARY_DIM features
// each (defined with NEOX 1: full, half-split rotary, the only kind fused), stored in the
// order trtcore.plugins.weight_only_gemm.rope_order gives -- per head, rows 16 t .. 16 t + 7 of
// its tile t hold features 8 t .. 8 t + 7 and rows 16 t + 8 .. those features + ROTARY_DIM / 2
// -- so one thread's D-fragment pair (rows gid, gid + 8) is a rotation pair (x_a, x_b): the
// epilogue rotates it by its row's position with the RoPE plugin's rope.cuh (the GEMM's outputs
// rounded to elem_t first, as the unfused graph stores them) and writes both features at their
// places. The rows past rope_rows (v) are stored as they are.
#ifndef ROPE
#define ROPE 0
#endif
#if ROPE && GATED
#error "ROPE and GATED exclude each other"
#endif
#if ROPE
#ifndef NEOX
#define NEOX 1
#endif
#if !NEOX || !defined(ROTARY_DIM) || ROTARY_DIM % 16
#error "ROPE needs NEOX 1 and ROTARY_DIM a multiple of 16"
#endif
#include "rope.cuh"  // the RoPE plugin's rotation (its numerical contract)
#endif

// where a block writes: the output and, with ROPE, what the epilogue's rotation reads
struct OutRows {
    elem_t* p;
    const int* pos;      // ROPE: [M] each x row's position
    const float* freq;   // ROPE: [ROTARY_DIM / 2] inv_freq
    int rope_rows;       // ROPE: rows rotated (q and k); 0 without
    float rope_scale;    // ROPE: attention_scaling
    // ADD_NORM (the v2 kernel's tail, section "the add + norm tail"): p is h, where the GEMM's y
    // goes first; the grid's last block makes h = y + residual in place and normed = RMSNorm(h).
    // Without ADD_NORM a residual is the add_residual epilogue's: store_rows writes y + residual
    const elem_t* residual;  // [M, N]
    const elem_t* norm_w;    // [N] the RMSNorm weight
    elem_t* normed;          // [M, N]
    unsigned int* counter;   // the grid's finished blocks: 0 before and after every launch
    float eps;
};

// the two outputs of one thread's D-fragment pair: rows gid (lo) and gid + 8 (hi) of 16-row tile
// `tile`, x row m; N is W's rows (2 I when GATED: then one output, feature 8 tile + gid)
__device__ __forceinline__ void store_rows(const OutRows& o, int tile, int gid, int m, int M, int N, float lo, float hi) {
    if (m >= M) return;
    elem_t* __restrict__ out = o.p;
#if GATED
    const int half = N / 2, n = tile * 8 + gid;
    if (n < half) out[(size_t)m * half + n] = from_f32(swiglu_of(lo, hi));
#else
#if ROPE
    if (tile * 16 < o.rope_rows) {  // a rotation pair of one head (rope_rows: whole heads)
        const int head = tile * 16 / ROTARY_DIM, j = tile * 16 % ROTARY_DIM / 2 + gid;  // j: the pair, < ROTARY_DIM / 2
        float cs, sn, a, b;
        rope_cos_sin((float)o.pos[m], o.freq[j], o.rope_scale, cs, sn);
        rope_rotate(round_elem(lo), round_elem(hi), cs, sn, a, b);
        const size_t at = (size_t)m * N + head * ROTARY_DIM + j;
        out[at] = from_f32(a);
        out[at + ROPE_HALF] = from_f32(b);
        return;
    }
#endif
    const int n = tile * 16 + gid;
#if !ADD_NORM
    if (o.residual) {  // the plugin's add_residual: h = round(round(y) + r), the unfused graph's add
        if (n < N) lo = round_elem(lo) + to_f32(o.residual[(size_t)m * N + n]);
        if (n + 8 < N) hi = round_elem(hi) + to_f32(o.residual[(size_t)m * N + n + 8]);
    }
#endif
    if (n < N) out[(size_t)m * N + n] = from_f32(lo);
    if (n + 8 < N) out[(size_t)m * N + n + 8] = from_f32(hi);
#endif
}

// the output struct of a kernel's arguments, its rows from x row m0 on; residual: the
// add_residual epilogue's [M, row_len] (null without; the ADD_NORM tail's is set by add_norm_rows)
__device__ __forceinline__ OutRows out_rows(elem_t* out, const int* rope_pos, const float* rope_freq, int rope_rows, float rope_scale, int m0,
                                            int row_len, const elem_t* residual = nullptr) {
    OutRows o{out + (size_t)m0 * row_len, rope_pos + (rope_pos ? m0 : 0), rope_freq, rope_rows, rope_scale};
    o.residual = residual ? residual + (size_t)m0 * row_len : nullptr;
    return o;
}

// ---- the add + norm tail (ADD_NORM; trtcore.cuda.add_norm_fusion) ---------------------------------
//
// A decoder's residual add and the RMSNorm after it (Zhang & Sennrich, arXiv:1910.07467, as
// trtcore.ops.rms_norm builds it, LlamaRMSNorm):
//   h = round(y + residual);  inv = 1 / sqrt(sum(h32 * h32) / N + eps);  normed = round(round(h32 * inv) * w)
// with h32 = float(h), every product and sum in float32 (the sum in a fixed order: each thread's
// elements in turn, then the warps' sums in warp order). The v2 decode kernel runs it in the grid's
// last block once every block has stored its tiles of y in h (a ticket counter: each block's
// stores, a fence, one atomicInc; the block drawing the last ticket reads every block's tiles,
// and the counter wraps back to 0 for the next launch), so no kernel of its own waits for the GEMM;
// the other paths launch trtcore_wq_add_norm after the GEMM (one block per row).
#ifndef ADD_NORM
#define ADD_NORM 0
#endif
#if ADD_NORM && (GATED || ROPE)
#error "ADD_NORM excludes GATED and ROPE"
#endif
#define AN_CACHE 16  // elements of h a thread keeps in registers between the two passes

// the block's sum of v, the same in every thread; red: 32 floats of shared memory, free on entry
__device__ __forceinline__ float block_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int q = 0; q < warps; ++q) s += red[q];
    __syncthreads();  // red is free again
    return s;
}

// one row of N: h (holding y) becomes round(y + residual) in place, normed its RMSNorm; with a
// null residual h stays as it is (trtcore_wq_rms_norm). Every thread of the block calls it. y is
// read with ld.global.cg: other blocks wrote it.
__device__ __forceinline__ void add_norm_row(elem_t* h, const elem_t* __restrict__ residual, const elem_t* __restrict__ w, elem_t* normed, int N,
                                             float eps, float* red) {
    float hv[AN_CACHE];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < AN_CACHE; ++i) {  // all of a thread's loads before its first store
        const int j = threadIdx.x + i * blockDim.x;
        hv[i] = j < N ? to_f32(__ldcg(h + j)) : 0.0f;
        if (residual && j < N) hv[i] = round_elem(hv[i] + to_f32(residual[j]));
    }
#pragma unroll
    for (int i = 0; i < AN_CACHE; ++i) {
        const int j = threadIdx.x + i * blockDim.x;
        if (j < N) {
            if (residual) h[j] = from_f32(hv[i]);
            ss += hv[i] * hv[i];
        }
    }
    for (int j = threadIdx.x + AN_CACHE * blockDim.x; j < N; j += blockDim.x) {  // rows longer than the cache
        float v = to_f32(__ldcg(h + j));
        if (residual) {
            v = round_elem(v + to_f32(residual[j]));
            h[j] = from_f32(v);
        }
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)N + eps);
#pragma unroll
    for (int i = 0; i < AN_CACHE; ++i) {
        const int j = threadIdx.x + i * blockDim.x;
        if (j < N) normed[j] = from_f32(round_elem(hv[i] * inv) * to_f32(w[j]));
    }
    for (int j = threadIdx.x + AN_CACHE * blockDim.x; j < N; j += blockDim.x) normed[j] = from_f32(round_elem(to_f32(h[j]) * inv) * to_f32(w[j]));
}

#if ADD_NORM
// after warp 0's stores of its block's tiles of y (gemv2_store): the block that finishes last (by
// its ticket) makes h and normed of all M rows; the counter is back at 0 when it returns
__device__ __forceinline__ void add_norm_tail(const OutRows& o, int M, int N) {
    __shared__ float red[32];
    __shared__ unsigned int ticket;
    if (threadIdx.x < 32) __threadfence();  // warp 0's stores of y, visible to the grid before the block's ticket
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicInc(o.counter, gridDim.x - 1);  // gridDim.x - 1 -> 0
    __syncthreads();
    if (ticket != gridDim.x - 1) return;
    __threadfence();  // every other block fenced its stores before its ticket
    for (int m = 0; m < M; ++m)
        add_norm_row(o.p + (size_t)m * N, o.residual + (size_t)m * N, o.norm_w, o.normed + (size_t)m * N, N, o.eps, red);
}
#endif

// o with the ADD_NORM tail's arguments
__device__ __forceinline__ OutRows add_norm_rows(OutRows o, const elem_t* residual, const elem_t* norm_w, elem_t* normed, unsigned int* counter,
                                                 float eps) {
    o.residual = residual;
    o.norm_w = norm_w;
    o.normed = normed;
    o.counter = counter;
    o.eps = eps;
    return o;
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

// ---- decode: tensor cores -------------------------------------------------------------------

#if DTYPE == 1 || DTYPE == 2
#if DTYPE == 1
#define MAGIC16 0x6400u  // 1024.0 in float16: 1024 + q is exact for q < 1024
#define ONE16 0x3C00u
#else
#define MAGIC16 0x4300u  // 128.0 in bfloat16: 128 + q is exact for q < 128
#define ONE16 0x3F80u
#endif
#define PAIR(h) (((unsigned int)(h) << 16) | (unsigned int)(h))

__device__ __forceinline__ unsigned int pack2(float lo, float hi) {
    unsigned int d;
#if DTYPE == 1
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#endif
    return d;
}

// a * 1 + c on two 16-bit lanes (exact here: integers of at most 11 bits)
__device__ __forceinline__ unsigned int fma2_one(unsigned int a, unsigned int c) {
    unsigned int d;
#if DTYPE == 1
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(PAIR(ONE16)), "r"(c));
#else
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(PAIR(ONE16)), "r"(c));
#endif
    return d;
}

__device__ __forceinline__ void mma16816(float* d, const unsigned int* a, unsigned int b0, unsigned int b1) {
#if DTYPE == 1
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
#endif
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// the A fragment (exact 16-bit integers: q - 2^(BITS-1) symmetric, q with zero points) of
// k-step j of a lane's vector v
// (a & b) | c in one LOP3, b and c in registers: a mask the compiler cannot see as a constant
// stays in its register instead of being rematerialized before every use
__device__ __forceinline__ unsigned int and_or(unsigned int a, unsigned int b, unsigned int c) {
    unsigned int d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// mask: 0x000F000F (held in a register, see and_or)
__device__ __forceinline__ void a_fragment(const uint4& v, int j, unsigned int* a, unsigned int mask) {
    const unsigned int wv[4] = {v.x, v.y, v.z, v.w};
#if BITS == 4
    const unsigned int word = wv[j];
    // -(magic + z0) as a 16-bit float pair: z0 = 8 symmetric, 0 with zero points
#if DTYPE == 1
    const unsigned int negc = PAIR(HAS_ZEROS ? 0xE400u : 0xE408u);  // -1024, -1032
#else
    const unsigned int negc = PAIR(HAS_ZEROS ? 0xC300u : 0xC308u);  // -128, -136
#endif
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = fma2_one(and_or(word >> (4 * r), mask, PAIR(MAGIC16)), negc);
#else
    // 0x4B0000qq is 2^23 + q in float32; minus 2^23 + z0 (z0 = 128 symmetric, 0 with zero
    // points) it is q - z0 exactly, and exact again after rounding to 16 bits (|q - z0| < 256)
    const float off = 8388608.0f + (HAS_ZEROS ? 0.0f : SYM_ZERO);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned int word = wv[2 * j + h];
        float f[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) f[e] = __uint_as_float(0x4B000000u | ((word >> (8 * e)) & 0xFFu)) - off;
        a[2 * h] = pack2(f[0], f[1]);
        a[2 * h + 1] = pack2(f[2], f[3]);
    }
#endif
}

// the B fragment of x rows mt*8 + gid at stored columns k0 + 2 tid (+1) and k0 + 2 tid + 8 (+9)
// (the weight columns of the layout's K order), 0 beyond M or K
__device__ __forceinline__ void b_fragment(const elem_t* x, const int* __restrict__ perm, int m, int M, int K, int k0, int tid,
                                           unsigned int& b0, unsigned int& b1) {
    b0 = 0u;
    b1 = 0u;
    if (m >= M) return;
    int ka, kb;
    b_columns(k0, tid, ka, kb);
    const elem_t* row = x + (size_t)m * K;
#if HAS_PERM
    if (ka < K) b0 = (unsigned int)row[__ldg(perm + ka)] | ((unsigned int)row[__ldg(perm + ka + 1)] << 16);
    if (kb < K) b1 = (unsigned int)row[__ldg(perm + kb)] | ((unsigned int)row[__ldg(perm + kb + 1)] << 16);
#else
    if (ka < K) b0 = *reinterpret_cast<const unsigned int*>(row + ka);  // K even: both in or both out
    if (kb < K) b1 = *reinterpret_cast<const unsigned int*>(row + kb);
#endif
}

// the scale (and zero point) pair of rows gid, gid + 8 of group g
struct GroupPair {
    float s[2];
#if HAS_ZEROS
    float z[2];
#endif
};

__device__ __forceinline__ GroupPair group_pair(const float* __restrict__ st, const float* __restrict__ zt, int g, int gid) {
    GroupPair q;
    q.s[0] = __ldg(st + g * 16 + gid);
    q.s[1] = __ldg(st + g * 16 + gid + 8);
#if HAS_ZEROS
    q.z[0] = __ldg(zt + g * 16 + gid);
    q.z[1] = __ldg(zt + g * 16 + gid + 8);
#endif
    return q;
}

// a group segment's sums into the outputs: acc += s * d (s * (d - z * d1) with zero points);
// d (and d1) restart at 0
template <int MT>
__device__ __forceinline__ void flush(float (&acc)[MT][4], float (&d)[MT][4],
#if HAS_ZEROS
                                      float (&d1)[MT][4],
#endif
                                      const GroupPair& q) {
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float sv = q.s[i >> 1];  // D rows gid (i < 2), gid + 8
#if HAS_ZEROS
            acc[t][i] = fmaf(sv, fmaf(-q.z[i >> 1], d1[t][i], d[t][i]), acc[t][i]);
            d1[t][i] = 0.0f;
#else
            acc[t][i] = fmaf(sv, d[t][i], acc[t][i]);
#endif
            d[t][i] = 0.0f;
        }
    }
}

// the group of chunk c: cdiv > 0 when every group is cdiv whole chunks (cmagic = ceil(2^32 /
// cdiv): a multiply-high instead of a division, exact for c * cdiv < 2^32)
__device__ __forceinline__ int chunk_group(int c, int cdiv, unsigned int cmagic, int group_size) {
    if (cdiv == 1) return c;
    if (cdiv > 1) return (int)__umulhi((unsigned int)c, cmagic);
    return c * CHUNK / group_size;
}

// MT: 8-column tiles of x rows (M <= 8 MT). cdiv, cmagic: chunk_group; with cdiv > 0 a chunk
// inside K is one group segment, the fast path (no per-k-step bounds or group arithmetic).
// Each warp keeps UNROLL chunks' 16-byte vectors (and their first groups' scales) in flight in
// registers, refilling a buffer once its chunk is computed.
template <int MT>
__device__ __forceinline__ void gemv_body(const elem_t* __restrict__ x, const uint4* __restrict__ w, const float* __restrict__ scales,
                                          const float* __restrict__ zeros, const int* __restrict__ perm, const OutRows& out, int M,
                                          int N, int K, int group_size, int cdiv, unsigned int cmagic) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int gid = lane >> 2, tid = lane & 3;
    const int tt = blockIdx.x;
    const int chunks = (K + CHUNK - 1) / CHUNK;
    const int groups = K / group_size;
    const uint4* wt = w + (size_t)tt * chunks * 32 + lane;
    const float* st = scales + (size_t)tt * groups * 16;
#if HAS_ZEROS
    const float* zt = zeros + (size_t)tt * groups * 16;
    const unsigned int ones[4] = {PAIR(ONE16), PAIR(ONE16), PAIR(ONE16), PAIR(ONE16)};
#else
    const float* zt = nullptr;
#endif
    __shared__ float red[MAX_WARPS * MT * 4 * 32];  // the warps' partial sums [warp][MT * 4][32]

    // the first vectors and their chunks' first groups before PDL_WAIT: they are constants,
    // the previous kernel may still run
    uint4 buf[UNROLL];
    GroupPair gbuf[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int c = warp + u * warps;
        if (c < chunks) {
            buf[u] = load_stream(wt + (size_t)c * 32);
            gbuf[u] = group_pair(st, zt, chunk_group(c, cdiv, cmagic, group_size), gid);
        }
    }
    PDL_WAIT();
    PDL_LAUNCH();
    // 0x000F000F, opaque to the compiler (group_size > 0, so group_size >> 31 is 0)
    const unsigned int mask = 0x000F000Fu | (unsigned int)(group_size >> 31);
    // this lane's B-fragment rows: x[t * 8 + gid, 2 tid ..] (null beyond M)
    const elem_t* xrow[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) xrow[t] = t * 8 + gid < M ? x + (size_t)(t * 8 + gid) * K + XOFF_LANE(tid) : nullptr;

    float acc[MT][4];
    float d[MT][4];
#if HAS_ZEROS
    float d1[MT][4];
#endif
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc[t][i] = 0.0f;
            d[t][i] = 0.0f;
#if HAS_ZEROS
            d1[t][i] = 0.0f;
#endif
        }

    int next = warp + UNROLL * warps;  // the chunk the next refill loads, and its vector
    const uint4* wnext = wt + (size_t)next * 32;
    for (int base = warp; base < chunks; base += UNROLL * warps) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int c = base + u * warps;
        if (c >= chunks) break;
        const uint4& v = buf[u];
        const GroupPair& first = gbuf[u];
        if (!HAS_PERM && cdiv > 0 && (c + 1) * CHUNK <= K) {  // the fast path: one segment
            const int kc = c * CHUNK;
#pragma unroll
            for (int j = 0; j < CHUNK_STEPS; ++j) {
                unsigned int a[4];
                a_fragment(v, j, a, mask);
#pragma unroll
                for (int t = 0; t < MT; ++t) {
                    unsigned int b0 = 0u, b1 = 0u;
                    if (xrow[t] != nullptr) {
                        b0 = *reinterpret_cast<const unsigned int*>(xrow[t] + kc + XOFF_B0(j));
                        b1 = *reinterpret_cast<const unsigned int*>(xrow[t] + kc + XOFF_B1(j));
                    }
                    mma16816(d[t], a, b0, b1);
#if HAS_ZEROS
                    mma16816(d1[t], ones, b0, b1);
#endif
                }
            }
            flush<MT>(acc, d,
#if HAS_ZEROS
                      d1,
#endif
                      first);
        } else {
            const int g0 = chunk_group(c, cdiv, cmagic, group_size);
#pragma unroll
            for (int j = 0; j < CHUNK_STEPS; ++j) {
                const int k0 = c * CHUNK + 16 * j;
                if (k0 >= K) break;
                unsigned int a[4];
                a_fragment(v, j, a, mask);
#pragma unroll
                for (int t = 0; t < MT; ++t) {
                    unsigned int b0, b1;
                    b_fragment(x, perm, t * 8 + gid, M, K, k0, tid, b0, b1);
                    mma16816(d[t], a, b0, b1);
#if HAS_ZEROS
                    mma16816(d1[t], ones, b0, b1);
#endif
                }
                // end of a group segment: the chunk's last k-step, a group's end or K's
                if (j == CHUNK_STEPS - 1 || (k0 + 16) % group_size == 0 || k0 + 16 >= K) {
                    const int g = k0 / group_size;
                    const GroupPair q = g == g0 ? first : group_pair(st, zt, g, gid);  // groups below CHUNK: loaded here
                    flush<MT>(acc, d,
#if HAS_ZEROS
                              d1,
#endif
                              q);
                }
            }
        }
        // refill after the chunk's last use of buf[u]: no register copies; UNROLL - 1
        // vectors stay in flight while it computes
        if (next < chunks) {  // next = c + UNROLL * warps, at wnext
            buf[u] = load_stream(wnext);
            gbuf[u] = group_pair(st, zt, chunk_group(next, cdiv, cmagic, group_size), gid);
        }
        next += warps;
        wnext += (size_t)warps * 32;
    }
    }

    // the warps' partial sums, added in warp order
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[(warp * MT * 4 + t * 4 + i) * 32 + lane] = acc[t][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            // D fragment: rows gid (i) and gid + 8 (i + 2), column 2 tid + i
            float lo = red[(t * 4 + i) * 32 + lane], hi = red[(t * 4 + i + 2) * 32 + lane];
            for (int q = 1; q < warps; ++q) {
                lo += red[(q * MT * 4 + t * 4 + i) * 32 + lane];
                hi += red[(q * MT * 4 + t * 4 + i + 2) * 32 + lane];
            }
            store_rows(out, tt, gid, t * 8 + 2 * tid + i, M, N, lo, hi);
        }
    }
}

// ---- decode v2 (WQ_DECODE 2): the M <= 8 kernel with fewer instructions per byte -------------
//
// The same layout and numerics contract; it only runs where every chunk is one group segment
// (no act order, group_size a multiple of CHUNK: then K is one too, so no bounds checks at all;
// WeightOnlyGemmPlugin.fast_decode decides). What it changes, each measured by bench --tune:
//   ROW_TILES 1 | 2  tiles per block; with 2 every warp reads both tiles' vectors of a chunk, so
//                    each B fragment (x loads) and each X mma serves 32 rows.
//   WQ_FOLD 0 | 1 | 2  the magic number stays in the codes: A = off + q straight from one
//                    LOP3 / PRMT (no fma2 per register), and the segment's flush subtracts
//                    (off + z) * X, X = sum of x over the segment from one mma against ones per
//                    k-step (shared by the row tiles). off: float16 int4 64, bfloat16 int4 128,
//                    float16 int8 1024 (two codes per PRMT). bfloat16 int8 cannot fold (128 + q
//                    needs 9 bits) and ignores it. WQ_FOLD 2 differs only for float16 int4:
//                    1024 for rows gid (low nibbles, no shift) and 64 for rows gid + 8, so one
//                    shift per 8 codes instead of three, at 16x the rounding of the offset sums.
//   SEG 1 .. 4       chunks per work unit (a divisor of the chunks per group): a warp's unit is
//                    SEG consecutive chunks of one group, so its scales are loaded and its sums
//                    flushed once per SEG chunks (g128 int4: SEG 2 is one flush per group).
//   L2_PF 0 ..       at each refill, also prefetch into L2 the unit L2_PF rounds further on
//                    (prefetch.global.L2, one per 128 bytes: lanes 0, 8, 16, 24): more bytes in
//                    flight from DRAM without registers; the later loads then hit L2.
//   L2_HINT 0 | 1 | 2  the weight loads ask L2 to fetch 128 (1) or 256 (2) bytes around each
//                    (ld's .L2::128B / .L2::256B prefetch size), so DRAM sees fewer, larger requests.
//   ASYNC 0 | 2 ..   0: each warp keeps UNROLL units' vectors in flight in registers. Else ASYNC
//                    units in flight per warp, copied by cp.async into a ring of ASYNC slots of
//                    dynamic shared memory per warp (warps x ASYNC x ASLOT bytes, the launch's),
//                    the scales (and zero points) of the unit's group beside them: no registers
//                    held while in flight, so several times the bytes in flight of UNROLL 2 at the
//                    same occupancy. Each lane copies and reads only its own bytes (the two scales
//                    of its D rows, 4-byte copies), so cp.async.wait_group is the only
//                    synchronization. ASLOT: sizeof(AsyncSlot) as the plugin computes it
//                    (checked here at compile time: the launch's shared memory comes from it).
//   XPF 0 | 1        with ASYNC and CONTIG_X: the next unit's x words are loaded into registers
//                    before the current unit is computed, so their latency is not waited on.
//   int8             bytes reach float32 through one PRMT each (0x4B0000qq) instead of shift + mask.
//   per channel      (one group) the mma accumulators run over all of K and are scaled once at the
//                    end: no per-chunk scale loads or flushes.
//   M < 8            B rows beyond M read x row M - 1 (their D columns are never stored), so the
//                    x loads need no predicate.
#ifndef WQ_DECODE
#define WQ_DECODE 1
#endif
#ifndef ROW_TILES
#define ROW_TILES 1
#endif
#ifndef WQ_FOLD
#define WQ_FOLD 0
#endif
#ifndef SEG
#define SEG 1
#endif
#ifndef L2_PF
#define L2_PF 0
#endif
#ifndef L2_HINT
#define L2_HINT 0
#endif
#ifndef ASYNC
#define ASYNC 0
#endif
#if ASYNC == 1 || ASYNC < 0 || ASYNC > 32
#error "ASYNC must be 0 or 2 .. 32"  // above 63 ptxas clamps wait_group's count (DEPBAR.LE SB0, 0x3f)
#endif
#ifndef XPF
#define XPF 0
#endif
// NORM_X 0 | 1: the plugin's norm_input on the v2 register path (trtcore.cuda.norm_input_fusion):
// x is h, and the kernel computes RMSNorm's scale itself, folded out of the GEMM (RMSNorm: Zhang &
// Sennrich, arXiv:1910.07467; the scale is one number per row of x, so it factors out of the sum):
//   y[m, n] = round(inv_m * sum_k W[n, k] * round(h[m, k] * w[k])),  inv_m = 1 / sqrt(sum_k h32[m, k]^2 / K + eps)
// Each lane multiplies its x words by the norm weight's (one fma2 a word, rounded once: the mma's
// B operand; the weight read from L1 beside x) and sums the squares of h on the way (M = 1: the
// 8 lanes of a column run share its words, one word each; else each lane sums its own row's),
// the block adds the sums in a fixed order beside its partial sums, and warp 0 scales each
// output before its one rounding. No pass over x before the main loop and no shared-memory
// stage, whatever the grid (plugins/weight_only_gemm.py norm_folds; the unfused graph rounds
// h * inv before the weight: within an ulp of x, WeightOnlyGemmPlugin.reference). Measured on
// an H100 (bench/results/h100-2026-12-05-session28) it still costs more per chunk than the row
// kernel it saves: each warp's units run one after another, and the extra loads and
// instructions lengthen every one (the sums of squares on the tensor cores instead, one more
// mma a k-step, were slower still); trtcore.cuda.norm_input_fusion stays opt-in.
#ifndef NORM_X
#define NORM_X 0
#endif
#if NORM_X && (ASYNC > 0 || WQ_DECODE != 2 || ADD_NORM || !CONTIG_X || DTYPE == 0)
#error "NORM_X is the v2 register path's (WQ_DECODE 2, CONTIG_X, 16-bit x, no ASYNC, no ADD_NORM)"
#endif
#if XPF && !(ASYNC > 0 && CONTIG_X)
#error "XPF (x loaded a unit ahead) needs ASYNC and CONTIG_X"
#endif
#if ASYNC > 0 && !defined(ASLOT)
#error "ASYNC needs ASLOT, the bytes of one AsyncSlot (plugins/weight_only_gemm.py async_slot_bytes)"
#endif
#if WQ_DECODE != 1 && WQ_DECODE != 2
#error "WQ_DECODE must be 1 or 2"
#endif
#if ROW_TILES != 1 && ROW_TILES != 2
#error "ROW_TILES must be 1 or 2"
#endif
#if WQ_FOLD < 0 || WQ_FOLD > 2
#error "WQ_FOLD must be 0, 1 or 2"
#endif
#if L2_HINT < 0 || L2_HINT > 2
#error "L2_HINT must be 0, 1 or 2"
#endif
#if SEG < 1 || SEG > 4
#error "SEG must be 1 .. 4"
#endif
#define FOLD_ON (WQ_FOLD && (BITS == 4 || DTYPE == 1))
#define NEED_X (HAS_ZEROS || FOLD_ON)  // the X mma (sum of x per segment) is needed

// the weights' 16-byte streaming load, v2: load_stream with the L2_HINT prefetch size
__device__ __forceinline__ uint4 load_stream2(const uint4* p) {
#if L2_HINT == 0
    return load_stream(p);
#else
    uint4 v;
#if L2_HINT == 1
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
    return v;
#endif
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__device__ __forceinline__ unsigned int prmt(unsigned int a, unsigned int b, unsigned int sel) {
    unsigned int d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// mma with C = 0: the first k-step of a segment starts its sums without zeroing registers
__device__ __forceinline__ void mma16816_zc(float* d, const unsigned int* a, unsigned int b0, unsigned int b1) {
#if DTYPE == 1
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
#endif
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// the folded offset of the D rows gid (half 0) and gid + 8 (half 1): A = off + q
__device__ __forceinline__ float fold_off(int half) {
#if !FOLD_ON
    return 0.0f;
#elif BITS == 4 && DTYPE == 1 && WQ_FOLD == 2
    return half ? 64.0f : 1024.0f;
#elif BITS == 4 && DTYPE == 1
    return 64.0f;
#elif BITS == 4
    return 128.0f;
#else
    return 1024.0f;
#endif
}

// k-step j's A fragment, v2. m0f, mf0: 0x000F000F, 0x00F000F0; m1, m2: the magic pairs (int4
// FOLD_ON: float16 1024 / 64, bfloat16 128 / 128), or for int8 the PRMT byte sources
// (0x64646464 float16 fold, 0x4B000000 float32); all in registers (see and_or).
__device__ __forceinline__ void a_fragment2(const uint4& v, int j, unsigned int* a, unsigned int m0f, unsigned int mf0, unsigned int m1,
                                            unsigned int m2) {
    const unsigned int wv[4] = {v.x, v.y, v.z, v.w};
#if BITS == 4 && FOLD_ON && DTYPE == 1 && WQ_FOLD == 2
    // nibbles r, r + 4 are register r: 0 and 2 (rows gid) in the low nibble of a byte, 1024 + q;
    // 1 and 3 (rows gid + 8) in the high one, 64 + q (float16 ulp 1/16 at 64): one shift in all.
    // The 1024 offset costs accuracy: the mma sums (1024 + q) x, 16x larger than WQ_FOLD 1's.
    const unsigned int word = wv[j], t = word >> 8;
    a[0] = and_or(word, m0f, m1);
    a[1] = and_or(word, mf0, m2);
    a[2] = and_or(t, m0f, m1);
    a[3] = and_or(t, mf0, m2);
#elif BITS == 4 && FOLD_ON && DTYPE == 1
    // every nibble moves to bits 4-7 of its half: 64 + q (float16 ulp 1/16 at 64); register 1's
    // is there already
    const unsigned int word = wv[j];
    a[0] = and_or(word << 4, mf0, m2);
    a[1] = and_or(word, mf0, m2);
    a[2] = and_or(word >> 4, mf0, m2);
    a[3] = and_or(word >> 8, mf0, m2);
#elif BITS == 4 && FOLD_ON
    // bfloat16 has 7 mantissa bits: every nibble moves to bits 0-3, 128 + q
    const unsigned int word = wv[j];
    a[0] = and_or(word, m0f, m1);
#pragma unroll
    for (int r = 1; r < 4; ++r) a[r] = and_or(word >> (4 * r), m0f, m1);
#elif BITS == 4
    a_fragment(v, j, a, m0f);  // the fma2 path of v1
#elif FOLD_ON
    // float16 int8: bytes (b0, b1) of a word -> 0x64b1_64b0 = (1024 + q1, 1024 + q0); register
    // 2h (rows gid) takes bytes 0, 1 of word 2j + h, register 2h + 1 (rows gid + 8) bytes 2, 3
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        a[2 * h] = prmt(wv[2 * j + h], m1, 0x4140u);
        a[2 * h + 1] = prmt(wv[2 * j + h], m1, 0x4342u);
    }
#else
    // int8 through float32: PRMT builds 0x4B0000qq (2^23 + q) from byte e and m1 = 0x4B000000,
    // minus 2^23 + z0 is q - z0 exactly (z0 = 128 symmetric, 0 with zero points)
    const float off = 8388608.0f + (HAS_ZEROS ? 0.0f : SYM_ZERO);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const unsigned int word = wv[2 * j + h];
        float f[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) f[e] = __uint_as_float(prmt(word, m1, 0x7440u + e)) - off;
        a[2 * h] = pack2(f[0], f[1]);
        a[2 * h + 1] = pack2(f[2], f[3]);
    }
#endif
}

// a segment's sums into acc: acc += s * (d - c * dx), c = off + z (z: the zero point, or 2^(BITS-1)
// when the offset folds symmetric codes); without NEED_X acc += s * d
__device__ __forceinline__ void flush2(float (&acc)[4], const float (&d)[4], const float (&dx)[4], const GroupPair& q) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int half = i >> 1;
#if NEED_X
#if HAS_ZEROS
        const float c = fold_off(half) + q.z[half];
#else
        const float c = fold_off(half) + SYM_ZERO;
#endif
        acc[i] = fmaf(q.s[half], fmaf(-c, dx[i], d[i]), acc[i]);
#else
        acc[i] = fmaf(q.s[half], d[i], acc[i]);
#endif
    }
}

// the group of chunk c when every group is cdiv >= 1 whole chunks (chunk_group without its
// division fallback, which v2 never needs)
__device__ __forceinline__ int chunk_group2(int c, int cdiv, unsigned int cmagic) {
    return cdiv == 1 ? c : (int)__umulhi((unsigned int)c, cmagic);
}

// the masks and magic pairs of a_fragment2 (and the ones of the X mma), held in registers:
// opaque is 0 but unknown to the compiler (see and_or)
struct Frag2 {
    unsigned int m0f, mf0, m1, m2;
#if NEED_X
    unsigned int one2;
#endif
};

__device__ __forceinline__ Frag2 frag2_consts(unsigned int opaque) {
    Frag2 f;
    f.m0f = 0x000F000Fu | opaque;
    f.mf0 = 0x00F000F0u | opaque;
#if BITS == 4 && DTYPE == 1
    f.m1 = 0x64006400u | opaque;
    f.m2 = 0x54005400u | opaque;
#elif BITS == 4
    f.m1 = f.m2 = 0x43004300u | opaque;
#elif FOLD_ON
    f.m1 = f.m2 = 0x64646464u | opaque;
#else
    f.m1 = f.m2 = 0x4B000000u | opaque;
#endif
#if NEED_X
    f.one2 = PAIR(ONE16) | opaque;
#endif
    return f;
}

#if CONTIG_X
// the lane's CHUNK / 4 x columns of a chunk (from xc, its first) in 16-byte loads: k-step j's
// b0, b1 are words 2 j, 2 j + 1
__device__ __forceinline__ void chunk_x(const elem_t* xc, unsigned int (&xw)[2 * CHUNK_STEPS]) {
#pragma unroll
    for (int q = 0; q < CHUNK_STEPS / 2; ++q) {
        const uint4 v4 = *reinterpret_cast<const uint4*>(xc + 8 * q);
        xw[4 * q] = v4.x;
        xw[4 * q + 1] = v4.y;
        xw[4 * q + 2] = v4.z;
        xw[4 * q + 3] = v4.w;
    }
}

// a unit's x words of this lane: chunk s's are w[s] (chunk_x)
struct UnitX {
    unsigned int w[SEG][2 * CHUNK_STEPS];
};

__device__ __forceinline__ void unit_x(const elem_t* xc, UnitX& x) {
#pragma unroll
    for (int s = 0; s < SEG; ++s) chunk_x(xc + s * CHUNK, x.w[s]);
}
#else
struct UnitX {};  // PRE needs CONTIG_X
#endif

// NORM_X's state in a lane (section above; empty without): the norm weight at the lane's x run of
// its current unit (advanced with x), the lane's sum of h^2, and whether x has one row
struct NormFold {
#if NORM_X
    const elem_t* w;
    float ss;
    bool one_row;
#endif
};

#if NORM_X
// a pair of 16-bit elements times another, rounded once (fma with -0: x * w exactly, signed zeros kept)
__device__ __forceinline__ unsigned int mul2(unsigned int a, unsigned int b) {
    unsigned int d;
#if DTYPE == 1
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
#else
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
#endif
    return d;
}

// ss plus the squares of a word's two elements, in float32
__device__ __forceinline__ float sq2(unsigned int word, float ss) {
    const float a = to_f32((elem_t)(word & 0xffffu)), b = to_f32((elem_t)(word >> 16));
    return fmaf(b, b, fmaf(a, a, ss));
}

// a chunk's x words (h, from xr: the lane's run) become round(h * w) (w from wr, the norm weight's
// same run), and nf.ss takes this lane's share of the squares of h: x of one row, word gid of the
// run (the run's words are split among the 8 lanes that share it; int8's 4 words: lanes gid < 4);
// else the lane's whole run (its row gid: the rows past M repeat row M - 1, never stored)
__device__ __forceinline__ void norm_fold(unsigned int (&xw)[2 * CHUNK_STEPS], const elem_t* xr, const elem_t* wr, NormFold& nf) {
    unsigned int ww[2 * CHUNK_STEPS];
    chunk_x(wr, ww);
    const int gid = (threadIdx.x & 31) >> 2;
    if (nf.one_row) {
        if (gid < 2 * CHUNK_STEPS) nf.ss = sq2(*reinterpret_cast<const unsigned int*>(xr + 2 * gid), nf.ss);
    } else {
#pragma unroll
        for (int i = 0; i < 2 * CHUNK_STEPS; ++i) nf.ss = sq2(xw[i], nf.ss);
    }
#pragma unroll
    for (int i = 0; i < 2 * CHUNK_STEPS; ++i) xw[i] = mul2(xw[i], ww[i]);
}

// the warp's sum of h^2 of the row of this lane (every lane of a row gets the same bits: a
// butterfly adds the same pairs in every lane)
__device__ __forceinline__ float norm_row_sum(const NormFold& nf) {
    float s = nf.ss;
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    if (nf.one_row) {
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        s += __shfl_xor_sync(0xffffffffu, s, 8);
        s += __shfl_xor_sync(0xffffffffu, s, 16);
    }
    return s;
}
#endif

// one unit's products: its SEG chunks' vectors v (ROW_TILES tiles) against x from xc (the lane's
// B-fragment row at the unit's first column) into d (and dx, the sums of x). A grouped unit
// starts its sums (C = 0); per channel they run on. PRE (CONTIG_X): x comes from xp, loaded
// ahead (unit_x), instead of xc. NORM_X: x is h, each chunk's words folded with the norm weight at
// nf (norm_fold).
template <bool GROUPED, bool PRE = false>
__device__ __forceinline__ void unit2(const uint4 (&v)[SEG][ROW_TILES], const elem_t* xc, float (&d)[ROW_TILES][4], float (&dx)[4],
                                      const Frag2& f, const UnitX* xp = nullptr, NormFold* nf = nullptr) {
#if NEED_X
    const unsigned int ones[4] = {f.one2, f.one2, f.one2, f.one2};
#endif
#pragma unroll
    for (int s = 0; s < SEG; ++s) {
#if CONTIG_X
        unsigned int xw[2 * CHUNK_STEPS];
        if constexpr (PRE) {
#pragma unroll
            for (int i = 0; i < 2 * CHUNK_STEPS; ++i) xw[i] = xp->w[s][i];
        } else {
            chunk_x(xc + s * CHUNK, xw);
#if NORM_X
            norm_fold(xw, xc + s * CHUNK, nf->w + s * CHUNK, *nf);
#endif
        }
#else
        static_assert(!PRE, "x loaded ahead needs CONTIG_X");
#endif
#pragma unroll
        for (int j = 0; j < CHUNK_STEPS; ++j) {
#if CONTIG_X
            const unsigned int b0 = xw[2 * j], b1 = xw[2 * j + 1];
#else
            const unsigned int b0 = *reinterpret_cast<const unsigned int*>(xc + s * CHUNK + 16 * j);
            const unsigned int b1 = *reinterpret_cast<const unsigned int*>(xc + s * CHUNK + 16 * j + 8);
#endif
            const bool first = GROUPED && s == 0 && j == 0;  // a segment starts: C = 0
#pragma unroll
            for (int r = 0; r < ROW_TILES; ++r) {
                unsigned int a[4];
                a_fragment2(v[s][r], j, a, f.m0f, f.mf0, f.m1, f.m2);
                if (first)
                    mma16816_zc(d[r], a, b0, b1);
                else
                    mma16816(d[r], a, b0, b1);
            }
#if NEED_X
            if (first)
                mma16816_zc(dx, ones, b0, b1);
            else
                mma16816(dx, ones, b0, b1);
#endif
        }
    }
}

// the block's outputs: every warp's sums into shared memory (warp q's at red + q * wstride
// floats), then warp 0 adds them in warp order (deterministic) and rounds each output once.
// NORM_X: nf's sums of h^2 go beside them (per warp and row), and warp 0 scales each output by
// its row's inv (section NORM_X; K and eps: the norm's)
__device__ __forceinline__ void gemv2_store(const float (&acc)[ROW_TILES][4], float* red, const OutRows& out, int M, int N,
                                            int wstride = ROW_TILES * 4 * 32, const NormFold* nf = nullptr, int K = 0, float eps = 0.0f) {
    constexpr int RT = ROW_TILES;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int gid = lane >> 2, tid = lane & 3;
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp * wstride + (r * 4 + i) * 32 + lane] = acc[r][i];
#if NORM_X
    __shared__ float nss[MAX_WARPS][8];  // [warp][x row] the sums of h^2
    const float rs = norm_row_sum(*nf);
    if (tid == 0) nss[warp][gid] = rs;
#endif
    __syncthreads();
    if (warp == 0) {
#if NORM_X
        float inv[2];  // the rows of this lane's D columns, 2 tid and 2 tid + 1 (past M: unused)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float t = nss[0][2 * tid + i];
            for (int q = 1; q < warps; ++q) t += nss[q][2 * tid + i];
            inv[i] = 1.0f / sqrtf(t / (float)K + eps);
        }
#endif
#pragma unroll
        for (int r = 0; r < RT; ++r) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                // D fragment: rows gid (i) and gid + 8 (i + 2), column 2 tid + i
                float lo = red[(r * 4 + i) * 32 + lane], hi = red[(r * 4 + i + 2) * 32 + lane];
                for (int q = 1; q < warps; ++q) {
                    lo += red[q * wstride + (r * 4 + i) * 32 + lane];
                    hi += red[q * wstride + (r * 4 + i + 2) * 32 + lane];
                }
#if NORM_X
                lo *= inv[i];
                hi *= inv[i];
#endif
                store_rows(out, (int)blockIdx.x * RT + r, gid, 2 * tid + i, M, N, lo, hi);
            }
        }
    }
#if ADD_NORM
    add_norm_tail(out, M, N);
#endif
}

// this lane's B-fragment row x[gid, XOFF_LANE(tid) ..] at unit `warp` (CONTIG_X: 16-byte
// aligned, x's rows being whole chunks; the plugin runs v2 only on a 16-byte aligned x); rows beyond M read row M - 1 (their
// D columns are never stored), so no predicate
__device__ __forceinline__ const elem_t* x_row2(const elem_t* __restrict__ x, int M, int K) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    return x + (size_t)min(lane >> 2, M - 1) * K + XOFF_LANE(lane & 3) + warp * (SEG * CHUNK);
}

// A unit is SEG consecutive chunks (SEG divides the chunks per group, so a unit lies inside one
// group): warps take units round robin, keep UNROLL units' vectors (SEG x ROW_TILES 16-byte
// loads per lane each) in flight in registers, and refill a unit's buffers once it is computed.
// GROUPED: more than one group, so a flush per unit; else one scale per row, applied at the end.
// NORM_X: x is h, folded with the norm weight norm_w (eps: the norm's; section NORM_X).
template <bool GROUPED>
__device__ __forceinline__ void gemv2_main(const elem_t* __restrict__ x, const uint4* const (&wt)[ROW_TILES], const float* const (&st)[ROW_TILES],
                                           const float* const (&zt)[ROW_TILES], uint4 (&buf)[UNROLL][SEG][ROW_TILES],
                                           GroupPair (&gbuf)[UNROLL][ROW_TILES], float* red, const OutRows& out, int M, int N, int K,
                                           int cdiv, unsigned int cmagic, unsigned int opaque, const elem_t* __restrict__ norm_w, float eps) {
    constexpr int RT = ROW_TILES;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int gid = lane >> 2;
    const int units = K / (CHUNK * SEG);
    const Frag2 f = frag2_consts(opaque);
    // pointers advance by `warps` units per unit: an add, not a multiply and a widening per load
    const elem_t* xc = x_row2(x, M, K);
    const size_t xstep = (size_t)warps * (SEG * CHUNK), wstep = (size_t)warps * (SEG * 32);
    NormFold nf;
#if NORM_X
    nf.w = norm_w + XOFF_LANE(lane & 3) + warp * (SEG * CHUNK);  // x_row2's columns
    nf.ss = 0.0f;
    nf.one_row = M == 1;
#endif
    const uint4* wn[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) wn[r] = wt[r] + (size_t)(warp + UNROLL * warps) * (SEG * 32);
#if L2_PF > 0
    const size_t pfstep = (size_t)L2_PF * wstep;  // the prefetched unit, from the refilled one
#endif

    float acc[RT][4], d[RT][4], dx[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        dx[i] = 0.0f;
#pragma unroll
        for (int r = 0; r < RT; ++r) acc[r][i] = d[r][i] = 0.0f;
    }

    int next = warp + UNROLL * warps;
    for (int base = warp; base < units; base += UNROLL * warps) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (base + u * warps >= units) break;
            unit2<GROUPED>(buf[u], xc, d, dx, f, nullptr, &nf);
            if (GROUPED) {
#pragma unroll
                for (int r = 0; r < RT; ++r) flush2(acc[r], d[r], dx, gbuf[u][r]);
            }
            // refill after the unit's last use of buf[u]
            if (next < units) {
                const int g = GROUPED ? chunk_group2(next * SEG, cdiv, cmagic) : 0;
#pragma unroll
                for (int r = 0; r < RT; ++r) {
#pragma unroll
                    for (int s = 0; s < SEG; ++s) buf[u][s][r] = load_stream2(wn[r] + s * 32);
                    if (GROUPED) gbuf[u][r] = group_pair(st[r], zt[r], g, gid);
                }
#if L2_PF > 0
                if ((lane & 7) == 0 && next + L2_PF * warps < units) {  // lanes 8i: 128 bytes each
#pragma unroll
                    for (int r = 0; r < RT; ++r)
#pragma unroll
                        for (int s = 0; s < SEG; ++s) prefetch_l2(wn[r] + pfstep + s * 32);
                }
#endif
            }
            next += warps;
            xc += xstep;
#if NORM_X
            nf.w += xstep;
#endif
#pragma unroll
            for (int r = 0; r < RT; ++r) wn[r] += wstep;
        }
    }
    if (!GROUPED) {
#pragma unroll
        for (int r = 0; r < RT; ++r) flush2(acc[r], d[r], dx, gbuf[0][r]);
    }
    gemv2_store(acc, red, out, M, N, RT * 4 * 32, &nf, K, eps);
}

// the block's ROW_TILES tiles: their weights (at this lane's vectors), scales and zero points; a
// block's second tile past the last one reads the last one again (never stored)
__device__ __forceinline__ void tile_pointers(const uint4* __restrict__ w, const float* __restrict__ scales, const float* __restrict__ zeros,
                                              int N, int K, int group_size, const uint4* (&wt)[ROW_TILES], const float* (&st)[ROW_TILES],
                                              const float* (&zt)[ROW_TILES]) {
    const int lane = threadIdx.x & 31;
    const int tiles = (N + 15) / 16, chunks = K / CHUNK, groups = K / group_size;
#pragma unroll
    for (int r = 0; r < ROW_TILES; ++r) {
        const int t = min((int)blockIdx.x * ROW_TILES + r, tiles - 1);
        wt[r] = w + (size_t)t * chunks * 32 + lane;
        st[r] = scales + (size_t)t * groups * 16;
        zt[r] = HAS_ZEROS ? zeros + (size_t)t * groups * 16 : nullptr;
    }
}

// v2's body: the first units' vectors and scales before PDL_WAIT (constants), then gemv2_main.
// NORM_X: x is h, normalized with norm_w and eps on the way (section NORM_X).
__device__ __forceinline__ void gemv2_body(const elem_t* __restrict__ x, const uint4* __restrict__ w, const float* __restrict__ scales,
                                           const float* __restrict__ zeros, const OutRows& out, int M, int N, int K, int group_size,
                                           int cdiv, unsigned int cmagic, const elem_t* __restrict__ norm_w = nullptr, float eps = 0.0f) {
    constexpr int RT = ROW_TILES;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int gid = lane >> 2;
    const int units = K / CHUNK / SEG;  // K is a multiple of CHUNK here
    const bool grouped = K / group_size > 1;
    const uint4* wt[RT];
    const float* st[RT];
    const float* zt[RT];
    tile_pointers(w, scales, zeros, N, K, group_size, wt, st, zt);
    __shared__ float red[MAX_WARPS * RT * 4 * 32];  // the warps' partial sums [warp][RT * 4][32]
    const unsigned int opaque = (unsigned int)(group_size >> 31);  // 0, unknown to the compiler
    uint4 buf[UNROLL][SEG][RT];
    GroupPair gbuf[UNROLL][RT];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int c = warp + u * warps;
        if (c < units) {
            const int g = grouped ? chunk_group2(c * SEG, cdiv, cmagic) : 0;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
#pragma unroll
                for (int s = 0; s < SEG; ++s) buf[u][s][r] = load_stream2(wt[r] + ((size_t)c * SEG + s) * 32);
                gbuf[u][r] = group_pair(st[r], zt[r], g, gid);
            }
        } else if (u == 0) {
#pragma unroll
            for (int r = 0; r < RT; ++r) gbuf[0][r] = group_pair(st[r], zt[r], 0, gid);  // per channel: the scales
        }
    }
    PDL_WAIT();
    PDL_LAUNCH();
    if (grouped)
        gemv2_main<true>(x, wt, st, zt, buf, gbuf, red, out, M, N, K, cdiv, cmagic, opaque, norm_w, eps);
    else
        gemv2_main<false>(x, wt, st, zt, buf, gbuf, red, out, M, N, K, cdiv, cmagic, opaque, norm_w, eps);
}

#if ASYNC > 0
#include "cp_async.cuh"  // cp_async16 / cp_async4 / cp_async_commit / cp_async_wait

// one unit in flight: its vectors [SEG][ROW_TILES][lane] and this lane's scales (and zero
// points) of its group, rows gid and gid + 8 [ROW_TILES][2][lane]
struct AsyncSlot {
    uint4 v[SEG][ROW_TILES][32];
    float s[ROW_TILES][2][32];
#if HAS_ZEROS
    float z[ROW_TILES][2][32];
#endif
};
static_assert(sizeof(AsyncSlot) == ASLOT, "ASLOT is not sizeof(AsyncSlot): the launch would size the rings wrong");
static_assert(sizeof(AsyncSlot) >= ROW_TILES * 4 * 32 * sizeof(float), "a slot holds a warp's partial sums at the end");

// unit c's copies into slot (g: its group, when grouped); one commit group per call
template <bool GROUPED>
__device__ __forceinline__ void unit_copy(AsyncSlot& slot, const uint4* const (&wt)[ROW_TILES], const float* const (&st)[ROW_TILES],
                                          const float* const (&zt)[ROW_TILES], int c, int g, int lane) {
    const int gid = lane >> 2;
#pragma unroll
    for (int r = 0; r < ROW_TILES; ++r) {
#pragma unroll
        for (int s = 0; s < SEG; ++s) cp_async16(smem_u32(&slot.v[s][r][lane]), wt[r] + ((size_t)c * SEG + s) * 32, 16);
        if (GROUPED) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                cp_async4(smem_u32(&slot.s[r][h][lane]), st[r] + g * 16 + gid + 8 * h);
#if HAS_ZEROS
                cp_async4(smem_u32(&slot.z[r][h][lane]), zt[r] + g * 16 + gid + 8 * h);
#endif
            }
        }
    }
    cp_async_commit();
}

// v2 with ASYNC: warps take units round robin as gemv2_main does; unit i of a warp is in slot
// i % ASYNC of its ring, refilled with unit i + ASYNC once computed. pc: the per-channel scales
// (not GROUPED). The ring's first ASYNC units were issued by gemv3_body before PDL_WAIT.
template <bool GROUPED>
__device__ __forceinline__ void gemv3_main(const elem_t* __restrict__ x, const uint4* const (&wt)[ROW_TILES], const float* const (&st)[ROW_TILES],
                                           const float* const (&zt)[ROW_TILES], AsyncSlot* ring, const GroupPair (&pc)[ROW_TILES],
                                           const OutRows& out, int M, int N, int K, int cdiv, unsigned int cmagic, unsigned int opaque) {
    constexpr int RT = ROW_TILES;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int units = K / (CHUNK * SEG);
    const Frag2 f = frag2_consts(opaque);
    const elem_t* xc = x_row2(x, M, K);
    const size_t xstep = (size_t)warps * (SEG * CHUNK);

    float acc[RT][4], d[RT][4], dx[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        dx[i] = 0.0f;
#pragma unroll
        for (int r = 0; r < RT; ++r) acc[r][i] = d[r][i] = 0.0f;
    }
    int slot = 0;
#if XPF
    UnitX xcur;
    if (warp < units) unit_x(xc, xcur);
#endif
    for (int c = warp; c < units; c += warps) {
        cp_async_wait<ASYNC - 1>();  // this lane's copies of unit c have landed
        AsyncSlot& sl = ring[slot];
        uint4 v[SEG][RT];
#pragma unroll
        for (int s = 0; s < SEG; ++s)
#pragma unroll
            for (int r = 0; r < RT; ++r) v[s][r] = sl.v[s][r][lane];
#if XPF
        UnitX xnext;
        if (c + warps < units) unit_x(xc + xstep, xnext);  // in flight while this unit computes
        unit2<GROUPED, true>(v, xc, d, dx, f, &xcur);
        xcur = xnext;
#else
        unit2<GROUPED>(v, xc, d, dx, f);
#endif
        if (GROUPED) {
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                GroupPair q;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    q.s[h] = sl.s[r][h][lane];
#if HAS_ZEROS
                    q.z[h] = sl.z[r][h][lane];
#endif
                }
                flush2(acc[r], d[r], dx, q);
            }
        }
        // the slot's values are in registers and used: refill it (an empty group past the end,
        // so that wait_group's count stays one group per unit)
        const int cn = c + ASYNC * warps;
        if (cn < units)
            unit_copy<GROUPED>(sl, wt, st, zt, cn, GROUPED ? chunk_group2(cn * SEG, cdiv, cmagic) : 0, lane);
        else
            cp_async_commit();
        slot = slot + 1 == ASYNC ? 0 : slot + 1;
        xc += xstep;
    }
    cp_async_wait<0>();  // nothing is left in flight (only empty groups) before the ring holds the sums
    if (!GROUPED) {
#pragma unroll
        for (int r = 0; r < RT; ++r) flush2(acc[r], d[r], dx, pc[r]);
    }
    // each warp's sums in its own ring (no other warp reads or writes it before the barrier);
    // they overwrite slot 0's vectors, which every lane read before the last mma.sync
    __syncwarp();
    gemv2_store(acc, reinterpret_cast<float*>(ring - (size_t)warp * ASYNC), out, M, N, (int)(ASYNC * sizeof(AsyncSlot) / sizeof(float)));
}

// v2 with ASYNC: the first ASYNC units of every warp are copied before PDL_WAIT (constants)
__device__ __forceinline__ void gemv3_body(const elem_t* __restrict__ x, const uint4* __restrict__ w, const float* __restrict__ scales,
                                           const float* __restrict__ zeros, const OutRows& out, int M, int N, int K, int group_size,
                                           int cdiv, unsigned int cmagic) {
    constexpr int RT = ROW_TILES;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int gid = lane >> 2;
    const int units = K / CHUNK / SEG;  // K is a multiple of CHUNK here
    const bool grouped = K / group_size > 1;
    const uint4* wt[RT];
    const float* st[RT];
    const float* zt[RT];
    tile_pointers(w, scales, zeros, N, K, group_size, wt, st, zt);
    extern __shared__ __align__(16) unsigned char wq_rings[];  // warps x ASYNC slots: the launch's dynamic shared memory
    AsyncSlot* ring = reinterpret_cast<AsyncSlot*>(wq_rings) + (size_t)warp * ASYNC;
    const unsigned int opaque = (unsigned int)(group_size >> 31);  // 0, unknown to the compiler
    GroupPair pc[RT];
#pragma unroll
    for (int i = 0; i < ASYNC; ++i) {
        const int c = warp + i * warps;
        if (c >= units)
            cp_async_commit();
        else if (grouped)
            unit_copy<true>(ring[i], wt, st, zt, c, chunk_group2(c * SEG, cdiv, cmagic), lane);
        else
            unit_copy<false>(ring[i], wt, st, zt, c, 0, lane);
    }
    if (!grouped) {
#pragma unroll
        for (int r = 0; r < RT; ++r) pc[r] = group_pair(st[r], zt[r], 0, gid);  // per channel: the scales
    }
    PDL_WAIT();
    PDL_LAUNCH();
    if (grouped)
        gemv3_main<true>(x, wt, st, zt, ring, pc, out, M, N, K, cdiv, cmagic, opaque);
    else
        gemv3_main<false>(x, wt, st, zt, ring, pc, out, M, N, K, cdiv, cmagic, opaque);
}
#endif  // ASYNC

// rope_*: the ROPE epilogue's arguments (OutRows; null / 0 without ROPE)
// an_*: the ADD_NORM tail's arguments (OutRows; null / 0 without ADD_NORM, which only v2 takes).
// With ADD_NORM at least two blocks per SM: without the bound ptxas spends up to 128 registers on
// the tail's loads in flight (124 for int4 against 50 without the tail), which halves the blocks
// a 512-thread launch keeps resident and with them the main loop's bytes in flight (measured: the
// o_proj GEMV + tail 15.9 us against 4.2 + 3.9 for GEMV and row kernel; session 23)
// (only there: an explicit minimum of 1 makes ptxas take 95 registers for the plain int4 kernel
// instead of 50, the same halving)
// The symmetric int4 v2 kernel likewise: on an H100 the bound made its GEMVs 2-6% faster (the
// Llama-3-8B shapes at M = 1, bench/bench_norm_fold.py, bench/results/h100-2026-12-05-session28);
// NORM_X's symmetric kernels too (as measured there). With zero points (and plain int8) the
// bound would make ptxas spill 8-24 bytes.
#if ADD_NORM || (WQ_DECODE == 2 && !HAS_ZEROS && (BITS == 4 || NORM_X))
#define WQ_GEMV_BOUNDS __launch_bounds__(MAX_WARPS * 32, 2)
#else
#define WQ_GEMV_BOUNDS __launch_bounds__(MAX_WARPS * 32)
#endif
extern "C" __global__ void WQ_GEMV_BOUNDS
trtcore_wq_gemv(const elem_t* __restrict__ x, const uint4* __restrict__ w, const float* __restrict__ scales,
                const float* __restrict__ zeros, const int* __restrict__ perm, elem_t* __restrict__ out, int M, int N, int K,
                int group_size, int cdiv, unsigned int cmagic, const int* __restrict__ rope_pos, const float* __restrict__ rope_freq,
                int rope_rows, float rope_scale, const elem_t* an_residual, const elem_t* an_weight, elem_t* an_normed,
                unsigned int* an_counter, float an_eps) {
#if ADD_NORM && WQ_DECODE != 2
#error "ADD_NORM is the v2 decode kernel's (WQ_DECODE 2)"
#endif
#if WQ_DECODE == 2 && ASYNC > 0
    gemv3_body(x, w, scales, zeros,
               add_norm_rows(out_rows(out, rope_pos, rope_freq, rope_rows, rope_scale, 0, N), an_residual, an_weight, an_normed, an_counter, an_eps),
               M, N, K, group_size, cdiv, cmagic);
#elif WQ_DECODE == 2 && NORM_X
    // an_residual: the add_residual epilogue's; an_weight, an_eps: the input norm's
    gemv2_body(x, w, scales, zeros, out_rows(out, rope_pos, rope_freq, rope_rows, rope_scale, 0, N, an_residual), M, N, K, group_size, cdiv,
               cmagic, an_weight, an_eps);
#elif WQ_DECODE == 2
    // v2: the plugin launches it only without perm and with whole-chunk groups (fast_decode)
    gemv2_body(x, w, scales, zeros,
               add_norm_rows(out_rows(out, rope_pos, rope_freq, rope_rows, rope_scale, 0, N), an_residual, an_weight, an_normed, an_counter, an_eps),
               M, N, K, group_size, cdiv, cmagic);
#else
    gemv_body<1>(x, w, scales, zeros, perm, out_rows(out, rope_pos, rope_freq, rope_rows, rope_scale, 0, N, an_residual), M, N, K, group_size,
                 cdiv, cmagic);
#endif
}

// grid (tiles, ceil(M / 16)): block (t, y) computes rows 16 y .. 16 y + 15 of x against tile t,
// so any M runs on the tensor cores in one launch (prefill); the slices of a tile re-read its
// codes, mostly from L2 (a 4-bit Llama-3-8B decoder linear is at most 29 MB)
extern "C" __global__ void __launch_bounds__(MAX_WARPS * 32)
trtcore_wq_gemv16(const elem_t* __restrict__ x, const uint4* __restrict__ w, const float* __restrict__ scales,
                  const float* __restrict__ zeros, const int* __restrict__ perm, elem_t* __restrict__ out, int M, int N, int K,
                  int group_size, int cdiv, unsigned int cmagic, const int* __restrict__ rope_pos, const float* __restrict__ rope_freq,
                  int rope_rows, float rope_scale, const elem_t* an_residual, const elem_t* an_weight, elem_t* an_normed,
                  unsigned int* an_counter, float an_eps) {  // an_*: trtcore_wq_gemv's (only an_residual: ADD_NORM is v2's)
    // one statement, a body call (tests/test_kernels.py: nothing but the body before its PDL_WAIT);
    // with GATED the output's rows are N / 2 long (the SwiGLU output)
    gemv_body<2>(x + (size_t)blockIdx.y * 16 * K, w, scales, zeros, perm,
                 out_rows(out, rope_pos, rope_freq, rope_rows, rope_scale, (int)blockIdx.y * 16, GATED ? N / 2 : N, an_residual),
                 min(16, M - (int)blockIdx.y * 16), N, K, group_size, cdiv, cmagic);
}
#endif  // DTYPE 1 or 2

// ---- prefill (and float32 activations): float32 tiles -----------------------------------------

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
    const int chunks = (K + CHUNK - 1) / CHUNK;
    const int groups = K / group_size;
    const int r = tid >> 2;          // the tile row this thread loads (x row m0 + r, weight row n0 + r)
    const int kk = (tid & 3) * 8;    // its 8 columns within the chunk

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
            float s, z;
            group_scale_zero(scales, zeros, scale_index(n, k / group_size, groups), s, z);
            const float b = -z * s;
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = fmaf((float)code_at(w, chunks, n / 16, n % 16, k + e), s, b);
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

// ---- prefill on cuBLAS: the weight dequantized in blocks of rows --------------------------------
// The plugin's default from CUBLAS_MIN_M rows of float16 / bfloat16 x: trtcore_wq_dequantize writes a
// block of rows of W in x's dtype into the workspace, cuBLASLt multiplies x by it on the tensor
// cores (trtcore.cuda.cublaslt.LinearMatmul), block after block; with HAS_PERM
// trtcore_wq_gather_x first permutes x's columns into the stored order, so the GEMM runs on the
// stored columns as the kernels above do.

#if DTYPE == 1 || DTYPE == 2
// eight float32 values rounded to elem_t, as one 16-byte store (dst 16-byte aligned)
__device__ __forceinline__ void store8(elem_t* __restrict__ dst, const float* v) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
}

// w16[r, k] = (q[n0 + r, k] - z) * s rounded once to elem_t, r < rows (n0 a multiple of 16, so
// the block is whole tiles), k < K the weight's column (the stored column with HAS_PERM). One
// thread per 16-byte vector of the layout (tile, chunk, lane; a warp one tile's chunk, 512
// contiguous bytes): its codes are rows r0 = gid and r0 + 8 of the tile at the columns of lane
// tid's B-fragment pairs (XOFF_*: one run of CHUNK / 4 columns with CONTIG_X, written as 16-byte
// stores; else pairs c, c + 1 and c + 8, c + 9 of each k-step, 4-byte stores).
extern "C" __global__ void __launch_bounds__(256)
trtcore_wq_dequantize(const uint4* __restrict__ w, const float* __restrict__ scales, const float* __restrict__ zeros,
                      elem_t* __restrict__ out, int n0, int rows, int K, int group_size) {
    PDL_WAIT();  // the GEMM before it still reads the previous block of this buffer
    PDL_LAUNCH();
    const int chunks = (K + CHUNK - 1) / CHUNK, groups = K / group_size;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int vec = (int)(i >> 5);  // the warp's (tile, chunk); 32-bit division below
    const int lane = (int)(i & 31), chunk = vec % chunks, tile = n0 / 16 + vec / chunks;
    if (tile * 16 >= n0 + rows) return;
    const int gid = lane >> 2, tid = lane & 3;
    const uint4 v = __ldg(w + ((size_t)tile * chunks + chunk) * 32 + lane);
    const unsigned int word[4] = {v.x, v.y, v.z, v.w};
    const int base = chunk * CHUNK + XOFF_LANE(tid);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int n = tile * 16 + gid + 8 * h;
        if (n >= n0 + rows) continue;
        float val[CHUNK / 4];  // the lane's columns in XOFF order: pair (j, hi) at 4 j + 2 hi
#pragma unroll
        for (int j = 0; j < CHUNK_STEPS; ++j) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int col = base + (hi ? XOFF_B1(j) : XOFF_B0(j));  // a pair, inside one group of 8+
                float s, z;
                group_scale_zero(scales, zeros, scale_index(n, min(col, K - 1) / group_size, groups), s, z);
#pragma unroll
                for (int e = 0; e < 2; ++e) {
#if BITS == 4
                    const unsigned int q = (word[j] >> (4 * ((h + 2 * hi) + 4 * e))) & CODE_MASK;
#else
                    const unsigned int q = (word[2 * j + hi] >> (8 * (2 * h + e))) & CODE_MASK;
#endif
                    val[4 * j + 2 * hi + e] = ((float)q - z) * s;
                }
            }
        }
        elem_t* row = out + (size_t)(n - n0) * K;
#if CONTIG_X  // K is whole chunks here: the run is inside the row
#pragma unroll
        for (int c = 0; c < CHUNK / 4; c += 8) store8(row + base + c, val + c);
#else
#pragma unroll
        for (int j = 0; j < CHUNK_STEPS; ++j)
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int col = base + (hi ? XOFF_B1(j) : XOFF_B0(j));
                if (col < K)  // K is a multiple of 8: a pair is inside K or past it
                    *reinterpret_cast<unsigned int*>(row + col) = pack2(val[4 * j + 2 * hi], val[4 * j + 2 * hi + 1]);
            }
#endif
    }
}

// xg[m, k] = x[m, perm[k]] (act order: x in the stored column order), one thread per 8 columns
extern "C" __global__ void __launch_bounds__(256)
trtcore_wq_gather_x(const elem_t* __restrict__ x, const int* __restrict__ perm, elem_t* __restrict__ out, int M, int K) {
    PDL_WAIT();
    PDL_LAUNCH();
    const int per_row = K / 8;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)M * per_row) return;
    const int m = (int)(i / per_row), k = (int)(i % per_row) * 8;
    float v[8];
    load_x8(x + (size_t)m * K, perm, k, v);  // exact: the values are elem_t
    store8(out + (size_t)m * K + k, v);
}
#endif  // DTYPE 1 or 2

// ---- the gated output of the staged paths (tiled, cuBLAS) -----------------------------------------
// out[m, j] = silu(gate) * up from y [M, 2 I] in W's gated row order (GATED above: gate feature j
// at column 16 (j / 8) + j % 8, its up 8 columns on), out [M, I]; one thread per output
extern "C" __global__ void __launch_bounds__(256)
trtcore_wq_swiglu(const elem_t* __restrict__ y, elem_t* __restrict__ out, int M, int I) {
    PDL_WAIT();  // y is the GEMM's output, just written
    PDL_LAUNCH();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)M * I) return;
    const int m = (int)(i / I), j = (int)(i % I);
    const elem_t* pair = y + (size_t)m * 2 * I + (j / 8) * 16 + j % 8;
    out[i] = from_f32(swiglu_of(to_f32(pair[0]), to_f32(pair[8])));
}

// ---- the add + norm of the other paths (v1, 16-row, tiled, cuBLAS) --------------------------------
// one block per row m: h [M, N] (the GEMM's y) becomes y + residual in place, normed its RMSNorm
// (add_norm_row)
extern "C" __global__ void __launch_bounds__(1024)
trtcore_wq_add_norm(elem_t* h, const elem_t* __restrict__ residual, const elem_t* __restrict__ w, elem_t* normed, int N, float eps) {
    PDL_WAIT();  // h holds the GEMM's output, just written
    PDL_LAUNCH();
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * N;
    add_norm_row(h + row, residual + row, w, normed + row, N, eps, red);
}

// one block per row m: normed [M, N] = RMSNorm(h) * w (the norm_input plugin's x where the GEMM
// runs without NORM_X: add_norm_row without a residual)
extern "C" __global__ void __launch_bounds__(1024)
trtcore_wq_rms_norm(const elem_t* h, const elem_t* __restrict__ w, elem_t* normed, int N, float eps) {
    PDL_WAIT();  // h: the previous kernel's output
    PDL_LAUNCH();
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * N;
    add_norm_row(const_cast<elem_t*>(h) + row, nullptr, w, normed + row, N, eps, red);  // h is only read
}

// dst [total] = src: a folded-norm plugin's x (or norm weight) copied to 16-byte alignment (NORM_X's loads)
extern "C" __global__ void __launch_bounds__(256) trtcore_wq_copy(const elem_t* __restrict__ src, elem_t* __restrict__ dst, long long total) {
    PDL_WAIT();  // src: the previous kernel's output
    PDL_LAUNCH();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) dst[i] = src[i];
}

// y [total] = round(y + residual): the add_residual plugin's add where the GEMM has no epilogue
// for it (tiled, cuBLAS)
extern "C" __global__ void __launch_bounds__(256) trtcore_wq_add_residual(elem_t* y, const elem_t* __restrict__ residual, long long total) {
    PDL_WAIT();  // y: the GEMM's output, just written
    PDL_LAUNCH();
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
        y[i] = from_f32(to_f32(y[i]) + to_f32(residual[i]));
}

#if ROPE
// ---- the rotated output of the staged paths (tiled, cuBLAS) ---------------------------------------
// out [M, N] in the natural row order from y [M, N] in W's stored order (ROPE above: rows below
// rope_rows rotated by their x row's position, the rest copied); one thread per stored row pair
// (rows 16 t + r and 16 t + r + 8, r < 8) of a token
extern "C" __global__ void __launch_bounds__(256)
trtcore_wq_rope(const elem_t* __restrict__ y, elem_t* __restrict__ out, const int* __restrict__ pos, const float* __restrict__ freq,
                int M, int N, int rope_rows, float rope_scale) {
    PDL_WAIT();  // y is the GEMM's output, just written
    PDL_LAUNCH();
    const int pairs = (N + 15) / 16 * 8;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)M * pairs) return;
    const int m = (int)(i / pairs), p = (int)(i % pairs), tile = p / 8, r = p % 8;
    const elem_t* row = y + (size_t)m * N;
    const int n = tile * 16 + r;
    const float lo = n < N ? to_f32(row[n]) : 0.0f, hi = n + 8 < N ? to_f32(row[n + 8]) : 0.0f;
    store_rows(OutRows{out, pos, freq, rope_rows, rope_scale}, tile, r, m, M, N, lo, hi);
}
#endif
