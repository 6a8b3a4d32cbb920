"""The scorer's protocol, System One, as the gateway speaks it: a `Decision` rendered as
the scorer's request body, and the scorer's answer read back into the domain.

Question ids are the internal ids and option keys the internal keys, so answers are read
back by key whatever wire format the caller used. An answer that does not fit its
question (a missing or malformed probability) becomes a refused answer, never an error
for the caller; a body that is not the expected shape at all is `BackendFailed` (502).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from gateway.backends.pools import Invocation
from gateway.decisions.cost import Meter
from gateway.decisions.model import (
    Answer,
    Decision,
    DecisionResult,
    Question,
    ReadFeatures,
    Usage,
    figures,
)
from gateway.errors import BackendFailed
from systemone.answers import normalise
from systemone.features import decode_state
from systemone.models import Answer as ScorerAnswer
from systemone.models import AnswerFeatures, Extensions, NoulAnswer

log = logging.getLogger("gateway.backends.scorer")


def backend_request(decision: Decision, model: str) -> dict[str, Any]:
    """The System One body the scorer receives (`model`: the route's own name, never an alias).
    The state comes first: an endpoint routing by prefix reads the body's first bytes, and sends
    requests about one state to the instance that keeps it (scorer_container.state_cache)."""
    return {
        "state": decision.state,
        "model": model,
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


def read_result(decision: Decision, invocation: Invocation, meter: Meter | None = None) -> DecisionResult:
    """The decision's result from the endpoint's answer; the scorer's own figure of the time
    it worked on it (`x_busy_ms`) goes to the request's `meter`, whose cost the result carries."""
    endpoint = invocation.endpoint
    body = json_object(invocation.body)
    answers = body.get("answers")
    if not isinstance(answers, dict) or not isinstance(body.get("model"), str):
        raise BackendFailed("the model endpoint answered in an unexpected shape")
    read = []
    for question in decision.questions:
        answer = _answer(question, answers.get(question.id))
        if answer.refused:
            log.warning("unusable answer from the endpoint", extra={"endpoint": endpoint, "question_kind": question.kind})
        read.append(answer)
    figures = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    busy_ms = figures.get("x_busy_ms")
    # Cached tokens are a part of the input, never more (a scorer that says otherwise is not believed).
    usage = Usage(input_tokens=_count(figures.get("input_tokens")), output_tokens=_count(figures.get("output_tokens")),
                  cached_tokens=min(_count(figures.get("x_cached_tokens")), _count(figures.get("input_tokens"))))
    if meter is not None:
        if _count(busy_ms) == busy_ms:  # a count, as the contract says; else not believed
            meter.busy(busy_ms / 1000)
        meter.input_tokens, meter.cached_tokens = usage.input_tokens, usage.cached_tokens
    extensions, typed = _extensions(body)
    return DecisionResult(
        model=body["model"],
        answers=tuple(read),
        usage=usage,
        endpoint=endpoint,
        attempts=invocation.attempts,
        cost=meter.cost() if meter is not None else invocation.cost,
        extensions=extensions,
        injection=typed.x_injection,
    )


def _extensions(body: dict[str, Any]) -> tuple[dict[str, Any], Extensions]:
    """The answer's x_ fields as sent (passed through), and those a record keeps, typed as the
    contract says (else 502, never a 500 later)."""
    found = {k: v for k, v in body.items() if k.startswith("x_")}
    try:
        typed = Extensions.model_validate(found)
    except ValidationError:
        raise BackendFailed("the model endpoint answered with malformed x_ fields") from None
    return found, typed


_ANSWER = TypeAdapter(ScorerAnswer, config=ConfigDict(defer_build=True))  # built on first use, as the models
_AGREEMENT = 1e-6  # rounding between the scorer's floats and these (it normalises before it computes)


def _answer(question: Question, raw: Any) -> Answer:
    """The answer's distribution over the question's declared options, with its confidence and
    score, computed here once (the contract's formulas, systemone.answers): the scorer's own
    floats are kept where they agree, so that a scorer and a gateway deployed apart (another
    image, another version of the formulas) never hand a caller or a policy a figure that
    does not describe the probabilities. Refused when it is not a contract answer of the
    question's type covering every option with some probability."""
    try:
        answer = _ANSWER.validate_python(raw)
    except ValidationError:
        return Answer(question, refused=True)
    if answer.type != question.kind:
        return Answer(question, refused=True)
    if isinstance(answer, NoulAnswer):
        return Answer(question, (answer.noul,), features=_features(raw, 2))
    keys = [o.key for o in question.options] if question.kind == "choice" else [str(i) for i in range(len(question.options))]
    values = [answer.probabilities.get(key) for key in keys]
    if any(v is None for v in values) or sum(values) <= 0:
        return Answer(question, refused=True)
    probabilities = normalise(values)
    confidence, score = figures(question.kind, probabilities)
    sent = (answer.confidence, getattr(answer, "score", None))
    mine = (confidence, score or 0.0)
    if set(answer.probabilities) == set(keys) and all(
            theirs is None or abs(theirs - own) <= _AGREEMENT for theirs, own in zip(sent, mine, strict=True)):
        confidence, score = (sent[0] if sent[0] is not None else confidence), (sent[1] if sent[1] is not None else score)
    elif sent != (None, None):
        log.warning("the endpoint's confidence or score does not match its probabilities; computed here instead")
    return Answer(question, probabilities, confidence=confidence, score=score, features=_features(raw, len(keys)))


_FEATURES = TypeAdapter(AnswerFeatures)


def _features(raw: dict[str, Any], n_options: int) -> ReadFeatures | None:
    """The answer's x_features, when sent and well-formed for `n_options` options (each
    listing a distribution: log-probabilities summing to 1); else None (an adapter then
    does not apply, and says so: never a guess from malformed numbers)."""
    if "x_features" not in raw:
        return None
    try:
        sent = _FEATURES.validate_python(raw["x_features"])
        state = decode_state(sent.state)
    except (ValidationError, ValueError):
        log.warning("the endpoint's x_features are malformed; answered without them")
        return None
    orders = tuple(tuple(o) for o in sent.orders)
    if any(len(o) != n_options or not all(math.isfinite(v) and v <= 1e-6 for v in o)
           or abs(math.log(math.fsum(math.exp(v) for v in o) or 1e-300)) > 1e-3 for o in orders):
        log.warning("the endpoint's x_features do not fit the question; answered without them")
        return None
    return ReadFeatures(orders, tuple(state), sent.sketch)


def _count(value: Any) -> int:
    is_count = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return int(value) if is_count else 0


def json_bytes(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        raise BackendFailed("the model endpoint answered something that is not JSON") from None
    if not isinstance(body, dict):
        raise BackendFailed("the model endpoint answered in an unexpected shape")
    return body
