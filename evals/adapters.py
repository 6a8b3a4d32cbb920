"""`make eval-adapters`: what a catalog entry gains from its own outcomes.

For each catalog of evals/catalogs/ (one declared question, 150+ labelled texts, each with
the source it was written from) and each model, every text is decided once with
`x_features` (the engine as the scorer serves it, the model's own defaults). Then, out of
fold, with folds grouped by source (paraphrases of one text never straddle train and
test):

- zero-shot: the model's answer as it comes;
- calibrated: the zero-shot answer at a temperature fitted on the n outcomes;
- adapter: the head fitted on the n outcomes (gateway.catalogs.fitting), kept only where
  its own inner cross-validation says it beats the calibrated answer; else the zero-shot
  answer, as the gateway answers an entry without an adapter.

for n = 0, 10, 25, 50, 100, 150 outcomes drawn from the training folds (three draws
each). Accuracy, NLL and Brier go to reports/adapters/adapters.json, a plot beside it,
the seconds per decision of each model with them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gateway.catalogs import fitting
from scorer_container.engine import DecisionEngine
from scorer_container.llama import LlamaModel, LlamaSettings
from scorer_container.model_files import verify_model
from scorer_container.prompts import PromptFormat
from scorer_container.schema import DecisionRequest, parse
from systemone.features import decode_state

ROOT = Path(__file__).resolve().parent.parent
CATALOGS = ROOT / "evals" / "catalogs"
REPORTS = ROOT / "reports" / "adapters"
FIGURE = REPORTS / "adapters.png"  # scripts/docs_pages.py copies it beside the evaluation page
SIZES = (0, 10, 25, 50, 100, 150)
DRAWS = 3
# The fast model (`make up FAST=1`) gets adapters fitted; SmolLM2 only with --models (its
# features of the three catalogs took about 45 minutes to read here).
FAST_MODELS = ("gemma-3-270m-q4_k_m",)
QUALITY_MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"
# The quality model takes 3-15 s a text here: its zero-shot line is measured on a fixed
# sample of each catalog (about 25 minutes for the three), its confidence interval wider.
ZERO_SHOT_ITEMS = 60


@dataclass(frozen=True)
class Catalog:
    name: str
    question: dict[str, Any]
    items: list[dict[str, Any]]

    @property
    def options(self) -> list[str]:
        return list(self.question["criteria"])


def load_catalogs(names: list[str] | None = None) -> list[Catalog]:
    found = []
    for head in sorted(CATALOGS.glob("*.json")):
        spec = json.loads(head.read_text())
        if names and spec["name"] not in names:
            continue
        items = [json.loads(line) for line in head.with_suffix(".jsonl").read_text().splitlines() if line.strip()]
        options = list(spec["question"]["criteria"])
        for item in items:
            if item["gold"] not in options:
                raise ValueError(f"{item['id']}: gold {item['gold']!r} is not an option of {spec['name']}")
        found.append(Catalog(spec["name"], spec["question"], items))
    return found


def sampled(catalog: Catalog, n: int) -> Catalog:
    """`n` of the catalog's texts, the same ones every run (the smallest hashes of their ids)."""
    chosen = sorted(catalog.items, key=lambda item: hash_text(item["id"]))[:n]
    return Catalog(catalog.name, catalog.question, sorted(chosen, key=lambda item: item["id"]))


class Engine:
    """The engine as the scorer serves the model (its manifest's defaults), loaded only when
    a text is not in the cache (a rerun of the curves reads the cache alone)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = sorted((ROOT / "models" / name).glob("*.gguf"))[0]
        self.manifest = verify_model(self.path)
        self.sha256 = self.manifest.sha256
        # What an answer depends on besides the file: the manifest's settings (readout,
        # listings, prior, temperatures, framing), which `make eval` may choose again.
        self.settings = hash_text((self.path.parent / "model-manifest.json").read_text())
        self._engine: DecisionEngine | None = None

    def answer(self, request: DecisionRequest) -> dict[str, Any]:
        if self._engine is None:
            llama = LlamaModel(self.path, LlamaSettings(n_ctx=4096))
            self._engine = DecisionEngine.for_manifest(llama, PromptFormat.for_model(llama), self.manifest,
                                                       model_name=self.name)
        return self._engine.answer(request)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.llama.close()


def read_features(engine: Engine, catalog: Catalog) -> list[dict[str, Any]]:
    """Each item's features, decided once (cached by model file, its settings, prompt and item text)."""
    model = engine.name
    cache_path = REPORTS / f"features-{model}-{catalog.name}.jsonl"
    cached: dict[str, dict[str, Any]] = {}
    if cache_path.exists():
        for line in cache_path.read_text().splitlines():
            row = json.loads(line)
            cached[row["key"]] = row
    rows, started, decided = [], time.monotonic(), 0
    with cache_path.open("a") as sink:
        for i, item in enumerate(catalog.items, 1):
            key = f"{engine.sha256}:{engine.settings}:{item['id']}:{hash_text(item['state'] + json.dumps(catalog.question, sort_keys=True))}"
            if key not in cached:
                t0 = time.perf_counter()
                request = parse(DecisionRequest, {"model": model, "state": item["state"], "questions": {"q": catalog.question},
                                                  "x_features": True})
                answer = engine.answer(request)["answers"]["q"]
                cached[key] = {"key": key, "orders": answer["x_features"]["orders"],
                               "state": answer["x_features"]["state"], "seconds": time.perf_counter() - t0}
                sink.write(json.dumps(cached[key]) + "\n")
                decided += 1
            rows.append({**cached[key], "label": catalog.options.index(item["gold"]), "group": item["source"]})
            if i % 25 == 0 or i == len(catalog.items):
                rate = decided / max(1e-9, time.monotonic() - started)
                print(f"  [{model} {catalog.name}] {i}/{len(catalog.items)} ({decided} decided, {rate:.1f}/s)",
                      file=sys.stderr, flush=True)
    return rows


def hash_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def learning_curve(rows: list[dict[str, Any]], n_options: int, sizes: tuple[int, ...] = SIZES,
                   draws: int = DRAWS) -> dict[str, Any]:
    """Out-of-fold figures of zero-shot, calibrated and adapted answers per number of outcomes."""
    samples = [fitting.Sample(r["orders"], decode_state(r["state"]), r["label"], r["group"]) for r in rows]
    folds = fitting.grouped_folds([s.group for s in samples])
    dims = len(samples[0].state)
    # The zero-shot answer as a head: scale 1, nothing learned.
    identity = fitting.Head(1.0, np.zeros(n_options), np.zeros((n_options, dims)), np.zeros(dims), np.ones(dims))
    curve: dict[str, Any] = {}
    for n in sizes:
        per_method: dict[str, list[fitting.Scores]] = {"zero_shot": [], "calibrated": [], "adapter": []}
        kept = tried = 0
        for fold in range(int(folds.max()) + 1):
            test = [s for s, f in zip(samples, folds, strict=True) if f == fold]
            pool = [s for s, f in zip(samples, folds, strict=True) if f != fold]
            for draw in range(draws if 0 < n < len(pool) else 1):
                rng = np.random.default_rng(1000 * fold + draw)
                train = [pool[i] for i in rng.permutation(len(pool))[:n]] if n else []
                per_method["zero_shot"].append(fitting.evaluate(identity, test))
                if not n:
                    per_method["calibrated"].append(per_method["zero_shot"][-1])
                    per_method["adapter"].append(per_method["zero_shot"][-1])
                    continue
                calibrated = _calibrated(train, n_options)
                per_method["calibrated"].append(fitting.evaluate(calibrated, test))
                fitted = fitting.fit(train, n_options)
                tried += 1
                if fitted.head is not None:
                    kept += 1
                # Where no adapter is kept the entry answers zero-shot, as the gateway does.
                per_method["adapter"].append(fitting.evaluate(fitted.head or identity, test))
        curve[str(n)] = {method: _mean(scores) for method, scores in per_method.items()}
        curve[str(n)]["adapters_kept"] = f"{kept}/{tried}"
    return curve


def _calibrated(train: list[fitting.Sample], n_options: int) -> fitting.Head:
    z = np.stack([fitting.zero_shot(s.orders) for s in train])
    states = np.asarray([s.state for s in train])
    return fitting.train(z, states, np.asarray([s.label for s in train]), n_options, None)


def _mean(scores: list[fitting.Scores]) -> dict[str, float]:
    return {key: round(float(np.mean([getattr(s, key) for s in scores])), 4) for key in ("accuracy", "nll", "brier")}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    catalogs = list(report["catalogs"])
    fig, axes = plt.subplots(3, len(catalogs), figsize=(5 * len(catalogs), 10), squeeze=False)
    colors = {"gemma-3-270m-q4_k_m": "#4C72B0", "smollm2-135m-instruct-q4_1": "#55A868", QUALITY_MODEL: "#C44E52"}
    for c, name in enumerate(catalogs):
        by_model = report["catalogs"][name]["models"]
        for r, metric in enumerate(("accuracy", "nll", "brier")):
            axis = axes[r][c]
            for model, result in by_model.items():
                curve = result["curve"]
                sizes = [int(n) for n in curve]
                color = colors.get(model, "black")
                seconds = result["seconds_per_decision"]
                if len(sizes) > 1:
                    axis.plot(sizes, [curve[str(n)]["adapter"][metric] for n in sizes], "-o", color=color,
                              label=f"{model} + adapter ({seconds:.2f} s/decision)")
                    axis.plot(sizes, [curve[str(n)]["calibrated"][metric] for n in sizes], ":", color=color,
                              label=f"{model} calibrated")
                axis.axhline(curve["0"]["zero_shot"][metric], color=color, linestyle="--", linewidth=0.9,
                             label=f"{model} zero-shot ({seconds:.2f} s/decision)")
            axis.axhline(report["catalogs"][name]["uniform"][metric], color="grey", linewidth=0.7, label="uniform")
            axis.set_title(f"{name}: {metric}", fontsize=10)
            axis.set_xlabel("outcomes the entry has seen")
            axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6, loc="lower right")
    fig.suptitle("Out of fold, folds grouped by source: zero-shot, calibrated, adapter", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evals.adapters", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(FAST_MODELS))
    parser.add_argument("--catalogs", nargs="+", default=None)
    parser.add_argument("--zero-shot-only", nargs="*", default=[QUALITY_MODEL],
                        help="models measured zero-shot only (where there is no time for more): the line to reach")
    parser.add_argument("--zero-shot-items", type=int, default=ZERO_SHOT_ITEMS,
                        help="texts per catalog those models answer (a fixed sample, by id hash)")
    args = parser.parse_args(argv)
    REPORTS.mkdir(parents=True, exist_ok=True)
    catalogs = load_catalogs(args.catalogs)
    report: dict[str, Any] = {"sizes": list(SIZES), "draws": DRAWS, "catalogs": {}}
    for catalog in catalogs:
        n = len(catalog.options)
        report["catalogs"][catalog.name] = {
            "items": len(catalog.items), "sources": len({i["source"] for i in catalog.items}), "options": n,
            "uniform": fitting.uniform(n).as_dict(), "models": {}}
    for model in [*args.models, *[m for m in args.zero_shot_only if m not in args.models]]:
        if not (ROOT / "models" / model).is_dir():
            print(f"[eval-adapters] {model}: not fetched (scripts/setup_env.py --model {model}); skipped", file=sys.stderr)
            continue
        engine = Engine(model)
        zero_shot_only = model in args.zero_shot_only and model not in args.models
        for catalog in catalogs:
            measured = sampled(catalog, args.zero_shot_items) if zero_shot_only else catalog
            rows = read_features(engine, measured)
            sizes = (0,) if zero_shot_only else SIZES
            curve = learning_curve(rows, len(catalog.options), sizes)
            seconds = float(np.median([r["seconds"] for r in rows]))
            report["catalogs"][catalog.name]["models"][model] = {"curve": curve, "seconds_per_decision": round(seconds, 3),
                                                                 "items": len(rows)}
            print(f"[eval-adapters] {model} {catalog.name}: " + ", ".join(
                f"n={k} acc {v['adapter']['accuracy']:.3f} (zero-shot {v['zero_shot']['accuracy']:.3f})"
                for k, v in curve.items()), file=sys.stderr, flush=True)
        engine.close()
    (REPORTS / "adapters.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, FIGURE)
    print(f"[eval-adapters] wrote {REPORTS / 'adapters.json'} and {FIGURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
