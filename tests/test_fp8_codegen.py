"""The cuda engine's E4M3 arithmetic (``trtcore.cuda.codegen``), on the CPU.

On the H200 (bench/results/h200-2026-12-02-final) the engine's Q/DQ form of an FP8 linear was
off the reference: the generated cast float32 -> FP8 went through an integer,
``rnd_e4m3((float)(long long)v)``, because FP8 was not a floating type to the code generator,
so ``x / s_x`` lost its fraction before the E4M3 rounding. These tests hold the generated
arithmetic to a float64 implementation written from the OCP OFP8 spec (``tests/test_fp8.py``'s
``spec_encode`` / ``SPEC_VALUES``) and to ml_dtypes' ``float8_e4m3fn`` (the reference
backend's cast):

* the cast expressions the generator writes (float -> FP8 rounds the value; FP8 -> int
  truncates; an FP8 scalar constant is its float value);
* ``codegen.E4M3_HELPERS`` -- the very source text every generated kernel includes -- compiled
  for the host with a C++ compiler and ``cuda_fp8.h`` (skipped, saying why, without them) and
  run over every tie, every E4M3 value, a float32 ulp either side of each, the overflow
  boundary, subnormals, infinities, NaN and random values: its codes equal the spec's and
  ml_dtypes' (the device differs from this host build only in ``cuda_fp8.h``'s
  ``cvt.rn.satfinite.e4m3x2.f32`` on compute capability 8.9+, the same rounding in hardware;
  the GPU test ``tests/cuda/test_fp8_gemm_gpu.py::test_qdq_linear_on_the_cuda_engine_equals_the_reference``
  checks it there);
* the Q/DQ linear's fused kernels: the E4M3 rounding is applied to the scaled value itself.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from test_fp8 import SPEC_VALUES, _qdq_plan, spec_encode

from trtcore.cuda import codegen
from trtcore.cuda.ir import Node
from trtcore.reference.types import DataType

#: 448 plus half an E4M3 ulp at 448 (ulp 32): above it a cast rounds past the largest finite value
OVERFLOW = 464.0


def cast_oracle(x: float) -> float:
    """The value of ``x`` cast to E4M3 (spec rounding; NaN above :data:`OVERFLOW`, for an
    infinity or a NaN: E4M3 has no infinity and the cast does not saturate)."""
    if np.isnan(x) or abs(x) > OVERFLOW:
        return float("nan")
    return float(SPEC_VALUES[spec_encode(x)])


def probe_values() -> np.ndarray:
    """float32 values where a rounding slip shows: every E4M3 value and every tie between
    neighbours, each with the float32 values one ulp either side, both signs; the overflow
    boundary; subnormals; random values over many scales; zeros, infinities, NaN."""
    rng = np.random.default_rng(20261202)
    pos = SPEC_VALUES[:0x7F].astype(np.float32)  # +0 .. 448
    mids = ((SPEC_VALUES[:0x7E] + SPEC_VALUES[1:0x7F]) / 2).astype(np.float32)
    edges = np.array([OVERFLOW, 448.0, 480.0, 512.0, 2.0**-9, 2.0**-10, 2.0**-6, 1e30, 3e38], np.float32)
    base = np.concatenate([pos, mids, edges])
    around = np.concatenate([base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))])
    scales = [1e-4, 1e-3, 1e-2, 0.1, 1, 10, 100, 300]
    rand = np.concatenate([rng.normal(0, s, 2000) for s in scales]).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    x = np.concatenate([around, -around, rand, special]).astype(np.float32)
    return x


def test_cast_to_fp8_rounds_the_value_not_an_integer() -> None:
    cast = Node("c", "cast", ["x"], ["y"], {"to": int(DataType.FP8)})
    assert codegen.member_expr(cast, ["v"], [DataType.FLOAT], DataType.FP8) == "rnd_e4m3(((float)v))"
    assert codegen.member_expr(cast, ["v"], [DataType.BF16], DataType.FP8) == "rnd_e4m3(((float)v))"
    back = Node("c", "cast", ["x"], ["y"], {"to": int(DataType.FLOAT)})
    assert codegen.member_expr(back, ["v"], [DataType.FP8], DataType.FLOAT) == "((float)v)"
    to_int = Node("c", "cast", ["x"], ["y"], {"to": int(DataType.INT32)})
    assert codegen.member_expr(to_int, ["v"], [DataType.FP8], DataType.INT32) == "((int)(long long)(v))"  # float -> int truncates
    assert codegen.scalar_literal(np.array([0.4375], ml_dtypes.float8_e4m3fn), DataType.FP8) == codegen.float_literal(0.4375)


def test_qdq_linear_kernels_round_the_scaled_value_to_e4m3() -> None:
    """The fused Q/DQ kernels of the cuda engine: x / s_x, clip to +-448, E4M3 rounding of
    that float, back to float32 -- no integer conversion anywhere on the way."""
    for strategy, scale in (("channel", None), ("tensor", 2.0 / 448)):
        plan = _qdq_plan(strategy, scale, opt=16, most=64)
        bodies = [ks.source.split(codegen.PREAMBLE, 1)[-1] for ks in plan.sources.values()]
        rounding = [line for body in bodies for line in body.splitlines() if "rnd_e4m3(" in line]
        assert rounding, "no E4M3 rounding in the Q/DQ linear's kernels"
        for line in rounding:
            assert "long long" not in line and "(int)" not in line, line


def _host_compiler() -> str | None:
    return shutil.which("g++") or shutil.which("clang++") or shutil.which("c++")


def _host_cuda_include() -> Path | None:
    """A CUDA include directory a host compiler can use for ``cuda_fp8.h`` (a toolkit's:
    ``$CUDA_HOME``, ``$CUDA_PATH``, ``/usr/local/cuda``, then the one NVRTC uses)."""
    import os

    from trtcore.kernels.nvrtc import cuda_include_dir

    dirs = [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    dirs.append(Path("/usr/local/cuda/include"))
    try:
        dirs.append(cuda_include_dir())
    except Exception:  # noqa: BLE001 - no NVRTC headers either
        pass
    for d in dirs:
        if (d / "cuda_fp8.h").exists() and (d / "crt" / "host_defines.h").exists():
            return d
    return None


def _run_helpers_on_host(tmp_path: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``e4m3_bits`` of each float32 of ``x`` and ``e4m3_value`` of the 256 codes, from
    ``codegen.E4M3_HELPERS`` compiled for the host."""
    cxx = _host_compiler()
    if cxx is None:
        pytest.skip("no host C++ compiler (g++ / clang++) to build codegen.E4M3_HELPERS")
    include = _host_cuda_include()
    if include is None:
        pytest.skip("no CUDA toolkit include directory with cuda_fp8.h and crt/host_defines.h (the NVRTC wheel's headers lack the host ones)")
    head = "#include <cuda_fp8.h>\n#include <cmath>\n#include <cstdio>\n"
    exe = tmp_path / "e4m3"

    def build(body: str) -> subprocess.CompletedProcess:
        src = tmp_path / "e4m3.cpp"
        src.write_text(head + body)
        return subprocess.run([cxx, "-std=c++17", "-O1", f"-I{include}", str(src), "-o", str(exe)], capture_output=True, text=True, check=False)

    if build("int main() { return 0; }\n").returncode != 0:  # the machine, not the code under test
        pytest.skip(f"{cxx} cannot build cuda_fp8.h for the host with {include}")
    main = (
        "int main() {\n"
        "  float v; unsigned char b;\n"
        "  while (fread(&v, 4, 1, stdin) == 1) { b = e4m3_bits(v); fwrite(&b, 1, 1, stdout); }\n"
        "  for (int c = 0; c < 256; ++c) { float f = e4m3_value((__nv_fp8_storage_t)c); fwrite(&f, 4, 1, stdout); }\n"
        "  return 0;\n}\n"
    )
    done = build(codegen.E4M3_HELPERS + main)
    assert done.returncode == 0, f"codegen.E4M3_HELPERS does not compile for the host: {done.stderr[-2000:]}"
    out = subprocess.run([str(exe)], input=x.astype("<f4").tobytes(), capture_output=True, check=True).stdout
    codes = np.frombuffer(out[: x.size], np.uint8)
    values = np.frombuffer(out[x.size :], "<f4")
    assert values.size == 256
    return codes, values


def test_generated_e4m3_conversion_equals_the_spec_and_ml_dtypes(tmp_path: Path) -> None:
    x = probe_values()
    codes, values = _run_helpers_on_host(tmp_path, x)
    # decoding: every code's value is the spec's
    finite = ~np.isnan(SPEC_VALUES)
    np.testing.assert_array_equal(np.isnan(values), ~finite)
    np.testing.assert_array_equal(values[finite].astype(np.float64), SPEC_VALUES[finite])
    # encoding: the spec's value (NaN positions included) and ml_dtypes' code, for every probe
    got = SPEC_VALUES[codes]
    want = np.array([cast_oracle(float(v)) for v in x])
    bad = np.flatnonzero(~((got == want) | (np.isnan(got) & np.isnan(want))))
    assert bad.size == 0, [(float(x[i]), int(codes[i]), float(want[i])) for i in bad[:8]]
    ml = x.astype(ml_dtypes.float8_e4m3fn)
    nan = np.isnan(ml.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(codes[~nan], ml.view(np.uint8)[~nan])


def test_the_oracle_is_not_the_code_under_test() -> None:
    """The cast oracle agrees with ml_dtypes on the probes (two independent derivations), and
    the old generated arithmetic -- truncation to an integer first -- differs from both on most
    in-range probes (so the tests above can fail)."""
    x = probe_values()
    want = np.array([cast_oracle(float(v)) for v in x])
    ml = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(ml), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(ml[ok], want[ok])
    in_range = ok & (np.abs(x) < 16) & (x != 0)
    truncated = np.trunc(x[in_range]).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert (truncated != want[in_range]).mean() > 0.5
