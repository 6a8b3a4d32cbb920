"""Decisions, in System One and in OpenAI Decisions: two codecs over one decide service."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body

from gateway.api.context import caller, request_id
from gateway.api.docs import UNDOCUMENTED, Documentation
from gateway.api.responses import json_response, served_by
from gateway.decisions.model import DecisionResult
from gateway.observability import counters
from gateway.services.decide import DecideService
from gateway.wire import openai_decisions, systemone


def router(service: DecideService, doc: Documentation = UNDOCUMENTED) -> Router:
    routes = Router()

    def headers(result: DecisionResult, decision_id: str) -> dict[str, str]:
        return {**served_by(result.endpoint, result.attempts), "x-decision-id": decision_id}

    @routes.post("/v1/systemone", summary="System One decision: a probability for every declared option",
                 tags=["System One"], responses=doc("SystemOneResponse", "The answers, by question id"))
    def decide_systemone(request: Annotated[systemone.SystemOneRequest, Body(embed=False)]):
        result, decision_id = service.decide(caller(routes, "decide"), request.to_decision(), route="systemone",
                                              request_id=request_id(routes), metrics=counters())
        return json_response(200, systemone.render(result, decision_id), headers(result, decision_id))

    @routes.post("/v1/decisions", summary="OpenAI Decisions: predicates, choices and scores", tags=["OpenAI"],
                 responses=doc("DecisionsResponse", "The answers, in the order asked"))
    def decide_openai(request: Annotated[openai_decisions.DecisionsRequest, Body(embed=False)]):
        result, decision_id = service.decide(caller(routes, "decide"), request.to_decision(), route="decisions",
                                              request_id=request_id(routes), metrics=counters())
        return json_response(200, openai_decisions.render(result, decision_id), headers(result, decision_id))

    return routes
