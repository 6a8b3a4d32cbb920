"""Fakes for the gateway's boundaries, for tests at the lowest layer.

They implement the same interface as the real adapters and answer honestly: the
uniform backend answers exactly the questions it was asked, in System One, with valid
probabilities; nothing here stands in for the model in integration or end-to-end tests.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from gateway.backends.base import Endpoint, EndpointError
from systemone.models import ChoiceAnswer, DecisionRequest, DecisionResponse, NoulAnswer, Question, ScoreAnswer, Usage


class UniformBackend:
    """Answers every decision with a uniform distribution (the most likely option: the first)."""

    def __init__(self, model: str = "fake-model") -> None:
        self.model = model
        self.calls: list[tuple[str, dict[str, Any], str]] = []
        self.request_ids: list[str] = []
        self.lock = threading.Lock()

    def invoke(self, endpoint: Endpoint, body: bytes, route: str, request_id: str = "") -> bytes:
        request = json.loads(body)
        with self.lock:
            self.calls.append((endpoint.name, request, route))
            self.request_ids.append(request_id)
        if route == "chat":
            return json.dumps(chat_completion(self.model, "hello")).encode()
        return json.dumps(uniform_answer(self.model, request)).encode()


class FailingBackend(UniformBackend):
    """Raises the given EndpointError for the named endpoints, answers uniformly elsewhere."""

    def __init__(self, errors: dict[str, EndpointError]) -> None:
        super().__init__()
        self.errors = errors

    def invoke(self, endpoint: Endpoint, body: bytes, route: str, request_id: str = "") -> bytes:
        if endpoint.name in self.errors:
            with self.lock:
                self.calls.append((endpoint.name, json.loads(body), route))
            raise self.errors[endpoint.name]
        return super().invoke(endpoint, body, route)


def answer_with(model: str, request: dict[str, Any],
                distribution: Callable[[Question], list[float]]) -> dict[str, Any]:
    """A scorer's answer through the contract: the request validated as the scorer validates
    it (a fake takes nothing the scorer would refuse), each answer a contract answer model."""
    parsed = DecisionRequest.model_validate(request)
    answers: dict[str, Any] = {}
    for qid, question in parsed.questions.items():
        p = distribution(question)
        if question.type == "noul":
            answers[qid] = NoulAnswer(type="noul", noul=p[0])
        elif question.type == "choice":
            names = list(question.criteria)
            answers[qid] = ChoiceAnswer(type="choice", choice=names[p.index(max(p))],
                                        probabilities=dict(zip(names, p, strict=True)), confidence=0.0)
        else:
            answers[qid] = ScoreAnswer(type="score", score=sum(i * v for i, v in enumerate(p)),
                                       legend={str(i): c for i, c in enumerate(question.criteria)},
                                       probabilities={str(i): v for i, v in enumerate(p)}, confidence=0.0)
    reply = DecisionResponse(model=model, answers={k: v.model_dump(exclude_none=True) for k, v in answers.items()},
                             usage=Usage(input_tokens=10, output_tokens=0))
    return reply.model_dump(exclude_none=True)


def uniform(question: Question) -> list[float]:
    n = 2 if question.type == "noul" else len(question.criteria)
    return [1 / n] * n


def uniform_answer(model: str, request: dict[str, Any]) -> dict[str, Any]:
    return answer_with(model, request, uniform)


def chat_completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


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

    def invoke(self, endpoint: Endpoint, body: bytes, route: str, request_id: str = "") -> bytes:
        if route == "chat":
            return super().invoke(endpoint, body, route, request_id)
        request = json.loads(body)
        with self.lock:
            self.calls.append((endpoint.name, request, route))
            self.request_ids.append(request_id)
        answer = answer_with(self.model, request, self.distribution)
        answer["x_model_sha256"] = "ab" * 32
        answer["x_prompt_version"] = "decision-prompt/1"
        answer["x_debias"] = {"order_average": True, "prior": False, "ordering": "canonical", "averaging": "reversal",
                              "temperature": 0.8}
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
