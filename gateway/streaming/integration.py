"""A response as the streaming integration carries it: Lambda's HTTP integration stream.

A function invoked with InvokeWithResponseStream behind an HTTP integration (API Gateway's
REST API with `responseTransferMode: STREAM`, or a function URL) sends its response as
one byte stream of content type `application/vnd.awslambda.http-integration-response`: a
JSON prelude with the status and headers, eight NUL bytes, then the body, which API
Gateway passes on as it arrives. The same bytes are what the runtime loop
(`gateway.functions.runtime_loop`) posts to the Lambda Runtime API, and what the local runner
(`devkit.local`) reads back, so both run one code path.
"""

from __future__ import annotations

import base64
import json
from typing import Any

CONTENT_TYPE = "application/vnd.awslambda.http-integration-response"
DELIMITER = b"\x00" * 8
# The local runner's bound on a prelude (API Gateway reads it from the stream's first bytes,
# with a limit of its own that AWS's documentation does not state): a gateway prelude is a
# status and a few headers, well under it.
MAX_PRELUDE_BYTES = 16 * 1024


class BadPrelude(ValueError):
    pass


def prelude(result: dict[str, Any]) -> bytes:
    """A proxy result's status and headers as the stream's prelude (its body follows the delimiter)."""
    headers = {str(k): str(v) for k, v in (result.get("headers") or {}).items()}
    multi = {str(k): [str(v) for v in values] for k, values in (result.get("multiValueHeaders") or {}).items()}
    meta = {"statusCode": int(result.get("statusCode", 500)), "headers": headers, "multiValueHeaders": multi,
            "cookies": []}
    return json.dumps(meta, separators=(",", ":")).encode() + DELIMITER


def whole_body(result: dict[str, Any]) -> bytes:
    body = result.get("body") or ""
    return base64.b64decode(body) if result.get("isBase64Encoded") else body.encode()


def read_prelude(head: bytes) -> tuple[dict[str, Any], bytes] | None:
    """(The prelude, the body bytes after it) once `head` holds the delimiter; None before.
    Raises BadPrelude when the stream cannot be a response (no delimiter within the bound,
    or metadata that is not a status and headers)."""
    end = head.find(DELIMITER)
    if end < 0:
        if len(head) > MAX_PRELUDE_BYTES:
            raise BadPrelude(f"no prelude within the first {MAX_PRELUDE_BYTES} bytes")
        return None
    try:
        meta = json.loads(head[:end])
    except ValueError:
        raise BadPrelude("the prelude is not JSON") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("statusCode"), int):
        raise BadPrelude("the prelude has no statusCode")
    return meta, head[end + len(DELIMITER):]


def header_list(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """The prelude's headers as HTTP header lines (multi-value ones repeated)."""
    lines = [(k, str(v)) for k, v in (meta.get("headers") or {}).items()]
    for name, values in (meta.get("multiValueHeaders") or {}).items():
        lines.extend((name, str(v)) for v in values)
    lines.extend(("Set-Cookie", str(c)) for c in meta.get("cookies") or [])
    return lines
