"""`make bench-options`: the largest valid decisions, end to end, as `make up` serves them.

One scorer with the `make up` default model (or `--model FOLDER`) and default settings (two threads, the
budget it derives from its measured prefill rate) behind the gateway's local runner
with its default routing (25 s deadline). Through the gateway it sends one choice
question of 16, 32, 64, 128 and 255 options (a name and a description, about 45
characters together): twice as the model reads by default, once with each readout; then
the same 255 options with numbered names (digits cost a token each), and the largest
body the contract allows (400 questions x 255 options), to the gateway and to the scorer
alone. For each: status, seconds, what debiasing the budget left, tokens evaluated.
Every request must end in a 200 or a 413 (never a 503 or a 504, the gateway's or API
Gateway's), and a refusal must come in under a second. Writes reports/bench_options_<model>.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from systemone.errors import read_error_body

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"


def main() -> int:
    import argparse

    import httpx

    sys.path.insert(0, str(ROOT))
    from bench.stack import local_stack
    from bench.workloads import many_options
    from devkit.models import GEMMA_DIR

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=GEMMA_DIR, help="the model folder (default: make up's)")
    args = parser.parse_args()
    rows = []
    with local_stack(ROOT / args.model) as stack:
        scorer, gateway, key = stack.scorer, stack.gateway, stack.keys["bench"]
        ping = httpx.get(f"{scorer.url}/ping").json()
        print(f"scorer: {ping['model']}, budget {ping['max_request_tokens']} units in {ping['budget_s']} s"
              f" ({ping['units_per_s_at_load']:.0f} units/s on a decision at load; a plain prefill"
              f" {ping['tokens_per_s']:.0f} tokens/s)", flush=True)
        numbered = many_options(255)
        numbered["questions"]["queue"]["criteria"] = {
            f"queue {k:03d}": f"requests about product line {k:03d} support" for k in range(255)}
        largest = {"model": "jev-latest", "state": "A ticket.", "questions": {
            f"q{i}": numbered["questions"]["queue"] for i in range(400)}}
        sizes = (16, 32, 64, 128, 255)
        cases = [(f"{n} options, run {run}", "default", f"{gateway}/v1/systemone", many_options(n))
                 for run in (1, 2) for n in sizes]
        cases += [(f"{n} options", readout, f"{gateway}/v1/systemone", many_options(n, x_readout=readout))
                  for readout in ("letters", "likelihood") for n in sizes]
        cases += [("255 numbered options", readout, f"{gateway}/v1/systemone", {**numbered, "x_readout": readout})
                  for readout in ("letters", "likelihood")]
        cases += [("400 x 255 options", "default", f"{gateway}/v1/systemone", largest),
                  ("400 x 255 options, scorer alone", "default", f"{scorer.url}/v1/systemone", largest)]
        for name, readout, url, body in cases:
            started = time.perf_counter()
            reply = httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
            seconds = time.perf_counter() - started
            answer = reply.json()
            row = {"case": name, "readout": readout, "status": reply.status_code, "seconds": round(seconds, 2),
                   "debias": answer.get("x_debias"), "tokens": (answer.get("usage") or {}).get("input_tokens"),
                   "message": read_error_body(reply.content).message if reply.status_code != 200 else None}
            rows.append(row)
            debias = row["debias"] or {}
            applied = "+".join(k for k in ("order_average", "prior") if debias.get(k)) or "none"
            print(f"{name:<34} {readout:<10} {reply.status_code} {seconds:6.2f} s  tokens {row['tokens'] or '-':>5}"
                  f"  debias {applied}{' (reduced for the budget)' if debias.get('reduced_for_budget') else ''}"
                  f"{'  ' + row['message'][:90] if row['message'] else ''}", flush=True)
        after = httpx.get(f"{scorer.url}/ping").json()
        print(f"after the run: {after['units_per_s_observed']} units/s observed on its decisions, budget"
              f" {after['max_request_tokens']} units", flush=True)
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / f"bench_options_{Path(args.model).name}.json").write_text(json.dumps({"scorer": ping, "scorer_after": after, "rows": rows},
                                                           indent=2) + "\n")
    bad = [r for r in rows if r["status"] not in (200, 413)]
    slow_refusals = [r for r in rows if r["status"] == 413 and r["seconds"] >= 1.0]
    print(f"\n{len(bad)} requests ended in something else than 200 or 413; {len(slow_refusals)} refusals took a second"
          f" or more; wrote {REPORTS / f'bench_options_{Path(args.model).name}.json'}")
    return 1 if bad or slow_refusals else 0


if __name__ == "__main__":
    sys.exit(main())
