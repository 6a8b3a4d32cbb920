"""Saved sequences restored: the cells a state left answer the next question as a fresh
evaluation of the same tokens does, split at the same place (the real SmolLM2 model), in
llama.cpp and through the decision engine."""

import math

import httpx
import numpy as np
import pytest

from scorer_container.llama import Batch
from scorer_container.schema import DecisionRequest, parse
from scorer_container.state_cache import StateCache
from systemone.sidechannel import attributes
from tests.conftest import make_engine

pytestmark = pytest.mark.model

STEP = "step {i}: the agent called tool_{t} with argument {a} and got ok. "


def transcript(llama, steps: int) -> list[int]:
    text = "".join(STEP.format(i=i, t=i % 7, a=i * 37 % 101) for i in range(steps))
    return llama.tokenize(text, add_bos=llama.adds_bos)


def decode(llama, tokens, seq, start=0) -> np.ndarray:
    """Decode `tokens` at positions from `start` in pieces of n_batch; the last token's logits."""
    for i in range(0, len(tokens), llama.n_batch):
        batch = Batch.empty()
        piece = tokens[i:i + llama.n_batch]
        for j, token in enumerate(piece):
            batch.add(token, start + i + j, seq, i + j == len(tokens) - 1)
        llama.decode(batch)
    return llama.logits(len(piece) - 1)


def test_a_restored_state_answers_exactly_as_a_fresh_one_split_at_the_same_place(smollm2_llama):
    llama = smollm2_llama
    state, question = transcript(llama, 30), llama.tokenize(" Did the agent finish? Answer:")
    with llama.lock:  # each path on an empty cache: the same cells in use, the same sums
        llama.clear()
        decode(llama, state, 1)
        saved = llama.save_sequence(1)
        llama.clear()
        decode(llama, state, 0)
        fresh = decode(llama, question, 0, len(state))
        llama.clear()
        llama.restore_sequence(saved, 2)
        reused = decode(llama, question, 2, len(state))
        llama.clear()
    assert len(saved) > 1000 * len(state) and np.array_equal(fresh, reused)


def test_a_longer_transcript_continues_from_the_part_it_shares(smollm2_llama):
    llama = smollm2_llama
    before, after = transcript(llama, 30), transcript(llama, 31)  # one tool call later
    shared = next(i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b) if before != after[
        :len(before)] else len(before)
    question = llama.tokenize(" Did the agent finish? Answer:")
    with llama.lock:
        llama.clear()
        decode(llama, before, 1)
        saved = llama.save_sequence(1)
        llama.clear()
        decode(llama, after[:shared], 0)  # the fresh path, split where the saved cells end
        decode(llama, after[shared:], 0, shared)
        fresh = decode(llama, question, 0, len(after))
        llama.clear()
        llama.restore_sequence(saved, 2, keep=shared)
        decode(llama, after[shared:], 2, shared)
        reused = decode(llama, question, 2, len(after))
        llama.clear()
    assert shared > 0.9 * len(before)
    assert np.array_equal(fresh, reused)



# -- the engine: a state read once serves the next question about it -----------------------

QUESTIONS = {
    "finished": {"type": "noul", "instructions": "Did the agent finish its task?"},
    "next": {"type": "choice", "instructions": "What should the supervisor do?",
             "criteria": {"continue": "let it go on", "stop": "stop the agent", "ask": "ask a human"}},
    "risk": {"type": "score", "instructions": "How risky is the agent's last step?",
             "criteria": ["none", "some", "high"]},
}
MANY = {"tool": {"type": "choice", "instructions": "Which tool ran most?",  # 30 options: two groups and a final round
                 "criteria": {f"tool_{i}": None for i in range(30)}}}


def agent_request(steps: int, questions=QUESTIONS, **extra) -> DecisionRequest:
    text = "".join(STEP.format(i=i, t=i % 7, a=i * 37 % 101) for i in range(steps))
    return parse(DecisionRequest, {"model": "m", "state": text, "questions": questions, **extra})


def cached_engine(llama, readout: str):
    return make_engine(llama, readout, states=StateCache(512 * 2**20), model_id="sha")


def run(engine, request, tenant="acme") -> dict:
    return engine.decide(engine.fit(request, math.inf, tenant=tenant))


@pytest.mark.parametrize("readout", ["letters", "likelihood"])
@pytest.mark.parametrize("debias", [{"x_order_average": False, "x_prior": False},
                                    {"x_order_average": True, "x_prior": True}])
@pytest.mark.parametrize("questions", [QUESTIONS, MANY], ids=["types", "grouped"])
def test_an_exact_repeat_answers_what_a_fresh_evaluation_answers(smollm2_llama, readout, debias, questions):
    if questions is MANY and readout == "likelihood" and debias["x_prior"]:
        pytest.skip("one grouped likelihood case is enough: the final round is the same path")
    engine = cached_engine(smollm2_llama, readout)
    fresh = run(engine, agent_request(12, questions, x_cache=False, **debias))
    first = run(engine, agent_request(12, questions, **debias))
    again = run(engine, agent_request(12, questions, **debias))
    # A final round (grouped options) starts from the cells its first round kept, within one request.
    assert fresh["usage"]["x_cached_tokens"] == 0 and (first["usage"]["x_cached_tokens"] > 0) == (questions is MANY)
    assert again["usage"]["x_cached_tokens"] > 200  # the hit: the transcript was restored, not read
    assert again["usage"]["input_tokens"] == first["usage"]["input_tokens"]  # read the same, evaluated less
    assert again["answers"] == fresh["answers"] == first["answers"]


def test_a_transcript_one_step_longer_reuses_what_it_shares_and_answers_within_rounding(smollm2_llama):
    engine = cached_engine(smollm2_llama, "letters")
    run(engine, agent_request(12))
    longer = run(engine, agent_request(13))
    fresh = run(engine, agent_request(13, x_cache=False))
    assert longer["usage"]["x_cached_tokens"] > 0.85 * fresh["usage"]["input_tokens"] / 2
    for qid, answer in fresh["answers"].items():
        reused = longer["answers"][qid]
        assert reused.get("choice") == answer.get("choice")
        for key, p in answer.get("probabilities", {"true": answer.get("noul")}).items():
            assert abs(reused.get("probabilities", {"true": reused.get("noul")})[key] - p) < 2e-3


def test_the_cache_is_per_tenant_and_x_cache_false_forgets_the_state(smollm2_llama):
    engine = cached_engine(smollm2_llama, "letters")
    run(engine, agent_request(12), tenant="acme")
    assert run(engine, agent_request(12), tenant="globex")["usage"]["x_cached_tokens"] == 0  # another tenant: fresh
    assert run(engine, agent_request(12), tenant="acme")["usage"]["x_cached_tokens"] > 0
    run(engine, agent_request(12, x_cache=False), tenant="acme")  # forgets acme's, keeps nothing
    assert run(engine, agent_request(12), tenant="acme")["usage"]["x_cached_tokens"] == 0
    assert run(engine, agent_request(12), tenant="globex")["usage"]["x_cached_tokens"] > 0  # globex's stays


def test_the_plan_counts_only_what_it_evaluates_and_holds_its_hit(smollm2_llama):
    engine = cached_engine(smollm2_llama, "letters")
    cold = engine.fit(agent_request(12, x_prior=False), math.inf, tenant="acme")  # no prior: nothing else cached
    engine.decide(cold)
    warm = engine.fit(agent_request(12, x_prior=False), math.inf, tenant="acme")
    assert cold.cost.cached == 0 and warm.cost.cached > 200
    assert warm.cost.tokens == cold.cost.tokens - warm.cost.cached and warm.cost.cells == cold.cost.cells
    engine.states.forget(warm.reuse.key, warm.stem)  # evicted after planning: the plan still holds its cells
    assert engine.decide(warm)["usage"]["x_cached_tokens"] == warm.cost.cached


# -- over HTTP: the scorer reports what it restored, per tenant tag ---------------------------

def test_the_scorer_reports_cached_tokens_per_tenant_and_its_figures_count_the_hits(scorer_url):
    body = {"model": "m", "state": agent_request(12).state, "questions": QUESTIONS, "x_prior": False}

    def ask(tenant: str, **extra) -> dict:
        answer = httpx.post(f"{scorer_url}/invocations", json={**body, **extra}, timeout=120, headers={
            "X-Amzn-SageMaker-Custom-Attributes": attributes("systemone", 60_000, tenant=tenant)})
        assert answer.status_code == 200, answer.text
        return answer.json()["usage"]

    before = httpx.get(f"{scorer_url}/stats").json()["state_cache"]
    first, again = ask("a" * 16), ask("a" * 16)
    assert first["x_cached_tokens"] == 0 < again["x_cached_tokens"] <= again["input_tokens"] == first["input_tokens"]
    assert again["x_busy_ms"] < first["x_busy_ms"]  # the time the scorer worked, and so the charge, falls
    assert ask("b" * 16)["x_cached_tokens"] == 0  # another tenant's identical state: read afresh
    assert ask("a" * 16, x_cache=False)["x_cached_tokens"] == 0
    assert ask("a" * 16)["x_cached_tokens"] == 0  # forgotten
    after = httpx.get(f"{scorer_url}/stats").json()["state_cache"]
    assert after["hits"] - before["hits"] == 1 and after["max_bytes"] > 0 and after["held_bytes"] > 0
