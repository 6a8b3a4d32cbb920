"""OpenAI's Files, Uploads and Batch APIs, so that the SDK's `client.files`, `client.uploads` and
`client.batches` work unchanged (`gateway.services.batches`).

`POST /v1/files` and an upload's parts come as multipart/form-data: the handler leaves such a
body as the bytes API Gateway sent (`gateway.functions.handler.prepare_event`), and it is read
here. A file's content is sent as it is read on the streaming integration (a batch's output
can be larger than a buffered Lambda response's 6 MB), whole on the buffered one, up to what
that carries.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from typing import Annotated
from urllib.parse import quote

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from pydantic import ValidationError

from gateway.api.context import caller, streaming
from gateway.api.docs import UNSERVED, ResponseDocs
from gateway.api.responses import json_response
from gateway.errors import InvalidParameters, PayloadTooLarge
from gateway.services.batches import BATCH_LIST_LIMIT, FILE_LIST_LIMIT, BatchService, FileService
from gateway.settings import MAX_BODY_BYTES
from gateway.wire import responses
from gateway.wire.batches import BatchCreate, ExpiresAfter, FormField, UploadComplete, UploadCreate, form_fields

ID = r"^[A-Za-z0-9_-]{1,128}$"
# A file's bytes as they were stored: never "application/json..." (Powertools would serialize the body).
CONTENT_TYPE = "application/octet-stream"
# What a buffered response carries of a file: Lambda's 6 MB response holds the body base64-encoded
# (4 bytes for 3) beside the headers; the streaming integration has no such bound.
MAX_BUFFERED_BYTES = MAX_BODY_BYTES


def router(files: FileService, batches: BatchService, doc: ResponseDocs = UNSERVED) -> Router:
    routes = Router()
    _file_routes(routes, files, doc)
    _upload_routes(routes, files, doc)
    _batch_routes(routes, batches, doc)
    return routes


def _file_routes(routes: Router, files: FileService, doc: ResponseDocs) -> None:
    @routes.post("/v1/files", summary="Upload a batch input file (multipart: file, purpose=batch)", tags=["Batches"],
                 responses=doc(responses.FileObject, "The file"))
    def create_file():
        fields = form_fields(routes.current_event.headers.get("content-type", ""), _raw_body(routes))
        upload, purpose = fields.get("file"), fields.get("purpose")
        if upload is None or purpose is None:
            raise InvalidParameters.at(["file" if upload is None else "purpose"], "a multipart field is missing",
                                       "missing")
        file = files.create(caller(routes, None), upload.filename or "upload.jsonl", _text(purpose.data),
                            upload.data, ttl_s=_form_expiry(fields))
        return json_response(200, file.as_openai())

    @routes.get("/v1/files", summary="The tenant's files, a page at a time", tags=["Batches"],
                 responses=doc(responses.FilePage, "A page of files"))
    def list_files(purpose: Annotated[str | None, Query(max_length=64)] = None,
                   after: Annotated[str | None, Query(pattern=ID)] = None,
                   limit: Annotated[int, Query(ge=1, le=FILE_LIST_LIMIT)] = FILE_LIST_LIMIT,
                   order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc"):
        return json_response(200, files.list(caller(routes, None), purpose, after, limit, order))

    @routes.get("/v1/files/<file_id>", summary="One file", tags=["Batches"],
                 responses=doc(responses.FileObject, "The file"))
    def get_file(file_id: Annotated[str, Path(pattern=ID)]):
        return json_response(200, files.get(caller(routes, None), file_id).as_openai())

    @routes.delete("/v1/files/<file_id>", summary="Delete a file", tags=["Batches"],
                 responses=doc(responses.FileDeleted, "The file is deleted"))
    def delete_file(file_id: Annotated[str, Path(pattern=ID)]):
        return json_response(200, files.delete(caller(routes, None), file_id))

    @routes.get("/v1/files/<file_id>/content", summary="A file's bytes (a batch's output: JSONL)", tags=["Batches"],
                responses=doc.text(CONTENT_TYPE, "The file's bytes, as uploaded or as the batch wrote them"))
    def file_content(file_id: Annotated[str, Path(pattern=ID)]):
        file, chunks = files.content(caller(routes, None), file_id)
        headers = {"content-disposition": attachment(file.filename)}
        if streaming(routes):
            return Response(200, CONTENT_TYPE, chunks, headers)
        with contextlib.closing(chunks):
            if file.bytes > MAX_BUFFERED_BYTES:
                raise PayloadTooLarge(f"this file has {file.bytes} bytes, more than a buffered response carries"
                                      f" ({MAX_BUFFERED_BYTES}); it is served on the streaming integration")
            return Response(200, CONTENT_TYPE, b"".join(chunks), headers)


def _upload_routes(routes: Router, files: FileService, doc: ResponseDocs) -> None:
    @routes.post("/v1/uploads", summary="Start an upload of a file in parts", tags=["Batches"],
                 responses=doc(responses.UploadObject, "The upload, pending"))
    def create_upload(request: Annotated[UploadCreate, Body(embed=False)]):
        upload = files.create_upload(caller(routes, None), request.filename, request.purpose, request.bytes,
                                     request.mime_type, ttl_s=request.expires_after.seconds if request.expires_after
                                     else None)
        return json_response(200, upload.as_openai())

    @routes.post("/v1/uploads/<upload_id>/parts", summary="Add a part (multipart: data)", tags=["Batches"],
                 responses=doc(responses.UploadPartObject, "The part"))
    def add_part(upload_id: Annotated[str, Path(pattern=ID)]):
        fields = form_fields(routes.current_event.headers.get("content-type", ""), _raw_body(routes))
        if "data" not in fields:
            raise InvalidParameters.at(["data"], "a multipart field is missing", "missing")
        return json_response(200, files.add_part(caller(routes, None), upload_id, fields["data"].data).as_openai())

    @routes.post("/v1/uploads/<upload_id>/complete", summary="Assemble the parts into a file", tags=["Batches"],
                 responses=doc(responses.UploadObject, "The upload, completed, with its file"))
    def complete_upload(upload_id: Annotated[str, Path(pattern=ID)],
                        request: Annotated[UploadComplete, Body(embed=False)]):
        upload, file = files.complete(caller(routes, None), upload_id, request.part_ids, request.md5)
        return json_response(200, upload.as_openai(file))

    @routes.post("/v1/uploads/<upload_id>/cancel", summary="Cancel an upload", tags=["Batches"],
                 responses=doc(responses.UploadObject, "The upload, cancelled"))
    def cancel_upload(upload_id: Annotated[str, Path(pattern=ID)]):
        return json_response(200, files.cancel_upload(caller(routes, None), upload_id).as_openai())


def _batch_routes(routes: Router, batches: BatchService, doc: ResponseDocs) -> None:
    @routes.post("/v1/batches", summary="Create a batch from an uploaded file", tags=["Batches"],
                 responses=doc(responses.BatchObject, "The batch, validating"))
    def create_batch(request: Annotated[BatchCreate, Body(embed=False)]):
        expires = request.output_expires_after.seconds if request.output_expires_after is not None else None
        batch = batches.create(caller(routes, None), request.input_file_id, request.endpoint,
                               request.completion_window, request.metadata, expires)
        return json_response(200, batch.as_openai())

    @routes.get("/v1/batches", summary="The tenant's batches, newest first, a page at a time", tags=["Batches"],
                 responses=doc(responses.BatchPage, "A page of batches"))
    def list_batches(after: Annotated[str | None, Query(pattern=ID)] = None,
                     limit: Annotated[int, Query(ge=1, le=BATCH_LIST_LIMIT)] = 20):
        return json_response(200, batches.list(caller(routes, None), after, limit))

    @routes.get("/v1/batches/<batch_id>", summary="One batch", tags=["Batches"],
                 responses=doc(responses.BatchObject, "The batch"))
    def get_batch(batch_id: Annotated[str, Path(pattern=ID)]):
        return json_response(200, batches.get(caller(routes, None), batch_id).as_openai())

    @routes.post("/v1/batches/<batch_id>/cancel", summary="Cancel a batch (what finished is kept)", tags=["Batches"],
                 responses=doc(responses.BatchObject, "The batch, cancelling"))
    def cancel_batch(batch_id: Annotated[str, Path(pattern=ID)]):
        return json_response(200, batches.cancel(caller(routes, None), batch_id).as_openai())


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace").strip()


def _form_expiry(fields: dict[str, FormField]) -> float | None:
    """OpenAI's `expires_after` as the SDK sends it in a form (`expires_after[anchor]`,
    `expires_after[seconds]`): the seconds a file is kept, or None (the default)."""
    anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    try:
        expiry = ExpiresAfter(anchor=_text(anchor.data) if anchor else "", seconds=_text(seconds.data) if seconds else "")
    except ValidationError:
        raise InvalidParameters.at(["expires_after"], "expires_after is {anchor: created_at, seconds: 3600 to 2592000}",
                                   "value_error") from None
    return float(expiry.seconds)


def attachment(filename: str) -> str:
    """A Content-Disposition naming a download: an ASCII name, and the name itself encoded (RFC 6266)."""
    ascii_name = "".join(c if c.isascii() and c.isprintable() and c not in '"\\;' else "_" for c in filename)
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename, safe='')}"


def _raw_body(routes: Router) -> bytes:
    event = routes.current_event
    body = event.body or ""
    if not event.is_base64_encoded:
        return body.encode("utf-8", "surrogateescape")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParameters.at([], "the body is not valid base64", "body_encoding") from None

