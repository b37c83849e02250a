"""File writing: the one atomic writer (engines, sidecars, kernel CUBINs, cache markers).

A reader never sees a partial file: :func:`write_atomic` writes a temporary file in the
target's folder (same file system) and renames it over the target with :func:`os.replace`,
which POSIX and Windows both make atomic. A process killed half-way leaves at most a hidden
``.<name>.*.tmp`` file beside the target, never a truncated target.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import InvalidArgumentError

__all__ = ["check_writable", "write_atomic"]


def check_writable(path: str | os.PathLike[str]) -> None:
    """Fail early (before a long build) when the file ``path`` cannot be written; creates
    its folder.

    Raises:
        InvalidArgumentError: the folder cannot be created or written, or ``path`` is a folder.
    """
    path = Path(path)
    if path.is_dir():
        raise InvalidArgumentError(f"output {path} is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot create the folder of {path}: {exc.strerror}") from exc
    if not os.access(path.parent, os.W_OK):
        raise InvalidArgumentError(f"cannot write {path}: folder {path.parent} is not writable")


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    Args:
        path: the file; its folder is created.
        data: the complete contents.
        mode: permission bits of the file; default 0666 minus the umask, like ``open``.

    Raises:
        InvalidArgumentError: the file cannot be written (the message names ``path`` and why).
    """
    path = Path(path)
    check_writable(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot write {path}: {exc.strerror}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if mode is None:
            umask = os.umask(0)  # the only way to read the umask
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InvalidArgumentError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
