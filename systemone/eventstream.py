"""AWS event-stream messages, as SageMaker's InvokeEndpointWithResponseStream sends them.

Both deployables speak it: the scorer's local stand-in for SageMaker's runtime writes them
(`scorer_container.sagemaker_runtime`), the gateway reads them (`gateway.backends.sagemaker_runtime`),
so the two sides share one codec. botocore reads the same bytes in tests
(tests/unit/test_eventstream.py), so this codec cannot drift from AWS's format unnoticed.

A message: a prelude (total length, headers length, the prelude's CRC32), the headers
(name, type, value), the payload, and the CRC32 of everything before it.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

_PRELUDE = struct.Struct("!II")
_CRC = struct.Struct("!I")
_PRELUDE_BYTES = _PRELUDE.size + _CRC.size  # 12
_MIN_MESSAGE_BYTES = _PRELUDE_BYTES + _CRC.size  # 16: no headers, no payload

# botocore's bounds (botocore.eventstream): a message past them is a broken stream, never a
# buffer that grows without limit.
MAX_HEADERS_BYTES = 128 * 1024
MAX_PAYLOAD_BYTES = 24 * 1024 * 1024

_STRING = 7  # the header value type of a UTF-8 string (the only one this codec writes)
# Fixed-size header value types: (struct format, how the value is read).
_FIXED = {2: "!b", 3: "!h", 4: "!i", 5: "!q", 8: "!q"}


class EventStreamError(ValueError):
    """Bytes that are not a well-formed event stream (a bad CRC, a length past the bounds,
    an unknown header type, a stream cut inside a message)."""


@dataclass(frozen=True, slots=True)
class Message:
    headers: dict[str, object] = field(default_factory=dict)
    payload: bytes = b""

    @property
    def message_type(self) -> str:
        return str(self.headers.get(":message-type", ""))

    @property
    def event_type(self) -> str:
        return str(self.headers.get(":event-type", ""))

    @property
    def error_code(self) -> str:
        """An exception message's type (`ModelStreamError`), or an error message's code."""
        return str(self.headers.get(":exception-type") or self.headers.get(":error-code") or "")


# -- writing ---------------------------------------------------------------------------------


def encode(headers: dict[str, str], payload: bytes) -> bytes:
    """One message, its headers all strings (type 7)."""
    encoded = b"".join(
        struct.pack("!B", len(name.encode())) + name.encode() + struct.pack("!BH", _STRING, len(value.encode()))
        + value.encode() for name, value in headers.items())
    prelude = _PRELUDE.pack(_PRELUDE_BYTES + len(encoded) + len(payload) + _CRC.size, len(encoded))
    message = prelude + _CRC.pack(zlib.crc32(prelude)) + encoded + payload
    return message + _CRC.pack(zlib.crc32(message))


def payload_part(data: bytes) -> bytes:
    """A `PayloadPart` event: a piece of the container's answer."""
    return encode({":event-type": "PayloadPart", ":content-type": "application/octet-stream",
                   ":message-type": "event"}, data)


def model_stream_error(message: str, code: str = "ModelStreamError") -> bytes:
    """A `ModelStreamError` exception: the container failed after the stream began."""
    import json

    body = json.dumps({"Message": message, "ErrorCode": code}).encode()
    return encode({":exception-type": "ModelStreamError", ":content-type": "application/json",
                   ":message-type": "exception"}, body)


# -- reading ---------------------------------------------------------------------------------


class Decoder:
    """Messages from bytes fed in pieces of any size (a piece may end inside a message):
    `feed` the bytes as they arrive, then iterate the whole messages they completed."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[Message]:
        self._buffer += data
        while len(self._buffer) >= _PRELUDE_BYTES:
            total, headers_length = _PRELUDE.unpack_from(self._buffer)
            if _CRC.unpack_from(self._buffer, _PRELUDE.size)[0] != zlib.crc32(self._buffer[:_PRELUDE.size]):
                raise EventStreamError("the prelude's CRC does not match")
            if headers_length > MAX_HEADERS_BYTES:
                raise EventStreamError(f"headers of {headers_length} bytes (at most {MAX_HEADERS_BYTES})")
            payload_length = total - _MIN_MESSAGE_BYTES - headers_length
            if payload_length < 0:
                raise EventStreamError(f"a message of {total} bytes cannot hold {headers_length} bytes of headers")
            if payload_length > MAX_PAYLOAD_BYTES:
                raise EventStreamError(f"a payload of {payload_length} bytes (at most {MAX_PAYLOAD_BYTES})")
            if len(self._buffer) < total:
                return  # the rest of this message is still on its way
            message = bytes(self._buffer[:total])
            del self._buffer[:total]
            if _CRC.unpack_from(message, total - _CRC.size)[0] != zlib.crc32(message[:total - _CRC.size]):
                raise EventStreamError("the message's CRC does not match")
            start = _PRELUDE_BYTES + headers_length
            yield Message(_headers(message[_PRELUDE_BYTES:start]), message[start:total - _CRC.size])

    def close(self) -> None:
        """The stream ended: bytes left over are a message cut short."""
        if self._buffer:
            raise EventStreamError(f"the stream ended inside a message ({len(self._buffer)} bytes left)")


def _headers(data: bytes) -> dict[str, object]:
    headers: dict[str, object] = {}
    at = 0
    try:
        while at < len(data):
            length = data[at]
            name = data[at + 1:at + 1 + length].decode()
            at += 1 + length
            kind = data[at]
            at += 1
            value: object
            if kind in (0, 1):  # true, false: no bytes
                value = kind == 0
            elif kind in _FIXED:
                (value,) = struct.unpack_from(_FIXED[kind], data, at)
                at += struct.calcsize(_FIXED[kind])
            elif kind in (6, _STRING):  # bytes, string: a 2-byte length first
                (size,) = struct.unpack_from("!H", data, at)
                raw = data[at + 2:at + 2 + size]
                if len(raw) != size:
                    raise EventStreamError("a header value runs past the headers")
                value = raw.decode() if kind == _STRING else raw
                at += 2 + size
            elif kind == 9:  # uuid
                raw = data[at:at + 16]
                if len(raw) != 16:
                    raise EventStreamError("a header value runs past the headers")
                value = uuid.UUID(bytes=raw)
                at += 16
            else:
                raise EventStreamError(f"unknown header value type {kind}")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise EventStreamError(f"malformed headers ({type(exc).__name__})") from None
    return headers
