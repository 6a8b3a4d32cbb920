"""The backend adapter alone: a Decision as the scorer's request, and the scorer's answer
read back. An answer that does not fit its question refuses that question only; a body
that is not an answer at all fails the request (502)."""

from __future__ import annotations

import json

import pytest

from gateway.backends.pools import Invocation
from gateway.backends.scorer import backend_request, read_result
from gateway.decisions.model import Decision, Option, Question
from gateway.errors import BackendFailed

REFUND = Question(id="q0", kind="noul", instructions="Asks for a refund?", options=(), name="refund")
QUEUE = Question(id="q1", kind="choice", instructions="Which queue?", name="queue",
                 options=(Option("billing", "billing", "payments"), Option("delivery", "delivery", None)))
ANGER = Question(id="q2", kind="score", instructions="How angry?", name="anger",
                 options=(Option("0", 0, "calm", label="calm"), Option("1", 1, "angry", label="angry")))
DECISION = Decision("jev-latest", {"ticket": 4411}, (REFUND, QUEUE, ANGER), {"x_readout": "letters"})
GOOD = {"q0": {"type": "noul", "noul": 0.7},
        "q1": {"type": "choice", "choice": "billing", "probabilities": {"billing": 0.6, "delivery": 0.2}},
        "q2": {"type": "score", "score": 0.5, "probabilities": {"0": 0.5, "1": 0.5}}}


def read(answers, **extra):
    body = json.dumps({"model": "gemma", "answers": answers, **extra}).encode()
    return read_result(DECISION, Invocation(body, "dg-cpu", 2))


def test_the_request_is_system_one_by_internal_ids_with_the_routes_model():
    body = backend_request(DECISION, "decision-default")
    assert body == {"model": "decision-default", "state": {"ticket": 4411}, "x_readout": "letters", "questions": {
        "q0": {"type": "noul", "instructions": "Asks for a refund?"},
        "q1": {"type": "choice", "instructions": "Which queue?", "criteria": {"billing": "payments", "delivery": None}},
        "q2": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "angry"]}}}


def test_a_good_answer_is_read_normalised_in_declared_order():
    result = read(GOOD, usage={"input_tokens": 30, "x_cached_tokens": 12}, x_readout="letters")
    assert [a.probabilities for a in result.answers] == [(0.7,), pytest.approx((0.75, 0.25)), (0.5, 0.5)]
    assert (result.endpoint, result.attempts, result.usage.cached_tokens) == ("dg-cpu", 2, 12)
    assert result.extensions == {"x_readout": "letters"}


def test_the_injection_signal_is_read_typed_and_passed_through_as_sent():
    signal = {"suspicion": 0.83, "probe": None, "patterns": ["ignore_instructions"], "neutralised": []}
    result = read(GOOD, x_injection=signal, x_framing="spotlight")
    assert result.injection is not None and result.injection.suspicion == 0.83
    assert result.injection.patterns == ["ignore_instructions"] and result.injection.probe is None
    assert result.extensions == {"x_injection": signal, "x_framing": "spotlight"}
    assert read(GOOD).injection is None  # an older scorer


@pytest.mark.parametrize("broken", [
    {"q0": {"type": "choice", "noul": 0.7}},  # another type
    {"q0": {"type": "noul", "noul": 1.5}},  # not a probability
    {"q0": {"type": "noul", "noul": float("nan")}},
    {"q0": {"type": "noul", "noul": True}},
    {"q1": {"type": "choice", "choice": "billing", "probabilities": {"billing": 1.0}}},  # an option missing
    {"q1": {"type": "choice", "choice": "billing", "probabilities": {"billing": 0, "delivery": 0}}},
    {"q2": {"type": "score", "score": 0, "probabilities": ["0.5", "0.5"]}},
    {"q2": None},
])
def test_an_answer_that_does_not_fit_refuses_that_question_only(broken):
    result = read({**GOOD, **broken})
    refused = {a.question.id for a in result.answers if a.refused}
    assert refused == set(broken)


@pytest.mark.parametrize("body", [b"not json", b"[1]", b'{"answers": {}}', b'{"model": "m", "answers": []}',
                                  b'{"model": "m", "answers": {}, "x_debias": "on"}',
                                  b'{"model": "m", "answers": {}, "x_model_sha256": 7}',
                                  b'{"model": "m", "answers": {}, "x_injection": {"suspicion": 2.0}}',
                                  b'{"model": "m", "answers": {}, "x_injection": {"suspicion": "0.9"}}',
                                  b'{"model": "m", "answers": {}, "x_injection": 0.9}'])
def test_a_body_that_is_no_answer_fails_the_request(body):
    with pytest.raises(BackendFailed):
        read_result(DECISION, Invocation(body, "dg-cpu", 1))


@pytest.mark.parametrize(("busy_ms", "by_duration", "charged_s"), [
    (300, False, 0.3),  # a shared instance: the scorer's own time, its line excluded
    (300, True, 2.0),  # Serverless: the invocation is billed for its whole duration
    (2500, False, 2.0),  # longer than the attempt itself: not believed
    (-5, False, 2.0), ("300", False, 2.0), (True, False, 2.0), (None, False, 2.0),  # not a count: ignored
])
def test_a_decision_is_charged_the_time_the_scorer_worked_on_it_where_an_instance_is_shared(busy_ms, by_duration,
                                                                                             charged_s):
    from gateway.decisions.cost import Meter

    # Given a failed attempt of 1 s elsewhere and 2 s on the endpoint that answered
    meter = Meter()
    meter.add("first", 1.0, 0.5)
    meter.add("dg-cpu", 2.0, 0.25, by_duration)
    body = json.dumps({"model": "gemma", "answers": GOOD, "usage": {"input_tokens": 9, "x_busy_ms": busy_ms}}).encode()
    result = read_result(DECISION, Invocation(body, "dg-cpu", 2), meter)
    # Then the failed attempt is charged whole, the answering one as the scorer's figure allows
    assert result.cost.endpoint_seconds == pytest.approx(1.0 + charged_s)
    assert result.cost.endpoint_usd == pytest.approx(0.5 + charged_s * 0.25)


def _with_features(orders, state=None):
    from systemone.features import SKETCH, encode_state
    from systemone.limits import STATE_FEATURE_DIMS

    features = {"orders": orders, "state": state or encode_state([0.5] * STATE_FEATURE_DIMS), "sketch": SKETCH}
    return {**GOOD, "q1": {**GOOD["q1"], "x_features": features}}


@pytest.mark.parametrize(("orders", "state"), [
    ([[-800.0, -800.0]], None),  # log-probabilities of nothing: exp underflows, the mean would divide by 0
    ([[-0.1, -0.1]], None),  # not a distribution (the two sum to 1.8)
    ([[0.5, -2.0]], None),  # a log-probability above 0
    ([[-0.7, -0.7, -0.7]], None),  # three options for a question of two
    ([[-0.6931471805599453, -0.6931471805599453]], "AAAA"),  # good orders, a state that is not 256 numbers
])
def test_malformed_features_are_dropped_and_the_answer_stands(orders, state):
    [_, queue, _] = read(_with_features(orders, state)).answers
    assert not queue.refused and queue.features is None


def test_well_formed_features_are_read_in_declared_order():
    import math

    [_, queue, _] = read(_with_features([[math.log(0.75), math.log(0.25)], [math.log(0.6), math.log(0.4)]])).answers
    assert queue.features is not None and queue.features.orders[1] == (math.log(0.6), math.log(0.4))
