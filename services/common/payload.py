"""Replies and values that may outgrow NATS's message limit (1 MB by default).

A tree of 10,000 projects answers ``tree``, ``work`` and ``ledger.usage`` with 1 to 3 MB of
JSON: over the server's ``max_payload`` the reply is refused (``MaxPayloadError``) and the
gateway sees no answer at all. Such a body is sent zlib-compressed (JSON of repeated path names
shrinks about tenfold) with the header ``Timeshare-Encoding: zlib``; a small one goes as plain
JSON, as before. Readers call :func:`decode` on the message. Key-value entries carry no headers,
so a large value is stored compressed and told apart by its first byte (zlib's ``0x78``; JSON
starts with ``{``): :func:`decode_value`.
"""

from __future__ import annotations

import zlib
from typing import Any

import msgspec

#: bodies above this are compressed (well under NATS's 1 MB default, which also holds headers)
COMPRESS_ABOVE_BYTES = 256 * 1024
HEADER = "Timeshare-Encoding"

_encoder = msgspec.json.Encoder()


def answer(body: Any):
    """A handler's reply: plain JSON when small, else compressed with the header saying so."""
    from faststream import Response

    data = _encoder.encode(body)
    if len(data) <= COMPRESS_ABOVE_BYTES:
        return Response(data, headers={"content-type": "application/json"})
    return Response(zlib.compress(data, 1), headers={HEADER: "zlib", "content-type": "application/octet-stream"})


def decode(msg) -> Any:
    """The JSON body of a NATS message sent by :func:`answer` (or any plain JSON reply)."""
    data = msg.data
    if msg.headers and msg.headers.get(HEADER) == "zlib":
        data = zlib.decompress(data)
    return msgspec.json.decode(data)


def value(body: Any) -> bytes:
    """A key-value entry: plain JSON when small, else zlib-compressed JSON."""
    data = _encoder.encode(body)
    return data if len(data) <= COMPRESS_ABOVE_BYTES else zlib.compress(data, 1)


def decode_value(data: bytes) -> Any:
    return msgspec.json.decode(zlib.decompress(data) if data[:1] == b"\x78" else data)
