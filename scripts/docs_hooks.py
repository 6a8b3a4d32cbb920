"""MkDocs hooks (mkdocs.yml `hooks:`): the API reference is rendered at build time from the
OpenAPI document the gateway serves (scripts/openapi_doc.py), never from a committed copy.

- `docs/reference/api.md` holds the marker below; the hook replaces it with the rendered
  operations and schemas;
- the document itself is added to the site as `reference/openapi.json`, so the page can
  link to it and a strict build checks that link like any other.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import openapi_doc  # beside this file

MARKER = "<!-- openapi: the operations and schemas are rendered here at build time -->"
DOCUMENT_PATH = "reference/openapi.json"
# A page shows an operation's recorded answer where it holds this marker.
ANSWER = re.compile(r"<!-- example-answer: ([A-Z]+ [^ ]+) -->")
# One request and answer per operation, from a run against the local stack (make api-examples).
EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "reference" / "examples.json"
_document: dict[str, Any] | None = None


def _served() -> dict[str, Any]:
    global _document
    if _document is None:
        openapi_doc.quiet()
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
    examples = json.loads(EXAMPLES.read_text()) if EXAMPLES.exists() else None
    markdown = re.sub(ANSWER, lambda m: recorded_answer(examples, m.group(1)), markdown)
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, openapi_doc.markdown(_served(), examples))


def recorded_answer(examples: dict[str, Any] | None, operation: str) -> str:
    """An operation's recorded answer, as a JSON block that says which run wrote it."""
    found = [e for e in (examples or {}).get("examples", []) if e["operation"] == operation]
    if not found:
        raise LookupError(f"no recorded example of {operation} in {EXAMPLES.name}: run make api-examples")
    response = found[0]["response"]
    return (f"```json\n{json.dumps(response['body'], indent=2, ensure_ascii=False)}\n```\n\n"
            f"*HTTP {response['status']}, recorded by `{examples['written_by']}` on {examples['date']} with "
            f"`{examples['model']}`.*")
