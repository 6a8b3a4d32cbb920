"""Backends that answer instantly and honestly, for the tests at the lowest layer and the
overhead benchmarks: what is timed or tested is whatever sits in front of them.

`UniformBackend` implements the gateway's backend interface in process. It answers
exactly the questions it was asked, in System One, with valid probabilities (the request
validated as the scorer validates it); nothing here stands in for the model in
integration or end-to-end tests. `FakeBackendServer` gives the same canned answers over
HTTP, on SageMaker's runtime paths (`/endpoints/{name}/invocations`, and
`.../invocations-response-stream` as AWS event-stream messages: what botocore calls with
`endpoint_url`) and OpenAI's `/v1/chat/completions` (what LiteLLM calls).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from devkit.sagemaker_standin import EVENT_STREAM, payload_part
from gateway.backends.base import ANONYMOUS, Caller, Endpoint, StreamedAnswer
from gateway.wire.openai_chat import as_event_stream
from systemone import answers as formulas
from systemone.models import ChoiceAnswer, DecisionRequest, DecisionResponse, NoulAnswer, Question, ScoreAnswer, Usage

MODEL = "instant-fake"


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
            answers[qid] = ChoiceAnswer(type="choice", choice=names[formulas.argmax(p)],
                                        probabilities=dict(zip(names, p, strict=True)),
                                        confidence=formulas.choice_confidence(p))
        else:
            answers[qid] = ScoreAnswer(type="score", score=formulas.expected_score(p),
                                       legend={str(i): c for i, c in enumerate(question.criteria)},
                                       probabilities={str(i): v for i, v in enumerate(p)},
                                       confidence=formulas.score_confidence(p))
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


class UniformBackend:
    """Answers every decision with a uniform distribution (the most likely option: the first)."""

    def __init__(self, model: str = "fake-model") -> None:
        self.model = model
        self.calls: list[tuple[str, dict[str, Any], str]] = []
        self.request_ids: list[str] = []
        self.callers: list[Caller] = []  # whom each call was for (its tenant tag, work and weight)
        self.lock = threading.Lock()

    def invoke(self, endpoint: Endpoint, body: bytes, route: str, caller: Caller = ANONYMOUS) -> bytes:
        request = json.loads(body)
        with self.lock:
            self.calls.append((endpoint.name, request, route))
            self.request_ids.append(caller.request_id)
            self.callers.append(caller)
        if route == "chat":
            return json.dumps(chat_completion(self.model, "hello")).encode()
        return json.dumps(uniform_answer(self.model, request)).encode()

    def invoke_stream(self, endpoint: Endpoint, body: bytes, route: str, caller: Caller,
                      deadline_s: float) -> StreamedAnswer:
        """The answer `invoke` gives, as a streaming endpoint sends it: a chat as its events,
        anything else whole, in pieces that do not align with lines (as SageMaker's parts)."""
        data = stream_bytes(self.invoke(endpoint, body, route, caller), json.loads(body))
        pieces = [data[i:i + PIECE_BYTES] for i in range(0, len(data), PIECE_BYTES)]
        return StreamedAnswer(endpoint.name, pieces[0], iter(pieces[1:]), lambda: None)


PIECE_BYTES = 7  # fewer than any event: every event arrives in several pieces


def stream_bytes(answer: bytes, request: dict[str, Any]) -> bytes:
    """What a streaming endpoint sends for this answer: a streamed chat's events, else the answer."""
    if request.get("stream") and "messages" in request:
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        return as_event_stream(json.loads(answer), include_usage).encode()
    return answer


def answer(body: bytes, path: str) -> bytes:
    request = json.loads(body or b"{}")
    if "messages" in request or path.endswith("/chat/completions"):
        return json.dumps(chat_completion(MODEL, "hello")).encode()
    return json.dumps(uniform_answer(MODEL, request)).encode()


class FakeBackendServer:
    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once, no 40 ms delayed-ACK stall

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                data = answer(body, self.path)
                if self.path.endswith("/invocations-response-stream"):  # InvokeEndpointWithResponseStream
                    data = stream_bytes(data, json.loads(body or b"{}"))
                    data = b"".join(payload_part(data[i:i + PIECE_BYTES]) for i in range(0, len(data), PIECE_BYTES))
                    content_type = EVENT_STREAM
                else:
                    content_type = "application/json"
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeBackendServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
