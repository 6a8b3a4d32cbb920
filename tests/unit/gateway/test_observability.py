"""Credentials never reach a log line, whatever carries them."""

from __future__ import annotations

import logging

from gateway.observability import RedactCredentials, redact

KEY = "dgk_0123456789abcdef_" + "S" * 43


def test_redact_finds_keys_bearer_values_and_jwts():
    text = f"key={KEY} auth=Bearer abc.def-ghi jwt=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"
    out = redact(text)
    assert KEY not in out and "abc.def-ghi" not in out and "c2lnbmF0dXJl" not in out
    assert out.count("[redacted]") == 3


def test_the_filter_scrubs_message_arguments_extras_and_exception_text():
    record = logging.LogRecord("gateway.x", logging.ERROR, __file__, 1, "got %s", (KEY,), None)
    record.header = f"Bearer {KEY}"
    try:
        raise ValueError(f"bad key {KEY}")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert RedactCredentials().filter(record)
    assert KEY not in record.getMessage() and KEY not in record.header
    assert record.exc_info is None and "ValueError" in record.exception_trace and KEY not in record.exception_trace
