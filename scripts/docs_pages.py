"""The figures of the evaluation and benchmark pages, written from the reports that made them.

Each bench and eval target writes a report under reports/ (gitignored) and ends by
running this script, which renders that report into a Markdown fragment under
docs/figures/ (committed; the pages include it) and copies its plot next to it:

    python scripts/docs_pages.py                  # every fragment whose report exists
    python scripts/docs_pages.py bench-load eval  # only these

A fragment whose report is absent is left as it is, and says which command rewrites it.
Nothing here is typed by hand: edit the renderer, not the fragment.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
FIGURES = ROOT / "docs" / "figures"


# -- formatting ----------------------------------------------------------------------------

def pct(x: float | None, signed: bool = False) -> str:
    if x is None or x != x:  # None or NaN
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return [*lines, ""]


def image(name: str, alt: str) -> list[str]:
    """The plot, where one was copied here (the pages sit beside figures/)."""
    return [f"![{alt}](figures/{name})", ""] if (FIGURES / name).exists() else []


# -- the renderers: one per report ---------------------------------------------------------

def render_eval(report: dict) -> list[str]:
    lines: list[str] = []
    rows = []
    baseline = None
    for name, model in report.get("models", {}).items():
        results = model["results"]
        per_type = results["per-type"]
        held = per_type["heldout"]
        baseline = baseline or (held.get("uniform_nll"), held.get("uniform_brier"), held["n"])
        flat = set(model.get("flat", ()))
        kinds = [k for k in ("noul", "choice", "score") if k in held["by_type"]]
        by_type = " / ".join(f"{held['by_type'][k]:.0%}" for k in kinds)
        flat_note = ""
        if flat:
            flat_note = "; all flat" if flat >= set(kinds) else f"; {' and '.join(k for k in kinds if k in flat)} flat"
        before = results.get(model.get("before", ""), {})
        invariance, before_invariance = per_type.get("invariance", {}), before.get("invariance", {})
        low, high = held.get("nll_vs_uniform_95", [None, None])
        perm = (f"{invariance['perm_flip']:.0%} of {per_type.get('invariance_items', 0)}"
                f" (before: {before_invariance['perm_flip']:.0%})") if invariance and before_invariance else "-"
        rename = (f"{invariance['rename_shift']:.2f} ({invariance['rename_shift_mean']:.2f})"
                  if invariance.get("rename_shift_mean") is not None else "-")
        tokens = model.get("costs", {}).get("per-type")
        seconds = model.get("seconds_per_decision")
        rows.append([f"`{name}`", f"{pct(held['accuracy'])} ({by_type}{flat_note}), n={held['n']}",
                     f"{pct(held['nll_vs_uniform'], True)} (95%: {pct(low, True)} to {pct(high, True)})",
                     pct(held["brier_vs_uniform"], True), num(held["ece"], 3), perm, rename,
                     f"{tokens:.0f} tokens, {seconds:.2f} s" if tokens is not None and seconds is not None else "-"])
    if baseline:
        lines += [f"Held-out split: uniform answer NLL {num(baseline[0], 3)}, Brier {num(baseline[1], 3)}.", ""]
    lines += table(["model", "held-out accuracy (noul / choice / score)", "NLL vs uniform", "Brier vs uniform", "ECE",
                    "answer changes under permutation", "largest shift when an option is renamed (mean)",
                    "cost per decision"], rows)
    before_rows = []
    for name, model in report.get("models", {}).items():
        held = model["results"].get(model.get("before", ""), {}).get("heldout")
        if held:
            before_rows.append([f"`{name}`", f"`{model['before']}`", pct(held["accuracy"]),
                                pct(held["nll_vs_uniform"], True), pct(held["brier_vs_uniform"], True),
                                num(held["ece"], 3), f"{model.get('costs', {}).get(model['before'], float('nan')):.0f}"])
    if before_rows:
        lines += ["What the engine did before (the caller's order and its reversal), on the same items:", ""]
        lines += table(["model", "configuration", "accuracy", "NLL vs uniform", "Brier vs uniform", "ECE", "tokens"],
                       before_rows)
    chosen = []
    for name, model in report.get("models", {}).items():
        temps = model.get("temperatures", {})
        types = ", ".join(f"{kind}: `{key}`" + (" (flat)" if kind in model.get("flat", ()) else f" at T {temps.get(kind, 1):.2f}")
                          + (", chosen on all dev types pooled" if kind in model.get("pooled", ()) else "")
                          for kind, key in model.get("by_type", {}).items())
        chosen.append(f"- `{name}`: {types}")
    if chosen:
        lines += ["Chosen per question type on dev (written to `evals/model_defaults.json`):", "", *chosen, ""]
    return lines + image("eval.png", "held-out quality and order sensitivity per model and configuration")


def render_injection(report: dict) -> list[str]:
    lines: list[str] = []
    for name, model in report.items():
        if not isinstance(model, dict) or "defenses" not in model:
            continue
        chosen = model.get("chosen", {})
        served = chosen.get("framing", "?") + ("+quarantine" if chosen.get("quarantine") else "")
        lines += [f"**`{name}`**: {model['items']} held-out items, {model['attacks']} attacks; the pattern checks flag"
                  f" {pct(model.get('clean_flagged_by_patterns'))} of all clean labelled states; chosen on the tuned"
                  f" forms: **{served}**{', with the probe' if chosen.get('injection_probe') else ''}.", ""]
        rows = []
        for defense, figures in model["defenses"].items():
            for split, r in figures["by_split"].items():
                label = f"**{defense}**" if defense == served else defense
                rows.append([label, "held-out" if split == "heldout" else split, pct(figures["clean_accuracy"]),
                             pct(r["accuracy"]), pct(r["success"]), pct(r["clean_target_rate"]),
                             f"{r['target_shift']:+.3f}", f"{r['recall_patterns']:.0%}",
                             f"{r.get('precision_patterns', float('nan')):.0%}", f"{r['caught_patterns']:.0%}",
                             f"{r['successes_auto_patterns']:.0%}"])
        lines += table(["defense", "forms", "clean acc", "acc under attack", "attack success", "clean picks target",
                        "target shift", "flagged (recall)", "precision", "successes flagged", "auto-acted"], rows)
    return lines + image("injection.png", "attack success per defense")


def render_bench_scorer(report: dict) -> list[str]:
    lines = [f"Model `{report.get('model')}`, a {report.get('state_tokens')}-token state; debiasing off unless said.", ""]
    rows, naive = [], []
    for r in report["rows"]:
        request = f"{r['questions']} q x {r['options']}"
        rows.append([r["readout"], request, r["tokens"], r["logits_rows"], f"{r['engine_s']:.2f} s",
                     f"{r['engine_over_floor']:.2f}x", f"{r['engine_over_floor_rows']:.2f}x",
                     f"{r['debias_warm_over_plain']:.2f}x plain"])
        if "reevaluate_s" in r:
            naive.append(f"{r['readout']} {request}: re-evaluating every prompt {r['reevaluate_s'] / r['engine_s']:.1f}x,"
                         f" generating and parsing {r['generate_s'] / r['engine_s']:.1f}x")
    lines += table(["readout", "request", "tokens", "rows", "engine", "/ floor", "/ floor + rows",
                    "debiased, warm priors"], rows)
    if naive:
        lines += ["The naive approaches, against the engine: " + "; ".join(naive) + ".", ""]
    return lines + image("bench-scorer.png", "decision cost against its floors")


def _debias(row: dict) -> str:
    if row["status"] != 200:
        found = re.search(r"more than (\d+)", row.get("message") or "")
        return f" (more than {found.group(1)} needed)" if found else ""
    d = row.get("debias") or {}
    applied = {(True, True): "both debiasing steps", (True, False): "order averaging", (False, True): "prior",
               (False, False): "no debiasing"}[(bool(d.get("order_average")), bool(d.get("prior")))]
    return f", {applied}" + (" (cut for the budget)" if d.get("reduced_for_budget") else "")


def render_bench_options(reports: dict[str, dict]) -> list[str]:
    lines: list[str] = []
    for name, report in reports.items():
        ping = report.get("scorer", {})
        lines += [f"**`{ping.get('model', name)}`**: a budget of {ping.get('max_request_tokens')} units in"
                  f" {ping.get('budget_s')} s ({num(ping.get('units_per_s_at_load'), 0)} units/s on a decision at load,"
                  f" a plain prefill {num(ping.get('tokens_per_s'), 0)} tokens/s).", ""]
        cases: dict[str, dict[str, str]] = {}
        columns: list[str] = []
        for row in report["rows"]:
            case, _, run = row["case"].partition(", run ")
            # "default": as the model's manifest reads (the same request sent twice, the second with priors warm).
            column = f"as served, run {run or 1}" if row["readout"] == "default" else f"x_readout: {row['readout']}"
            if column not in columns:
                columns.append(column)
            cases.setdefault(case, {})[column] = f"{row['status']} in {row['seconds']:.2f} s{_debias(row)}"
        lines += table(["request", *columns], [[case, *(cells.get(c, "") for c in columns)] for case, cells in cases.items()])
        other = [r for r in report["rows"] if r["status"] not in (200, 413)]
        slowest = max((r["seconds"] for r in report["rows"] if r["status"] == 413), default=0)
        lines += [f"{len(report['rows'])} requests: {len(other)} ended in anything but 200 or 413;"
                  f" the slowest refusal took {slowest:.2f} s.", ""]
    return lines


def render_bench_hostile(report: dict) -> list[str]:
    hostile = report["hostile"]
    rows = [["through the gateway, alone", hostile["gateway"]["status"], f"{hostile['gateway']['seconds']:.2f} s",
             f"{hostile['gateway']['scorer_cpu_s']:.2f} s"],
            ["straight to the scorer, alone", hostile["scorer"]["status"], f"{hostile['scorer']['seconds']:.2f} s",
             f"{hostile['scorer']['scorer_cpu_s']:.2f} s"],
            ["straight to the scorer, beside the other tenant", report["hostile_beside"]["status"],
             f"{report['hostile_beside']['seconds']:.2f} s", "-"]]
    lines = [f"A JSON state of {report['keys']:,} keys ({report['body_bytes']:,} bytes):", ""]
    lines += table(["the hostile request", "status", "seconds", "scorer CPU"], rows)
    alone = statistics.median(s for _, s in report["neighbour_alone"])
    beside = statistics.median(s for _, s in report["neighbour_beside"])
    statuses = lambda rows: ", ".join(str(status) for status, _ in rows)  # noqa: E731
    lines += table(["the other tenant's decisions", "statuses", "median"],
                   [["alone", statuses(report["neighbour_alone"]), f"{alone:.2f} s"],
                    ["beside the hostile state", statuses(report["neighbour_beside"]),
                     f"{beside:.2f} s ({beside / alone:.2f}x)"]])
    return lines


def _phases(cold: dict) -> str:
    return (f"import {cold['import_p50_ms']:.0f} ms, init {cold['init_p50_ms']:.0f} ms, first request"
            f" {cold['first_request_p50_ms']:.0f} ms (total {cold['cold_total_p50_ms']:.0f} ms)")


def render_bench_gateway(report: dict) -> list[str]:
    rows = [[name, f"{r['handler_p50_ms']:.2f} ms", f"{r['handler_p95_ms']:.2f} ms", f"{r['added_p50_ms']:.2f} ms"]
            for name, r in report["handler_overhead"].items()]
    lines = [f"Handler overhead, in process, the backend an instant in-process fake ({report.get('requests')} requests):", ""]
    lines += table(["route", "handler p50", "p95", "added p50"], rows)
    cold = report["cold_start"]
    if stores := report.get("cold_start_with_dynamodb"):
        python = f", Python {stores['python']}" if "python" in stores else ""
        lines += [f"**Cold start as deployed** (median of {stores['runs']} fresh processes{python}): the function's"
                  " artifact (`make build-GatewayFunction`) with its stores as in AWS (tenants, keys, catalogs and"
                  " records in DynamoDB, the signing and record keys in Secrets Manager: moto's server here, slower to"
                  " answer than AWS; their botocore clients and SageMaker's built in the init phase):"
                  f" {_phases(stores)}; RSS {stores['rss_after_first_request_mb']:.0f} MB after it and"
                  f" {stores['rss_after_burst_mb']:.0f} MB after {stores['burst_requests']} more (the function gets"
                  " 256 MB).", ""]
    if authorizer := report.get("authorizer_cold_start"):
        lines += [f"The authorizer as deployed: loading the module, which builds it, {authorizer['load_p50_ms']:.0f} ms,"
                  f" then the first bearer credential {authorizer['first_request_p50_ms']:.0f} ms (total"
                  f" {authorizer['cold_total_p50_ms']:.0f} ms).", ""]
    lines += ["In AWS both functions resume from a SnapStart snapshot taken after their init phase, so a new instance"
              " skips the import and init figures; a restore's own time is untested here (it needs AWS).", ""]
    init = f", building the function in the init phase {cold['init_p50_ms']:.0f} ms" if "init_p50_ms" in cold else ""
    lines += [f"Without stores (the credential and records stores off), in a fresh process (median of"
              f" {cold['runs']}): importing the handler"
              f" {cold['import_p50_ms']:.0f} ms{init}, then the first request {cold['first_request_p50_ms']:.0f} ms"
              f" (total {cold['cold_total_p50_ms']:.0f} ms); RSS {cold['rss_after_first_request_mb']:.0f} MB after it"
              f" and {cold['rss_after_burst_mb']:.0f} MB after {cold['burst_requests']} more requests.", ""]
    if "framework_floor_p50_ms" in cold:
        floor = cold["framework_floor_p50_ms"]
        lines += [f"Of that, {floor:.0f} ms ({floor / cold['cold_total_p50_ms']:.0%}) is what any function on this stack"
                  " pays: pydantic and Powertools' REST resolver with validation, one route with a model body and one"
                  " request, timed the same way in the same artifact. The gateway's own modules, settings, clients,"
                  f" routes and first decision take the other {cold['cold_total_p50_ms'] - floor:.0f} ms.", ""]
    if bare := report.get("cold_start_without_bytecode"):
        lines += [f"The same artifact without its bytecode (as a code folder without it compiles every module at every"
                  f" cold start): {_phases(bare)}, so {cold['cold_total_p50_ms'] / bare['cold_total_p50_ms']:.2f}x with"
                  " it.", ""]
    if runtime := report.get("cold_start_runtime_python"):
        lines += [f"With Python {runtime['python']} (the template's runtime; its own artifact, `--runtime-python`):"
                  f" {_phases(runtime)}.", ""]
    http = report["over_http"]
    lines += ["One chat request over HTTP against an instant backend:", ""]
    lines += table(["path", "p50", "p95", "added p50"],
                   [[name, f"{r['p50_ms']:.2f} ms", f"{r['p95_ms']:.2f} ms", f"{r['added_p50_ms']:.2f} ms"]
                    for name, r in http.items()])
    if "litellm" not in http:
        lines += ["LiteLLM's proxy was not measured in this run (`python -m bench.gateway --no-litellm`, or its"
                  " install failed).", ""]
    return lines + image("bench-gateway.png", "gateway overhead")


def render_bench_load(report: dict) -> list[str]:
    rows = []
    for r in report["pool"]:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(r["errors"].items())) or "none"
        rows.append([r["phase"], r["concurrency"], f"{r['throughput_rps']:.2f}", f"{r['p50_s']:.2f}", f"{r['p95_s']:.2f}",
                     f"{r['p99_s']:.2f}", f"{r['fallback_share']:.0%}", errors, f"{r['ok']}/{r['requests']}"])
    lines = table(["run", "concurrency", "req/s", "p50 s", "p95 s", "p99 s", "served by fallback", "errors", "answered"],
                  rows)
    tenants = report.get("two_tenants") or []
    if tenants:
        base = tenants[0]["quiet"]["p50_answered_s"]
        rows = []
        for t in tenants:
            quiet = t["quiet"]
            flood = ", ".join(f"{k}: {v}" for k, v in sorted(t["flood"].get("statuses", {}).items())) or "-"
            answered = quiet["ok"] > 0
            rows.append([t["phase"], f"{quiet['ok']}/{quiet['requests']}",
                         num(quiet["p50_answered_s"]) if answered else "-",
                         num(quiet["p50_answered_s"] / base) if answered else "-", num(quiet["p95_s"]), flood])
        lines += table(["the quiet tenant", "answered", "p50 s", "x alone", "p95 s", "the flood's answers"], rows)
    costed = [r for r in report["pool"] if "cost" in r]
    if costed:
        first = costed[0]["cost"]
        lines += [f"What each run cost, each scorer priced as one {first['instance_type']}"
                  f" (${first['instance_usd_per_hour']}/h): the pool's uptime (what an instance pool pays, idle time"
                  " included), the answered decisions' records, and the tenant's spend ledger (`GET /v1/usage`: every"
                  " request that reached an endpoint) with its month's tally:", ""]
        lines += table(["run", "concurrency", "pool up", "paid", "records", "ledger", "records' cost", "ledger's cost",
                        "tally", "busy share of uptime"],
                       [[r["phase"], r["concurrency"], f"{c['pool_up_endpoint_s']:.1f} s", f"${c['pool_paid_usd']:.5f}",
                         f"{c['records_endpoint_s']:.1f} s", f"{c['ledger_endpoint_s']:.1f} s",
                         f"${c['records_cost_usd']:.5f}", f"${c['ledger_cost_usd']:.5f}", f"${c['month_tally_usd']:.5f}",
                         f"{c['busy_share_of_uptime']:.0%}"] for r in costed for c in [r["cost"]]])
    five_xx = sum(r["client_5xx"] for r in report["pool"]) + sum(
        t["quiet"]["client_5xx"] + t["flood"].get("client_5xx", 0) for t in tenants)
    lines += [f"Client-visible 5xx in the whole run: {five_xx}.", ""]
    refused = [r for r in report["pool"] if r["ok"] < r["requests"]]
    if refused:  # percentiles over every request: instant refusals pull them down
        lines += ["The latency columns and the plot count every request, refused ones included: where most were "
                  "refused at once with 429 (" + ", ".join(f"{r['phase']} at {r['concurrency']}: "
                                                           f"{r['requests'] - r['ok']} of {r['requests']}"
                                                           for r in refused)
                  + "), a lower p50 means instant refusals, not faster answers: read them with the answered column.", ""]
    return lines + image("bench-load.png", "bench-load")


def render_cost(report: dict) -> list[str]:
    daily = sum(report["hourly"])
    lines = [f"{daily:,.0f} decisions a day; autoscaling target {report['utilisation_target']:.0%}, at least"
             f" {report['min_instances']} instance(s); prices {report['prices']['collected']}"
             " (gateway/decisions/prices.json).", ""]
    rows = []
    for pool, month in zip(report["pools"], report["months"], strict=True):
        served = month.get("served", True)
        rows.append([pool["name"], f"{pool['seconds']:.3f} s", pool["figure"], f"${pool['busy_per_1000_usd']:.3f}",
                     f"${month['per_1000_usd']:.3f}" if served else "refused (over 60 s)",
                     f"${month['usd']:,.2f}" if served else "-", f"{month['utilisation']:.0%}"])
    lines += table(["pool", "per decision", "which figure", "busy, per 1,000", "per 1,000", "per month",
                    "busy share"], rows)
    if "async" in report:
        assumed = report["async"]
        lines += [f"The Async pool answers batch lines only (within the batch's window): a burst pays a cold start"
                  f" of {assumed['cold_start_min']:g} min and {assumed['idle_min']:g} min idle before it scales back"
                  " to zero, both assumed (the pool is untested in AWS).", ""]
    changes = report["break_even"]
    lines += ["Cheapest for interactive requests at steady traffic:", ""]
    for change, following in zip(changes, [*changes[1:], None], strict=True):
        upto = f"to {following['from_per_hour']:,.0f}" if following else "and above"
        lines.append(f"- from {change['from_per_hour']:,.0f} decisions an hour {upto}: {change['cheapest']}")
    return [*lines, "", *image("cost.png", "cost per 1,000 decisions against traffic")]


def render_bench_compare(reports: dict[str, dict]) -> list[str]:
    lines: list[str] = []
    for report in reports.values():
        arguments = " ".join(report.get("arguments", [])) or "its defaults"
        lines += [f"`bench.{report['bench']}` ({arguments}) at `{report['base']}` and at {report['against']},"
                  f" alternately, {report['rounds']} rounds each (medians): after / before"
                  f" {report['geometric_mean_ratio']:.3f}x in geometric mean.", ""]
        lines += table(["figure", "before", "after", "after / before"],
                       [[name, f"{row['before']:.4g}", f"{row['after']:.4g}", f"{row['ratio']:.3f}x"]
                        for name, row in report["figures"].items()])
    return lines


def render_calibration(report: dict) -> list[str]:
    before, after, base = report["before"], report["after"], report["uniform"]
    lines = [f"{report['samples']} labelled decisions from `{Path(report['file']).name}`"
             f" ({report['skipped']} skipped), catalog entry `{report.get('catalog')}`:", ""]
    lines += table(["", "accuracy", "NLL", "Brier", "ECE"],
                   [["raw (T = 1)", num(before["accuracy"], 3), num(before["nll"], 3), num(before["brier"], 3),
                     num(before["ece"], 3)],
                    [f"calibrated (T = {report['temperature']:.2f})", num(after["accuracy"], 3), num(after["nll"], 3),
                     num(after["brier"], 3), num(after["ece"], 3)],
                    ["uniform", "", num(base["nll"], 3), num(base["brier"], 3), ""]])
    proposed = report.get("proposed", {})
    for label, key, precision in (("auto", "auto_min_top", report.get("target_precision", 0.9)),
                                  ("review", "review_min_top", max(0.5, report.get("target_precision", 0.9) - 0.2))):
        threshold = proposed.get(key)
        if threshold is None:
            lines.append(f"- `{label}`: no threshold reaches {precision:.0%} precision with this model.")
            continue
        row = next((r for r in report.get("coverage", []) if abs(r["threshold"] - threshold) < 1e-9), None)
        covered = f", covering {row['coverage']:.0%} of the items at {row['accuracy']:.0%} accuracy" if row else ""
        lines.append(f"- `{label}`: top probability ≥ {threshold:.2f} (target precision {precision:.0%}){covered}.")
    return [*lines, "", *image("calibration-reliability.png", "reliability diagram")]


def render_container(report: dict) -> list[str]:
    words = {"image_mb": "the CPU image: {} MB", "time_to_healthy_s": "`/ping` healthy {} s after `docker run`",
             "rss_after_load_mib": "RSS {} MiB after load", "rss_after_requests_mib": "{} MiB after a decision and a chat",
             "stop_s": "`docker stop` ends it with exit code 0 in {} s (SageMaker's grace period is 30 s)"}
    return [f"- {text.format(report[key])}" for key, text in words.items() if key in report] + [""]


def render_bench_stream(report: dict) -> list[str]:
    lines = [f"{report['runs']} streamed chats of {report['tokens']} tokens with `{report['model']}`, through the local"
             " runner's streaming route with the OpenAI SDK (`stream=True`, usage asked for):", ""]
    rows = [[i + 1, num(s["first_s"]), num(s["total_s"]), pct(s["first_s"] / s["total_s"]),
             f"{s['max_gap_s'] * 1000:.0f} ms", pct(s["max_gap_s"] / s["total_s"]), s["chunks"], s["completion_tokens"]]
            for i, s in enumerate(report["streams"])]
    lines += table(["run", "first content chunk (s)", "whole stream (s)", "first / whole", "longest gap", "gap / whole",
                    "content chunks", "usage: completion tokens"], rows)
    lines += [f"The same completion unstreamed took {num(report['whole_s_median'])} s (median): before the streaming"
              " routes, a stream's first chunk arrived then, with its last.", ""]
    return lines + image("bench-stream.png", "chunks received against time, streamed and buffered")


def render_bench_long(report: dict) -> list[str]:
    ordinary, busy, asked = report["ordinary"], report["while_busy"], report["asked_for_time"]
    return [
        f"A decision of {report['questions']} questions x {report['options_per_question']} options with"
        f" `{report['model']}`, sized to need about 40 s of the scorer's time even without its debiasing, through"
        " the local runner's `POST /v1/systemone` (a streaming route):", "",
        f"- with the ordinary deadline: **{ordinary['status']}** in {num(ordinary['seconds'])} s: \"{ordinary['message']}\";",
        f"- with `Prefer: wait=58` while another decision held the model: **{busy['status']}** in"
        f" {num(busy['seconds'])} s" + (f", Retry-After {busy['retry_after']} s;" if busy["retry_after"] else
                                         " (the two took turns at the model);"),
        f"- with `Prefer: wait=58` on an idle model: **{asked['status']}** in {num(asked['seconds'])} s,"
        f" {asked['answers']} answers.", ""]


def render_bench_tenants(report: dict) -> list[str]:
    phases = report["phases"]
    alone = phases["alone"]
    lines = [f"With `{report['model']}`; steady alone: {pct(alone['ok_share'])} answered 200, median"
             f" {num(alone['median_s'])} s.", ""]
    rows = []
    for name in ("long chats", "flood", "half load"):
        steady, heavy = phases[name]["steady"], phases[name]["heavy"]
        share = phases[name]["busy_share"]
        rows.append([name, f"{pct(steady['ok_share'])} of {steady['sent']}", num(steady["median_s"]),
                     f"{steady['vs_alone']:.2f}x" if steady["vs_alone"] else "-",
                     ", ".join(f"{n} {status}" for status, n in sorted(heavy["statuses"].items())),
                     f"{pct(share.get('steady', 0))} / {pct(share.get('heavy', 0))}"])
    lines += table(["heavy", "steady: 200s", "steady: median (s)", "against alone", "heavy's requests by status",
                    "scorer's busy time: steady / heavy"], rows)
    heavy = phases["heavy alone"]["heavy"]
    lines += [f"Heavy alone, looping long chats: {pct(heavy['scorer_share'])} of the scorer's time; its longest chat"
              f" {heavy['longest_chat_tokens']} tokens in {num(heavy['longest_chat_s'])} s"
              f" ({', '.join(f'{n} {status}' for status, n in sorted(heavy['statuses'].items()))}).", ""]
    lines += [f"- {'met' if ok else '**not met**'}: {check}" for check, ok in report["checks"].items()] + [""]
    return lines + image("bench-tenants.png", "steady's answers and latency beside heavy, and the scorer's time per tenant")


def render_bench_cache(report: dict) -> list[str]:
    stack, agent, churn = report["stack"], report["agent"], report["churn"]
    cached = stack["cached_tokens"]
    lines = [f"Through `make up FAST=1`'s stack (`{stack['model']}`), a {stack['state_tokens']}-token transcript and"
             f" three questions ({stack['input_tokens']} tokens read in all), medians of {stack['repeats']}:", ""]
    lines += table(["request", "seconds", "against fresh", "cached tokens"], [
        ["fresh (`x_cache: false`)", num(stack["fresh_s"]), "1.00x", str(max(cached["fresh"]))],
        ["the same again", num(stack["repeat_s"]), f"{stack['repeat_vs_fresh']:.2f}x", str(min(cached["repeat"]))],
        ["one tool call longer", num(stack["extended_s"]), f"{stack['extended_vs_fresh']:.2f}x"
         f" (of {num(stack['extended_fresh_s'])} s fresh)", str(min(cached["extended"]))],
        ["another tenant, the same state", num(stack["other_tenant_s"]), f"{stack['other_vs_fresh']:.2f}x",
         str(max(cached["other_tenant"]))]])
    agent_usage, fresh_usage = stack["usage"]["agent"], stack["usage"]["fresh"]
    lines += [f"`GET /v1/usage`: the reusing tenant read {agent_usage['input_tokens']} tokens,"
              f" {agent_usage['cached_tokens']} of them restored; the fresh tenant {fresh_usage['input_tokens']},"
              f" {fresh_usage['cached_tokens']} restored.", ""]
    for run in (agent, report.get("agent_fast")):
        if run is not None:
            lines += _agent_run(run)
    lines += [f"{churn['states']} distinct states from {churn['tenants']} tenants on `{churn['model']}`, the cache"
              f" bounded at {churn['bound_mib']} MiB: {churn['evictions']} evictions, at most {churn['held_max_mib']:.1f} MiB"
              f" held; RSS moved {num(churn['rss_growth_once_full_mb'], 1)} MB once the cache was full.", ""]
    if "saving" in report:
        lines += ["What keeping a state costs (a first step's transcript, medians of 5):", ""]
        lines += table(["model", "tokens", "read afresh (s)", "saved (KiB a token)", "save (ms)", "restore (ms)"], [
            [f"`{name}`", str(f["tokens"]), num(f["prefill_s"]), num(f["kib_per_token"], 1), num(f["save_ms"], 1),
             num(f["restore_ms"], 1)] for name, f in report["saving"].items()])
    lines += [f"- {'met' if ok else '**not met**'}: {check}" for check, ok in report["checks"].items()] + [""]
    return lines + image("bench-cache.png", "the agent run's seconds per step with and without reuse; RSS and the"
                         " cache's bytes over 500 distinct states")


def render_bench_batch(report: dict) -> list[str]:
    reference = report["reference"]
    lines = [f"{report['lines']} decisions (distinct tickets, two questions) on `{report['model']}` through"
             f" `make up FAST=1`'s stack; cost at `{reference['instance']}`'s {reference['usd_per_hour']:.3f} USD an"
             f" hour, a batch line at {reference['batch_price_factor']:g} of it:", ""]
    rows = [[name, f"{report[key]['ok']}/{report['lines']}", num(report[key]["wall_s"], 1),
             num(report[key]["endpoint_s"], 1), f"{report[key]['usd_per_1000']:.4f}"]
            for name, key in (("one by one", "one_by_one"), ("one batch, idle stack", "batch_idle"),
                              ("one batch beside interactive decisions", "batch_loaded"))]
    lines += table(["run", "answered", "wall (s)", "the scorer's seconds", "USD per 1,000"], rows)
    alone, beside, used = report["alone"], report["interactive_beside_batch"], report["model_s"]
    lines += table(["interactive decisions", "p50 (s)", "p95 (s)", "answered"], [
        ["alone", num(alone["p50_s"], 3), num(alone["p95_s"], 3), f"{alone['ok']}/{alone['sent']}"],
        ["beside the batch", num(beside["p50_s"], 3), num(beside["p95_s"], 3), f"{beside['ok']}/{beside['sent']}"]])
    lines += [f"Beside the interactive decisions, the model ran them {num(used['ordinary'], 1)} s and batch lines"
              f" {num(used['bulk'], 1)} s of {num(report['batch_loaded']['wall_s'], 1)} s: the batch used"
              f" {pct(report['batch_share_of_idle'])} of the time interactive work left, and made"
              f" {pct(report['batch_progress_in_idle'])} of its idle-stack progress in it (two cores shared by the"
              " scorer, the gateway, the worker and the clients make each step slower under load).", ""]
    lines += [f"- {'met' if ok else '**not met**'}: {check}" for check, ok in report["checks"].items()] + [""]
    return lines + image("bench-batch.png", "wall time and cost per 1,000 one by one and as a batch; interactive"
                         " latency alone and beside a batch")


def _agent_run(agent: dict) -> list[str]:
    lines = [f"An agent run on `{agent['model']}`: {agent['steps']} steps, one tool call more each (the first"
             f" {agent['first_state_tokens']} tokens), three questions a step:", ""]
    lines += table(["", "scorer seconds in all", "first step (s)", "last step (s)", "tokens evaluated"], [
        [name, num(agent["total_s"][name], 1), num(agent["first_step_s"][name]), num(agent["last_step_s"][name]),
         str(agent["evaluated_tokens"][name])] for name in ("fresh", "reuse")])
    flips = agent["flips"]
    changed = ("the same top answers at every step" if not flips else f"the top answer changed {len(flips)} time(s) of"
               f" {3 * agent['steps']}, where the fresh answer's lead was "
               + ", ".join(f"{f['fresh_margin']:.3f} ({f['question']}, step {f['step']})" for f in flips))
    return [*lines, f"Reuse takes {agent['reuse_vs_fresh']:.2f}x the scorer's time (and so the endpoint time billed);"
                    f" every step's probabilities within {agent['largest_difference']:.3f} of the fresh ones, {changed};"
                    f" RSS at the end {agent['rss_mb']:.0f} MB.", ""]


def render_eval_stack(report: dict) -> list[str]:
    served = report["served"]
    nll, brier = report["nll_vs_uniform"], report["brier_vs_uniform"]
    return [
        f"The {report['items']} held-out decisions ({', '.join(f'{n} {k}' for k, n in report['kinds'].items())}),"
        f" one at a time through the gateway as `make up` serves `{served.get('model')}`"
        f" (model file `{str(served.get('x_model_sha256'))[:12]}`); {report['answered']} answered,"
        f" {len(report['refused'])} refused as too large (413):", "",
        *table(["accuracy", "best constant answer per question type", "NLL vs uniform (95% interval)",
                "Brier vs uniform (95% interval)", "s / decision (median, p90)"],
               [[pct(report["accuracy"]), pct(report["best_constant_accuracy"]),
                 f"{pct(nll[0], True)} ({pct(nll[1], True)} to {pct(nll[2], True)})",
                 f"{pct(brier[0], True)} ({pct(brier[1], True)} to {pct(brier[2], True)})",
                 f"{num(report['seconds_per_decision']['median'])}, {num(report['seconds_per_decision']['p90'])}"]]),
        "The best constant answer saw the answers: for each question type, its most common gold position.", "",
        *by_kind_table(report.get("by_kind", {}))]


def by_kind_table(by_kind: dict) -> list[str]:
    if not by_kind:
        return []
    return ["By question type:", "", *table(["type", "items", "accuracy", "NLL vs uniform", "Brier vs uniform"],
                                             [[k, str(r["n"]), pct(r["accuracy"]), pct(r["nll_vs_uniform"], True),
                                               pct(r["brier_vs_uniform"], True)] for k, r in by_kind.items()])]


def render_eval_adapters(report: dict) -> list[str]:
    """Per catalog and model: zero-shot, then the answer with an adapter after n outcomes (out of fold)."""
    sizes = [str(n) for n in report["sizes"] if n]
    lines = [f"Out of fold, folds grouped by source, {report['draws']} draws of the outcomes per fold. Accuracy;"
             " the adapter column is the zero-shot answer where the refit's own cross-validation kept no"
             " adapter (as the gateway answers). The quality model's time per decision was measured while"
             " other work shared the 2 cores: its time alone is on the evaluation page (make eval-stack).", ""]
    rows = []
    for name, catalog in report["catalogs"].items():
        for model, result in catalog["models"].items():
            curve = result["curve"]
            zero = curve["0"]["zero_shot"]["accuracy"]
            cells = [pct(curve[n]["adapter"]["accuracy"]) if n in curve else "-" for n in sizes]
            gain = (curve["100"]["adapter"]["accuracy"] - zero) if "100" in curve else None
            sampled = result.get("items", catalog["items"]) < catalog["items"]
            rows.append([f"{name} ({catalog['items']} texts, {catalog['sources']} sources, {catalog['options']} options)",
                         model, num(result["seconds_per_decision"]),
                         f"{pct(zero)} (on {result['items']} texts)" if sampled else pct(zero), *cells,
                         pct(gain, signed=True) if gain is not None else "-"])
    lines += table(["catalog", "model", "s / decision", "zero-shot", *[f"n={n}" for n in sizes], "gain at 100"], rows)
    rows = []
    for name, catalog in report["catalogs"].items():
        for model, result in catalog["models"].items():
            curve = result["curve"]
            if "100" not in curve:
                continue
            at, zero = curve["100"], curve["0"]["zero_shot"]
            rows.append([name, model, num(zero["nll"], 3), num(at["calibrated"]["nll"], 3), num(at["adapter"]["nll"], 3),
                         num(zero["brier"], 3), num(at["adapter"]["brier"], 3), at["adapters_kept"],
                         num(catalog["uniform"]["nll"], 3)])
    lines += ["NLL and Brier at 100 outcomes (lower is better), and how many of the fits kept an adapter:", ""]
    lines += table(["catalog", "model", "NLL zero-shot", "NLL calibrated", "NLL adapter", "Brier zero-shot",
                    "Brier adapter", "adapters kept", "NLL uniform"], rows)
    return [*lines, *image("eval-adapters.png", "accuracy, NLL and Brier against outcomes seen, per catalog")]


# -- the fragments ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Fragment:
    name: str  # docs/figures/<name>.md
    report: str  # a path under reports/, or a glob
    command: str  # what writes the report (and, at its end, this fragment)
    render: Callable[[Any], list[str]]
    plots: tuple[tuple[str, str], ...] = ()  # (under reports/, under docs/figures/)

    def sources(self) -> list[Path]:
        found = sorted(REPORTS.glob(self.report))
        if self.name == "bench-options":  # a report from before the per-model names, unless its model has a newer one
            legacy = REPORTS / "bench_options.json"
            if legacy.exists():
                model = json.loads(legacy.read_text()).get("scorer", {}).get("model")
                if not (REPORTS / f"bench_options_{model}.json").exists():
                    found.append(legacy)
        return found


FRAGMENTS = {f.name: f for f in (
    Fragment("eval", "eval.json", "make eval", render_eval, (("eval.png", "eval.png"),)),
    Fragment("eval-stack", "eval_stack.json", "make eval-stack", render_eval_stack),
    Fragment("eval-adapters", "adapters/adapters.json", "make eval-adapters", render_eval_adapters,
             (("adapters/adapters.png", "eval-adapters.png"),)),
    Fragment("injection", "injection.json", "make eval-injection", render_injection, (("injection.png", "injection.png"),)),
    Fragment("bench-scorer", "bench_scorer.json", "make bench-scorer", render_bench_scorer,
             (("bench_scorer.png", "bench-scorer.png"),)),
    Fragment("bench-options", "bench_options_*.json", "make bench-options", render_bench_options),
    Fragment("bench-hostile", "bench_hostile.json", "make bench-hostile", render_bench_hostile),
    Fragment("bench-stream", "bench_stream.json", "make bench-stream", render_bench_stream,
             (("bench_stream.png", "bench-stream.png"),)),
    Fragment("bench-long", "bench_long.json", "make bench-long", render_bench_long),
    Fragment("bench-tenants", "bench_tenants.json", "make bench-tenants", render_bench_tenants,
             (("bench_tenants.png", "bench-tenants.png"),)),
    Fragment("bench-cache", "bench_cache.json", "make bench-cache", render_bench_cache,
             (("bench_cache.png", "bench-cache.png"),)),
    Fragment("bench-batch", "bench_batch.json", "make bench-batch", render_bench_batch,
             (("bench_batch.png", "bench-batch.png"),)),
    Fragment("bench-gateway", "bench_gateway.json", "make bench-gateway", render_bench_gateway,
             (("bench_gateway.png", "bench-gateway.png"),)),
    Fragment("bench-load", "bench_load.json", "make bench-load", render_bench_load, (("bench_load.png", "bench-load.png"),)),
    Fragment("cost", "cost.json", "make cost", render_cost, (("cost.png", "cost.png"),)),
    Fragment("bench-compare", "bench_revisions_*.json", "make bench-compare", render_bench_compare),
    Fragment("calibration", "calibration/calibration.json",
             "python -m devkit.calibrate (then python scripts/docs_pages.py calibration)", render_calibration,
             (("calibration/reliability.png", "calibration-reliability.png"),)),
    Fragment("container", "container.json", "make container-test (then python scripts/docs_pages.py container)",
             render_container),
)}


def write(fragment: Fragment) -> Path | None:
    """Render one fragment from its report(s); None when no report exists."""
    sources = fragment.sources()
    if not sources:
        return None
    FIGURES.mkdir(parents=True, exist_ok=True)
    for source, target in fragment.plots:
        if (REPORTS / source).exists():
            shutil.copyfile(REPORTS / source, FIGURES / target)
    if fragment.name == "bench-options":
        loaded = {p.stem.removeprefix("bench_options_"): json.loads(p.read_text()) for p in sources}
        reports = dict(sorted(loaded.items(), key=lambda kv: str(kv[1].get("scorer", {}).get("model", kv[0]))))
        body = fragment.render(reports)
    elif "*" in fragment.report:  # one report per bench or model: all of them, by name
        body = fragment.render({p.stem: json.loads(p.read_text()) for p in sources})
    else:
        body = fragment.render(json.loads(sources[0].read_text()))
    day = max(datetime.datetime.fromtimestamp(p.stat().st_mtime, tz=datetime.UTC).date() for p in sources)
    names = ", ".join(f"`{p.relative_to(ROOT)}`" for p in sources)
    header = (f"*Written by `{fragment.command}` from {names} ({day.isoformat()}); the next run rewrites it,"
              " so edit `scripts/docs_pages.py`, not this file.*")
    path = FIGURES / f"{fragment.name}.md"
    path.write_text("\n".join([header, "", *body]).rstrip() + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fragments", nargs="*", metavar="FRAGMENT", help=f"any of {', '.join(FRAGMENTS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.fragments if name not in FRAGMENTS]
    if unknown:
        parser.error(f"no fragment named {', '.join(unknown)}; the fragments: {', '.join(FRAGMENTS)}")
    for name in args.fragments or list(FRAGMENTS):
        fragment = FRAGMENTS[name]
        path = write(fragment)
        if path is None:
            print(f"[docs] {name}: no reports/{fragment.report}; docs/figures/{name}.md kept ({fragment.command} writes it)")
        else:
            print(f"[docs] wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
