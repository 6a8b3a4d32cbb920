"""`make bench-long`: a decision that needs about 40 s of scorer time, as `make up` serves it.

One scorer with `make up`'s default model and settings (its budgets derived from its own
measured speed) behind the gateway's local runner. A decision is sized to need about
`--target-s` seconds of the scorer's time even without debiasing (`sized`): copies of one
64-option choice question over one state. The decision is sent three ways:

1. through the gateway (POST /v1/systemone on the local runner, a streaming route) with the
   ordinary deadline: refused at once with 413, the figures, and how to ask for more time,
   as every decision was before the streaming routes;
2. the same with `Prefer: wait=58`, while another decision holds the model: admitted, the
   two taking turns at the model (long work has a share of the model, not the model:
   scorer_container/scheduler.py): answered 200 within SageMaker's 60 s, or, where the time
   lost waiting for the other's plan and turns leaves too little of its deadline for work
   this size, refused with a Retry-After (429: busy, a retry can succeed), never cut;
3. the same on an idle model: answered 200 within SageMaker's 60 s.

Prints each status and time; writes reports/bench_long.json.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
OPTIONS_PER_QUESTION = 64
BUFFERED_ATTEMPT_MS = 22750  # what an attempt gets of the ordinary deadline (gateway.backends.sagemaker.deadline_ms)
WAIT = {"Prefer": "wait=58"}  # the longest a streaming route allows (gateway.settings.MAX_STREAM_DEADLINE_S)


def decision(questions: int) -> dict[str, Any]:
    from bench.workloads import STATE, options

    criteria = options(OPTIONS_PER_QUESTION)
    return {"model": "jev-latest", "state": STATE,
            "questions": {f"q{i}": {"type": "choice", "instructions": f"Which support queue should handle part {i}?",
                                    "criteria": criteria} for i in range(questions)}}


def busy_seconds(scorer_url: str, body: dict[str, Any], timeout_ms: int = 55750) -> tuple[int, float]:
    """(The scorer's status, the seconds it worked on the request: its usage's x_busy_ms.)"""
    import httpx

    from systemone.sidechannel import CUSTOM_ATTRIBUTES, attributes

    reply = httpx.post(f"{scorer_url}/invocations", json=body, timeout=90,
                       headers={CUSTOM_ATTRIBUTES: attributes("systemone", timeout_ms)})
    busy = reply.json().get("usage", {}).get("x_busy_ms", 0) / 1000 if reply.status_code == 200 else 0.0
    return reply.status_code, busy


def sized(scorer_url: str, target_s: float) -> dict[str, Any]:
    """A decision that the ordinary deadline must refuse and that needs about `target_s` of scorer
    time. Scaled from the time a few questions take, measured warm (the first run also computes
    the options' content-free prior, which the scorer then keeps), at half that time a question:
    a decision over the budget first sheds its debiasing (order averaging, the prior) to fit.
    Grown until an attempt with the ordinary deadline refuses it, which costs no model time (413 at once),
    never past the options a tenant at default limits may ask (1,024: 16 questions)."""
    from gateway.auth.store import DEFAULT_LIMITS

    # Measured on as few questions as the scorer takes within the longest deadline: a loaded
    # machine reads its own speed low, and may refuse four at first (413: too much work).
    for few in (4, 2, 1):
        runs = [busy_seconds(scorer_url, decision(few)) for _ in range(2)]
        if all(status == 200 for status, _ in runs):
            busy = runs[-1][1]
            break
    else:
        raise RuntimeError(f"the scorer answered {runs[-1][0]} to a decision of one question")
    most = DEFAULT_LIMITS.max_options // OPTIONS_PER_QUESTION  # what a tenant at default limits may ask
    questions = min(most, max(1, math.ceil(target_s / (busy / few / 2))))
    while questions < most and busy_seconds(scorer_url, decision(questions), BUFFERED_ATTEMPT_MS)[0] == 200:
        questions = min(most, math.ceil(questions * 1.5))
    return decision(questions)


def run(stack: Any, target_s: float) -> dict[str, Any]:
    import httpx

    from systemone.errors import read_error_body

    body = sized(stack.scorer.url, target_s)
    url, key = f"{stack.gateway}/v1/systemone", {"Authorization": f"Bearer {stack.keys['bench']}"}
    report: dict[str, Any] = {"questions": len(body["questions"]), "options_per_question": OPTIONS_PER_QUESTION}
    print(f"  a decision of {len(body['questions'])} questions x {OPTIONS_PER_QUESTION} options", flush=True)

    def timed(name: str, headers: dict[str, str]) -> httpx.Response:
        started = time.perf_counter()
        reply = httpx.post(url, json=body, headers={**key, **headers}, timeout=90)
        report[name] = {"status": reply.status_code, "seconds": time.perf_counter() - started,
                        "retry_after": reply.headers.get("retry-after")}
        return reply

    refused = timed("ordinary", {})  # the ordinary deadline: refused at once, with how to ask for more
    report["ordinary"]["message"] = read_error_body(refused.content).message or ""
    # While a short decision holds the model, the long one takes turns with it
    holder = threading.Thread(target=lambda: httpx.post(url, json=decision(4), headers=key, timeout=60))
    holder.start()
    time.sleep(0.3)
    timed("while_busy", WAIT)
    holder.join()
    answered = timed("asked_for_time", WAIT)
    report["asked_for_time"]["answers"] = len(answered.json().get("answers", {})) if answered.status_code == 200 else 0
    for name in ("ordinary", "while_busy", "asked_for_time"):
        print(f"  {name}: {report[name]['status']} in {report[name]['seconds']:.2f} s", flush=True)
    if answered.status_code != 200:
        print(f"    {answered.text[:400]}", flush=True)
    return report


def main() -> int:
    import argparse

    sys.path.insert(0, str(ROOT))
    from bench.stack import local_stack
    from devkit.models import GEMMA_DIR

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=GEMMA_DIR, help="the model folder (default: make up's)")
    parser.add_argument("--target-s", type=float, default=40.0, help="the scorer time the decision needs")
    args = parser.parse_args()
    print(f"bench-long: {args.model.name}, a decision of about {args.target_s:.0f} s", flush=True)
    with local_stack(args.model) as stack:
        report = run(stack, args.target_s)
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "bench_long.json").write_text(json.dumps({"model": args.model.name, **report}, indent=2) + "\n")
    busy = report["while_busy"]
    ok = (report["ordinary"]["status"] == 413 and report["asked_for_time"]["status"] == 200
          and (busy["status"] == 200 or (busy["status"] == 429 and int(busy["retry_after"] or 0) >= 1)))
    print("bench-long: " + ("as expected" if ok else "NOT as expected"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
