"""``LLM(backend="cuda")`` end to end on the GPU: trtcore's own engine (:mod:`trtcore.cuda`)
built from each tiny checkpoint and driven by the same executor as a TensorRT engine
(:class:`trtcore.runtime.trt_executor.TensorRTExecutor`, ``execute_async_v3``), against
transformers on the GPU: greedy tokens equal and full-vocabulary log-probabilities within
1e-4 relative in float32 (:func:`test_gpu_backend.check_float32_against_hf`)."""

from __future__ import annotations

from typing import Any

import pytest
from hf_models import VARIANTS, ModelStore, hf_models  # noqa: F401
from test_gpu_backend import _stat, check_float32_against_hf, cp, torch_cuda  # noqa: F401

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cuda_backend_matches_transformers(cp: Any, torch_cuda: Any, hf_models: ModelStore, name: str) -> None:  # noqa: F811
    stats = check_float32_against_hf(hf_models, name, None, "cuda", "cuda", backend="cuda")
    _stat(test="hf_float32_cuda_backend", name=name, **stats)
