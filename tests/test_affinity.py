"""CPU affinity of the stepping thread (:mod:`trtcore.runtime.affinity`, ``LLM(cpu_affinity=...)``,
``trtcore serve --cpu-affinity``). Every pin happens in a thread of its own, so that pytest's
thread keeps its CPUs; the expected sets come from ``os.sched_getaffinity``, not from the code
under test."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hf_models import hf_models  # noqa: F401  (fixture)

from trtcore import LLM, SamplingParams
from trtcore.errors import InvalidArgumentError
from trtcore.runtime import affinity
from trtcore.runtime.affinity import parse_cpu_list, pin_thread, pinned, resolve_cpus

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux only")


def in_thread(fn: Callable[[], Any]) -> tuple[Any, set[int]]:
    """``fn()`` in a new thread: its result and that thread's CPU set afterwards (exceptions re-raised)."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["result"] = fn()
            box["cpus"] = os.sched_getaffinity(0)
        except BaseException as exc:  # noqa: BLE001  (handed to the test's thread)
            box["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"], box["cpus"]


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", {0}), ("0-3", {0, 1, 2, 3}), ("1,4-5, 9", {1, 4, 5, 9}), ("2-2", {2}), ("0-1,\n", {0, 1}), ("", set())],
)
def test_cpu_list_format(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "-1", "1-b", "1--2"])
def test_cpu_list_refuses_what_is_no_cpu_list(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="CPU list"):
        parse_cpu_list(text)


def test_auto_pins_one_allowed_cpu_and_leaves_other_threads() -> None:
    before = os.sched_getaffinity(0)
    result, cpus = in_thread(lambda: pin_thread("auto"))
    assert len(cpus) == 1 and cpus <= before
    assert result == tuple(cpus)
    assert os.sched_getaffinity(0) == before  # the caller's thread is untouched


def test_auto_prefers_the_gpus_numa_node(monkeypatch: pytest.MonkeyPatch) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU allowed: nothing to prefer")
    local = {allowed[0]}  # the lowest one: 'auto' would take the highest without the NUMA hint
    monkeypatch.setattr(affinity, "gpu_local_cpus", lambda device=0: local)
    assert resolve_cpus("auto") == local
    monkeypatch.setattr(affinity, "gpu_local_cpus", lambda device=0: {10**6})  # none allowed: any allowed one
    assert resolve_cpus("AUTO") <= set(allowed)
    monkeypatch.setattr(affinity, "gpu_local_cpus", lambda device=0: None)
    assert resolve_cpus("auto") == {allowed[-1]}
    assert resolve_cpus("auto", device=1) == {allowed[-2]}  # a second engine on another GPU takes another CPU


def test_explicit_cpus_as_list_and_as_text() -> None:
    cpu = min(os.sched_getaffinity(0))
    assert in_thread(lambda: pin_thread([cpu]))[1] == {cpu}
    assert in_thread(lambda: pin_thread(str(cpu)))[1] == {cpu}


@pytest.mark.parametrize("bad", ["everywhere", "x-1", [-1], ["a"], []])
def test_bad_values_are_refused_naming_them(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="cpu_affinity|CPU list"):
        resolve_cpus(bad)


def test_a_cpu_outside_the_allowed_set_is_refused_with_the_allowed_ones() -> None:
    allowed = os.sched_getaffinity(0)
    outside = max(allowed) + 1
    with pytest.raises(InvalidArgumentError, match=rf"\[{outside}\] are not among those this thread may use"):
        resolve_cpus([outside])


def test_pinned_restores_the_threads_set() -> None:
    def body() -> tuple[set[int], set[int], tuple[int, ...] | None]:
        with pinned("auto") as pin:
            inside = os.sched_getaffinity(0)
        return inside, os.sched_getaffinity(0), pin.cpus

    before = os.sched_getaffinity(0)
    (inside, after, cpus), _ = in_thread(body)
    assert len(inside) == 1 and cpus == tuple(inside)
    assert after == before
    with pinned(None) as pin:  # None: nothing happens
        assert pin.cpus is None and os.sched_getaffinity(0) == before


def test_llm_pins_the_constructing_thread(hf_models: Any) -> None:  # noqa: F811
    d = hf_models.dir("qwen2_bias")
    before = os.sched_getaffinity(0)
    cpu = max(before)

    def build_and_run() -> tuple[Any, Any]:
        llm = LLM(d, backend="reference", device="cpu", kv_cache="paged", progress=False, cpu_affinity=[cpu])
        out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        return llm.cpu_affinity, out[0].outputs[0].token_ids

    (pinned_to, tokens), cpus = in_thread(build_and_run)
    assert pinned_to == (cpu,) and cpus == {cpu} and len(tokens) == 2
    assert os.sched_getaffinity(0) == before
    assert LLM(d, backend="reference", device="cpu", progress=False).cpu_affinity is None


def test_llm_refuses_a_bad_affinity_before_building(hf_models: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    d = hf_models.dir("qwen2_bias")

    def no_build(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("built before the check")

    monkeypatch.setattr(LLM, "_make_executor", no_build)
    with pytest.raises(InvalidArgumentError, match="cpu_affinity"):
        LLM(d, backend="reference", device="cpu", progress=False, cpu_affinity="fastest")


def test_serve_passes_the_flag_to_the_engine_process() -> None:
    from trtcore.cli import _parser
    from trtcore.serve.server import make_llm_factory

    args = _parser().parse_args(["serve", "--backend", "reference", "--cpu-affinity", "auto"])
    assert make_llm_factory(args).args[2]["cpu_affinity"] == "auto"
    args = _parser().parse_args(["serve", "--backend", "reference"])
    assert "cpu_affinity" not in make_llm_factory(args).args[2]


def test_host_gpu_index_counts_nvidia_display_controllers_in_pci_order(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    devices = {  # bus id: (vendor, class, local_cpulist)
        "0000:03:00.0": ("0x10de", "0x030200", "0-7"),
        "0000:00:1f.0": ("0x8086", "0x060100", ""),  # not a GPU
        "0000:41:00.0": ("0x10de", "0x030200", "8-15"),
        "0000:40:00.0": ("0x10de", "0x040300", ""),  # NVIDIA audio, not a GPU
    }
    for bus, (vendor, klass, cpus) in devices.items():
        d = tmp_path / bus
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
        (d / "local_cpulist").write_text(cpus + "\n")
    monkeypatch.setattr(affinity, "_PCI", tmp_path)
    # CUDA_VISIBLE_DEVICES=1 in a second process: its device 0 is the host's second GPU
    monkeypatch.setattr(affinity, "_pci_bus_id", lambda device: "0000:41:00.0")
    assert affinity.host_gpu_index(0) == 1
    assert affinity.gpu_local_cpus(0) == set(range(8, 16))
    monkeypatch.setattr(affinity, "_pci_bus_id", lambda device: "0000:03:00.0")
    assert affinity.host_gpu_index(0) == 0 and affinity.gpu_local_cpus(0) == set(range(8))
    monkeypatch.setattr(affinity, "_pci_bus_id", lambda device: None)  # no GPU: the ordinal given
    assert affinity.host_gpu_index(3) == 3 and affinity.gpu_local_cpus(3) is None
