"""The one TensorRT logger: TensorRT's messages go to :mod:`logging` (logger ``trtcore.trt``).

TensorRT keeps the first ``ILogger`` a process gives it (builder and runtime alike), so
:func:`trt_logger` hands out one logger per TensorRT module. Its messages are logged as
``[TensorRT] <message>`` at the matching :mod:`logging` level (``INFO`` and ``VERBOSE`` at
``DEBUG``); with no logging configured, Python's last-resort handler prints warnings and
errors to stderr. The recent warnings and errors are kept for error messages:
``logger.messages`` (the last 32, cleared by the caller before an operation) and
``logger.errors`` (every error since the process started; a caller remembers the length
before an operation and reads what came after).

The reference module (:mod:`trtcore.reference`) has no ``ILogger``: there the logger is its
own ``Logger``, which prints warnings itself.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

__all__ = ["LOGGER_NAME", "trt_logger"]

#: the :mod:`logging` logger TensorRT's messages go to
LOGGER_NAME = "trtcore.trt"
_LOG = logging.getLogger(LOGGER_NAME)

#: TensorRT severity name -> logging level
_LEVELS = {
    "INTERNAL_ERROR": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "WARNING": logging.WARNING,
    "INFO": logging.DEBUG,
    "VERBOSE": logging.DEBUG,
}

_LOGGERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _severity_name(severity: Any) -> str:
    name = getattr(severity, "name", None)
    if isinstance(name, str):
        return name
    names = ("INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE")  # TensorRT's numbering
    try:
        return names[int(severity)]
    except (TypeError, ValueError, IndexError):
        return "VERBOSE"


def _make(trt: Any) -> Any:
    base = trt.ILogger

    class TrtLogger(base):  # type: ignore[misc, valid-type]
        """``trt.ILogger`` forwarding to :mod:`logging`, remembering warnings and errors."""

        def __init__(self) -> None:
            base.__init__(self)
            self.messages: collections.deque[str] = collections.deque(maxlen=32)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            level = _LEVELS.get(_severity_name(severity), logging.DEBUG)
            _LOG.log(level, "[TensorRT] %s", msg)
            if level >= logging.WARNING:
                self.messages.append(msg)
            if level >= logging.ERROR:
                self.errors.append(msg)

    return TrtLogger()


def trt_logger(trt: Any) -> Any:
    """The process's logger for the TensorRT module ``trt`` (``tensorrt``, ``tensorrt_rtx``;
    for :mod:`trtcore.reference` its own ``Logger``), created on first use.

    Returns:
        A ``trt.ILogger`` with ``messages`` (recent warnings and errors) and ``errors``
        (every error), see the module docstring.
    """
    name = getattr(trt, "__name__", repr(trt))
    with _LOCK:
        if name not in _LOGGERS:
            if getattr(trt, "ILogger", None) is None:  # the reference module: its Logger prints already
                _LOGGERS[name] = trt.Logger(trt.Logger.WARNING)
            else:
                _LOGGERS[name] = _make(trt)
        return _LOGGERS[name]
