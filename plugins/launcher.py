"""Compiling, loading and launching the kernels of one ``kernels/*.cu`` file for a plugin.

:class:`KernelLauncher` compiles the file once per set of defines (NVRTC, disk-cached by
:func:`trtcore.kernels.compile_kernel`), loads each kernel once, and launches it
programmatically (PDL: every kernel of ``kernels/`` starts with ``PDL_WAIT()``), reloading it
when the current CUDA context changed.
"""

from __future__ import annotations

import threading
from typing import Any

Defines = tuple[tuple[str, int], ...]


class KernelLauncher:
    """The kernels of ``kernels/<source>.cu``.

    Args:
        source: the kernel file's name without ``.cu`` (e.g. ``"wq_gemm"``).
    """

    def __init__(self, source: str):
        self.source = source
        self._lock = threading.Lock()
        self._modules: dict[Defines, Any] = {}
        self._functions: dict[tuple[Defines, str], Any] = {}

    def function(self, defines: Defines, name: str, reload: bool = False) -> Any:
        """The loaded kernel ``name`` of the variant ``defines`` (``reload`` after the current
        context changed)."""
        fn = None if reload else self._functions.get((defines, name))
        if fn is None:
            with self._lock:
                module = self._modules.get(defines)
                if module is None:
                    from trtcore import kernels

                    module = self._modules[defines] = kernels.compile_kernel(self.source, defines=dict(defines))
                fn = module.function(name)
                self._functions[(defines, name)] = fn
        return fn

    def launch(
        self, defines: Defines, name: str, grid: tuple[int, ...], block: tuple[int, ...], args: list, stream: int, shared_mem: int = 0
    ) -> None:
        """Launch ``name`` on ``stream`` with PDL (``args`` and ``shared_mem``, dynamic shared
        memory in bytes, as :meth:`trtcore.kernels.KernelFunction.launch` takes them)."""
        try:  # kernels start with PDL_WAIT
            self.function(defines, name).launch(grid, block, args, shared_mem=shared_mem, stream=stream, programmatic=True)
        except Exception as exc:  # loaded in another context: load it here
            if getattr(exc, "result", None) != "CUDA_ERROR_INVALID_CONTEXT":
                raise
            self.function(defines, name, reload=True).launch(grid, block, args, shared_mem=shared_mem, stream=stream, programmatic=True)


__all__ = ["Defines", "KernelLauncher"]
