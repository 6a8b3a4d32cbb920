"""Arithmetic on answers: argmax, confidence and expected score (the System One definitions).

These run in the gateway, not only in the scorer, because the gateway may recalibrate
probabilities (temperature) before it reports them: score and confidence are computed
from the probabilities the caller finally gets.
"""

from __future__ import annotations

from collections.abc import Sequence


def argmax(probabilities: Sequence[float]) -> int:
    return max(range(len(probabilities)), key=probabilities.__getitem__)


def choice_confidence(probabilities: Sequence[float]) -> float:
    """(n * p_max - 1) / (n - 1): 0 for a uniform distribution, 1 for a one-hot one."""
    n = len(probabilities)
    return _clamp((n * max(probabilities) - 1) / (n - 1))


def expected_score(probabilities: Sequence[float]) -> float:
    return sum(i * p for i, p in enumerate(probabilities))


def score_confidence(probabilities: Sequence[float]) -> float:
    """1 - E|i - k| / E_uniform|i - k|, k the most likely level, clamped to [0, 1]."""
    n = len(probabilities)
    k = argmax(probabilities)
    spread = sum(p * abs(i - k) for i, p in enumerate(probabilities))
    uniform = sum(abs(i - k) for i in range(n)) / n
    return _clamp(1 - spread / uniform) if uniform > 0 else 1.0


def normalise(values: Sequence[float]) -> tuple[float, ...]:
    total = sum(values)
    return tuple(v / total for v in values)


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))
