// Programmatic dependent launch (compute capability 9.0+; CUDA Programming Guide, "Programmatic
// Dependent Launch and Synchronization"). A kernel launched with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may start before the previous kernel on its
// stream has finished: PDL_WAIT() blocks until that kernel has completed and its writes are
// visible, so a kernel runs it before it reads or writes any tensor (only constant weights may be
// read before it); PDL_LAUNCH() lets the next kernel start launching. Without the attribute, or
// below 9.0, both are no-ops, so every launch may use them.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT()
#define PDL_LAUNCH()
#endif
