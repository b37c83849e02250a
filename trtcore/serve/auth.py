"""``trtcore serve --api-key``: the bearer-token check of the ``/v1`` routes (an ASGI middleware).

With a key set (``--api-key KEY`` or the ``TRTCORE_API_KEY`` environment variable, as vLLM's
``--api-key`` / ``VLLM_API_KEY``), every request whose path is ``/v1`` or under it needs the
header ``Authorization: Bearer KEY`` (the ``openai`` client sends its ``api_key`` so);
anything else gets 401 with OpenAI's error body ``{"error": {"message", "type":
"invalid_request_error", "param": null, "code": "invalid_api_key"}}`` and ``WWW-Authenticate:
Bearer``. The other routes stay open: ``/health`` (probes), ``/metrics`` (scrapers),
``/version``. A CORS preflight (``OPTIONS``) passes, as in vLLM.

The key is compared in constant time (:func:`hmac.compare_digest` of the SHA-256 digests: the
time depends on neither the key's content nor its length), and it is never logged nor echoed
in an error message.

This is a plain ASGI middleware, not Starlette's ``BaseHTTPMiddleware``: a streamed response
passes through untouched (no extra task or queue per request).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

__all__ = ["API_KEY_ENV", "ApiKeyMiddleware", "is_protected"]

#: the environment variable ``trtcore serve`` reads the key from when ``--api-key`` is not given
API_KEY_ENV = "TRTCORE_API_KEY"


def is_protected(path: str) -> bool:
    """Whether ``path`` needs the key: ``/v1`` and every path under it."""
    return path == "/v1" or path.startswith("/v1/")


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class ApiKeyMiddleware:
    """The ASGI middleware (module docstring): ``app`` behind a bearer-token check of the
    ``/v1`` routes against ``api_key`` (a non-empty string)."""

    def __init__(self, app: Any, api_key: str) -> None:
        if not api_key:
            raise ValueError("api_key must be a non-empty string")
        self.app = app
        self._digest = _digest(api_key.encode())

    def authorized(self, authorization: bytes | None) -> bool:
        """Whether an ``Authorization`` header value carries the key (``Bearer KEY``; the
        scheme's case does not matter, RFC 7235)."""
        scheme, _, token = (authorization or b"").partition(b" ")
        ok = hmac.compare_digest(_digest(token.strip()), self._digest)
        return ok and scheme.lower() == b"bearer"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        if not is_protected(path):
            await self.app(scope, receive, send)
            return
        authorization = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if self.authorized(authorization):
            await self.app(scope, receive, send)
            return
        message = (
            "You didn't provide an API key: send it in the Authorization header as 'Bearer KEY'"
            if authorization is None
            else "Incorrect API key provided (the Authorization header must be 'Bearer KEY' with this server's --api-key)"
        )
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
        body = json.dumps({"error": error}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
