"""The answer formulas of System One: one copy, for the scorer that computes an answer and
the gateway that recalibrates one.

A choice answer's `choice` is its most likely option and its `confidence` how far its
distribution is from uniform; a score answer's `score` is the expected level (0 = the
lowest) and its `confidence` how concentrated the distribution is around the most likely
level. Both confidences are 0 for a uniform distribution and 1 for a certain one.
Pure Python over floats: the gateway carries no numpy.
"""

from __future__ import annotations

from collections.abc import Sequence


def argmax(probabilities: Sequence[float]) -> int:
    """The index of the most likely option (the first of equals)."""
    return max(range(len(probabilities)), key=probabilities.__getitem__)


def choice_confidence(probabilities: Sequence[float]) -> float:
    """(n * p_max - 1) / (n - 1): 0 for a uniform distribution, 1 for a one-hot one."""
    n = len(probabilities)
    return _clamp((n * max(probabilities) - 1) / (n - 1))


def expected_score(probabilities: Sequence[float]) -> float:
    """The expected level, levels numbered from 0."""
    return float(sum(i * p for i, p in enumerate(probabilities)))


def score_confidence(probabilities: Sequence[float]) -> float:
    """1 - E|i - k| / E_uniform|i - k|, k the most likely level, clamped to [0, 1]."""
    n = len(probabilities)
    k = argmax(probabilities)
    spread = sum(p * abs(i - k) for i, p in enumerate(probabilities))
    uniform = sum(abs(i - k) for i in range(n)) / n
    return _clamp(1 - spread / uniform) if uniform > 0 else 1.0


def normalise(values: Sequence[float]) -> tuple[float, ...]:
    """Values scaled to sum to 1 (a distribution read off the wire may be off by rounding)."""
    total = sum(values)
    return tuple(v / total for v in values)


def _clamp(x: float) -> float:
    return float(min(1.0, max(0.0, x)))
