"""The bounded body reader: Content-Encoding undone with a limit on what it inflates to
(a small compressed body cannot become a large one), then UTF-8 and JSON (`json_text`).

Each refusal is the error a caller gets, the same on both sides: PayloadTooLarge (413),
UnsupportedMedia (415) or InvalidRequest (422, with the detail's type).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from systemone import json_text
from systemone.errors import InvalidRequest, PayloadTooLarge, UnsupportedMedia


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """Undo Content-Encoding, refusing anything that inflates past `limit` bytes."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return data
    too_large = PayloadTooLarge(f"the decompressed body is larger than {limit} bytes")
    if encoding == "gzip":
        try:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = inflater.decompress(data, limit + 1)
        except zlib.error:
            raise InvalidRequest.at([], "the body is not valid gzip data", "decompression_error") from None
        if len(out) > limit or inflater.unconsumed_tail:
            raise too_large
        if not inflater.eof:
            raise InvalidRequest.at([], "the gzip body is truncated", "decompression_error")
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
            raise InvalidRequest.at([], "the body is not valid zstd data", "decompression_error") from None
        if not inflater.eof:
            raise InvalidRequest.at([], "the zstd body is truncated", "decompression_error")
        return out
    raise UnsupportedMedia(f"Content-Encoding {encoding!r} is not supported (use gzip or zstd)")


def decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest.at([], "the body is not UTF-8 text", "json_invalid") from None


def read_json(raw: bytes, encoding: str, limit: int) -> Any:
    """A body as the JSON value it holds, or the error the caller gets."""
    text = decode(inflate(raw, encoding, limit))
    if not text.strip():
        raise InvalidRequest.at([], "the body is empty; a JSON object is required", "missing")
    try:
        return json_text.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest.at([], f"the body is not valid JSON: {exc.msg}", "json_invalid") from None
