"""One benchmark at two revisions of this repository, in one run: is a change as fast as before?

    python -m bench.revisions --base <rev> [--against <rev>] --bench scorer|gateway|engine [-- arguments]

The base revision is exported (`git archive`) into build/revisions/<sha>, beside the
models this checkout fetched; then the benchmark runs there and here in turn, `--rounds`
times, alternating which goes first, so that a machine that slows down over the run
slows both alike. `--bench engine` times the scorer's engine alone as the server drives
it (fit, then decide) on bench.scorer's shapes, priors warm: the figure an engine change
can move, in minutes rather than the hour bench.scorer's floors and baselines take here. Each figure is the median of its rounds; the report gives the ratio
after / before of each (below 1: faster now) and their geometric mean, and is written
to reports/bench_revisions_<bench>.json. Timings taken on a shared machine drift by
several percent between runs: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"


def scorer_figures(report: dict) -> dict[str, float]:
    """Seconds per decision of every shape the scorer bench measures: plain and debiased (warm priors)."""
    figures = {}
    for row in report["rows"]:
        shape = f"{row['readout']} {row['questions']}q x {row['options']}"
        figures[f"{shape}: engine s"] = row["engine_s"]
        figures[f"{shape}: debiased s"] = row["debias_warm_s"]
    return figures


def gateway_figures(report: dict) -> dict[str, float]:
    """The handler's own time per route, the cold start as deployed and without stores, the
    authorizer's (where the revision measures it), memory, and the overhead over HTTP."""
    figures = {f"{route}: handler p50 ms": row["handler_p50_ms"] for route, row in report["handler_overhead"].items()}
    deployed, cold = report["cold_start_with_dynamodb"], report["cold_start"]
    figures.update({"as deployed: import ms": deployed["import_p50_ms"],
                    "as deployed: init ms": deployed["init_p50_ms"],
                    "as deployed: first request ms": deployed["first_request_p50_ms"],
                    "no stores: import ms": cold["import_p50_ms"],
                    "no stores: init ms": cold["init_p50_ms"],
                    "no stores: first request ms": cold["first_request_p50_ms"],
                    "RSS after the burst MB": deployed["rss_after_burst_mb"],
                    "over HTTP: added p50 ms": report["over_http"]["gateway"]["added_p50_ms"]})
    if authorizer := report.get("authorizer_cold_start"):
        figures["authorizer: load ms"] = authorizer["load_p50_ms"]
        figures["authorizer: first credential ms"] = authorizer["first_request_p50_ms"]
    return figures


# The engine as the server drives it (plan, then run), timed in each revision by that
# revision's own code: the figure `make bench-scorer` reports as "engine s", without its
# floors and naive baselines (which take most of its time and do not change with the engine).
ENGINE_CHILD = r"""
import json, sys, time
from pathlib import Path
from bench.scorer import STATE, questions
from scorer_container.engine import DecisionEngine
from scorer_container.llama import LlamaModel, LlamaSettings
from scorer_container.prompts import PromptFormat
from scorer_container.schema import DecisionRequest, parse

model, repeat, largest = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llama = LlamaModel(sorted(Path("models", model).glob("*.gguf"))[0], LlamaSettings(n_ctx=8192))
prompts = PromptFormat.for_model(llama)
figures = {}
for readout in ("letters", "likelihood"):
    engine = DecisionEngine(llama, prompts, model_name=model, default_readout=readout, defenses_overridable=True)
    for n_questions, n_options in [s for s in ((1, 4), (4, 4), (1, 16), (4, 16), (1, 64)) if s[1] <= largest]:
        for debias in (False, True):
            body = {"model": "m", "state": STATE, "questions": questions(n_questions, n_options),
                    "x_readout": readout, "x_order_average": debias, "x_prior": debias}
            request = parse(DecisionRequest, body)
            if hasattr(engine, "planner"):  # a plan, then its run
                run = lambda: engine.decide(engine.fit(request, float("inf")))
            else:  # the settings fitted, then decide (which rebuilt what fit had counted)
                run = lambda: engine.decide(request, settings=engine.fit(request, float("inf")).settings)
            run()  # priors warm, as in steady traffic
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                run()
                times.append(time.perf_counter() - started)
            shape = "debiased" if debias else "plain"
            figures[readout + " " + str(n_questions) + "q x " + str(n_options) + " " + shape + ": s"] = min(times)
print(json.dumps(figures))
"""

BENCHES: dict[str, tuple[str, Callable[[dict], dict[str, float]]]] = {
    "scorer": ("bench_scorer.json", scorer_figures),
    "gateway": ("bench_gateway.json", gateway_figures),
    # ENGINE_CHILD's figures as they are; arguments: --model (gemma), --repeat (3), --options (64: the largest shape)
    "engine": ("", dict),
}


def export(revision: str) -> Path:
    """The revision's files in build/revisions/<sha>, with this checkout's models beside them."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    target = ROOT / "build" / "revisions" / sha
    if not (target / ".exported").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", "--format=tar", sha], cwd=ROOT, check=True, capture_output=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(target, filter="data")
        (target / ".exported").touch()
    for shared in ("models", ".cache"):  # fetched by make setup, never in git
        link = target / shared
        if not link.exists() and (ROOT / shared).exists():
            link.symlink_to(ROOT / shared)
    return target


def run_once(tree: Path, bench: str, arguments: list[str]) -> dict:
    """The benchmark's report from one run in `tree`, its own code first on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.monotonic()
    if bench == "engine":
        options = dict(zip(arguments[::2], arguments[1::2], strict=False))
        child = [sys.executable, "-c", ENGINE_CHILD, options.get("--model", "gemma-3-270m-q4_k_m"),
                 options.get("--repeat", "3"), options.get("--options", "64")]
        out = subprocess.run(child, cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
        report = json.loads(out.strip().splitlines()[-1])
    else:
        subprocess.run([sys.executable, "-m", f"bench.{bench}", *arguments], cwd=tree, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        report = json.loads((tree / "reports" / BENCHES[bench][0]).read_text())
    print(f"[bench] {tree.name if tree != ROOT else 'this checkout'}: {time.monotonic() - started:.0f} s", flush=True)
    return report


def compare(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict:
    rows = {}
    for name in [n for n in after[0] if n in before[0]]:  # a figure one revision does not measure is not compared
        old = statistics.median(run[name] for run in before)
        new = statistics.median(run[name] for run in after)
        rows[name] = {"before": old, "after": new, "ratio": new / old if old else math.nan}
    ratios = [r["ratio"] for r in rows.values() if r["ratio"] > 0 and math.isfinite(r["ratio"])]
    return {"figures": rows, "geometric_mean_ratio": math.exp(statistics.fmean(math.log(r) for r in ratios))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to compare with (a commit, tag or branch)")
    parser.add_argument("--against", help="a second revision to compare (default: this checkout, as it is)")
    parser.add_argument("--bench", choices=sorted(BENCHES), required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="passed to the benchmark (after --)")
    args = parser.parse_args()
    arguments = [a for a in args.arguments if a != "--"]
    base = export(args.base)
    head = export(args.against) if args.against else ROOT
    figures = BENCHES[args.bench][1]
    before: list[dict[str, float]] = []
    after: list[dict[str, float]] = []
    for round_ in range(args.rounds):
        print(f"[bench] round {round_ + 1} of {args.rounds}", flush=True)
        order = [(base, before), (head, after)]
        for tree, runs in order if round_ % 2 == 0 else order[::-1]:
            runs.append(figures(run_once(tree, args.bench, arguments)))
    result = {"bench": args.bench, "base": args.base, "against": args.against or "this checkout",
              "arguments": arguments, "rounds": args.rounds,
              **compare(before, after)}
    REPORTS.mkdir(exist_ok=True)
    out = REPORTS / f"bench_revisions_{args.bench}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{'figure':<44} {'before':>10} {'after':>10} {'after/before':>13}")
    for name, row in result["figures"].items():
        print(f"{name:<44} {row['before']:>10.4g} {row['after']:>10.4g} {row['ratio']:>12.3f}x")
    print(f"geometric mean of the ratios: {result['geometric_mean_ratio']:.3f}x (median of {args.rounds} rounds each)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
