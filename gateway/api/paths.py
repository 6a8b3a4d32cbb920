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
# The routes whose body is a multipart form (a file, an upload's part), not JSON.
FORM_ROUTES = (("POST", "/v1/files"), ("POST", "/v1/uploads/{upload_id}/parts"))
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
    if path in OPENAI_PATHS or files_api(path):
        return "openai"
    return None


def files_api(path: str) -> bool:
    """A path of OpenAI's Files, Uploads or Batch API (whose errors OpenAI answers 400, not 422)."""
    path = route_path(path)
    return any(path == p or path.startswith(p + "/") for p in OPENAI_PREFIXES)


def streams(method: str, path: str) -> bool:
    """Whether API Gateway sends this request to the streaming integration."""
    return _among(method, path, STREAMING_ROUTES)


def takes_form(method: str, path: str) -> bool:
    """Whether the route's body is a multipart form."""
    return _among(method, path, FORM_ROUTES)


def _among(method: str, path: str, routes: tuple[tuple[str, str], ...]) -> bool:
    segments = route_path(path).split("/")
    return any(method.upper() == route_method and _matches(segments, route.split("/")) for route_method, route in routes)


def _matches(segments: list[str], template: list[str]) -> bool:
    """A path's segments against an API Gateway path template's (`{name}` takes one segment)."""
    return len(segments) == len(template) and all(
        t == s or (t.startswith("{") and t.endswith("}") and s != "") for s, t in zip(segments, template, strict=True))
