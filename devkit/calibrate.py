"""Fit a catalog entry's calibration on labelled data, through the gateway:
`python -m devkit.calibrate --file labelled.jsonl --catalog NAME [--apply]`.

Each JSONL line holds a `state`, the `expected` answer (an option name; true/false for
a noul; a level index for a score) and optionally its own `catalog` (a name or
{"catalog", "version"}) or an inline System One `question`; otherwise `--catalog` names
the entry. Every item is decided through the gateway (POST /v1/systemone) with
`x_calibrate: false`, so the probabilities are the model's own. Then:

- the temperature that minimises the negative log-likelihood of the expected answers
  (a golden-section search over log T in [0.05, 20]);
- accuracy, Brier score, expected calibration error and NLL, before and after, beside
  the uniform distribution's NLL and Brier (a low ECE on near-chance answers means
  nothing: read it with them);
- coverage and accuracy for every threshold on the calibrated top probability, and the
  smallest `auto` threshold whose accepted answers reach `--target-precision` (and a
  `review` threshold for target - 0.2), or "not reachable";
- a reliability diagram and the coverage curve (PNG), and the report (JSON).

`--apply` writes the temperature, the fit and the proposed thresholds as a new version
of the entry (PUT /v1/catalogs/NAME), keeping its policy mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gateway.catalogs.drift import expected_calibration_error
from gateway.catalogs.policy import answered_by, with_temperature

T_RANGE = (0.05, 20.0)
FIT_KEYS = ("model_sha256", "prompt_version", "readout")  # gateway.decisions.model.FitKey


class GatewayClient:
    def __init__(self, url: str, api_key: str) -> None:
        self.url, self.api_key = url.rstrip("/"), api_key

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers={  # noqa: S310 (the operator's URL)
            "Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:  # noqa: S310
                return reply.status, json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


def decide_raw(client: GatewayClient, model: str, item: dict[str, Any],
               catalog: str | None) -> tuple[list[str], list[float], str, dict[str, str | None]]:
    """(option names, raw probabilities, kind, what answered: model file, prompt template,
    readout) for one labelled item."""
    if "question" in item:
        question = item["question"]
    else:
        ref = item.get("catalog", catalog)
        question = ref if isinstance(ref, dict) else {"catalog": ref}
    status, body = client.request("POST", "/v1/systemone", {"model": model, "state": item["state"], "questions": {"q": question},
                                                            "x_calibrate": False})
    if status != 200:
        raise RuntimeError(f"the gateway answered {status}: {json.dumps(body)[:300]}")
    answer = body["answers"]["q"]
    source = dataclasses.asdict(answered_by(body, answer["type"]))
    if answer["type"] == "noul":
        return ["true", "false"], [answer["noul"], 1 - answer["noul"]], "noul", source
    names = list(answer["probabilities"])
    return names, [answer["probabilities"][n] for n in names], answer["type"], source


def apply_temperature(kind: str, probabilities: list[float], t: float) -> list[float]:
    if kind == "noul":
        p = with_temperature("noul", probabilities[:1], t)[0]
        return [p, 1 - p]
    return list(with_temperature(kind, probabilities, t))


def metrics(samples: list[dict[str, Any]], t: float) -> dict[str, float]:
    nll = brier = correct = 0.0
    pairs = []
    for s in samples:
        p = apply_temperature(s["kind"], s["probabilities"], t)
        k = s["names"].index(s["expected"])
        top = max(range(len(p)), key=p.__getitem__)
        correct += top == k
        nll -= math.log(max(p[k], 1e-12))
        brier += sum((v - (i == k)) ** 2 for i, v in enumerate(p))
        pairs.append((p[top], top == k))
    n = len(samples)
    return {"accuracy": correct / n, "nll": nll / n, "brier": brier / n, "ece": expected_calibration_error(pairs)}


def fit_temperature(samples: list[dict[str, Any]]) -> float:
    """Golden-section search of the NLL over log T (unimodal in practice for softmax temperature)."""
    lo, hi = math.log(T_RANGE[0]), math.log(T_RANGE[1])
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = metrics(samples, math.exp(a))["nll"], metrics(samples, math.exp(b))["nll"]
    for _ in range(40):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = metrics(samples, math.exp(a))["nll"]
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = metrics(samples, math.exp(b))["nll"]
    return math.exp((lo + hi) / 2)


def coverage_curve(samples: list[dict[str, Any]], t: float) -> list[dict[str, float]]:
    rows = []
    scored = []
    for s in samples:
        p = apply_temperature(s["kind"], s["probabilities"], t)
        top = max(range(len(p)), key=p.__getitem__)
        scored.append((p[top], s["names"][top] == s["expected"]))
    for step in range(0, 100):
        threshold = step / 100
        kept = [ok for top, ok in scored if top >= threshold]
        rows.append({"threshold": threshold, "coverage": len(kept) / len(scored),
                     "accuracy": sum(kept) / len(kept) if kept else float("nan"), "accepted": len(kept)})
    return rows


def propose(curve: list[dict[str, float]], precision: float, min_accepted: int = 5) -> float | None:
    for row in curve:
        if row["accepted"] >= min_accepted and row["accuracy"] >= precision:
            return row["threshold"]
    return None


def uniform(samples: list[dict[str, Any]]) -> dict[str, float]:
    nll = sum(math.log(len(s["names"])) for s in samples) / len(samples)
    brier = sum((1 - 1 / len(s["names"])) for s in samples) / len(samples)
    return {"nll": nll, "brier": brier}


def plot(samples: list[dict[str, Any]], t: float, curve: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, temperature, color in (("raw (T=1)", 1.0, "#dd8452"), (f"calibrated (T={t:.2f})", t, "#4c72b0")):
        bins: list[list[tuple[float, bool]]] = [[] for _ in range(10)]
        for s in samples:
            p = apply_temperature(s["kind"], s["probabilities"], temperature)
            top = max(range(len(p)), key=p.__getitem__)
            bins[min(9, int(p[top] * 10))].append((p[top], s["names"][top] == s["expected"]))
        xs = [sum(c for c, _ in b) / len(b) for b in bins if b]
        ys = [sum(ok for _, ok in b) / len(b) for b in bins if b]
        sizes = [20 + 3 * len(b) for b in bins if b]
        left.plot(xs, ys, "-", color=color, alpha=0.6)
        left.scatter(xs, ys, s=sizes, color=color, label=label)
    left.plot([0, 1], [0, 1], ":", color="grey", label="perfect calibration")
    left.set_xlabel("confidence in the top answer")
    left.set_ylabel("accuracy")
    left.set_title("Reliability diagram")
    left.legend(fontsize=8)
    left.set_xlim(0, 1)
    left.set_ylim(0, 1.02)
    right.plot([r["coverage"] for r in curve], [r["accuracy"] for r in curve], "-", color="#4c72b0")
    for r in curve[30::10]:
        right.annotate(f"{r['threshold']:.1f}", (r["coverage"], r["accuracy"]), fontsize=7)
    right.set_xlabel("coverage (share of answers with top >= threshold)")
    right.set_ylabel("accuracy of those answers")
    right.set_title("Coverage vs accuracy per threshold (calibrated)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", required=True, type=Path)
    parser.add_argument("--catalog", help="the entry to calibrate (and the default reference of each item)")
    parser.add_argument("--url", default=os.environ.get("DG_URL", "http://127.0.0.1:3000"))
    parser.add_argument("--api-key", default=None, help="else DG_API_KEY from the environment")
    parser.add_argument("--model", default="jev-latest")
    parser.add_argument("--target-precision", type=float, default=0.9)
    parser.add_argument("--out", type=Path, default=Path("reports/calibration"))
    parser.add_argument("--apply", action="store_true", help="write the fit and thresholds as a new catalog version")
    args = parser.parse_args(argv)
    api_key = args.api_key or os.environ.get("DG_API_KEY")
    if not api_key:
        print("calibrate: pass --api-key or set DG_API_KEY", file=sys.stderr)
        return 2
    if args.apply and not args.catalog:
        print("calibrate: --apply needs --catalog", file=sys.stderr)
        return 2
    client = GatewayClient(args.url, api_key)
    samples, skipped = collect(client, args)
    if not samples:
        print("calibrate: no item had an expected answer among the options", file=sys.stderr)
        return 2
    report = fit_report(samples, skipped, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(samples, report["temperature"], report["coverage"], args.out / "reliability.png")
    print_report(report, args)
    return apply_fit(client, args.catalog, report) if args.apply else 0


def collect(client: GatewayClient, args: argparse.Namespace) -> tuple[list[dict[str, Any]], int]:
    """Each labelled item decided through the gateway: (the samples, how many were skipped)."""
    items = [json.loads(line) for line in args.file.read_text().splitlines() if line.strip()]
    samples, skipped, started = [], 0, time.monotonic()
    for i, item in enumerate(items, 1):
        names, probabilities, kind, source = decide_raw(client, args.model, item, args.catalog)
        expected = str(item["expected"]).lower() if kind == "noul" else str(item["expected"])
        if expected not in names:
            skipped += 1
        else:
            samples.append({"names": names, "probabilities": probabilities, "kind": kind, "expected": expected,
                            **source})
        if i % 10 == 0 or i == len(items):
            rate = i / (time.monotonic() - started)
            print(f"  {i}/{len(items)} decided ({rate:.1f}/s)", file=sys.stderr, flush=True)
    return samples, skipped


def fit_report(samples: list[dict[str, Any]], skipped: int, args: argparse.Namespace) -> dict[str, Any]:
    t = fit_temperature(samples)
    curve = coverage_curve(samples, t)
    return {
        "file": str(args.file), "catalog": args.catalog, "samples": len(samples), "skipped": skipped, "temperature": t,
        "before": metrics(samples, 1.0), "after": metrics(samples, t), "uniform": uniform(samples),
        "target_precision": args.target_precision, "coverage": curve,
        # A temperature holds for the model, prompt template and readout that produced the
        # probabilities it was fitted on: the gateway applies it to their answers only.
        **{f"{key}s": sorted({s[key] for s in samples if s[key]}) for key in FIT_KEYS},
        "proposed": {"auto_min_top": propose(curve, args.target_precision),
                     "review_min_top": propose(curve, max(0.5, args.target_precision - 0.2))},
    }


def print_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    t, auto, review = report["temperature"], report["proposed"]["auto_min_top"], report["proposed"]["review_min_top"]
    print(f"\n{report['samples']} labelled decisions ({report['skipped']} skipped: expected answer not an option)")
    print(f"{'':<12}{'accuracy':>10}{'NLL':>8}{'Brier':>8}{'ECE':>8}")
    for name, row in (("raw", report["before"]), (f"T={t:.2f}", report["after"])):
        print(f"{name:<12}{row['accuracy']:>10.3f}{row['nll']:>8.3f}{row['brier']:>8.3f}{row['ece']:>8.3f}")
    base = report["uniform"]
    print(f"{'uniform':<12}{'':>10}{base['nll']:>8.3f}{base['brier']:>8.3f}")
    print("\nthreshold  coverage  accuracy")
    for row in report["coverage"][30::10]:
        print(f"{row['threshold']:>9.2f}{row['coverage']:>10.2f}{row['accuracy']:>10.3f}")
    print(f"\nauto threshold for precision {args.target_precision:.2f}: "
          f"{'not reachable with this model' if auto is None else f'top >= {auto:.2f}'}")
    print(f"review threshold for precision {max(0.5, args.target_precision - 0.2):.2f}: "
          f"{'not reachable' if review is None else f'top >= {review:.2f}'}")
    print(f"wrote {args.out / 'calibration.json'} and {args.out / 'reliability.png'}")


def apply_fit(client: GatewayClient, catalog: str, report: dict[str, Any]) -> int:
    """The fit and the proposed thresholds, written as a new version of the entry."""
    mixed = [key for key in FIT_KEYS if len(report[f"{key}s"]) != 1]
    if mixed:
        counts = ", ".join(f"{len(report[key + 's'])} {key}" for key in mixed)
        print(f"calibrate: not applied: the answers came from {counts} values (one of each is needed: a calibration"
              " belongs to one model, prompt and readout)", file=sys.stderr)
        return 1
    status, entry = client.request("GET", f"/v1/catalogs/{catalog}")
    if status != 200:
        print(f"calibrate: cannot read {catalog} ({status})", file=sys.stderr)
        return 1
    t, auto, review, after = (report["temperature"], report["proposed"]["auto_min_top"],
                              report["proposed"]["review_min_top"], report["after"])
    content = {k: v for k, v in entry.items() if k not in ("name", "version", "hash", "created_at")}
    policy = content.get("policy") or {"mode": "advisory"}
    policy["auto"] = {"min_top": 1.0 if auto is None else auto}  # unreachable: nothing is automated
    policy["review"] = {"min_top": 1.0 if review is None else review}
    content["policy"] = policy
    content["calibration"] = {"temperature": round(t, 4), "fit": {
        "fitted_at": time.time(), "samples": report["samples"], "accuracy": after["accuracy"], "ece": after["ece"],
        "brier": after["brier"], **{key: report[f"{key}s"][0] for key in FIT_KEYS}}}
    status, written = client.request("PUT", f"/v1/catalogs/{catalog}", content)
    if status not in (200, 201):
        print(f"calibrate: the gateway refused the new version ({status}): {json.dumps(written)[:300]}", file=sys.stderr)
        return 1
    print(f"applied: {catalog}@{written['version']} (temperature {t:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
