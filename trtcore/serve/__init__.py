"""``trtcore serve``: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over one engine loop.

Modules: :mod:`~trtcore.serve.protocol` (the API's pydantic bodies),
:mod:`~trtcore.serve.engine` (the engine loop and its request queue),
:mod:`~trtcore.serve.app` (the routes and errors), :mod:`~trtcore.serve.auth` (``--api-key``), :mod:`~trtcore.serve.metrics`
(Prometheus metrics named as vLLM's), :mod:`~trtcore.serve.server` (the command and
uvicorn), :mod:`~trtcore.serve.process` (the server as a child process, for tests and
benchmarks). Needs the ``serve`` extra (``pip install "trtcore[serve]"``).
"""
