// Bulk copies from global to shared memory by the TMA unit (compute capability 9.0+; PTX ISA 8.0,
// "cp.async.bulk" and "mbarrier"): one thread issues a copy of any multiple of 16 bytes, which
// completes on an mbarrier by its transaction count; threads wait on the barrier's phase.
#pragma once

// the shared-memory address of a generic pointer into shared memory
__device__ __forceinline__ unsigned bulk_smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// an mbarrier of `count` arrivals per phase; fence_barrier_init() makes the inits visible to the
// async proxy (then a __syncthreads to the other threads)
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// this thread's arrival, expecting `bytes` more of transactions in the phase
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); }

// until the phase of parity `parity` has completed
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from src to dst, completing on bar
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
