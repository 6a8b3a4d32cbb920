"""Scores of a set of answers against their golds, and the temperature that fits them.

Proper scoring rules first: NLL and Brier, each beside the uniform answer's, because a
low calibration error (ECE) alone means little when every answer is near chance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scorer_container import scoring
from scorer_container.model_files import TEMPERATURE_RANGE

KINDS = ("noul", "choice", "score")
# Log-spaced, so that sharpening (T < 1) and flattening (T > 1) are searched alike.
TEMPERATURES = np.exp(np.linspace(*np.log(TEMPERATURE_RANGE), 241))


def item_losses(distributions: Sequence[np.ndarray], golds: Sequence[int]) -> np.ndarray:
    """Each answer's NLL: minus the log of the probability it gave its gold option."""
    return np.array([-np.log(max(p[g], 1e-12)) for p, g in zip(distributions, golds, strict=True)], dtype=float)


def nll(distributions: Sequence[np.ndarray], golds: Sequence[int]) -> float:
    return float(item_losses(distributions, golds).mean())


def brier(distributions: Sequence[np.ndarray], golds: Sequence[int]) -> float:
    return float(np.mean([np.sum((p - np.eye(len(p))[g]) ** 2) for p, g in zip(distributions, golds, strict=True)]))


def ece(distributions: Sequence[np.ndarray], golds: Sequence[int], bins: int = 10) -> float:
    confidences = np.array([p.max() for p in distributions])
    correct = np.array([int(np.argmax(p)) == g for p, g in zip(distributions, golds, strict=True)], dtype=float)
    total = 0.0
    edges = np.linspace(0, 1, bins + 1)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        mask = (confidences > lo) & (confidences <= hi)
        if mask.any():
            total += mask.mean() * abs(confidences[mask].mean() - correct[mask].mean())
    return float(total)


def uniform(sizes: Sequence[int]) -> dict[str, float]:
    return {"nll": float(np.mean(np.log(sizes))), "brier": float(np.mean([1 - 1 / n for n in sizes]))}


def at_temperature(distributions: Sequence[np.ndarray], temperature: float) -> list[np.ndarray]:
    return [scoring.with_temperature(p, temperature) for p in distributions]


def fit_temperature(distributions: Sequence[np.ndarray], golds: Sequence[int]) -> float:
    """The temperature that minimises NLL (a grid: robust, and the grid is fine enough for 3 decimals)."""
    losses = [nll(at_temperature(distributions, t), golds) for t in TEMPERATURES]
    return float(TEMPERATURES[int(np.argmin(losses))])


FLAT = float(TEMPERATURES[-1])  # the answer for a type whose gain is not real: as flat as the grid goes


def out_of_fold_losses(distributions: Sequence[np.ndarray], golds: Sequence[int], folds: int = 5,
                       seed: int = 0) -> np.ndarray:
    """Each item's NLL at the temperature fitted on the other folds (k-fold, seeded).

    What a configuration and its fitted temperature are worth on items the fit never saw:
    the in-sample NLL at a temperature fitted on the same items flatters every
    configuration, and most the ones that carry no information."""
    n = len(golds)
    losses = np.zeros(n)
    order = np.random.default_rng(seed).permutation(n)
    for fold in np.array_split(order, min(folds, n)):
        rest = np.setdiff1d(order, fold)
        t = fit_temperature([distributions[i] for i in rest], [golds[i] for i in rest]) if len(rest) else 1.0
        losses[fold] = item_losses(at_temperature([distributions[i] for i in fold], t), [golds[i] for i in fold])
    return losses


def gain_is_real(losses: Sequence[float], sizes: Sequence[int], draws: int = 2000, seed: int = 0) -> bool:
    """True when these per-item NLLs beat the uniform answer's (log n) with 95% confidence:
    a paired bootstrap over the items of each one's NLL minus log(n)."""
    gains = np.asarray(losses, dtype=float) - np.log(np.asarray(sizes, dtype=float))
    if len(gains) < 10:
        return False
    rng = np.random.default_rng(seed)
    means = gains[rng.integers(0, len(gains), (draws, len(gains)))].mean(axis=1)
    return bool(np.quantile(means, 0.95) < 0)


def report(distributions: Sequence[np.ndarray], golds: Sequence[int], kinds: Sequence[str]) -> dict:
    correct = np.array([int(np.argmax(p)) == g for p, g in zip(distributions, golds, strict=True)], dtype=float)
    kinds_array = np.array(kinds)
    sizes = [len(p) for p in distributions]
    base = uniform(sizes)
    out = {
        "n": len(golds),
        "accuracy": float(correct.mean()),
        "by_type": {k: float(correct[kinds_array == k].mean()) for k in KINDS if (kinds_array == k).any()},
        "nll": nll(distributions, golds),
        "brier": brier(distributions, golds),
        "ece": ece(distributions, golds),
        "uniform_nll": base["nll"],
        "uniform_brier": base["brier"],
    }
    # Below 0: better than answering uniformly (the requirement is at most -2%).
    out["nll_vs_uniform"] = out["nll"] / base["nll"] - 1
    out["brier_vs_uniform"] = out["brier"] / base["brier"] - 1
    out["nll_vs_uniform_95"] = nll_ratio_interval(distributions, golds)
    return out


def nll_ratio_interval(distributions: Sequence[np.ndarray], golds: Sequence[int], draws: int = 2000,
                       seed: int = 0) -> list[float]:
    """A 95% bootstrap interval (over the items) of NLL against the uniform answer's, minus 1:
    how far a split's figure can be trusted to say the answers beat uniform."""
    losses = item_losses(distributions, golds)
    sizes = np.log([len(p) for p in distributions])
    if len(losses) < 2:
        return [float("nan"), float("nan")]
    picks = np.random.default_rng(seed).integers(0, len(losses), (draws, len(losses)))
    ratios = losses[picks].mean(axis=1) / sizes[picks].mean(axis=1) - 1
    return [float(q) for q in np.quantile(ratios, [0.025, 0.975])]


def baselines(golds: Sequence[int], kinds: Sequence[str]) -> dict[str, float]:
    """Always the first declared option; the most frequent gold index per question type."""
    first = float(np.mean([g == 0 for g in golds]))
    majority = 0
    for kind in KINDS:
        of_kind = [g for g, k in zip(golds, kinds, strict=True) if k == kind]
        if of_kind:
            majority += max(of_kind.count(v) for v in set(of_kind))
    return {"always_first": first, "majority": majority / len(golds)}
