"""The arithmetic of a decision: distributions from log-scores (the answer formulas
themselves are the contract's: systemone/answers.py).

Pure functions over numpy arrays, tested without a model.
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
