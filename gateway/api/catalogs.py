"""A tenant's catalog entries: named, versioned questions with their policy and calibration."""

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.context import caller
from gateway.api.docs import UNSERVED, ResponseDocs
from gateway.api.responses import json_response
from gateway.catalogs.model import MAX_VERSION, NAME_PATTERN, CatalogContent
from gateway.catalogs.service import VERSIONS_PAGE, CatalogService
from gateway.errors import NotFound
from gateway.services.learning import LearningService
from gateway.wire import responses

Name = Annotated[str, Path(pattern=NAME_PATTERN)]
# A name, or nothing (from the first): the entries named after it.
AfterName = Annotated[str, Query(pattern=NAME_PATTERN.replace("^", "^$|^", 1),
                                 description="Only entries named after this (the last page's next_after)")]
PageLimit = Annotated[int, Query(ge=1, le=VERSIONS_PAGE, description="At most this many; a page also ends before 4 MB"
                                 " of content")]


class RefitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
    apply: bool | None = Field(default=None, description="true: write the adapter as a new version when it beats"
                               " the zero-shot answer (an enforcing entry moves only so); false: report the figures"
                               " only; absent: write it for an advisory entry, report only for an enforcing one.")


# PUT's two successes: the content is already the latest version (nothing written), or a new version.
WRITTEN = {200: (responses.CatalogWritten, "The content was already the latest version: nothing written"),
           201: (responses.CatalogWritten, "A new version")}


def router(service: CatalogService | None, learning: LearningService | None = None, doc: ResponseDocs = UNSERVED) -> Router:
    routes = Router()

    def catalogs() -> CatalogService:
        if service is None:
            raise NotFound("catalogs are not configured on this gateway")
        return service

    @routes.get("/v1/catalogs", summary="The tenant's catalog entries (latest versions), by name, a page at a time",
                tags=["Catalogs"], responses=doc(responses.CatalogList, "A page of entries, each its latest version;"
                                                 " next_after when there are more"))
    def list_catalogs(after: AfterName = "", limit: PageLimit = VERSIONS_PAGE):
        principal = caller(routes, "catalogs:read")
        found, next_after = catalogs().list(principal.tenant_id, after, limit)
        return json_response(200, {"catalogs": [v.as_dict() for v in found],
                                   **({"next_after": next_after} if next_after is not None else {})})

    @routes.get("/v1/catalogs/<name>", summary="A catalog entry, latest version", tags=["Catalogs"],
                responses=doc(responses.CatalogEntry, "The entry"))
    def get_catalog(name: Name):
        tenant_id = caller(routes, "catalogs:read").tenant_id
        return json_response(200, catalogs().get(tenant_id, name).as_dict())

    @routes.put("/v1/catalogs/<name>", summary="Write a catalog entry: a new version when its content changed",
                tags=["Catalogs"], responses=doc.each(WRITTEN))
    def put_catalog(name: Name, content: Annotated[CatalogContent, Body(embed=False)]):
        tenant_id = caller(routes, "catalogs:write").tenant_id
        version, created = catalogs().put(tenant_id, name, content)
        return json_response(201 if created else 200, {**version.as_dict(), "created": created})

    @routes.get("/v1/catalogs/<name>/versions", summary="The versions of a catalog entry, oldest first, a page at a time",
                tags=["Catalogs"], responses=doc(responses.VersionList, "A page of versions, oldest first; next_after when"
                                                 " there are more"))
    def list_versions(name: Name,
                      after: Annotated[int, Query(ge=0, le=MAX_VERSION, description="Only versions numbered above"
                                                  " this (the last page's next_after)")] = 0,
                      limit: PageLimit = VERSIONS_PAGE):
        tenant_id = caller(routes, "catalogs:read").tenant_id
        found, next_after = catalogs().versions(tenant_id, name, after, limit)
        return json_response(200, {"versions": [v.as_dict() for v in found],
                                   **({"next_after": next_after} if next_after is not None else {})})

    @routes.get("/v1/catalogs/<name>/versions/<version>", summary="One version of a catalog entry", tags=["Catalogs"],
                responses=doc(responses.CatalogEntry, "The version"))
    def get_version(name: Name, version: Annotated[int, Path(ge=1, le=MAX_VERSION)]):
        tenant_id = caller(routes, "catalogs:read").tenant_id
        return json_response(200, catalogs().get(tenant_id, name, version).as_dict())

    @routes.post("/v1/catalogs/<name>/refit", tags=["Catalogs"],
                 summary="Fit the entry's adapter on its records' training outcomes; a new version when it beats"
                         " the calibrated zero-shot answer out of fold",
                 responses=doc(responses.RefitReply, "The refit's figures, and the new version when one was written"))
    def refit(name: Name, request: Annotated[RefitRequest, Body(embed=False)]):
        principal = caller(routes, "catalogs:write")
        if learning is None:
            raise NotFound("catalogs are not configured on this gateway")
        return json_response(200, learning.refit(principal.tenant_id, name, request.apply))

    return routes
