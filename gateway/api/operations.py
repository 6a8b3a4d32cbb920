"""Liveness and the model list."""

from __future__ import annotations

from aws_lambda_powertools.event_handler.api_gateway import Router

from gateway.api.context import caller
from gateway.api.docs import UNSERVED, ResponseDocs
from gateway.api.responses import json_response
from gateway.backends.routing import ModelRegistry
from gateway.wire import models as models_wire
from gateway.wire import responses


def router(registry: ModelRegistry, doc: ResponseDocs = UNSERVED) -> Router:
    routes = Router()

    @routes.get("/health", summary="Liveness of the gateway function (no credentials needed)", tags=["Operations"],
                responses=doc(responses.Health, "The function runs"))
    def health():
        return json_response(200, {"status": "ok"})

    @routes.get("/v1/models", summary="Models and aliases, in the OpenAI and System One list shapes at once",
                tags=["Models"], responses=doc(responses.ModelList, "The models this credential may use"))
    def list_models():
        principal = caller(routes, None)
        visible = [r for r in registry.routes if any(principal.may_use(n) for n in (r.name, *r.aliases))]
        return json_response(200, models_wire.render(visible))

    return routes
