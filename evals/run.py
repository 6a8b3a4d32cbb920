"""`make eval`: how well each embedded model and readout decides the dev set.

For every (model, readout) it prints accuracy by question type, the always-first-option
and majority baselines, expected calibration error, NLL and Brier score beside the
uniform distribution's (a low ECE alone means little near chance), and the share of
items whose answer flips when the option order is reversed (measured without order
averaging: with it, the answer is order-invariant by construction). Writes
reports/eval.json and reports/eval.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from evals.devset import Item, items
from scorer_container.engine import DecisionEngine
from scorer_container.llama_runtime import Runtime, RuntimeSettings
from scorer_container.model_files import verify_model
from scorer_container.prompts import PromptFormat
from scorer_container.schema import DecisionRequest, parse

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m"]
READOUTS = ["letters", "likelihood"]


def load_engine(name: str) -> DecisionEngine:
    path = sorted((ROOT / "models" / name).glob("*.gguf"))[0]
    verify_model(path)
    runtime = Runtime(path, RuntimeSettings(n_ctx=2048))
    prompts = PromptFormat.for_runtime(runtime)
    return DecisionEngine(runtime, prompts, model_name=name, default_readout="letters")


def distribution(engine: DecisionEngine, item: Item, readout: str, reverse: bool = False, average: bool = True) -> np.ndarray:
    question = dict(item.question)
    if reverse and question["type"] == "choice":
        question["criteria"] = dict(reversed(list(question["criteria"].items())))
    request = parse(DecisionRequest, {"model": "m", "state": item.state, "questions": {"q": question},
                                      "x_readout": readout, "x_order_average": average})
    answer = engine.decide(request)["answers"]["q"]
    if answer["type"] == "noul":
        p = np.array([answer["noul"], 1 - answer["noul"]])
    elif answer["type"] == "choice":
        p = np.array(list(answer["probabilities"].values()))
    else:
        p = np.array([answer["probabilities"][str(i)] for i in range(item.n_options)])
    if reverse and question["type"] == "choice":
        p = p[::-1]
    return p


def flips(engine: DecisionEngine, item: Item, readout: str) -> bool:
    """Without order averaging, does reversing the listed options change the answer? (choice items)"""
    if item.kind != "choice":
        return False
    forward = distribution(engine, item, readout, average=False)
    backward = distribution(engine, item, readout, reverse=True, average=False)
    return int(np.argmax(forward)) != int(np.argmax(backward))


def ece(confidences: np.ndarray, correct: np.ndarray, bins: int = 10) -> float:
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        mask = (confidences > lo) & (confidences <= hi)
        if mask.any():
            total += mask.mean() * abs(confidences[mask].mean() - correct[mask].mean())
    return float(total)


def evaluate(engine: DecisionEngine, readout: str, dataset: list[Item]) -> dict:
    rows = []
    for item in dataset:
        p = distribution(engine, item, readout)
        rows.append((item, p, flips(engine, item, readout)))
    report: dict = {"by_type": {}}
    for kind in ("noul", "choice", "score", "all"):
        subset = [r for r in rows if kind == "all" or r[0].kind == kind]
        correct = np.array([int(np.argmax(p)) == it.gold for it, p, _ in subset], dtype=float)
        report["by_type"][kind] = {"n": len(subset), "accuracy": float(correct.mean())}
    correct = np.array([int(np.argmax(p)) == it.gold for it, p, _ in rows], dtype=float)
    confidence = np.array([p.max() for _, p, _ in rows])
    gold_p = np.array([max(p[it.gold], 1e-12) for it, p, _ in rows])
    uniform_nll = float(np.mean([np.log(it.n_options) for it, _, _ in rows]))
    brier = float(np.mean([np.sum((p - np.eye(it.n_options)[it.gold]) ** 2) for it, p, _ in rows]))
    uniform_brier = float(np.mean([np.sum((np.full(it.n_options, 1 / it.n_options) - np.eye(it.n_options)[it.gold]) ** 2)
                                   for it, _, _ in rows]))
    reversible = [r for r in rows if r[0].kind == "choice"]
    report.update(
        ece=ece(confidence, correct),
        nll=float(-np.log(gold_p).mean()),
        uniform_nll=uniform_nll,
        brier=brier,
        uniform_brier=uniform_brier,
        flip_rate_without_averaging=float(np.mean([f for _, _, f in reversible])) if reversible else 0.0,
    )
    return report


def baselines(dataset: list[Item]) -> dict:
    first = np.mean([it.gold == 0 for it in dataset])
    majority = 0
    for kind in ("noul", "choice", "score"):
        golds = Counter(it.gold for it in dataset if it.kind == kind)
        majority += golds.most_common(1)[0][1]
    return {"always_first": float(first), "majority": majority / len(dataset)}


def plot(results: dict, base: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(results)
    accuracy = [results[k]["by_type"]["all"]["accuracy"] for k in labels]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(range(len(labels)), accuracy, color="#4C72B0")
    ax.axhline(base["always_first"], color="#C44E52", linestyle="--", label=f"always first ({base['always_first']:.0%})")
    ax.axhline(base["majority"], color="#55A868", linestyle=":", label=f"majority ({base['majority']:.0%})")
    ax.set_xticks(range(len(labels)), [k.replace(" / ", "\n") for k in labels], fontsize=8)
    ax.set_ylabel("accuracy on the dev set")
    ax.set_ylim(0, 1)
    ax.set_title("Decision accuracy per model and readout (debiased: order averaging + prior)")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--readouts", nargs="*", default=READOUTS)
    args = parser.parse_args()
    dataset = items()
    base = baselines(dataset)
    print(f"dev set: {len(dataset)} items; baselines: always-first {base['always_first']:.1%}, majority {base['majority']:.1%}")
    results = {}
    for name in args.models:
        engine = load_engine(name)
        for readout in args.readouts:
            start = time.monotonic()
            print(f"[eval] {name} / {readout} ...", flush=True)
            report = evaluate(engine, readout, dataset)
            report["seconds"] = round(time.monotonic() - start, 1)
            results[f"{name} / {readout}"] = report
            by = report["by_type"]
            print(
                f"  accuracy {by['all']['accuracy']:.1%} (noul {by['noul']['accuracy']:.1%}, choice {by['choice']['accuracy']:.1%},"
                f" score {by['score']['accuracy']:.1%}); ECE {report['ece']:.3f}; NLL {report['nll']:.3f}"
                f" (uniform {report['uniform_nll']:.3f}); Brier {report['brier']:.3f} (uniform {report['uniform_brier']:.3f});"
                f" flips without averaging {report['flip_rate_without_averaging']:.0%}; {report['seconds']} s",
                flush=True,
            )
        engine.runtime.close()
    best = max(results, key=lambda k: results[k]["by_type"]["all"]["accuracy"])
    print(f"best: {best} ({results[best]['by_type']['all']['accuracy']:.1%})")
    out = ROOT / "reports"
    out.mkdir(exist_ok=True)
    (out / "eval.json").write_text(json.dumps({"baselines": base, "results": results, "best": best}, indent=2))
    plot(results, base, out / "eval.png")
    print(f"wrote {out / 'eval.json'} and {out / 'eval.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
