"""``Weights`` of the cuda backend: the reference's, with a fast pointer form.

``Weights(DataType, pointer, count)`` copies the ``count`` elements at ``pointer`` with one
NumPy copy of a zero-copy view (the reference goes through ``bytes``, several times slower,
which matters for 8B-parameter networks); ``Weights(array)`` is unchanged.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..reference.types import DataType, nptype
from ..reference.types import Weights as _ReferenceWeights


class Weights(_ReferenceWeights):
    """Constant data (``tensorrt.Weights``); see the module docstring."""

    def __init__(self, *args: Any) -> None:
        if len(args) != 3:
            super().__init__(*args)
            return
        dtype, ptr, count = DataType(args[0]), int(args[1]), int(args[2])
        nbytes = count * dtype.itemsize
        if nbytes:
            view = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))
            self.array = view.copy().view(nptype(dtype))
        else:
            self.array = np.zeros(0, dtype=nptype(dtype))
        self.dtype = dtype
