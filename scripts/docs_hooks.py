"""MkDocs hooks (mkdocs.yml `hooks:`): the API reference is rendered at build time from the
OpenAPI document the gateway serves (scripts/openapi_doc.py), never from a committed copy.

- `docs/reference/api.md` holds the marker below; the hook replaces it with the rendered
  operations and schemas;
- the document itself is added to the site as `reference/openapi.json`, so the page can
  link to it and a strict build checks that link like any other.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import openapi_doc  # beside this file

MARKER = "<!-- openapi: the operations and schemas are rendered here at build time -->"
DOCUMENT_PATH = "reference/openapi.json"
_document: dict[str, Any] | None = None


def _served() -> dict[str, Any]:
    global _document
    if _document is None:
        _document = openapi_doc.document()
    return _document


def on_pre_build(config: Any) -> None:
    global _document
    _document = None  # a fresh document on every build (mkdocs serve rebuilds in one process)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, DOCUMENT_PATH, content=json.dumps(_served(), indent=2) + "\n"))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, openapi_doc.markdown(_served()))
