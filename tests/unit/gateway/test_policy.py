"""Calibration (temperature) and thresholds (auto / review / abstain)."""

from __future__ import annotations

import pytest

from gateway.catalogs.model import Policy, Rule
from gateway.catalogs.policy import judge, measures, with_temperature


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
