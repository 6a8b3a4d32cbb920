"""The decision service: resolve the model, ask its endpoint pool in System One, and read
the answer back into the internal model.

The backend speaks System One: question ids are the internal ids, option keys the
internal keys, so answers are read back by key whatever wire format the caller used.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from typing import Any

from gateway.auth.store import DEFAULT_LIMITS, TenantLimits
from gateway.backends.base import InferenceBackend
from gateway.catalogs.policy import judge, with_temperature
from gateway.catalogs.resolve import resolve
from gateway.catalogs.service import CatalogService
from gateway.decisions.budget import check_budget, check_chat_budget
from gateway.decisions.model import Answer, Decision, Outcome, Question, Usage
from gateway.decisions.pools import Invocation, MetricsSink
from gateway.decisions.routing import ModelRegistry, ModelRoute
from gateway.decisions.scoring import normalise
from gateway.errors import BackendFailed

log = logging.getLogger("gateway.decisions")


class DecisionService:
    def __init__(self, registry: ModelRegistry, backend: InferenceBackend, catalogs: CatalogService | None = None) -> None:
        self.registry = registry
        self.backend = backend
        self.catalogs = catalogs

    def decide(self, decision: Decision, metrics: MetricsSink | None = None, *, tenant_id: str = "",
               catalog_only: bool = False, limits: TenantLimits = DEFAULT_LIMITS,
               may_override_policy: bool = True, request_id: str = "") -> tuple[Decision, Outcome]:
        """Resolve catalog references, ask the pool, then calibrate and judge: (the decision as asked, its outcome)."""
        route = self.registry.resolve(decision.model, "decisions")
        decision = resolve(decision, tenant_id, self.catalogs, catalog_only, may_override_policy)
        check_budget(decision, route.max_request_tokens, limits)
        invocation = route.pool.invoke(self.backend, _json_bytes(backend_request(decision, route)), "systemone", metrics,
                                       request_id)
        outcome = read_outcome(decision, invocation)
        return decision, (apply_catalogs(outcome) if decision.calibrate else outcome)

    def chat(self, request: dict[str, Any], metrics: MetricsSink | None = None,
             limits: TenantLimits = DEFAULT_LIMITS, request_id: str = "") -> tuple[dict[str, Any], Invocation]:
        """One chat completion (never streamed from the backend: the gateway frames any stream)."""
        route = self.registry.resolve(request["model"], "chat")
        payload = {**request, "stream": False, **check_chat_budget(request, limits)}
        payload.pop("stream_options", None)
        invocation = route.pool.invoke(self.backend, _json_bytes(payload), "chat", metrics, request_id)
        completion = _json_object(invocation.body)
        if not isinstance(completion.get("choices"), list) or not completion["choices"]:
            raise BackendFailed("the model endpoint answered without a completion")
        return completion, invocation


def apply_catalogs(outcome: Outcome) -> Outcome:
    """Each catalog question's temperature, then its policy's verdict, on the calibrated probabilities."""
    answers = []
    for answer in outcome.answers:
        binding = answer.question.binding
        if binding is None or answer.refused:
            answers.append(answer)
            continue
        calibrated = with_temperature(answer.question.kind, answer.probabilities, binding.temperature)
        verdict = judge(answer.question.kind, calibrated, binding.policy) if binding.policy is not None else None
        answers.append(replace(answer, probabilities=calibrated, verdict=verdict))
    return replace(outcome, answers=tuple(answers))


def backend_request(decision: Decision, route: ModelRoute) -> dict[str, Any]:
    """The System One body the scorer receives."""
    return {
        "model": route.name,
        "state": decision.state,
        "questions": {q.id: _backend_question(q) for q in decision.questions},  # type: ignore[arg-type]
        **decision.engine_options,
    }


def _backend_question(question: Question) -> dict[str, Any]:
    body: dict[str, Any] = {"type": question.kind}
    if question.instructions is not None:
        body["instructions"] = question.instructions
    if question.kind == "noul":
        if question.options:
            body["criteria"] = {o.key: o.description for o in question.options}
    elif question.kind == "choice":
        body["criteria"] = {o.key: o.description for o in question.options}
    else:
        body["criteria"] = [o.description for o in question.options]
    return body


def read_outcome(decision: Decision, invocation: Invocation) -> Outcome:
    endpoint = invocation.endpoint
    body = _json_object(invocation.body)
    answers = body.get("answers")
    if not isinstance(answers, dict) or not isinstance(body.get("model"), str):
        raise BackendFailed("the model endpoint answered in an unexpected shape")
    read = []
    for question in decision.questions:
        probabilities = _probabilities(question, answers.get(question.id))
        if probabilities is None:
            log.warning("unusable answer from the endpoint", extra={"endpoint": endpoint, "question_kind": question.kind})
            read.append(Answer(question, refused=True))
        else:
            read.append(Answer(question, probabilities))
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return Outcome(
        model=body["model"],
        answers=tuple(read),
        usage=Usage(
            input_tokens=_count(usage.get("input_tokens")),
            output_tokens=_count(usage.get("output_tokens")),
            cached_tokens=_count(usage.get("x_cached_tokens")),
        ),
        endpoint=endpoint,
        attempts=invocation.attempts,
        extensions={k: v for k, v in body.items() if k.startswith("x_")},
    )


def _probabilities(question: Question, answer: Any) -> tuple[float, ...] | None:
    if not isinstance(answer, dict) or answer.get("type") != question.kind:
        return None
    if question.kind == "noul":
        p = answer.get("noul")
        return (float(p),) if _is_probability(p) else None
    table = answer.get("probabilities")
    if not isinstance(table, dict):
        return None
    keys = [o.key for o in question.options] if question.kind == "choice" else [str(i) for i in range(len(question.options))]
    values = [table.get(key) for key in keys]
    if not all(_is_probability(v) for v in values) or sum(values) <= 0:
        return None
    return normalise([float(v) for v in values])


def _is_probability(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value <= 1


def _count(value: Any) -> int:
    is_count = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return int(value) if is_count else 0


def _json_bytes(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        raise BackendFailed("the model endpoint answered something that is not JSON") from None
    if not isinstance(body, dict):
        raise BackendFailed("the model endpoint answered in an unexpected shape")
    return body
