"""The REST API: Powertools' APIGatewayRestResolver with request validation, assembled
from one router per resource (`gateway.api`), each given the services it calls.

Handlers are thin: the resolver validates the body into a wire model, the handler
checks the caller's scope, calls one service and renders the answer. Errors become
bodies by `systemone.errors.error_parts`, in the shape of the route's API.
"""

from __future__ import annotations

import logging
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError

from gateway.api import batches, catalogs, chat, decisions, operations, records, tokens, usage
from gateway.api.docs import ResponseDocs
from gateway.api.paths import IAM_PREFIX, OPENAPI_PATH
from gateway.api.responses import error_response
from gateway.errors import AnsweredLater, InvalidRequest, ServiceError, UnknownRoute
from gateway.services.instance import InstanceServices
from systemone import json_text
from systemone.errors import QUESTION_TAGS, validation_details

log = logging.getLogger("gateway.api.app")
# The public API's question types beside the contract's: /v1/decisions' predicates and catalog references.
PUBLIC_QUESTION_TAGS = QUESTION_TAGS | {"predicate", "catalog"}
API_TITLE = "Decision gateway"


class GatewayResolver(APIGatewayRestResolver):
    """Powertools' resolver, whose OpenAPI document also says what each operation answers
    besides its success (`gateway.api.reference`)."""

    _documents: dict[str, Any]

    def get_openapi_schema(self, **kwargs: Any) -> Any:
        # Built once per instance and arguments (the routes never change, and /v1/openapi is
        # public where served): a few arguments' worth, as the servers entry is the stage's.
        key = repr(sorted(kwargs.items()))
        documents = self.__dict__.setdefault("_documents", {})
        if key not in documents:
            from aws_lambda_powertools.event_handler.openapi.models import OpenAPI

            from gateway.api.reference import finish

            document = super().get_openapi_schema(**kwargs).model_dump(by_alias=True, exclude_none=True, mode="json")
            if len(documents) >= 4:
                documents.clear()
            documents[key] = OpenAPI.model_validate(finish(document))
        return documents[key]


def build_app(services: InstanceServices) -> APIGatewayRestResolver:
    app = GatewayResolver(enable_validation=True, json_body_deserializer=json_text.loads,
                                 strip_prefixes=[IAM_PREFIX])
    doc = ResponseDocs(served=services.settings.openapi)
    app.include_router(operations.router(services.registry, doc))
    app.include_router(decisions.router(services.decide, services.idempotency, doc))
    app.include_router(records.router(services.records, doc))
    app.include_router(catalogs.router(services.catalogs, services.learning, doc))
    app.include_router(chat.router(services.decide, doc))
    app.include_router(tokens.router(services.authenticator, doc))
    if services.files is not None and services.batches is not None:
        app.include_router(batches.router(services.files, services.batches, doc))
    if services.spending is not None:
        app.include_router(usage.router(services.spending, services.decide.limits, doc=doc))
    if services.settings.openapi:
        # The OpenAPI models are a cold start's worth of imports: loaded only where the document is served.
        from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer

        # Every route but /health takes a bearer credential (an API key or a minted token).
        app.enable_swagger(path=OPENAPI_PATH, title=API_TITLE, version="1",
                           security_schemes={"bearer": HTTPBearer(description="An API key (dgk_...) or a token (dgt_...)")},
                           security=[{"bearer": []}])
    register_error_handlers(app)
    return app


def register_error_handlers(app: APIGatewayRestResolver) -> None:
    @app.exception_handler(RequestValidationError)
    def invalid(exc: RequestValidationError) -> Response:  # 422; OpenAI's Files, Uploads and Batch APIs: 400
        path = app.current_event.path
        return error_response(InvalidRequest(validation_details(exc.errors(), PUBLIC_QUESTION_TAGS)), path)

    @app.exception_handler(ServiceError)
    def gateway_error(exc: ServiceError) -> Response:
        if exc.status >= 500 and not isinstance(exc, AnsweredLater):
            log.warning("request failed", extra={"status": exc.status, "error_type": exc.error_type})
        return error_response(exc, app.current_event.path)

    @app.not_found
    def not_found(exc: Exception) -> Response:
        return error_response(UnknownRoute("no such route; see the API reference"), app.current_event.path)

    @app.exception_handler(Exception)
    def unexpected(exc: Exception) -> Response:
        log.exception("unexpected error")
        return error_response(ServiceError("the gateway failed on this request"), app.current_event.path)
