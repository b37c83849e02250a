"""``trtcore.trt``: the one module that imports TensorRT.

* ``load_trt`` picks ``tensorrt`` / ``tensorrt_rtx`` / ``trtcore.reference`` by argument,
  ``$TRTCORE_BACKEND`` or auto-detection; unknown names and missing modules give clear
  errors (``BackendNotAvailableError`` says how to install the backend);
* ``tensorrt-stubs`` installs an importable but empty ``tensorrt`` package: it must count
  as "not installed", not be returned;
* statically (``ast``) and at run time, no other module of trtcore, models, plugins or
  kernels imports ``tensorrt`` or ``tensorrt_rtx`` (``if TYPE_CHECKING:`` imports are fine).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import trtcore.reference
from trtcore import trt as trt_mod
from trtcore.errors import BackendNotAvailableError, TrtcoreError
from trtcore.trt import BACKENDS, is_available, load_trt, normalize_backend, resolve_backend

REPO = Path(__file__).resolve().parents[1]
HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None
needs_rtx = pytest.mark.skipif(not HAS_RTX, reason="tensorrt_rtx is not installed")


def _real_tensorrt_installed() -> bool:
    try:
        module = importlib.import_module("tensorrt")
    except ImportError:
        return False
    return hasattr(module, "Builder")


@pytest.fixture(autouse=True)
def _no_backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRTCORE_BACKEND", raising=False)


def _fake_trt(name: str) -> types.ModuleType:
    """A module that looks like a TensorRT build (has ``Builder``)."""
    module = types.ModuleType(name)
    module.Builder = type("Builder", (), {})  # type: ignore[attr-defined]
    return module


# --- explicit names ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["reference", "ref", "numpy", " Reference "])
def test_reference_backend(name: str) -> None:
    assert load_trt(name) is trtcore.reference
    assert normalize_backend(name) == "reference"
    assert is_available(name)


@needs_rtx
@pytest.mark.parametrize("name", ["tensorrt_rtx", "rtx", "TENSORRT_RTX"])
def test_tensorrt_rtx_backend(name: str) -> None:
    import tensorrt_rtx

    module = load_trt(name)
    assert module is tensorrt_rtx
    assert hasattr(module, "Builder") and hasattr(module, "ComputeCapability")
    assert is_available(name)


@pytest.mark.parametrize("name", ["tensorrt8", "onnx", "", "cuda13"])
def test_unknown_backend_lists_choices(name: str) -> None:
    with pytest.raises(ValueError) as info:
        load_trt(name or "  ")
    message = str(info.value)
    assert all(choice in message for choice in BACKENDS), message
    assert not isinstance(info.value, BackendNotAvailableError)


# --- environment variable ----------------------------------------------------------------


def test_env_var_selects_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTCORE_BACKEND", "reference")
    assert load_trt() is trtcore.reference
    assert resolve_backend() == "reference"
    monkeypatch.setenv("TRTCORE_BACKEND", "ref")
    assert load_trt() is trtcore.reference


@needs_rtx
def test_env_var_selects_rtx_and_argument_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    import tensorrt_rtx

    monkeypatch.setenv("TRTCORE_BACKEND", "tensorrt_rtx")
    assert load_trt() is tensorrt_rtx
    assert load_trt("reference") is trtcore.reference  # an explicit argument beats the variable


def test_env_var_unknown_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTCORE_BACKEND", "tensorflow")
    with pytest.raises(ValueError, match="tensorflow.*tensorrt, tensorrt_rtx, reference"):
        load_trt()


def test_env_var_names_missing_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", None)
    monkeypatch.setenv("TRTCORE_BACKEND", "rtx")
    with pytest.raises(BackendNotAvailableError, match=r"trtcore\[rtx\]"):
        load_trt()


# --- auto-detection ------------------------------------------------------------------------


def test_auto_detection_order(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_trt, fake_rtx = _fake_trt("tensorrt"), _fake_trt("tensorrt_rtx")
    monkeypatch.setitem(sys.modules, "tensorrt", fake_trt)
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", fake_rtx)
    assert load_trt() is fake_trt
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))  # stubs only
    assert load_trt() is fake_rtx
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert load_trt() is fake_rtx
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", None)
    assert load_trt() is trtcore.reference
    monkeypatch.setenv("TRTCORE_BACKEND", "")  # empty counts as unset
    assert resolve_backend() == "reference"


@needs_rtx
def test_auto_detection_here() -> None:
    """On this machine: real tensorrt if present, else tensorrt_rtx (never the stubs)."""
    expected = "tensorrt" if _real_tensorrt_installed() else "tensorrt_rtx"
    assert resolve_backend() == expected
    assert hasattr(load_trt(), "Builder")


# --- missing backends ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "backend, install",
    [("tensorrt", r"pip install 'trtcore\[trt\]'"), ("tensorrt_rtx", r"pip install 'trtcore\[rtx\]'")],
)
def test_not_installed(monkeypatch: pytest.MonkeyPatch, backend: str, install: str) -> None:
    monkeypatch.setitem(sys.modules, backend, None)  # import raises ImportError
    with pytest.raises(BackendNotAvailableError, match=install) as info:
        load_trt(backend)
    assert isinstance(info.value, ImportError) and isinstance(info.value, TrtcoreError)
    assert f"backend {backend!r} is not installed" in str(info.value)
    assert isinstance(info.value.__cause__, ImportError)
    assert not is_available(backend)


def test_not_installed_via_import_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same as above, by making importlib fail instead of poisoning sys.modules."""
    real = importlib.import_module

    def fake_import(name: str, package: str | None = None) -> types.ModuleType:
        if name.split(".")[0] in ("tensorrt", "tensorrt_rtx"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, package)

    monkeypatch.setattr(trt_mod.importlib, "import_module", fake_import)
    for backend in ("tensorrt", "tensorrt_rtx"):
        with pytest.raises(BackendNotAvailableError, match="install it with: pip install"):
            load_trt(backend)
    assert resolve_backend() == "reference"


def test_empty_stub_package_is_not_a_backend(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``tensorrt-stubs`` leaves an importable ``tensorrt`` with only ``.pyi`` files."""
    pkg = tmp_path / "tensorrt"
    pkg.mkdir()
    (pkg / "__init__.pyi").write_text("class Builder: ...\n")
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    with pytest.raises(BackendNotAvailableError) as info:
        load_trt("tensorrt")
    message = str(info.value)
    assert "has no Builder" in message and "pip install 'trtcore[trt]'" in message
    assert str(tmp_path) in message  # says where the impostor lives
    assert not is_available("tensorrt")


@pytest.mark.skipif(_real_tensorrt_installed(), reason="a real tensorrt is installed here")
def test_installed_stubs_here_are_not_a_backend() -> None:
    """This machine has tensorrt-stubs: ``import tensorrt`` works but is empty."""
    with pytest.raises(BackendNotAvailableError, match=r"trtcore\[trt\]"):
        load_trt("tensorrt")
    with pytest.raises(BackendNotAvailableError):
        load_trt("trt")


def test_plain_empty_module_is_not_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_rtx", types.ModuleType("tensorrt_rtx"))
    with pytest.raises(BackendNotAvailableError, match=r"has no Builder.*trtcore\[rtx\]"):
        load_trt("tensorrt_rtx")


# --- nothing else imports TensorRT ---------------------------------------------------------

TRT_MODULES = ("tensorrt", "tensorrt_rtx", "tensorrt_bindings", "tensorrt_rtx_bindings", "tensorrt_libs")
SCANNED = ("trtcore", "models", "plugins", "kernels")
ALLOWED = {Path("trtcore/trt.py")}


def _is_trt(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in TRT_MODULES  # type: ignore[union-attr]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_trt_imports(source: str, filename: str = "<src>") -> list[str]:
    """``file:line: statement`` for every TensorRT import that runs at run time."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the else branch does run
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(f"{filename}:{node.lineno}: import {a.name}" for a in node.names if _is_trt(a.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_trt(node.module):
            found.append(f"{filename}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0].value
            if fname in ("import_module", "__import__") and isinstance(arg, str) and _is_trt(arg):
                found.append(f"{filename}:{node.lineno}: {fname}({arg!r})")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source, filename))
    return found


def test_import_scanner_itself() -> None:
    src = textwrap.dedent(
        """
        from __future__ import annotations
        import typing
        from typing import TYPE_CHECKING
        import numpy, tensorrt as trt            # 5: flagged
        from tensorrt_rtx import Builder         # 6: flagged
        from . import tensorrt                   # relative: ours, fine
        if TYPE_CHECKING:
            import tensorrt as trt_types         # fine
        else:
            import tensorrt_rtx                  # 11: runs
        if typing.TYPE_CHECKING:
            from tensorrt import ITensor         # fine
        def lazy():
            import tensorrt.plugin               # 15: runs when called
            return importlib.import_module("tensorrt_rtx")   # 16
        import tensorrtx_unrelated
        """
    )
    lines = [int(f.split(":")[1]) for f in runtime_trt_imports(src)]
    assert lines == [5, 6, 11, 15, 16]


def _scanned_files() -> list[Path]:
    files = [p for d in SCANNED if (REPO / d).is_dir() for p in sorted((REPO / d).rglob("*.py"))]
    return [p for p in files if p.relative_to(REPO) not in ALLOWED]


def test_no_runtime_tensorrt_imports_outside_trt_py() -> None:
    files = _scanned_files()
    assert any(p.relative_to(REPO) == Path("trtcore/reference/network.py") for p in files)
    found = [f for p in files for f in runtime_trt_imports(p.read_text(), str(p.relative_to(REPO)))]
    assert not found, "only trtcore/trt.py may import TensorRT at run time:\n" + "\n".join(found)
    # and trt.py does it through importlib, by name
    assert runtime_trt_imports((REPO / "trtcore/trt.py").read_text()) == []


def test_importing_trtcore_does_not_import_tensorrt() -> None:
    """Run time check: import every trtcore module, then look at sys.modules."""
    code = textwrap.dedent(
        f"""
        import importlib, pkgutil, sys
        import trtcore
        failed = []
        for pkg in ("trtcore", "trtcore.reference", "trtcore.runtime", "trtcore.models", "trtcore.plugins", "trtcore.kernels"):
            try:
                module = importlib.import_module(pkg)
            except ImportError as exc:
                failed.append(f"{{pkg}}: {{exc}}"); continue
            for info in pkgutil.iter_modules(getattr(module, "__path__", []), pkg + "."):
                try:
                    importlib.import_module(info.name)
                except ImportError as exc:  # optional dependencies
                    failed.append(f"{{info.name}}: {{exc}}")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {TRT_MODULES!r})
        print("LOADED", loaded)
        print("FAILED", failed)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout, out.stdout
