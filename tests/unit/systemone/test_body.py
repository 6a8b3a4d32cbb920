"""The contract's bounded body reader, alone: what it inflates, what it refuses and with which status."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from systemone.body import inflate, read_json
from systemone.errors import InvalidRequest, RequestError
from systemone.limits import MAX_JSON_DEPTH

BODY = json.dumps({"model": "m", "state": "s" * 500}).encode()
GZIP, ZSTD = gzip.compress(BODY, mtime=0), zstandard.ZstdCompressor().compress(BODY)  # the same bytes in every run


@pytest.mark.parametrize(("data", "encoding"), [(BODY, ""), (BODY, "identity"), (GZIP, "gzip"), (ZSTD, " ZSTD ")])
def test_bodies_are_inflated_within_the_limit(data, encoding):
    assert inflate(data, encoding, len(BODY)) == BODY


def said(refused: RequestError) -> str:
    """What the caller reads: a 422's problem, any other refusal's message."""
    return refused.details[0]["msg"] if isinstance(refused, InvalidRequest) else refused.message


@pytest.mark.parametrize(("data", "encoding", "status", "says"), [
    (gzip.compress(b"0" * 100_000, mtime=0), "gzip", 413, "larger than"),
    (zstandard.ZstdCompressor().compress(b"0" * 100_000), "zstd", 413, "larger than"),
    (GZIP[:-6], "gzip", 422, "truncated"),
    (ZSTD[:-4], "zstd", 422, "truncated"),
    (b"not gzip", "gzip", 422, "not valid gzip"),
    (b"not zstd", "zstd", 422, "not valid zstd"),
    (BODY, "br", 415, "not supported"),
])
def test_what_cannot_be_inflated_is_refused_with_its_status(data, encoding, status, says):
    with pytest.raises(RequestError) as refused:
        inflate(data, encoding, len(BODY))
    assert refused.value.status == status and says in said(refused.value)


@pytest.mark.parametrize(("raw", "says"), [
    (b"", "empty"), (b"   ", "empty"), (b"{nope", "not valid JSON"), (b'{"p": NaN}', "NaN"),
    (b'{"p": 1e400}', "too large"), (b'{"s": "\\ud800"}', "surrogate"), (b"\xff\xfe", "UTF-8"),
    (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "deeper"),
    (b'{"n": 1' + b"0" * 200 + b"}", "digits"),
])
def test_what_is_not_a_json_value_is_a_422(raw, says):
    with pytest.raises(InvalidRequest) as refused:
        read_json(raw, "", 10_000)
    assert refused.value.status == 422 and says in said(refused.value)


def test_a_body_at_the_depth_limit_is_read():
    deep = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert read_json(deep, "", 10_000) is not None
