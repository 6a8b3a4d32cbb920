"""The event-stream codec both deployables share reads and writes what botocore does."""

from __future__ import annotations

import struct
import uuid
import zlib

import pytest
from botocore.eventstream import EventStreamBuffer

from systemone.eventstream import (
    MAX_PAYLOAD_BYTES,
    Decoder,
    EventStreamError,
    Message,
    encode,
    model_stream_error,
    payload_part,
)


def by_botocore(data: bytes) -> list[tuple[dict, bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(dict(m.headers), m.payload) for m in buffer]


def decoded(data: bytes, piece: int | None = None) -> list[Message]:
    decoder = Decoder()
    piece = piece or len(data) or 1
    found = [m for i in range(0, len(data), piece) for m in decoder.feed(data[i:i + piece])]
    decoder.close()
    return found


def test_what_the_scorer_writes_botocore_reads():
    stream = payload_part(b"data: {}\n\n") + payload_part(b"") + model_stream_error("it broke", "ModelInvocationTimeExceeded")
    (part, empty, error) = by_botocore(stream)
    assert part == ({":event-type": "PayloadPart", ":content-type": "application/octet-stream",
                     ":message-type": "event"}, b"data: {}\n\n")
    assert empty[1] == b""
    assert error[0][":exception-type"] == "ModelStreamError" and b"ModelInvocationTimeExceeded" in error[1]


def _header(name: str, kind: int, value: bytes) -> bytes:
    return struct.pack("!B", len(name)) + name.encode() + struct.pack("!B", kind) + value


def _message(headers: bytes, payload: bytes) -> bytes:
    """Written here by hand from the format's description, not with the codec under test."""
    prelude = struct.pack("!II", 16 + len(headers) + len(payload), len(headers))
    body = prelude + struct.pack("!I", zlib.crc32(prelude)) + headers + payload
    return body + struct.pack("!I", zlib.crc32(body))


EVERY_TYPE = _message(
    _header("yes", 0, b"") + _header("no", 1, b"") + _header("byte", 2, struct.pack("!b", -3))
    + _header("short", 3, struct.pack("!h", -300)) + _header("int", 4, struct.pack("!i", 70000))
    + _header("long", 5, struct.pack("!q", 2**40)) + _header("bytes", 6, struct.pack("!H", 3) + b"\x00\x01\x02")
    + _header(":message-type", 7, struct.pack("!H", 5) + b"event")
    + _header("time", 8, struct.pack("!q", 1764892800000))
    + _header("id", 9, uuid.UUID(int=7).bytes),
    b"payload")


@pytest.mark.parametrize("piece", [1, 2, 5, 13, None], ids=lambda p: f"piece-{p}")
def test_what_botocore_reads_the_gateway_reads_from_pieces_of_any_size(piece):
    stream = EVERY_TYPE + payload_part(b"a" * 300) + model_stream_error("x")
    expected = by_botocore(stream)
    found = decoded(stream, piece)
    assert [m.payload for m in found] == [payload for _, payload in expected]
    assert [m.message_type for m in found] == ["event", "event", "exception"]
    headers = found[0].headers
    assert headers["yes"] is True and headers["no"] is False
    assert [headers[k] for k in ("byte", "short", "int", "long", "bytes", "id")] == [
        -3, -300, 70000, 2**40, b"\x00\x01\x02", uuid.UUID(int=7)]
    assert found[2].error_code == "ModelStreamError"
    for (theirs, _), ours in zip(expected[1:], found[1:], strict=True):
        assert theirs == ours.headers


def _prelude(total: int, headers: int) -> bytes:
    prelude = struct.pack("!II", total, headers)
    return prelude + struct.pack("!I", zlib.crc32(prelude))


def _with_crc(message: bytearray, at: int) -> bytes:
    message[at] ^= 0xFF
    return bytes(message)


@pytest.mark.parametrize("broken", [
    _with_crc(bytearray(payload_part(b"abc")), 8),  # the prelude's CRC
    _with_crc(bytearray(payload_part(b"abc")), -1),  # the message's CRC
    _with_crc(bytearray(payload_part(b"abc")), -5),  # a payload byte
    _prelude(16 + 200 * 1024, 200 * 1024),  # headers past the bound, refused before they arrive
    _prelude(16, 10),  # a message too short for its own headers
    _message(_header("x", 42, b""), b""),  # no such header type
    _message(_header("x", 7, struct.pack("!H", 50) + b"short"), b""),  # a value past the headers
], ids=["prelude-crc", "message-crc", "payload", "headers-bound", "too-short", "unknown-type", "overrun"])
def test_a_malformed_stream_is_refused(broken):
    with pytest.raises(EventStreamError):
        decoded(broken)


def test_a_message_larger_than_the_bound_is_refused_before_its_bytes_arrive():
    with pytest.raises(EventStreamError, match="payload"):
        list(Decoder().feed(_prelude(16 + MAX_PAYLOAD_BYTES + 1, 0)))


def test_a_stream_cut_inside_a_message_is_refused_at_its_end():
    decoder = Decoder()
    assert list(decoder.feed(payload_part(b"abc")[:-3])) == []
    with pytest.raises(EventStreamError, match="ended inside"):
        decoder.close()


def test_encode_writes_string_headers_botocore_reads():
    assert by_botocore(encode({"a": "é", ":message-type": "event"}, b"p")) == [({"a": "é", ":message-type": "event"}, b"p")]
