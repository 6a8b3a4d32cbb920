"""Reading a batch's input file: its lines, or why the file is refused (OpenAI's `errors` list).

A file is refused whole when it is not a batch of this endpoint: a line that is not a JSON
object, a line without `custom_id`, `method` POST, `url` or a `body` object, a `custom_id`
used twice, a line for another endpoint, a line asking to stream, two models, more than
MAX_LINES lines, or no line at all. A line whose body is a JSON object but not a valid
request is not the file's fault: it runs, and its route refuses it (its status and error in
the error file), as the synchronous route would.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from gateway.batches.model import MAX_CUSTOM_ID_CHARS, MAX_LINES

MAX_ERRORS = 100  # the errors a refused file reports (its first ones); one is enough to fix it, most are many


class InputErrors:
    """OpenAI's BatchError items, the first MAX_ERRORS of them."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.count = 0

    def add(self, code: str, message: str, line: int | None = None, param: str | None = None) -> None:
        self.count += 1
        if len(self.items) < MAX_ERRORS:
            self.items.append({"code": code, "message": message, "param": param, "line": line})


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The file's lines (without their ending), from its bytes in pieces of any size."""
    rest = b""
    for chunk in chunks:
        rest += chunk
        *whole, rest = rest.split(b"\n")
        yield from (line.removesuffix(b"\r") for line in whole)
    if rest.strip():
        yield rest.removesuffix(b"\r")


def read_input(chunks: Iterable[bytes], endpoint: str) -> tuple[list[tuple[str, str]], str | None, InputErrors]:
    """The lines (custom_id, body as JSON text), the model they name, and the errors: a file
    with any error is refused whole. Line numbers in errors count from 1, as editors do."""
    errors = InputErrors()
    lines: list[tuple[str, str]] = []
    seen: set[str] = set()
    models: set[str] = set()
    for number, raw in enumerate(split_lines(chunks), start=1):
        if not raw.strip():
            continue  # a blank line (a trailing newline, say) is no request
        if len(lines) >= MAX_LINES:
            errors.add("too_many_requests", f"a batch holds at most {MAX_LINES} requests; split the file", number)
            break
        parsed = _request(raw, number, endpoint, errors)
        if parsed is None:
            continue
        custom_id, body, text = parsed
        if custom_id in seen:
            errors.add("duplicate_custom_id", f"custom_id {custom_id!r} is used by an earlier line; each must be unique",
                       number, "custom_id")
            continue
        seen.add(custom_id)
        if isinstance(body.get("model"), str):
            models.add(body["model"])
        lines.append((custom_id, text))
    if not lines and not errors.count:
        errors.add("empty_file", "the file has no requests")
    if len(models) > 1:
        errors.add("mismatched_model", f"a batch runs one model; this file names {len(models)}: {sorted(models)[:5]}",
                   param="body.model")
    return lines, (next(iter(models)) if len(models) == 1 else None), errors


def _request(raw: bytes, number: int, endpoint: str, errors: InputErrors) -> tuple[str, dict[str, Any], str] | None:
    """One line's custom_id, body and body as JSON text, or None with its error added."""
    try:
        line = json.loads(raw)
        # Text that UTF-8 cannot hold (a lone surrogate, "\ud800") is no request's: refused here,
        # not by the ledger's store when it is written.
        text = json.dumps(line.get("body") if isinstance(line, dict) else None, ensure_ascii=False,
                          separators=(",", ":"))
        text.encode("utf-8")
        if isinstance(line, dict) and isinstance(line.get("custom_id"), str):
            line["custom_id"].encode("utf-8")
    except (ValueError, UnicodeError, RecursionError):  # a line nested past the parser's depth included
        errors.add("invalid_json_line", "this line is not JSON (a batch file is JSONL: one JSON object a line)", number)
        return None
    if not isinstance(line, dict):
        errors.add("invalid_json_line", "this line is not a JSON object", number)
        return None
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID_CHARS:
        errors.add("invalid_custom_id", f"custom_id must be a string of 1 to {MAX_CUSTOM_ID_CHARS} characters",
                   number, "custom_id")
        return None
    if line.get("method") != "POST":
        errors.add("invalid_method", "method must be POST", number, "method")
        return None
    if line.get("url") != endpoint:
        errors.add("mismatched_endpoint", f"url {line.get('url')!r} is not this batch's endpoint {endpoint!r}",
                   number, "url")
        return None
    body = line.get("body")
    if not isinstance(body, dict):
        errors.add("invalid_body", "body must be a JSON object: the request as its route takes it", number, "body")
        return None
    if body.get("stream") not in (None, False):
        errors.add("streaming_unsupported", "a batch line cannot stream; leave out stream", number, "body.stream")
        return None
    return custom_id, body, text


def first_model(chunks: Iterator[bytes]) -> str | None:
    """The model the file's first request names (None: it names none, or is not JSON), read no
    further than that line."""
    try:
        for raw in split_lines(chunks):
            if raw.strip():
                try:
                    body = json.loads(raw).get("body")
                except (ValueError, UnicodeError, AttributeError, RecursionError):
                    return None
                model = body.get("model") if isinstance(body, dict) else None
                return model if isinstance(model, str) else None
        return None
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
