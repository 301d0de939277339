"""Refuse text that is not UTF-8 before the app sees it (issue 22, finding 4).

JSON may carry a lone surrogate (``"\\ud800"``): valid JSON, not text. Python decodes it into
a ``str`` that nothing can encode again: the request reached the app, its error answer echoed
the input, encoding that answer failed (HTTP 500) and the next request on the connection was
reset. ``%ED%A0%80`` in a path is the same in UTF-8 bytes. Both are a 400 here, naming where.
"""

from __future__ import annotations

import json
import re
from urllib.parse import unquote_to_bytes

import msgspec

#: the JSON escape of a surrogate (high or low), the only way a lone one reaches a str
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate_at(value, where: str = "$") -> str | None:
    """The JSON path of the first string (or key) of ``value`` that is not encodable text."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if _lone_surrogate_at(k) is not None:
                return f"{where} (a key)"
            found = _lone_surrogate_at(v, f"{where}.{k}")
            if found:
                return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = _lone_surrogate_at(v, f"{where}[{i}]")
            if found:
                return found
    return None


def body_problem(body: bytes) -> str | None:
    """Why ``body`` (JSON) is not text, or None. Cheap unless it holds a surrogate escape."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"request body: not UTF-8 text (byte {exc.start})"
    if not _SURROGATE_ESCAPE.search(body):
        return None
    try:
        where = _lone_surrogate_at(json.loads(body))
    except ValueError:
        return None  # not JSON: the endpoint's decoder says so
    if where is None:
        return None  # escaped pairs (an emoji) are text
    return f"request body: {where} holds a lone surrogate (\\ud800-\\udfff without its pair): not text"


def path_problem(raw_path: bytes) -> str | None:
    try:
        unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        return "path: not UTF-8 text (percent-encoded bytes such as %ED%A0%80, a lone surrogate)"
    return None


class TextGuard:
    """ASGI middleware: 400 for a path or a request body that is not UTF-8 text."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        problem = path_problem(scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape"))
        if problem is None and any("\ud800" <= c <= "\udfff" for c in scope["path"]):
            problem = "path: holds a lone surrogate: not text"
        if problem is not None:
            return await _refuse(send, problem)
        if scope.get("method") not in ("POST", "PUT", "PATCH", "DELETE"):
            return await self.app(scope, receive, send)
        chunks = []
        more = True
        while more:  # the body is bounded by BodyLimit, outside this middleware
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message]), send)
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        problem = body_problem(body)
        if problem is not None:
            return await _refuse(send, problem)
        await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send)


def _replay(messages: list, receive=None):
    async def replayed():
        if messages:
            return messages.pop(0)
        if receive is not None:
            return await receive()  # e.g. http.disconnect
        return {"type": "http.disconnect"}

    return replayed


async def _refuse(send, detail: str) -> None:
    body = msgspec.json.encode({"detail": detail})
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
