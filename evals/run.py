"""`make eval`: how well each model decides the labelled set, how much its answers depend on
how the options are listed or named, and which settings it should serve with.

For each model and readout, every configuration of
- ordering: `declared` (the caller's order: what the engine did before) or `canonical`
  (a hash of each option name: invariant to the caller's order by construction),
- averaging: none, `reversal` (the listing and its reverse) or `rotations` (every
  cyclic rotation: each option once in each position),
- prior: raw scores or the content-free prior divided out,
is scored on the dev split and the held-out split (evals/labelled.py; defaults are
chosen on dev only). A temperature is fitted per configuration on dev (NLL) and the
held-out figures are given with it: accuracy per type, NLL and Brier against the
uniform answer, ECE. On a sample of choice items it measures, per configuration:
- permutations: 3 random orders of the options; the share of items whose answer
  (argmax) changes, and the largest probability shift;
- renaming: one option renamed to an equivalent name (the item's synonyms);
- duplicating: one option listed twice under two names: its probability should split
  between the two and the others' stay (the split error and the others' shift).

The chosen configuration per model and question type is the invariant one with the lowest
out-of-fold dev NLL (5 folds: each item at the temperature fitted without it), answered
flat where even that gain is not real; it and the per-readout temperatures are written to
evals/model_defaults.json, which `make setup` writes into each model's manifest.
Probe scores are cached (evals/probing.py), so a second run decodes nothing it has seen.
Writes reports/eval.json and reports/eval.png.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from evals import metrics
from evals.labelled import Item, load
from evals.probing import Config, Prober, ScoreCache, distribution, prepared, probes_for
from scorer_container.decision_settings import DecisionSettings
from scorer_container.engine import DecisionEngine
from scorer_container.llama import LlamaModel, LlamaSettings
from scorer_container.model_files import ModelManifest, verify_model
from scorer_container.prompts import PromptFormat
from scorer_container.schema import DecisionRequest, parse

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS_FILE = ROOT / "evals" / "model_defaults.json"
CACHE = ROOT / "build" / "eval-cache"
READOUTS = ("letters", "likelihood")
PER_TYPE = "per-type"
MIN_DEV_TO_CHOOSE = 40  # fewer dev items and no type's gain can show as real: measured, not chosen
# A type with fewer dev items than this is answered with the configuration and temperature
# chosen on all dev items pooled: 13 items of a type cannot show a real gain on their own,
# and answering them flat would throw away what the pooled set shows.
MIN_TYPE_TO_CHOOSE = 30
LISTINGS = (("declared", "reversal"), ("declared", None), ("canonical", None), ("canonical", "reversal"),
            ("canonical", "rotations"))


@dataclass(frozen=True)
class Plan:
    """How much of the set a model is measured on: the quality model decodes about 30 tokens
    a second on 2 cores, so it gets samples (the same items on every run: sorted by id hash)."""

    dev: int | None  # None: every item of the split
    heldout: int | None
    invariance: int  # choice items (from the held-out split) the variants are measured on
    readouts: tuple[str, ...] = ("letters", "likelihood")
    full_grid: bool = False  # every configuration (`--full-grid`), or the core ones below
    rotations: bool = True  # False: no rotations (they cost one probe per option)
    timed: int = 8  # decisions timed for the cost per decision


# The configurations worth a decode on every run: the invariant ones that measured best
# on a full-grid run (reports/eval-full-grid.json), and what the engine did before. The
# full grid adds the single listings and the declared ones, both readouts with rotations.
CORE = ("letters/canonical+reversal/raw", "letters/canonical+reversal/prior", "likelihood/canonical+reversal/raw",
        "likelihood/canonical+reversal/prior", "likelihood/canonical+rotations/prior")

# Sized to what 2 cores decode in a few hours for all three (gemma ~225 tokens/s, SmolLM2
# ~150, qwen ~34); the fast model (`make up FAST=1`) gets the whole held-out split.
MODELS = {
    "gemma-3-270m-q4_k_m": Plan(dev=None, heldout=None, invariance=20),
    "smollm2-135m-instruct-q4_1": Plan(dev=48, heldout=48, invariance=6),
    # The quality model serves `make up`: its settings are chosen on 160 dev items (40-70 a
    # type, so each type is chosen on its own), both readouts (on 40 items the likelihood
    # readout won, and on the catalogs it then answered one option for nearly everything;
    # on 80, letters for every type at one temperature), about 40 minutes alone here. It is
    # measured on the whole held-out split through the gateway by `make eval-stack`.
    "qwen2.5-coder-1.5b-instruct-q4_k_m": Plan(dev=4 * MIN_DEV_TO_CHOOSE, heldout=12, invariance=2, rotations=False,
                                               timed=2),
}


def configs(readouts: tuple[str, ...] = READOUTS, full: bool = True) -> list[Config]:
    every = [Config(readout, ordering, averaging, prior) for readout in readouts
             for ordering, averaging in LISTINGS for prior in (False, True)]
    return every if full else [c for c in every if c.key in CORE]


def sample(items: list[Item], n: int | None) -> list[Item]:
    ranked = sorted(items, key=lambda it: hashlib.sha256(("sample:" + it.id).encode()).digest())
    return ranked if n is None else ranked[:n]


# -- the variants a choice item is measured under ---------------------------------------

def variants(item: Item) -> dict[str, dict]:
    """Permuted, renamed and duplicated versions of a choice item's question (seeded by its id)."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(item.id.encode()).digest()[:8], "big"))
    criteria = item.question["criteria"]
    names = list(criteria)
    out = {}
    for k in range(3):
        order = rng.permutation(len(names))
        while len(names) > 2 and list(order) == list(range(len(names))):
            order = rng.permutation(len(names))
        out[f"perm{k}"] = {**item.question, "criteria": {names[i]: criteria[names[i]] for i in order}}
    target = names[item.gold] if rng.random() < 0.5 else names[int(rng.choice([i for i in range(len(names))
                                                                                if i != item.gold]))]
    alias = item.synonyms[target]
    out["renamed"] = {**item.question, "criteria": {(alias if n == target else n): v for n, v in criteria.items()}}
    duplicated = {}
    for n, v in criteria.items():
        duplicated[n] = v
        if n == target:
            duplicated[alias] = v
    out["duplicated"] = {**item.question, "criteria": duplicated}
    out["target"] = {"name": target, "alias": alias}
    return out


def invariance(sent: np.ndarray, item: Item, found: dict[str, np.ndarray], shape: dict) -> dict[str, float]:
    names = list(item.question["criteria"])
    p0 = dict(zip(names, sent, strict=True))
    target, alias = shape["name"], shape["alias"]
    perm_flip, perm_shift = False, 0.0
    for k in range(3):
        order = list(shape[f"perm{k}"]["criteria"])
        p = dict(zip(order, found[f"perm{k}"], strict=True))
        perm_flip |= max(p, key=p.get) != max(p0, key=p0.get)
        perm_shift = max(perm_shift, max(abs(p[n] - p0[n]) for n in names))
    renamed = dict(zip(shape["renamed"]["criteria"], found["renamed"], strict=True))
    back = {(target if n == alias else n): v for n, v in renamed.items()}
    duplicated = dict(zip(shape["duplicated"]["criteria"], found["duplicated"], strict=True))
    merged = {n: duplicated[n] + (duplicated[alias] if n == target else 0.0) for n in names}
    return {
        "perm_flip": float(perm_flip), "perm_shift": perm_shift,
        "rename_flip": float(max(back, key=back.get) != max(p0, key=p0.get)),
        "rename_shift": max(abs(back[n] - p0[n]) for n in names),
        "dup_flip": float(max(merged, key=merged.get) != max(p0, key=p0.get)),
        "dup_split_error": abs(merged[target] - p0[target]),
        "dup_others_shift": max((abs(duplicated[n] - p0[n]) for n in names if n != target), default=0.0),
    }


# -- one model ----------------------------------------------------------------------------

def load_engine(name: str) -> tuple[DecisionEngine, ModelManifest]:
    path = sorted((ROOT / "models" / name).glob("*.gguf"))[0]
    manifest = verify_model(path)
    llama = LlamaModel(path, LlamaSettings(n_ctx=2048))
    engine = DecisionEngine(llama, PromptFormat.for_model(llama), model_name=name, default_readout="letters")
    return engine, manifest


def distributions_for(prober: Prober, item: Item, grid: list[Config], variant_grid: list[Config]) -> dict:
    """{config key: {"sent": p, ...variants}} for one item, every probe of the item in one tree.

    The question as sent is scored under `grid`; its variants (choice items) under `variant_grid`."""
    questions = {"sent": item.question}
    shape = {}
    if variant_grid:
        shape = variants(item)
        questions.update({k: v for k, v in shape.items() if k != "target"})
    prepared_questions = {k: prepared(item.state, q) for k, q in questions.items()}
    plans = {(k, c.key): probes_for(prober.engine, pq, c) for k, pq in prepared_questions.items()
             for c in (grid if k == "sent" else variant_grid)}
    for c in variant_grid:  # the variants are compared with the question as sent
        plans.setdefault(("sent", c.key), probes_for(prober.engine, prepared_questions["sent"], c))
    scores = prober.scores(item.state, [p for probes in plans.values() for p in probes])
    priors = prober.priors([p for (_, key), probes in plans.items() if Config.parse(key).prior for p in probes])
    out: dict[str, dict] = {}
    for (k, key), probes in plans.items():
        config = Config.parse(key)
        out.setdefault(key, {})[k] = distribution(prepared_questions[k], probes, scores,
                                                  priors if config.prior else None)
    return {"by_config": out, "shape": {**shape.get("target", {}), **{k: v for k, v in shape.items()
                                                                      if k != "target"}}}


def evaluate_model(name: str, plan: Plan, dataset: list[Item], grid: list[Config]) -> dict:
    """Choose on dev, then measure on held-out what was chosen beside what it replaces.

    Stage 1 scores every configuration of `grid` on the dev sample and fits each one's
    temperature there, per question type too. The chosen answer is `per-type`: for each
    question type the invariant configuration with the lowest out-of-fold dev NLL on that
    type, at its own temperature (fitted on the whole dev split of that type; a type with
    few dev items takes the pooled choice and temperature, see `choose_per_type`). Stage 2
    scores on the held-out sample (and its choice items' variants) the configurations `per-type` uses, the best single invariant
    configuration of each readout, and the declared-order configuration each replaces:
    the held-out split never picks anything."""
    engine, manifest = load_engine(name)
    cache = ScoreCache(CACHE / f"{name}.sqlite", manifest.sha256)
    prober = Prober(engine, cache)
    dev = sample([it for it in dataset if it.split == "dev"], plan.dev)
    heldout = sample([it for it in dataset if it.split == "heldout"], plan.heldout)
    with_variants = {it.id for it in sample([it for it in heldout if it.kind == "choice"], plan.invariance)}
    # What the engine did before canonical ordering: the manifest's readout and prior, the
    # caller's order and its reversal.
    before = Config(manifest.readout if manifest.readout in plan.readouts else plan.readouts[0], "declared",
                    "reversal", manifest.prior)
    grid = list(dict.fromkeys([*grid, before]))
    found: dict[str, dict] = {}
    try:
        probe_all(prober, f"{name} stage 1 (dev, {len(grid)} configurations)", dev, lambda it: grid, [], set(),
                  found)
        results = {c.key: score_config(c, dev, [], found, set()) for c in grid}
        invariant = [c.key for c in grid if c.invariant]
        counted = cost_per_decision(engine, dev, {key: Config.parse(key).settings() for key in invariant})
        by_type, flat, pooled, temperatures = choose_per_type(
            results, Counter(it.kind for it in dev), invariant, counted)
        # Invariance, per readout: the best invariant configuration for choice items, and
        # the declared-order configuration it replaces.
        variant_grid = []
        for readout in plan.readouts:
            best = Config.parse(min((k for k in invariant if k.startswith(readout + "/")),
                                    key=lambda k: results[k]["dev_by_type"].get("choice", {"cv_nll": results[k]["dev"]["nll"]})["cv_nll"]))
            variant_grid += [best, Config(readout, "declared", "reversal", best.prior)]
        # ... and what per-type answers choice items with (a flat type's cheapest one too).
        chosen_choice = [Config.parse(by_type["choice"])] if "choice" in by_type else []
        variant_grid = list(dict.fromkeys([*variant_grid, before, *chosen_choice]))
        probe_all(prober, f"{name} stage 2 (held-out: per-type and {before.key})", heldout,
                  lambda it: list(dict.fromkeys([Config.parse(by_type[it.kind]), before])), variant_grid,
                  with_variants, found)
        for config in dict.fromkeys([before, *variant_grid]):
            results[config.key] = score_config(config, dev, heldout, found, with_variants)
        results[PER_TYPE] = score_per_type(by_type, temperatures, dev, heldout, found, with_variants)
        settings = per_type_settings(by_type, temperatures)
        costs = cost_per_decision(engine, heldout, {**{c.key: c.settings() for c in grid}, PER_TYPE: settings})
        seconds = seconds_per_decision(engine, heldout, settings, plan.timed)
    finally:
        cache.close()
        engine.llama.close()
    return {"plan": plan.__dict__, "results": results, "chosen": PER_TYPE, "by_type": by_type, "flat": flat,
            "pooled": pooled,
            "temperatures": temperatures, "before": before.key,
            "heldout_configs": list(dict.fromkeys([PER_TYPE, before.key, *(c.key for c in variant_grid)])),
            "costs": costs, "seconds_per_decision": seconds, "decoded_tokens": prober.decoded_tokens}


def choose_per_type(results: dict, counts: Counter, invariant: list[str], cost: dict[str, float]) -> tuple[
        dict[str, str], list[str], list[str], dict[str, float]]:
    """Per question type: (configuration, flat types, types chosen on all dev pooled, temperature).

    Each type gets the invariant configuration with the lowest out-of-fold dev NLL on it;
    a type with fewer than MIN_TYPE_TO_CHOOSE dev items gets the one best on all dev items
    pooled, at the pooled temperature. A type whose best out-of-fold gain over the uniform
    answer is not real (bootstrap, 95%; for a pooled type, the pooled gain, and its own
    out-of-fold loss below uniform) is answered flat: the model claims no knowledge it did
    not show, and a flat answer pays for the cheapest configuration."""
    kinds = sorted(counts)
    pooled = sorted(k for k in kinds if counts[k] < MIN_TYPE_TO_CHOOSE)
    by_type = {k: min(invariant, key=lambda key, k=k: judged_on(results, key, k, pooled)["cv_nll"]) for k in kinds}

    def shows_nothing(kind: str, key: str) -> bool:
        if not judged_on(results, key, kind, pooled)["real_gain"]:
            return True
        # A pooled gain may come from the other types alone: the type's own out-of-fold
        # loss must be below uniform too.
        return kind in pooled and results[key]["dev_by_type"][kind]["cv_nll_vs_uniform"] >= 0

    flat = sorted(k for k, key in by_type.items() if shows_nothing(k, key))
    temperatures = {k: metrics.FLAT if k in flat else judged_on(results, key, k, pooled)["temperature"]
                    for k, key in by_type.items()}
    by_type.update({k: min(invariant, key=cost.get) for k in flat})
    return by_type, flat, pooled, temperatures


def judged_on(results: dict, key: str, kind: str, pooled) -> dict | None:
    """What a type's answer under `key` is chosen and judged on: that type's dev items, or
    all dev items pooled (`pooled`: the types chosen that way); None where not measured."""
    measured = results.get(key, {})
    return measured.get("dev_pooled") if kind in pooled else measured.get("dev_by_type", {}).get(kind)


def probe_all(prober: Prober, what: str, items: list[Item], grid_for, variant_grid: list[Config],
              with_variants: set[str], found: dict) -> None:
    start, decoded = time.monotonic(), prober.decoded_tokens
    print(f"[eval] {what}: {len(items)} items, {len(with_variants)} with variants", flush=True)
    for i, item in enumerate(items, 1):
        found.setdefault(item.id, {"by_config": {}, "shape": {}})
        new = distributions_for(prober, item, grid_for(item), variant_grid if item.id in with_variants else [])
        for key, value in new["by_config"].items():
            found[item.id]["by_config"].setdefault(key, {}).update(value)
        found[item.id]["shape"] = new["shape"] or found[item.id]["shape"]
        if i % 25 == 0 or i == len(items):
            prober.cache.commit()
            print(f"[eval]   {i}/{len(items)} items, {prober.decoded_tokens - decoded} tokens decoded,"
                  f" {time.monotonic() - start:.0f} s", flush=True)


def split_report(items: list[Item], found: dict, pick) -> dict:
    """The report of one split, each item's distribution chosen by `pick(item) -> (config key, temperature)`."""
    ps = []
    for it in items:
        key, temperature = pick(it)
        ps.append(metrics.at_temperature([found[it.id]["by_config"][key]["sent"]], temperature)[0])
    return metrics.report(ps, [it.gold for it in items], [it.kind for it in items])


def invariance_summary(config_key: str, items: list[Item], found: dict, with_variants: set) -> tuple[dict, int]:
    rows = [invariance(found[it.id]["by_config"][config_key]["sent"], it, found[it.id]["by_config"][config_key],
                       found[it.id]["shape"]) for it in items
            if it.id in with_variants and "perm0" in found[it.id]["by_config"].get(config_key, {})]
    summary = {}
    for key in rows[0] if rows else ():
        values = [r[key] for r in rows]
        summary[key] = float(np.mean(values)) if key.endswith("flip") else float(np.max(values))
        if not key.endswith("flip"):
            summary[key + "_mean"] = float(np.mean(values))
    return summary, len(rows)


def score_config(config: Config, dev: list[Item], heldout: list[Item], found: dict, with_variants: set) -> dict:
    key = config.key
    if any(key not in found[it.id]["by_config"] for it in dev):  # measured for its variants only, at T = 1
        summary, n = invariance_summary(key, heldout, found, with_variants)
        return {"temperature": 1.0, "invariance": summary, "invariance_items": n}
    pooled = out_of_fold(dev, key, found)
    temperature = pooled["temperature"]
    by_type = {}
    for kind in sorted({it.kind for it in dev}):
        of_kind = [it for it in dev if it.kind == kind]
        judged = out_of_fold(of_kind, key, found)
        by_type[kind] = {**judged, **split_report(of_kind, found, lambda it, t=judged["temperature"]: (key, t))}
    summary, n = invariance_summary(key, heldout, found, with_variants)
    out = {"temperature": temperature, "dev": split_report(dev, found, lambda it: (key, temperature)),
           "dev_by_type": by_type, "dev_pooled": pooled, "invariance": summary, "invariance_items": n}
    if heldout and all(key in found[it.id]["by_config"] for it in heldout):
        out["heldout"] = split_report(heldout, found, lambda it: (key, temperature))
        out["heldout_t1"] = split_report(heldout, found, lambda it: (key, 1.0))
    return out


def out_of_fold(items: list[Item], key: str, found: dict) -> dict:
    """A configuration on these dev items: its fitted temperature, and what it is worth on
    items the fit never saw (each item at the temperature fitted without it), which is
    what it is chosen and judged on."""
    ps = [found[it.id]["by_config"][key]["sent"] for it in items]
    golds, sizes = [it.gold for it in items], [it.n_options for it in items]
    losses = metrics.out_of_fold_losses(ps, golds)
    return {"temperature": metrics.fit_temperature(ps, golds), "cv_nll": float(losses.mean()),
            "cv_nll_vs_uniform": float(losses.mean() / metrics.uniform(sizes)["nll"] - 1),
            "real_gain": metrics.gain_is_real(losses, sizes)}


def score_per_type(by_type: dict[str, str], temperatures: dict[str, float], dev: list[Item], heldout: list[Item],
                   found: dict, with_variants: set) -> dict:
    """Each question type answered by its own configuration, at that type's dev temperature."""
    def pick(it: Item) -> tuple[str, float]:
        return by_type[it.kind], temperatures[it.kind]

    summary, n = invariance_summary(by_type["choice"], heldout, found, with_variants) if "choice" in by_type else ({
        }, 0)
    return {"by_type": by_type, "temperatures": temperatures,
            "dev": split_report(dev, found, pick), "heldout": split_report(heldout, found, pick),
            "invariance": summary, "invariance_items": n}


def per_type_settings(by_type: dict[str, str], temperatures: dict[str, float]) -> DecisionSettings:
    """The engine settings `per-type` stands for: the choice configuration, other types where they differ."""
    def settings(kind: str) -> DecisionSettings:
        return Config.parse(by_type[kind]).settings(temperatures[kind])

    base = settings("choice") if "choice" in by_type else Config.parse(next(iter(by_type.values()))).settings()
    return replace(base, kinds={k: settings(k) for k in by_type if settings(k) != base})


def cost_per_decision(engine: DecisionEngine, items: list[Item], settings: dict[str, DecisionSettings]) -> dict:
    """Tokens the engine evaluates per decision (one question, priors uncached), counted, not decoded."""
    requests = [parse(DecisionRequest, {"model": "m", "state": it.state, "questions": {"q": it.question}})
                for it in items]
    return {key: float(np.mean([engine.planner.plan(r, s).cost.tokens for r in requests])) for key, s in settings.items()}


def seconds_per_decision(engine: DecisionEngine, items: list[Item], settings: DecisionSettings, n: int = 8) -> float:
    """Wall time of one decision served as chosen (priors warm, as in steady traffic)."""
    chosen = items[:: max(1, len(items) // n)][:n]
    requests = [parse(DecisionRequest, {"model": "m", "state": it.state, "questions": {"q": it.question}})
                for it in chosen]
    for request in requests:
        engine.answer(request, settings)  # warms the prior cache
    start = time.perf_counter()
    for request in requests:
        engine.answer(request, settings)
    return (time.perf_counter() - start) / len(requests)


# -- output ------------------------------------------------------------------------------

def print_model(name: str, model: dict) -> None:
    results = model["results"]
    print(f"\n{name}: chosen {model['chosen']} ({model['seconds_per_decision']:.2f} s per decision here)")
    print(f"  stage 1, dev (n={next(iter(results.values()))['dev']['n']}): {'':<14} {'T':>5} {'acc':>5} {'NLL±u':>6}"
          f" {'Bri±u':>6} {'ECE':>5} {'tokens':>6} {'oofNLL':>6}")
    for key, r in results.items():
        if key == PER_TYPE or "dev" not in r:
            continue
        d = r["dev"]
        mark = " *" if key == model["chosen"] else ""
        print(f"  {key:<41} {r['temperature']:>5.2f} {d['accuracy']:>5.0%} {d['nll_vs_uniform']:>+6.1%}"
              f" {d['brier_vs_uniform']:>+6.1%} {d['ece']:>5.3f} {model['costs'][key]:>6.0f}"
              f" {r.get('dev_pooled', {}).get('cv_nll_vs_uniform', float('nan')):>+6.1%}{mark}")
    per_type = results[PER_TYPE]
    print("  per-type: " + ", ".join(f"{k} {v} (T {per_type['temperatures'][k]:.2f}"
                                     f"{', chosen on all dev types pooled' if k in model.get('pooled', ()) else ''}"
                                     f"{', flat: no real gain on dev' if k in model['flat'] else ''})"
                                     for k, v in per_type["by_type"].items()))
    held = model["heldout_configs"]
    low, high = results[PER_TYPE]["heldout"].get("nll_vs_uniform_95", [float("nan")] * 2)
    print(f"  per-type held-out NLL vs uniform {results[PER_TYPE]['heldout']['nll_vs_uniform']:+.1%}"
          f" (95% bootstrap interval over the items: {low:+.1%} to {high:+.1%})")
    print(f"  stage 2, held-out (n={results[PER_TYPE]['heldout']['n']}; invariance on"
          f" {results[PER_TYPE]['invariance_items']} choice items; {model['before']} is what the engine did before):")
    print(f"  {'configuration':<36} {'acc':>5} {'noul':>5} {'choi':>5} {'scor':>5} {'NLL±u':>6} {'Bri±u':>6}"
          f" {'ECE':>5} {'perm':>5} {'pΔ':>5} {'ren':>5} {'rΔ':>5} {'dup':>5} {'dupΔ':>5}")
    for key in held:
        h, inv = results[key].get("heldout"), results[key]["invariance"]
        mark = " *" if key == model["chosen"] else ""
        quality = (f"{h['accuracy']:>5.0%} {h['by_type'].get('noul', 0):>5.0%} {h['by_type'].get('choice', 0):>5.0%}"
                   f" {h['by_type'].get('score', 0):>5.0%} {h['nll_vs_uniform']:>+6.1%} {h['brier_vs_uniform']:>+6.1%}"
                   f" {h['ece']:>5.3f}") if h else f"{'(choice variants only)':>48}"
        print(f"  {key:<36} {quality}"
              + (f" {inv['perm_flip']:>5.0%} {inv['perm_shift']:>5.2f} {inv['rename_flip']:>5.0%}"
                 f" {inv['rename_shift']:>5.2f} {inv['dup_flip']:>5.0%} {inv['dup_others_shift']:>5.2f}" if inv else "")
              + mark)


# The keys of a model's defaults this eval chooses; `make eval-injection` (evals/attacked.py)
# owns framing, quarantine and injection_probe in the same entry, and they are kept.
QUALITY_KEYS = ("readout", "order_average", "prior", "averaging", "temperatures", "ordering", "by_type",
                "heldout_accuracy", "heldout_nll_vs_uniform", "heldout_brier_vs_uniform", "accuracy")


def write_defaults(models: dict, path: Path = DEFAULTS_FILE) -> None:
    chosen = json.loads(path.read_text()) if path.exists() else {}
    for name, model in models.items():
        if model["plan"]["dev"] is not None and model["plan"]["dev"] < MIN_DEV_TO_CHOOSE:
            print(f"[eval] {name}: {model['plan']['dev']} dev items are too few to choose on; its defaults stay as"
                  f" they are", flush=True)
            continue
        results, by_type = model["results"], model["by_type"]

        def entry(kind: str) -> dict:
            config = Config.parse(by_type[kind])
            temperatures = {}
            for readout in READOUTS:  # the same debiasing with either readout (a request may switch readout)
                key = Config(readout, config.ordering, config.averaging, config.prior).key
                judged = judged_on(results, key, kind, model.get("pooled", ()))
                if kind in model["flat"]:
                    temperatures[readout] = round(metrics.FLAT, 3)
                elif judged is not None:
                    temperatures[readout] = round(judged["temperature"], 3)
            return {"readout": config.readout, "order_average": config.averaging is not None, "prior": config.prior,
                    "averaging": config.averaging or "reversal", "temperatures": temperatures}

        base = entry("choice")
        held = results[PER_TYPE]["heldout"]
        kept = {k: v for k, v in chosen.get(name, {}).items() if k not in QUALITY_KEYS}
        chosen[name] = {**kept, **base, "ordering": "canonical",
                        "by_type": {k: {f: v for f, v in entry(k).items() if base.get(f) != v}
                                    for k in by_type if k != "choice"},
                        "heldout_accuracy": round(held["accuracy"], 4),
                        "heldout_nll_vs_uniform": round(held["nll_vs_uniform"], 4),
                        "heldout_brier_vs_uniform": round(held["brier_vs_uniform"], 4)}
        chosen[name]["by_type"] = {k: v for k, v in chosen[name]["by_type"].items() if v}
    path.write_text(json.dumps(chosen, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--no-write", action="store_true", help="do not rewrite evals/model_defaults.json")
    parser.add_argument("--full-grid", action="store_true", help="every configuration, not only the core ones")
    parser.add_argument("--sample", nargs=3, type=int, metavar=("DEV", "HELDOUT", "INVARIANCE"),
                        help="measure every model on this many items (a quick look; 0 for a whole split)")
    args = parser.parse_args()
    dataset = load()
    for split in ("dev", "heldout"):
        part = [it for it in dataset if it.split == split]
        base = metrics.baselines([it.gold for it in part], [it.kind for it in part])
        unif = metrics.uniform([it.n_options for it in part])
        print(f"{split}: {len(part)} items; always-first {base['always_first']:.1%}, majority {base['majority']:.1%};"
              f" uniform NLL {unif['nll']:.3f}, Brier {unif['brier']:.3f}", flush=True)
    models = {}
    for name in args.models:
        if not (ROOT / "models" / name).is_dir():
            print(f"[eval] {name} is not fetched: run `make setup MODEL=models/{name}` (skipped)", flush=True)
            continue
        plan = MODELS.get(name, Plan(None, None, 40))
        if args.sample:
            dev, heldout, variants_n = args.sample
            plan = replace(plan, dev=dev or None, heldout=heldout or None, invariance=variants_n)
        if args.full_grid:
            plan = replace(plan, full_grid=True)
        grid = [c for c in configs(plan.readouts, plan.full_grid) if plan.rotations or c.averaging != "rotations"]
        models[name] = evaluate_model(name, plan, dataset, grid)
        print_model(name, models[name])
    out = ROOT / "reports"
    out.mkdir(exist_ok=True)
    previous = json.loads((out / "eval.json").read_text()).get("models", {}) if (out / "eval.json").exists() else {}
    merged = {**{k: v for k, v in previous.items() if "plan" in v}, **models}
    (out / "eval.json").write_text(json.dumps({"models": merged}, indent=1))
    from evals.plots import plot

    plot(merged, out / "eval.png")
    if not args.no_write:
        write_defaults(models)
        print(f"\nwrote the chosen settings to {DEFAULTS_FILE.relative_to(ROOT)} (make setup puts them in the manifests)")
    print(f"wrote {out / 'eval.json'} and {out / 'eval.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
