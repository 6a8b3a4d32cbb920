"""How much work one request may ask of the model.

A request's work is what the engine will evaluate (`DecisionEngine.cost`): its tokens,
plus its logits rows, each counted as `row_cost` tokens. A row is not free: with
gemma's 262k-word vocabulary, computing one and reading it (a log-softmax over the
whole vocabulary) costs about as much as a token, and the likelihood readout reads one
per option token. Both rates are measured when the model loads, on this machine.

The budget is `SCORER_MAX_REQUEST_TOKENS` when set; otherwise what this machine
evaluates in 90% of `SCORER_BUDGET_S` (default 22 s: the gateway's first attempt under
its 25 s deadline may read for 23 s, of which it gives the scorer 22.75), so a request
the model cannot finish in time is refused at once with 413 and the figures, never
left to time out. The measurements are logged and shown on /ping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from scorer_container.llama_runtime import Runtime
from scorer_container.prefix_tree import log_probs

_SAMPLE_TEXT = (
    "The customer writes that the parcel arrived late and damaged, asks for a refund of the shipping fee, "
    "and wants to know whether the replacement will be sent by express delivery this time. "
)
_SAMPLE_TOKENS = 256
_SAMPLE_ROWS = 32  # the most rows the engine reads in one decode


@dataclass(frozen=True)
class Budget:
    max_tokens: int  # tokens' worth of work per request
    row_cost: float  # one logits row, in tokens' worth
    tokens_per_s: float
    seconds: float
    explicit: bool  # max_tokens came from SCORER_MAX_REQUEST_TOKENS

    def describe(self) -> str:
        measured = f"{self.tokens_per_s:.0f} tokens/s, a logits row {self.row_cost:.2f} tokens"
        if self.explicit:
            return f"{self.max_tokens} tokens' worth per request (SCORER_MAX_REQUEST_TOKENS; measured {measured})"
        return f"{self.max_tokens} tokens' worth per request ({measured}, x {self.seconds:g} s x 0.9)"


def measure(runtime: Runtime, repeat: int = 2) -> tuple[float, float]:
    """(tokens per second of a plain prefill, the cost of one logits row in tokens), best of `repeat`."""
    base = runtime.tokenize(_SAMPLE_TEXT)
    tokens = (base * (_SAMPLE_TOKENS // len(base) + 1))[:_SAMPLE_TOKENS]
    last_piece = (len(tokens) - 1) // runtime.n_batch * runtime.n_batch  # rows are read from the last decode
    rows = frozenset(range(max(last_piece, len(tokens) - _SAMPLE_ROWS), len(tokens)))
    candidates = (tokens[0],)

    def timed(wanted: frozenset[int]) -> float:
        runtime.clear()
        start = time.perf_counter()
        runtime.prefill(tokens, rows=wanted)
        for position in sorted(wanted) or [len(tokens) - 1]:
            log_probs(runtime.logits(position - last_piece), candidates)  # as the engine reads a row
        return time.perf_counter() - start

    with runtime.lock:
        try:
            plain = min(timed(frozenset()) for _ in range(repeat))
            with_rows = min(timed(rows) for _ in range(repeat))
        finally:
            runtime.clear()
    per_token = plain / len(tokens)
    return len(tokens) / plain, max(0.0, (with_rows - plain) / (len(rows) - 1)) / per_token


def budget_for(runtime: Runtime, max_tokens: int | None, seconds: float) -> Budget:
    rate, row_cost = measure(runtime)
    if max_tokens is not None:
        return Budget(max_tokens, row_cost, rate, seconds, explicit=True)
    # 0.9: a budget-sized job should end before `seconds` despite the engine's extra
    # decodes and a shared machine's noise; one that still overruns is stopped by its deadline.
    return Budget(max(256, int(rate * seconds * 0.9)), row_cost, rate, seconds, explicit=False)
