"""Fakes for the gateway's boundaries that only tests use, for tests at the lowest layer.

They build on the uniform backend (devkit.fake_backend), which the benchmarks share, and
answer as honestly: nothing here stands in for the model in integration or end-to-end tests.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from pydantic import TypeAdapter

from devkit.fake_backend import UniformBackend, answer_with, uniform
from gateway.backends.base import ANONYMOUS, Caller, Endpoint, EndpointError
from systemone.features import SKETCH, encode_state
from systemone.limits import STATE_FEATURE_DIMS
from systemone.models import Question

_QUESTION = TypeAdapter(Question)


class FailingBackend(UniformBackend):
    """Raises the given EndpointError for the named endpoints, answers uniformly elsewhere."""

    def __init__(self, errors: dict[str, EndpointError]) -> None:
        super().__init__()
        self.errors = errors

    def invoke(self, endpoint: Endpoint, body: bytes, route: str, caller: Caller = ANONYMOUS) -> bytes:
        if endpoint.name in self.errors:
            with self.lock:
                self.calls.append((endpoint.name, json.loads(body), route))
            raise self.errors[endpoint.name]
        return super().invoke(endpoint, body, route, caller)


class FixedBackend(UniformBackend):
    """Answers with set probabilities: `choice` by option name (others share the rest), `noul` as P(true),
    `score` as a list, lowest level first. `injection` (an `x_injection` object, sent as given, so a
    malformed one can be too) and `framing` add the scorer's injection check to the answer."""

    def __init__(self, choice: dict[str, float] | None = None, noul: float = 0.5, score: list[float] | None = None,
                 injection: dict[str, Any] | None = None, framing: str | None = None) -> None:
        super().__init__()
        self.choice, self.noul, self.score = choice or {}, noul, score
        self.injection, self.framing = injection, framing

    def distribution(self, question: Question) -> list[float]:
        if question.type == "noul":
            return [self.noul, 1 - self.noul]
        if question.type == "choice":
            names = list(question.criteria)
            rest = [n for n in names if n not in self.choice]
            left = max(0.0, 1 - sum(self.choice.get(n, 0.0) for n in names))
            return [self.choice.get(n, left / len(rest) if rest else 0.0) for n in names]
        return list(self.score) if self.score is not None else uniform(question)

    def features(self, state: Any, question: dict[str, Any]) -> dict[str, Any]:
        """What a scorer reads an answer from, as the contract sends it: the answer's own
        distribution in two listings, and for the state a hashed bag of its words (so that a
        head fitted on it has something to learn; the real sketch is the model's)."""
        p = self.distribution(_QUESTION.validate_python(question))
        logs = [math.log(max(v, 1e-12)) for v in p]
        words = [0.0] * STATE_FEATURE_DIMS
        for word in str(state).lower().split():
            words[int(hashlib.sha256(word.strip(".,!?").encode()).hexdigest(), 16) % STATE_FEATURE_DIMS] += 1.0
        return {"orders": [logs, logs], "prior": None, "state": encode_state(words), "sketch": SKETCH}

    def invoke(self, endpoint: Endpoint, body: bytes, route: str, caller: Caller = ANONYMOUS) -> bytes:
        if route == "chat":
            return super().invoke(endpoint, body, route, caller)
        request = json.loads(body)
        with self.lock:
            self.calls.append((endpoint.name, request, route))
            self.request_ids.append(caller.request_id)
            self.callers.append(caller)
        answer = answer_with(self.model, request, self.distribution)
        if request.get("x_features"):
            for qid, question in request["questions"].items():
                answer["answers"][qid]["x_features"] = self.features(request["state"], question)
        answer["x_model_sha256"] = "ab" * 32
        answer["x_prompt_version"] = "decision-prompt/1"
        answer["x_readout"] = "likelihood"
        # What a scorer says it applied: the request's own settings where it sets them.
        answer["x_debias"] = {"order_average": request.get("x_order_average", True), "prior": request.get("x_prior", False),
                              "ordering": "canonical", "averaging": "reversal", "temperature": 0.8}
        answer["x_image_digest"] = "sha256:" + "cd" * 32
        if self.injection is not None:
            answer["x_injection"] = self.injection
        if self.framing is not None:
            answer["x_framing"] = self.framing
        return json.dumps(answer).encode()


class ManualClock:
    """A clock the test moves: `clock()` reads it, `sleep` and `advance` move it on (nothing waits)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
