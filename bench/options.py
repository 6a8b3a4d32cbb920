"""`make bench-options`: the largest valid decisions, end to end, as `make up` serves them.

One scorer with the `make up` default model and default settings (two threads, the
budget it derives from its measured prefill rate) behind the gateway's local runner
with its default routing (25 s deadline). Through the gateway it sends one choice
question of 4, 64, 128 and 255 options (descriptions of about 40 characters) with each
readout, then the same 255 options with numbered names (digits cost a token each), and
the largest body the contract allows (400 questions x 255 options), to the gateway and
to the scorer alone. For each: status, seconds, what debiasing the budget left, tokens
evaluated. Every request must end in a 200 or a 413 (never a 5xx or API Gateway's 504),
and the over-budget refusals must be immediate. Writes reports/bench_options.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"


def main() -> int:
    import httpx

    sys.path.insert(0, str(ROOT))
    from bench.workloads import many_options
    from gateway.auth.authenticate import Authenticator
    from gateway.auth.tenants import create_tenant, issue_api_key
    from gateway.authorizer import Authorizer
    from gateway.local import LocalApiGateway, ProcessFunctions, make_server
    from gateway.observability import configure_logging
    from gateway.stores.sqlite import SQLiteStore
    from tests.conftest import GEMMA_DIR, ScorerProcess
    from tests.gateway_helpers import settings_for

    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      POWERTOOLS_LOG_LEVEL="ERROR", POWERTOOLS_METRICS_DISABLED="true")
    configure_logging()
    tmp = Path(tempfile.mkdtemp(prefix="bench-options-"))
    store = SQLiteStore(tmp / "gateway.db")
    create_tenant(store, "bench")
    key = issue_api_key(store, "bench", ["decide"]).secret
    authorize = Authorizer(Authenticator(store))
    rows = []
    with ScorerProcess({"SM_LLAMA_CPP_MODEL_DIR": str(GEMMA_DIR), "SM_LLAMA_CPP_THREADS": "2"}) as scorer:
        scorer.wait("ready")
        ping = httpx.get(f"{scorer.url}/ping").json()
        print(f"scorer: {ping['model']}, budget {ping['max_request_tokens']} tokens"
              f" ({ping['tokens_per_s']:.0f} tokens/s measured)", flush=True)
        settings = settings_for(scorer.url)
        functions = ProcessFunctions(max_instances=2, env={"GATEWAY_MODELS": settings.model_dump_json()})
        server = make_server("127.0.0.1", 0, LocalApiGateway(functions, authorizer=authorize))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        gateway = f"http://127.0.0.1:{server.server_address[1]}"
        functions.prewarm(1)
        numbered = many_options(255)
        numbered["questions"]["queue"]["criteria"] = {
            f"queue {k:03d}": f"requests about product line {k:03d} support" for k in range(255)}
        largest = {"model": "jev-latest", "state": "A ticket.", "questions": {
            f"q{i}": numbered["questions"]["queue"] for i in range(400)}}
        cases = [(f"{n} options", readout, f"{gateway}/v1/systemone", many_options(n, x_readout=readout))
                 for readout in ("letters", "likelihood") for n in (4, 64, 128, 255)]
        cases += [("255 numbered options", readout, f"{gateway}/v1/systemone", {**numbered, "x_readout": readout})
                  for readout in ("letters", "likelihood")]
        cases += [("400 x 255 options", "default", f"{gateway}/v1/systemone", largest),
                  ("400 x 255 options, scorer alone", "default", f"{scorer.url}/v1/systemone", largest)]
        try:
            for name, readout, url, body in cases:
                started = time.perf_counter()
                reply = httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
                seconds = time.perf_counter() - started
                answer = reply.json()
                row = {"case": name, "readout": readout, "status": reply.status_code, "seconds": round(seconds, 2),
                       "debias": answer.get("x_debias"), "tokens": (answer.get("usage") or {}).get("input_tokens"),
                       "message": (answer.get("detail") or {}).get("message") if reply.status_code != 200 else None}
                rows.append(row)
                debias = row["debias"] or {}
                applied = "+".join(k for k in ("order_average", "prior") if debias.get(k)) or "none"
                print(f"{name:<34} {readout:<10} {reply.status_code} {seconds:6.2f} s  tokens {row['tokens'] or '-':>5}"
                      f"  debias {applied}{' (reduced for the budget)' if debias.get('reduced_for_budget') else ''}"
                      f"{'  ' + row['message'][:90] if row['message'] else ''}", flush=True)
        finally:
            server.shutdown()
            server.server_close()
            functions.close()
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "bench_options.json").write_text(json.dumps({"scorer": ping, "rows": rows}, indent=2) + "\n")
    bad = [r for r in rows if r["status"] not in (200, 413)]
    print(f"\n{len(bad)} requests ended in something else than 200 or 413; wrote {REPORTS / 'bench_options.json'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
