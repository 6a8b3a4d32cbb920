"""Fitting a catalog entry's adapter from labelled answers (numpy; imported only by a refit).

The head is a regularised multinomial logistic regression on what the scorer read each
answer from (`x_features`): the zero-shot answer's log-probabilities, times a learned
scale, plus a bias per option and a linear map of the state sketch (standardised):

    logit_k = scale * log p0_k + bias_k + w_k . (state - center) / spread

With the bias and the map at zero it is the zero-shot answer at a temperature (1 / scale),
which is what a calibration fits; the L2 penalty on bias and map pulls it there, so few
outcomes move it little. Its strength is chosen by cross-validation with folds grouped
(by source, or by state: two answers about one text are never split across train and
test), and the head is kept only where it beats the calibrated zero-shot answer out of
fold, on log-loss and accuracy both.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

L2_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
MAX_FOLDS = 5
MIN_SAMPLES = 10  # fewer outcomes than this: no adapter is fitted (nothing to tell apart out of fold)
_STEPS = 300
_LEARNING_RATE = 0.05


@dataclass(frozen=True)
class Sample:
    """One labelled answer: its per-listing log-probabilities (declared order), the state
    sketch, the index of the true option, and the group it may not be split from."""

    orders: Sequence[Sequence[float]]
    state: Sequence[float]
    label: int
    group: str


@dataclass(frozen=True)
class Head:
    scale: float
    bias: np.ndarray  # (K,)
    weights: np.ndarray  # (K, D)
    center: np.ndarray  # (D,)
    spread: np.ndarray  # (D,)

    def probabilities(self, zero_shot: np.ndarray, states: np.ndarray) -> np.ndarray:
        x = (states - self.center) / self.spread
        return _softmax(self.scale * zero_shot + self.bias + x @ self.weights.T)


@dataclass(frozen=True)
class Scores:
    accuracy: float
    nll: float
    brier: float

    def as_dict(self) -> dict[str, float]:
        return {"accuracy": round(self.accuracy, 4), "nll": round(self.nll, 4), "brier": round(self.brier, 4)}


@dataclass(frozen=True)
class Fitted:
    """The outcome of one fit: the head on every sample (None when it was not kept), the
    out-of-fold figures of the head and of the calibrated zero-shot answer, and why."""

    head: Head | None
    l2: float | None
    folds: int
    adapted: Scores | None
    zero_shot: Scores | None
    reason: str


def zero_shot(orders: Sequence[Sequence[float]]) -> np.ndarray:
    """The zero-shot answer's log-probabilities: the listings' distributions averaged (as the
    scorer answers, before a temperature)."""
    mean = np.exp(np.asarray(orders, dtype=np.float64)).mean(axis=0)
    return np.log(np.clip(mean / mean.sum(), 1e-12, None))


def fit(samples: Sequence[Sample], n_options: int, l2_grid: Sequence[float] = L2_GRID) -> Fitted:
    """The adapter for these samples, kept only where it beats the calibrated zero-shot answer out of fold."""
    if len(samples) < MIN_SAMPLES:
        return Fitted(None, None, 0, None, None, f"{len(samples)} outcomes: an adapter needs at least {MIN_SAMPLES}")
    z = np.stack([zero_shot(s.orders) for s in samples])
    states = np.asarray([s.state for s in samples], dtype=np.float64)
    y = np.asarray([s.label for s in samples])
    folds = grouped_folds([s.group for s in samples])
    n_folds = int(folds.max()) + 1
    if n_folds < 2:
        return Fitted(None, None, n_folds, None, None, "every outcome is about one text: nothing to validate on")
    base = _score(_out_of_fold(z, states, y, folds, n_options, None), y)
    best_l2, best = None, None
    for l2 in l2_grid:
        scores = _score(_out_of_fold(z, states, y, folds, n_options, l2), y)
        if best is None or scores.nll < best.nll:
            best_l2, best = l2, scores
    assert best is not None and best_l2 is not None
    if best.nll >= base.nll or best.accuracy < base.accuracy:
        return Fitted(None, best_l2, n_folds, best, base, "out of fold it does not beat the calibrated zero-shot answer"
                      f" (accuracy {best.accuracy:.3f} vs {base.accuracy:.3f}, NLL {best.nll:.3f} vs {base.nll:.3f})")
    return Fitted(train(z, states, y, n_options, best_l2), best_l2, n_folds, best, base, "beats the calibrated"
                  f" zero-shot answer out of fold (accuracy {best.accuracy:.3f} vs {base.accuracy:.3f}, NLL"
                  f" {best.nll:.3f} vs {base.nll:.3f})")


def grouped_folds(groups: Sequence[str], n_folds: int = MAX_FOLDS) -> np.ndarray:
    """A fold per sample; a group's samples share one. Groups are dealt round-robin in the
    order of their hash, so the folds are balanced and never depend on the input's order."""
    unique = sorted(set(groups), key=lambda g: hashlib.sha256(g.encode()).digest())
    n = min(n_folds, len(unique))
    fold_of = {g: i % n for i, g in enumerate(unique)}
    return np.asarray([fold_of[g] for g in groups])


def train(z: np.ndarray, states: np.ndarray, y: np.ndarray, n_options: int, l2: float | None) -> Head:
    """The head on these samples (`l2` None: the scale alone, the calibrated zero-shot answer)."""
    center = states.mean(axis=0)
    spread = states.std(axis=0) + 1e-6
    x = (states - center) / spread
    n, d = x.shape
    onehot = np.eye(n_options)[y]
    scale, bias, weights = 1.0, np.zeros(n_options), np.zeros((n_options, d))
    moments = [np.zeros(1), np.zeros(n_options), np.zeros((n_options, d))]
    squares = [np.zeros(1), np.zeros(n_options), np.zeros((n_options, d))]
    for step in range(1, _STEPS + 1):  # Adam on a convex loss: full batches, a few hundred steps
        p = _softmax(scale * z + bias + x @ weights.T)
        error = (p - onehot) / n
        grads = [np.array([(error * z).sum()]), error.sum(axis=0), error.T @ x]
        if l2 is None:
            grads[1][:], grads[2][:] = 0.0, 0.0
        else:
            grads[1] += l2 * bias
            grads[2] += l2 * weights
        params = [np.array([scale]), bias, weights]
        for i, g in enumerate(grads):
            moments[i] = 0.9 * moments[i] + 0.1 * g
            squares[i] = 0.999 * squares[i] + 0.001 * g * g
            params[i] = params[i] - _LEARNING_RATE * (moments[i] / (1 - 0.9**step)) / (
                np.sqrt(squares[i] / (1 - 0.999**step)) + 1e-8)
        scale, bias, weights = float(params[0][0]), params[1], params[2]
    return Head(scale, bias, weights, center, spread)


def evaluate(head: Head, samples: Sequence[Sample]) -> Scores:
    z = np.stack([zero_shot(s.orders) for s in samples])
    states = np.asarray([s.state for s in samples], dtype=np.float64)
    return _score(head.probabilities(z, states), np.asarray([s.label for s in samples]))


def _out_of_fold(z: np.ndarray, states: np.ndarray, y: np.ndarray, folds: np.ndarray, n_options: int,
                 l2: float | None) -> np.ndarray:
    predicted = np.zeros((len(y), n_options))
    for fold in range(int(folds.max()) + 1):
        held = folds == fold
        head = train(z[~held], states[~held], y[~held], n_options, l2)
        predicted[held] = head.probabilities(z[held], states[held])
    return predicted


def _score(p: np.ndarray, y: np.ndarray) -> Scores:
    n = len(y)
    truth = p[np.arange(n), y]
    onehot = np.eye(p.shape[1])[y]
    return Scores(float((p.argmax(axis=1) == y).mean()), float(-np.log(np.clip(truth, 1e-12, None)).mean()),
                  float(((p - onehot) ** 2).sum(axis=1).mean()))


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def uniform(n_options: int) -> Scores:
    return Scores(1 / n_options, math.log(n_options), 1 - 1 / n_options)
