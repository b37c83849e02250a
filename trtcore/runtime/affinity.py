"""CPU affinity of the thread that runs the step loop.

A graphed decode step leaves the host some tens of microseconds of Python per step (the
scheduler, the staging, the sampler's records, the outputs: :func:`trtcore.bench.host_time_per_step`).
When the operating system moves that thread between cores its caches start cold, and on a
virtual machine some cores are slower than others. Serving stacks bind their engine processes
for that reason (TensorRT-LLM binds its workers to the GPU's NUMA node,
``TLLM_NUMA_AWARE_WORKER_AFFINITY``). On the lent H200's 16-core VM, the host work per step of
SmolLM2-135M had a median of 40.3 us over 13 runs with the stepping thread pinned, against
50.8 us over 23 runs unpinned. Both ranged up to about 80 us: pinning lowers the median but
does not remove the machine's slow phases (``bench/results/h200-2026-12-02-session4``). It is
therefore off by default.

:func:`pin_thread` pins the calling thread; ``"auto"`` picks one CPU of those the thread may
use, on the GPU's NUMA node where Linux says which (``/sys/bus/pci/devices/<bus id>/local_cpulist``).
Threads that the pinned thread starts afterwards inherit its CPU set (Linux semantics); threads
started before (the CUDA driver's) keep theirs. :class:`pinned` pins for a ``with`` block and
restores the thread's previous set after it.

Linux only (``os.sched_setaffinity``): elsewhere ``"auto"`` does nothing and an explicit list
is refused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["AUTO", "gpu_local_cpus", "host_gpu_index", "parse_cpu_list", "pin_thread", "pinned", "resolve_cpus"]

#: the ``cpu_affinity`` value that lets trtcore choose one CPU
AUTO = "auto"

_log = logging.getLogger(__name__)


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a Linux CPU list (``"0-3,8,10-11"``, the format of ``local_cpulist`` and
    ``taskset -c``; see ``cpuset(7)``, "List format").

    Raises:
        InvalidArgumentError: a part that is not ``N`` or ``N-M`` with ``0 <= N <= M``.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise InvalidArgumentError(f"CPU list {text!r}: {part!r} is not a CPU number or a range N-M") from None
        if a < 0 or b < a:
            raise InvalidArgumentError(f"CPU list {text!r}: {part!r} is not a range N-M with 0 <= N <= M")
        cpus.update(range(a, b + 1))
    return cpus


_PCI = Path("/sys/bus/pci/devices")


def _pci_bus_id(device: int) -> str | None:
    """CUDA device ``device``'s PCI bus id as sysfs names it (``"0000:19:00.0"``), or None."""
    try:
        from .. import gpu

        rt = gpu.cuda_bindings("runtime")
        bus_id = gpu.call("cudaDeviceGetPCIBusId", rt.cudaDeviceGetPCIBusId, 32, int(device))
    except Exception:  # no GPU, no CUDA runtime
        return None
    return (bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)).rstrip("\x00").strip().lower() or None


def gpu_local_cpus(device: int = 0) -> set[int] | None:
    """The CPUs on CUDA device ``device``'s NUMA node (Linux sysfs ``local_cpulist`` of its PCI
    bus id), or None where that is unknown (no GPU, no CUDA runtime, no sysfs). Never raises."""
    bus_id = _pci_bus_id(device)
    if bus_id is None:
        return None
    try:
        cpus = parse_cpu_list((_PCI / bus_id / "local_cpulist").read_text())
    except Exception:  # no sysfs entry: no preference
        return None
    return cpus or None


def host_gpu_index(device: int = 0) -> int:
    """CUDA device ``device``'s place among the host's NVIDIA display / 3D controllers in PCI
    order (sysfs: vendor ``0x10de``, class ``0x03xxxx``), the same in every process whatever
    ``CUDA_VISIBLE_DEVICES`` says; ``device`` itself where sysfs does not tell. Never raises."""
    bus_id = _pci_bus_id(device)
    try:
        gpus = sorted(
            d.name for d in _PCI.iterdir() if (d / "vendor").read_text().strip() == "0x10de" and (d / "class").read_text().startswith("0x03")
        )
        return gpus.index(bus_id) if bus_id in gpus else int(device)
    except Exception:
        return int(device)


def _allowed() -> set[int] | None:
    getter = getattr(os, "sched_getaffinity", None)
    return set(getter(0)) if getter is not None else None


def resolve_cpus(cpus: str | Iterable[int], device: int = 0) -> set[int] | None:
    """The CPU set ``cpus`` stands for.

    * ``"auto"``: one CPU of the calling thread's allowed set, preferring the GPU's NUMA node
      (:func:`gpu_local_cpus`): the highest-numbered one less the GPU's index on the host
      (:func:`host_gpu_index`), so that one engine per GPU, each in its own process, takes a
      CPU of its own, and CPU 0, where interrupts tend to land, is the last choice. None where
      affinity cannot be set (not Linux).
    * a CPU list string (``"2,5-7"``) or integers: that set.

    Raises:
        InvalidArgumentError: an empty set, a CPU the thread may not use (the message lists
            those it may), an explicit set where affinity cannot be set, another string.
    """
    allowed = _allowed()
    if isinstance(cpus, str):
        if cpus.strip().lower() == AUTO:
            if allowed is None:
                return None
            local = gpu_local_cpus(device)
            pool = sorted((allowed & local) or allowed) if local else sorted(allowed)
            return {pool[(len(pool) - 1 - host_gpu_index(device)) % len(pool)]}
        try:
            wanted = parse_cpu_list(cpus)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"cpu_affinity must be 'auto' or a CPU list such as '2,5-7'; got {cpus!r} ({exc})") from None
    else:
        try:
            wanted = {int(c) for c in cpus}
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"cpu_affinity must be 'auto', a CPU list such as '2,5-7', or CPU numbers; got {cpus!r}") from None
        if any(c < 0 for c in wanted):
            raise InvalidArgumentError(f"cpu_affinity: CPU numbers are >= 0, got {sorted(wanted)}")
    if not wanted:
        raise InvalidArgumentError(f"cpu_affinity {cpus!r} names no CPU")
    if allowed is None:
        raise InvalidArgumentError(f"cpu_affinity {cpus!r}: this platform cannot set a thread's CPU affinity (os.sched_setaffinity is Linux only)")
    outside = wanted - allowed
    if outside:
        raise InvalidArgumentError(f"cpu_affinity: CPU(s) {sorted(outside)} are not among those this thread may use ({_ranges(allowed)})")
    return wanted


def pin_thread(cpus: str | Iterable[int] = AUTO, device: int = 0) -> tuple[int, ...] | None:
    """Pin the calling thread to ``cpus`` (:func:`resolve_cpus`; ``device`` is the CUDA device
    the thread drives). Returns the CPUs, sorted, or None where nothing was pinned (``"auto"``
    on a platform without affinity, or one that refused: logged as a warning).

    Raises:
        InvalidArgumentError: as :func:`resolve_cpus`; an explicit set the system refused
            (the OS's message).
    """
    chosen = resolve_cpus(cpus, device)
    if chosen is None:
        return None
    try:
        os.sched_setaffinity(0, chosen)
    except OSError as exc:
        if isinstance(cpus, str) and cpus.strip().lower() == AUTO:
            _log.warning("cpu_affinity='auto': the system refused to pin the thread to CPU %s (%s); it stays unpinned", sorted(chosen), exc)
            return None
        raise InvalidArgumentError(f"cpu_affinity {sorted(chosen)}: the system refused it ({exc})") from None
    return tuple(sorted(chosen))


class pinned:
    """``with pinned("auto"):`` the calling thread runs on :func:`pin_thread`'s CPUs inside the
    block and on its former set after it (for timing a loop without pinning a whole process:
    threads started inside the block keep the narrow set). ``cpus`` None: nothing changes.
    ``.cpus`` is what was pinned (None if nothing)."""

    def __init__(self, cpus: str | Iterable[int] | None = AUTO, device: int = 0) -> None:
        self._want, self._device = cpus, device
        self._before: set[int] | None = None
        self.cpus: tuple[int, ...] | None = None

    def __enter__(self) -> pinned:
        if self._want is not None:
            self._before = _allowed()
            self.cpus = pin_thread(self._want, self._device)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cpus is not None and self._before is not None:
            os.sched_setaffinity(0, self._before)


def _ranges(cpus: set[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"`` (the CPU list format)."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
