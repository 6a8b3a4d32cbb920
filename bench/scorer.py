"""`make bench-scorer`: what a decision costs, against naive approaches and the raw-decode floor.

For the same requests (1 and 4 questions over a ~300-token state, 4 and 16 options),
measured in one run on one model:
- engine: the decision engine as served (prefix tree, one state evaluation);
- floor: one raw llama.cpp decode, as a single sequence in n_batch pieces, of exactly
  the tokens the engine evaluates (the state once plus every branch suffix): the
  engine/floor ratio is the engine's own overhead;
- re-evaluate: every branch prompt evaluated from scratch (no shared state);
- generate: chat completion per question (greedy, a few tokens) and parsing the reply;
- debiasing: order averaging + content-free prior on (prior cache cold and warm) vs off.
Each figure is the best of `--repeat` runs (the machine is shared and noisy). Writes
reports/bench_scorer.json and reports/bench_scorer.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from scorer_container.chat import ChatGenerator
from scorer_container.engine import DecisionEngine, prepare_question
from scorer_container.llama_runtime import Batch, Runtime, RuntimeSettings
from scorer_container.prefix_tree import Branch, build_tree, evaluate
from scorer_container.prompts import PromptFormat, render_value
from scorer_container.schema import ChatRequest, DecisionRequest, parse

ROOT = Path(__file__).resolve().parent.parent
STATE = (
    "Ticket 88213 from a business customer. "
    "We were charged twice for the March invoice of our 40-seat plan, and the second charge also used the old price. "
    "Our finance team needs a corrected invoice before the quarter closes on Friday. "
    "Separately, two of our users cannot log in since the password policy changed, and the mobile app shows an "
    "error when they try to reset it. One of them is the account owner. We have been customers for six years "
    "and this is the third time we write about billing this quarter; nobody answered the previous two emails. "
    "If this is not fixed this week we will review our contract. Please call our office manager, who is "
    "available every morning, and confirm in writing what will be refunded and when the login problem will be "
    "solved. We also want to know whether the price change applies to the seats we added in February, and "
    "whether the annual plan would be cheaper for us. Attached are the two invoices and a screenshot of the error."
)


def questions(n_questions: int, n_options: int) -> dict:
    topics = ["Which team should handle this?", "What does the customer want most?",
              "Which product area is affected?", "What is the next best action?"]
    out = {}
    for q in range(n_questions):
        out[f"q{q}"] = {
            "type": "choice",
            "instructions": topics[q % len(topics)],
            "criteria": {f"option {chr(65 + k)}{q}": f"description of option {k} for question {q}" for k in range(n_options)},
        }
    return out


def best_of(repeat: int, func) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def engine_branches(engine: DecisionEngine, request: DecisionRequest, readout: str) -> list[Branch]:
    settings = engine.settings_for(request)
    state = render_value(request.state)
    branches = []
    for qid, question in request.questions.items():
        prepared = prepare_question(qid, question)
        orders = [tuple(range(len(prepared.options)))]
        if settings.order_average:
            orders.append(tuple(reversed(orders[0])))
        for order in orders:
            for probe in engine._plan(prepared, order, readout).groups:
                branches.extend(engine._branches(state, probe))
    return branches


def floor_tokens(branches: list[Branch]) -> list[int]:
    """The tokens a prefix tree evaluates, laid end to end."""
    root = build_tree(branches)
    tokens, stack = [], [root]
    while stack:
        node = stack.pop()
        tokens.extend(node.tokens)
        stack.extend(node.children)
    return tokens


def raw_decode(runtime: Runtime, tokens: list[int]) -> None:
    runtime.clear()
    for start in range(0, len(tokens), runtime.n_batch):
        batch = Batch.empty()
        piece = tokens[start : start + runtime.n_batch]
        for i, token in enumerate(piece):
            batch.add(token, start + i, 0, start + i == len(tokens) - 1)
        runtime.decode(batch)
    runtime.clear()


def reevaluate(runtime: Runtime, branches: list[Branch]) -> None:
    for branch in branches:
        evaluate(runtime, [branch])


def generate_and_parse(chat: ChatGenerator, request: DecisionRequest) -> int:
    parsed = 0
    for question in request.questions.values():
        names = list(question.criteria)
        prompt = (f"Text:\n{render_value(request.state)}\n\nTask: {question.instructions}\nOptions:\n"
                  + "\n".join(names) + "\nReply with one option exactly as written.")
        reply = chat.completion(parse(ChatRequest, {"messages": [{"role": "user", "content": prompt}],
                                                    "max_tokens": 8, "temperature": 0}))
        text = reply["choices"][0]["message"]["content"]
        parsed += any(name in text for name in names)
    return parsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct-q4_1")
    parser.add_argument("--readouts", nargs="*", default=["letters", "likelihood"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = sorted((ROOT / "models" / args.model).glob("*.gguf"))[0]
    runtime = Runtime(path, RuntimeSettings(n_ctx=8192))
    prompts = PromptFormat.for_runtime(runtime)
    chat = ChatGenerator(runtime, prompts, args.model)
    state_tokens = len(runtime.tokenize(STATE))
    print(f"model {args.model}; state {state_tokens} tokens; n_batch {runtime.n_batch}; best of {args.repeat}")
    header = (f"{'readout':<10} {'q':>2} {'opts':>4} {'tokens':>6} {'engine s':>9} {'floor s':>8} {'eng/floor':>9}"
              f" {'re-eval s':>9} {'generate s':>10} {'debias off':>10} {'on, cold':>9} {'on, warm':>9}")
    print(header)
    rows = []
    for readout in args.readouts:
        for n_questions in (1, 4):
            for n_options in (4, 16):
                engine = DecisionEngine(runtime, prompts, model_name=args.model, default_readout=readout)
                body = {"model": "m", "state": STATE, "questions": questions(n_questions, n_options)}
                plain = parse(DecisionRequest, {**body, "x_order_average": False, "x_prior": False})
                debiased = parse(DecisionRequest, body)
                branches = engine_branches(engine, plain, readout)
                tokens = floor_tokens(branches)
                engine_s = best_of(args.repeat, lambda: engine.decide(plain))
                evaluated = engine.decide(plain)["usage"]["input_tokens"]
                assert evaluated == len(tokens), (evaluated, len(tokens))
                floor_s = best_of(args.repeat, lambda: raw_decode(runtime, tokens))
                reeval_s = best_of(1, lambda: reevaluate(runtime, branches))
                generate_s = best_of(1, lambda: generate_and_parse(chat, plain))
                engine.priors = type(engine.priors)(4096)
                cold_s = best_of(1, lambda: engine.decide(debiased))
                warm_s = best_of(args.repeat, lambda: engine.decide(debiased))
                row = {"readout": readout, "questions": n_questions, "options": n_options, "tokens": len(tokens),
                       "engine_s": engine_s, "floor_s": floor_s, "engine_over_floor": engine_s / floor_s,
                       "reevaluate_s": reeval_s, "generate_s": generate_s, "debias_cold_s": cold_s,
                       "debias_warm_s": warm_s}
                rows.append(row)
                print(f"{readout:<10} {n_questions:>2} {n_options:>4} {len(tokens):>6} {engine_s:>9.3f} {floor_s:>8.3f}"
                      f" {engine_s / floor_s:>8.2f}x {reeval_s:>9.3f} {generate_s:>10.3f} {engine_s:>10.3f}"
                      f" {cold_s:>9.3f} {warm_s:>9.3f}", flush=True)
    print("\nratios (same run): engine vs floor, re-evaluate vs engine, generate vs engine, debias warm vs off")
    for r in rows:
        print(f"  {r['readout']:<10} {r['questions']} q x {r['options']:>2} opts: engine/floor {r['engine_over_floor']:.2f}x,"
              f" re-evaluate {r['reevaluate_s'] / r['engine_s']:.1f}x slower, generate {r['generate_s'] / r['engine_s']:.1f}x"
              f" slower, debiasing costs {r['debias_warm_s'] / r['engine_s']:.2f}x warm / {r['debias_cold_s'] / r['engine_s']:.2f}x cold")
    out = ROOT / "reports"
    out.mkdir(exist_ok=True)
    (out / "bench_scorer.json").write_text(json.dumps({"model": args.model, "state_tokens": state_tokens, "rows": rows}, indent=2))
    plot(rows, out / "bench_scorer.png")
    print(f"wrote {out / 'bench_scorer.json'} and {out / 'bench_scorer.png'}")
    runtime.close()
    return 0


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['readout']}\n{r['questions']}q x {r['options']}" for r in rows]
    series = [("floor", "floor_s", "#999999"), ("engine", "engine_s", "#4C72B0"),
              ("engine + debias (warm)", "debias_warm_s", "#8172B2"),
              ("re-evaluate", "reevaluate_s", "#C44E52"), ("generate", "generate_s", "#DD8452")]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.16
    for i, (name, key, color) in enumerate(series):
        ax.bar([x + (i - 2) * width for x in range(len(rows))], [r[key] for r in rows], width, label=name, color=color)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("seconds per request (best of runs)")
    ax.set_title("Decision cost: engine vs raw-decode floor and naive approaches")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
