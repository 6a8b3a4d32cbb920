"""The decision engine against the real SmolLM2 model (no fake engine)."""

import numpy as np
import pytest

from scorer_container.errors import ContextOverflow
from scorer_container.prefix_tree import Branch, Read, evaluate
from scorer_container.schema import DecisionRequest, parse
from tests.conftest import make_engine

pytestmark = pytest.mark.model

STATE = "Customer wrote: I was charged twice for order 4411, refund one please."
QUESTIONS = {
    "is_refund": {"type": "noul", "instructions": "Is the customer asking for a refund?",
                  "criteria": {"true": "asks for money back", "false": "anything else"}},
    "queue": {"type": "choice", "instructions": "Which queue should handle this?",
              "criteria": {"billing": "payments, duplicate charges, refunds, invoices",
                           "delivery": "shipping and tracking", "account": None}},
    "anger": {"type": "score", "instructions": "How frustrated is the customer?",
              "criteria": ["calm", "annoyed", "angry"]},
}


def request(questions=None, **extra):
    return parse(DecisionRequest, {"model": "jev-latest", "state": STATE, "questions": questions or QUESTIONS, **extra})


@pytest.fixture(scope="module", params=["letters", "likelihood"])
def engine(request, smollm2_runtime):
    return make_engine(smollm2_runtime, request.param)


def test_answers_follow_the_contract(engine):
    result = engine.decide(request())
    answers = result["answers"]
    assert list(answers) == list(QUESTIONS)
    assert set(answers["is_refund"]) == {"type", "noul"} and 0 <= answers["is_refund"]["noul"] <= 1
    queue = answers["queue"]
    assert list(queue["probabilities"]) == ["billing", "delivery", "account"]
    assert sum(queue["probabilities"].values()) == pytest.approx(1)
    assert queue["choice"] == max(queue["probabilities"], key=queue["probabilities"].get)
    p = np.array(list(queue["probabilities"].values()))
    assert queue["confidence"] == pytest.approx((3 * p.max() - 1) / 2)
    anger = answers["anger"]
    assert anger["legend"] == {"0": "calm", "1": "annoyed", "2": "angry"}
    levels = np.array([anger["probabilities"][str(i)] for i in range(3)])
    assert anger["score"] == pytest.approx(float(np.dot(np.arange(3), levels)))
    assert 0 <= anger["confidence"] <= 1
    assert type(result["usage"]["input_tokens"]) is int and result["usage"]["input_tokens"] > 0
    assert result["usage"]["output_tokens"] == 0
    assert all(k.startswith("x_") for k in result if k not in ("model", "answers", "usage"))


def test_same_request_same_numbers(engine):
    assert engine.decide(request()) == engine.decide(request())


def test_renaming_a_question_does_not_change_its_answer(engine):
    renamed = {"something else entirely 🎯": QUESTIONS["queue"]}
    before = engine.decide(request({"queue": QUESTIONS["queue"]}))["answers"]["queue"]
    after = engine.decide(request(renamed))["answers"]["something else entirely 🎯"]
    assert after == before


def test_order_averaged_result_does_not_depend_on_declared_order(engine):
    criteria = QUESTIONS["queue"]["criteria"]
    forward = {"q": {**QUESTIONS["queue"], "criteria": criteria}}
    backward = {"q": {**QUESTIONS["queue"], "criteria": dict(reversed(list(criteria.items())))}}
    p1 = engine.decide(request(forward))["answers"]["q"]["probabilities"]
    p2 = engine.decide(request(backward))["answers"]["q"]["probabilities"]
    for name in criteria:
        assert p1[name] == pytest.approx(p2[name], abs=1e-9)


def test_without_order_averaging_the_declared_order_shows(engine):
    criteria = QUESTIONS["queue"]["criteria"]
    backward = {"q": {**QUESTIONS["queue"], "criteria": dict(reversed(list(criteria.items())))}}
    p1 = engine.decide(request({"q": QUESTIONS["queue"]}, x_order_average=False))["answers"]["q"]["probabilities"]
    p2 = engine.decide(request(backward, x_order_average=False))["answers"]["q"]["probabilities"]
    assert any(abs(p1[n] - p2[n]) > 1e-6 for n in criteria)


def test_prior_switch_changes_the_numbers(engine):
    on = engine.decide(request())["answers"]["queue"]["probabilities"]
    off = engine.decide(request(x_prior=False))["answers"]["queue"]["probabilities"]
    assert on != off


def test_a_cached_prior_equals_a_fresh_one(smollm2_runtime):
    fresh_engine = make_engine(smollm2_runtime, "letters")
    first = fresh_engine.decide(request())
    assert fresh_engine.priors.misses > 0
    hits_before = fresh_engine.priors.hits
    second = fresh_engine.decide(request())
    assert fresh_engine.priors.hits > hits_before
    assert first == second


def test_255_options_sum_to_one(engine):
    criteria = {f"product {i:03d}": None for i in range(255)}
    answer = engine.decide(request({"big": {"type": "choice", "instructions": "Which product?", "criteria": criteria}},
                                   x_prior=False))["answers"]["big"]
    assert list(answer["probabilities"]) == list(criteria)
    assert sum(answer["probabilities"].values()) == pytest.approx(1)
    assert all(0 <= v <= 1 for v in answer["probabilities"].values())


def test_more_options_than_letters_uses_groups_and_a_final(smollm2_runtime):
    engine = make_engine(smollm2_runtime, "letters", max_labels=4)
    criteria = {name: None for name in ["red", "green", "blue", "yellow", "black", "white", "pink"]}
    answer = engine.decide(request({"c": {"type": "choice", "instructions": "Pick a colour", "criteria": criteria}}))
    probabilities = answer["answers"]["c"]["probabilities"]
    assert sum(probabilities.values()) == pytest.approx(1) and len(probabilities) == 7


def test_a_state_longer_than_the_context_is_refused(engine):
    with pytest.raises(ContextOverflow):
        engine.decide(parse(DecisionRequest, {"model": "m", "state": "word " * 5000, "questions": QUESTIONS}))


def test_structured_state_is_rendered_canonically(engine):
    a = engine.decide(parse(DecisionRequest, {"model": "m", "state": {"b": 1, "a": [1, 2]}, "questions": QUESTIONS}))
    b = engine.decide(parse(DecisionRequest, {"model": "m", "state": {"a": [1, 2], "b": 1}, "questions": QUESTIONS}))
    assert a == b


def test_shared_prefix_evaluation_equals_evaluating_each_prompt_alone(smollm2_runtime):
    # Given four prompts sharing a long state, when evaluated as one prefix tree,
    # then each read equals the same prompt evaluated alone, and the state is evaluated once.
    runtime = smollm2_runtime
    state = "Text:\n" + "The parcel arrived late and damaged. " * 20
    labels = tuple(runtime.tokenize(" " + c)[0] for c in "ABCD")
    branches = []
    for q in range(4):
        tokens = runtime.tokenize(f"{state}\n\nQuestion {q}: which team?\nA\nB\nC\nD\nAnswer:")
        branches.append(Branch(tuple(tokens), (Read(len(tokens) - 1, labels),)))
    together = evaluate(runtime, branches)
    assert together.evaluated_tokens < sum(len(b.tokens) for b in branches) / 2
    for i, branch in enumerate(branches):
        alone = evaluate(runtime, [branch]).results[0][0]
        np.testing.assert_allclose(together.results[i][0], alone, atol=1e-4)
