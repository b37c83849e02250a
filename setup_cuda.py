#!/usr/bin/env python3
"""Print the CUDA / TensorRT environment trtcore sees, and which backends are usable here.

    python setup_cuda.py

Reports the NVIDIA driver and GPU (compute capability), the CUDA runtime and NVRTC
versions (cuda-python), CuPy, TensorRT and TensorRT-RTX, and for each trtcore backend
whether it can build networks and execute them on this machine. Exits 1 when trtcore
itself cannot run (the reference backend does not import).
"""

from __future__ import annotations

import importlib
import sys


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    if not hasattr(mod, "Builder"):
        return None if not hasattr(mod, "__path__") else "type stubs only (no library)"
    return str(getattr(mod, "__version__", "installed"))


def _gpu() -> tuple[str, str | None]:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return "cuda-python not installed", None
    err, count = cudart.cudaGetDeviceCount()
    if int(err) != 0 or count == 0:
        return f"no GPU visible ({getattr(err, 'name', err)})", None
    err, prop = cudart.cudaGetDeviceProperties(0)
    name = prop.name.decode(errors="replace").rstrip("\x00") if isinstance(prop.name, bytes) else str(prop.name)
    _, drv = cudart.cudaDriverGetVersion()
    _, rt = cudart.cudaRuntimeGetVersion()
    return f"{name}, compute capability {prop.major}.{prop.minor}, driver {drv}, runtime {rt}", f"sm{prop.major}{prop.minor}"


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


def main() -> int:
    gpu, arch = _gpu()
    rows = [
        ("python", sys.version.split()[0]),
        ("GPU", gpu),
        ("NVRTC", _nvrtc()),
        ("cupy", _version("cupy") or "not installed (pip install 'trtcore[gpu]')"),
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
