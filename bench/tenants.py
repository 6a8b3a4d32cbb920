"""`make bench-tenants`: two tenants share one scorer through `make up FAST=1`'s stack, at default limits.

`scripts/up.py` starts the stack as `make up FAST=1` does (the fast model, the SQLite store,
the record keys the gateway derives tenant tags from); two tenants are created with default
limits: `steady` decides at a steady pace (README's three-question decision), `heavy` works.

    alone        steady alone, one decision every 3 s: its latency alone
    long chats   heavy loops streamed chats of 1,024 tokens with `Prefer: wait=58` (long work)
                 back to back, while steady decides every 3 s
    flood        heavy holds its in-flight cap of ordinary chats (more clients than the cap:
                 the rest get 429), while steady decides every 3 s
    half load    heavy loops long chats, while steady sends decisions at about half of what the
                 scorer can answer (twice its time alone between sends, open loop)
    heavy alone  heavy loops long chats alone: its share of the scorer's time (work-conserving),
                 and whether a lone tenant still gets its 58 s, 1,024-token chat

For each: steady's share of 200s and its median latency against alone, heavy's requests by
status, and the scorer's busy seconds per tenant in the phase (its `/stats`, keyed by the
tenant tags: the one seen alone is steady's). Writes reports/bench_tenants.json and
reports/bench_tenants.png.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
DECISION = {
    "model": "jev-latest",
    "state": "Customer wrote: I was charged twice for order 4411, refund one please.",
    "questions": {
        "is_refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"},
        "queue": {"type": "choice", "instructions": "Which queue?",
                  "criteria": {"billing": "payments, refunds", "delivery": "shipping", "account": None}},
        "anger": {"type": "score", "instructions": "How frustrated?", "criteria": ["calm", "annoyed", "angry"]}}}
STORY = [{"role": "user", "content": "Write a long, detailed story about a lighthouse keeper and a storm."}]


def progress(text: str) -> None:
    print(text, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Stack:
    """`scripts/up.py` in a process of its own, on free ports and a fresh state folder."""

    def __init__(self, model: Path) -> None:
        self.state = Path(tempfile.mkdtemp(prefix="bench-tenants-"))
        self.scorer_port, self.gateway_port = free_port(), free_port()
        self.gateway = f"http://127.0.0.1:{self.gateway_port}"
        self.scorer = f"http://127.0.0.1:{self.scorer_port}"
        env = {k: v for k, v in os.environ.items() if k != "GATEWAY_DEV_API_KEY"}
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "up.py"), "--model", str(model), "--state-dir", str(self.state),
             "--scorer-port", str(self.scorer_port), "--gateway-port", str(self.gateway_port)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> Stack:
        import httpx

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the stack exited with status {self.process.returncode}")
            try:
                if httpx.get(f"{self.gateway}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError("the stack did not start within 300 s")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def tenant(self, name: str, scopes: tuple[str, ...] = ("decide", "chat")) -> str:
        """A tenant with default limits, and an API key of its (decide and chat, unless told)."""
        from gateway.auth.tenants import create_tenant, issue_api_key
        from gateway.stores.sqlite import open_sqlite

        store = open_sqlite(self.state / "gateway.db").tenants
        create_tenant(store, name)
        return issue_api_key(store, name, list(scopes)).secret

    def busy(self) -> dict[str, float]:
        import httpx

        return httpx.get(f"{self.scorer}/stats", timeout=10).json()["busy_s_by_tenant"]


def decide(stack: Stack, key: str) -> tuple[int | str, float]:
    import httpx

    started = time.perf_counter()
    try:
        status: int | str = httpx.post(f"{stack.gateway}/v1/systemone", json=DECISION, timeout=60,
                                       headers={"Authorization": f"Bearer {key}"}).status_code
    except httpx.HTTPError as exc:
        status = f"transport:{type(exc).__name__}"
    return status, time.perf_counter() - started


def chat(stack: Stack, key: str, *, long: bool, max_tokens: int) -> dict[str, Any]:
    """One chat: streamed with `Prefer: wait=58` (long work), or buffered with the ordinary deadline."""
    import httpx

    headers = {"Authorization": f"Bearer {key}", **({"Prefer": "wait=58"} if long else {})}
    body = {"model": "chat-default", "messages": STORY, "max_tokens": max_tokens, "temperature": 0.8, "stream": long}
    started = time.perf_counter()
    try:
        if not long:
            reply = httpx.post(f"{stack.gateway}/v1/chat/completions", json=body, headers=headers, timeout=60)
            tokens = reply.json().get("usage", {}).get("completion_tokens", 0) if reply.status_code == 200 else 0
            return {"status": reply.status_code, "seconds": time.perf_counter() - started, "tokens": tokens}
        body["stream_options"] = {"include_usage": True}
        tokens = 0
        with httpx.stream("POST", f"{stack.gateway}/v1/chat/completions", json=body, headers=headers,
                          timeout=90) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    usage = json.loads(line[6:]).get("usage") or {}
                    tokens = usage.get("completion_tokens", tokens)
            return {"status": reply.status_code, "seconds": time.perf_counter() - started, "tokens": tokens}
    except httpx.HTTPError as exc:
        return {"status": f"transport:{type(exc).__name__}", "seconds": time.perf_counter() - started, "tokens": 0}


class Heavy:
    """`clients` threads sending chats back to back until stopped; a 429 waits its Retry-After (1 s)."""

    def __init__(self, stack: Stack, key: str, *, long: bool, clients: int, max_tokens: int) -> None:
        self.results: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(stack, key, long, max_tokens)) for _ in range(clients)]

    def _loop(self, stack: Stack, key: str, long: bool, max_tokens: int) -> None:
        while not self._stop.is_set():
            result = chat(stack, key, long=long, max_tokens=max_tokens)
            self.results.append(result)
            if result["status"] != 200:
                self._stop.wait(1.0)

    def __enter__(self) -> Heavy:
        for thread in self._threads:
            thread.start()
        time.sleep(2.0)  # its work is running before the other tenant's first request
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)


def steady(stack: Stack, key: str, interval_s: float, duration_s: float) -> list[tuple[int | str, float]]:
    """Decisions sent every `interval_s` for `duration_s`, open loop (each in its own thread)."""
    return open_loop(lambda n: decide(stack, key), interval_s, lambda n: n * interval_s < duration_s)


def open_loop(send: Callable[[int], Any], interval_s: float, go_on: Callable[[int], bool]) -> list[Any]:
    """`send(n)` every `interval_s` while `go_on(n)`, each in its own thread (open loop: a slow
    answer does not delay the next send); what they returned, once all have."""
    results: list[Any] = []
    threads = []
    start = time.monotonic()
    n = 0
    while go_on(n):
        time.sleep(max(0.0, start + n * interval_s - time.monotonic()))
        thread = threading.Thread(target=lambda m=n: results.append(send(m)))
        thread.start()
        threads.append(thread)
        n += 1
    for thread in threads:
        thread.join(120)
    return results


def summary(results: list[tuple[int | str, float]], alone_s: float | None) -> dict[str, Any]:
    ok = [seconds for status, seconds in results if status == 200]
    median = statistics.median(ok) if ok else None
    return {"sent": len(results), "ok_share": len(ok) / len(results) if results else 0.0,
            "statuses": dict(Counter(str(status) for status, _ in results)), "median_s": median,
            "p90_s": sorted(ok)[int(0.9 * (len(ok) - 1))] if ok else None,
            "vs_alone": median / alone_s if median and alone_s else None}


def phase(stack: Stack, name: str, run) -> dict[str, Any]:
    progress(f"  {name}...")
    time.sleep(3.0)  # the last phase's work has ended
    started = time.monotonic()
    report = run()
    report["seconds"] = round(time.monotonic() - started, 1)
    report["busy_s"] = stack.busy()  # the last minute: this phase (each lasts about a minute)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "gemma-3-270m-q4_k_m")
    parser.add_argument("--duration-s", type=float, default=55.0, help="each shared phase (the scorer's /stats shows 60 s)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    progress(f"bench-tenants: {args.model.name}, two tenants at default limits through make up's stack")
    with Stack(args.model) as stack:
        keys = {name: stack.tenant(name) for name in ("steady", "heavy")}
        report: dict[str, Any] = {"model": args.model.name, "phases": {}}
        phases = report["phases"]
        decide(stack, keys["steady"])  # warm: the content-free priors are computed once

        def alone() -> dict[str, Any]:
            return summary(steady(stack, keys["steady"], 3.0, 30.0), None)

        phases["alone"] = phase(stack, "steady alone", alone)
        alone_s = phases["alone"]["median_s"]
        steady_tag = max(phases["alone"]["busy_s"], key=phases["alone"]["busy_s"].get)
        cap = 4  # heavy's in-flight cap at default limits: half the scorer's line of 8, one instance

        def shared(long: bool, clients: int, max_tokens: int, interval_s: float):
            def run() -> dict[str, Any]:
                with Heavy(stack, keys["heavy"], long=long, clients=clients, max_tokens=max_tokens) as heavy:
                    decided = steady(stack, keys["steady"], interval_s, args.duration_s)
                return {"steady": summary(decided, alone_s),
                        "heavy": {"statuses": dict(Counter(str(r["status"]) for r in heavy.results)),
                                  "tokens": sum(r["tokens"] for r in heavy.results)}}
            return run

        phases["long chats"] = phase(stack, "heavy loops long chats", shared(True, 1, 1024, 3.0))
        phases["flood"] = phase(stack, "heavy floods ordinary chats", shared(False, cap + 2, 256, 3.0))
        phases["half load"] = phase(stack, "steady at half capacity beside long chats",
                                    shared(True, 1, 1024, max(0.5, 2 * alone_s)))

        def heavy_alone() -> dict[str, Any]:
            started = time.monotonic()
            with Heavy(stack, keys["heavy"], long=True, clients=1, max_tokens=1024) as heavy:
                time.sleep(max(0.0, args.duration_s - 2.0))
            elapsed = time.monotonic() - started
            done = [r for r in heavy.results if r["status"] == 200]
            return {"heavy": {"statuses": dict(Counter(str(r["status"]) for r in heavy.results)),
                              "tokens": sum(r["tokens"] for r in heavy.results),
                              "longest_chat_tokens": max((r["tokens"] for r in done), default=0),
                              "longest_chat_s": max((r["seconds"] for r in done), default=0.0)},
                    "elapsed_s": elapsed}

        phases["heavy alone"] = phase(stack, "heavy alone", heavy_alone)
    for figures in phases.values():
        busy = figures["busy_s"]
        total = sum(busy.values()) or 1.0
        figures["busy_share"] = {("steady" if tag == steady_tag else "heavy"): round(s / total, 3)
                                 for tag, s in busy.items()}
        figures["busy_s"] = {("steady" if tag == steady_tag else "heavy"): s for tag, s in busy.items()}
    heavy_alone = phases["heavy alone"]
    heavy_alone["heavy"]["scorer_share"] = round(heavy_alone["busy_s"].get("heavy", 0.0)
                                                 / min(60.0, heavy_alone["elapsed_s"]), 3)
    checks = {
        "long chats: steady >= 90% 200": phases["long chats"]["steady"]["ok_share"] >= 0.9,
        "long chats: steady median <= 2x alone": (phases["long chats"]["steady"]["vs_alone"] or 99) <= 2.0,
        "flood: steady >= 90% 200": phases["flood"]["steady"]["ok_share"] >= 0.9,
        "flood: steady median <= 2x alone": (phases["flood"]["steady"]["vs_alone"] or 99) <= 2.0,
        "heavy alone: >= 80% of the scorer's time": heavy_alone["heavy"]["scorer_share"] >= 0.8,
    }
    report["checks"] = checks
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "bench_tenants.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, REPORTS / "bench_tenants.png")
    print_table(report)
    for check, ok in checks.items():
        progress(f"  {'ok ' if ok else 'NOT'} {check}")
    return 0 if all(checks.values()) else 1


def print_table(report: dict[str, Any]) -> None:
    phases = report["phases"]
    alone = phases["alone"]
    progress(f"  steady alone: {alone['ok_share']:.0%} answered 200, median {alone['median_s']:.2f} s")
    for name in ("long chats", "flood", "half load"):
        s, h = phases[name]["steady"], phases[name]["heavy"]
        median = f"{s['median_s']:.2f} s" if s["median_s"] else "-"
        progress(f"  {name}: steady {s['ok_share']:.0%} 200 of {s['sent']}, median {median}"
                 f" ({(s['vs_alone'] or 0):.2f}x alone); heavy {h['statuses']}; busy share {phases[name]['busy_share']}")
    h = phases["heavy alone"]["heavy"]
    progress(f"  heavy alone: {h['scorer_share']:.0%} of the scorer's time; {h['statuses']}; longest chat"
             f" {h['longest_chat_tokens']} tokens in {h['longest_chat_s']:.1f} s")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = report["phases"]
    shared = ["long chats", "flood", "half load"]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 4))
    left.bar(shared, [phases[n]["steady"]["ok_share"] * 100 for n in shared], color="#4c72b0")
    left.axhline(90, color="grey", linestyle="--", linewidth=1)
    left.set_ylabel("steady's decisions answered 200 (%)")
    left.set_ylim(0, 105)
    middle.bar(shared, [phases[n]["steady"]["vs_alone"] or 0 for n in shared], color="#dd8452")
    middle.axhline(2, color="grey", linestyle="--", linewidth=1)
    middle.set_ylabel("steady's median latency / alone")
    names = [*shared, "heavy alone"]
    steady_share = [phases[n]["busy_share"].get("steady", 0) * 100 for n in names]
    heavy_share = [phases[n]["busy_share"].get("heavy", 0) * 100 for n in names]
    right.bar(names, steady_share, label="steady", color="#4c72b0")
    right.bar(names, heavy_share, bottom=steady_share, label="heavy", color="#c44e52")
    right.set_ylabel("the scorer's busy time (%)")
    right.legend(loc="lower left")
    for axis in (left, middle, right):
        axis.tick_params(axis="x", labelrotation=20)
    fig.suptitle(f"Two tenants on one scorer ({report['model']}, 2 CPU cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
