"""The source checkout's top-level folders on ``sys.path``.

trtcore's checkout keeps ``kernels/``, ``plugins/`` and ``models/`` as top-level folders
(installed as ``trtcore.kernels`` / ``trtcore.plugins`` / ``trtcore.models``: DESIGN.md, Layout).
When the checkout's root is on ``sys.path`` (``python -m trtcore`` or ``python -m pytest`` run
there put the working directory first), ``kernels/`` shadows the PyPI package ``kernels``
(Hugging Face's hub kernels), which transformers 5.25+ depends on and imports with its models:
``from kernels import CUDAProperties`` then fails inside transformers.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: the checkout's root, where this module lives in a source checkout (editable install)
ROOT = Path(__file__).resolve().parent.parent


def drop_checkout_root() -> None:
    """Remove the checkout's root (and ``""``, the working directory, when it is that root)
    from ``sys.path`` if it holds trtcore's own ``kernels/`` folder. trtcore is still found
    through its install; an installed wheel (no ``kernels/`` beside ``trtcore/``) is untouched."""
    if not (ROOT / "kernels" / "wq_gemm.cu").is_file() or not (ROOT / "trtcore").is_dir():
        return

    def is_root(entry: str) -> bool:
        try:
            return Path(entry or ".").resolve() == ROOT
        except OSError:
            return False

    sys.path[:] = [p for p in sys.path if not is_root(p)]
