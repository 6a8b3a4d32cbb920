"""The asynchronous pool's answer book: a request is taken down the first time, answered from
the pool's output the second, only if it is the same request, and charged the scorer's time."""

from __future__ import annotations

import json

import pytest

from gateway.backends.base import Caller, Endpoint, EndpointFailed, EndpointRejected
from gateway.backends.deferred import AnswerBook, PoolAnswer, digest, read_line_id
from gateway.backends.pools import Circuits, EndpointPool, PoolEndpoint, PoolPolicy
from gateway.backends.sagemaker import deadline_ms
from gateway.decisions.cost import Meter
from gateway.errors import AnsweredLater
from systemone.sidechannel import parse_attributes

ENDPOINT = Endpoint("dg-async", read_timeout_s=23.0, usd_per_second=0.001)
CALLER = Caller("batch_req_abc_0", "ab" * 16, "bulk", 2.0)
BODY = b'{"state":"s","model":"m","questions":{}}'


def test_a_request_is_taken_down_with_its_attributes_and_its_line_is_the_scorers_lines_format():
    book = AnswerBook(wait_s=60)
    with pytest.raises(AnsweredLater):
        book.invoke(ENDPOINT, BODY, "systemone", CALLER)
    asked = book.take(CALLER.request_id)
    assert asked is not None and book.take(CALLER.request_id) is None  # taken once
    line = json.loads(asked.as_line())
    assert line["body"] == json.loads(BODY) and line["route"] == "systemone"
    assert read_line_id(line["id"]) == (CALLER.request_id, digest("systemone", BODY))
    attributes = parse_attributes(line["attributes"])
    assert attributes["tenant"] == CALLER.tenant_tag and attributes["work"] == "bulk"
    assert attributes["request_id"] == CALLER.request_id
    assert int(attributes["timeout_ms"]) == deadline_ms(ENDPOINT) == asked.deadline_s * 1000


@pytest.mark.parametrize("line_id", [None, 7, "no-digest", "a#b#c", "#" + "0" * 64, "req#short"])
def test_an_id_this_gateway_never_sent_is_not_read(line_id):
    assert read_line_id(line_id) is None


def test_an_answer_goes_only_to_the_request_it_answers():
    book = AnswerBook(wait_s=60)
    book.learn(CALLER.request_id, PoolAnswer(digest("systemone", b'{"other":1}'), 200, b'{"answers":{}}'))
    with pytest.raises(AnsweredLater):  # the request changed since it was sent: sent again
        book.invoke(ENDPOINT, BODY, "systemone", CALLER)
    assert book.take(CALLER.request_id) is not None
    book.learn(CALLER.request_id, PoolAnswer(digest("systemone", BODY), 200, b'{"answers":{}}'))
    assert book.invoke(ENDPOINT, BODY, "systemone", CALLER) == b'{"answers":{}}'
    with pytest.raises(AnsweredLater):  # given once
        book.invoke(ENDPOINT, BODY, "systemone", CALLER)


def test_an_error_answer_is_the_error_a_real_time_answer_of_that_status_is_and_a_busy_one_is_sent_again():
    book = AnswerBook(wait_s=60)
    refused = json.dumps({"error": {"message": "too long"}}).encode()
    book.learn(CALLER.request_id, PoolAnswer(digest("systemone", BODY), 413, refused))
    with pytest.raises(EndpointRejected) as rejected:
        book.invoke(ENDPOINT, BODY, "systemone", CALLER)
    assert rejected.value.status == 413 and rejected.value.body == refused
    failed = json.dumps({"error": {"message": "crashed"}}).encode()
    book.learn(CALLER.request_id, PoolAnswer(digest("systemone", BODY), 500, failed))
    with pytest.raises(EndpointFailed):
        book.invoke(ENDPOINT, BODY, "systemone", CALLER)
    for status, state in ((503, "queue_timeout"), (429, "tenant_share")):  # not run there: neither busy nor an error
        busy = json.dumps({"error": {"message": "not run"}, "x_state": state, "x_retry_after": 5}).encode()
        book.learn(CALLER.request_id, PoolAnswer(digest("systemone", BODY), status, busy))
        with pytest.raises(AnsweredLater):
            book.invoke(ENDPOINT, BODY, "systemone", CALLER)
        assert book.take(CALLER.request_id) is not None


def test_the_pool_charges_an_answer_the_scorers_time_and_a_taken_request_nothing():
    book = AnswerBook(wait_s=60)
    pool = EndpointPool((PoolEndpoint(ENDPOINT, tier=0),), PoolPolicy(), Circuits(PoolPolicy()), clock=book.clock)
    for _ in range(PoolPolicy().failure_threshold + 1):  # the route's 503, however often: no circuit opens
        with pytest.raises(AnsweredLater) as waits:
            pool.ask(book, BODY, "systemone", caller=CALLER, meter=Meter())
        assert waits.value.retry_after == 60 and book.take(CALLER.request_id) is not None
    assert pool.circuits.allow(ENDPOINT.name, True)  # it says nothing of the endpoint
    answer = json.dumps({"answers": {}, "model": "m", "usage": {"x_busy_ms": 2500}}).encode()
    book.learn(CALLER.request_id, PoolAnswer(digest("systemone", BODY), 200, answer))
    meter = Meter()
    assert pool.ask(book, BODY, "systemone", caller=CALLER, meter=meter).body == answer
    assert 2.5 <= meter.seconds < 3.0 and meter.cost().endpoint_usd == pytest.approx(meter.seconds * 0.001)


def test_the_output_lines_own_time_is_charged_where_the_answer_says_none_a_chats():
    book = AnswerBook(wait_s=60)
    chat = b'{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3}}'
    book.learn(CALLER.request_id, PoolAnswer(digest("chat", BODY), 200, chat, busy_s=0.75))  # the line's own figure
    before = book.clock()
    assert book.invoke(ENDPOINT, BODY, "chat", CALLER) == chat
    assert book.clock() - before >= 0.75


def test_a_line_leaves_nothing_in_the_book_once_taken_even_an_answer_its_route_never_asked_for():
    book = AnswerBook(wait_s=60)
    book.learn(CALLER.request_id, PoolAnswer(digest("systemone", BODY), 200, b'{"answers":{}}'))
    assert book.take(CALLER.request_id) is None  # its route refused it before any call: nothing taken down
    with pytest.raises(AnsweredLater):  # and the answer it did not ask for is gone
        book.invoke(ENDPOINT, BODY, "systemone", CALLER)
