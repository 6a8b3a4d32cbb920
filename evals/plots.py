"""reports/eval.png: per model, what stage 1 chose on dev, and what stage 2 measured on held-out."""

from __future__ import annotations

import math
from pathlib import Path

PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]


def _short(key: str) -> str:
    for long, short in (("letters", "let"), ("likelihood", "lik"), ("canonical", "can"), ("declared", "dec"),
                        ("rotations", "rot"), ("reversal", "rev")):
        key = key.replace(long, short)
    return key


def _bars(axis, models: dict, keys: list[str], value, title: str, line: float | None = None) -> None:
    width = 0.8 / max(1, len(models))
    for m, (name, model) in enumerate(models.items()):
        xs = [i + (m - (len(models) - 1) / 2) * width for i in range(len(keys))]
        ys = []
        for k in keys:
            r = model["results"].get(k)
            try:
                ys.append(value(r) if r else math.nan)
            except KeyError:
                ys.append(math.nan)
        axis.bar(xs, ys, width, color=PALETTE[m % len(PALETTE)], label=name)
        for x, y in zip(xs, ys, strict=True):  # the value on each bar: a 0 bar is a result, not a gap
            if not math.isnan(y):
                axis.annotate(f"{y:+.1%}" if line is not None and line <= 0 else f"{y:.0%}", (x, y),
                              textcoords="offset points", xytext=(0, 2), ha="center", fontsize=6)
        if model["chosen"] in keys:
            i = keys.index(model["chosen"])
            axis.plot([xs[i]], [ys[i]], marker="*", color="black", markersize=9, linestyle="none")
    if line is not None:
        axis.axhline(line, color="black", linewidth=0.8)
    axis.set_title(title, fontsize=10)
    axis.grid(axis="y", alpha=0.3)
    axis.set_xticks(range(len(keys)), [_short(k) for k in keys], rotation=50, ha="right", fontsize=7)


def plot(models: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stage1 = list(dict.fromkeys(k for m in models.values() for k, r in m["results"].items() if "dev" in r))
    stage2 = list(dict.fromkeys(k for m in models.values() for k in m.get("heldout_configs", [])))
    fig, axes = plt.subplots(4, 1, figsize=(14, 16))
    _bars(axes[0], models, stage1, lambda r: r["dev"]["nll_vs_uniform"],
          "stage 1, dev: NLL vs the uniform answer at each configuration's fitted temperature (below 0 is better)", 0.0)
    _bars(axes[1], models, stage2, lambda r: r["heldout"]["accuracy"], "stage 2, held-out: accuracy")
    _bars(axes[2], models, stage2, lambda r: r["heldout"]["nll_vs_uniform"],
          "stage 2, held-out: NLL vs uniform at the dev-fitted temperature (the bar to pass: -2%)", -0.02)
    _bars(axes[3], models, stage2, lambda r: r["invariance"]["perm_flip"],
          "stage 2, held-out choice items: share whose answer changes under 3 random permutations (at most 10%)", 0.10)
    axes[0].legend(fontsize=8, loc="upper left", title="★ chosen", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
