"""OpenAI's Files, Uploads and Batch APIs: the JSON bodies they take (the objects they answer
are `gateway.batches.model`'s `as_openai()`), and the multipart form `POST /v1/files` and an
upload's parts arrive in."""

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.batches.model import MAX_UPLOAD_PARTS
from gateway.errors import InvalidParameters


class _Body(BaseModel):
    # Unknown fields are ignored, as OpenAI's API does: newer SDKs send fields older servers lack.
    model_config = ConfigDict(extra="ignore", defer_build=True)


class ExpiresAfter(_Body):
    """OpenAI's expires_after, of a file or a batch's output: seconds after its creation."""

    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=2_592_000)


class BatchCreate(_Body):
    input_file_id: str = Field(min_length=1, max_length=128)
    endpoint: str = Field(min_length=1, max_length=64)
    completion_window: str = Field(min_length=1, max_length=16)
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


class UploadCreate(_Body):
    bytes: int = Field(ge=1)
    filename: str = Field(min_length=1, max_length=1024)
    mime_type: str = Field(min_length=1, max_length=255)
    purpose: Literal["batch"] = Field(description="The only purpose this API keeps: batch input files.")
    expires_after: ExpiresAfter | None = None  # how long the file it makes is kept


class UploadComplete(_Body):
    part_ids: list[str] = Field(min_length=1, max_length=MAX_UPLOAD_PARTS)
    md5: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{32}$")


class FormField:
    """One field of a multipart/form-data body: its value, and its file name when it is a file."""

    __slots__ = ("data", "filename")

    def __init__(self, data: bytes, filename: str | None) -> None:
        self.data = data
        self.filename = filename


def form_fields(content_type: str, body: bytes) -> dict[str, FormField]:
    """The fields of a multipart/form-data body (RFC 7578), by name; InvalidParameters when it is not one."""
    kind, _, parameters = content_type.partition(";")
    boundary = next((value.strip().strip('"') for name, _, value in
                     (p.strip().partition("=") for p in parameters.split(";")) if name.lower() == "boundary"), "")
    if kind.strip().lower() != "multipart/form-data" or not boundary:
        raise InvalidParameters.at([], "send multipart/form-data with a boundary (the OpenAI SDK does)", "content_type")
    delimiter = b"--" + boundary.encode("latin-1")
    fields: dict[str, FormField] = {}
    sections = body.split(b"\r\n" + delimiter)
    if not sections[0].startswith(delimiter):
        raise InvalidParameters.at([], "the multipart body does not start with its boundary", "multipart")
    sections[0] = sections[0][len(delimiter):]
    for section in sections:
        if section.startswith(b"--"):
            break  # the closing delimiter
        head, found, data = section.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not found:
            raise InvalidParameters.at([], "a multipart section has no header end", "multipart")
        name, filename = _disposition(head.decode("utf-8", "replace"))
        if name:
            fields[name] = FormField(data, filename)
    return fields


_PARAMETER = re.compile(r';\s*([A-Za-z0-9_.*-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')


def _disposition(head: str) -> tuple[str | None, str | None]:
    """The field name and file name of a section's Content-Disposition (quoted strings read as
    RFC 7578 and HTML write them: a quote inside escaped, or sent as %22)."""
    for line in head.split("\r\n"):
        header, _, value = line.partition(":")
        if header.strip().lower() != "content-disposition":
            continue
        values = {}
        for key, raw in _PARAMETER.findall(value):
            text = raw.strip()
            if text.startswith('"') and text.endswith('"') and len(text) >= 2:
                text = re.sub(r"\\(.)", r"\1", text[1:-1]).replace("%22", '"')
            values[key.lower()] = text
        return values.get("name"), values.get("filename")
    return None, None
