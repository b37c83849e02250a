"""One-op networks for the per-op tests of :mod:`trtcore.ops` (the layout of TensorRT-LLM's
``tests/unittest/functional/``: one file per group of ops).

A test describes its op as a *body* ``body(g, inputs) -> tensor or tuple of tensors``
(``g`` a :class:`trtcore.ops.Graph`, ``inputs`` the network inputs by name) and example
feeds; :class:`OneOp` then

* defines the same strongly typed network with any TensorRT module (``trtcore.reference``
  or ``tensorrt_rtx``): one input per feed, of the feed's dtype and shape, with ``-1`` on
  the axes named dynamic, and one network output per returned tensor (``out`` or
  ``out0``, ``out1``...);
* :meth:`OneOp.run`: builds it on the reference backend (``build_serialized_network`` with
  one optimization profile, ``Runtime.deserialize_cuda_engine``) and runs the engine with
  :class:`~trtcore.runtime.reference_executor.ReferenceExecutor` on copies of the feeds
  (``OneOp.fed`` after the run: caches updated in place show there);
* :meth:`OneOp.check_rtx`: builds it with ``tensorrt_rtx`` ahead of time for ``sm89`` (no
  GPU needed, as tests/test_build_rtx.py) and checks that the build succeeds and that the
  output shapes and types ``tensorrt_rtx`` infers are the reference network's. Skips, saying
  so, when ``tensorrt_rtx`` is not installed.

The test files import these helpers (``from .conftest import ...``: tests/ops is a package).
:func:`builds_rtx` says which parametrized cases also build with ``tensorrt_rtx``.

The optimization profile of a dynamic axis spans ``[1, n]`` (opt = max = ``n``, the feed's
size); ``min_shapes`` raises the lower end where an op needs it.

Tolerances, used by :func:`assert_close`: the reference evaluator computes every layer in
float32 and rounds its output once to the tensor's type (trtcore.reference.evaluator), so an
op of ``k`` layers in float16/bfloat16 differs from an exact float64 formula by about ``k``
roundings: :data:`UNIT_ROUNDOFF` is the unit roundoff ``u`` of each format (2^-24, 2^-11,
2^-8); tests state their ``k``.
"""

from __future__ import annotations

import importlib.util
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import trtcore.reference as ref
from trtcore import ops
from trtcore.builder import trt_logger
from trtcore.runtime.reference_executor import ReferenceExecutor

HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None
#: the compute capability of the ahead-of-time tensorrt_rtx builds (as tests/test_build_rtx.py)
RTX_CC = "SM89"

DTYPES = ("float32", "float16", "bfloat16")
NP_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
#: unit roundoff (half an ulp at 1) of each format: 2^-(significand bits)
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}

Body = Callable[[ops.Graph, dict[str, Any]], Any]


def builds_rtx(dtype: str, first_variant: bool) -> bool:
    """Whether a parametrized case also builds with tensorrt_rtx: every variant in float16,
    every dtype for the first variant. A build takes 0.1-0.4 s on 2 cores, most of this
    folder's time, and the shapes TensorRT infers do not depend on the dtype."""
    return dtype == "float16" or first_variant


def as_float64(a: Any) -> np.ndarray:
    """Any float array (bfloat16 included) as float64."""
    return np.asarray(a).astype(np.float64)


def assert_close(got: Any, want: np.ndarray, dtype: str, roundings: float, *, atol_scale: float | None = None) -> None:
    """``|got - want| <= tol * (|want| + atol_scale)`` elementwise, ``tol`` = ``roundings``
    units of roundoff of ``dtype`` plus 64 units of float32 roundoff (float32 compute noise:
    libm functions, summation order), ``atol_scale`` default ``max|want| / 4`` (values near zero
    inherit the rounding error of the larger terms they were computed from)."""
    got64, want = as_float64(got), np.asarray(want, np.float64)
    assert got64.shape == want.shape, (got64.shape, want.shape)
    tol = roundings * UNIT_ROUNDOFF[dtype] + 64 * UNIT_ROUNDOFF["float32"]
    scale = float(np.max(np.abs(want), initial=0.0)) / 4 if atol_scale is None else atol_scale
    np.testing.assert_allclose(got64, want, rtol=tol, atol=tol * scale, err_msg=f"{dtype}, {roundings} roundings")


def torch_module_reference(rng: np.random.Generator, module: Any, shape: Sequence[int], dtype: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Random float64 parameters for the float64 torch ``module`` (``1/sqrt(fan_in)`` normal,
    rounded to the graph ``dtype``, as the ops store them) copied into it, a random input of
    ``shape`` in ``dtype``, and the module's float64 output on it:
    ``(params by parameter name, x, want)``."""
    import torch

    params = {name: rng.standard_normal(tuple(p.shape)) / np.sqrt(p.shape[-1]) for name, p in module.named_parameters()}
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.from_numpy(as_float64(params[name].astype(NP_DTYPES[dtype]))))
    x = randn(rng, shape, dtype)
    with torch.no_grad():
        want = module(torch.from_numpy(as_float64(x))).numpy()
    return params, x, want


def randn(rng: np.random.Generator, shape: Sequence[int], dtype: str | np.dtype, scale: float = 1.0) -> np.ndarray:
    """Standard normal values drawn in float64, times ``scale``, rounded to ``dtype``."""
    dt = NP_DTYPES[dtype] if isinstance(dtype, str) else np.dtype(dtype)
    return (rng.standard_normal(tuple(shape)) * scale).astype(dt)


class OneOp:
    """A network of one op (see the module docstring).

    Args:
        body: ``body(g, inputs)`` adds the op and returns its output tensor(s).
        feeds: example inputs by name; they give each input's dtype and shape.
        dtype: the graph dtype (:class:`trtcore.ops.Graph`), ``"float32"``, ``"float16"``
            or ``"bfloat16"``.
        dynamic: per input, the axes declared ``-1`` (profile ``[min, n, n]``).
        min_shapes: per input, the profile's min shape (default 1 on every dynamic axis).
        graph_kwargs: more arguments of :class:`trtcore.ops.Graph` (``implementations``,
            ``block_size``, ``max_seq_len``).
    """

    def __init__(
        self, body: Body, feeds: Mapping[str, np.ndarray], *, dtype: str = "float32",
        dynamic: Mapping[str, Sequence[int]] | None = None, min_shapes: Mapping[str, Sequence[int]] | None = None,
        graph_kwargs: Mapping[str, Any] | None = None,
    ):
        self.body, self.dtype = body, dtype
        self.feeds = {k: np.asarray(v) for k, v in feeds.items()}
        self.dynamic = {k: tuple(a % self.feeds[k].ndim for a in axes) for k, axes in (dynamic or {}).items()}
        self.min_shapes = {k: tuple(v) for k, v in (min_shapes or {}).items()}
        self.graph_kwargs = dict(graph_kwargs or {})
        #: the arrays the last :meth:`run` fed, as the run left them
        self.fed: dict[str, np.ndarray] = {}

    def input_shape(self, name: str) -> tuple[int, ...]:
        """The declared shape of input ``name`` (-1 on its dynamic axes)."""
        axes = self.dynamic.get(name, ())
        return tuple(-1 if a in axes else d for a, d in enumerate(self.feeds[name].shape))

    def define(self, trt: Any) -> tuple[Any, Any, ops.Graph]:
        """``(builder, network, graph)`` of the op, defined with the TensorRT module ``trt``."""
        builder = trt.Builder(trt_logger(trt))
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        g = ops.Graph(trt, network, self.dtype, **self.graph_kwargs)
        inputs = {name: g.input(name, a.dtype, self.input_shape(name)) for name, a in self.feeds.items()}
        out = self.body(g, inputs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        for i, t in enumerate(outs):
            g.output(t, "out" if len(outs) == 1 else f"out{i}")
        return builder, network, g

    def _config(self, builder: Any) -> Any:
        cfg = builder.create_builder_config()
        if self.dynamic:
            profile = builder.create_optimization_profile()
            for name, a in self.feeds.items():
                if name in self.dynamic:
                    lo = self.min_shapes.get(name) or tuple(1 if d == -1 else d for d in self.input_shape(name))
                    profile.set_shape(name, lo, a.shape, a.shape)
            cfg.add_optimization_profile(profile)
        return cfg

    def run(self, capture: Sequence[str] = ()) -> dict[str, np.ndarray]:
        """Build on the reference backend and run the engine on the feeds; every output (and
        each tensor named in ``capture``) as a NumPy array (bfloat16 as ``ml_dtypes.bfloat16``)."""
        builder, network, g = self.define(ref)
        blob = builder.build_serialized_network(network, self._config(builder))
        executor = ReferenceExecutor(ref.Runtime(ref.Logger()).deserialize_cuda_engine(blob))
        # copies: KV caches and pools are updated in place (TensorRT's aliasing), the feeds stay as given
        self.fed = {k: v.copy() for k, v in self.feeds.items()}
        return executor.to_host(executor.run(self.fed, capture=capture))

    def output_signature(self, trt: Any) -> list[tuple[str, tuple[int, ...], str]]:
        """``(name, shape, dtype name)`` of each output as the network defined with ``trt`` infers it."""
        _, network, _ = self.define(trt)
        outs = [network.get_output(i) for i in range(network.num_outputs)]
        return [(t.name, tuple(t.shape), t.dtype.name) for t in outs]

    def check_rtx(self) -> list[tuple[str, tuple[int, ...], str]]:
        """Build with ``tensorrt_rtx`` (ahead of time, sm89) and check the build succeeds and
        the outputs' shapes and types equal the reference network's; returns them."""
        if not HAS_RTX:
            pytest.skip("tensorrt_rtx is not installed: the reference check ran, the TensorRT-RTX build check needs it")
        import tensorrt_rtx as rtx

        builder, network, g = self.define(rtx)
        cfg = self._config(builder)
        cfg.num_compute_capabilities = 1
        cfg.set_compute_capability(getattr(rtx.ComputeCapability, RTX_CC), 0)
        logger = trt_logger(rtx)
        seen = len(logger.errors)
        blob = builder.build_serialized_network(network, cfg)
        assert blob is not None, f"tensorrt_rtx did not build the network: {logger.errors[seen:]}"
        del g  # the constants' memory (g.keepalive) is no longer read
        outs = [network.get_output(i) for i in range(network.num_outputs)]
        got = [(t.name, tuple(t.shape), t.dtype.name) for t in outs]
        assert got == self.output_signature(ref)
        return got


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded by the test's id: fresh inputs per test and parameter set, the
    same on every run (``hash`` of a str changes between processes, crc32 does not)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
