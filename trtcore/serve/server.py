"""``trtcore serve``: its options and the uvicorn server around :func:`trtcore.serve.app.build_app`.

The listening socket is bound before the model loads, and one line
``trtcore serve: listening on http://HOST:PORT`` goes to stderr (with ``--port 0``, the port
the system chose); ``GET /health`` answers 503 until the model is ready. The model is loaded
and stepped in an engine process of its own (:mod:`trtcore.serve.engine`); once it is ready,
``trtcore serve: engine process PID`` goes to stderr.

SIGTERM (and SIGINT) drain: ``/health`` and new requests answer 503, the listening socket
closes, running requests finish, the engine process exits, then the server exits with status
0. A model that fails to load ends the process with status 2 and ``trtcore: error: ...``. An
engine process that dies fails the live requests (a streamed one gets an error event, a whole
one a 503), then the server shuts down and exits with status 1 and one stderr line
``trtcore: error: the engine process (pid N, exit status S) exited unexpectedly; ...`` (as
vLLM's API server does: ``docker run --restart`` or Kubernetes restarts it).

``--api-key KEY`` (or the ``TRTCORE_API_KEY`` environment variable; the option wins): the
``/v1`` routes need ``Authorization: Bearer KEY`` (:mod:`trtcore.serve.auth`). The key is
never printed; prefer the environment variable (a command line is visible to every local user
in ``ps``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["ENGINE_PROCESS", "LISTENING", "add_serve_parser", "api_key_of", "build_llm", "make_llm_factory", "run_server", "serve"]

#: the start of the stderr line that announces the bound address
LISTENING = "trtcore serve: listening on "
#: the start of the stderr line that announces the engine process's pid (once the model is loaded)
ENGINE_PROCESS = "trtcore serve: engine process "


def add_serve_parser(p: argparse.ArgumentParser, add_engine: Callable[[argparse.ArgumentParser], None]) -> None:
    """Options of ``trtcore serve`` (``add_engine`` adds the CLI's ``--engine``)."""
    p.add_argument("--model", help="Hugging Face model folder (default: SmolLM2-135M-Instruct; with --engine: the folder its sidecar names)")
    add_engine(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port, announced on stderr)")
    p.add_argument("--served-model-name", help="the model's name in the API (default: the model folder's name)")
    p.add_argument("--max-waiting", type=int, default=1024, help="most requests waiting to run; more get 429 (default 1024)")
    p.add_argument(
        "--max-queue-delay-ms", type=float, default=0.0, help="batching window: hold new requests up to this long to fill the batch (default 0: off)"
    )
    p.add_argument("--backend", help="reference | tensorrt | tensorrt_rtx | cuda")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--max-batch-size", type=int, help="sequences per step (default 8, or the engine's)")
    p.add_argument("--max-seq-len", type=int, help="context length (default: the model's, or the engine's)")
    p.add_argument("--max-num-tokens", type=int, help="token budget per step (default 2048, or the engine's)")
    p.add_argument(
        "--kv-cache-memory", type=int, help="bytes of the KV block pool (default 256 MiB on the CPU; on a GPU what --gpu-memory-utilization leaves)"
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="fraction of the GPU's memory to use (default 0.9)")
    p.add_argument(
        "--cpu-affinity",
        help="pin the engine process's step loop to CPUs: 'auto' (one CPU on the GPU's NUMA node) or a CPU list such as '2,5-7' (default: not pinned)",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (default warning)")
    # CORS, vLLM's options (JSON lists) and defaults: browser clients may call the API
    p.add_argument("--allowed-origins", type=json.loads, default=["*"], help='CORS allowed origins, a JSON list (default ["*"])')
    p.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials (default: not)")
    p.add_argument("--allowed-methods", type=json.loads, default=["*"], help='CORS allowed methods, a JSON list (default ["*"])')
    p.add_argument("--allowed-headers", type=json.loads, default=["*"], help='CORS allowed headers, a JSON list (default ["*"])')
    p.add_argument(
        "--api-key",
        help="the /v1 routes need 'Authorization: Bearer KEY' (default: the TRTCORE_API_KEY environment variable; none if unset or empty)",
    )


def api_key_of(args: argparse.Namespace) -> str | None:
    """The server's API key: ``--api-key``, else the ``TRTCORE_API_KEY`` environment variable
    (unset or empty: no key, every route is open).

    Raises:
        InvalidArgumentError: ``--api-key ''`` (an empty key, e.g. an unset shell variable,
            would leave the server open without a word).
    """
    from ..errors import InvalidArgumentError
    from .auth import API_KEY_ENV

    key = getattr(args, "api_key", None)
    if key is not None:
        if not key.strip():
            raise InvalidArgumentError(f"--api-key is empty; give a key, or leave the option out (and {API_KEY_ENV} unset) for no key")
        return str(key)
    return os.environ.get(API_KEY_ENV) or None


def build_llm(model: str | None, engine: str | None, options: dict[str, Any]) -> Any:
    """The served :class:`~trtcore.llm.LLM` (in the engine process): ``model`` (None: the default
    model, or the folder the engine file's sidecar names), ``engine`` (an engine file or None),
    ``options`` (the LLM's keyword arguments)."""
    from ..llm import LLM

    if model is None and engine is None:
        from ..default_model import default_model_dir

        model = default_model_dir(progress=False)
    return LLM(model, engine=engine, progress=False, **options)


def make_llm_factory(args: argparse.Namespace) -> Callable[[], Any]:
    """A picklable function (a :func:`functools.partial` of :func:`build_llm`) that builds the
    served :class:`~trtcore.llm.LLM` from ``args`` in the engine process (paged KV cache; build
    options not given are the LLM's defaults, or the engine file's)."""
    options = {
        k: v
        for k, v in {
            "dtype": args.dtype,
            "max_batch_size": args.max_batch_size,
            "max_seq_len": args.max_seq_len,
            "max_num_tokens": args.max_num_tokens,
            "kv_cache_memory": args.kv_cache_memory,
            "cpu_affinity": getattr(args, "cpu_affinity", None),
            "kv_cache_dtype": getattr(args, "kv_cache_dtype", None),
        }.items()
        if v is not None
    }
    if args.engine is None:
        options["kv_cache"] = "paged"  # continuous batching (an engine file brings its own)
    options |= {"backend": args.backend, "gpu_memory_utilization": args.gpu_memory_utilization, "quantization": getattr(args, "quantization", None)}
    return functools.partial(build_llm, args.model, args.engine, options)


def _served_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return str(args.served_model_name)
    if args.model:
        return Path(args.model).name
    if args.engine:
        return Path(args.engine).stem
    return "SmolLM2-135M-Instruct"


def serve(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM / SIGINT; the exit status (0 after a drain, 2 if the
    model failed to load)."""
    from ..errors import InvalidArgumentError
    from .engine import AsyncEngine
    from .metrics import ServerMetrics

    if args.max_waiting < 1:
        raise InvalidArgumentError(f"--max-waiting must be >= 1 (a new request waits until the scheduler takes it), got {args.max_waiting}")
    if args.max_queue_delay_ms < 0:
        raise InvalidArgumentError(f"--max-queue-delay-ms must be >= 0, got {args.max_queue_delay_ms}")
    # a path that is not there fails now, before the port is taken and the address announced
    for flag, value, expected in (
        ("--model", args.model, "a Hugging Face model folder"),
        ("--engine", args.engine, "an engine file from `trtcore build`"),
    ):
        if value and not Path(value).exists():
            raise InvalidArgumentError(f"{flag} {value}: no such file or folder (expected {expected})")
    name = _served_name(args)
    api_key = api_key_of(args)
    cors = cors_policy_of(args)
    engine = AsyncEngine(make_llm_factory(args), ServerMetrics(name), args.max_waiting, args.max_queue_delay_ms / 1000.0)
    return run_server(engine, name, args.host, args.port, args.log_level, api_key=api_key, cors=cors)


def cors_policy_of(args: argparse.Namespace) -> Any:
    """The :class:`~trtcore.serve.app.CorsPolicy` of ``--allowed-origins`` / ``--allow-credentials``
    / ``--allowed-methods`` / ``--allowed-headers``.

    Raises:
        InvalidArgumentError: a list option that is not a JSON list of strings (named)."""
    from ..errors import InvalidArgumentError
    from .app import CorsPolicy

    lists = {}
    for field in ("allowed_origins", "allowed_methods", "allowed_headers"):
        value = getattr(args, field, ["*"])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidArgumentError(f"--{field.replace('_', '-')} must be a JSON list of strings, e.g. '[\"*\"]', got {value!r}")
        lists[field] = tuple(value)
    return CorsPolicy(allow_credentials=bool(getattr(args, "allow_credentials", False)), **lists)


def run_server(engine: Any, name: str, host: str, port: int, log_level: str = "warning", api_key: str | None = None, cors: Any = None) -> int:
    """Serve ``engine`` (an :class:`~trtcore.serve.engine.AsyncEngine`, not started) as ``name``
    on ``host:port`` with uvicorn until SIGTERM / SIGINT or the engine's death (module
    docstring: the announced address, the drain); ``api_key``: the ``/v1`` routes need it;
    ``cors``: a :class:`~trtcore.serve.app.CorsPolicy` (None: its defaults). The
    exit status: 0 after a drain, 1 if the engine process died, 2 if the model failed to load.

    Raises:
        InvalidArgumentError: ``host:port`` cannot be listened on (a port in use, an address
            not on this machine), before the engine starts."""
    import uvicorn

    from ..errors import InvalidArgumentError
    from .app import build_app

    failed: list[BaseException] = []

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            engine.draining = True  # /health and new requests: 503 from now on
            super().handle_exit(sig, frame)

    def load_error(exc: BaseException) -> None:
        failed.append(exc)
        server.should_exit = True

    def ready() -> None:
        print(f"{ENGINE_PROCESS}{engine.engine_pid}", file=sys.stderr, flush=True)

    died: list[BaseException] = []

    def dead(exc: BaseException) -> None:
        # the live streams already got the error: the shutdown lets their responses finish
        died.append(exc)
        server.should_exit = True

    engine.on_dead = dead
    app = build_app(engine, name, on_load_error=load_error, on_ready=ready, api_key=api_key, cors=cors)
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=None, lifespan="on")
    server = _Server(config)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:  # a port in use, an address not on this machine: the user's to change
        sock.close()
        raise InvalidArgumentError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port (0: any free port) or --host"
        ) from None
    sock.set_inheritable(True)
    bound_host, bound_port = sock.getsockname()[:2]
    print(f"{LISTENING}http://{bound_host}:{bound_port}", file=sys.stderr, flush=True)
    # uvicorn re-raises the signal it drained on; after a drain the process exits 0 instead
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run(sockets=[sock])
    if failed:
        print(f"trtcore: error: the model failed to load: {failed[0]}", file=sys.stderr)
        return 2
    if died:
        print(f"trtcore: error: {died[0]}", file=sys.stderr)
        return 1
    return 0
