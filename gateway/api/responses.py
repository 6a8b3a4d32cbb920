"""JSON responses and error bodies, in the shape of the API a path belongs to."""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.event_handler import Response

from gateway.api.paths import files_api, flavor_of
from gateway.errors import InvalidParameters, InvalidRequest, ServiceError
from systemone.errors import error_parts


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(status_code=status, content_type="application/json", body=text, headers=headers or {})


def error_response(exc: ServiceError, path: str) -> Response:
    if files_api(path) and type(exc) is InvalidRequest:  # a body the handler could not read, on those APIs: 400
        exc = InvalidParameters(exc.details)
    flavor = flavor_of(path)
    if flavor is not None:
        status, body, headers = error_parts(exc, flavor)
        return json_response(status, body, headers)
    # /v1/models and unknown paths are called by both SDKs: one body with both keys.
    status, openai_body, headers = error_parts(exc, "openai")
    _, systemone_body, _ = error_parts(exc, "systemone")
    return json_response(status, {**openai_body, **systemone_body}, headers)


def proxy_error(exc: ServiceError, path: str) -> dict[str, Any]:
    """An error as the proxy result the handler returns without routing (before the body is read)."""
    response = error_response(exc, path)
    headers = {"Content-Type": response.content_type, **{k: str(v) for k, v in response.headers.items()}}
    return {"statusCode": response.status_code, "headers": headers, "body": response.body, "isBase64Encoded": False}


def served_by(endpoint: str, attempts: int) -> dict[str, str]:
    """Transparency: which endpoint answered, after how many attempts."""
    return {"x-endpoint": endpoint, "x-attempts": str(attempts)}
