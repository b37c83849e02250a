"""A plugin from another package registers through the entry-point group ``trtcore.plugins``.

The test writes a tiny installed distribution (a ``*.dist-info`` folder with
``entry_points.txt``) on ``sys.path``, as pip would, whose module defines a plugin class;
trtcore finds it, registers its creator in the reference plugin registry, and a network
built with it runs the plugin's NumPy reference.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import trtcore.reference as ref
from trtcore.plugins.base import ENTRY_POINT_GROUP, NAMESPACE, PluginError, create, load_entry_point_plugins
from trtcore.reference.evaluator import evaluate


def _install(tmp_path: Path, body: str, name: str) -> None:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    info = tmp_path / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nscale = {name}:ScaleBy\n")


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return tmp_path


def test_entry_point_plugin_is_registered_and_runs(on_path: Path) -> None:
    _install(on_path, '''
        from dataclasses import dataclass
        import numpy as np
        from trtcore.plugins.base import Plugin

        @dataclass
        class ScaleBy(Plugin):
            plugin_name = "thirdparty_scale_by"
            factor: float = 1.0

            def output_dtypes(self, dtypes):
                return [dtypes[0]]

            def output_shapes(self, shapes):
                return [list(shapes[0])]

            def reference(self, x):
                return [x * np.float32(self.factor)]
    ''', "thirdparty_ep_ok")
    loaded = load_entry_point_plugins(ref)
    cls = next(c for c in loaded if c.plugin_name == "thirdparty_scale_by")
    assert ref.get_plugin_registry().get_creator("thirdparty_scale_by", "1", NAMESPACE) is not None
    net = ref.Builder().create_network(1)
    x = net.add_input("x", ref.float32, (-1, 3))
    layer = net.add_plugin_v3([x], [], create(cls(factor=2.5), ref))
    net.mark_output(layer.get_output(0))
    data = np.random.default_rng().standard_normal((4, 3)).astype(np.float32)
    out = evaluate(net, {"x": data})[layer.get_output(0).name]
    np.testing.assert_array_equal(out, data * np.float32(2.5))


def test_entry_point_that_is_not_a_plugin_is_refused(on_path: Path) -> None:
    _install(on_path, "class ScaleBy:\n    pass\n", "thirdparty_ep_bad")
    with pytest.raises(PluginError, match="not a trtcore Plugin"):
        load_entry_point_plugins(ref)
    sys.modules.pop("thirdparty_ep_bad", None)


def test_register_all_registers_the_builtin_plugins() -> None:
    from trtcore.plugins import builtin_plugins, register_all

    classes = register_all(ref)
    for cls in builtin_plugins():
        assert cls in classes
        assert ref.get_plugin_registry().get_creator(cls.plugin_name, cls.plugin_version, NAMESPACE) is not None
    import tensorrt_rtx

    assert register_all(tensorrt_rtx) == []  # RTX's Python network cannot take plugins
