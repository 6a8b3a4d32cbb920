"""Decision records: the true outcome attached later, one record, the list with drift."""

from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from gateway.api.context import caller
from gateway.api.docs import UNSERVED, ResponseDocs
from gateway.api.responses import json_response
from gateway.catalogs.model import NAME_PATTERN, OutcomeSource
from gateway.decisions.model import MAX_QUESTIONS
from gateway.services.records import CURSOR_PATTERN, ID_PATTERN, RecordsService
from gateway.wire import responses


class OutcomeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
    answers: dict[str, Annotated[str, Field(max_length=1024)] | bool | int] = Field(
        min_length=1, max_length=MAX_QUESTIONS, description="Question name -> the true answer (or the override).")
    override: bool = Field(default=False, description="true: a person overrode the decision rather than observed the truth.")
    note: str | None = Field(default=None, max_length=500)
    source: OutcomeSource | None = Field(
        default=None, description="Where the truth came from: review (a person), audit (a sampled check) or downstream"
        " (the system that learned it). With a source the outcome trains the catalog entries' adapters, which needs"
        " the outcomes:train scope; without one it counts for drift only.")


def router(service: RecordsService, doc: ResponseDocs = UNSERVED) -> Router:
    routes = Router()

    @routes.post("/v1/decisions/<decision_id>/outcome", tags=["Records"],
                 summary="Attach the true outcome, or a human override, to a decision",
                 responses=doc(responses.OutcomeReply, "The outcome as stored"))
    def attach_outcome(decision_id: Annotated[str, Path(pattern=ID_PATTERN)],
                       request: Annotated[OutcomeRequest, Body(embed=False)]):
        outcome = service.attach_outcome(caller(routes, "decide"), decision_id, request.answers,
                                         override=request.override, note=request.note, source=request.source)
        return json_response(200, {"id": decision_id, "outcome": outcome})

    @routes.get("/v1/records", tags=["Records"],
                summary="The tenant's decision records, newest first, a page at a time, with calibration drift per"
                        " catalog entry",
                responses=doc(responses.RecordList, "Records and drift; next_cursor when more records follow"))
    def list_records(catalog: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
                     limit: Annotated[int, Query(ge=1, le=1000, description="At most this many records; a page"
                                                 " can hold fewer, to fit one response")] = 100,
                     cursor: Annotated[str | None, Query(pattern=CURSOR_PATTERN,
                                                         description="The previous page's next_cursor")] = None):
        return json_response(200, service.list_with_drift(caller(routes, "decide"), catalog=catalog, limit=limit,
                                                          cursor=cursor))

    @routes.get("/v1/records/<decision_id>", summary="One decision record", tags=["Records"],
                responses=doc(responses.DecisionRecord, "The record, with its outcome once attached"))
    def get_record(decision_id: Annotated[str, Path(pattern=ID_PATTERN)]):
        return json_response(200, service.get(caller(routes, "decide"), decision_id))

    return routes
