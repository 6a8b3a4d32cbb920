"""The local SageMaker stand-in writes event-stream messages botocore reads (the gateway
reads them with botocore's own reader, as it reads AWS's)."""

from __future__ import annotations

from botocore.eventstream import EventStreamBuffer

from devkit.sagemaker_standin import encode, model_stream_error, payload_part


def by_botocore(data: bytes) -> list[tuple[dict, bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(dict(m.headers), m.payload) for m in buffer]


def test_what_the_stand_in_writes_botocore_reads():
    stream = payload_part(b"data: {}\n\n") + payload_part(b"") + model_stream_error("it broke", "ModelInvocationTimeExceeded")
    (part, empty, error) = by_botocore(stream)
    assert part == ({":event-type": "PayloadPart", ":content-type": "application/octet-stream",
                     ":message-type": "event"}, b"data: {}\n\n")
    assert empty[1] == b""
    assert error[0][":exception-type"] == "ModelStreamError" and b"ModelInvocationTimeExceeded" in error[1]


def test_encode_writes_string_headers_botocore_reads():
    assert by_botocore(encode({"a": "é", ":message-type": "event"}, b"p")) == [({"a": "é", ":message-type": "event"}, b"p")]
