"""How much work one request may ask of the model.

A request's cost is the number of tokens the engine will evaluate (`DecisionEngine.cost`).
The budget is `SCORER_MAX_REQUEST_TOKENS` when set; otherwise it is derived at load
time from the model's measured prefill rate on this machine and the time one request
may take (`SCORER_BUDGET_S`, default 22 s: the gateway's first attempt under its 25 s
deadline may read for 23 s, of which it gives the scorer 22.75), so a request the model
cannot finish in time is refused at once with 413 and the figures, never left to time
out. The measurement is logged and shown on /ping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from scorer_container.llama_runtime import Batch, Runtime

_SAMPLE_TEXT = (
    "The customer writes that the parcel arrived late and damaged, asks for a refund of the shipping fee, "
    "and wants to know whether the replacement will be sent by express delivery this time. "
)


@dataclass(frozen=True)
class Budget:
    max_tokens: int
    tokens_per_s: float | None  # measured; None when the budget was set explicitly
    seconds: float

    def describe(self) -> str:
        if self.tokens_per_s is None:
            return f"{self.max_tokens} tokens per request (SCORER_MAX_REQUEST_TOKENS)"
        return (f"{self.max_tokens} tokens per request ({self.tokens_per_s:.0f} tokens/s measured here"
                f" x {self.seconds:g} s)")


def prefill_rate(runtime: Runtime, n_tokens: int = 256, repeat: int = 2) -> float:
    """Tokens per second of a plain prefill on this machine (the best of `repeat`)."""
    base = runtime.tokenize(_SAMPLE_TEXT)
    tokens = (base * (n_tokens // len(base) + 1))[:n_tokens]
    best = float("inf")
    with runtime.lock:
        for _ in range(repeat):
            runtime.clear()
            start = time.perf_counter()
            for offset in range(0, len(tokens), runtime.n_batch):
                batch = Batch.empty()
                for i, token in enumerate(tokens[offset : offset + runtime.n_batch]):
                    batch.add(token, offset + i, 0, offset + i == len(tokens) - 1)
                runtime.decode(batch)
            best = min(best, time.perf_counter() - start)
        runtime.clear()
    return n_tokens / best


def budget_for(runtime: Runtime, max_tokens: int | None, seconds: float) -> Budget:
    if max_tokens is not None:
        return Budget(max_tokens, None, seconds)
    rate = prefill_rate(runtime)
    # 0.9: the engine runs at 94-96% of a plain prefill's rate (measured through `make up`
    # on 2 cores: 2454 tokens in 10.4 s against 252 tokens/s), so a budget-sized job ends
    # about 6% before `seconds`; one that still overruns is stopped by its deadline.
    return Budget(max(256, int(rate * seconds * 0.9)), rate, seconds)
