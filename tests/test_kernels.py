"""trtcore.kernels: NVRTC compilation, the CUBIN cache, variants, setup_cuda.py, and (marker
``gpu``) loading and launching kernels through cuda.bindings.

The CPU tests need cuda-python, nvidia-cuda-nvrtc and nvidia-cuda-runtime (headers) but no GPU:
NVRTC builds CUBINs for sm_80, sm_89 and sm_90 anywhere. Their test kernels are written into
temporary folders; every kernel in trtcore's kernels/ is compiled by
``test_every_kernel_variant_compiles``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from trtcore import kernels
from trtcore.errors import InvalidArgumentError, TrtcoreError
from trtcore.kernels import nvrtc as knvrtc

ARCHS = ["sm_80", "sm_89", "sm_90"]
REPO = Path(__file__).resolve().parents[1]

# --- test kernels ---------------------------------------------------------------------------

SAXPY_CU = """\
// A tiny test kernel: saxpy on ELEM_T (a define; not "T": a macro T would clash with
// template parameters in CUDA's headers), a local header chain x.cuh -> y.cuh, CUDA's
// fp16/bf16 headers, and a dynamic-shared-memory kernel.
// trtcore-variants: [{"ELEM_T": "float"},
// trtcore-variants:  {"ELEM_T": "__half"}]
// trtcore-variants: [{"ELEM_T": "__nv_bfloat16"}]
#include "x.cuh"
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef ELEM_T
#error "define ELEM_T (float, __half or __nv_bfloat16)"
#endif

extern "C" __global__ void saxpy(ELEM_T* __restrict__ y, const ELEM_T* __restrict__ x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = from_f32<ELEM_T>(a * to_f32(x[i]) + to_f32(y[i]));
}

// reverse n floats (n <= dynamic shared floats) in one block, through shared memory
extern "C" __global__ void reverse_smem(float* data, int n) {
    extern __shared__ float buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = data[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) data[i] = twice(buf[n - 1 - i]) * 0.5f;
}
"""

X_CUH = """\
#pragma once
#include "y.cuh"
template <typename U> __device__ U from_f32(float v);
template <> __device__ float from_f32<float>(float v) { return v; }
template <> __device__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
"""

Y_CUH = """\
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
__device__ inline float to_f32(float v) { return v; }
__device__ inline float to_f32(__half v) { return __half2float(v); }
__device__ inline float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
// no __device__: compiled as device code because of -default-device
constexpr float kTwo = 2.0f;
inline float twice(float v) { return v * kTwo; }
"""


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets an empty kernel cache of its own ($TRTCORE_CACHE)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TRTCORE_CACHE", str(root))
    return root / "kernels"


@pytest.fixture
def kdir(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "saxpy.cu").write_text(SAXPY_CU)
    (d / "x.cuh").write_text(X_CUH)
    (d / "y.cuh").write_text(Y_CUH)
    return d


def _elf(cubin: bytes) -> dict[str, int]:
    assert cubin[:4] == b"\x7fELF" and cubin[4] == 2, "not a 64-bit ELF"
    (machine,) = struct.unpack_from("<H", cubin, 18)
    (flags,) = struct.unpack_from("<I", cubin, 0x30)
    return {"osabi": cubin[7], "machine": machine, "flags": flags}


def _cache_files(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def _nvcc() -> str | None:
    for cand in (shutil.which("nvcc"), "/usr/local/cuda-13.0/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


# --- arch strings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("sm_80", "sm_80"),
        ("sm89", "sm_89"),
        ("90", "sm_90"),
        ("9.0", "sm_90"),
        ("SM_90", "sm_90"),
        (" 8.9 ", "sm_89"),
        (90, "sm_90"),
        ((8, 0), "sm_80"),
        ("sm_90a", "sm_90a"),
    ],
)
def test_normalize_arch(given, want) -> None:
    assert kernels.normalize_arch(given) == want


@pytest.mark.parametrize("bad", ["", "sm_", "foo", "9", "sm_9x", "compute_90", "9.0.1", "sm-90", None, 9.0, True])
def test_bad_arch_string(bad, kdir: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="bad CUDA arch"):
        kernels.normalize_arch(bad)
    if isinstance(bad, str) and bad:
        with pytest.raises(InvalidArgumentError, match="bad CUDA arch"):
            kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"}, arch=bad)


def test_unsupported_arch_lists_supported() -> None:
    with pytest.raises(InvalidArgumentError, match=r"cannot build CUBINs for sm_35.*sm_80.*sm_90"):
        kernels.normalize_arch("sm_35")
    assert {"sm_80", "sm_89", "sm_90"} <= set(kernels.supported_archs())


def test_import_is_light() -> None:
    code = "import sys, trtcore.kernels as k; k.KERNEL_DIR; print(sorted(m for m in sys.modules if m.startswith(('cuda', 'numpy'))))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


# --- compile + cache ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_compile_for_arch_and_cache_hit(arch: str, kdir: Path, cache: Path) -> None:
    ck = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"}, arch=arch)
    assert not ck.from_cache and ck.name == "saxpy" and ck.arch == arch and ck.defines == {"ELEM_T": "float"}
    assert len(ck.key) == 64 and ck.source == (kdir / "saxpy.cu").resolve()
    elf = _elf(ck.cubin)
    assert elf["machine"] == 190  # EM_CUDA
    assert kernels.cubin_arch(ck.cubin) == arch
    assert ck.symbols == ["reverse_smem", "saxpy"]
    assert "--std=c++17" in ck.options and f"--gpu-architecture={arch}" in ck.options and "-DELEM_T=float" in ck.options
    assert _cache_files(cache) == [f"saxpy.{arch}.{ck.key}.cubin"]

    again = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"}, arch=arch.replace("sm_", ""))
    assert again.from_cache and again.key == ck.key and again.cubin == ck.cubin and again.log == ""
    assert _cache_files(cache) == [f"saxpy.{arch}.{ck.key}.cubin"]


#: a kernel with many values live at once (an unrolled array of loads), its minimum blocks per SM
#: a define: ptxas must fit BLOCKS blocks of 256 threads in an SM's 65,536 registers
_REGS_CU = r"""
extern "C" __global__ void __launch_bounds__(256, BLOCKS) many_live(const float4* __restrict__ x, float* out) {
    float4 v[24];
#pragma unroll
    for (int i = 0; i < 24; ++i) v[i] = x[threadIdx.x + i * 256];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 24; ++i) s += v[i].x * v[i].y + v[i].z * v[i].w;
    out[threadIdx.x] = s;
}
"""


def test_cubin_register_counts_follow_the_launch_bounds(tmp_path: Path, cache: Path) -> None:
    """cubin_register_counts reads what ptxas allotted: with ``__launch_bounds__(256, 4)`` at most
    65536 / (4 * 256) = 64 registers (the CUDA C++ Programming Guide's contract for the minimum
    blocks per SM), with 8 at most 32, and without that bound the 24 float4 values in flight take
    more than 64; every kernel entry point of the CUBIN has a count."""
    (tmp_path / "regs.cu").write_text(_REGS_CU)
    counts = {
        b: kernels.cubin_register_counts(kernels.compile_kernel(tmp_path / "regs.cu", defines={"BLOCKS": b}, arch="sm_90").cubin) for b in (1, 4, 8)
    }
    assert all(set(c) == {"many_live"} for c in counts.values()), counts
    assert counts[1]["many_live"] > 64 >= counts[4]["many_live"] and 32 >= counts[8]["many_live"] > 0, counts


def test_decode_kernels_keep_two_512_thread_blocks_per_sm() -> None:
    """The precompiled weight-only decode kernels (``trtcore_wq_gemv``, launched with up to 512
    threads a block) that o_proj / down_proj of a symmetric 4- or 8-bit checkpoint run, with and
    without the add + norm tail (``ADD_NORM``), take at most 64 registers per thread: two such
    blocks per SM (65,536 registers). The faults this guards against: the tail took 124 registers
    (one block per SM; the o_proj / down_proj GEMVs ran about twice as long on the H200,
    bench/results/h200-2026-12-05-session23), and an explicit ``__launch_bounds__(512, 1)`` took
    the plain int4 kernel from 50 to 95."""
    over = {}
    for v in kernels.variants("wq_gemm"):
        if v.get("WQ_DECODE") != 2 or v.get("HAS_ZEROS") or v.get("GATED"):
            continue
        regs = kernels.cubin_register_counts(kernels.compile_kernel("wq_gemm", defines=v, arch="sm_90").cubin)["trtcore_wq_gemv"]
        if regs > 64:
            over[tuple(sorted(v.items()))] = regs
    assert not over, over


def test_cubin_arch_matches_nvcc(tmp_path: Path) -> None:
    """Our reading of e_flags agrees with nvcc's own CUBINs (skipped without nvcc)."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed; the ELF e_flags reading is not cross-checked")
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n')
    for arch in ARCHS:
        out = tmp_path / f"k_{arch}.cubin"
        subprocess.run([nvcc, "-cubin", f"-arch={arch}", str(src), "-o", str(out)], check=True, capture_output=True)
        data = out.read_bytes()
        assert kernels.cubin_arch(data) == arch
        assert kernels.cubin_kernel_names(data) == ["k"]
        ours = kernels.compile_kernel(src, arch=arch).cubin
        assert _elf(ours)["flags"] == _elf(data)["flags"]


def test_cache_misses_on_every_input(kdir: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = kdir / "saxpy.cu"
    base = kernels.compile_kernel(src, defines={"ELEM_T": "float", "UNUSED": 1}, arch="sm_90")
    # define order does not matter; an identical request hits
    same = kernels.compile_kernel(src, defines={"UNUSED": 1, "ELEM_T": "float"}, arch="sm_90")
    assert same.from_cache and same.key == base.key

    keys = {base.key}

    def miss(**kw) -> None:
        args = {"defines": {"ELEM_T": "float", "UNUSED": 1}, "arch": "sm_90", **kw}
        ck = kernels.compile_kernel(src, **args)
        assert not ck.from_cache, kw
        assert ck.key not in keys, kw
        keys.add(ck.key)
        assert kernels.compile_kernel(src, **args).from_cache, kw  # and now it is cached

    miss(defines={"ELEM_T": "float", "UNUSED": 2})  # a define's value
    miss(defines={"ELEM_T": "float", "UNUSED": 1, "EXTRA": True})  # one define more
    miss(arch="sm_89")  # the arch
    miss(options=["-lineinfo"])  # an option
    (kdir / "x.cuh").write_text(X_CUH + "// changed\n")  # an included header
    miss()
    (kdir / "y.cuh").write_text(Y_CUH + "// changed\n")  # a header included by a header
    miss()
    src.write_text(SAXPY_CU + "\n")  # the source
    miss()
    monkeypatch.setattr(knvrtc, "nvrtc_version", lambda: (99, 0))  # another NVRTC
    miss()
    assert len(_cache_files(cache)) == len(keys)


def test_cache_survives_moving_the_sources(kdir: Path, tmp_path: Path) -> None:
    a = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "__half"}, arch="sm_80")
    moved = shutil.copytree(kdir, tmp_path / "elsewhere")
    b = kernels.compile_kernel(moved / "saxpy.cu", defines={"ELEM_T": "__half"}, arch="sm_80")
    assert b.from_cache and b.key == a.key
    assert f"-I{moved.resolve()}" in b.options


def test_corrupt_cache_file_is_rebuilt(kdir: Path, cache: Path) -> None:
    ck = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"}, arch="sm_90")
    path = cache / f"saxpy.sm_90.{ck.key}.cubin"
    path.write_bytes(ck.cubin[: len(ck.cubin) // 2])  # truncated
    again = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"}, arch="sm_90")
    assert not again.from_cache and again.cubin == ck.cubin and path.read_bytes() == ck.cubin


def test_unwritable_cache_warns_and_compiles(kdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("TRTCORE_CACHE", str(blocker))
    with pytest.warns(RuntimeWarning, match="cannot write the kernel cache"):
        ck = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"}, arch="sm_90")
    assert not ck.from_cache and kernels.cubin_arch(ck.cubin) == "sm_90"


_WORKER = """\
import json, sys, time
from pathlib import Path
from trtcore import kernels
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.002)
ck = kernels.compile_kernel(sys.argv[1], defines={"ELEM_T": "__nv_bfloat16"}, arch="sm_90")
print(json.dumps({"key": ck.key, "from_cache": ck.from_cache}))
"""


def test_concurrent_processes_share_one_cache_file(kdir: Path, cache: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    env = {**os.environ, "TRTCORE_CACHE": str(cache.parent)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(kdir / "saxpy.cu"), str(go)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    go.write_text("go")  # all four start compiling at once
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    print("compiled by", sum(not r["from_cache"] for r in results), "of 4 processes")
    assert len({r["key"] for r in results}) == 1
    key = results[0]["key"]
    assert _cache_files(cache) == [f"saxpy.sm_90.{key}.cubin"]  # one file, no temp leftovers
    data = (cache / f"saxpy.sm_90.{key}.cubin").read_bytes()
    assert kernels.cubin_arch(data) == "sm_90" and kernels.cubin_kernel_names(data) == ["reverse_smem", "saxpy"]
    hit = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "__nv_bfloat16"}, arch="sm_90")
    assert hit.from_cache and hit.cubin == data


# --- errors ---------------------------------------------------------------------------------


def test_syntax_error_raises_nvrtc_error_with_log(tmp_path: Path, cache: Path) -> None:
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float* x) {\n    x[0] = 1.0f\n    int y = ;\n}\n')
    with pytest.raises(kernels.NVRTCError) as info:
        kernels.compile_kernel(bad, defines={"HEAD_DIM": 64}, arch="9.0")
    err = info.value
    assert isinstance(err, TrtcoreError)
    msg = str(err)
    assert "bad.cu(3): error" in err.log and "bad.cu(3): error" in msg
    assert "sm_90" in msg and "HEAD_DIM" in msg and "NVRTC_ERROR_COMPILATION" in msg
    assert err.arch == "sm_90" and err.defines == {"HEAD_DIM": 64} and err.result == "NVRTC_ERROR_COMPILATION"
    assert "error" in err.first_error()
    assert _cache_files(cache) == []


def test_defines_are_formatted(tmp_path: Path) -> None:
    src = tmp_path / "defs.cu"
    src.write_text(
        textwrap.dedent("""\
        #include <cuda_fp16.h>
        static_assert(FLAG == 1, "bool True -> 1");
        static_assert(OFF == 0, "bool False -> 0");
        static_assert(NEG == -3, "int");
        static_assert(SCALE == 0.5, "float");
        typedef TYPE my_t;
        static_assert(sizeof(my_t) == 2, "str verbatim");
        extern "C" __global__ void k(my_t* x) {}
        """)
    )
    ck = kernels.compile_kernel(src, defines={"FLAG": True, "OFF": False, "NEG": -3, "SCALE": 0.5, "TYPE": "__half"}, arch="sm_89")
    assert {"-DFLAG=1", "-DOFF=0", "-DNEG=-3", "-DSCALE=0.5", "-DTYPE=__half"} <= set(ck.options)
    with pytest.raises(kernels.NVRTCError, match="bool True -> 1"):
        kernels.compile_kernel(src, defines={"FLAG": False, "OFF": False, "NEG": -3, "SCALE": 0.5, "TYPE": "__half"}, arch="sm_89")


@pytest.mark.parametrize("defines", [{"1BAD": 1}, {"A B": 1}, {"X": float("nan")}, {"X": [1]}, {"X": "a\nb"}])
def test_bad_defines(defines, kdir: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        kernels.compile_kernel(kdir / "saxpy.cu", defines=defines, arch="sm_90")


def test_unknown_kernel() -> None:
    with pytest.raises(InvalidArgumentError, match="no kernel 'no_such_kernel'"):
        kernels.compile_kernel("no_such_kernel", arch="sm_90")
    with pytest.raises(InvalidArgumentError, match="bad kernel name"):
        kernels.compile_kernel("sub/dir", arch="sm_90")
    with pytest.raises(InvalidArgumentError, match="not an existing .cu file"):
        kernels.compile_kernel("/nonexistent/k.cu", arch="sm_90")


def test_missing_cuda_headers(kdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(knvrtc, "_include_candidates", lambda: [tmp_path / "nothing"])
    knvrtc._find_cuda_include.cache_clear()
    try:
        with pytest.raises(kernels.CUDAToolchainError, match="CUDA headers not found"):
            kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"}, arch="sm_90")
    finally:
        knvrtc._find_cuda_include.cache_clear()


def test_arch_none_without_gpu_says_so(kdir: Path) -> None:
    if kernels.gpu_count() > 0:
        pytest.skip("a GPU is present: arch=None compiles for it (tested in test_gpu_launch_saxpy)")
    with pytest.raises(kernels.NoGPUError, match="arch='sm_90'"):
        kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"})


def test_function_unknown_symbol_needs_no_gpu(kdir: Path) -> None:
    ck = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"}, arch="sm_90")
    with pytest.raises(InvalidArgumentError, match="no kernel 'saxpyy'.*reverse_smem, saxpy"):
        ck.function("saxpyy")


# --- launch argument packing (CPU) ------------------------------------------------------------


def test_argument_packing() -> None:
    from trtcore.kernels.launch import _pack

    class Arr:
        __cuda_array_interface__ = {"data": (0x1000, False), "shape": (4,), "typestr": "<f4", "version": 3}

    class Dev:
        ptr = 0x2000

    assert _pack((0xDEAD, "ptr"), 0).value == 0xDEAD
    assert _pack((None, "ptr"), 0).value is None  # NULL
    assert _pack((Arr(), "ptr"), 0).value == 0x1000
    assert _pack((Dev(), "ptr"), 0).value == 0x2000
    assert isinstance(_pack((7, "i32"), 0), ctypes.c_int32) and _pack((np.int64(7), "i64"), 0).value == 7
    assert isinstance(_pack((1.5, "float"), 0), ctypes.c_float)
    assert _pack((1.0, "f16"), 0).value == 0x3C00 and _pack((1.0, "bf16"), 0).value == 0x3F80
    assert _pack((1.00390625, "bf16"), 0).value == 0x3F80  # tie rounds to even
    assert _pack((-2.0, "bf16"), 0).value == 0xC000
    c = ctypes.c_uint64(5)
    assert _pack(c, 0) is c
    for bad in [(2**31, "i32"), (-1, "u32"), (1.5, "i32"), ("x", "f32"), (1e6, "f16"), (1, "int128"), 7, (object(), "ptr")]:
        with pytest.raises(InvalidArgumentError):
            _pack(bad, 0)


def test_programmatic_launch_config_carries_the_pdl_attribute() -> None:
    """The ``CUlaunchConfig`` of a programmatic dependent launch (built without a GPU): the
    launch's dimensions, shared memory and stream, and exactly one attribute,
    ``PROGRAMMATIC_STREAM_SERIALIZATION`` = 1 (CUDA driver API, ``cuLaunchKernelEx``)."""
    pytest.importorskip("cuda.bindings")
    from cuda.bindings import driver as drv

    from trtcore.kernels.launch import programmatic_config

    cfg = programmatic_config((7, 2, 1), (64, 1, 1), 4096, drv.CUstream(0))
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == (7, 2, 1, 64, 1, 1)
    assert cfg.sharedMemBytes == 4096 and cfg.numAttrs == 1
    (attr,) = cfg.attrs
    assert attr.id == drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1


#: kernels that read constant weights before ``PDL_WAIT()`` (pdl.cuh allows it): the device
#: function their body calls (one of them, chosen by the preprocessor), which must wait before it
#: touches any other argument
EARLY_CONSTANT_READS = {
    ("wq_gemm.cu", "trtcore_wq_gemv"): ("gemv_body", "gemv2_body", "gemv3_body"),
    ("wq_gemm.cu", "trtcore_wq_gemv16"): ("gemv_body",),
}

#: kernels that read host-written inputs (pinned memory the host filled before the launch)
#: before ``PDL_WAIT()``: the only kernel arguments their statements before it may name
EARLY_HOST_READS = {
    ("sampling.cu", "sampling_step"): ("params",),
}


def test_every_plugin_kernel_waits_for_its_predecessor_first() -> None:
    """The plugins launch their kernels programmatically (PDL), which is sound only if each
    ``__global__`` function of ``kernels/*.cu`` executes ``PDL_WAIT()`` before it reads or writes
    anything the previous kernel may touch: first of all, or (:data:`EARLY_CONSTANT_READS`) after
    reading only the constant weights -- before its ``PDL_WAIT();`` the body function names none
    of the activations, outputs or the permutation (``x``, ``out``, ``perm``) -- or
    (:data:`EARLY_HOST_READS`) after reading only the named host-written arguments."""
    import re

    root = Path(kernels.__file__).parent
    found = 0
    for cu in sorted(root.glob("*.cu")):
        text = cu.read_text()
        for m in re.finditer(r'extern "C" __global__([^{]*)\{', text):
            # the kernel's statements up to its closing brace, without comments and preprocessor lines
            rest = text[m.end() : text.index("\n}", m.end())]
            lines = [ln for ln in re.sub(r"//[^\n]*", "", rest).splitlines() if not ln.lstrip().startswith("#")]
            statements = [st.strip() for st in "\n".join(lines).split(";") if st.strip()]
            first = statements[0]
            header = re.sub(r"__launch_bounds__\([^)]*\)", "", m.group(1))
            kernel = re.search(r"(\w+)\s*\(", header).group(1)  # type: ignore[union-attr]
            bodies = EARLY_CONSTANT_READS.get((cu.name, kernel))
            host_reads = EARLY_HOST_READS.get((cu.name, kernel))
            if host_reads is not None:
                params = set(re.findall(r"(\w+)\s*(?:,|$)", header.split("(", 1)[1].rsplit(")", 1)[0]))
                prologue = re.sub(r"//[^\n]*", "", rest[: rest.index("PDL_WAIT();")])
                named = params & set(re.findall(r"\b\w+\b", prologue))
                assert named <= set(host_reads), f"{cu.name}: {kernel} names {sorted(named - set(host_reads))} before PDL_WAIT()"
                assert "params" in params and len(params) > 5  # the argument list was parsed
            elif bodies is None:
                assert first == "PDL_WAIT()", f"{cu.name}: kernel {kernel} starts with {first!r}"
            else:
                # every statement (one per preprocessor branch) is a call of an allowed body
                for st in statements:
                    assert any(st.startswith(f"{b}<") or st.startswith(f"{b}(") for b in bodies), (cu.name, kernel, st)
                for body in bodies:
                    start = text.index("{", re.search(rf"void {body}\(", text).end()) + 1
                    prologue = text[start : text.index("PDL_WAIT();", start)]
                    code = re.sub(r"//[^\n]*", "", prologue)
                    for name in ("x", "out", "perm"):
                        assert not re.search(rf"(?<![.\w]){name}\b", code), f"{cu.name}: {body} uses {name!r} before PDL_WAIT()"
            found += 1
    assert found >= 8  # paged_attention.cu's five kernels, RoPE and the weight-only GEMMs


# --- variants and compile_all -----------------------------------------------------------------


def test_variants_parsing(tmp_path: Path, kdir: Path) -> None:
    assert kernels.variants(kdir / "saxpy.cu") == [{"ELEM_T": "float"}, {"ELEM_T": "__half"}, {"ELEM_T": "__nv_bfloat16"}]
    plain = tmp_path / "plain.cu"
    plain.write_text('extern "C" __global__ void k() {}\n')
    assert kernels.variants(plain) == [{}]
    none = tmp_path / "none.cu"
    none.write_text("// trtcore-variants: []\n")
    assert kernels.variants(none) == []
    dup = tmp_path / "dup.cu"
    dup.write_text('// trtcore-variants: [{"A": 1}, {"A": 1}, {"A": true, "B": 0.5}]\n')
    assert kernels.variants(dup) == [{"A": 1}, {"A": True, "B": 0.5}]
    for text, match in [
        ('// trtcore-variants: [{"A": 1},\n', "not valid JSON"),
        ('// trtcore-variants: {"A": 1}\n', "lists of objects"),
        ('// trtcore-variants: [{"A": [1]}]\n', "int/float/str/bool"),
        ('// trtcore-variants: [{"1A": 1}]\n', "int/float/str/bool"),
    ]:
        broken = tmp_path / "broken.cu"
        broken.write_text(text)
        with pytest.raises(InvalidArgumentError, match=match):
            kernels.variants(broken)


def test_compile_all_in_a_folder(kdir: Path) -> None:
    (kdir / "plain.cu").write_text('extern "C" __global__ void plain(int* x) { *x = 1; }\n')
    assert kernels.list_kernels(kdir) == ["plain", "saxpy"]
    first = kernels.compile_all("sm_89", directory=kdir)
    assert [(c.name, dict(c.defines)) for c in first] == [
        ("plain", {}),
        ("saxpy", {"ELEM_T": "float"}),
        ("saxpy", {"ELEM_T": "__half"}),
        ("saxpy", {"ELEM_T": "__nv_bfloat16"}),
    ]
    assert not any(c.from_cache for c in first) and all(kernels.cubin_arch(c.cubin) == "sm_89" for c in first)
    second = kernels.compile_all("sm_89", directory=kdir, jobs=1)
    assert all(c.from_cache for c in second) and [c.key for c in second] == [c.key for c in first]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_variant_compiles(arch: str) -> None:
    """Every variant of every kernel in trtcore's kernels/ compiles with NVRTC (testing tier 2)."""
    names = kernels.list_kernels()
    if not names:
        pytest.skip(f"no kernels in {kernels.KERNEL_DIR}")
    built = kernels.compile_all(arch)
    expected = [(n, v) for n in names for v in kernels.variants(n)]
    assert [(c.name, dict(c.defines)) for c in built] == expected
    for c in built:
        assert kernels.cubin_arch(c.cubin) == arch, (c.name, c.defines)
        assert c.symbols, f'{c.name} {c.defines}: no extern "C" __global__ kernel'


# --- setup_cuda.py ----------------------------------------------------------------------------


@pytest.fixture
def setup_cuda():
    spec = importlib.util.spec_from_file_location("setup_cuda_under_test", REPO / "setup_cuda.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_setup_cuda_compiles_then_uses_the_cache(setup_cuda, kdir: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--arch", "sm_80", "9.0", "--kernels-dir", str(kdir)]
    assert setup_cuda.main(argv) == 0
    out = capsys.readouterr().out
    assert "NVRTC" in out and "backends:" in out  # the environment report is kept
    assert out.count(" compiled (") == 6 and "compiled 6, from cache 0" in out
    assert 'saxpy        sm_90  {"ELEM_T":"__half"}  compiled' in out
    assert setup_cuda.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("  from cache") == 6 and "compiled 0, from cache 6 -- nothing to compile" in out


def test_setup_cuda_without_gpu_or_arch_builds_three_archs(setup_cuda, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if kernels.gpu_count() > 0:
        pytest.skip("a GPU is present: setup_cuda.py compiles for it")
    one = tmp_path / "one"
    one.mkdir()
    (one / "k.cu").write_text('extern "C" __global__ void k(int* x) { *x = 1; }\n')
    assert setup_cuda.main(["--kernels-dir", str(one)]) == 0
    out = capsys.readouterr().out
    assert "no GPU and no --arch: compiling for sm_80, sm_89, sm_90" in out and "compiled 3, from cache 0" in out


def test_setup_cuda_fails_on_a_broken_kernel(setup_cuda, kdir: Path, capsys: pytest.CaptureFixture) -> None:
    (kdir / "broken.cu").write_text('extern "C" __global__ void k() { int x = ; }\n')
    assert setup_cuda.main(["--arch", "sm_90", "--kernels-dir", str(kdir)]) == 1
    cap = capsys.readouterr()
    assert "broken       sm_90  {}  FAILED (NVRTC_ERROR_COMPILATION)" in cap.out
    assert "compiled 3, from cache 0" in cap.out  # the others still compiled
    [line] = cap.err.strip().splitlines()
    assert line.startswith("setup_cuda: kernel broken sm_90 {} failed to compile: ") and "error" in line


def test_setup_cuda_fails_on_a_bad_variants_line(setup_cuda, kdir: Path, capsys: pytest.CaptureFixture) -> None:
    (kdir / "bad_variants.cu").write_text('// trtcore-variants: [{"A": 1}\nextern "C" __global__ void k() {}\n')
    assert setup_cuda.main(["--arch", "sm_90", "--kernels-dir", str(kdir)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("setup_cuda: ") and "bad_variants.cu: '// trtcore-variants:' is not valid JSON" in line


def test_setup_cuda_fails_without_headers_or_nvrtc(
    setup_cuda, kdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(knvrtc, "_include_candidates", lambda: [tmp_path / "nothing"])
    knvrtc._find_cuda_include.cache_clear()
    try:
        assert setup_cuda.main(["--arch", "sm_90", "--kernels-dir", str(kdir)]) == 1
    finally:
        knvrtc._find_cuda_include.cache_clear()
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("setup_cuda: cannot compile kernels: CUDA headers not found")
    monkeypatch.undo()

    def no_nvrtc():
        raise kernels.CUDAToolchainError("NVRTC library cannot be loaded (libnvrtc.so.13: not found); pip install nvidia-cuda-nvrtc")

    monkeypatch.setattr(knvrtc, "nvrtc_version", no_nvrtc)
    assert setup_cuda.main(["--arch", "sm_90", "--kernels-dir", str(kdir)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("setup_cuda: cannot compile kernels: NVRTC library cannot be loaded")
    assert setup_cuda.main(["--skip-kernels"]) == 0  # the report alone still works


def test_setup_cuda_bad_arch(setup_cuda, capsys: pytest.CaptureFixture) -> None:
    assert setup_cuda.main(["--arch", "sm_9x"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("setup_cuda: --arch: bad CUDA arch 'sm_9x'")


# --- GPU ------------------------------------------------------------------------------------


def _gpu_status() -> tuple[int, str]:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        return 0, f"cuda-python not installed ({exc})"
    err, n = cudart.cudaGetDeviceCount()
    if int(err) != 0:
        return 0, f"no CUDA GPU (cudaGetDeviceCount: {getattr(err, 'name', err)})"
    return int(n), "no CUDA GPU (cudaGetDeviceCount: 0)"


_NGPU, _NO_GPU_REASON = _gpu_status()
needs_gpu = pytest.mark.skipif(_NGPU == 0, reason=_NO_GPU_REASON)


class _DeviceBuffer:
    """cudaMalloc'd memory with host copies (cuda.bindings.runtime only; no CuPy)."""

    def __init__(self, host: np.ndarray) -> None:
        from cuda.bindings import runtime as cudart

        self.rt = cudart
        self.nbytes, self.dtype, self.shape = host.nbytes, host.dtype, host.shape
        err, self.ptr = cudart.cudaMalloc(self.nbytes)
        assert int(err) == 0, err
        self.upload(host)

    def upload(self, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        (err,) = self.rt.cudaMemcpy(self.ptr, host.ctypes.data, self.nbytes, self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice)
        assert int(err) == 0, err

    def download(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        (err,) = self.rt.cudaMemcpy(out.ctypes.data, self.ptr, self.nbytes, self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        assert int(err) == 0, err
        return out

    def free(self) -> None:
        self.rt.cudaFree(self.ptr)


def _sync() -> None:
    from cuda.bindings import runtime as cudart

    (err,) = cudart.cudaDeviceSynchronize()
    assert int(err) == 0, f"kernel failed: {getattr(err, 'name', err)}"


@pytest.mark.gpu
@needs_gpu
def test_gpu_launch_saxpy(kdir: Path) -> None:
    import ml_dtypes
    from cuda.bindings import runtime as cudart

    major, minor = kernels.compute_capability()
    rng = np.random.default_rng(0)
    n, a = 100_003, 2.5  # not a multiple of the block size
    for t, dt, rtol in [("float", np.float32, 1e-6), ("__half", np.float16, 1e-3), ("__nv_bfloat16", ml_dtypes.bfloat16, 8e-3)]:
        ck = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": t})  # arch=None: this GPU
        assert ck.arch == f"sm_{major}{minor}"
        fn = ck.function("saxpy")
        assert ck.function("saxpy") is fn  # cached per device
        if fn.param_sizes() is not None:
            assert fn.param_sizes() == [8, 8, 4, 4]
        x = rng.standard_normal(n).astype(dt)
        y = rng.standard_normal(n).astype(dt)
        dx, dy = _DeviceBuffer(x), _DeviceBuffer(y)
        try:
            err, stream = cudart.cudaStreamCreate()
            assert int(err) == 0
            fn.launch(((n + 255) // 256,), (256,), [(dy.ptr, "ptr"), (dx.ptr, "ptr"), (a, "f32"), (n, "i32")], stream=int(stream))
            cudart.cudaStreamSynchronize(stream)
            _sync()
            got = dy.download().astype(np.float64)
            want = (np.float32(a) * x.astype(np.float32) + y.astype(np.float32)).astype(dt).astype(np.float64)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=t)
            if fn.param_sizes() is not None:
                with pytest.raises(InvalidArgumentError, match="takes 4 parameters"):
                    fn.launch(1, 1, [(dy.ptr, "ptr")])
                with pytest.raises(InvalidArgumentError, match="argument 3 is 8 bytes"):
                    fn.launch(1, 1, [(dy.ptr, "ptr"), (dx.ptr, "ptr"), (a, "f32"), (n, "i64")])
            cudart.cudaStreamDestroy(stream)
        finally:
            dx.free()
            dy.free()

    # a launch from a fresh thread (no current context yet) works too
    ck = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"})
    fn = ck.function("saxpy")
    x = np.arange(1000, dtype=np.float32)
    dx, dy = _DeviceBuffer(x), _DeviceBuffer(np.ones(1000, np.float32))
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            fn.launch(4, 256, [(dy.ptr, "ptr"), (dx.ptr, "ptr"), (3.0, "f32"), (1000, "i32")])
            _sync()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert not errors, errors
    np.testing.assert_array_equal(dy.download(), 3 * x + 1)
    dx.free()
    dy.free()

    # a CUBIN for another major cannot be loaded, and says why
    other = "sm_80" if major != 8 else "sm_90"
    with pytest.raises(InvalidArgumentError, match="cannot run on device"):
        kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"}, arch=other).function("saxpy")


@pytest.mark.gpu
@needs_gpu
def test_gpu_launch_large_dynamic_shared_memory(kdir: Path) -> None:
    fn = kernels.compile_kernel(kdir / "saxpy.cu", defines={"ELEM_T": "float"}).function("reverse_smem")
    n = 16384  # 64 KiB of shared memory: above the 48 KiB default limit
    data = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    buf = _DeviceBuffer(data)
    try:
        fn.launch(1, 1024, [(buf.ptr, "ptr"), (n, "i32")], shared_mem=n * 4)
        _sync()
        np.testing.assert_array_equal(buf.download(), data[::-1])
        assert fn.attribute("max_dynamic_shared_size_bytes") >= n * 4
        with pytest.raises(kernels.CUDAError, match="CUDA_ERROR_INVALID_VALUE"):
            fn.launch(1, 2048, [(buf.ptr, "ptr"), (n, "i32")])  # block too large
    finally:
        buf.free()
