"""`make bench-load`: the gateway's pools under load and under a fault, on the local stack.

Two scorer processes are the two endpoints of one pool: the first with little capacity
(`SCORER_MAX_JOBS=1`: one request at a time, any other gets 503), the second with the
default. A bounded number of decisions is sent at concurrency 1, 4 and 16 through the
gateway's local runner; then the same again with the first scorer killed halfway. For
each run it prints throughput, p50/p95/p99 latency, the share served by fallback (by
another endpoint than the first tried, or after more than one attempt), client-visible
errors by status, and checks that every request got exactly one answer.

Then two tenants share one scorer: a quiet tenant sends decisions one at a time, alone,
then while a second tenant floods at concurrency 16 with its usage plan (3 requests a
minute, burst 1: about a tenth of what this one scorer serves; the runner's emulation
of API Gateway's), then while it floods with no per-tenant throttle at all. The flood's
clients wait 1 s after a 429, as the SDKs do when told Retry-After. The quiet tenant's p50 in the three runs, as ratios to the
first, is what per-tenant throttling buys.

Every pool run also reconciles what it cost. Each scorer is priced as one instance of the
cheapest CPU type in gateway/decisions/prices.json, and each run's tenant has a monthly
budget, so its spend goes through the shared tally. Three counts of one run are set side
by side: the endpoint-seconds the pool was up (what an instance pool pays for, idle time
included), the endpoint-seconds its decision records carry (answered decisions only), and
the tenant's spend ledger (`GET /v1/usage`: every request that reached an endpoint,
failed attempts included) with its month's tally.

Writes reports/bench_load.json and reports/bench_load.png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
STATE = ("Ticket 4411: I was charged twice for my March order and the second charge used the old price. "
         "Please refund the duplicate and confirm by email.")
QUESTIONS = {"refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"},
             "queue": {"type": "choice", "instructions": "Which queue?", "criteria": {"billing": None, "delivery": None}}}


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(url: str, key: str, requests: int, concurrency: int, on_half=None) -> dict:
    import httpx

    results: list[dict | None] = [None] * requests
    half = threading.Event()
    done = Counter()
    lock = threading.Lock()

    def one(i: int) -> None:
        body = {"model": "jev-latest", "state": f"{STATE} (request {i})", "questions": QUESTIONS}
        started = time.perf_counter()
        try:
            reply = httpx.post(f"{url}/v1/systemone", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=40)
            status = reply.status_code
            answered = status == 200 and set(reply.json().get("answers", {})) == set(QUESTIONS)
            record = {"status": status, "answered": answered, "endpoint": reply.headers.get("x-endpoint"),
                      "attempts": int(reply.headers.get("x-attempts", "0") or 0)}
        except httpx.HTTPError as exc:
            record = {"status": f"transport:{type(exc).__name__}", "answered": False, "endpoint": None, "attempts": 0}
        record["latency_s"] = time.perf_counter() - started
        if results[i] is not None:
            raise AssertionError(f"request {i} answered twice")
        results[i] = record
        with lock:
            done["n"] += 1
            if done["n"] == requests // 2 and on_half is not None and not half.is_set():
                half.set()
                on_half()

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(requests)))
    elapsed = time.perf_counter() - started
    assert all(r is not None for r in results), "a request got no answer"
    ok = [r for r in results if r["status"] == 200]
    statuses = Counter(str(r["status"]) for r in results if r["status"] != 200)
    fallback = [r for r in ok if r["attempts"] > 1 or r["endpoint"] == "second"]
    latencies = [r["latency_s"] for r in results]
    return {
        "requests": requests,
        "concurrency": concurrency,
        "throughput_rps": requests / elapsed,
        "p50_s": percentile(latencies, 0.50),
        "p95_s": percentile(latencies, 0.95),
        "p99_s": percentile(latencies, 0.99),
        "p50_answered_s": percentile([r["latency_s"] for r in ok], 0.50),
        "p50_refused_s": percentile([r["latency_s"] for r in results if r["status"] != 200], 0.50),
        "ok": len(ok),
        "every_ok_answered": all(r["answered"] for r in ok),
        "fallback_share": len(fallback) / len(ok) if ok else 0.0,
        "served_by": dict(Counter(r["endpoint"] for r in ok)),
        "errors": dict(statuses),
        "client_5xx": sum(v for k, v in statuses.items() if k.isdigit() and int(k) >= 500),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32, help="requests per run")
    parser.add_argument("--levels", default="1,4,16")
    parser.add_argument("--quiet-requests", type=int, default=40, help="the quiet tenant's requests per two-tenant run")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from devkit.gateway_stack import settings_for
    from devkit.local import LocalApiGateway, ProcessFunctions, make_server
    from devkit.models import SMOLLM2_DIR
    from devkit.scorer_process import ScorerProcess
    from gateway.auth.authenticate import Authenticator
    from gateway.auth.tenants import create_tenant, issue_api_key, set_limits
    from gateway.functions.authorizer import Authorizer
    from gateway.observability import configure_logging
    from gateway.stores.sqlite import open_sqlite

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      POWERTOOLS_LOG_LEVEL="ERROR", POWERTOOLS_METRICS_DISABLED="true")
    configure_logging()
    levels = [int(x) for x in args.levels.split(",") if x]
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    stores = open_sqlite(tmp / "gateway.db")
    store = stores.tenants
    authorize = Authorizer(Authenticator(stores))
    model = {"SM_LLAMA_CPP_MODEL_DIR": str(SMOLLM2_DIR)}
    rows = []
    for phase in ("steady", "first killed halfway"):
        for level in levels:
            progress(f"{phase}: concurrency {level}, {args.requests} requests")
            tenant = f"bench-{len(rows)}"  # a tenant per run: its records and ledger are this run's
            create_tenant(store, tenant)
            set_limits(store, tenant, rate_per_s=1000, burst=1000, max_in_flight=64, monthly_budget_usd=1000.0)
            key = issue_api_key(store, tenant, ["decide"]).secret
            uptime = Uptime()
            with ScorerProcess({**model, "SCORER_MAX_JOBS": "1"}) as first, ScorerProcess(model) as second:
                first.wait("ready")
                second.wait("ready")
                uptime.start("first", "second")
                # A fresh function per run (its instances are processes, as in Lambda), so
                # every run starts from the same circuits; instances are warmed first.
                settings = settings_for(endpoints=("first", "second"), urls={"first": first.url, "second": second.url},
                                        usd_per_hour=INSTANCE_USD_PER_HOUR)
                functions = ProcessFunctions(max_instances=32, env={"GATEWAY_MODELS": settings.model_dump_json(),
                                                                    "GATEWAY_SQLITE_PATH": str(tmp / "gateway.db")})
                server = make_server("127.0.0.1", 0, LocalApiGateway(functions, authorizer=authorize))
                threading.Thread(target=server.serve_forever, daemon=True).start()
                url = f"http://127.0.0.1:{server.server_address[1]}"
                functions.prewarm(level)

                def kill_first() -> None:
                    first.kill()
                    uptime.stop("first")

                try:
                    row = run(url, key, args.requests, level, on_half=kill_first if phase != "steady" else None)
                finally:
                    server.shutdown()
                    server.server_close()
                    functions.close()
                    uptime.stop("first", "second")
            row["cost"] = reconcile(stores, tenant, uptime.seconds())
            rows.append({"phase": phase, **row})
            progress(f"  {row['throughput_rps']:.2f} req/s, p50 {row['p50_s']:.2f} s, fallback {row['fallback_share']:.0%}, "
                     f"errors {row['errors'] or 'none'}")
    tenants = two_tenants(store, authorize, model, args.quiet_requests)
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "bench_load.json").write_text(json.dumps({"pool": rows, "two_tenants": tenants}, indent=2) + "\n")
    plot(rows, tenants, REPORTS / "bench_load.png")

    print(f"\n{'phase':<22}{'conc':>5}{'req/s':>8}{'p50 s':>8}{'p95 s':>8}{'p99 s':>8}{'fallback':>10}  {'errors by status':<20} answered")
    for r in rows:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(r["errors"].items())) or "none"
        print(f"{r['phase']:<22}{r['concurrency']:>5}{r['throughput_rps']:>8.2f}{r['p50_s']:>8.2f}{r['p95_s']:>8.2f}"
              f"{r['p99_s']:>8.2f}{r['fallback_share']:>10.0%}  {errors:<20} {r['ok']}/{r['requests']}"
              f"{'' if r['every_ok_answered'] else ' (INCOMPLETE ANSWERS)'}")
    print_costs(rows)
    five_xx = sum(r["client_5xx"] for r in rows)
    refused = [r for r in rows if r["errors"]]
    for r in refused:
        print(f"{r['phase']}, concurrency {r['concurrency']}: answered p50 {r['p50_answered_s']:.2f} s, "
              f"refused p50 {r['p50_refused_s']:.2f} s")
    print(f"\n{'two tenants: the quiet one':<34}{'answered':>9}{'p50 s':>8}{'x alone':>9}{'p95 s':>8}   flood answers by status")
    base = tenants[0]["quiet"]["p50_answered_s"]
    for t in tenants:
        quiet = t["quiet"]
        flood = ", ".join(f"{k}: {v}" for k, v in sorted(t["flood"].get("statuses", {}).items())) or "-"
        print(f"{t['phase']:<34}{quiet['ok']:>5}/{quiet['requests']:<3}{quiet['p50_answered_s']:>8.3f}"
              f"{quiet['p50_answered_s'] / base:>9.2f}{quiet['p95_s']:>8.3f}   {flood}")
    five_xx += sum(t["quiet"]["client_5xx"] + t["flood"].get("client_5xx", 0) for t in tenants)
    print(f"\nclient-visible 5xx while an endpoint could answer: {five_xx}")
    print(f"wrote {REPORTS / 'bench_load.json'} and {REPORTS / 'bench_load.png'}")
    return 0 if five_xx == 0 and all(r["every_ok_answered"] for r in rows) else 1


FLOOD_RATE_PER_S, FLOOD_BURST, FLOOD_CONCURRENCY = 0.05, 1, 16
PRICES = json.loads((ROOT / "gateway" / "decisions" / "prices.json").read_text())
INSTANCE_TYPE, INSTANCE_USD_PER_HOUR = min(
    ((name, price) for name, price in PRICES["sagemaker_realtime_usd_per_hour"].items() if not name.startswith("ml.g")),
    key=lambda item: item[1])


class Uptime:
    """When each endpoint of a run was up: from ready until killed or stopped."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.stopped: dict[str, float] = {}

    def start(self, *names: str) -> None:
        for name in names:
            self.started[name] = time.monotonic()

    def stop(self, *names: str) -> None:
        for name in names:
            self.stopped.setdefault(name, time.monotonic())

    def seconds(self) -> float:
        return sum(self.stopped[name] - began for name, began in self.started.items())


def reconcile(stores, tenant: str, up_s: float) -> dict:
    """One run's cost three ways: the pool's uptime at the instance price, the records', the ledger's."""
    from gateway.services.spending import Spending

    records = [listed.record for listed in stores.records.scan_records(tenant) if listed.record is not None]
    usage = Spending(stores.counters, lambda _: None).usage(tenant, *[time.strftime("%Y-%m-%d", time.gmtime())] * 2,
                                                            stores.tenants.get_tenant(tenant).limits)
    per_second = INSTANCE_USD_PER_HOUR / 3600
    records_s = sum(r["usage"]["endpoint_s"] or 0.0 for r in records)
    ledger_s = usage["total"]["endpoint_seconds"]
    return {
        "instance_type": INSTANCE_TYPE, "instance_usd_per_hour": INSTANCE_USD_PER_HOUR,
        "pool_up_endpoint_s": up_s, "pool_paid_usd": up_s * per_second,
        "records": len(records), "records_endpoint_s": records_s,
        "records_cost_usd": sum(r["usage"]["cost_usd"] or 0.0 for r in records),
        "ledger_requests": usage["total"]["requests"], "ledger_endpoint_s": ledger_s,
        "ledger_cost_usd": usage["total"]["cost_usd"], "month_tally_usd": usage["budget"]["month_spent_usd"],
        "busy_share_of_uptime": ledger_s / up_s if up_s else 0.0,
    }


def print_costs(rows: list[dict]) -> None:
    first = rows[0]["cost"]
    print(f"\nWhat each run cost, each scorer priced as one {first['instance_type']} (${first['instance_usd_per_hour']}/h)")
    print(f"{'phase':<22}{'conc':>5}{'up s':>8}{'paid $':>10}{'records s':>10}{'ledger s':>9}{'records $':>11}"
          f"{'ledger $':>10}{'tally $':>10}{'busy':>7}")
    for r in rows:
        c = r["cost"]
        print(f"{r['phase']:<22}{r['concurrency']:>5}{c['pool_up_endpoint_s']:>8.1f}{c['pool_paid_usd']:>10.5f}"
              f"{c['records_endpoint_s']:>10.1f}{c['ledger_endpoint_s']:>9.1f}{c['records_cost_usd']:>11.5f}"
              f"{c['ledger_cost_usd']:>10.5f}{c['month_tally_usd']:>10.5f}{c['busy_share_of_uptime']:>7.0%}")
    print("up s: both scorers' time up (paid, idle included); records: answered decisions; ledger: every request that"
          " reached an endpoint (GET /v1/usage), which the month's tally must equal once all have settled")


def two_tenants(store, authorize, model: dict, quiet_requests: int) -> list[dict]:
    """The quiet tenant's latency alone, beside a throttled flood, beside an unthrottled one."""
    from devkit.gateway_stack import settings_for
    from devkit.local import LocalApiGateway, LocalUsagePlans, ProcessFunctions, make_server
    from devkit.scorer_process import ScorerProcess
    from gateway.auth.tenants import create_tenant, issue_api_key, set_limits

    for tenant in ("quiet", "flood"):
        create_tenant(store, tenant)
    # Each with a usage key of its own (as `set-limits --usage-plan` gives): its own bucket.
    set_limits(store, "flood", rate_per_s=FLOOD_RATE_PER_S, burst=FLOOD_BURST, usage_key="local-flood")
    set_limits(store, "quiet", usage_key="local-quiet")
    quiet_key = issue_api_key(store, "quiet", ["decide"]).secret
    flood_key = issue_api_key(store, "flood", ["decide"]).secret
    phases = [("quiet tenant alone", False, True), ("beside a flood, usage plans on", True, True),
              ("beside a flood, no throttle", True, False)]
    results = []
    with ScorerProcess(model) as scorer:
        scorer.wait("ready")
        settings = settings_for(endpoints=("scorer",), urls={"scorer": scorer.url})
        for phase, flooding, throttled in phases:
            progress(f"two tenants: {phase}")
            functions = ProcessFunctions(max_instances=24, env={"GATEWAY_MODELS": settings.model_dump_json()})
            plans = LocalUsagePlans(authorize.limits) if throttled else None
            server = make_server("127.0.0.1", 0, LocalApiGateway(functions, authorizer=authorize, usage_plans=plans))
            threading.Thread(target=server.serve_forever, daemon=True).start()
            url = f"http://127.0.0.1:{server.server_address[1]}"
            functions.prewarm(FLOOD_CONCURRENCY + 1)
            stop, flood = threading.Event(), Counter()
            flooders = [threading.Thread(target=_flood, args=(url, flood_key, stop, flood)) for _ in range(FLOOD_CONCURRENCY)]
            try:
                if flooding:
                    for thread in flooders:
                        thread.start()
                    time.sleep(2.0)  # the flood is at full strength before the quiet tenant starts
                quiet = run(url, quiet_key, quiet_requests, 1)
            finally:
                stop.set()
                for thread in flooders:
                    if thread.is_alive():
                        thread.join()
                server.shutdown()
                server.server_close()
                functions.close()
            statuses = {str(k): v for k, v in flood.items()}
            results.append({"phase": phase, "quiet": quiet, "flood": {
                "statuses": statuses, "client_5xx": sum(v for k, v in statuses.items() if k.isdigit() and int(k) >= 500)}})
            progress(f"  quiet: {quiet['ok']}/{quiet['requests']} answered, p50 {quiet['p50_answered_s']:.3f} s,"
                     f" refused {quiet['errors'] or 'none'}; flood {statuses or '-'}")
    return results


def _flood(url: str, key: str, stop: threading.Event, statuses: Counter) -> None:
    import httpx

    body = {"model": "jev-latest", "state": STATE, "questions": QUESTIONS}
    with httpx.Client(timeout=40) as client:
        while not stop.is_set():
            try:
                status = client.post(f"{url}/v1/systemone", json=body, headers={"Authorization": f"Bearer {key}"}).status_code
            except httpx.HTTPError as exc:
                status = f"transport:{type(exc).__name__}"
            statuses[status] += 1
            if status == 429:
                stop.wait(1.0)  # as the SDKs do: wait (they honour Retry-After, 1 s here), then again


def plot(rows: list[dict], tenants: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right, third) = plt.subplots(1, 3, figsize=(16, 4))
    names = [t["phase"].replace(", ", ",\n") for t in tenants]
    third.bar(names, [t["quiet"]["p50_answered_s"] * 1000 if t["quiet"]["ok"] else 0 for t in tenants], color=["#4c72b0", "#55a868", "#c44e52"][:len(tenants)])
    third.set_ylabel("quiet tenant p50 of answered (ms)")
    for i, t in enumerate(tenants):
        refused = ", ".join(f"{k}: {v}" for k, v in sorted(t["quiet"]["errors"].items()))
        third.annotate(f"{t['quiet']['ok']}/{t['quiet']['requests']} answered" + (f"\n(refused {refused})" if refused else ""),
                       (i, 0), ha="center", va="bottom", fontsize=7)
    third.set_title("One tenant floods, the other decides")
    third.tick_params(axis="x", labelsize=7)
    for phase, style in (("steady", "-o"), ("first killed halfway", "--s")):
        sel = [r for r in rows if r["phase"] == phase]
        conc = [r["concurrency"] for r in sel]
        for q, color in (("p50_s", "#4c72b0"), ("p95_s", "#dd8452"), ("p99_s", "#c44e52")):
            left.plot(conc, [r[q] for r in sel], style, color=color, label=f"{q[:-2]} ({phase})")
        right.plot(conc, [r["fallback_share"] * 100 for r in sel], style, label=phase)
    left.set_xlabel("concurrency")
    left.set_ylabel("latency (s)")
    left.legend(fontsize=7)
    left.set_title("Latency through the gateway")
    levels = sorted({r["concurrency"] for r in rows})
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(levels, [str(level) for level in levels])
    right.set_xlabel("concurrency")
    right.set_ylabel("% of answers served by fallback")
    right.legend(fontsize=8)
    right.set_title("Fallback share")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
