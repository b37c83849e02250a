"""The layering of trtcore's modules (issue 7, Build 4): no import cycle, and nothing in
``kernels/`` or ``plugins/`` imports a layer above it.

The import graph is read from the sources with :mod:`ast`: every ``import`` statement,
including those inside functions (a lazy import is still a dependency), except those under
``if TYPE_CHECKING:`` (annotations only). Relative imports are resolved against the
package layout of ``pyproject.toml`` (``plugins/`` is ``trtcore.plugins``, ...). The
subprocess tests import each module of ``kernels/`` and ``plugins/`` in a fresh interpreter,
use its cheap entry points, and look at ``sys.modules``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: package -> folder, as ``[tool.setuptools] package-dir`` in pyproject.toml
PACKAGES = {"trtcore": "trtcore", "trtcore.plugins": "plugins", "trtcore.kernels": "kernels", "trtcore.models": "models"}
#: the layers above kernels/ and plugins/ (a module or a package prefix)
UPPER = ("trtcore.llm", "trtcore.runtime", "trtcore.default_model", "trtcore.cli", "trtcore.models", "trtcore.ops", "trtcore.builder", "trtcore.check", "trtcore.chat")
#: the low-level helpers every layer may import: they import only each other
LOW_LEVEL = ("trtcore.errors", "trtcore.dtypes", "trtcore.gpu", "trtcore.dims", "trtcore.log", "trtcore.fileio", "trtcore.cache_dir")


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (source file, is a package)."""
    out: dict[str, tuple[Path, bool]] = {}
    for pkg, folder in PACKAGES.items():
        base = REPO / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if folder == "trtcore" and parts[0] in ("plugins", "kernels", "models"):
                continue  # not packaged from there
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = (path, is_pkg)
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path, is_pkg: bool, known: dict[str, tuple[Path, bool]]) -> set[str]:
    """The trtcore modules ``name`` imports (anywhere in the file but under TYPE_CHECKING)."""
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.orelse:
                    visit_stmt(stmt)
                continue
            visit_stmt(child)

    def visit_stmt(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known)  # from pkg import submodule
        visit(node)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {n: _imports(n, p, is_pkg, known) for n, (p, is_pkg) in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _is_upper(module: str) -> bool:
    return any(module == u or module.startswith(u + ".") for u in UPPER)


def test_the_graph_sees_imports_the_way_python_does() -> None:
    """The reader itself, on modules whose imports are known: relative, lazy and TYPE_CHECKING ones."""
    g = _graph()
    assert "trtcore.errors" in g["trtcore.kernels.errors"]  # absolute
    assert "trtcore.kernels.errors" in g["trtcore.kernels.nvrtc"]  # relative, from .errors
    assert "trtcore.kernels.launch" in g["trtcore.kernels.nvrtc"]  # lazy, inside CompiledKernel.function
    assert "trtcore.kernels.nvrtc" not in g["trtcore.kernels.launch"]  # only under TYPE_CHECKING
    assert "trtcore.kernels" in g["trtcore.plugins.rope"]  # from trtcore import kernels
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m.startswith(("trtcore.kernels", "trtcore.plugins"))))
def test_kernels_and_plugins_depend_on_no_upper_layer(module: str) -> None:
    """Every module reachable from a kernels/ or plugins/ module, lazy imports included."""
    g = _graph()
    upper = sorted(m for m in _closure(g, module) if _is_upper(m))
    assert upper == [], f"{module} reaches {upper}"


@pytest.mark.parametrize("module", LOW_LEVEL)
def test_low_level_helpers_import_only_each_other(module: str) -> None:
    g = _graph()
    trtcore_deps = sorted(m for m in _closure(g, module) if m not in LOW_LEVEL)
    assert trtcore_deps == [], f"{module} reaches {trtcore_deps}"


_PROBE = """
import importlib, json, sys
mod = importlib.import_module(sys.argv[1])
# the cheap entry points, which may import lazily
import trtcore.kernels as k
k.kernel_cache_dir(); k.list_kernels(); k.variants("rope")
import trtcore.plugins as p
p.builtin_plugins()
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m.startswith(("trtcore.kernels", "trtcore.plugins"))))
def test_importing_kernels_and_plugins_loads_no_upper_layer(module: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _PROBE, module], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert module in loaded
    upper = [m for m in loaded if _is_upper(m)]
    assert upper == [], f"importing {module} loaded {upper}"
