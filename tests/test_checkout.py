"""trtcore.checkout: the checkout's top-level kernels/ must not shadow the PyPI package
``kernels`` that transformers 5.25+ imports."""

from __future__ import annotations

import subprocess
import sys

from trtcore.checkout import ROOT


def _kernels_origin(prelude: str) -> str:
    """Where ``import kernels`` would come from in a fresh interpreter started in the checkout's
    root with that root first on ``sys.path`` (as ``python -m`` there puts it), after ``prelude``."""
    code = (
        "import sys, importlib.util as u; sys.path.insert(0, ''); sys.path.insert(0, sys.argv[1]); "
        f"{prelude}; s = u.find_spec('kernels'); print(s.origin if s else None)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_checkout_root_shadows_kernels_until_dropped() -> None:
    ours = str(ROOT / "kernels" / "__init__.py")
    assert _kernels_origin("pass") == ours  # the failure this guards against, reproduced
    assert _kernels_origin("from trtcore.checkout import drop_checkout_root; drop_checkout_root()") != ours


def test_the_cli_drops_the_checkout_root_before_a_command_runs() -> None:
    code = (
        "import sys, importlib.util as u; sys.path.insert(0, sys.argv[1]); from trtcore import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "s = u.find_spec('kernels'); print(s.origin if s else None)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] != str(ROOT / "kernels" / "__init__.py")
