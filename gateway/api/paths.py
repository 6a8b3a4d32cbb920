"""Which API a path belongs to, as the handler (before routing) and the routes both read it."""

from __future__ import annotations

from systemone.errors import Flavor

PUBLIC_PATHS = ("/health",)
OPENAPI_PATH = "/v1/openapi"  # the OpenAPI document (?format=json) and Swagger UI, where enabled: it holds no data
IAM_PREFIX = "/iam"  # the same routes for SigV4 callers (API Gateway's AWS_IAM authorization)
SYSTEM_ONE_PATHS = ("/v1/systemone",)
OPENAI_PATHS = ("/v1/chat/completions", "/v1/decisions")
# OpenAI's Files, Uploads and Batch APIs: every path under these.
OPENAI_PREFIXES = ("/v1/files", "/v1/uploads", "/v1/batches")
# The routes API Gateway streams (template.yaml: StreamingFunction's events, for both prefixes):
# chat, which streams its completions, the decisions, which may take the longer deadline, and a
# file's content (a batch's output may be larger than a buffered Lambda response's 6 MB).
STREAMING_ROUTES = (("POST", "/v1/chat/completions"), ("POST", "/v1/systemone"), ("POST", "/v1/decisions"),
                    ("GET", "/v1/files/{file_id}/content"))

def route_path(path: str) -> str:
    return path[len(IAM_PREFIX):] if path == IAM_PREFIX or path.startswith(IAM_PREFIX + "/") else path


def flavor_of(path: str) -> Flavor | None:
    """The error shape of a path: System One, OpenAI, or None for both (models, unknown paths)."""
    path = route_path(path)
    if path in SYSTEM_ONE_PATHS or path in PUBLIC_PATHS:
        return "systemone"
    if path in OPENAI_PATHS or any(path == p or path.startswith(p + "/") for p in OPENAI_PREFIXES):
        return "openai"
    return None


def streams(method: str, path: str) -> bool:
    """Whether API Gateway sends this request to the streaming integration."""
    segments = route_path(path).split("/")
    return any(method.upper() == route_method and _matches(segments, route.split("/"))
               for route_method, route in STREAMING_ROUTES)


def _matches(segments: list[str], template: list[str]) -> bool:
    """A path's segments against an API Gateway path template's (`{name}` takes one segment)."""
    return len(segments) == len(template) and all(
        t == s or (t.startswith("{") and t.endswith("}") and s != "") for s, t in zip(segments, template, strict=True))
