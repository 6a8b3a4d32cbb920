"""OpenAI Chat Completions. On the streaming integration, `stream: true` is relayed from the
backend's stream as it is generated; on the buffered one, the completion is asked whole
and framed as the events a stream would have sent (they arrive together)."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body

from gateway.api.context import batch_line, caller, request_id, streaming, wait_preference
from gateway.api.docs import UNSERVED, ResponseDocs
from gateway.api.responses import json_response, served_by
from gateway.observability import counters
from gateway.services.decide import BulkWork, DecideService
from gateway.streaming.response import EVENT_STREAM, EventStream
from gateway.wire import responses
from gateway.wire.openai_chat import ChatRequest, as_event_stream


def router(service: DecideService, doc: ResponseDocs = UNSERVED) -> Router:
    routes = Router()

    @routes.post("/v1/chat/completions", summary="OpenAI Chat Completions (streams on the streaming integration)",
                 tags=["OpenAI"], responses=doc.streamed(responses.ChatCompletion, responses.ChatCompletionChunk,
                                                         "The completion; with `stream: true`, its events"))
    def chat_completions(request: Annotated[ChatRequest, Body(embed=False)]):
        principal = caller(routes, "chat")
        if request.stream and streaming(routes):
            events, invocation = service.chat_stream(principal, request.backend_body(), request_id=request_id(routes),
                                                     metrics=counters(), wait_s=wait_preference(routes))
            return EventStream(events, served_by(invocation.endpoint, invocation.attempts))
        line = batch_line(routes)
        bulk = None if line is None else BulkWork(None, lambda completion: line.keep(200, completion))
        completion, invocation = service.chat(principal, request.backend_body(), request_id=request_id(routes),
                                              metrics=counters(), streaming=streaming(routes),
                                              wait_s=wait_preference(routes), bulk=bulk)
        headers = served_by(invocation.endpoint, invocation.attempts)
        if request.stream:
            text = as_event_stream(completion, request.include_usage())
            return Response(200, EVENT_STREAM, text, {"cache-control": "no-cache", **headers})
        return json_response(200, completion, headers)

    return routes
