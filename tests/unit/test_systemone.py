"""The gateway-to-scorer contract, both ways, by property: every request the gateway can
build from a valid caller request validates on the scorer, and every answer the scorer
can give parses in the gateway as the answer it is (no question read as refused).

Both sides are the real code: the gateway's wire models and backend adapter, the
scorer's request model and answer renderer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.backends.pools import Invocation
from gateway.backends.scorer import backend_request, json_bytes, read_result
from gateway.wire.openai_decisions import DecisionsRequest
from gateway.wire.systemone import SystemOneRequest
from scorer_container import errors as scorer_errors
from scorer_container.answers import answer
from scorer_container.questions import prepare_question
from scorer_container.schema import DecisionRequest, parse
from tests.conftest import examples

# Text as JSON carries it (no lone surrogates: they are not UTF-8), short and long.
plain = st.text(st.characters(exclude_categories=("Cs",)), min_size=0, max_size=40)
words = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20).filter(str.strip)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | plain,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(plain, inner, max_size=3),
                           max_leaves=6)
text = plain | st.dictionaries(plain, json_values, min_size=1, max_size=3) | st.lists(json_values, min_size=1, max_size=3)
maybe = st.none() | text

noul = st.fixed_dictionaries({"type": st.just("noul"), "instructions": text},
                             optional={"criteria": st.fixed_dictionaries({}, optional={"true": maybe, "false": maybe})})
choice = st.fixed_dictionaries({"type": st.just("choice"),
                                "criteria": st.dictionaries(words, maybe, min_size=2, max_size=8)},
                               optional={"instructions": maybe})
score = st.fixed_dictionaries({"type": st.just("score"), "criteria": st.lists(text, min_size=2, max_size=10)},
                              optional={"instructions": maybe})
system_one = st.fixed_dictionaries({
    "model": st.just("jev-latest"), "state": text,
    "questions": st.dictionaries(words, noul | choice | score, min_size=1, max_size=5),
}, optional={"x_readout": st.sampled_from(["letters", "likelihood"]), "x_prior": st.booleans(),
             "x_order_average": st.booleans()})

option = st.fixed_dictionaries({"value": words | st.booleans()}, optional={"description": st.none() | plain})
openai_question = (
    st.fixed_dictionaries({"type": st.just("predicate"), "instructions": plain.filter(str.strip)})
    | st.fixed_dictionaries({"type": st.just("choice"), "instructions": plain.filter(str.strip),
                             "choices": st.lists(option, min_size=2, max_size=6)})
    | st.fixed_dictionaries({"type": st.just("score"), "instructions": plain.filter(str.strip),
                             "levels": st.lists(st.fixed_dictionaries({"label": words}), min_size=2, max_size=10)})
)
openai = st.fixed_dictionaries({"model": st.just("jev-latest"), "input": plain.filter(str.strip),
                                "questions": st.lists(openai_question, min_size=1, max_size=4)})


def caller_decision(model: type, body: dict):
    """The Decision the gateway makes of a caller's body, or nothing when the body is invalid."""
    try:
        return model.model_validate(body).to_decision()
    except ValidationError:
        assume(False)


def on_the_scorer(decision) -> DecisionRequest:
    """What the scorer makes of the bytes the gateway sends it (raises its 422 if it refuses them)."""
    return parse(DecisionRequest, json.loads(json_bytes(backend_request(decision, "decision-default"))))


CONTRACT = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@CONTRACT
@given(body=system_one)
def test_every_system_one_request_the_gateway_accepts_validates_on_the_scorer(body):
    decision = caller_decision(SystemOneRequest, body)
    scored = on_the_scorer(decision)
    assert list(scored.questions) == [q.id for q in decision.questions]
    assert [q.type for q in scored.questions.values()] == [q.kind for q in decision.questions]


@CONTRACT
@given(body=openai)
def test_every_openai_decisions_request_the_gateway_accepts_validates_on_the_scorer(body):
    decision = caller_decision(DecisionsRequest, body)
    assert len(on_the_scorer(decision).questions) == len(decision.questions)


@CONTRACT
@given(body=system_one | openai, seed=st.integers(0, 2**32 - 1))
def test_every_answer_the_scorer_gives_parses_in_the_gateway_as_that_answer(body, seed):
    decision = caller_decision(SystemOneRequest if "state" in body else DecisionsRequest, body)
    scored = on_the_scorer(decision)
    rng = np.random.default_rng(seed)
    given_p = {}
    answers = {}
    for qid, question in scored.questions.items():
        prepared = prepare_question(qid, question)
        p = rng.dirichlet(np.ones(len(prepared.options)))
        answers[qid] = answer(prepared, p)
        given_p[qid] = p / p.sum()
    reply = {"model": "decision-default", "answers": answers, "usage": {"input_tokens": 12, "output_tokens": 0},
             "x_readout": "letters"}
    outcome = read_result(decision, Invocation(json.dumps(reply).encode(), "endpoint", 1))
    for read in outcome.answers:
        assert not read.refused
        expected = given_p[read.question.id]
        np.testing.assert_allclose(read.probabilities, expected[:1] if read.question.kind == "noul" else expected,
                                   rtol=1e-9, atol=1e-12)
    assert outcome.usage.input_tokens == 12


INVALID = [
    {"model": "jev-latest", "state": "s", "questions": {"": {"type": "noul", "instructions": "?"}}},
    {"model": "jev-latest", "state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": None}}}},
    {"model": "jev-latest", "state": "s", "questions": {"q": {"type": "choice", "criteria": {" ": 1, "b": None}}}},
    {"model": "jev-latest", "state": "s", "questions": {"q": {"type": "score", "criteria": {"0": "low"}}}},
    {"model": "jev-latest", "state": 3, "questions": {"q": {"type": "noul"}}},
    {"model": "", "state": "s", "questions": {}},
    {"model": "jev-latest", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}, "x_readout": "magic"},
]


def test_a_body_both_refuse_gets_the_same_problems_from_both():
    # The gateway's 422 (through its real handler) and the scorer's, item for item.
    from devkit.fake_backend import UniformBackend
    from devkit.gateway_stack import event, install
    from scorer_container.errors import InvalidRequest
    from tests.gateway_helpers import call

    install(UniformBackend())
    for body in INVALID:
        status, _, gateway = call(event("POST", "/v1/systemone", body))
        with pytest.raises(InvalidRequest) as refused:
            parse(DecisionRequest, body)
        assert status == 422 and gateway["detail"] == refused.value.details, body


def test_a_non_text_chat_part_is_refused_by_both_when_the_body_is_validated():
    from devkit.fake_backend import UniformBackend
    from devkit.gateway_stack import event, install
    from scorer_container.errors import InvalidRequest
    from scorer_container.schema import ChatRequest
    from tests.gateway_helpers import call

    body = {"model": "chat-default", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}
    backend = UniformBackend()
    install(backend)
    status, _, gateway = call(event("POST", "/v1/chat/completions", body))
    with pytest.raises(InvalidRequest) as refused:
        parse(ChatRequest, body)
    assert status == 422 and backend.calls == []
    assert "only text content parts" in gateway["error"]["message"]
    assert refused.value.details[0]["msg"] == "only text content parts are supported"


# -- beside the body: the scorer's errors and the custom attributes ----------------------------

SCORER_ERRORS = [  # every kind of error the scorer answers, as it raises them
    ("invalid", lambda: scorer_errors.InvalidRequest.at(["questions", "q"], "bad question")),
    ("too large", lambda: scorer_errors.PayloadTooLarge("the body is larger than 8 bytes")),
    ("over budget", lambda: scorer_errors.OverBudget("this request needs about 9000 tokens' worth")),
    ("context", lambda: scorer_errors.ContextOverflow("a probe needs 9000 tokens of context")),
    ("encoding", lambda: scorer_errors.UnsupportedMedia("unsupported Content-Encoding")),
    ("overloaded", lambda: scorer_errors.Overloaded("busy", 3)),
    ("not ready", lambda: scorer_errors.ModelNotReady("the model is loading")),
    ("cut", lambda: scorer_errors.DeadlineExceeded("the deadline passed")),
    ("queue", lambda: scorer_errors.QueueTimeout("waited too long", 4)),
    ("failed", lambda: scorer_errors.ServiceError("the scorer failed on this request")),
]


def through_sagemaker(exc: Exception, flavor: str) -> Exception:
    """The scorer's error answer, as InvokeEndpoint hands it to the gateway (ModelError), classified there."""
    from starlette.applications import Starlette
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from devkit.sagemaker_standin import SageMakerStandIn
    from gateway.backends.sagemaker import _classify
    from scorer_container.server import error_response

    async def invocations(request):
        return error_response(exc, flavor)

    scorer = Starlette(routes=[Route("/invocations", invocations, methods=["POST"])])
    answer = TestClient(SageMakerStandIn(scorer)).post("/endpoints/ep/invocations", content=b"{}")
    assert answer.status_code == 424 and answer.headers["x-amzn-errortype"].startswith("ModelError:")
    return _classify("ep", {"Error": {"Code": "ModelError"}, **answer.json()})


@pytest.mark.parametrize("flavor", ["systemone", "openai"])
@pytest.mark.parametrize(("name", "make"), SCORER_ERRORS, ids=[n for n, _ in SCORER_ERRORS])
def test_every_scorer_error_reaches_the_gateway_as_what_it_is(name, make, flavor):
    # Given each error the scorer answers, in both body shapes, when SageMaker passes it on,
    # the gateway reads the kind the scorer meant: a client error with its message (a 422
    # with its problems), busy with the scorer's Retry-After, cut (never re-sent), failed.
    from gateway.backends.base import EndpointBusy, EndpointFailed, EndpointRejected, EndpointTimedOut
    from gateway.backends.pools import rejection_error

    exc = make()
    read = through_sagemaker(exc, flavor)
    if isinstance(exc, scorer_errors.RequestError):
        assert isinstance(read, EndpointRejected) and read.status == exc.status
        error = rejection_error(read)
        if isinstance(exc, scorer_errors.InvalidRequest) and flavor == "systemone":
            assert error.details == exc.details
        else:
            assert exc.message in error.message
    elif exc.status == 503:
        assert isinstance(read, EndpointBusy) and read.retry_after == exc.retry_after
    elif exc.status == 504:
        assert isinstance(read, EndpointTimedOut) and read.answered
    else:
        assert isinstance(read, EndpointFailed)


@given(route=st.sampled_from(["systemone", "chat"]), timeout_ms=st.integers(1, 10**8),
       request_id=st.text(max_size=200))
def test_what_the_gateway_writes_in_the_custom_attributes_the_scorer_reads_back(route, timeout_ms, request_id):
    # Any request id (hostile ones too: separators, newlines, 200 characters) travels as its
    # safe form, and never breaks the route or the deadline beside it.
    from systemone import sidechannel

    header = sidechannel.attributes(route, timeout_ms, request_id)
    assert len(header) <= sidechannel.MAX_ATTRIBUTES_CHARS
    pairs = sidechannel.parse_attributes(header)
    assert sidechannel.route_of(pairs) == route
    assert sidechannel.timeout_of(pairs, ceiling=10**7) == timeout_ms / 1000
    assert sidechannel.request_id_of(pairs) == sidechannel.safe_request_id(request_id)


def test_a_scorer_answer_keeps_its_own_confidence_and_score_in_the_gateway():
    # The gateway reports the scorer's confidence and expected score as the scorer computed
    # them (systemone.answers: one set of formulas for both sides) where they describe the
    # probabilities; it computes each figure once, and its own after it changed them.
    from gateway.decisions.model import confidence_of, score_of

    body = parse(DecisionRequest, {"model": "m", "state": "s", "questions": {
        "a": {"type": "score", "criteria": ["low", "mid", "high"]}}})
    decision = SystemOneRequest.model_validate({"model": "m", "state": "s", "questions": {
        "a": {"type": "score", "criteria": ["low", "mid", "high"]}}}).to_decision()
    sent = answer(prepare_question("a", body.questions["a"]), np.array([0.2, 0.3, 0.5]))
    qid = decision.questions[0].id

    def read(answer: dict):
        (got,) = read_result(decision, Invocation(json_bytes({"model": "m", "answers": {qid: answer}}), "ep", 1)).answers
        return got

    kept = read(sent)
    assert (kept.confidence, kept.score) == (sent["confidence"], sent["score"])  # the scorer's own floats
    changed = kept.recalibrated((0.1, 0.2, 0.7))
    assert changed.score == pytest.approx(1.6) and changed.confidence == pytest.approx(0.6)
    assert (score_of(changed), confidence_of(changed)) == (changed.score, changed.confidence)  # read, not recomputed
    # Figures that contradict the probabilities (a scorer of another version), or over options
    # the question lacks, are not passed on: computed here instead.
    for lying in ({**sent, "confidence": 0.9}, {**sent, "score": 0.2},
                  {**sent, "probabilities": {**sent["probabilities"], "3": 0.0}, "score": 1.9}):
        got = read(lying)
        assert got.score == pytest.approx(1.3) and got.confidence == pytest.approx(sent["confidence"])


@pytest.mark.parametrize("wire", ["systemone", "openai", "scorer"])
def test_a_question_name_is_any_text_up_to_its_bound_and_a_422_past_it(wire):
    # Given names of the bound and one past it (any text: spaces and emoji count as characters)
    from pydantic import ValidationError

    from systemone.errors import validation_details
    from systemone.limits import MAX_QUESTION_NAME_CHARS
    from systemone.models import DecisionRequest as ScorerRequest

    def body(name: str) -> dict:
        if wire == "openai":
            return {"model": "m", "input": "s", "questions": [{"type": "predicate", "name": name, "instructions": "?"}]}
        return {"model": "m", "state": "s", "questions": {name: {"type": "noul", "instructions": "?"}}}

    model = {"systemone": SystemOneRequest, "openai": DecisionsRequest, "scorer": ScorerRequest}[wire]
    fits = "é 🙂" + "x" * (MAX_QUESTION_NAME_CHARS - 3)
    assert model.model_validate(body(fits))  # accepted, and returned unchanged (the contract tests above)
    # When one is a character longer (a 280 KB one was once stored whole), it is a 422 naming
    # the limit, and the error echoes no more than the bound of it
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body(fits + "x" * 280_000))
    [problem] = validation_details(refused.value.errors())
    assert problem["type"] == "string_too_long" and str(MAX_QUESTION_NAME_CHARS) in problem["msg"]
    assert len(str(problem)) < 2 * MAX_QUESTION_NAME_CHARS
