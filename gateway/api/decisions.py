"""Decisions, in System One and in OpenAI Decisions: two codecs over one decide service.

On the streaming integration a decision's whole answer is still sent at once, when it is
ready, but a caller that asks for it (`Prefer: wait=N`) may have a longer deadline (work
past API Gateway's 29 s): nothing is sent before the answer, so every refusal keeps its
status.
Either may carry an `Idempotency-Key` header: a retry with the same key gets the first
answer, and no second decision or record (`gateway.services.idempotency`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Header

from gateway.api.context import batch_line, caller, request_id, streaming, wait_preference
from gateway.api.docs import UNSERVED, ResponseDocs
from gateway.api.responses import json_response, served_by
from gateway.decisions.model import DecisionResult
from gateway.observability import counters
from gateway.services.decide import BulkWork, DecideService
from gateway.services.idempotency import HEADER, MAX_KEY_CHARS, Idempotency, Reply
from gateway.wire import openai_decisions, responses, systemone

# Declared so that the OpenAPI document shows it; its rules are checked by the service.
IdempotencyKey = Annotated[str, Header(alias=HEADER, min_length=1, max_length=MAX_KEY_CHARS, description=(
    "Makes the decision idempotent for 24 hours: a retry with the same key gets the first answer"
    " (header idempotent-replayed: true), with no second decision or record. 1-255 printable ASCII characters."))]


def router(service: DecideService, idempotency: Idempotency | None = None, doc: ResponseDocs = UNSERVED) -> Router:
    routes = Router()

    def decided(route: str, request: Any, render: Callable[[DecisionResult, str], dict[str, Any]], key: str | None):
        principal = caller(routes, "decide")
        line = batch_line(routes)
        rendered: dict[str, Any] = {}

        def keep(result: DecisionResult) -> None:  # a batch line's answer, kept before its record is written
            rendered["body"] = render(result, line.decision_id)
            line.keep(200, rendered["body"])

        def work() -> Reply:
            result, decision_id = service.decide(principal, request.to_decision(), route=route,
                                                  request_id=request_id(routes), metrics=counters(),
                                                  streaming=streaming(routes), wait_s=wait_preference(routes),
                                                  bulk=None if line is None else BulkWork(line.decision_id, keep))
            headers = {**served_by(result.endpoint, result.attempts), "x-decision-id": decision_id}
            return Reply(200, rendered.get("body") or render(result, decision_id), headers)

        if idempotency is None or line is not None:
            reply = work()
        else:
            reply = idempotency.respond(principal, key, route, request.model_dump(mode="json"), work,
                                        admit=lambda: service.admit(principal, request.to_decision()))
        return json_response(reply.status, reply.body, reply.headers)

    @routes.post("/v1/systemone", summary="System One decision: a probability for every declared option",
                 tags=["System One"], responses=doc(responses.SystemOneResponse, "The answers, by question id"))
    def decide_systemone(request: Annotated[systemone.SystemOneRequest, Body(embed=False)],
                         idempotency_key: IdempotencyKey = None):
        return decided("systemone", request, systemone.render, idempotency_key)

    @routes.post("/v1/decisions", summary="OpenAI Decisions: predicates, choices and scores", tags=["OpenAI"],
                 responses=doc(responses.DecisionsResponse, "The answers, in the order asked"))
    def decide_openai(request: Annotated[openai_decisions.DecisionsRequest, Body(embed=False)],
                      idempotency_key: IdempotencyKey = None):
        return decided("decisions", request, openai_decisions.render, idempotency_key)

    return routes
