"""Start ``trtcore serve`` as a child process and wait until it serves (tests, benchmarks).

Example::

    with ServerProcess(["--model", "tiny", "--backend", "reference"]) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from ..errors import TrtcoreError
from .server import ENGINE_PROCESS, LISTENING

__all__ = ["ServerProcess"]


class ServerProcess:
    """``python -m trtcore.cli serve ARGS --host 127.0.0.1 --port 0`` in a child process.

    :meth:`start` (or entering the ``with`` block) returns once ``GET /health`` answers 200.

    Args:
        args: options of ``trtcore serve`` (``--host`` / ``--port`` are added).
        timeout: seconds to wait for the model to load.
        new_session: start the server in a session (and process group) of its own, as a
            service manager does, so that a signal can be sent to the whole group
            (``os.killpg(process.pid, ...)``) without reaching the caller.

    Attributes:
        url: ``http://127.0.0.1:PORT`` once started.
        engine_pid: the server's engine process, once its model is loaded.
        process: the :class:`subprocess.Popen`.
        stderr_lines: what the server wrote to stderr so far.

    Raises:
        TrtcoreError: the server exited or was not ready within ``timeout`` (its stderr
            is in the message).
    """

    def __init__(self, args: Sequence[str], timeout: float = 300.0, new_session: bool = False):
        self.args = list(args)
        self.timeout = timeout
        self.new_session = bool(new_session)
        self.url = ""
        self.engine_pid: int | None = None
        self.process: subprocess.Popen[str] | None = None
        self.stderr_lines: list[str] = []
        self._port_found = threading.Event()
        self._engine_found = threading.Event()

    def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr_lines.append(line)
            if line.startswith(LISTENING):
                self.url = line[len(LISTENING) :].strip()
                self._port_found.set()
            elif line.startswith(ENGINE_PROCESS):
                self.engine_pid = int(line[len(ENGINE_PROCESS) :])
                self._engine_found.set()

    def _fail(self, why: str) -> TrtcoreError:
        self.stop()
        return TrtcoreError(f"trtcore serve {why}:\n{''.join(self.stderr_lines)[-4000:]}")

    def start(self) -> ServerProcess:
        """Launch it and wait until ``/health`` answers 200 (and the engine process is announced)."""
        cmd = [sys.executable, "-m", "trtcore.cli", "serve", *self.args, "--host", "127.0.0.1", "--port", "0"]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=self.new_session)
        threading.Thread(target=self._read_stderr, daemon=True).start()
        deadline = time.monotonic() + self.timeout
        while not self._port_found.wait(0.1):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise self._fail("did not start")
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self._fail(f"exited with status {self.process.returncode}")
            if self.health() == 200:
                # the engine's pid line comes with readiness, maybe just after /health turned 200
                self._engine_found.wait(max(0.0, min(10.0, deadline - time.monotonic())))
                return self
            time.sleep(0.1)
        raise self._fail(f"was not ready within {self.timeout} s")

    def health(self) -> int | None:
        """``GET /health``'s status, or None when nothing answers."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return None

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the server drains), wait; SIGKILL if it is still there; its exit status."""
        p = self.process
        if p is None:
            return None
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
