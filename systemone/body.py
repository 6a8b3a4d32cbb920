"""The bounded body reader: Content-Encoding undone with a limit on what it inflates to
(a small compressed body cannot become a large one), then UTF-8 and JSON (`json_text`).

Each refusal is a `BodyRefused` with the status a caller gets (413, 415 or 422) and,
for a 422, the detail's type; each side raises it as its own error type.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from systemone import json_text


class BodyRefused(Exception):
    def __init__(self, status: int, message: str, kind: str = "value_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """Undo Content-Encoding, refusing anything that inflates past `limit` bytes."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return data
    too_large = BodyRefused(413, f"the decompressed body is larger than {limit} bytes")
    if encoding == "gzip":
        try:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = inflater.decompress(data, limit + 1)
        except zlib.error:
            raise BodyRefused(422, "the body is not valid gzip data", "decompression_error") from None
        if len(out) > limit or inflater.unconsumed_tail:
            raise too_large
        if not inflater.eof:
            raise BodyRefused(422, "the gzip body is truncated", "decompression_error")
        return out
    if encoding == "zstd":
        import zstandard

        try:
            out = zstandard.ZstdDecompressor().stream_reader(data).read(limit + 1)
            if len(out) > limit:
                raise too_large
            # Within the limit, so decoding it again is bounded: only a whole frame is a body.
            inflater = zstandard.ZstdDecompressor().decompressobj()
            inflater.decompress(data)
        except zstandard.ZstdError:
            raise BodyRefused(422, "the body is not valid zstd data", "decompression_error") from None
        if not inflater.eof:
            raise BodyRefused(422, "the zstd body is truncated", "decompression_error")
        return out
    raise BodyRefused(415, f"Content-Encoding {encoding!r} is not supported (use gzip or zstd)")


def decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyRefused(422, "the body is not UTF-8 text", "json_invalid") from None


def read_json(raw: bytes, encoding: str, limit: int) -> Any:
    """A body as the JSON value it holds, or BodyRefused."""
    text = decode(inflate(raw, encoding, limit))
    if not text.strip():
        raise BodyRefused(422, "the body is empty; a JSON object is required", "missing")
    try:
        return json_text.loads(text)
    except json.JSONDecodeError as exc:
        raise BodyRefused(422, f"the body is not valid JSON: {exc.msg}", "json_invalid") from None
