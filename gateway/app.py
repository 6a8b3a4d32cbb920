"""The REST routes, on Powertools' APIGatewayRestResolver with request validation.

Handlers are thin: the resolver validates the body into a wire model, the handler
checks the caller's scope, calls one domain function and renders the answer. Errors
become bodies in `gateway.wire.errors`, in the shape of the route's API.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.auth.credentials import Principal
from gateway.auth.store import DEFAULT_LIMITS
from gateway.catalogs.drift import drift
from gateway.catalogs.model import MAX_VERSION, NAME_PATTERN, CatalogContent
from gateway.catalogs.resolve import POLICY_OVERRIDE_SCOPE
from gateway.catalogs.service import CatalogService
from gateway.decisions.model import MAX_QUESTIONS, Decision, Outcome
from gateway.errors import Forbidden, GatewayError, InvalidRequest, NotFound, Unauthenticated, UnknownRoute
from gateway.handler import IAM_PREFIX, PUBLIC_PATHS, route_path
from gateway.observability import counters
from gateway.runtime import GatewayRuntime
from gateway.wire import json_text, openai_decisions, systemone
from gateway.wire import models as models_wire
from gateway.wire.errors import Flavor, error_body, validation_details
from gateway.wire.openai_chat import ChatRequest, as_event_stream

log = logging.getLogger("gateway.app")

SYSTEM_ONE_PATHS = ("/v1/systemone",)
OPENAI_PATHS = ("/v1/chat/completions", "/v1/decisions")


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    scopes: list[str] | None = Field(default=None, description="A subset of the caller's scopes (default: all of them).")
    models: list[str] | None = Field(default=None, description="A subset of the caller's models (default: the same).")
    ttl_s: int | None = Field(default=None, ge=60, le=12 * 3600, description="Lifetime in seconds (default 3600).")


# A record id, bare (System One's x_decision_id, the x-decision-id header) or as the
# OpenAI Decisions answer's `id` carries it (decision_<id>): both name the same record.
ID_PATTERN = r"^(decision_)?[0-9a-f]{24}$"


def record_id(decision_id: str) -> str:
    return decision_id.removeprefix("decision_")


class OutcomeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    answers: dict[str, Annotated[str, Field(max_length=1024)] | bool | int] = Field(
        min_length=1, max_length=MAX_QUESTIONS, description="Question name -> the true answer (or the override).")
    override: bool = Field(default=False, description="true: a person overrode the decision rather than observed the truth.")
    note: str | None = Field(default=None, max_length=500)


class RevokeRequest(BaseModel):
    """Exactly one of: the token, its id, or every token of the tenant minted until now."""

    model_config = ConfigDict(extra="forbid", strict=True)
    token: str | None = Field(default=None, min_length=1, max_length=4096, description="The token itself.")
    token_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$", description="The token's id (token_id when minted).")
    all_tokens: Literal[True] | None = Field(default=None, description="Refuse every token of the tenant minted until now.")

    @model_validator(mode="after")
    def _exactly_one(self) -> RevokeRequest:
        if sum(value is not None for value in (self.token, self.token_id, self.all_tokens)) != 1:
            raise ValueError("name exactly one of: token, token_id, all_tokens")
        return self


def flavor_of(path: str) -> Flavor | None:
    """The error shape of a path: System One, OpenAI, or None for both (models, unknown paths)."""
    path = route_path(path)
    if path in SYSTEM_ONE_PATHS or path in PUBLIC_PATHS:
        return "systemone"
    if path in OPENAI_PATHS:
        return "openai"
    return None


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(status_code=status, content_type="application/json", body=text, headers=headers or {})


def error_response(exc: GatewayError, path: str) -> Response:
    flavor = flavor_of(path)
    if flavor is not None:
        status, body, headers = error_body(exc, flavor)
        return json_response(status, body, headers)
    # /v1/models and unknown paths are called by both SDKs: one body with both keys.
    status, openai_body, headers = error_body(exc, "openai")
    _, systemone_body, _ = error_body(exc, "systemone")
    return json_response(status, {**openai_body, **systemone_body}, headers)


def check_outcome_answers(record: dict[str, Any], answers: dict[str, Any]) -> None:
    """An outcome names one of the options the question declared (its record lists them):
    true or false for a yes/no question, a level for a score, an option's value for a choice."""
    for question in record.get("questions", []):
        if question["name"] not in answers:
            continue
        value, options = answers[question["name"]], question.get("probabilities") or {}
        if question["kind"] == "noul":
            fits = isinstance(value, bool)
        elif question["kind"] == "score":
            fits = isinstance(value, int) and not isinstance(value, bool) and str(value) in options
        else:
            fits = not options or str(value) in options  # a refused question recorded no options
        if not fits:
            expected = "true or false" if question["kind"] == "noul" else "one of: " + ", ".join(list(options)[:10])
            raise InvalidRequest.at(["answers", question["name"]], f"not an answer this question allows ({expected})",
                                    "invalid_outcome")


def served_by(endpoint: str, attempts: int) -> dict[str, str]:
    """Transparency: which endpoint answered, after how many attempts."""
    return {"x-endpoint": endpoint, "x-attempts": str(attempts)}


def build_app(runtime: GatewayRuntime) -> APIGatewayRestResolver:
    app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=json_text.loads, strip_prefixes=[IAM_PREFIX])

    def caller(scope: str | None) -> Principal:
        principal = app.context.get("principal")  # found by the handler before the body was read
        if principal is None:
            raise Unauthenticated("missing credentials")
        if scope is not None and scope not in principal.scopes:
            raise Forbidden(f"this credential lacks the {scope!r} scope")
        app.append_context(tenant_id=principal.tenant_id)
        return principal

    def allowed(principal: Principal, model: str) -> None:
        # A model outside the credential's list does not exist for it.
        if not principal.may_use(model):
            raise NotFound(f"the model {model!r} does not exist; GET /v1/models lists the available models")

    @app.get("/health", summary="Liveness of the gateway function (no credentials needed)", tags=["Operations"])
    def health():
        return json_response(200, {"status": "ok"})

    @app.get("/v1/models", summary="Models and aliases, in the OpenAI and System One list shapes at once", tags=["Models"])
    def list_models():
        principal = caller(None)
        visible = [r for r in runtime.registry.routes if any(principal.may_use(n) for n in (r.name, *r.aliases))]
        return json_response(200, models_wire.render(visible))

    def decide(principal: Principal, decision: Decision, route: str) -> tuple[Outcome, str]:
        """Decide, then record: (the outcome, its decision id)."""
        allowed(principal, decision.model)
        started = time.perf_counter()
        tenant = runtime.tenants.get(principal.tenant_id) if runtime.tenants else None
        asked, outcome = runtime.decisions.decide(
            decision, counters(), tenant_id=principal.tenant_id, catalog_only=bool(tenant and tenant.catalog_only),
            limits=tenant.limits if tenant is not None else DEFAULT_LIMITS,
            may_override_policy=POLICY_OVERRIDE_SCOPE in principal.scopes, request_id=app.context.get("request_id", ""))
        decision_id = runtime.recorder.new_id() if runtime.recorder else ""
        if runtime.recorder:
            runtime.recorder.record(decision_id, principal=principal, route=route, request_id=app.context.get("request_id", ""),
                                    decision=asked, outcome=outcome, latency_ms=(time.perf_counter() - started) * 1000)
        return outcome, decision_id

    def decision_headers(outcome: Outcome, decision_id: str) -> dict[str, str]:
        return {**served_by(outcome.endpoint, outcome.attempts), "x-decision-id": decision_id}

    @app.post("/v1/systemone", summary="System One decision: a probability for every declared option", tags=["System One"])
    def decide_systemone(request: Annotated[systemone.SystemOneRequest, Body(embed=False)]):
        outcome, decision_id = decide(caller("decide"), request.to_decision(), "systemone")
        return json_response(200, systemone.render(outcome, decision_id), decision_headers(outcome, decision_id))

    @app.post("/v1/decisions", summary="OpenAI Decisions: predicates, choices and scores", tags=["OpenAI"])
    def decide_openai(request: Annotated[openai_decisions.DecisionsRequest, Body(embed=False)]):
        outcome, decision_id = decide(caller("decide"), request.to_decision(), "decisions")
        return json_response(200, openai_decisions.render(outcome, decision_id), decision_headers(outcome, decision_id))

    @app.post("/v1/decisions/<decision_id>/outcome", summary="Attach the true outcome, or a human override, to a decision",
              tags=["Records"])
    def attach_outcome(decision_id: Annotated[str, Path(pattern=ID_PATTERN)],
                       request: Annotated[OutcomeRequest, Body(embed=False)]):
        principal = caller("decide")
        record = records_store().get_record(principal.tenant_id, record_id(decision_id))
        if record is None:
            raise NotFound(f"no decision {decision_id!r}")
        names = {q["name"] for q in record.get("questions", [])}
        unknown = sorted(set(request.answers) - names)
        if unknown:
            raise InvalidRequest.at(["answers", unknown[0]], "this decision asked no such question", "unknown_question")
        check_outcome_answers(record, request.answers)
        outcome = {"answers": request.answers, "override": request.override, "note": request.note,
                   "recorded_at": time.time(), "recorded_by": principal.credential_id}
        records_store().set_outcome(principal.tenant_id, record_id(decision_id), outcome)
        return json_response(200, {"id": decision_id, "outcome": outcome})

    @app.get("/v1/records", summary="The tenant's decision records, newest first, with calibration drift per catalog entry",
             tags=["Records"])
    def list_records(catalog: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100):
        principal = caller("decide")
        found = records_store().list_records(principal.tenant_id, catalog=catalog, limit=limit)
        names = sorted({q["catalog"].split("@")[0] for r in found for q in r.get("questions", []) if q.get("catalog")})
        report = {}
        for name in names:
            fit = None
            if runtime.catalogs is not None:
                entry = runtime.catalogs.store.latest_catalog_version(principal.tenant_id, name)
                fitted = entry.entry().calibration.fit if entry is not None else None
                fit = fitted.model_dump() if fitted is not None else None
            since = [r for r in found if fit is None or r["created_at"] >= fit["fitted_at"]]
            report[name] = drift(since, name, fit)
        return json_response(200, {"records": found, "drift": report})

    @app.get("/v1/records/<decision_id>", summary="One decision record", tags=["Records"])
    def get_record(decision_id: Annotated[str, Path(pattern=ID_PATTERN)]):
        principal = caller("decide")
        record = records_store().get_record(principal.tenant_id, record_id(decision_id))
        if record is None:
            raise NotFound(f"no decision {decision_id!r}")
        return json_response(200, record)

    def records_store() -> Any:
        if runtime.recorder is None or runtime.recorder.store is None:
            raise NotFound("decision records are not configured on this gateway")
        return runtime.recorder.store

    def catalog_service() -> CatalogService:
        if runtime.catalogs is None:
            raise NotFound("catalogs are not configured on this gateway")
        return runtime.catalogs

    @app.get("/v1/catalogs", summary="The tenant's catalog entries (latest versions)", tags=["Catalogs"])
    def list_catalogs():
        principal = caller("catalogs:read")
        return json_response(200, {"catalogs": [v.as_dict() for v in catalog_service().list(principal.tenant_id)]})

    @app.get("/v1/catalogs/<name>", summary="A catalog entry, latest version", tags=["Catalogs"])
    def get_catalog(name: Annotated[str, Path(pattern=NAME_PATTERN)]):
        principal = caller("catalogs:read")
        return json_response(200, catalog_service().get(principal.tenant_id, name).as_dict())

    @app.put("/v1/catalogs/<name>", summary="Write a catalog entry: a new version when its content changed", tags=["Catalogs"])
    def put_catalog(name: Annotated[str, Path(pattern=NAME_PATTERN)], content: Annotated[CatalogContent, Body(embed=False)]):
        principal = caller("catalogs:write")
        version, created = catalog_service().put(principal.tenant_id, name, content)
        return json_response(201 if created else 200, {**version.as_dict(), "created": created})

    @app.get("/v1/catalogs/<name>/versions", summary="Every version of a catalog entry", tags=["Catalogs"])
    def list_versions(name: Annotated[str, Path(pattern=NAME_PATTERN)]):
        principal = caller("catalogs:read")
        return json_response(200, {"versions": [v.as_dict() for v in catalog_service().versions(principal.tenant_id, name)]})

    @app.get("/v1/catalogs/<name>/versions/<version>", summary="One version of a catalog entry", tags=["Catalogs"])
    def get_version(name: Annotated[str, Path(pattern=NAME_PATTERN)], version: Annotated[int, Path(ge=1, le=MAX_VERSION)]):
        principal = caller("catalogs:read")
        return json_response(200, catalog_service().get(principal.tenant_id, name, version).as_dict())

    @app.post("/v1/chat/completions", summary="OpenAI Chat Completions (a stream is buffered)", tags=["OpenAI"])
    def chat_completions(request: Annotated[ChatRequest, Body(embed=False)]):
        principal = caller("chat")
        allowed(principal, request.model)
        limits = runtime.tenants.limits(principal.tenant_id) if runtime.tenants else DEFAULT_LIMITS
        completion, invocation = runtime.decisions.chat(request.backend_body(), counters(), limits,
                                                        app.context.get("request_id", ""))
        headers = served_by(invocation.endpoint, invocation.attempts)
        if request.stream:
            text = as_event_stream(completion, request.include_usage())
            return Response(200, "text/event-stream", text, {"cache-control": "no-cache", **headers})
        return json_response(200, completion, headers)

    @app.post("/v1/tokens", summary="Mint a short-lived bearer token for the caller's tenant (SigV4 callers only)",
              tags=["Credentials"])
    def mint_token(request: Annotated[TokenRequest, Body(embed=False)]):
        principal = caller(None)
        if runtime.authenticator is None:
            raise Forbidden("token minting is not configured on this gateway")
        token, claims = runtime.authenticator.mint_token(principal, request.scopes, request.models, request.ttl_s)
        return json_response(201, {
            "token": token, "token_id": claims.token_id, "tenant_id": claims.tenant_id, "scopes": list(claims.scopes),
            "models": None if claims.models is None else list(claims.models), "expires_at": claims.expires_at,
            "expires_in": claims.expires_at - claims.issued_at,
        }, {"cache-control": "no-store"})

    @app.post("/v1/tokens/revoke", summary="Revoke a token of the caller's tenant (SigV4 callers, or the admin scope)",
              tags=["Credentials"])
    def revoke_token(request: Annotated[RevokeRequest, Body(embed=False)]):
        principal = caller(None)
        if not principal.iam and "admin" not in principal.scopes:
            raise Forbidden("revoking tokens needs IAM credentials (SigV4) or the 'admin' scope")
        if runtime.authenticator is None:
            raise Forbidden("tokens are not configured on this gateway")
        if request.all_tokens:
            not_before = runtime.authenticator.revoke_all_tokens(f"tenant:{principal.tenant_id}")
            return json_response(200, {"tenant_id": principal.tenant_id, "revoked": True, "not_before": not_before})
        token_id = runtime.authenticator.revoke_token(principal, token=request.token, token_id=request.token_id)
        return json_response(200, {"token_id": token_id, "revoked": True})

    @app.exception_handler(RequestValidationError)
    def invalid(exc: RequestValidationError) -> Response:
        return error_response(InvalidRequest(validation_details(exc.errors())), app.current_event.path)

    @app.exception_handler(GatewayError)
    def gateway_error(exc: GatewayError) -> Response:
        if exc.status >= 500:
            log.warning("request failed", extra={"status": exc.status, "error_type": exc.error_type})
        return error_response(exc, app.current_event.path)

    @app.not_found
    def not_found(exc: Exception) -> Response:
        return error_response(UnknownRoute("no such route; see the API reference"), app.current_event.path)

    @app.exception_handler(Exception)
    def unexpected(exc: Exception) -> Response:
        log.exception("unexpected error")
        return error_response(GatewayError("the gateway failed on this request"), app.current_event.path)

    return app
