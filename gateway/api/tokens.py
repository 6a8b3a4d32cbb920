"""Short-lived bearer tokens: minted by SigV4 callers, revoked by them or an admin key."""

from typing import Annotated, Any, Literal, Self

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.api.context import caller
from gateway.api.docs import UNSERVED, ResponseDocs
from gateway.api.responses import json_response
from gateway.auth.authenticate import Authenticator
from gateway.auth.tokens import TokenClaims
from gateway.errors import Forbidden
from gateway.wire import responses


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
    scopes: list[str] | None = Field(default=None, description="A subset of the caller's scopes (default: all of them).")
    models: list[str] | None = Field(default=None, description="A subset of the caller's models (default: the same).")
    ttl_s: int | None = Field(default=None, ge=60, le=12 * 3600, description="Lifetime in seconds (default 3600).")


class RevokeRequest(BaseModel):
    """Exactly one of: the token, its id, or every token of the tenant minted until now."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
    token: str | None = Field(default=None, min_length=1, max_length=4096, description="The token itself.")
    token_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$", description="The token's id (token_id when minted).")
    all_tokens: Literal[True] | None = Field(default=None, description="Refuse every token of the tenant minted until now.")

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if sum(value is not None for value in (self.token, self.token_id, self.all_tokens)) != 1:
            raise ValueError("name exactly one of: token, token_id, all_tokens")
        return self


def router(authenticator: Authenticator | None, doc: ResponseDocs = UNSERVED) -> Router:
    routes = Router()

    @routes.post("/v1/tokens", summary="Mint a short-lived bearer token for the caller's tenant (SigV4 callers only)",
                 tags=["Credentials"], responses=doc(responses.MintedToken, "The token (shown once)", 201))
    def mint_token(request: Annotated[TokenRequest, Body(embed=False)]):
        principal = caller(routes, None)
        if authenticator is None:
            raise Forbidden("token minting is not configured on this gateway")
        token, claims = authenticator.mint_token(principal, request.scopes, request.models, request.ttl_s)
        return json_response(201, minted(token, claims), {"cache-control": "no-store"})

    @routes.post("/v1/tokens/revoke", summary="Revoke a token of the caller's tenant (SigV4 callers, or the admin scope)",
                 tags=["Credentials"], responses=doc(responses.Revoked, "Revoked"))
    def revoke_token(request: Annotated[RevokeRequest, Body(embed=False)]):
        principal = caller(routes, None)
        if not principal.iam and "admin" not in principal.scopes:
            raise Forbidden("revoking tokens needs IAM credentials (SigV4) or the 'admin' scope")
        if authenticator is None:
            raise Forbidden("tokens are not configured on this gateway")
        if request.all_tokens:
            not_before = authenticator.revoke_all_tokens(f"tenant:{principal.tenant_id}")
            return json_response(200, {"tenant_id": principal.tenant_id, "revoked": True, "not_before": not_before})
        token_id = authenticator.revoke_token(principal, token=request.token, token_id=request.token_id)
        return json_response(200, {"token_id": token_id, "revoked": True})

    return routes


def minted(token: str, claims: TokenClaims) -> dict[str, Any]:
    return {"token": token, "token_id": claims.token_id, "tenant_id": claims.tenant_id, "scopes": list(claims.scopes),
            "models": None if claims.models is None else list(claims.models), "expires_at": claims.expires_at,
            "expires_in": claims.expires_at - claims.issued_at}
