"""OpenAI Chat Completions: the backend answers whole; a stream is framed here."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body

from gateway.api.context import caller, request_id
from gateway.api.responses import json_response, served_by
from gateway.observability import counters
from gateway.services.decide import DecideService
from gateway.wire.openai_chat import ChatRequest, as_event_stream


def router(service: DecideService) -> Router:
    routes = Router()

    @routes.post("/v1/chat/completions", summary="OpenAI Chat Completions (a stream is buffered)", tags=["OpenAI"])
    def chat_completions(request: Annotated[ChatRequest, Body(embed=False)]):
        completion, invocation = service.chat(caller(routes, "chat"), request.backend_body(),
                                              request_id=request_id(routes), metrics=counters())
        headers = served_by(invocation.endpoint, invocation.attempts)
        if request.stream:
            text = as_event_stream(completion, request.include_usage())
            return Response(200, "text/event-stream", text, {"cache-control": "no-cache", **headers})
        return json_response(200, completion, headers)

    return routes
