"""The multipart form `POST /v1/files` and an upload's parts arrive in."""

import pytest

from gateway.errors import InvalidRequest
from gateway.wire.batches import form_fields
from tests.gateway_helpers import multipart


def test_fields_and_files_are_read_with_their_bytes_intact():
    data = bytes(range(256)) + b"\r\n--not-the-boundary\r\n"
    body, content_type = multipart({"purpose": b"batch"}, {"file": ('in "x".jsonl', data)})
    fields = form_fields(content_type, body)
    assert fields["purpose"].data == b"batch" and fields["purpose"].filename is None
    assert fields["file"].data == data


@pytest.mark.parametrize(("content_type", "body"), [
    ("application/json", b"{}"),
    ("multipart/form-data", b"--x\r\n"),
    ("multipart/form-data; boundary=x", b"garbage"),
    ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="a"'),
])
def test_what_is_not_a_multipart_form_is_refused(content_type, body):
    with pytest.raises(InvalidRequest):
        form_fields(content_type, body)
