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


def test_the_form_the_openai_sdks_http_client_sends_is_read():
    import httpx

    data = b'{"custom_id": "a"}\n' * 3
    request = httpx.Request("POST", "http://x/v1/files", data={"purpose": "batch"},
                            files={"file": ("tickets \u00e9.jsonl", data, "application/jsonl")})
    fields = form_fields(request.headers["content-type"], request.read())
    assert fields["purpose"].data == b"batch" and fields["file"].data == data
    assert fields["file"].filename == "tickets \u00e9.jsonl"
