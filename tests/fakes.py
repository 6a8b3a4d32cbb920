"""Fakes for the gateway's boundaries, for tests at the lowest layer.

They implement the same interface as the real adapters and answer honestly: the
uniform backend answers exactly the questions it was asked, in System One, with valid
probabilities; nothing here stands in for the model in integration or end-to-end tests.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from gateway.backends.base import Endpoint, EndpointError


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


def uniform_answer(model: str, request: dict[str, Any]) -> dict[str, Any]:
    answers = {}
    for qid, question in request["questions"].items():
        if question["type"] == "noul":
            answers[qid] = {"type": "noul", "noul": 0.5}
        elif question["type"] == "choice":
            names = list(question["criteria"])
            answers[qid] = {"type": "choice", "choice": names[0], "probabilities": {n: 1 / len(names) for n in names},
                            "confidence": 0.0}
        else:
            n = len(question["criteria"])
            answers[qid] = {"type": "score", "score": (n - 1) / 2, "probabilities": {str(i): 1 / n for i in range(n)},
                            "legend": {str(i): c for i, c in enumerate(question["criteria"])}, "confidence": 0.0}
    return {"model": model, "answers": answers, "usage": {"input_tokens": 10, "output_tokens": 0}}


def chat_completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


class FixedBackend(UniformBackend):
    """Answers with set probabilities: `choice` by option name (others share the rest), `noul` as P(true),
    `score` as a list, lowest level first."""

    def __init__(self, choice: dict[str, float] | None = None, noul: float = 0.5, score: list[float] | None = None) -> None:
        super().__init__()
        self.choice, self.noul, self.score = choice or {}, noul, score

    def invoke(self, endpoint: Endpoint, body: bytes, route: str, request_id: str = "") -> bytes:
        if route == "chat":
            return super().invoke(endpoint, body, route, request_id)
        request = json.loads(body)
        with self.lock:
            self.calls.append((endpoint.name, request, route))
            self.request_ids.append(request_id)
        answer = uniform_answer(self.model, request)
        for qid, question in request["questions"].items():
            if question["type"] == "noul":
                answer["answers"][qid]["noul"] = self.noul
            elif question["type"] == "choice":
                names = list(question["criteria"])
                rest = [n for n in names if n not in self.choice]
                left = max(0.0, 1 - sum(self.choice.get(n, 0.0) for n in names))
                answer["answers"][qid]["probabilities"] = {n: self.choice.get(n, left / len(rest) if rest else 0.0) for n in names}
            elif self.score is not None:
                answer["answers"][qid]["probabilities"] = {str(i): p for i, p in enumerate(self.score)}
        answer["x_model_sha256"] = "ab" * 32
        answer["x_prompt_version"] = "decision-prompt/1"
        answer["x_debias"] = {"order_average": True, "prior": False, "ordering": "canonical", "averaging": "reversal",
                              "temperature": 0.8}
        answer["x_image_digest"] = "sha256:" + "cd" * 32
        return json.dumps(answer).encode()
