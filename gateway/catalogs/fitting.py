"""Fitting a catalog entry's adapter from labelled answers (numpy; imported only by a refit).

The head is a regularised multinomial logistic regression on what the scorer read each
answer from (`x_features`): the zero-shot answer's log-probabilities, times a learned
scale, plus a bias per option and a linear map of the state sketch (standardised):

    logit_k = scale * log p0_k + bias_k + clamp(w_k . clip((state - center) / spread, +-4), reach_k)

where reach_k is the range the sketch's term took over the samples it was fitted on: a
state unlike any it learned from (a crafted one: anyone can write the text the model reads)
moves a logit no further than the training's own did.

With the bias and the map at zero it is the zero-shot answer at a temperature (1 / scale),
which is what a calibration fits; the L2 penalty on bias and map pulls it there, so few
outcomes move it little. Its strength is chosen by cross-validation with folds grouped
(by source, or by state: two answers about one text are never split across train and
test), and the head is kept only where it beats the calibrated zero-shot answer out of
fold: a log-loss lower by more than chance (a paired one-sided test) and an accuracy no
lower. Where it is not kept the entry keeps its zero-shot answer.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gateway.catalogs.vectors import MIN_SCALE, STATE_CLIP  # the decision-time head's: one figure for both

L2_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
MAX_FOLDS = 5
MIN_SAMPLES = 10  # fewer outcomes than this: no adapter is fitted (nothing to tell apart out of fold)
SURE = 1.645  # standard errors: the one-sided 95% point of a normal
MIN_SPREAD = 1e-3
_STEPS = 300
_LEARNING_RATE = 0.05


@dataclass(frozen=True, slots=True)
class Sample:
    """One labelled answer: its per-listing log-probabilities (declared order), the state
    sketch, the index of the true option, and the group it may not be split from."""

    orders: Sequence[Sequence[float]]
    state: Sequence[float]
    label: int
    group: str


@dataclass(frozen=True, slots=True)
class Head:
    scale: float
    bias: np.ndarray  # (K,)
    weights: np.ndarray  # (K, D)
    center: np.ndarray  # (D,)
    spread: np.ndarray  # (D,)
    reach: np.ndarray  # (K, 2): the sketch term's least and greatest over the training samples

    def probabilities(self, zero_shot: np.ndarray, states: np.ndarray) -> np.ndarray:
        x = np.clip((states - self.center) / self.spread, -STATE_CLIP, STATE_CLIP)
        term = np.clip(x @ self.weights.T, self.reach[:, 0], self.reach[:, 1])
        return _softmax(self.scale * zero_shot + self.bias + term)


@dataclass(frozen=True, slots=True)
class Scores:
    accuracy: float
    nll: float
    brier: float

    def as_dict(self) -> dict[str, float]:
        return {"accuracy": round(self.accuracy, 4), "nll": round(self.nll, 4), "brier": round(self.brier, 4)}


@dataclass(frozen=True, slots=True)
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
    base_p = _out_of_fold(z, states, y, folds, n_options, None)
    base = _score(base_p, y)
    best_l2, best, best_p = None, None, base_p
    for l2 in l2_grid:
        p = _out_of_fold(z, states, y, folds, n_options, l2)
        scores = _score(p, y)
        if best is None or scores.nll < best.nll:
            best_l2, best, best_p = l2, scores, p
    assert best is not None and best_l2 is not None
    if best.accuracy < base.accuracy or not _surely_better(best_p, base_p, y):
        return Fitted(None, best_l2, n_folds, best, base, "out of fold it does not surely beat the calibrated zero-shot"
                      f" answer (accuracy {best.accuracy:.3f} vs {base.accuracy:.3f}, NLL {best.nll:.3f} vs"
                      f" {base.nll:.3f}; kept when its NLL is lower by {SURE:.3g} standard errors of the paired"
                      " difference, and its accuracy no lower)")
    return Fitted(train(z, states, y, n_options, best_l2), best_l2, n_folds, best, base, "beats the calibrated"
                  f" zero-shot answer out of fold (accuracy {best.accuracy:.3f} vs {base.accuracy:.3f}, NLL"
                  f" {best.nll:.3f} vs {base.nll:.3f})")


def _surely_better(adapted: np.ndarray, base: np.ndarray, y: np.ndarray) -> bool:
    """Whether the adapter's out-of-fold log-loss is lower than the base's by more than chance:
    the paired per-answer differences' mean at least SURE standard errors above 0 (a one-sided
    test at about 95%). With few outcomes a lower mean alone is often luck, and an adapter
    kept on luck answers worse than the zero-shot answer it replaced."""
    rows = np.arange(len(y))
    gain = np.log(np.clip(adapted[rows, y], 1e-12, None)) - np.log(np.clip(base[rows, y], 1e-12, None))
    spread = gain.std(ddof=1) / np.sqrt(len(y)) if len(y) > 1 else np.inf
    return bool(gain.mean() > 0 and gain.mean() >= SURE * spread)


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
    # A dimension that never varied gets a spread of 1e-3, not ~0: its weight stays 0 (its
    # gradient is), and a value it takes later cannot blow a logit up.
    spread = np.maximum(states.std(axis=0), MIN_SPREAD)
    x = np.clip((states - center) / spread, -STATE_CLIP, STATE_CLIP)
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
        # A temperature is positive and at most 20 (devkit.calibrate's range): a head never
        # reads the zero-shot answer backwards, nor flattens it into a tie.
        scale, bias, weights = max(MIN_SCALE, float(params[0][0])), params[1], params[2]
    terms = x @ weights.T
    return Head(scale, bias, weights, center, spread, np.stack([terms.min(axis=0), terms.max(axis=0)], axis=1))


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
