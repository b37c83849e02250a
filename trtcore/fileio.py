"""File writing: the one atomic writer (engines, sidecars, kernel CUBINs, cache markers), and
the one atomic folder writer (converted and quantized checkpoints).

A reader never sees a partial file: :func:`write_atomic` writes a temporary file in the
target's folder (same file system) and renames it over the target with :func:`os.replace`,
which POSIX and Windows both make atomic. A process killed half-way leaves at most a hidden
``.<name>.*.tmp`` file beside the target, never a truncated target. :func:`atomic_folder`
does the same for a folder: it is written as a hidden ``.<name>.partial-*`` sibling and
renamed into place when complete, removed on any failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from .errors import InvalidArgumentError

__all__ = ["atomic_folder", "check_folder_free", "check_writable", "write_atomic"]


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
        os.chmod(tmp, 0o666 & ~_umask() if mode is None else mode)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InvalidArgumentError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    umask = os.umask(0)  # the only way to read the umask
    os.umask(umask)
    return umask


def _default_modes(folder: Path) -> None:
    """Give every file under ``folder`` 0666 and every folder 0777, minus the umask, as
    ``open`` / ``mkdir`` would: some writers (safetensors' ``save_file``) create their files
    0600, which another user or a container's non-root user could not read."""
    umask = _umask()
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777 & ~umask)
        for f in files:
            os.chmod(os.path.join(root, f), 0o666 & ~umask)


def check_folder_free(
    output_dir: str | os.PathLike[str], overwrite: bool, error: type[Exception] = InvalidArgumentError, source: str | os.PathLike[str] | None = None
) -> None:
    """Fail early -- before the work whose result goes there -- when ``output_dir`` cannot take
    a new folder: it is empty (``""``), the current folder or one holding it (a folder in use
    is not renamed or replaced); it overlaps ``source`` (the input being converted: the same
    path, or one inside the other), which replacing ``output_dir`` would delete even with
    ``overwrite``; it exists, is not an empty folder and ``overwrite`` is false, or
    ``overwrite`` is true but it is a file or a folder without ``config.json`` (not a model
    folder: a mistyped path would delete other files); or no folder
    can be created beside it (its parent cannot be made, is a file, or is not writable: tried
    with a hidden probe folder; it and the parent folders the probe made are removed at once).

    Raises:
        error: it does (the message names it and the way out).
    """
    given = output_dir
    if str(given) == "":
        raise error("the output folder is empty (''); give the path of the folder to write")
    output_dir = Path(output_dir)
    try:
        cwd: Path | None = Path.cwd().resolve()
    except FileNotFoundError:  # the current folder was deleted: nothing in use to protect, nothing relative to it
        if not output_dir.is_absolute():
            raise error(f"the current folder no longer exists, so the output {str(given)!r} is nowhere; give an absolute path") from None
        cwd = None
    out = output_dir.resolve()
    if cwd is not None and (out == cwd or out in cwd.parents):
        raise error(f"the output {str(given)!r} is the current folder or holds it ({cwd}); give a new folder's path")
    if source is not None:
        src = Path(source).resolve()
        if src == out or out in src.parents or src in out.parents:
            raise error(f"the output {output_dir} and the input {source} overlap (the same path, or one inside the other); write to another folder")
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        if not overwrite:
            what = "is not empty" if output_dir.is_dir() else "is a file, not a folder"
            raise error(f"{output_dir} already exists and {what} (pass overwrite=True, or --overwrite on the command line)")
        if not (output_dir / "config.json").is_file():
            # overwrite replaces a model folder: a mistyped path must not delete someone's other files
            what = "is a file" if not output_dir.is_dir() else "holds no config.json (it is not a model folder)"
            raise error(f"{output_dir} {what}: overwrite replaces a model folder only; remove it yourself or write to another folder")
    parent = output_dir.absolute().parent
    made = [p for p in (parent, *parent.parents) if not p.exists()]  # deepest first: removed again after the probe
    try:
        parent.mkdir(parents=True, exist_ok=True)
        Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.probe-", dir=parent)).rmdir()
    except OSError as e:
        raise error(f"cannot create the folder {output_dir}: {e.strerror or e} (in {output_dir.parent}); write to a folder you can create") from None
    finally:
        for p in made:
            with contextlib.suppress(OSError):
                p.rmdir()


@contextlib.contextmanager
def atomic_folder(output_dir: str | os.PathLike[str], *, overwrite: bool = False, error: type[Exception] = InvalidArgumentError) -> Iterator[Path]:
    """A temporary folder beside ``output_dir`` to write a whole folder into: when the
    ``with`` block ends without an exception its files get the default permissions (0666 minus
    the umask, :func:`_default_modes`) and it is renamed to ``output_dir`` (an existing
    one replaced only with ``overwrite``, and put back if the rename fails); on any exception
    it is removed, so nothing half-written is left at or next to ``output_dir``. A run killed
    outright (SIGKILL) cannot remove its folder; the next one removes such folders of processes
    that are gone (:func:`trtcore.cache_dir.remove_stale`).

    Raises:
        error: ``output_dir`` exists, is not empty and ``overwrite`` is false, or it cannot be
            created (its parent not a folder, not writable: the OS's reason in the message).
    """
    from .cache_dir import remove_stale

    output_dir = Path(output_dir)
    check_folder_free(output_dir, overwrite, error)
    tmp = output_dir.parent / f".{output_dir.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        output_dir.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(output_dir.parent)
        tmp.mkdir()
    except OSError as e:  # before any work: the folder cannot be made there at all
        raise error(f"cannot create the folder {output_dir}: {e.strerror or e} (in {output_dir.parent}); write to a folder you can create") from None
    try:
        yield tmp
        _default_modes(tmp)
        _move_into_place(tmp, output_dir, overwrite, error)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _move_into_place(tmp: Path, output_dir: Path, overwrite: bool, error: type[Exception]) -> None:
    if output_dir.exists():
        if output_dir.is_dir() and not any(output_dir.iterdir()):
            output_dir.rmdir()
        elif overwrite:
            trash = output_dir.parent / f".{output_dir.name}.old-{uuid.uuid4().hex[:8]}"
            output_dir.rename(trash)
            try:
                tmp.rename(output_dir)
            except BaseException:
                trash.rename(output_dir)  # put the old folder back
                raise
            if trash.is_dir():
                shutil.rmtree(trash, ignore_errors=True)
            else:
                trash.unlink(missing_ok=True)
            return
        else:
            check_folder_free(output_dir, overwrite, error)
    tmp.rename(output_dir)
