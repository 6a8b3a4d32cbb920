"""What each operation answers besides its success, declared once: the statuses, when each is
sent, its body (in the error shape of the route's API) and its headers. `finish` writes them
into the OpenAPI document the gateway serves, with chat's event stream and the request headers
the routes read (`Prefer`).

Two checks hold this table to the handler: the test suite's recorder (tests/declared_statuses.py)
fails a test in which a route answers a status it does not declare here, and fails a whole run
of the suite that never drove a route into a status declared here. A route added without a line
here fails the document's build (`finish` raises).
"""

from __future__ import annotations

from typing import Any

from gateway.api.paths import files_api, flavor_of

# -- when each status is sent -------------------------------------------------------------

Statuses = dict[int, str]

# Before routing, on every route: the handler refuses a credential in the URL.
IN_THE_URL: Statuses = {400: "A credential in the query string: credentials travel in the Authorization header only."}
# Every route that does more than answer a constant.
ANY_ROUTE: Statuses = {**IN_THE_URL, 500: "The gateway failed on this request (a defect); endpoint time already spent "
                                           "on it is counted."}
# Before routing, on every route that takes a credential.
CALLER: Statuses = {
    401: "No credential, or one that is malformed, unknown, expired, revoked or tampered with (all alike).",
    429: "The tenant is over its request rate (Retry-After).",
    503: "The credential store cannot be read right now (Retry-After).",
}
# Before routing, on every route that reads a body.
BODY: Statuses = {
    413: "A body over 4,669,440 bytes (also once gzip or zstd is undone), with the figures.",
    415: "A Content-Encoding other than gzip or zstd.",
    422: "A body that is not JSON this API can read, or a field out of its contract: every problem, with its place.",
}
# OpenAI's Files, Uploads and Batch APIs answer a request they cannot read 400, as OpenAI does.
FILES_BODY: Statuses = {**BODY, 400: "A request these APIs cannot read (a body, a field out of its contract): OpenAI "
                                     "answers those 400."}
del FILES_BODY[422]
FILES_QUERY: Statuses = {400: FILES_BODY[400]}
# A multipart form (a file, an upload's part) is read by its route, and sent without Content-Encoding.
FORM_BODY: Statuses = {**FILES_BODY, 400: "A form these APIs cannot read, or one sent with a Content-Encoding."}
del FORM_BODY[415]
QUERY: Statuses = {422: "A path or query parameter out of its contract: every problem, with its place."}


def declare(*groups: Statuses) -> Statuses:
    """The statuses of several groups; where two name one status, the reasons are both kept."""
    merged: dict[int, list[str]] = {}
    for group in groups:
        for status, when in group.items():
            if when not in merged.setdefault(status, []):
                merged[status].append(when)
    return {status: " Or: ".join(reasons) for status, reasons in merged.items()}


def forbidden(what: str) -> Statuses:
    return {403: what}


def not_found(what: str) -> Statuses:
    return {404: what}


SCORED: Statuses = {  # a decision or a chat, on the model's endpoints
    403: "The credential lacks the route's scope, or may not use this model.",
    404: "No such model (or alias), or one the credential may not use.",
    413: "A prompt over the model's context, work over the model's work budget or the tenant's, or a request "
         "larger than every endpoint of the model takes; the figures say which.",
    429: "With Retry-After: the tenant's rate, work in flight or endpoint time; the tenant's share of the "
         "model's scorers; every endpoint saturated; long work's share taken. A spent monthly budget is 429 "
         "with x-should-retry: false and Retry-After to the next month.",
    502: "An endpoint answered something unusable.",
    503: "With Retry-After: no endpoint could answer, or one said nothing in time (not re-sent), or the "
         "decision's record could not be stored.",
    504: "The scorer cut the work at its deadline (never re-sent; x-should-retry: false).",
}
DECIDED: Statuses = {
    **SCORED,
    403: "The credential lacks `decide`, or may not use this model; inline questions for a catalog-only "
         "tenant; reading past an enforcing catalog entry without `catalogs:write`.",
    404: "No such model, or catalog entry (or version), or one the credential may not use.",
    409: "An Idempotency-Key whose first request still runs (retry after it ends).",
    422: "A field out of its contract, an Idempotency-Key reused for another request, or a catalog entry's "
         "questions that do not fit the request: every problem, with its place.",
}
CATALOG_READ = forbidden("The credential lacks `catalogs:read`.")
CATALOG_WRITE = forbidden("The credential lacks `catalogs:write`.")
NO_CATALOG = not_found("No such catalog entry (or version) for this tenant.")
# A deployment without a store (none of the templates') has no records or catalogs to read.
NO_STORE = not_found("This gateway keeps no records or catalogs (it has no store).")
FILES_SCOPE = forbidden("The credential holds neither `decide` nor `chat`.")
BATCH_OWNER = forbidden("The credential holds neither `decide` nor `chat`, or not the scope of the route the batch "
                        "runs.")

# Every operation: its statuses beyond its success. Keys are (method, path as the document has it).
DECLARED: dict[tuple[str, str], Statuses] = {
    ("GET", "/health"): declare(IN_THE_URL),
    ("GET", "/v1/models"): declare(ANY_ROUTE, CALLER),
    ("POST", "/v1/systemone"): declare(ANY_ROUTE, CALLER, BODY, DECIDED),
    ("POST", "/v1/decisions"): declare(ANY_ROUTE, CALLER, BODY, DECIDED),
    ("POST", "/v1/chat/completions"): declare(ANY_ROUTE, CALLER, BODY, SCORED),
    ("POST", "/v1/decisions/{decision_id}/outcome"): declare(
        ANY_ROUTE, CALLER, BODY, forbidden("The credential lacks `decide`."),
        not_found("No decision with this id for this tenant (or its record has expired)."),
        {413: "The record with this outcome would be larger than one stored item."}),
    ("GET", "/v1/records"): declare(ANY_ROUTE, CALLER, QUERY, forbidden("The credential lacks `decide`."), NO_STORE),
    ("GET", "/v1/records/{decision_id}"): declare(
        ANY_ROUTE, CALLER, QUERY, forbidden("The credential lacks `decide`."),
        not_found("No decision with this id for this tenant (or its record has expired).")),
    ("GET", "/v1/catalogs"): declare(ANY_ROUTE, CALLER, QUERY, CATALOG_READ, NO_STORE),
    ("GET", "/v1/catalogs/{name}"): declare(ANY_ROUTE, CALLER, QUERY, CATALOG_READ, NO_CATALOG),
    ("PUT", "/v1/catalogs/{name}"): declare(
        ANY_ROUTE, CALLER, BODY, CATALOG_WRITE, NO_STORE,
        {409: "Concurrent writers of this entry kept colliding (re-read and retry)."}),
    ("GET", "/v1/catalogs/{name}/versions"): declare(ANY_ROUTE, CALLER, QUERY, CATALOG_READ, NO_CATALOG),
    ("GET", "/v1/catalogs/{name}/versions/{version}"): declare(ANY_ROUTE, CALLER, QUERY, CATALOG_READ, NO_CATALOG),
    ("POST", "/v1/catalogs/{name}/refit"): declare(
        ANY_ROUTE, CALLER, BODY, CATALOG_WRITE, NO_CATALOG,
        {409: "Concurrent writers of this entry kept colliding (re-read and retry)."}),
    ("POST", "/v1/tokens"): declare(
        ANY_ROUTE, CALLER, BODY,
        forbidden("Only a SigV4 (IAM) caller mints tokens; or the scopes or models asked for exceed the caller's."),
        {429: "The tenant's mint cap (Retry-After)."}),
    ("POST", "/v1/tokens/revoke"): declare(
        ANY_ROUTE, CALLER, BODY, forbidden("Revoking needs a SigV4 caller or the `admin` scope."),
        {429: "The tenant's revocation cap (Retry-After)."}),
    ("GET", "/v1/usage"): declare(
        ANY_ROUTE, CALLER, QUERY,
        forbidden("Reading usage needs `admin` or `catalogs:read` (it names catalog entries).")),
    ("POST", "/v1/files"): declare(
        ANY_ROUTE, CALLER, FORM_BODY, FILES_SCOPE,
        {413: "A file past its limits (`file_too_large`: its size, the tenant's files or bytes), with the figures."}),
    ("GET", "/v1/files"): declare(ANY_ROUTE, CALLER, FILES_QUERY, FILES_SCOPE),
    ("GET", "/v1/files/{file_id}"): declare(
        ANY_ROUTE, CALLER, FILES_QUERY, FILES_SCOPE, not_found("No such file for this tenant.")),
    ("DELETE", "/v1/files/{file_id}"): declare(
        ANY_ROUTE, CALLER, FILES_BODY, FILES_SCOPE, not_found("No such file for this tenant.")),
    ("GET", "/v1/files/{file_id}/content"): declare(
        ANY_ROUTE, CALLER, FILES_QUERY, FILES_SCOPE, not_found("No such file for this tenant."),
        {413: "A file larger than a buffered response carries, asked on the buffered integration (it is served on the "
              "streaming one)."}),
    ("POST", "/v1/uploads"): declare(
        ANY_ROUTE, CALLER, FILES_BODY, FILES_SCOPE,
        {413: "An upload larger than a file may be, or past the tenant's files or bytes, with the figures."}),
    ("POST", "/v1/uploads/{upload_id}/parts"): declare(
        ANY_ROUTE, CALLER, FORM_BODY, FILES_SCOPE, not_found("No such upload for this tenant."),
        {413: "A part over 4 MiB, with the figures."}),
    ("POST", "/v1/uploads/{upload_id}/complete"): declare(
        ANY_ROUTE, CALLER, FILES_BODY, FILES_SCOPE, not_found("No such upload for this tenant."),
        {409: "Another request completed or cancelled the upload at the same time."}),
    ("POST", "/v1/uploads/{upload_id}/cancel"): declare(
        ANY_ROUTE, CALLER, FILES_BODY, FILES_SCOPE, not_found("No such upload for this tenant."),
        {409: "Another request completed or cancelled the upload at the same time."}),
    ("POST", "/v1/batches"): declare(
        ANY_ROUTE, CALLER, FILES_BODY, BATCH_OWNER, not_found("No such input file for this tenant."),
        {413: "A batch whose work cannot finish in its window (`batch_too_large`), with the figures.",
         429: "The tenant has 10 batches validating or running (Retry-After)."}),
    ("GET", "/v1/batches"): declare(ANY_ROUTE, CALLER, FILES_QUERY, FILES_SCOPE),
    ("GET", "/v1/batches/{batch_id}"): declare(
        ANY_ROUTE, CALLER, FILES_QUERY, FILES_SCOPE, not_found("No such batch for this tenant.")),
    ("POST", "/v1/batches/{batch_id}/cancel"): declare(
        ANY_ROUTE, CALLER, FILES_BODY, FILES_SCOPE, not_found("No such batch for this tenant."),
        {409: "The batch has ended, or is finalizing (what finished is kept either way)."}),
}

# -- headers ----------------------------------------------------------------------------

REQUEST_ID = {"description": "API Gateway's request id: in the decision's record and the scorer's logs.",
              "schema": {"type": "string"}}
RETRY_AFTER = {"description": "Seconds after which a retry can succeed.", "schema": {"type": "integer", "minimum": 0}}
SHOULD_RETRY = {"description": "`false` where retrying the same request cannot help (the OpenAI SDKs obey it).",
                "schema": {"type": "string", "enum": ["false"]}}
RETRY_AFTER_STATUSES = (429, 503)
PREFER = {
    "name": "Prefer", "in": "header", "required": False,
    "description": "`wait=N` (RFC 7240): a deadline of N seconds instead of 25, up to 58 (the tenant's "
                   "endpoint_seconds_per_minute, if lower, caps it). Work too large for its deadline is 413.",
    "schema": {"type": "string", "pattern": "^wait=[0-9]+$"},
}
PREFER_ROUTES = {("POST", "/v1/systemone"), ("POST", "/v1/decisions"), ("POST", "/v1/chat/completions")}

# -- the error bodies -------------------------------------------------------------------

ERROR_MODELS = ("ProblemItem", "SystemOneProblems", "SystemOneErrorDetail", "SystemOneError",
                "OpenAIErrorDetail", "OpenAIError", "EitherError")


def error_schema(path: str, status: int) -> str:
    """The component naming the body of an error `status` on `path`, in its API's shape."""
    flavor = flavor_of(path)
    if flavor == "openai" or files_api(path):
        return "OpenAIError"
    if flavor == "systemone":
        return "SystemOneProblems" if status == 422 else "SystemOneError"
    return "EitherError"


def error_components() -> dict[str, Any]:
    """The error models' JSON schemas, as components."""
    from pydantic.json_schema import models_json_schema

    from gateway.wire import responses

    models = [(getattr(responses, name), "serialization") for name in ERROR_MODELS]
    _, schema = models_json_schema(models, ref_template="#/components/schemas/{model}")
    return schema["$defs"]


def error_response(path: str, status: int, when: str) -> dict[str, Any]:
    headers = {"x-request-id": REQUEST_ID}
    if status in RETRY_AFTER_STATUSES:
        headers["Retry-After"] = RETRY_AFTER
    headers["x-should-retry"] = SHOULD_RETRY
    ref = {"$ref": f"#/components/schemas/{error_schema(path, status)}"}
    return {"description": when, "headers": headers, "content": {"application/json": {"schema": ref}}}


def finish(document: dict[str, Any]) -> dict[str, Any]:
    """The document with every operation's declared statuses, headers and event stream."""
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            key = (method.upper(), path)
            if key not in DECLARED:
                raise LookupError(f"{method.upper()} {path} declares no statuses (gateway.api.reference.DECLARED)")
            responses = {code: answer for code, answer in operation.get("responses", {}).items() if int(code) < 300}
            for answer in responses.values():
                answer.setdefault("headers", {})["x-request-id"] = REQUEST_ID
            for status, when in sorted(DECLARED[key].items()):
                responses[str(status)] = error_response(path, status, when)
            operation["responses"] = responses
            if key in PREFER_ROUTES:
                operation.setdefault("parameters", []).append(PREFER)
    # Powertools' own 422 shape is replaced by each API's: its components go, the errors' come.
    for unused in ("HTTPValidationError", "ValidationError", "ResponseValidationError"):
        components.pop(unused, None)
    components.update(error_components())
    return document
