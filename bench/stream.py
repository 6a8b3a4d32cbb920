"""`make bench-stream`: a streamed chat of 200 tokens through the gateway, as `make up` serves it.

One scorer with `make up`'s default model behind the gateway's local runner (function
instances in processes of their own, as Lambda runs them), and the official OpenAI SDK
with `stream=True`. For each of `--runs` completions of exactly 200 tokens: when the first
non-empty content chunk arrived, when the stream ended, and the longest gap between two
content chunks, as fractions of the whole stream; usage is asked for and must arrive.
Beside them, the same completion unstreamed: before the streaming routes, a stream reached
the caller all at once at that time. Writes reports/bench_stream.json and its plot.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
TOKENS = 200


def one_stream(client: Any) -> dict[str, Any]:
    started = time.perf_counter()
    arrivals: list[float] = []
    usage = None
    for chunk in client.chat.completions.create(model="chat-default", messages=PROMPT, max_tokens=TOKENS, temperature=0,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter() - started)
        usage = chunk.usage or usage
    total = time.perf_counter() - started
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    return {"first_s": arrivals[0], "total_s": total, "max_gap_s": max(gaps, default=0.0), "chunks": len(arrivals),
            "completion_tokens": usage.completion_tokens if usage else None, "arrivals": arrivals}


def one_whole(client: Any) -> float:
    started = time.perf_counter()
    client.chat.completions.create(model="chat-default", messages=PROMPT, max_tokens=TOKENS, temperature=0)
    return time.perf_counter() - started


def measure(url: str, key: str, runs: int) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    one_whole(client)  # warm: the function instance and the scorer's caches
    streams, wholes = [], []
    for i in range(runs):
        print(f"  run {i + 1}/{runs}", flush=True)
        streams.append(one_stream(client))
        wholes.append(one_whole(client))
    first = [s["first_s"] / s["total_s"] for s in streams]
    gap = [s["max_gap_s"] / s["total_s"] for s in streams]
    return {"runs": runs, "tokens": TOKENS, "streams": streams, "whole_s": wholes,
            "first_fraction_median": statistics.median(first), "first_fraction_max": max(first),
            "gap_fraction_max": max(gap), "usage_every_time": all(s["completion_tokens"] == TOKENS for s in streams),
            "first_s_median": statistics.median(s["first_s"] for s in streams),
            "total_s_median": statistics.median(s["total_s"] for s in streams),
            "whole_s_median": statistics.median(wholes)}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    run = report["streams"][len(report["streams"]) // 2]
    ax.step(run["arrivals"], range(1, len(run["arrivals"]) + 1), where="post", color="#4c72b0",
            label="streamed: content chunks received")
    whole = report["whole_s_median"]
    ax.step([0, whole, whole * 1.02], [0, 0, len(run["arrivals"])], where="post", color="#dd8452",
            label="buffered, as before: everything at the end")
    ax.set_xlabel("seconds since the request")
    ax.set_ylabel("content chunks received")
    ax.set_title(f"A {report['tokens']}-token chat through the gateway ({report['model']})")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    import argparse

    sys.path.insert(0, str(ROOT))
    from bench.stack import local_stack
    from devkit.models import GEMMA_DIR

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=GEMMA_DIR, help="the model folder (default: make up's)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"bench-stream: {args.model.name}, {args.runs} streams of {TOKENS} tokens", flush=True)
    with local_stack(args.model) as stack:
        report = {"model": args.model.name, **measure(stack.gateway, stack.keys["bench"], args.runs)}
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "bench_stream.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, REPORTS / "bench_stream.png")
    print(f"first content chunk at {report['first_s_median']:.2f} s of {report['total_s_median']:.2f} s"
          f" ({report['first_fraction_median']:.1%} of the stream, at most {report['first_fraction_max']:.1%});"
          f" longest gap {report['gap_fraction_max']:.1%} of a stream; unstreamed: {report['whole_s_median']:.2f} s;"
          f" usage every time: {report['usage_every_time']}", flush=True)
    ok = report["first_fraction_max"] < 0.25 and report["gap_fraction_max"] < 0.25 and report["usage_every_time"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
