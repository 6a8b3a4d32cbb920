"""`make eval-stack`: the whole held-out split of `make eval`, through a running gateway,
as a user meets it (`make up` and its default model, unless told otherwise).

Every held-out item is decided with `POST /v1/systemone`, its question as written, one at
a time; one the model refuses as too large (413) is counted as refused. Then accuracy, NLL and Brier against the uniform answer (each with a 95%
bootstrap interval over the items), the best constant answer per question type (its most
common gold position: a baseline that saw the answers) and the
seconds per decision. Written to reports/eval_stack.json.

    python -m evals.stack [--url URL] [--api-key KEY]   (else DG_URL and DG_API_KEY)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from devkit.calibrate import GatewayClient
from evals import metrics
from evals.labelled import Item, load

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "eval_stack.json"
DRAWS = 2000


class Refused(Exception):
    """The gateway refused the item as too large for the model (413): counted, never skipped silently."""


def decide(client: GatewayClient, item: Item) -> tuple[np.ndarray, float, dict[str, Any]]:
    body = {"model": "jev-latest", "state": item.state, "questions": {"q": item.question}}
    started = time.perf_counter()
    status, answer = client.request("POST", "/v1/systemone", body)
    if status == 413:
        raise Refused(f"{item.id}: {json.dumps(answer)[:300]} ({time.perf_counter() - started:.2f} s)")
    if status != 200:
        raise RuntimeError(f"{item.id}: the gateway answered {status}: {json.dumps(answer)[:300]}")
    seconds = time.perf_counter() - started
    a = answer["answers"]["q"]
    if a["type"] == "noul":
        p = [a["noul"], 1 - a["noul"]]
    elif a["type"] == "choice":
        p = [a["probabilities"][name] for name in item.question["criteria"]]
    else:
        p = [a["probabilities"][str(i)] for i in range(len(item.question["criteria"]))]
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, None)
    return p / p.sum(), seconds, {k: answer.get(k) for k in ("model", "x_readout", "x_model_sha256")}


def best_constant(items: list[Item]) -> float:
    """Accuracy of the best constant answer per question type (its most common gold position,
    in-sample: most held-out items ask a question of their own, so a constant per question
    would be the gold itself)."""
    return metrics.baselines([it.gold for it in items], [it.kind for it in items])["majority"]


def interval(values: np.ndarray, base: np.ndarray, seed: int = 0) -> tuple[float, float, float]:
    """mean(values) / mean(base) - 1, and its 95% bootstrap interval over the items."""
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(DRAWS):
        pick = rng.integers(0, len(values), len(values))
        ratios.append(values[pick].mean() / base[pick].mean() - 1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(values.mean() / base.mean() - 1), float(low), float(high)


def by_kind(answered: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Accuracy, NLL and Brier against uniform for each question type's items."""
    out = {}
    for kind in sorted({a["kind"] for a in answered}):
        rows = [a for a in answered if a["kind"] == kind]
        nll = np.mean([-np.log(a["p"][a["gold"]] or 1e-12) for a in rows]) / np.mean([np.log(len(a["p"])) for a in rows])
        brier = (np.mean([((np.asarray(a["p"]) - np.eye(len(a["p"]))[a["gold"]]) ** 2).sum() for a in rows])
                 / np.mean([1 - 1 / len(a["p"]) for a in rows]))
        out[kind] = {"n": len(rows), "accuracy": float(np.mean([int(np.argmax(a["p"]) == a["gold"]) for a in rows])),
                     "nll_vs_uniform": float(nll - 1), "brier_vs_uniform": float(brier - 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evals.stack", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("DG_URL", "http://127.0.0.1:3000"))
    parser.add_argument("--api-key", default=None, help="else DG_API_KEY")
    parser.add_argument("--limit", type=int, default=None, help="only the first N held-out items (a smoke run)")
    args = parser.parse_args(argv)
    api_key = args.api_key or os.environ.get("DG_API_KEY")
    if not api_key:
        print("eval-stack: pass --api-key or set DG_API_KEY", file=sys.stderr)
        return 2
    client = GatewayClient(args.url, api_key)
    items = [it for it in load() if it.split == "heldout"][: args.limit]
    nll, brier, uniform_nll, uniform_brier, correct, seconds = [], [], [], [], [], []
    served: dict[str, Any] = {}
    started = time.monotonic()
    refused: list[str] = []
    answered: list[dict[str, Any]] = []  # each answer as given, for a per-type reading (not for choosing settings)
    for i, item in enumerate(items, 1):
        try:
            p, took, served = decide(client, item)
        except Refused as exc:
            refused.append(str(exc))
            print(f"  refused: {exc}", file=sys.stderr, flush=True)
            continue
        n = len(p)
        nll.append(-np.log(p[item.gold]))
        brier.append(float(((p - np.eye(n)[item.gold]) ** 2).sum()))
        uniform_nll.append(np.log(n))
        uniform_brier.append(1 - 1 / n)
        correct.append(int(np.argmax(p) == item.gold))
        seconds.append(took)
        answered.append({"id": item.id, "kind": item.kind, "gold": item.gold, "p": [round(float(x), 6) for x in p]})
        if i % 10 == 0 or i == len(items):
            print(f"  {i}/{len(items)} decided ({(time.monotonic() - started) / i:.1f} s each)", file=sys.stderr, flush=True)
    nll_ratio = interval(np.array(nll), np.array(uniform_nll))
    brier_ratio = interval(np.array(brier), np.array(uniform_brier), seed=1)
    report = {
        "items": len(items), "answered": len(correct), "refused": refused, "served": served,
        "kinds": dict(Counter(it.kind for it in items)),
        "accuracy": float(np.mean(correct)), "best_constant_accuracy": best_constant(items),
        "nll_vs_uniform": nll_ratio, "brier_vs_uniform": brier_ratio,
        "seconds_per_decision": {"median": float(np.median(seconds)), "p90": float(np.percentile(seconds, 90))},
        "by_kind": by_kind(answered), "answers": answered,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{len(items)} held-out decisions through {args.url} ({served.get('model')}), {len(refused)} refused (413):")
    print(f"  accuracy {report['accuracy']:.3f} (best constant answer per question type: {report['best_constant_accuracy']:.3f})")
    for name, (mid, low, high) in (("NLL", nll_ratio), ("Brier", brier_ratio)):
        print(f"  {name} vs uniform {mid:+.1%} (95% interval {low:+.1%} to {high:+.1%})")
    for kind, row in report["by_kind"].items():
        print(f"  {kind:<7} n={row['n']:<4} accuracy {row['accuracy']:.3f}  NLL vs uniform {row['nll_vs_uniform']:+.1%}"
              f"  Brier vs uniform {row['brier_vs_uniform']:+.1%}")
    print(f"  {report['seconds_per_decision']['median']:.2f} s a decision (median), wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
