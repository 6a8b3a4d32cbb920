"""`make bench-scorer`: what a decision costs, against the raw-decode floor and naive approaches.

Every figure comes from one run on one model (the `make up` default unless --model),
best of `--repeat` (the machine is shared and noisy). For each request the engine's
prefix trees are captured as it evaluates them (first round, final rounds, priors),
and two floors are timed on exactly those tokens:
- floor: a raw llama.cpp decode, one sequence in n_batch pieces, logits for the last
  token only: what evaluating the tokens costs at all;
- floor+rows: the same decode, also computing a logits row wherever the engine reads
  one (at most 32 a decode, as the engine): the likelihood readout reads one row per
  option token, and with a 262k vocabulary a row costs most of a token. The engine's
  own overhead is engine / floor+rows; what the readout itself costs, floor+rows / floor.
Rows:
- 1 and 4 questions over a ~300-token state, 4 and 16 options: with the naive
  approaches beside it (re-evaluate every prompt from scratch; generate an answer per
  question and parse it), and the 4-question / 1-question ratio;
- 1 question of 64, 128 and 255 options (descriptions of about 40 characters);
each with debiasing off and on (order averaging + content-free prior; the prior cache
cold, then warm), and, up to 16 options, with rotations instead of the reversal (one
probe per option; priors warm) against its own floor, and, up to 16 options, with the
untrusted-state defenses on (the spotlight framing, the quarantine and the injection
probe; priors warm) against the debiased request and its own floor. Writes
reports/bench_scorer.json and reports/bench_scorer.png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.workloads import options
from scorer_container import engine as engine_module
from scorer_container.chat import ChatGenerator
from scorer_container.decision_settings import DecisionSettings
from scorer_container.engine import DecisionEngine
from scorer_container.llama import Batch, LlamaModel, LlamaSettings
from scorer_container.prefix_tree import MAX_LOGITS_ROWS_PER_DECODE, Branch, build_tree, evaluate
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
    "whether the annual plan would be cheaper for us. Attached are the two invoices and a screenshot of the error. "
    "For the record: the first charge appeared on the third of March, the second one on the fifth, both from the "
    "same card ending in the same four digits, and our bank confirmed that neither was a pre-authorisation. The "
    "login problem started the morning after the policy change; the reset link opens the app, which then shows "
    "a blank page. We tried two phones and the web site, with the same result."
)
TOPICS = ["Which team should handle this?", "What does the customer want most?",
          "Which product area is affected?", "What is the next best action?"]


def questions(n_questions: int, n_options: int) -> dict:
    out = {}
    for q in range(n_questions):
        listed = options(n_options) if n_options > 16 else {
            f"option {chr(65 + k)}{q}": f"description of option {k} for question {q}" for k in range(n_options)}
        out[f"q{q}"] = {"type": "choice", "instructions": TOPICS[q % len(TOPICS)], "criteria": listed}
    return out


def best_of(repeat: int, func) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return min(times)


def running(engine: DecisionEngine, request: DecisionRequest, settings: DecisionSettings | None = None):
    """The engine running `request`'s plan, planned once beforehand as the server plans it
    before admission: what is timed is the model's work and the engine's around it."""
    plan = engine.planner.plan(request, settings)
    return lambda: engine.decide(plan)


def captured_trees(engine: DecisionEngine, request: DecisionRequest,
                   settings: DecisionSettings | None = None) -> tuple[list[list[Branch]], int]:
    """Every prefix tree one `decide` evaluates, and the tokens it reports."""
    trees: list[list[Branch]] = []
    original = engine_module.evaluate

    def spy(llama, branches, deadline=None):
        trees.append(list(branches))
        return original(llama, branches, deadline)

    engine_module.evaluate = spy
    try:
        evaluated = engine.answer(request, settings)["usage"]["input_tokens"]
    finally:
        engine_module.evaluate = original
    return trees, evaluated


def tree_work(branches: list[Branch]) -> tuple[list[int], int]:
    """A tree's tokens laid end to end, and how many logits rows the engine reads in it."""
    root = build_tree(branches)
    tokens, rows, stack = [], 0, [root]
    while stack:
        node = stack.pop()
        tokens.extend(node.tokens)
        rows += len({local for local, *_ in node.reads})
        stack.extend(node.children)
    return tokens, rows


def raw_decode(llama: LlamaModel, tokens: list[int], rows: int = 1) -> None:
    """Decode `tokens` as one sequence with `rows` logits rows spread over them (>= 1: the last)."""
    llama.clear()
    last = len(tokens) - 1
    wanted = {round(i * last / (rows - 1)) for i in range(rows)} if rows > 1 else {last}
    batch, in_batch = Batch.empty(), 0
    for position, token in enumerate(tokens):
        logits = position in wanted
        if len(batch) >= llama.n_batch or (logits and in_batch >= MAX_LOGITS_ROWS_PER_DECODE):
            llama.decode(batch)
            batch, in_batch = Batch.empty(), 0
        batch.add(token, position, 0, logits)
        in_batch += logits
    llama.decode(batch)
    llama.clear()


def floors(llama: LlamaModel, trees: list[list[Branch]], repeat: int) -> tuple[int, int, float, float]:
    work = [tree_work(tree) for tree in trees]
    tokens = sum(len(t) for t, _ in work)
    rows = sum(r for _, r in work)
    plain = best_of(repeat, lambda: [raw_decode(llama, t) for t, _ in work])
    with_rows = best_of(repeat, lambda: [raw_decode(llama, t, r) for t, r in work])
    return tokens, rows, plain, with_rows


def reevaluate(llama: LlamaModel, trees: list[list[Branch]]) -> None:
    for tree in trees:
        for branch in tree:
            evaluate(llama, [branch])


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


def measure(engine: DecisionEngine, chat: ChatGenerator, readout: str, n_questions: int, n_options: int,
            repeat: int) -> dict:
    llama = engine.llama
    body = {"model": "m", "state": STATE, "questions": questions(n_questions, n_options), "x_readout": readout}
    plain = parse(DecisionRequest, {**body, "x_order_average": False, "x_prior": False})
    debiased = parse(DecisionRequest, {**body, "x_order_average": True, "x_prior": True})
    trees, evaluated = captured_trees(engine, plain)
    tokens, rows, floor_s, floor_rows_s = floors(llama, trees, repeat)
    assert evaluated == tokens, (evaluated, tokens)
    engine_s = best_of(repeat, running(engine, plain))
    engine.priors.clear()
    start = time.perf_counter()
    _, cold_tokens = captured_trees(engine, debiased)
    cold_s = time.perf_counter() - start
    warm_trees, warm_tokens = captured_trees(engine, debiased)
    warm_s = best_of(repeat, running(engine, debiased))
    _, _, warm_floor_s, warm_floor_rows_s = floors(llama, warm_trees, repeat)
    row = {"readout": readout, "questions": n_questions, "options": n_options, "tokens": tokens, "logits_rows": rows,
           "engine_s": engine_s, "floor_s": floor_s, "floor_rows_s": floor_rows_s,
           "engine_over_floor": engine_s / floor_s, "engine_over_floor_rows": engine_s / floor_rows_s,
           "debias_cold_s": cold_s, "debias_cold_tokens": cold_tokens, "debias_warm_s": warm_s,
           "debias_warm_tokens": warm_tokens, "debias_warm_over_floor_rows": warm_s / warm_floor_rows_s,
           "debias_warm_over_floor": warm_s / warm_floor_s,
           "debias_warm_over_plain": warm_s / engine_s}
    if n_options <= 16:  # rotations (one probe per option) exist for questions that fit one probe
        rotations = replace(engine.settings_for(debiased), averaging="rotations")
        engine.answer(debiased, rotations)  # its priors warm, as in steady traffic
        rotation_trees, rotation_tokens = captured_trees(engine, debiased, rotations)
        rotations_s = best_of(repeat, running(engine, debiased, rotations))
        _, _, _, rotation_floor_rows_s = floors(llama, rotation_trees, repeat)
        row.update({"rotations_warm_s": rotations_s, "rotations_warm_tokens": rotation_tokens,
                    "rotations_over_floor_rows": rotations_s / rotation_floor_rows_s,
                    "rotations_over_reversal": rotations_s / warm_s})
    if n_options <= 16:  # the state fenced and restated, flagged passages quarantined, the injection probe
        defended = parse(DecisionRequest, {**body, "x_order_average": True, "x_prior": True, "x_framing": "spotlight",
                                           "x_quarantine": True, "x_injection_probe": True})
        engine.answer(defended)  # its priors warm
        defended_trees, defended_tokens = captured_trees(engine, defended)
        defended_s = best_of(repeat, running(engine, defended))
        _, _, _, defended_floor_rows_s = floors(llama, defended_trees, repeat)
        row.update({"defended_warm_s": defended_s, "defended_warm_tokens": defended_tokens,
                    "defended_over_floor_rows": defended_s / defended_floor_rows_s,
                    "defended_over_debiased": defended_s / warm_s})
    if n_options <= 16:  # the naive approaches, on the small rows only (they take minutes on the big ones)
        row["reevaluate_s"] = best_of(1, lambda: reevaluate(llama, trees))
        row["generate_s"] = best_of(1, lambda: generate_and_parse(chat, plain))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="gemma-3-270m-q4_k_m")
    parser.add_argument("--readouts", nargs="*", default=["letters", "likelihood"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--options", nargs="*", type=int, default=[64, 128, 255])
    args = parser.parse_args()
    path = sorted((ROOT / "models" / args.model).glob("*.gguf"))[0]
    llama = LlamaModel(path, LlamaSettings(n_ctx=8192))
    prompts = PromptFormat.for_model(llama)
    chat = ChatGenerator(llama, prompts, args.model)
    state_tokens = len(llama.tokenize(STATE))
    print(f"model {args.model}; state {state_tokens} tokens; n_batch {llama.n_batch}; best of {args.repeat}", flush=True)
    print(f"{'readout':<10} {'q':>2} {'opts':>4} {'tokens':>6} {'rows':>5} {'engine s':>9} {'floor s':>8}"
          f" {'+rows s':>8} {'eng/+rows':>9} {'eng/floor':>9} {'debias cold':>11} {'warm':>7} {'warm/plain':>10}", flush=True)
    rows = []
    shapes = [(1, 4), (4, 4), (1, 16), (4, 16)] + [(1, n) for n in args.options]
    for readout in args.readouts:
        engine = DecisionEngine(llama, prompts, model_name=args.model, default_readout=readout,
                                defenses_overridable=True)
        for n_questions, n_options in shapes:
            row = measure(engine, chat, readout, n_questions, n_options, args.repeat if n_options <= 64 else 2)
            rows.append(row)
            print(f"{readout:<10} {n_questions:>2} {n_options:>4} {row['tokens']:>6} {row['logits_rows']:>5}"
                  f" {row['engine_s']:>9.3f} {row['floor_s']:>8.3f} {row['floor_rows_s']:>8.3f}"
                  f" {row['engine_over_floor_rows']:>8.2f}x {row['engine_over_floor']:>8.2f}x"
                  f" {row['debias_cold_s']:>11.3f} {row['debias_warm_s']:>7.3f} {row['debias_warm_over_plain']:>9.2f}x",
                  flush=True)
    print("\nratios (same run)")
    for r in rows:
        naive = ""
        if "reevaluate_s" in r:
            naive = (f"; re-evaluate {r['reevaluate_s'] / r['engine_s']:.1f}x slower,"
                     f" generate {r['generate_s'] / r['engine_s']:.1f}x slower")
        print(f"  {r['readout']:<10} {r['questions']} q x {r['options']:>3} opts: engine/floor+rows"
              f" {r['engine_over_floor_rows']:.2f}x, engine/floor {r['engine_over_floor']:.2f}x, debiased (warm"
              f" priors) {r['debias_warm_over_plain']:.2f}x plain and {r['debias_warm_over_floor_rows']:.2f}x its floor"
              f"+rows{naive}")
        if "rotations_warm_s" in r:
            print(f"  {'':<10} {'':>14} rotations (warm): {r['rotations_warm_s'] / r['engine_s']:.2f}x plain,"
                  f" {r['rotations_over_reversal']:.2f}x the reversal, {r['rotations_over_floor_rows']:.2f}x its"
                  " floor+rows")
        if "defended_warm_s" in r:
            print(f"  {'':<10} {'':>14} spotlight + quarantine + probe (warm): {r['defended_over_debiased']:.2f}x the"
                  f" debiased request ({r['defended_warm_tokens']} tokens against {r['debias_warm_tokens']}),"
                  f" {r['defended_over_floor_rows']:.2f}x its floor+rows")
    for readout in args.readouts:
        one, four = (next(r for r in rows if r["readout"] == readout and r["questions"] == q and r["options"] == 4)
                     for q in (1, 4))
        print(f"  {readout:<10} 4 questions / 1 question on the {state_tokens}-token state: debiasing off"
              f" {four['engine_s'] / one['engine_s']:.2f}x, on (warm) {four['debias_warm_s'] / one['debias_warm_s']:.2f}x")
    out = ROOT / "reports"
    out.mkdir(exist_ok=True)
    (out / "bench_scorer.json").write_text(json.dumps({"model": args.model, "state_tokens": state_tokens, "rows": rows},
                                                      indent=2))
    plot(rows, out / "bench_scorer.png", args.model)
    print(f"wrote {out / 'bench_scorer.json'} and {out / 'bench_scorer.png'}")
    llama.close()
    return 0


def plot(rows: list[dict], out: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['readout'][:6]}\n{r['questions']}q x {r['options']}" for r in rows]
    series = [("floor", "floor_s", "#BBBBBB"), ("floor + logits rows", "floor_rows_s", "#777777"),
              ("engine", "engine_s", "#4C72B0"), ("engine, debiased (warm priors)", "debias_warm_s", "#8172B2"),
              ("engine, debiased (cold)", "debias_cold_s", "#C44E52")]
    fig, ax = plt.subplots(figsize=(13, 4.8))
    width = 0.16
    for i, (name, key, color) in enumerate(series):
        ax.bar([x + (i - 2) * width for x in range(len(rows))], [r[key] for r in rows], width, label=name, color=color)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("seconds per request (log scale)")
    ax.set_title(f"Decision cost against its floors ({model}, 2 cores)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
