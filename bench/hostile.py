"""`make bench-hostile`: a state built to burn the scorer before admission, beside another tenant.

The worst case a review found: a JSON state of 8,700 keys that the quarantine rewrites to
the same text (about 130 KB, under every body limit). Renaming them one space at a time
took 35 s and 461 MB inside the planning step, before admission and with no deadline,
and the gateway then sent it to the next endpoint: one request became everyone's outage.

As `make up` serves it (gemma, whose manifest quarantines): the state is sent through
the gateway (whose own estimate may refuse it first) and straight to the scorer (as a
caller of the endpoint would, past the gateway), while a second tenant sends ordinary
decisions through the gateway at the same time. Printed: each hostile request's status
and seconds, the scorer's CPU seconds for it (measured alone, from /proc), and the
second tenant's statuses and latencies beside the same decisions sent alone. Writes
reports/bench_hostile.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
KEYS = 8700


def hostile_state(keys: int = KEYS) -> dict:
    """`keys` keys that all quarantine to the same text: a chat-template token and a number."""
    return {"model": "jev-latest", "state": {f"[INST]{i}": 0 for i in range(keys)},
            "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}}}


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    import httpx

    sys.path.insert(0, str(ROOT))
    from bench.stack import local_stack
    from bench.workloads import many_options
    from devkit.models import GEMMA_DIR

    body = hostile_state()
    print(f"hostile state: {KEYS} keys, {len(json.dumps(body)):,} bytes", flush=True)
    with local_stack(GEMMA_DIR, tenants=("attacker", "neighbour")) as stack:

        def send(tenant: str | None, payload: dict) -> tuple[int, float]:
            """Through the gateway as `tenant`, or (None) straight to the scorer."""
            url = f"{stack.gateway}/v1/systemone" if tenant else f"{stack.scorer.url}/v1/systemone"
            headers = {"Authorization": f"Bearer {stack.keys[tenant]}"} if tenant else {}
            started = time.perf_counter()
            reply = httpx.post(url, json=payload, timeout=60, headers=headers)
            return reply.status_code, time.perf_counter() - started

        def alone(tenant: str | None) -> dict:
            before = cpu_seconds(stack.scorer.process.pid)
            status, seconds = send(tenant, body)
            cpu = cpu_seconds(stack.scorer.process.pid) - before
            print(f"hostile request alone, {'through the gateway' if tenant else 'to the scorer'}: {status} in"
                  f" {seconds:.2f} s, {cpu:.2f} s of scorer CPU", flush=True)
            return {"status": status, "seconds": round(seconds, 3), "scorer_cpu_s": round(cpu, 3)}

        ordinary = many_options(16)
        send("neighbour", ordinary)  # its priors computed once, so both figures below are warm
        neighbour_alone = [send("neighbour", ordinary) for _ in range(3)]
        hostile = {"gateway": alone("attacker"), "scorer": alone(None)}
        concurrent: dict[str, tuple[int, float]] = {}
        attacker = threading.Thread(target=lambda: concurrent.setdefault("hostile", send(None, body)))
        attacker.start()
        beside = [send("neighbour", ordinary) for _ in range(3)]
        attacker.join()
    alone_s = statistics.median(s for _, s in neighbour_alone)
    beside_s = statistics.median(s for _, s in beside)
    print(f"neighbour alone:  {[status for status, _ in neighbour_alone]}, median {alone_s:.2f} s")
    print(f"neighbour beside: {[status for status, _ in beside]}, median {beside_s:.2f} s"
          f" ({beside_s / alone_s:.2f}x); the hostile state to the scorer at the same time: {concurrent['hostile'][0]}"
          f" in {concurrent['hostile'][1]:.2f} s")
    report = {"keys": KEYS, "body_bytes": len(json.dumps(body)), "hostile": hostile,
              "hostile_beside": {"status": concurrent["hostile"][0], "seconds": round(concurrent["hostile"][1], 3)},
              "neighbour_alone": neighbour_alone, "neighbour_beside": beside}
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "bench_hostile.json").write_text(json.dumps(report, indent=2) + "\n")
    ok = (all(h["status"] in (200, 413) and h["scorer_cpu_s"] < 2.0 for h in hostile.values())
          and all(status == 200 for status, _ in beside))
    print(f"{'ok' if ok else 'FAILED'}: the hostile state answered or refused in under 2 s of scorer CPU, and every"
          " decision of the other tenant beside it answered; wrote reports/bench_hostile.json")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
