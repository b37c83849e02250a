// The weight-only GEMM's K order (kernels/wq_gemm.cu, "CONTIG_X"): where lane tid's x columns
// of a chunk lie, and a weight column's stored column. __host__ __device__, so that the tests
// build these helpers for the host and check them against
// trtcore.plugins.weight_only_gemm.contiguous_x_order (tests/test_weight_only_gemm.py).
// Needs CHUNK (codes per chunk) and CONTIG_X (0 | 1) defined.
#pragma once

// lane tid's B-fragment columns of k-step j within a chunk (x element offsets): the start of the
// lane's columns, then b0's pair and b1's pair of k-step j (CONTIG_X: one contiguous run per lane)
#if CONTIG_X
#define XOFF_LANE(tid) ((tid) * (CHUNK / 4))
#define XOFF_B0(j) (4 * (j))
#define XOFF_B1(j) (4 * (j) + 2)
#else
#define XOFF_LANE(tid) (2 * (tid))
#define XOFF_B0(j) (16 * (j))
#define XOFF_B1(j) (16 * (j) + 8)
#endif

// the weight columns of lane tid's b0 and b1 pairs (their first elements) in the k-step that
// starts at stored column k0 (a multiple of 16)
__host__ __device__ __forceinline__ void b_columns(int k0, int tid, int& ka, int& kb) {
    const int cb = k0 - k0 % CHUNK, j = (k0 % CHUNK) / 16;
    ka = cb + XOFF_LANE(tid) + XOFF_B0(j);
    kb = cb + XOFF_LANE(tid) + XOFF_B1(j);
}

// the stored column (the layout's column order) of weight column k
__host__ __device__ __forceinline__ int stored_col(int k) {
#if CONTIG_X
    const int c = k % CHUNK, t = c / (CHUNK / 4), rem = c % (CHUNK / 4), q = rem % 4;
    return k - c + 16 * (rem / 4) + 2 * t + (q & 1) + 8 * (q >> 1);
#else
    return k;
#endif
}
