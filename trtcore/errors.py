"""Exceptions raised by trtcore.

Every error trtcore raises on bad input derives from :class:`TrtcoreError`, so a caller
(or the CLI, which prints one line per error) can catch them all at once. Each class also
derives from the closest built-in exception, so ``except ValueError`` keeps working.
"""

from __future__ import annotations


class TrtcoreError(Exception):
    """Base class of every error trtcore raises on purpose."""


class BackendNotAvailableError(TrtcoreError, ImportError):
    """The requested TensorRT module (``tensorrt``, ``tensorrt_rtx``) is not installed."""


class ConfigError(TrtcoreError, ValueError):
    """``config.json`` / ``generation_config.json`` is missing, unreadable or inconsistent."""


class UnsupportedArchitectureError(ConfigError):
    """The checkpoint's ``architectures`` entry is not one trtcore can build."""


class CheckpointError(TrtcoreError, ValueError):
    """A safetensors checkpoint is missing, corrupted, or does not match its config."""


class MissingTensorError(CheckpointError, KeyError):
    """A tensor the model needs is not in the checkpoint."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TensorShapeError(CheckpointError):
    """A checkpoint tensor has another shape than the config implies."""


class ConversionError(TrtcoreError, ValueError):
    """A GGUF file cannot be converted (unsupported architecture, tensor type, tokenizer)."""


class DownloadError(TrtcoreError, OSError):
    """The default model could not be fetched or failed its checksum."""


class CacheError(TrtcoreError, OSError):
    """trtcore's cache directory (``$TRTCORE_CACHE``) cannot be created or written."""


class InvalidRequestError(TrtcoreError, ValueError):
    """A generation request is invalid (empty prompt, prompt too long, bad sampling params)."""


class InvalidArgumentError(TrtcoreError, ValueError):
    """An option is out of range: unknown backend or dtype, bad build limits or target."""


class UnsupportedDTypeError(InvalidArgumentError, TypeError):
    """A data type trtcore has no entry for (or none in the form asked: TensorRT, NumPy);
    also a ``TypeError``, which the per-module dtype helpers raised before."""


class EngineBuildError(TrtcoreError, RuntimeError):
    """TensorRT's builder returned no engine (its log says why)."""


class NetworkError(TrtcoreError, ValueError):
    """A network-definition call was given inconsistent tensors (shapes, dtypes)."""


class GenerationError(TrtcoreError, RuntimeError):
    """A request failed while generating: its logits were not finite (NaN, or an overflow
    to inf), so no token could be sampled."""


class EngineFileError(TrtcoreError, ValueError):
    """An engine file cannot be loaded: it or its sidecar is missing or corrupted, or it was
    built for something else than what is here (another trtcore or TensorRT version, GPU
    target, plugin version, model files). ``field`` names the sidecar field that differs,
    ``expected`` the value the engine was built with, ``found`` the value found here (all
    None when the files cannot be read)."""

    def __init__(self, message: str, *, field: str | None = None, expected: object = None, found: object = None):
        super().__init__(message)
        self.field = field
        self.expected = expected
        self.found = found


class UnsupportedQuantizationError(ConfigError):
    """``config.json``'s ``quantization_config`` names a format (or a variant of one) that
    trtcore does not read; the message lists the supported ones."""
