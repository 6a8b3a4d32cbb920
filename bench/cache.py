"""`make bench-cache`: a state read once serves the next question about it (scorer_container/state_cache.py).

Five parts, each printing its figures as it goes (`--parts` picks some):

    stack    through `make up FAST=1`'s stack (the fast model, the SQLite store, tenant tags), after a
             warm-up: questions about a ~1,500-token transcript asked again, against the same
             questions with `x_cache: false` (another tenant, so its purge leaves the first alone);
             the transcript one step longer; another tenant's identical state; and the tenants'
             usage (`GET /v1/usage`: cached tokens on the reused requests, 0 on the fresh ones).
    agent    the decision engine on MODEL (the quality model by default): an agent run of 20 steps,
             each adding one tool call and asking three questions, with and without reuse: the
             scorer's seconds per step (what the endpoint is busy, and billed), tokens evaluated,
             the first and the 20th step, RSS; the top answers against the fresh ones.
    agent_fast  the same agent run on the fast model.
    churn    500 distinct states from 5 tenants on the fast model, the cache bounded at 32 MiB:
             evictions counted, the bytes held never past the bound, RSS flat once it is full.
    saving   what keeping a state costs on each model: bytes a token, a save, a restore, against
             reading it afresh (why saved cells, and not sequences kept in the context).

Writes reports/bench_cache.json and reports/bench_cache.png.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
FAST = ROOT / "models" / "gemma-3-270m-q4_k_m"
QUALITY = ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m"
TOOLS = ("search_orders", "read_ticket", "refund_payment", "send_email", "lookup_customer", "update_address", "close_ticket")
QUESTIONS = {
    "done": {"type": "noul", "instructions": "Has the agent finished the customer's request?"},
    "next": {"type": "choice", "instructions": "What should the supervisor do now?",
             "criteria": {"continue": "the agent is on track", "stop": "the agent is doing harm or looping",
                          "escalate": "a person must decide"}},
    "risk": {"type": "score", "instructions": "How risky was the agent's last action?",
             "criteria": ["harmless", "needs a look", "dangerous"]},
}
CHURN_MIB = 32


def progress(text: str) -> None:
    print(text, flush=True)


def tool_call(i: int) -> str:
    """One step of an agent's transcript: a tool call and its result (about 70 tokens)."""
    tool = TOOLS[i % len(TOOLS)]
    return (f"\n[step {i}] assistant -> {tool}(order_id={4400 + i * 7 % 97}, customer=\"c-{i * 31 % 1000:04d}\")\n"
            f"[step {i}] {tool} -> ok: {i * 13 % 5 + 1} record(s); status={('open', 'pending', 'paid')[i % 3]};"
            f" amount={i * 17 % 300 + 20}.{i % 100:02d} EUR; note=\"customer asked for an update on day {i % 28 + 1}\"\n")


def transcript(steps: int) -> str:
    return ("A support agent works on ticket 4411 (a customer charged twice). Its transcript so far:\n"
            + "".join(tool_call(i) for i in range(steps)))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the stack: make up FAST=1 ------------------------------------------------------------

def stack_part(model: Path, steps: int, repeats: int) -> dict[str, Any]:
    import httpx

    from bench.tenants import Stack

    def decide(key: str, state: str, **extra: Any) -> tuple[float, dict[str, Any]]:
        started = time.perf_counter()
        reply = httpx.post(f"{stack.gateway}/v1/systemone", timeout=120, headers={"Authorization": f"Bearer {key}"},
                           json={"model": "jev-latest", "state": state, "questions": QUESTIONS, **extra})
        if reply.status_code != 200:
            raise RuntimeError(f"a decision was answered {reply.status_code}: {reply.text[:300]}")
        return time.perf_counter() - started, reply.json()["usage"]

    with Stack(model) as stack:
        others = [f"other-{i}" for i in range(repeats)]
        keys = {name: stack.tenant(name, ("decide", "catalogs:read")) for name in ("agent", "fresh", *others)}
        base, longer = transcript(steps), transcript(steps + 1)
        decide(keys["fresh"], "warm-up: " + transcript(2), x_cache=False)  # priors computed, code paths warm
        fresh, repeat, extended, extended_fresh, other = [], [], [], [], []
        first = decide(keys["agent"], base)
        for name in others:  # interleaved, so that a drift of the machine's speed favours neither
            fresh.append(decide(keys["fresh"], base, x_cache=False))
            repeat.append(decide(keys["agent"], base))
            other.append(decide(keys[name], base))  # the same state, from a tenant that never asked it
        for i in range(repeats):  # each round: the longer transcript fresh, then from the base's saved state
            extended_fresh.append(decide(keys["fresh"], longer, x_cache=False))
            if i:  # the longer one kept last round replaced the base: forget it, and read the base again
                decide(keys["agent"], base, x_cache=False)
                decide(keys["agent"], base)
            extended.append(decide(keys["agent"], longer))
        usage = {name: httpx.get(f"{stack.gateway}/v1/usage", headers={"Authorization": f"Bearer {keys[name]}"},
                                 timeout=30).json()["total"] for name in ("agent", "fresh", others[0])}
        scorer = httpx.get(f"{stack.scorer}/stats", timeout=10).json()["state_cache"]

    def median(pairs: list[tuple[float, dict[str, Any]]]) -> float:
        return statistics.median(seconds for seconds, _ in pairs)

    figures = {"model": model.name, "repeats": repeats,
               # The state's part of the prompt (what a repeat restores); the request reads its questions too.
               "state_tokens": repeat[0][1]["x_cached_tokens"], "input_tokens": first[1]["input_tokens"],
               "fresh_s": median(fresh), "first_s": first[0], "repeat_s": median(repeat),
               "extended_fresh_s": median(extended_fresh), "extended_s": median(extended), "other_tenant_s": median(other),
               "cached_tokens": {"fresh": [u["x_cached_tokens"] for _, u in fresh],
                                 "first": first[1]["x_cached_tokens"],
                                 "repeat": [u["x_cached_tokens"] for _, u in repeat],
                                 "extended": [u["x_cached_tokens"] for _, u in extended],
                                 "other_tenant": [u["x_cached_tokens"] for _, u in other]},
               "usage": {"agent": usage["agent"], "fresh": usage["fresh"], "other": usage[others[0]]},
               "scorer_cache": scorer}
    figures["repeat_vs_fresh"] = figures["repeat_s"] / figures["fresh_s"]
    figures["extended_vs_fresh"] = figures["extended_s"] / figures["extended_fresh_s"]
    figures["other_vs_fresh"] = figures["other_tenant_s"] / figures["fresh_s"]
    progress(f"  stack: a {figures['state_tokens']}-token transcript: fresh {figures['fresh_s']:.2f} s, repeated"
             f" {figures['repeat_s']:.2f} s ({figures['repeat_vs_fresh']:.2f}x); one step longer"
             f" {figures['extended_s']:.2f} s against {figures['extended_fresh_s']:.2f} s fresh"
             f" ({figures['extended_vs_fresh']:.2f}x); another tenant {figures['other_tenant_s']:.2f} s"
             f" ({figures['other_vs_fresh']:.2f}x, {max(figures['cached_tokens']['other_tenant'])} cached)")
    return figures


# -- the agent run: the engine, in this process ----------------------------------------------

def engine_for(model: Path, cache_mib: int):
    from scorer_container.engine import DecisionEngine
    from scorer_container.llama import LlamaModel, LlamaSettings
    from scorer_container.model_files import locate_model, verify_model
    from scorer_container.prompts import PromptFormat
    from scorer_container.state_cache import StateCache

    path = locate_model(None, str(model))  # a model's folder: its .gguf and manifest
    manifest = verify_model(path, None, None)
    llama = LlamaModel(path, LlamaSettings(n_ctx=4096, n_threads=2))
    return DecisionEngine.for_manifest(llama, PromptFormat.for_model(llama), manifest, model_name=manifest.name,
                                       states=StateCache(cache_mib * 2**20), model_id=manifest.sha256)


def decide(engine, tenant: str, state: str, questions: dict[str, Any] = QUESTIONS, **extra: Any) -> dict[str, Any]:
    from scorer_container.schema import DecisionRequest, parse

    request = parse(DecisionRequest, {"model": "m", "state": state, "questions": questions, **extra})
    started = time.perf_counter()
    answer = engine.decide(engine.fit(request, math.inf, tenant=tenant))
    usage = answer["usage"]
    return {"seconds": time.perf_counter() - started, "input_tokens": usage["input_tokens"],
            "cached_tokens": usage["x_cached_tokens"], "evaluated_tokens": usage["input_tokens"] - usage["x_cached_tokens"],
            "answers": answer["answers"]}


def top(answer: dict[str, Any]) -> Any:
    """An answer's top option: a choice, a yes/no, the most likely level."""
    if "noul" in answer:
        return answer["noul"] > 0.5
    return answer.get("choice") or max(answer["probabilities"], key=answer["probabilities"].get)


def margin(answer: dict[str, Any]) -> float:
    """How far an answer's top option is from the next: what a difference must exceed to change it."""
    if "noul" in answer:
        return abs(2 * answer["noul"] - 1)
    first, second = sorted(answer["probabilities"].values(), reverse=True)[:2]
    return first - second


def largest_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    if "noul" in a:
        return abs(a["noul"] - b["noul"])
    return max(abs(p - b["probabilities"][key]) for key, p in a["probabilities"].items())


def agent_part(model: Path, first_steps: int, steps: int) -> dict[str, Any]:
    engine = engine_for(model, 1024)
    decide(engine, "warm", "warm-up: " + transcript(2), x_cache=False)  # the priors, computed once
    runs: dict[str, list[dict[str, Any]]] = {"fresh": [], "reuse": []}
    for step in range(steps):
        state = transcript(first_steps + step)
        for name, extra in (("fresh", {"x_cache": False}), ("reuse", {})):
            runs[name].append(decide(engine, name, state, **extra))
        fresh, reuse = runs["fresh"][-1], runs["reuse"][-1]
        reuse["flips"] = [{"step": step + 1, "question": q, "fresh_margin": round(margin(fresh["answers"][q]), 4)}
                          for q in QUESTIONS if top(fresh["answers"][q]) != top(reuse["answers"][q])]
        reuse["largest_difference"] = max(largest_difference(fresh["answers"][q], reuse["answers"][q]) for q in QUESTIONS)
        progress(f"  agent step {step + 1:2d}/{steps}: {fresh['input_tokens']} tokens; fresh {fresh['seconds']:.2f} s,"
                 f" reuse {reuse['seconds']:.2f} s ({reuse['cached_tokens']} restored; probabilities within"
                 f" {reuse['largest_difference']:.4f} of fresh); RSS {rss_mb():.0f} MB")
    total = {name: sum(r["seconds"] for r in run) for name, run in runs.items()}
    figures = {"model": model.name, "steps": steps, "first_state_tokens": runs["fresh"][0]["input_tokens"],
               "seconds": {name: [round(r["seconds"], 3) for r in run] for name, run in runs.items()},
               "evaluated_tokens": {name: sum(r["evaluated_tokens"] for r in run) for name, run in runs.items()},
               "total_s": total, "reuse_vs_fresh": total["reuse"] / total["fresh"],
               "first_step_s": {name: run[0]["seconds"] for name, run in runs.items()},
               "last_step_s": {name: run[-1]["seconds"] for name, run in runs.items()},
               "cache": engine.states.figures(), "rss_mb": rss_mb(),
               "flips": [flip for r in runs["reuse"] for flip in r["flips"]],
               "largest_difference": max(r["largest_difference"] for r in runs["reuse"])}
    progress(f"  agent: {steps} steps took {total['fresh']:.1f} s fresh, {total['reuse']:.1f} s with reuse"
             f" ({figures['reuse_vs_fresh']:.2f}x); tokens evaluated {figures['evaluated_tokens']['fresh']} against"
             f" {figures['evaluated_tokens']['reuse']}")
    engine.llama.close()
    return figures


# -- churn: many distinct states from several tenants ----------------------------------------

def saving_part(models: list[Path], steps: int, repeat: int = 5) -> dict[str, Any]:
    """What keeping a state costs on each model: its prefill, the saved bytes a token, a save and
    a restore (medians of `repeat`), on a first-step transcript."""
    from scorer_container.llama import Batch

    figures = {}
    for model in models:
        engine = engine_for(model, 0)
        llama = engine.llama
        tokens = llama.tokenize(transcript(steps), add_bos=llama.adds_bos)
        with llama.lock:
            llama.clear()
            started = time.perf_counter()
            for i in range(0, len(tokens), llama.n_batch):
                batch = Batch.empty()
                for j, token in enumerate(tokens[i:i + llama.n_batch]):
                    batch.add(token, i + j, 0, False)
                llama.decode(batch)
            prefill_s = time.perf_counter() - started
            saves, restores = [], []
            for _ in range(repeat):
                started = time.perf_counter()
                data = llama.save_sequence(0)
                saves.append(time.perf_counter() - started)
                started = time.perf_counter()
                llama.restore_sequence(data, 1)
                restores.append(time.perf_counter() - started)
                llama.drop_sequence(1)
            llama.clear()
        figures[model.name] = {"tokens": len(tokens), "prefill_s": round(prefill_s, 3),
                               "kib_per_token": round(len(data) / len(tokens) / 1024, 1),
                               "save_ms": round(1000 * statistics.median(saves), 1),
                               "restore_ms": round(1000 * statistics.median(restores), 1)}
        progress(f"  saving on {model.name}: {len(tokens)} tokens read in {prefill_s:.2f} s; saved"
                 f" {figures[model.name]['kib_per_token']} KiB a token, in {figures[model.name]['save_ms']} ms,"
                 f" restored in {figures[model.name]['restore_ms']} ms")
        llama.close()
    return figures


def churn_part(model: Path, states: int, tenants: int) -> dict[str, Any]:
    engine = engine_for(model, CHURN_MIB)
    question = {"done": QUESTIONS["done"]}
    samples = []
    held_max = 0
    for i in range(states):
        tenant = f"tenant-{i % tenants}"
        state = f"Ticket {i} of {tenant}.\n" + "".join(tool_call(i * 5 + j) for j in range(2))
        decide(engine, tenant, state, question, x_prior=False, x_order_average=False)
        held_max = max(held_max, engine.states.held_bytes)
        if (i + 1) % 25 == 0:
            figures = engine.states.figures()
            samples.append({"states": i + 1, "rss_mb": round(rss_mb(), 1), "held_mb": round(figures["held_bytes"] / 2**20, 2),
                            "evictions": figures["evictions"]})
            progress(f"  churn: {i + 1}/{states} states, {samples[-1]['held_mb']} MiB held of {CHURN_MIB},"
                     f" {figures['evictions']} evictions, RSS {samples[-1]['rss_mb']} MB")
    full = [s["rss_mb"] for s in samples if s["evictions"] > 0]
    figures = {"model": model.name, "states": states, "tenants": tenants, "bound_mib": CHURN_MIB, "samples": samples,
               "held_max_mib": held_max / 2**20, "evictions": engine.states.evictions,
               "rss_growth_once_full_mb": (max(full) - min(full)) if full else None}
    engine.llama.close()
    return figures


# -- the plot and the checks ------------------------------------------------------------------------

def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    agent = report["agent"]
    for name, style in (("fresh", "o-"), ("reuse", "s-")):
        seconds = agent["seconds"][name]
        left.plot(range(1, len(seconds) + 1), seconds, style, label=f"{name}: {sum(seconds):.0f} s in all")
    left.set(title=f"{agent['model']}: the scorer's seconds a step", xlabel="step (one more tool call)",
             ylabel="seconds")
    left.legend()
    churn = report["churn"]
    xs = [s["states"] for s in churn["samples"]]
    right.plot(xs, [s["rss_mb"] for s in churn["samples"]], "o-", label="RSS (MB)")
    right.plot(xs, [s["held_mb"] for s in churn["samples"]], "s-", label=f"cache held (MiB, bound {churn['bound_mib']})")
    right.set(title=f"{churn['states']} distinct states, {churn['tenants']} tenants ({churn['evictions']} evictions)",
              xlabel="states asked about", ylabel="MB")
    right.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def checks(report: dict[str, Any]) -> dict[str, bool]:
    stack, agent, churn = report["stack"], report["agent"], report["churn"]
    cached = stack["cached_tokens"]
    return {
        "a repeated transcript takes at most 0.25x its x_cache false time": stack["repeat_vs_fresh"] <= 0.25,
        "a transcript one step longer takes at most 0.35x its fresh time": stack["extended_vs_fresh"] <= 0.35,
        "cached tokens on every reused request, 0 on every fresh one": (
            min(cached["repeat"] + cached["extended"]) > 0 and max(cached["fresh"]) == 0),
        "another tenant's identical state is read fresh": max(cached["other_tenant"]) == 0,
        "the tenants' usage: cached tokens for the reusing tenant, 0 for the fresh one": (
            stack["usage"]["agent"]["cached_tokens"] > 0 and stack["usage"]["fresh"]["cached_tokens"] == 0),
        "the agent run takes at most a fifth of the scorer's time without reuse": agent["reuse_vs_fresh"] <= 0.2,
        # A top answer may change only where the fresh one was a near tie: within twice the
        # largest difference reuse made to any probability.
        "reused answers keep every top answer but near ties": all(
            flip["fresh_margin"] <= 2 * agent["largest_difference"] for flip in agent["flips"]),
        "evictions are counted and the cache never holds more than its bound": (
            churn["evictions"] > 0 and churn["held_max_mib"] <= churn["bound_mib"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=QUALITY, help="the agent run's model (default: the quality model)")
    parser.add_argument("--fast-model", type=Path, default=FAST, help="the stack's and the churn's model")
    parser.add_argument("--first-steps", type=int, default=20, help="tool calls in the first step's transcript")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--states", type=int, default=500)
    parser.add_argument("--parts", default="stack,agent,agent_fast,churn,saving",
                        help="which parts to run (comma-separated)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    REPORTS.mkdir(exist_ok=True)
    out = REPORTS / "bench_cache.json"
    parts = args.parts.split(",")
    runs = {"stack": (f"the stack on {args.fast_model.name} (make up FAST=1)",
                      lambda: stack_part(args.fast_model, args.first_steps, args.repeats)),
            "agent": (f"an agent run of {args.steps} steps on {args.model.name}, with and without reuse",
                      lambda: agent_part(args.model, args.first_steps, args.steps)),
            "agent_fast": (f"the same agent run on {args.fast_model.name}",
                           lambda: agent_part(args.fast_model, args.first_steps, args.steps)),
            "churn": (f"{args.states} distinct states from 5 tenants on {args.fast_model.name}",
                      lambda: churn_part(args.fast_model, args.states, 5)),
            "saving": ("what saving and restoring a state costs on each model",
                       lambda: saving_part([args.fast_model, args.model], args.first_steps))}
    # A run of some parts keeps the others' last figures (they are the same run's only when all run).
    report: dict[str, Any] = json.loads(out.read_text()) if out.exists() and len(parts) < len(runs) else {}
    report.pop("checks", None)
    for name, (what, run) in runs.items():
        if name in parts:
            progress(f"bench-cache: {what}")
            report[name] = run()
            out.write_text(json.dumps(report, indent=2) + "\n")  # a later part's failure keeps this one's figures
    if all(part in report for part in ("stack", "agent", "churn")):
        report["checks"] = checks(report)
        plot(report, REPORTS / "bench_cache.png")
        for check, ok in report["checks"].items():
            progress(f"  {'met' if ok else 'NOT MET'}: {check}")
    out.write_text(json.dumps(report, indent=2) + "\n")
    progress(f"bench-cache: wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
