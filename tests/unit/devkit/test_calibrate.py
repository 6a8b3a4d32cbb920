"""The calibration arithmetic: the fitted temperature, the metrics, the proposed thresholds."""

from __future__ import annotations

import math
import random

import pytest

from devkit.calibrate import coverage_curve, fit_temperature, metrics, propose, uniform
from gateway.catalogs.drift import drift, expected_calibration_error


def synthetic(true_t: float, n: int = 600, seed: int = 3) -> list[dict]:
    """Answers whose probabilities are a known temperature away from calibrated: labels are
    drawn from the calibrated distribution, the model reports it sharpened or flattened."""
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        logits = [rng.gauss(0, 1.5) for _ in range(4)]
        calibrated = [math.exp(v) for v in logits]
        total = sum(calibrated)
        calibrated = [v / total for v in calibrated]
        label = rng.choices(range(4), weights=calibrated)[0]
        reported = [math.exp(v / true_t) for v in logits]
        total = sum(reported)
        samples.append({"names": ["a", "b", "c", "d"], "probabilities": [v / total for v in reported], "kind": "choice",
                        "expected": "abcd"[label]})
    return samples


@pytest.mark.parametrize("true_t", [0.5, 2.0])
def test_the_fit_recovers_the_temperature_and_lowers_nll(true_t):
    samples = synthetic(true_t)
    t = fit_temperature(samples)
    assert t == pytest.approx(1 / true_t, rel=0.25)
    assert metrics(samples, t)["nll"] < metrics(samples, 1.0)["nll"]
    assert metrics(samples, t)["ece"] < metrics(samples, 1.0)["ece"]
    assert metrics(samples, t)["accuracy"] == metrics(samples, 1.0)["accuracy"]  # a temperature never reorders


def test_uniform_baselines():
    samples = synthetic(1.0, n=10)
    assert uniform(samples) == {"nll": pytest.approx(math.log(4)), "brier": pytest.approx(0.75)}


def test_the_proposed_threshold_is_the_smallest_reaching_the_precision():
    curve = [{"threshold": 0.5, "accuracy": 0.7, "accepted": 50}, {"threshold": 0.6, "accuracy": 0.91, "accepted": 4},
             {"threshold": 0.7, "accuracy": 0.92, "accepted": 20}, {"threshold": 0.8, "accuracy": 0.95, "accepted": 9}]
    assert propose(curve, 0.9) == 0.7  # 0.6 reaches it on too few answers
    assert propose(curve, 0.99) is None


def test_coverage_falls_as_the_threshold_rises():
    curve = coverage_curve(synthetic(1.0), 1.0)
    coverages = [row["coverage"] for row in curve]
    assert coverages[0] == 1.0 and coverages == sorted(coverages, reverse=True)


def test_ece_and_drift_on_outcomes():
    assert expected_calibration_error([(0.9, True), (0.9, False)]) == pytest.approx(0.4)
    records = [{"questions": [{"name": "q", "kind": "choice", "catalog": "c@2", "probabilities": {"a": 0.8, "b": 0.2},
                               "answer": "human", "model_answer": "a"}], "outcome": {"answers": {"q": "a"}}},
               {"questions": [{"name": "q", "kind": "noul", "catalog": "c@2", "probabilities": {"true": 0.3},
                               "answer": False}], "outcome": {"answers": {"q": "false"}}},
               {"questions": [{"name": "q", "kind": "choice", "catalog": "other@1", "probabilities": {"a": 1.0}}],
                "outcome": {"answers": {"q": "b"}}}]
    report = drift(records, "c", {"fitted_at": 0.0, "accuracy": 0.5, "ece": 0.1})
    assert report["samples"] == 2 and report["accuracy"] == 1.0 and report["accuracy_change"] == 0.5
