"""trtcore's cache directory: where it is, whether it can be written, and its private folders.

::

    $TRTCORE_CACHE (default platformdirs.user_cache_dir("trtcore"), e.g. ~/.cache/trtcore)
    ├── models/SmolLM2-135M-Instruct/   the converted default model (trtcore.default_model)
    └── kernels/                        NVRTC CUBINs (trtcore.kernels)

Set ``TRTCORE_CACHE`` to move all of it. Work in progress lives in *private folders* inside
the cache, never in ``/tmp``: ``.<label>.staging-<pid>-<8 hex>``, made by
:func:`private_dir`. A process killed hard leaves its private folders behind; since the name
holds the owner's process id, :func:`remove_stale` (called by the next run) deletes those
whose process is gone (also ``.<name>.partial-<pid>-<hex>``, the converter's own staging).

This module imports only :mod:`trtcore.errors`, so every layer (``kernels/`` included) may use it.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from .errors import CacheError

__all__ = ["ENV_CACHE", "cache_dir", "private_dir", "private_name", "remove_stale"]

#: the environment variable that moves the cache
ENV_CACHE = "TRTCORE_CACHE"
#: the file a completed cache folder holds (trtcore.default_model writes it: what the folder was
#: made from); a copy of such a folder must not take it along (trtcore.quantizer)
COMPLETE_MARKER = ".trtcore-complete.json"

# private folders; ".partial-" is trtcore.gguf_convert's own staging beside its output
_PRIVATE = re.compile(r"^\.(?P<label>.+)\.(?:staging|partial)-(?P<pid>\d+)-[0-9a-f]{8}$")


def cache_dir() -> Path:
    """trtcore's cache root: ``$TRTCORE_CACHE`` if set, else the platform's user cache dir
    (``platformdirs.user_cache_dir("trtcore")``). Not created by this call."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:  # a --no-deps install (e.g. the GPU check): the XDG default
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trtcore"
    return Path(platformdirs.user_cache_dir("trtcore"))


def _hint(path: Path, exc: OSError) -> CacheError:
    return CacheError(
        f"trtcore's cache {path} cannot be written ({exc.strerror or exc}); "
        f"set {ENV_CACHE} to a writable folder (e.g. {ENV_CACHE}=$HOME/trtcore-cache)"
    )


def private_name(parent: Path, label: str) -> Path:
    """A new private path ``parent/.<label>.staging-<pid>-<hex>`` (not created), for a folder
    that is made by a rename; :func:`remove_stale` removes it once this process is gone."""
    return Path(parent) / f".{label}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def private_dir(parent: Path, label: str) -> Path:
    """Create and return a new private folder ``parent/.<label>.staging-<pid>-<hex>`` (and
    ``parent``). The caller removes it when done; if the process dies first,
    :func:`remove_stale` removes it at the next run.

    Raises:
        CacheError: ``parent`` or the folder cannot be created; the message suggests ``TRTCORE_CACHE``.
    """
    path = private_name(parent, label)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    except OSError as exc:
        raise _hint(path.parent, exc) from exc
    return path


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return True  # cannot tell: keep the folder
    return True


def remove_stale(parent: Path) -> list[Path]:
    """Delete the private folders in ``parent`` (see :func:`private_dir`) whose process is
    gone; return those removed. Folders of live processes (and anything else) are kept;
    a missing ``parent`` is fine."""
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return []
    removed = []
    for p in entries:
        m = _PRIVATE.match(p.name)
        if m and not _alive(int(m.group("pid"))):
            shutil.rmtree(p, ignore_errors=True)
            if not p.exists():
                removed.append(p)
    return removed
