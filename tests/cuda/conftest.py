"""tests/cuda: the cuda backend. The helpers of tests/ (hf_models, test_device_select) are
importable from here."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = str(Path(__file__).resolve().parent.parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
