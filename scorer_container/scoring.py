"""The arithmetic of a decision: distributions from log-scores, and the answer formulas.

Pure functions over numpy arrays, so every formula of the System One contract is
tested without a model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def softmax(log_scores: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    scaled = np.asarray(log_scores, dtype=np.float64) / temperature
    scaled = scaled - scaled.max()
    weights = np.exp(scaled)
    return weights / weights.sum()


def log_normalize(log_scores: np.ndarray) -> np.ndarray:
    """Log-probabilities restricted to these candidates (a log-softmax)."""
    scores = np.asarray(log_scores, dtype=np.float64)
    peak = scores.max()
    return scores - (peak + np.log(np.exp(scores - peak).sum()))


def average(distributions: Sequence[np.ndarray]) -> np.ndarray:
    mean = np.mean(np.stack(distributions), axis=0)
    return mean / mean.sum()


def with_temperature(probabilities: np.ndarray, temperature: float) -> np.ndarray:
    if temperature == 1.0:
        return probabilities
    return softmax(np.log(np.clip(probabilities, 1e-300, None)), temperature)


def choice_confidence(probabilities: np.ndarray) -> float:
    """(n * p_max - 1) / (n - 1): 0 for a uniform distribution, 1 for a one-hot one."""
    n = len(probabilities)
    return _unit(float((n * probabilities.max() - 1) / (n - 1)))


def expected_score(probabilities: np.ndarray) -> float:
    return float(np.dot(np.arange(len(probabilities)), probabilities))


def score_confidence(probabilities: np.ndarray) -> float:
    """1 - sum(p_i |i - k|) / D, k the argmax, D the same sum under the uniform distribution."""
    n = len(probabilities)
    levels = np.arange(n)
    k = int(np.argmax(probabilities))
    spread = float(np.dot(probabilities, np.abs(levels - k)))
    uniform_spread = float(np.abs(levels - k).mean())
    return _unit(1.0 - spread / uniform_spread)


def _unit(value: float) -> float:
    return min(1.0, max(0.0, value))
