"""The one symbolic-dimension class: a dimension in a plugin's output-shape rule.

A plugin's :meth:`~trtcore.plugins.base.Plugin.output_shapes` computes its output shapes from
its input shapes with ``+``, ``-``, ``*``, ``//`` and :meth:`Dim.cdiv`. The same rule runs

* inside TensorRT, where a :class:`Dim` wraps an ``IDimensionExpr`` and the arithmetic builds
  expressions with the ``IExprBuilder`` (``DimensionOperation.SUM``, ``SUB``, ``PROD``,
  ``FLOOR_DIV``, ``CEIL_DIV``; TensorRT "IPluginV3OneBuild.get_output_shapes");
* in :mod:`trtcore.reference`, where a :class:`Dim` wraps an ``int``, or ``None`` when the
  dimension is only known at run time (a network input's ``-1``); an unknown operand makes
  the result unknown.
"""

from __future__ import annotations

from typing import Any

from .errors import NetworkError

__all__ = ["Dim"]


class Dim:
    """A dimension: an int, unknown (``None``), or a TensorRT ``IDimensionExpr``.

    Args:
        value: the size; ``None`` or a negative size (TensorRT's ``-1``) means unknown.
        expr: the ``IDimensionExpr`` (inside TensorRT), with ``builder`` (the ``IExprBuilder``)
            and ``trt`` (the TensorRT module, for ``DimensionOperation``).

    Supports ``+``, ``-``, ``*``, ``//`` (floor division) and :meth:`cdiv` with ints and other
    ``Dim``\\ s; ``int(dim)`` gives a known size.
    """

    __slots__ = ("value", "expr", "_builder", "_trt")

    def __init__(self, value: int | None = None, expr: Any = None, builder: Any = None, trt: Any = None):
        self.value = None if value is None or value < 0 else int(value)
        self.expr, self._builder, self._trt = expr, builder, trt

    @staticmethod
    def of(d: Dim | int) -> int | None:
        """The size of an int or a value :class:`Dim` (``None`` when unknown)."""
        if isinstance(d, int):
            return d
        return getattr(d, "value", None)

    def _lift(self, other: Dim | int) -> Dim:
        if isinstance(other, Dim):
            return other
        if self._builder is not None:
            return Dim(expr=self._builder.constant(int(other)), builder=self._builder, trt=self._trt)
        return Dim(int(other))

    def _op(self, other: Dim | int, name: str, fn: Any) -> Dim:
        o = self._lift(other)
        if self._builder is not None:
            op = getattr(self._trt.DimensionOperation, name)
            return Dim(expr=self._builder.operation(op, self.expr, o.expr), builder=self._builder, trt=self._trt)
        if self.value is None or o.value is None:
            return Dim(None)
        return Dim(fn(self.value, o.value))

    def __add__(self, other: Dim | int) -> Dim:
        return self._op(other, "SUM", lambda a, b: a + b)

    def __sub__(self, other: Dim | int) -> Dim:
        return self._op(other, "SUB", lambda a, b: a - b)

    def __mul__(self, other: Dim | int) -> Dim:
        return self._op(other, "PROD", lambda a, b: a * b)

    def __floordiv__(self, other: Dim | int) -> Dim:
        return self._op(other, "FLOOR_DIV", lambda a, b: a // b)

    def cdiv(self, other: Dim | int) -> Dim:
        """Ceiling division."""
        return self._op(other, "CEIL_DIV", lambda a, b: -(-a // b))

    def __int__(self) -> int:
        """The size.

        Raises:
            NetworkError: the dimension is only known at run time (or is a TensorRT expression).
        """
        if self.value is None:
            raise NetworkError("dimension is only known at run time")
        return self.value

    def __repr__(self) -> str:
        return f"Dim({self.value if self._builder is None else self.expr})"
