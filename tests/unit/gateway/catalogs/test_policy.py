"""Calibration (temperature), thresholds (auto / review / abstain) and the injection rule."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gateway.catalogs.model import InjectionRule, Policy, Rule, content_hash, parse_content
from gateway.catalogs.policy import answered_by, apply_catalogs, fitted_here, judge, measures, with_temperature
from gateway.decisions.model import Answer, CatalogBinding, DecisionResult, FitKey, Option, Question, Usage
from systemone.models import InjectionSignal


def test_temperature_sharpens_below_one_flattens_above_and_keeps_order():
    p = (0.6, 0.3, 0.1)
    sharp, flat = with_temperature("choice", p, 0.5), with_temperature("choice", p, 2.0)
    assert sum(sharp) == pytest.approx(1) and sum(flat) == pytest.approx(1)
    assert sharp[0] > 0.6 > flat[0] and sorted(sharp, reverse=True) == list(sharp)
    assert with_temperature("choice", p, 1.0) == p
    assert with_temperature("noul", (0.8,), 2.0)[0] == pytest.approx(1 / (1 + 4 ** -0.5))  # logit 2 ln2 halved
    assert with_temperature("noul", (0.5,), 0.1) == pytest.approx((0.5,))
    assert 0 < with_temperature("noul", (1.0,), 3.0)[0] < 1


def test_measures_per_kind():
    assert measures("noul", (0.9,)) == pytest.approx((0.9, 0.8, 0.8))
    top, margin, confidence = measures("choice", (0.5, 0.3, 0.2))
    assert (top, margin) == pytest.approx((0.5, 0.2)) and confidence == pytest.approx((3 * 0.5 - 1) / 2)
    assert measures("score", (0.0, 1.0, 0.0))[2] == 1.0


@pytest.mark.parametrize(
    ("probabilities", "policy", "action"),
    [
        ((0.9, 0.1), Policy(), "auto"),
        ((0.6, 0.4), Policy(), "review"),
        ((0.4, 0.35, 0.25), Policy(), "abstain"),
        ((0.85, 0.15), Policy(auto=Rule(min_top=0.8, min_margin=0.75)), "review"),  # top holds, margin 0.7 does not
        ((0.85, 0.15), Policy(auto=Rule(min_confidence=0.8)), "review"),  # two options: confidence 2 * 0.85 - 1 = 0.7
        ((0.85, 0.15), Policy(auto=Rule(min_confidence=0.7)), "auto"),
    ],
)
def test_each_rule_decides_the_action(probabilities, policy, action):
    assert judge("choice", probabilities, policy).action == action


def test_a_rule_with_no_conditions_always_holds():
    assert judge("noul", (0.5,), Policy(auto=Rule())).action == "auto"


# -- a suspected injection (the scorer's x_injection.suspicion) ------------------------------

ENFORCING = Policy(mode="enforcing")
CONFIDENT, UNSURE, LOST = (0.9, 0.1), (0.6, 0.4), (0.4, 0.35, 0.25)  # auto, review, abstain under the default rules


@pytest.mark.parametrize(("policy", "suspicion", "action"), [
    (ENFORCING, 0.5, "review"),  # the default threshold is reached at 0.5 exactly
    (ENFORCING, 0.4999, "auto"),
    (Policy(mode="enforcing", injection=InjectionRule(threshold=0.8)), 0.8, "review"),
    (Policy(mode="enforcing", injection=InjectionRule(threshold=0.8)), 0.79, "auto"),
    (Policy(mode="enforcing", injection=InjectionRule(threshold=0.0)), 0.0, "review"),
])
def test_the_threshold_is_reached_at_its_value(policy, suspicion, action):
    assert judge("choice", CONFIDENT, policy, suspicion).action == action


def test_an_enforcing_policy_sends_a_suspected_injection_to_review_by_default():
    verdict = judge("choice", CONFIDENT, ENFORCING, 0.9)
    assert (verdict.action, verdict.reason) == ("review", "injection_suspected")
    assert verdict.top == pytest.approx(0.9)  # the measures are still the answer's own


def test_an_advisory_policy_ignores_it_by_default_unless_it_says_otherwise():
    assert judge("choice", CONFIDENT, Policy(), 0.99) == judge("choice", CONFIDENT, Policy())
    told = judge("choice", CONFIDENT, Policy(injection=InjectionRule(action="review")), 0.99)
    assert (told.action, told.reason) == ("review", "injection_suspected")


def test_an_enforcing_policy_may_ignore_it_explicitly():
    assert judge("choice", CONFIDENT, Policy(mode="enforcing", injection=InjectionRule(action="ignore")), 1.0).action == "auto"


def test_abstain_turns_auto_and_review_into_abstain():
    policy = Policy(mode="enforcing", injection=InjectionRule(action="abstain"))
    for probabilities in (CONFIDENT, UNSURE):
        verdict = judge("choice", probabilities, policy, 0.7)
        assert (verdict.action, verdict.reason) == ("abstain", "injection_suspected")


def test_a_suspicion_never_softens_a_verdict_nor_explains_one_it_did_not_change():
    assert judge("choice", UNSURE, ENFORCING, 0.9).reason is None  # review stays review: the rules gave it
    abstained = judge("choice", LOST, ENFORCING, 0.9)
    assert (abstained.action, abstained.reason) == ("abstain", None)


def test_no_signal_changes_nothing():
    for policy in (ENFORCING, Policy(mode="enforcing", injection=InjectionRule(threshold=0.0, action="abstain"))):
        verdict = judge("choice", CONFIDENT, policy)
        assert (verdict.action, verdict.reason) == ("auto", None)


@pytest.mark.parametrize(("rule", "action"), [
    (InjectionRule(require_signal=True), "review"),  # an enforcing entry's default action
    (InjectionRule(require_signal=True, action="abstain"), "abstain"),
])
def test_an_entry_that_requires_the_signal_does_not_trust_an_answer_without_one(rule, action):
    policy = Policy(mode="enforcing", injection=rule)
    verdict = judge("choice", CONFIDENT, policy)
    assert (verdict.action, verdict.reason) == (action, None if action == "auto" else "injection_signal_missing")
    assert judge("choice", CONFIDENT, policy, 0.1).action == "auto"  # a signal below the threshold: trusted


def test_apply_catalogs_judges_by_the_results_injection_signal():
    binding = CatalogBinding("routing", 1, "h" * 64, policy=ENFORCING)
    question = Question("q0", "choice", "Which queue?", (Option("a", "a"), Option("b", "b")), name="queue", binding=binding)
    result = DecisionResult("m", (Answer(question, CONFIDENT),), Usage())
    assert apply_catalogs(result).answers[0].verdict.action == "auto"  # an older scorer: no x_injection
    for suspicion, action in ((0.9, "review"), (0.1, "auto")):
        signal = InjectionSignal(suspicion=suspicion, patterns=["ignore_instructions"])
        assert apply_catalogs(replace(result, injection=signal)).answers[0].verdict.action == action


def test_an_entry_without_an_injection_rule_keeps_its_canonical_json_and_hash():
    # Computed by the gateway before policies had `injection`: entries stored then must
    # re-dump byte for byte, or re-applying an unchanged catalog would make new versions.
    for content, canonical, digest in OLD_ENTRIES:
        entry = parse_content(json.dumps(content))
        assert entry.canonical() == canonical and content_hash(entry.canonical()) == digest
        assert parse_content(canonical).canonical() == canonical
    with_rule = parse_content(json.dumps({**OLD_ENTRIES[1][0], "policy": {"injection": {}}}))
    assert '"injection":{"threshold":0.5}' in with_rule.canonical()


OLD_ENTRIES = [
    ({"type": "choice", "instructions": "Which queue should handle this ticket?",
      "options": [{"name": "billing", "description": "payments, refunds"}, {"name": "delivery"}, {"name": "account"}],
      "abstain": {"name": "human", "description": "a person decides"},
      "policy": {"mode": "enforcing", "auto": {"min_top": 0.8}, "review": {"min_top": 0.5, "min_margin": 0.2}},
      "calibration": {"temperature": 1.0}},
     '{"abstain":{"description":"a person decides","name":"human"},"calibration":{"temperature":1.0},'
     '"instructions":"Which queue should handle this ticket?","options":[{"description":"payments, refunds",'
     '"name":"billing"},{"name":"delivery"},{"name":"account"}],"policy":{"auto":{"min_top":0.8},"mode":"enforcing",'
     '"review":{"min_margin":0.2,"min_top":0.5}},"readout":{},"type":"choice"}',
     "a38f10383dfe3f682ee0b843dbb67391a51c9fc45a4a5b6c3a4211230ba75fe0"),
    ({"type": "noul", "instructions": "Refund?", "policy": {}},
     '{"calibration":{"temperature":1.0},"instructions":"Refund?","policy":{"auto":{"min_top":0.8},"mode":"advisory",'
     '"review":{"min_top":0.5}},"readout":{},"type":"noul"}',
     "d584721633c80657b732aef4127e6a6dda2e4c214e4bb1abe6a3259e1f00b062"),
]


MODEL_A, MODEL_B = "a" * 64, "b" * 64
ANSWERED = {"x_model_sha256": MODEL_A, "x_prompt_version": "decision-prompt/2", "x_readout": "likelihood"}


@pytest.mark.parametrize(("fitted_on", "applies"), [
    (None, True),  # a temperature set by hand, nothing fitted: it claims no model
    (FitKey(MODEL_A, "decision-prompt/2", "likelihood"), True),
    (FitKey(MODEL_A, None, None), True),  # what the fit does not record is not compared
    (FitKey(MODEL_B, "decision-prompt/2", "likelihood"), False),
    (FitKey(MODEL_A, "decision-prompt/1", "likelihood"), False),
    (FitKey(MODEL_A, "decision-prompt/2", "letters"), False),
    (FitKey(None, "decision-prompt/2", "likelihood"), False),  # fitted before models were recorded: on which?
])
def test_a_calibration_applies_to_answers_of_what_it_was_fitted_on_only(fitted_on, applies):
    assert fitted_here(fitted_on, answered_by(ANSWERED, "choice")) is applies


def test_a_question_type_read_another_way_is_keyed_by_its_own_readout():
    by_type = {**ANSWERED, "x_debias": {"by_type": {"noul": {"readout": "letters"}}}}
    assert answered_by(by_type, "noul").readout == "letters" and answered_by(by_type, "choice").readout == "likelihood"
    assert answered_by({}, "choice") == FitKey(None, None, None)  # a backend that says nothing matches no fit


def _calibrated(fitted_on: FitKey | None, policy: Policy, probabilities=CONFIDENT):
    binding = CatalogBinding("routing", 3, "h" * 64, temperature=3.0, policy=policy, fitted_on=fitted_on)
    options = tuple(Option(name, name) for name in "abc"[: len(probabilities)])
    question = Question("q0", "choice", "Which queue?", options, name="queue", binding=binding)
    result = DecisionResult("m", (Answer(question, probabilities),), Usage(), extensions=ANSWERED)
    return apply_catalogs(result).answers[0]


def test_an_entry_fitted_on_another_model_answers_uncalibrated_and_an_enforcing_one_goes_to_review():
    here = _calibrated(FitKey(MODEL_A, "decision-prompt/2", None), ENFORCING)
    assert here.probabilities != CONFIDENT and here.question.binding.temperature == 3.0 and here.verdict.reason is None
    elsewhere = _calibrated(FitKey(MODEL_B, "decision-prompt/2", None), ENFORCING)
    assert elsewhere.probabilities == CONFIDENT  # the model's own, not another model's temperature
    assert elsewhere.question.binding.temperature == 1.0  # what the answer and its record say was applied
    assert (elsewhere.verdict.action, elsewhere.verdict.reason) == ("review", "calibration_mismatch")
    advisory = _calibrated(FitKey(MODEL_B, None, None), Policy(mode="advisory"))
    assert (advisory.verdict.action, advisory.verdict.reason) == ("auto", "calibration_mismatch")  # says so, acts on nothing
    unsure = _calibrated(FitKey(MODEL_B, None, None), ENFORCING, LOST)
    assert unsure.verdict.action == "abstain"  # never softened
