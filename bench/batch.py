"""`make bench-batch`: decisions as one batch against the same decisions sent one by one, through
`make up FAST=1`'s stack (the scorer, the gateway and the batch worker beside it).

    alone           a tenant's interactive decisions, one every 2 s: their latency alone
    one by one      N decisions sent back to back, each waiting for the last (one client)
    batch, idle     the same N as one batch (another tenant: no state the first one read is reused)
    batch + load    N more as a batch while a third tenant sends interactive decisions at a
                    steady pace (one every twice their latency alone: about half the scorer)

Each line is a distinct ticket (so no answer comes from a state the scorer kept). For each:
wall time, the scorer's seconds (each answer's `x_endpoint_s`: what the scorer itself spent on
it), the cost per 1,000 at a reference instance's price (prices.json: the local scorer has none)
with the batch price factor, and the interactive p50/p95 against alone. The batch's use of the
time interactive work left the scorer: the model's seconds on batch lines over the phase less
its seconds on interactive work (the scorer's own counters, /stats); and its progress in that
time (its time on an idle stack over the time left), which two cores shared by the scorer, the
gateway and the clients make lower than its use. Writes reports/bench_batch.json and reports/bench_batch.png.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.tenants import ROOT, Stack, open_loop, progress

REPORTS = ROOT / "reports"
REFERENCE_INSTANCE = "ml.c7i.xlarge"  # the price the figures are quoted at (4 vCPUs; this machine has 2)
TICKETS = ["I was charged twice for order {n}, refund one please.", "Order {n} never arrived and tracking is stuck.",
           "How do I change the email on my account? Ticket {n}.", "The invoice for order {n} shows the wrong address.",
           "My parcel {n} came damaged, I want a replacement.", "Please close my account, reference {n}."]
QUESTIONS = {"refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"},
             "queue": {"type": "choice", "instructions": "Which queue?",
                       "criteria": {"billing": "payments, refunds", "delivery": "shipping", "account": None}}}


def body(n: int) -> dict[str, Any]:
    return {"model": "jev-latest", "state": f"Customer wrote: {TICKETS[n % len(TICKETS)].format(n=n)}",
            "questions": QUESTIONS}


def decide(stack: Stack, key: str, n: int) -> dict[str, Any]:
    import httpx

    started = time.perf_counter()
    reply = httpx.post(f"{stack.gateway}/v1/systemone", json=body(n), timeout=60, headers={"Authorization": f"Bearer {key}"})
    seconds = time.perf_counter() - started
    usage = reply.json().get("usage", {}) if reply.status_code == 200 else {}
    return {"status": reply.status_code, "seconds": seconds, "endpoint_s": usage.get("x_endpoint_s", 0.0)}


def one_by_one(stack: Stack, key: str, first: int, lines: int) -> dict[str, Any]:
    started = time.monotonic()
    results = []
    for n in range(first, first + lines):
        results.append(decide(stack, key, n))
        if len(results) % 100 == 0:
            progress(f"    {len(results)}/{lines}")
    return {"wall_s": time.monotonic() - started, "ok": sum(r["status"] == 200 for r in results),
            "endpoint_s": sum(r["endpoint_s"] for r in results)}


def batch(stack: Stack, key: str, first: int, lines: int) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=f"{stack.gateway}/v1", api_key=key, max_retries=2, timeout=120)
    data = "\n".join(json.dumps({"custom_id": f"t{n}", "method": "POST", "url": "/v1/systemone", "body": body(n)})
                     for n in range(first, first + lines)).encode()
    started = time.monotonic()
    file_id = client.files.create(file=("tickets.jsonl", io.BytesIO(data)), purpose="batch").id
    batch_id = client.batches.create(input_file_id=file_id, endpoint="/v1/systemone", completion_window="24h").id
    shown = 0
    while (done := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "expired", "cancelled"):
        finished = done.request_counts.completed + done.request_counts.failed if done.request_counts else 0
        if finished >= shown + 100:
            shown = finished - finished % 100
            progress(f"    {shown}/{lines}")
        time.sleep(0.5)
    wall = time.monotonic() - started
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    return {"wall_s": wall, "ok": done.request_counts.completed, "status": done.status,
            "endpoint_s": sum(line["response"]["body"]["usage"].get("x_endpoint_s", 0.0) for line in output),
            "cost_usd": (done.model_extra or {}).get("x_cost_usd")}


def interactive(stack: Stack, key: str, first: int, interval_s: float, stop: threading.Event,
                count: int | None = None) -> list[dict[str, Any]]:
    """Decisions sent every `interval_s` (open loop) until `stop` (or `count` of them)."""
    return open_loop(lambda n: decide(stack, key, first + n), interval_s,
                     lambda n: not stop.is_set() and (count is None or n < count))


def latency(results: list[dict[str, Any]]) -> dict[str, Any]:
    ok = sorted(r["seconds"] for r in results if r["status"] == 200)
    return {"sent": len(results), "ok": len(ok), "p50_s": statistics.median(ok) if ok else None,
            "p95_s": ok[int(0.95 * (len(ok) - 1))] if ok else None, "endpoint_s": sum(r["endpoint_s"] for r in results)}


def run(stack: Stack, lines: int) -> dict[str, Any]:
    keys = {name: stack.tenant(name) for name in ("interactive", "sequential", "bulk", "bulk-loaded")}
    decide(stack, keys["interactive"], 10**6)  # warm: the content-free priors are computed once
    progress("  interactive decisions alone...")
    alone = latency(interactive(stack, keys["interactive"], 2 * 10**6, 2.0, threading.Event(), count=20))
    progress(f"  {lines} decisions one by one...")
    sequential = one_by_one(stack, keys["sequential"], 0, lines)
    progress(f"  the same {lines} as one batch, on an idle stack...")
    idle = batch(stack, keys["bulk"], 0, lines)
    progress(f"  {lines} more as a batch, beside interactive decisions every {2 * alone['p50_s']:.2f} s...")
    stop = threading.Event()
    results: list[dict[str, Any]] = []
    pacing = threading.Thread(target=lambda: results.extend(
        interactive(stack, keys["interactive"], 3 * 10**6, 2 * alone["p50_s"], stop)))
    before = model_seconds(stack)
    pacing.start()
    loaded = batch(stack, keys["bulk-loaded"], 10**5, lines)
    after = model_seconds(stack)
    stop.set()
    pacing.join(180)
    beside = latency(results)
    # The scorer's model time in the phase, by kind: what interactive work left is the batch's to use.
    used = {work: after[work] - before[work] for work in after}
    left_s = loaded["wall_s"] - used["ordinary"]
    # Its progress, beside: the time it needs on an idle stack over the time left (two cores
    # shared by the scorer, the gateway and the clients make each step slower under load).
    return {"lines": lines, "alone": alone, "one_by_one": sequential, "batch_idle": idle, "batch_loaded": loaded,
            "interactive_beside_batch": beside, "model_s": used, "idle_left_s": left_s,
            "batch_share_of_idle": used["bulk"] / left_s if left_s > 0 else None,
            "batch_progress_in_idle": idle["wall_s"] / left_s if left_s > 0 else None}


def model_seconds(stack: Stack) -> dict[str, float]:
    """The scorer's model seconds by kind of work so far (its /stats counters)."""
    import httpx

    return httpx.get(f"{stack.scorer}/stats", timeout=10).json()["busy_s_total_by_work"]


def priced(report: dict[str, Any]) -> None:
    """Cost per 1,000 lines at the reference instance's price: the scorer's seconds, times the batch factor for a batch."""
    from gateway.decisions.cost import PRICES
    from gateway.settings import BatchSettings

    usd_per_s = PRICES["sagemaker_realtime_usd_per_hour"][REFERENCE_INSTANCE] / 3600
    factor = BatchSettings().price_factor
    per_1000 = 1000 / report["lines"]
    report["reference"] = {"instance": REFERENCE_INSTANCE, "usd_per_hour": usd_per_s * 3600, "batch_price_factor": factor}
    report["one_by_one"]["usd_per_1000"] = report["one_by_one"]["endpoint_s"] * usd_per_s * per_1000
    for name in ("batch_idle", "batch_loaded"):
        report[name]["usd_per_1000"] = report[name]["endpoint_s"] * usd_per_s * factor * per_1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "gemma-3-270m-q4_k_m")
    parser.add_argument("--lines", type=int, default=1000)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    progress(f"bench-batch: {args.lines} decisions on {args.model.name}, through make up's stack")
    with Stack(args.model) as stack:
        report = {"model": args.model.name, **run(stack, args.lines)}
    priced(report)
    beside, alone = report["interactive_beside_batch"], report["alone"]
    report["ratios"] = {"batch_idle_vs_one_by_one": report["batch_idle"]["wall_s"] / report["one_by_one"]["wall_s"],
                        "interactive_p50_vs_alone": (beside["p50_s"] or 0) / alone["p50_s"],
                        "interactive_p95_vs_alone": (beside["p95_s"] or 0) / alone["p95_s"]}
    report["checks"] = {
        "idle: the batch within 1.2x one by one": report["ratios"]["batch_idle_vs_one_by_one"] <= 1.2,
        "loaded: the batch uses >= 70% of the idle time": (report["batch_share_of_idle"] or 0) >= 0.7,
        "loaded: interactive median <= 1.5x alone": report["ratios"]["interactive_p50_vs_alone"] <= 1.5,
    }
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "bench_batch.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, REPORTS / "bench_batch.png")
    print_table(report)
    return 0 if all(report["checks"].values()) else 1


def print_table(report: dict[str, Any]) -> None:
    for name in ("one_by_one", "batch_idle", "batch_loaded"):
        figures = report[name]
        progress(f"  {name.replace('_', ' ')}: {figures['ok']}/{report['lines']} answered in {figures['wall_s']:.1f} s,"
                 f" the scorer's {figures['endpoint_s']:.1f} s, {figures['usd_per_1000']:.4f} USD per 1,000")
    alone, beside = report["alone"], report["interactive_beside_batch"]
    progress(f"  interactive alone p50 {alone['p50_s']:.3f} s p95 {alone['p95_s']:.3f} s; beside the batch p50"
             f" {beside['p50_s']:.3f} s p95 {beside['p95_s']:.3f} s ({beside['ok']}/{beside['sent']} answered)")
    used = report["model_s"]
    progress(f"  beside: the model ran interactive work {used['ordinary']:.1f} s and batch lines {used['bulk']:.1f} s of"
             f" {report['batch_loaded']['wall_s']:.1f} s: the batch used {report['batch_share_of_idle']:.0%} of the time"
             f" left, and made {report['batch_progress_in_idle']:.0%} of its idle-stack progress in it")
    for check, ok in report["checks"].items():
        progress(f"  {'ok ' if ok else 'NOT'} {check}")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 4))
    names = ["one by one", "batch, idle", "batch + load"]
    keys = ["one_by_one", "batch_idle", "batch_loaded"]
    left.bar(names, [report[k]["wall_s"] for k in keys], color=["#4c72b0", "#55a868", "#8172b2"])
    left.set_ylabel(f"wall time for {report['lines']} decisions (s)")
    middle.bar(names, [report[k]["usd_per_1000"] * 1000 for k in keys], color=["#4c72b0", "#55a868", "#8172b2"])
    middle.set_ylabel(f"USD per million decisions (at {report['reference']['instance']})")
    alone, beside = report["alone"], report["interactive_beside_batch"]
    positions = range(2)
    right.bar([p - 0.2 for p in positions], [alone["p50_s"], alone["p95_s"]], 0.4, label="alone", color="#4c72b0")
    right.bar([p + 0.2 for p in positions], [beside["p50_s"], beside["p95_s"]], 0.4, label="beside a batch",
              color="#c44e52")
    right.set_xticks(list(positions), ["p50", "p95"])
    right.set_ylabel("interactive decision latency (s)")
    right.legend()
    fig.suptitle(f"A batch beside interactive work ({report['model']}, 2 CPU cores; the batch used"
                 f" {report['batch_share_of_idle']:.0%} of the idle time)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
