"""The server's Prometheus metrics, named as vLLM's (prefix ``trtcore:`` for ``vllm:``) so that
dashboards written for ``vllm serve`` carry over.

Names (vLLM v1's, ``docs/usage/metrics.md``); every metric has the label ``model_name``:

* histograms, seconds: ``trtcore:time_to_first_token_seconds`` (arrival -> first token),
  ``trtcore:inter_token_latency_seconds`` (between two tokens of a request),
  ``trtcore:e2e_request_latency_seconds`` (arrival -> finish),
  ``trtcore:request_queue_time_seconds`` (arrival -> the first step that schedules it);
* counters: ``trtcore:prompt_tokens_total``, ``trtcore:generation_tokens_total``,
  ``trtcore:num_preemptions_total``, ``trtcore:request_success_total`` (label
  ``finished_reason``: ``stop``, ``length``, ``abort``; a request that failed is counted in
  ``trtcore:request_failure_total`` instead);
* gauges: ``trtcore:num_requests_running``, ``trtcore:num_requests_waiting`` (queued in the
  server or the scheduler, not yet running), ``trtcore:kv_cache_usage_perc`` (fraction
  0..1 of the KV blocks in use).

Every server has its own :class:`prometheus_client.CollectorRegistry` (no process-global state).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "ServerMetrics"]

#: bucket bounds (seconds) of the latency histograms: 1 ms .. 160 s, as vLLM's span
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)


class ServerMetrics:
    """The metrics of one served model (see the module docstring for names and units).

    Args:
        model_name: the ``model_name`` label (the served model name).
    """

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(f"trtcore:{name}", doc, labels, registry=r, buckets=LATENCY_BUCKETS)

        self.time_to_first_token = hist("time_to_first_token_seconds", "Time to first token, seconds.").labels(model_name)
        self.inter_token_latency = hist("inter_token_latency_seconds", "Time between two output tokens of a request, seconds.").labels(model_name)
        self.e2e_request_latency = hist("e2e_request_latency_seconds", "End-to-end request latency, seconds.").labels(model_name)
        self.request_queue_time = hist("request_queue_time_seconds", "Time a request waited before its first step, seconds.").labels(model_name)
        self.prompt_tokens = Counter("trtcore:prompt_tokens", "Prompt tokens processed.", labels, registry=r).labels(model_name)
        self.generation_tokens = Counter("trtcore:generation_tokens", "Tokens generated.", labels, registry=r).labels(model_name)
        self.num_preemptions = Counter("trtcore:num_preemptions", "Requests preempted by the scheduler.", labels, registry=r).labels(model_name)
        self._success = Counter("trtcore:request_success", "Finished requests by finish reason.", [*labels, "finished_reason"], registry=r)
        self.request_failure = Counter("trtcore:request_failure", "Requests that ended in an error.", labels, registry=r).labels(model_name)
        self.num_requests_running = Gauge("trtcore:num_requests_running", "Requests running.", labels, registry=r).labels(model_name)
        self.num_requests_waiting = Gauge("trtcore:num_requests_waiting", "Requests waiting to run.", labels, registry=r).labels(model_name)
        self.kv_cache_usage = Gauge("trtcore:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).", labels, registry=r).labels(
            model_name
        )
        self._model_name = model_name
        for reason in ("stop", "length", "abort"):  # present (0) before the first request
            self._success.labels(model_name, reason)

    def request_success(self, finished_reason: str) -> None:
        """Count one finished request under ``finished_reason``."""
        self._success.labels(self._model_name, finished_reason).inc()

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric (``GET /metrics``'s body)."""
        return bytes(generate_latest(self.registry))
