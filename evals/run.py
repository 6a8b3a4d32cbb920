"""`make eval`: how well each model, readout and debiasing setting decides the dev set.

For every model (the two embedded ones and the optional quality model), both readouts,
and each debiasing setting (none, order averaging, content-free prior, both) it
prints and plots accuracy by question type, expected calibration error, NLL and Brier
score beside the uniform distribution's (a low ECE alone means little near chance),
the always-first and majority baselines, the share of items whose answer changes when
the option order is reversed (without order averaging), and what one decision costs
on this machine with the setting chosen. The chosen setting per model (best accuracy,
then lowest NLL) is written to evals/model_defaults.json, which `make setup` writes
into each model's manifest: defaults are measured, never set by hand.

Each item is probed once per option order with the real state and once with the
content-free state, and the four settings are combined from those probes exactly as
the engine combines them (every dev-set question fits one probe), so the settings are
compared on the same model outputs. Writes reports/eval.json and reports/eval.png.
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
from scorer_container import scoring
from scorer_container.engine import DecisionEngine, prepare_question
from scorer_container.llama_runtime import Runtime, RuntimeSettings
from scorer_container.model_files import verify_model
from scorer_container.prompts import PromptFormat, render_value
from scorer_container.schema import DecisionRequest, parse

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m"]
READOUTS = ["letters", "likelihood"]
# (order averaging, prior), by name.
SETTINGS = {"none": (False, False), "order": (True, False), "prior": (False, True), "both": (True, True)}
DEFAULTS_FILE = ROOT / "evals" / "model_defaults.json"


def load_engine(name: str) -> DecisionEngine:
    path = sorted((ROOT / "models" / name).glob("*.gguf"))[0]
    verify_model(path)
    runtime = Runtime(path, RuntimeSettings(n_ctx=2048))
    return DecisionEngine(runtime, PromptFormat.for_runtime(runtime), model_name=name, default_readout="letters")


def probe_scores(engine: DecisionEngine, item: Item, readout: str) -> dict[str, np.ndarray]:
    """Raw and content-free log-scores over the options, in declared order, for both orders."""
    request = parse(DecisionRequest, {"model": "m", "state": item.state, "questions": {"q": item.question}})
    question = prepare_question("q", request.questions["q"])
    n = len(question.options)
    out = {}
    for name, order in (("forward", tuple(range(n))), ("reversed", tuple(reversed(range(n))))):
        (probe,) = engine._plan(question, order, readout).groups  # every dev-set question fits one probe
        (raw,), _ = engine._evaluate(render_value(item.state), [probe])
        prior, _ = engine._prior(probe)
        back = np.argsort(np.array(probe.shown))  # scores are in shown order; put them in declared order
        out[name], out[name + "_prior"] = raw[back], prior[back]
    return out


def combine(scores: dict[str, np.ndarray], order_average: bool, prior: bool) -> np.ndarray:
    """The engine's combination of the probes (see DecisionEngine._distributions)."""
    orders = ["forward", "reversed"] if order_average else ["forward"]
    per_order = [scoring.softmax(scores[o] - (scores[o + "_prior"] if prior else 0.0)) for o in orders]
    return scoring.average(per_order)


def ece(confidences: np.ndarray, correct: np.ndarray, bins: int = 10) -> float:
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        mask = (confidences > lo) & (confidences <= hi)
        if mask.any():
            total += mask.mean() * abs(confidences[mask].mean() - correct[mask].mean())
    return float(total)


def report(dataset: list[Item], distributions: list[np.ndarray], flips: list[bool]) -> dict:
    golds = [it.gold for it in dataset]
    correct = np.array([int(np.argmax(p)) == g for p, g in zip(distributions, golds, strict=True)], dtype=float)
    by_type = {}
    for kind in ("noul", "choice", "score"):
        mask = np.array([it.kind == kind for it in dataset])
        by_type[kind] = float(correct[mask].mean())
    eye = [np.eye(it.n_options)[it.gold] for it in dataset]
    return {
        "accuracy": float(correct.mean()),
        "by_type": by_type,
        "ece": ece(np.array([p.max() for p in distributions]), correct),
        "nll": float(np.mean([-np.log(max(p[g], 1e-12)) for p, g in zip(distributions, golds, strict=True)])),
        "brier": float(np.mean([np.sum((p - e) ** 2) for p, e in zip(distributions, eye, strict=True)])),
        "order_flips": float(np.mean(flips)),
    }


def uniform(dataset: list[Item]) -> dict:
    return {"nll": float(np.mean([np.log(it.n_options) for it in dataset])),
            "brier": float(np.mean([1 - 1 / it.n_options for it in dataset]))}


def baselines(dataset: list[Item]) -> dict:
    first = np.mean([it.gold == 0 for it in dataset])
    majority = sum(Counter(it.gold for it in dataset if it.kind == kind).most_common(1)[0][1]
                   for kind in ("noul", "choice", "score"))
    return {"always_first": float(first), "majority": majority / len(dataset)}


def seconds_per_decision(engine: DecisionEngine, dataset: list[Item], readout: str, setting: str, n: int = 12) -> float:
    """Mean wall time of one decision (one question, priors cached as in steady traffic), served as chosen."""
    order_average, prior = SETTINGS[setting]
    sample = dataset[:: max(1, len(dataset) // n)][:n]
    requests = [parse(DecisionRequest, {"model": "m", "state": it.state, "questions": {"q": it.question},
                                        "x_readout": readout, "x_order_average": order_average, "x_prior": prior})
                for it in sample]
    start = time.perf_counter()
    for request in requests:
        engine.decide(request)
    return (time.perf_counter() - start) / len(requests)


def evaluate_model(name: str, dataset: list[Item], readouts: list[str]) -> dict:
    engine = load_engine(name)
    results = {}
    try:
        for readout in readouts:
            start = time.monotonic()
            print(f"[eval] {name} / {readout}: probing {len(dataset)} items in both orders ...", flush=True)
            probes = []
            for i, item in enumerate(dataset, 1):
                probes.append(probe_scores(engine, item, readout))
                if i % 20 == 0:
                    print(f"[eval]   {i}/{len(dataset)} ({time.monotonic() - start:.0f} s)", flush=True)
            for setting, (order_average, prior) in SETTINGS.items():
                distributions = [combine(s, order_average, prior) for s in probes]
                flips = [int(np.argmax(combine(s, False, prior))) != int(np.argmax(combine(
                    {"forward": s["reversed"], "forward_prior": s["reversed_prior"]}, False, prior))) for s in probes]
                results[f"{readout}/{setting}"] = report(dataset, distributions, flips)
            print(f"[eval]   {readout} done in {time.monotonic() - start:.0f} s", flush=True)
        chosen = max(results, key=lambda k: (round(results[k]["accuracy"], 6), -results[k]["nll"]))
        readout, setting = chosen.split("/")
        cost = seconds_per_decision(engine, dataset, readout, setting)
    finally:
        engine.runtime.close()
    return {"results": results, "chosen": chosen, "seconds_per_decision": cost}


def print_table(name: str, model: dict, base: dict, unif: dict) -> None:
    print(f"\n{name} (chosen: {model['chosen']}, {model['seconds_per_decision']:.2f} s per decision on this machine)")
    print(f"  {'readout/debias':<18} {'acc':>6} {'noul':>6} {'choice':>6} {'score':>6} {'ECE':>6} {'NLL':>6}"
          f" {'Brier':>6} {'flips':>6}")
    for key, r in model["results"].items():
        mark = " *" if key == model["chosen"] else ""
        print(f"  {key:<18} {r['accuracy']:>6.1%} {r['by_type']['noul']:>6.1%} {r['by_type']['choice']:>6.1%}"
              f" {r['by_type']['score']:>6.1%} {r['ece']:>6.3f} {r['nll']:>6.3f} {r['brier']:>6.3f}"
              f" {r['order_flips']:>6.0%}{mark}")
    print(f"  uniform: NLL {unif['nll']:.3f}, Brier {unif['brier']:.3f}; baselines: always-first"
          f" {base['always_first']:.1%}, majority {base['majority']:.1%}")


def write_defaults(models: dict) -> None:
    chosen = json.loads(DEFAULTS_FILE.read_text()) if DEFAULTS_FILE.exists() else {}
    for name, model in models.items():
        readout, setting = model["chosen"].split("/")
        order_average, prior = SETTINGS[setting]
        chosen[name] = {"readout": readout, "order_average": order_average, "prior": prior,
                        "accuracy": round(model["results"][model["chosen"]]["accuracy"], 4)}
    DEFAULTS_FILE.write_text(json.dumps(chosen, indent=2) + "\n")


def plot(models: dict, base: dict, unif: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    palette = ["#4C72B0", "#DD8452", "#55A868"]
    labels, colors, accuracy, nll = [], [], [], []
    for m, model in enumerate(models.values()):
        for key, r in model["results"].items():
            readout, setting = key.split("/")
            labels.append(f"{readout[:3]}.\n{setting}" + ("\n(chosen)" if key == model["chosen"] else ""))
            colors.append(palette[m % len(palette)])
            accuracy.append(r["accuracy"])
            nll.append(r["nll"] / unif["nll"])
    x = range(len(labels))
    top.bar(x, accuracy, color=colors)
    first = top.axhline(base["always_first"], color="#C44E52", linestyle="--")
    majority = top.axhline(base["majority"], color="#8172B2", linestyle=":")
    models_legend = [Patch(color=palette[m % len(palette)], label=name) for m, name in enumerate(models)]
    top.legend(handles=[*models_legend, first, majority], labels=[*models, f"always first ({base['always_first']:.0%})",
               f"majority ({base['majority']:.0%})"], loc="upper left", fontsize=8)
    top.set_ylabel("accuracy on the dev set")
    top.set_ylim(0, 1)
    top.set_title("Decisions per model, readout (let. = letters, lik. = likelihood) and debiasing")
    bottom.bar(x, nll, color=colors)
    bottom.axhline(1.0, color="black", linewidth=0.8, label="uniform answer")
    bottom.set_ylabel("NLL / uniform NLL (lower is better)")
    bottom.legend(loc="upper left", fontsize=8)
    bottom.set_xticks(list(x), labels, fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--readouts", nargs="*", default=READOUTS)
    parser.add_argument("--no-write", action="store_true", help="do not rewrite evals/model_defaults.json")
    args = parser.parse_args()
    dataset = items()
    base, unif = baselines(dataset), uniform(dataset)
    print(f"dev set: {len(dataset)} items; baselines: always-first {base['always_first']:.1%},"
          f" majority {base['majority']:.1%}; uniform NLL {unif['nll']:.3f}, Brier {unif['brier']:.3f}", flush=True)
    models = {}
    for name in args.models:
        if not (ROOT / "models" / name).is_dir():
            print(f"[eval] {name} is not fetched: run `make setup MODEL=models/{name}` (skipped)", flush=True)
            continue
        models[name] = evaluate_model(name, dataset, args.readouts)
    for name, model in models.items():
        print_table(name, model, base, unif)
    out = ROOT / "reports"
    out.mkdir(exist_ok=True)
    (out / "eval.json").write_text(json.dumps({"baselines": base, "uniform": unif, "models": models}, indent=2))
    plot(models, base, unif, out / "eval.png")
    if not args.no_write:
        write_defaults(models)
        print(f"\nwrote the chosen settings to {DEFAULTS_FILE.relative_to(ROOT)} (make setup puts them in the manifests)")
    print(f"wrote {out / 'eval.json'} and {out / 'eval.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
