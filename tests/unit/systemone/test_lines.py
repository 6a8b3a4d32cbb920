"""The lines of an asynchronous invocation, as both deployables write and read them."""

from __future__ import annotations

import json

import pytest

from systemone.lines import busy_seconds, in_line, out_line, read_out_line


def test_a_request_line_carries_its_body_as_sent_and_an_answer_line_reads_back():
    body = b'{"state":"caf\\u00e9 \\"quoted\\"\\nnext","model":"m"}'  # escapes kept as they were sent
    line = in_line("req-1#ab", "systemone", "route=systemone;timeout_ms=22000", body)
    assert line.endswith(b"}\n") and line.count(b"\n") == 1 and body in line
    assert json.loads(line) == {"id": "req-1#ab", "route": "systemone", "attributes": "route=systemone;timeout_ms=22000",
                                "body": json.loads(body)}
    answered = read_out_line(out_line("req-1#ab", 1, 200, {"answers": {"q": 1}}, 412))
    assert answered is not None and (answered.id, answered.status, answered.busy_s) == ("req-1#ab", 200, 0.412)
    assert json.loads(answered.body) == {"answers": {"q": 1}}


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'{"status": 200}', b'{"id": null, "status": 400}',
                                 b'{"id": "x", "status": true}', b'{"id": "x", "status": "200"}'])
def test_a_line_that_is_not_an_answer_is_not_read_as_one(raw):
    assert read_out_line(raw) is None


@pytest.mark.parametrize(("value", "seconds"), [(0, 0.0), (1500, 1.5), (3_600_000, 3600.0), (-1, None),
                                                (3_600_001, None), (True, None), (1.5, None), ("5", None)])
def test_a_busy_figure_is_a_count_within_an_invocations_hour(value, seconds):
    assert busy_seconds(value) == seconds
