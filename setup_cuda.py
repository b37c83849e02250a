#!/usr/bin/env python3
"""Print the CUDA / TensorRT environment trtcore sees, which backends are usable here, and
compile trtcore's CUDA kernels into the kernel cache.

    python setup_cuda.py                          # kernels for this GPU (sm_80/89/90 without one)
    python setup_cuda.py --arch sm_80 sm_89 sm_90 # kernels for these archs, GPU or not
    python setup_cuda.py --skip-kernels           # the report only

Reports the NVIDIA driver and GPU (compute capability), the CUDA runtime and NVRTC
versions (cuda-python), CuPy, TensorRT and TensorRT-RTX, and for each trtcore backend
whether it can build networks and execute them on this machine. Then compiles every
variant of every kernel in trtcore's ``kernels/`` (``trtcore.kernels.compile_all``) with
NVRTC into ``$TRTCORE_CACHE/kernels``, one line per kernel variant and arch ("compiled" or
"from cache"), and the total; a second run finds everything in the cache.

Exits 1 when trtcore itself cannot run (the reference backend does not import), when NVRTC
or the CUDA headers are missing, or when a kernel fails to compile (NVRTC's log is printed,
and a one-line summary goes to stderr); 2 on a bad ``--arch``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _version(module: str, attr: str = "Builder") -> str | None:
    """The module's version; "type stubs only" when it lacks ``attr`` (its real library)."""
    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    if not hasattr(mod, attr):
        return None if not hasattr(mod, "__path__") else "type stubs only (no library)"
    return str(getattr(mod, "__version__", "installed"))


def _gpu() -> tuple[str, str | None]:
    """(description, "smXY") of GPU 0, through trtcore's one GPU probe (:mod:`trtcore.gpu`)."""
    try:
        from trtcore import gpu
    except Exception as exc:  # noqa: BLE001 - reported again below, where trtcore is imported
        return f"unknown (trtcore does not import: {exc})", None
    ok, why = gpu.gpu_status()
    if not ok:
        return f"no GPU visible ({why})", None
    rt = gpu.cuda_bindings("runtime")
    drv = gpu.call("cudaDriverGetVersion", rt.cudaDriverGetVersion)
    runtime = gpu.call("cudaRuntimeGetVersion", rt.cudaRuntimeGetVersion)
    major, minor = gpu.compute_capability(0)
    return f"{gpu.describe_device(0)}, driver {drv}, runtime {runtime}", f"sm{major}{minor}"


def _nvrtc() -> str:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return "not installed (pip install nvidia-cuda-nvrtc cuda-python)"
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # library not loadable
        return f"unavailable ({exc})"
    return f"{major}.{minor}" if int(err) == 0 else f"unavailable ({err})"


DEFAULT_ARCHS = ("sm_80", "sm_89", "sm_90")


def _compile_kernels(archs: list[str] | None, have_gpu: bool, directory: Path | None) -> int:
    """Compile every kernel variant for ``archs`` (None: the GPU's, else DEFAULT_ARCHS)."""
    from trtcore import kernels
    from trtcore.errors import InvalidArgumentError

    def fail(msg: str, code: int = 1) -> int:
        print(f"setup_cuda: {msg}", file=sys.stderr)
        return code

    try:
        version = ".".join(map(str, kernels.nvrtc_version()))
        include = kernels.cuda_include_dir()
        if archs:
            targets = [kernels.normalize_arch(a) for a in archs]
        elif have_gpu:
            targets = [kernels.current_arch()]
        else:
            targets = list(DEFAULT_ARCHS)
    except kernels.CUDAToolchainError as exc:
        return fail(f"cannot compile kernels: {exc}")
    except InvalidArgumentError as exc:
        return fail(f"--arch: {exc}", 2)
    except kernels.CUDAError as exc:
        return fail(f"cannot query the GPU: {exc}")
    targets = list(dict.fromkeys(targets))
    src_dir = directory or kernels.KERNEL_DIR
    print(f"\nkernels (NVRTC {version}, CUDA headers {include}):")
    print(f"  sources {src_dir}")
    print(f"  cache   {kernels.kernel_cache_dir()}")
    if not archs and not have_gpu:
        print(f"  no GPU and no --arch: compiling for {', '.join(targets)}")
    names = kernels.list_kernels(src_dir)
    if not names:
        print(f"  no kernels (.cu files) in {src_dir}")
    jobs: list[tuple[str, str, dict]] = []
    failures: list[str] = []
    for name in names:
        try:
            sets = kernels.variants(src_dir / f"{name}.cu")
        except InvalidArgumentError as exc:
            print(f"  {name:<12} FAILED: {exc}")
            failures.append(str(exc))
            continue
        jobs += [(name, arch, defines) for arch in targets for defines in sets]
    w = max([12, *(len(n) for n in names)])
    compiled = cached = 0
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # NVRTC releases the GIL
        futures = [pool.submit(kernels.compile_kernel, src_dir / f"{name}.cu", defines=defines, arch=arch) for name, arch, defines in jobs]
        for (name, arch, defines), future in zip(jobs, futures):
            label = f"  {name:<{w}} {arch:<6} {json.dumps(defines, separators=(',', ':'))}"
            try:
                ck = future.result()
            except kernels.NVRTCError as exc:
                print(f"{label}  FAILED ({exc.result})")
                print("    " + exc.log.rstrip().replace("\n", "\n    "))
                failures.append(f"kernel {name} {arch} {json.dumps(defines, separators=(',', ':'))} failed to compile: {exc.first_error()}")
                continue
            except kernels.CUDAToolchainError as exc:
                for f in futures:
                    f.cancel()
                return fail(f"cannot compile kernels: {exc}")
            if ck.from_cache:
                cached += 1
                print(f"{label}  from cache")
            else:
                compiled += 1
                print(f"{label}  compiled ({ck.seconds:.2f} s)")
    note = " -- nothing to compile, all in the cache" if compiled == 0 and not failures else ""
    print(f"  compiled {compiled}, from cache {cached}{note}")
    if failures:
        more = f" (and {len(failures) - 1} more; see the log above)" if len(failures) > 1 else ""
        return fail(f"{failures[0]}{more}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--arch", nargs="+", metavar="ARCH", help="compile kernels for these archs (sm_80, sm_89, sm_90, ...; also 90 or 9.0) instead of the GPU's"
    )
    parser.add_argument("--skip-kernels", action="store_true", help="print the environment report only")
    parser.add_argument("--kernels-dir", type=Path, help="compile the .cu files of this folder instead of trtcore's kernels/ (kernel development)")
    args = parser.parse_args(argv)
    gpu, arch = _gpu()
    rows = [
        ("python", sys.version.split()[0]),
        ("GPU", gpu),
        ("NVRTC", _nvrtc()),
        ("cupy", _version("cupy", "ndarray") or "not installed (pip install 'trtcore[gpu]')"),
        ("tensorrt", _version("tensorrt") or "not installed (pip install 'trtcore[trt]')"),
        ("tensorrt_rtx", _version("tensorrt_rtx") or "not installed (pip install 'trtcore[rtx]')"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    try:
        from trtcore.trt import is_available
    except ImportError as exc:
        print(f"trtcore does not import: {exc}", file=sys.stderr)
        return 1
    print("\nbackends:")
    for name in ("tensorrt", "tensorrt_rtx", "reference"):
        if not is_available(name):
            print(f"  {name:<13} not installed")
            continue
        if name == "reference":
            where = "builds; executes on the CPU (NumPy)"
        elif arch is None:
            where = "builds; cannot execute (no GPU)"
        elif name == "tensorrt_rtx" and arch == "sm90":
            where = "builds; cannot execute (TensorRT-RTX refuses compute capability 9.0)"
        else:
            where = f"builds and executes on {arch}"
        print(f"  {name:<13} {where}")
    if not is_available("reference"):
        print("trtcore's reference backend does not import; reinstall trtcore", file=sys.stderr)
        return 1
    if args.skip_kernels:
        return 0
    return _compile_kernels(args.arch, arch is not None, args.kernels_dir.resolve() if args.kernels_dir else None)


if __name__ == "__main__":
    sys.exit(main())
