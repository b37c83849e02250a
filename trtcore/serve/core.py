"""The engine core of ``trtcore serve``: the loop that owns the :class:`~trtcore.llm.LLM` and
steps it, and the wire format between it and the server's event loop
(:class:`~trtcore.serve.engine.AsyncEngine`; the overall picture is in
:mod:`trtcore.serve.engine`'s docstring).

:func:`run_engine_core` is the entry point: the target of the engine process (started with the
``spawn`` method), or of a thread in the server process for debugging and tests (the same code
over the same socket). It builds the LLM, sends :class:`ServedModel` once (what the HTTP routes
need of the model), then runs :class:`EngineCore`'s loop until the server asks it to stop or
goes away.

Wire format: a stream socket (one end of a :func:`socket.socketpair`) carrying frames, each an
8-byte big-endian length and a pickle. A frame holds a list of messages (tuples whose first item
is the kind), so that everything one side has to say at a given moment travels in one write:

* server -> core: ``(ADD, request id, prompt token ids, SamplingParams)``,
  ``(ABORT, request id)``, ``(SHUTDOWN,)``. The request ids are the server's.
* core -> server: ``(READY, ServedModel, pid)`` or ``(LOAD_ERROR, exception)`` once, then one
  ``(STEP, start, prompt_tokens, errors, outputs, scheduled, running, kv_usage, preemptions)``
  per step (:meth:`EngineCore._step` lists the fields). A server that reads late gets the
  steps that piled up in one frame: the core never waits for the server while it has work.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ADD",
    "ABORT",
    "LOAD_ERROR",
    "READY",
    "SHUTDOWN",
    "STEP",
    "HEADER",
    "EngineCore",
    "ServedModel",
    "describe",
    "enlarge_buffers",
    "frame",
    "portable",
    "run_engine_core",
]

# message kinds (the first item of every message)
ADD, ABORT, SHUTDOWN = "add", "abort", "shutdown"
READY, LOAD_ERROR, STEP = "ready", "load_error", "step"

#: a frame's header: the pickle's length
HEADER = struct.Struct("!Q")
#: socket buffer asked for on each end (the kernel caps it): a burst of admissions or of step
#: outputs rarely has to wait for the reader
SOCKET_BUFFER = 4 << 20


def frame(obj: Any) -> bytes:
    """``obj`` as one frame: the header and its pickle."""
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def enlarge_buffers(sock: socket.socket) -> None:
    """Ask for :data:`SOCKET_BUFFER` bytes of send and receive buffer on ``sock`` (best effort)."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a :class:`RuntimeError` with its type and message
    (an exception that cannot cross to the server must not take the engine core down)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


@dataclass
class ServedModel:
    """What the HTTP routes need of the served model, sent once by the engine core when it is
    ready (the LLM itself stays in the engine process).

    Attributes:
        model_dir: the model folder (its ``tokenizer_config.json`` holds the chat template).
        vocab_size: token ids must be in ``[0, vocab_size)``.
        max_seq_len: the context (prompt + output tokens).
        max_batch_size: sequences per step.
        version: ``{"engine_sha256", "plan"}`` of an engine file, None for an engine built at
            start-up (``GET /v1/models``' ``version``).
        tokenizer: the LLM's :class:`tokenizers.Tokenizer` (pickled as its JSON), or None.
        kv_cache_tokens: tokens the KV pool holds (its blocks times the block size): a request
            needs up to ``prompt + max_tokens - 1`` of them; None where not known.
    """

    model_dir: str
    vocab_size: int
    max_seq_len: int
    max_batch_size: int
    version: dict[str, Any] | None = None
    tokenizer: Any = None
    kv_cache_tokens: int | None = None
    _max_token_chars: int | None = field(default=None, init=False, repr=False, compare=False)  # max_token_chars, once computed

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, as :meth:`trtcore.llm.LLM.encode`.

        Raises:
            InvalidRequestError: the model folder has no ``tokenizer.json``.
        """
        from ..llm import encode_text

        return encode_text(self.tokenizer, self.model_dir, text, add_special_tokens)

    def max_token_chars(self) -> int:
        """The most characters one token stands for (the longest string of the tokenizer's
        vocabulary, byte-level or SentencePiece: at least the characters it decodes to); 64
        without a tokenizer. Computed once."""
        if self._max_token_chars is None:
            vocab = self.tokenizer.get_vocab() if self.tokenizer is not None else {}
            self._max_token_chars = max((len(t) for t in vocab), default=64)
        return self._max_token_chars

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """``messages`` rendered with the model's chat template, as :meth:`trtcore.llm.LLM.apply_chat_template`.

        Raises:
            InvalidRequestError: the model has no chat template, or the template raised.
        """
        from ..chat import render_chat_template

        return render_chat_template(self.model_dir, messages, add_generation_prompt)


def describe(llm: Any) -> ServedModel:
    """The :class:`ServedModel` of ``llm`` (a :class:`~trtcore.llm.LLM`; an object with a
    ``served_model()`` method, such as a benchmark's stand-in, describes itself)."""
    own = getattr(llm, "served_model", None)
    if own is not None:
        return own()  # type: ignore[no-any-return]
    version = None
    if llm.engine_file is not None:
        version = {"engine_sha256": llm.engine_file.sidecar.get("engine_sha256"), "plan": llm.plan.to_dict()}
    bc = llm.build_config
    blocks = getattr(getattr(getattr(llm, "engine", None), "scheduler", None), "block_manager", None)
    kv_tokens = None if blocks is None else int(blocks.num_slots)
    return ServedModel(
        str(Path(llm.model_dir)), int(llm.config.vocab_size), int(bc.max_seq_len), int(bc.max_batch_size), version, llm.tokenizer, kv_tokens
    )


class _Channel:
    """The engine core's end of the socket: blocking frames, polled without blocking."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        enlarge_buffers(sock)
        self.sock = sock
        fd = sock.fileno()
        self._readable, self._writable = select.poll(), select.poll()
        self._readable.register(fd, select.POLLIN)
        self._writable.register(fd, select.POLLOUT)

    def send(self, obj: Any) -> None:
        self.sock.sendall(frame(obj))

    def poll(self, timeout: float | None) -> bool:
        """Whether a frame (or the end of the stream) is there, waiting up to ``timeout`` s (None: for ever)."""
        return bool(self._readable.poll(None if timeout is None else max(timeout * 1e3, 0.0)))

    def writable(self) -> bool:
        return bool(self._writable.poll(0))

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("the server closed the connection")
            buf += chunk
        return bytes(buf)

    def recv(self) -> Any:
        """The next frame's object; :class:`EOFError` once the server is gone."""
        (n,) = HEADER.unpack(self._exactly(HEADER.size))
        return pickle.loads(self._exactly(n))


class EngineCore:
    """The engine loop over ``llm`` (vLLM's ``EngineCore``): block for work while idle; while
    busy take every queued message without blocking, admit, step, and queue one ``STEP``
    message per step, sent whenever the socket takes it without waiting.

    Batching window (``max_queue_delay_s``, Triton's ``max_queue_delay``): queued requests are
    held until the oldest has waited that long here, or until they fill the free batch slots
    (``max_batch_size`` minus the running requests); 0 admits them at the next step.

    A request that :meth:`~trtcore.llm.LLM.add_request` refuses fails alone (its error goes
    back in the step's ``errors``); an exception out of a step fails the requests then live
    and the loop goes on.

    Args:
        llm: the model (online API: ``add_request`` / ``step`` / ``abort_request``; its
            scheduler's state is read for the metrics).
        channel: the socket to the server (:class:`_Channel`).
        max_queue_delay_s: the batching window, seconds.
    """

    def __init__(self, llm: Any, channel: _Channel, max_queue_delay_s: float = 0.0) -> None:
        self.llm = llm
        self.channel = channel
        self.max_queue_delay_s = max_queue_delay_s
        self.pending: dict[int, tuple[list[int], Any, float]] = {}  # server id -> (prompt, params, arrival here), in order
        self.server_id: dict[int, int] = {}  # the LLM's id -> the server's, while live in the LLM
        self.llm_id: dict[int, int] = {}  # the server's id -> the LLM's
        self.unscheduled: set[int] = set()  # LLM ids not yet seen running (their queue time is not reported)
        self.outbox: list[Any] = []
        self.report = False  # an abort changed the scheduler's state: report it even without a step
        self.stopping = False
        self.gone = False  # the server closed the socket

    def run(self) -> None:
        """Serve until ``SHUTDOWN`` (once idle) or until the server is gone."""
        llm = self.llm
        while not self.gone:
            self._receive(0.0)
            admit, hold = self._admissions(time.perf_counter())
            if admit or self.report or llm.has_unfinished_requests():
                self.outbox.append(self._step(admit))
                self._flush(block=False)
                continue
            if self.stopping and not self.pending:
                break
            self._flush(block=True)  # idle: nothing else will go out before the next message
            self._receive(hold)  # sleep until a message, or the window's end
        if not self.gone:
            self._flush(block=True)

    def _receive(self, timeout: float | None) -> None:
        """Apply the messages that arrive within ``timeout`` s, then every one queued behind them."""
        try:
            while self.channel.poll(timeout):
                timeout = 0.0
                for msg in self.channel.recv():
                    self._apply(msg)
        except (EOFError, OSError):
            self.gone = True

    def _apply(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == ADD:
            self.pending[msg[1]] = (msg[2], msg[3], time.perf_counter())
        elif kind == ABORT:
            if self.pending.pop(msg[1], None) is None and msg[1] in self.llm_id:
                lid = self.llm_id.pop(msg[1])
                del self.server_id[lid]
                self.unscheduled.discard(lid)
                self.llm.abort_request(lid)  # its KV blocks are free before the next step
                self.report = True
        elif kind == SHUTDOWN:
            self.stopping = True
        else:
            raise ValueError(f"unknown message kind {kind!r} from the server")

    def _admissions(self, now: float) -> tuple[list[tuple[int, tuple[list[int], Any, float]]], float | None]:
        """The queued requests to admit now, and how long to wait for the window otherwise."""
        if not self.pending:
            return [], None
        if self.max_queue_delay_s > 0:
            free = max(self.llm.build_config.max_batch_size - self.llm.engine.scheduler.num_running, 0)
            waited = now - next(iter(self.pending.values()))[2]
            if waited < self.max_queue_delay_s and (free == 0 or len(self.pending) < free):
                return [], self.max_queue_delay_s - waited
        admit = list(self.pending.items())
        self.pending.clear()
        return admit, None

    def _forget(self, lid: int) -> None:
        self.llm_id.pop(self.server_id.pop(lid), None)
        self.unscheduled.discard(lid)

    def _step(self, admit: list[tuple[int, tuple[list[int], Any, float]]]) -> tuple[Any, ...]:
        """Admissions, one step, the scheduler's state, as a ``STEP`` message: ``start`` (the
        step's ``time.perf_counter()``: CLOCK_MONOTONIC, comparable across processes here),
        ``prompt_tokens`` (of the requests admitted), ``errors`` ``[(id, exception)]``,
        ``outputs`` ``[(id, token_id, text, logprobs, finish_reason, stop_reason, error)]``
        (:class:`~trtcore.llm.StreamOutput`'s fields), ``scheduled`` (ids running for the
        first time), ``running``, ``kv_usage`` (0..1), ``preemptions`` (cumulative)."""
        llm = self.llm
        errors: list[tuple[int, BaseException]] = []
        prompt_tokens = 0
        for rid, (ids, params, _) in admit:
            try:
                lid = llm.add_request(ids, params)
            except Exception as exc:  # refused (e.g. a prompt over the context): only this one
                errors.append((rid, portable(exc)))
                continue
            self.server_id[lid], self.llm_id[rid] = rid, lid
            self.unscheduled.add(lid)
            prompt_tokens += len(ids)
        start = time.perf_counter()
        outputs: list[tuple[Any, ...]] = []
        if llm.has_unfinished_requests():
            try:
                outs = llm.step()
            except Exception as exc:  # a bug or a device error: fail what is live, keep serving
                err = portable(exc)
                for lid, rid in self.server_id.items():
                    errors.append((rid, err))
                    llm.abort_request(lid)
                self.server_id.clear()
                self.llm_id.clear()
                self.unscheduled.clear()
                outs = []
            server_id = self.server_id
            for o in outs:
                rid = server_id.get(o.index)
                if rid is None:
                    continue  # aborted meanwhile
                if o.finish_reason is not None:
                    self._forget(o.index)
                outputs.append((rid, o.token_id, o.text, o.logprobs, o.finish_reason, o.stop_reason, None if o.error is None else portable(o.error)))
        sched = llm.engine.scheduler
        scheduled = []
        if self.unscheduled:
            for r in sched.running:
                if r.request_id in self.unscheduled:
                    self.unscheduled.discard(r.request_id)
                    scheduled.append(self.server_id[r.request_id])
        blocks = sched.block_manager
        used = blocks.num_used_blocks
        self.report = False
        return (
            STEP,
            start,
            prompt_tokens,
            errors,
            outputs,
            scheduled,
            sched.num_running,
            used / max(used + blocks.num_free_blocks, 1),
            sched.num_preemptions,
        )

    def _flush(self, block: bool) -> None:
        """Send what the outbox holds (one frame); unless ``block``, only if the socket has room
        now (else the messages wait for the next step's flush)."""
        if not self.outbox or not (block or self.channel.writable()):
            return
        try:
            self.channel.send(self.outbox)
        except OSError:
            self.gone = True
        self.outbox = []


def run_engine_core(make_llm: Callable[[], Any], sock: socket.socket, max_queue_delay_s: float = 0.0, own_process: bool = True) -> None:
    """Build the LLM with ``make_llm()``, send ``READY`` (or ``LOAD_ERROR``), run
    :class:`EngineCore` until told to stop or until the server is gone, close the LLM.

    Args:
        make_llm: builds the LLM (paged KV cache); in an engine process it arrived pickled.
        sock: this side of the socket to the server (closed on return).
        max_queue_delay_s: the batching window, seconds.
        own_process: this is the engine process: SIGINT and SIGTERM are ignored (a terminal's
            Ctrl-C, ``timeout``, systemd's ``KillMode=control-group`` and ``kill -- -PGID`` signal
            the whole process group; the server drains, then stops this process with ``SHUTDOWN``,
            and this process also ends when the server's end of the socket closes).
    """
    if own_process:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    channel = _Channel(sock)
    llm = None
    try:
        try:
            llm = make_llm()
            model = describe(llm)
        except BaseException as exc:
            channel.send([(LOAD_ERROR, portable(exc))])
            return
        channel.send([(READY, model, os.getpid())])
        EngineCore(llm, channel, max_queue_delay_s).run()
    except (EOFError, OSError):
        pass  # the server is gone: nobody to report to
    finally:
        try:
            if llm is not None:
                llm.close()
        finally:
            sock.close()
