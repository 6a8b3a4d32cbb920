"""The API reference page: the OpenAPI document the gateway serves, rendered as Markdown.

The document is not a committed copy: the gateway function is built with the API
reference on (as the local runner serves it) and asked for `GET /v1/openapi?format=json`
through its own handler, so the page is what a deployment answers. No backend, store or
network is touched: the document route needs none.

    python scripts/openapi_doc.py --json build/openapi.json   # the document alone
    python scripts/openapi_doc.py                              # the Markdown, on stdout

mkdocs runs it at build time (scripts/docs_hooks.py), into docs/reference/api.md.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The order the sections appear in, by tag; tags not listed follow in the document's order.
TAG_ORDER = ("Operations", "Models", "System One", "OpenAI", "Catalogs", "Records", "Credentials")


def document() -> dict[str, Any]:
    """The OpenAPI document, from the gateway's own handler (GATEWAY_OPENAPI on)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from gateway.functions.composition import build_services
    from gateway.functions.handler import GatewayFunction
    from gateway.settings import GatewaySettings

    # With an (empty, throwaway) store, as every deployment has one: the routes that need one
    # (catalogs, records, usage, files, uploads, batches) are in the document only then.
    with tempfile.TemporaryDirectory() as folder:
        settings = GatewaySettings.model_validate({
            "models": [{"name": "decision-default", "serves": ["decisions"], "endpoints": [{"name": "unused"}]}],
            "openapi": True, "auth": {"sqlite_path": str(Path(folder) / "docs.sqlite")},
        })
        function = GatewayFunction(build_services(settings, backend=_NoBackend()))
        result = function(_document_event(), None)
    body = result.get("body") or ""
    if result.get("isBase64Encoded"):
        body = base64.b64decode(body).decode()
    if result.get("statusCode") != 200:
        raise RuntimeError(f"the gateway answered {result.get('statusCode')} for its OpenAPI document: {body[:300]}")
    served = json.loads(body)
    # The servers entry names the stage of the event above; the paths are what matters.
    served.pop("servers", None)
    return served


def quiet() -> None:
    """The function logs each request and emits metrics on stdout: neither belongs in a page."""
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")


def _document_event() -> dict[str, Any]:
    return {
        "resource": "/{proxy+}", "path": "/v1/openapi", "httpMethod": "GET", "headers": {}, "multiValueHeaders": {},
        "queryStringParameters": {"format": "json"}, "multiValueQueryStringParameters": {"format": ["json"]},
        "pathParameters": {"proxy": "v1/openapi"}, "body": None, "isBase64Encoded": False,
        "requestContext": {"requestId": "docs-build", "stage": "docs", "httpMethod": "GET", "path": "/v1/openapi",
                           "resourcePath": "/{proxy+}", "identity": {"sourceIp": "127.0.0.1"}},
    }


class _NoBackend:
    """The document route calls no backend; any call is a bug."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"the OpenAPI document should not call the backend ({name})")


def validate(document: dict[str, Any], schema: dict[str, Any], instance: Any) -> None:
    """Hold `instance` to a schema of the document (its references, "#/components/schemas/Name",
    resolved there: OpenAPI 3.1's schemas are JSON Schema 2020-12); jsonschema.ValidationError
    says where it does not fit."""
    import jsonschema
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    registry = Registry().with_resource("urn:openapi", DRAFT202012.create_resource(document))
    rooted = json.loads(json.dumps(schema).replace('"$ref": "#/', '"$ref": "urn:openapi#/'))
    jsonschema.Draft202012Validator(rooted, registry=registry).validate(instance)


# -- rendering ---------------------------------------------------------------------------

def cell(text: Any) -> str:
    """Text fit for one Markdown table cell."""
    return re.sub(r"\s*\n\s*", " ", str(text)).replace("|", "\\|").strip()


def anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def type_of(schema: dict[str, Any] | bool | None) -> str:
    """A schema as a short type expression, with links to the components it names."""
    if schema is None or schema is True or schema == {}:
        return "any"
    if schema is False:
        return "nothing"
    if "$ref" in schema:
        name = ref_name(schema["$ref"])
        return f"[{name}](#{anchor(name)})"
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    for union in ("anyOf", "oneOf"):
        if union in schema:
            parts = [type_of(s) for s in schema[union]]
            nullable = "null" in parts
            parts = [p for p in parts if p != "null"]
            text = " \\| ".join(dict.fromkeys(parts))
            return f"{text} (or null)" if nullable else text
    if "allOf" in schema:
        return " & ".join(type_of(s) for s in schema["allOf"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " \\| ".join(kind)
    if kind == "array":
        return f"array of {type_of(schema.get('items'))}"
    if kind == "object" and "properties" not in schema:
        values = schema.get("additionalProperties")
        return "object" if values in (None, True, {}) else f"map of {type_of(values)}"
    return kind or "any"


def constraints(schema: dict[str, Any]) -> str:
    """The bounds a value is validated against (lengths, ranges, counts, pattern, default)."""
    words = {"minLength": "length ≥ {}", "maxLength": "length ≤ {}", "minimum": "≥ {}", "maximum": "≤ {}",
             "exclusiveMinimum": "> {}", "exclusiveMaximum": "< {}", "minItems": "≥ {} items",
             "maxItems": "≤ {} items", "minProperties": "≥ {} entries", "maxProperties": "≤ {} entries",
             "pattern": "matches `{}`"}
    def bound(value: Any) -> str:
        return f"{value:g}" if isinstance(value, float) else str(value)

    found = [text.format(bound(schema[key])) for key, text in words.items() if key in schema]
    for union in ("anyOf", "oneOf"):
        for option in schema.get(union, []):
            if isinstance(option, dict):
                found += [text.format(bound(option[key])) for key, text in words.items() if key in option]
    if "default" in schema and schema["default"] is not None:
        found.append(f"default `{json.dumps(schema['default'])}`")
    return ", ".join(dict.fromkeys(found))


def render_schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{#{anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [cell(schema["description"]), ""]
    properties = schema.get("properties")
    if not properties:
        lines += [f"Type: {type_of({k: v for k, v in schema.items() if k != 'description'})}", ""]
        return lines
    required = set(schema.get("required", ()))
    lines += ["| field | type | required | notes |", "| --- | --- | --- | --- |"]
    for field, spec in properties.items():
        notes = " ".join(filter(None, [cell(spec.get("description", "")), constraints(spec)]))
        lines.append(f"| `{field}` | {type_of(spec)} | {'yes' if field in required else ''} | {notes} |")
    if schema.get("additionalProperties") is False:
        lines += ["", "No other field is accepted."]
    lines.append("")
    return lines


def indented(text: str) -> str:
    return "\n".join(("    " + line) if line else "" for line in text.splitlines())


def render_example(example: dict[str, Any], source: str) -> list[str]:
    """An example's request and answer, folded (pymdownx.details), as the run recorded them."""
    request, response = example["request"], example["response"]
    target = request["path"] + ("?" + "&".join(f"{k}={v}" for k, v in request["query"].items()) if request["query"] else "")
    asked = f"{request['method']} {target}"
    if request.get("body") is not None:
        asked += "\n\n" + json.dumps(request["body"], indent=2, ensure_ascii=False)
    elif request.get("form"):
        asked += "\n\nmultipart/form-data: " + ", ".join(f"{k}={v}" for k, v in request["form"].items())
        if request.get("form_file"):
            asked += "\n\n" + request["form_file"].rstrip("\n")
    headers = "".join(f"\n{k}: {v}" for k, v in response["headers"].items())
    body = response["body"]
    shown = body if isinstance(body, str) else json.dumps(body, indent=2, ensure_ascii=False)
    answer = f"{response['status']}{headers}\n\n{shown}"
    lines = [f'??? example "Example: {response["status"]} ({source})"', ""]
    if example.get("note"):
        lines += [indented(example["note"]), ""]
    lines += [indented("```http\n" + asked + "\n```"), "", indented("```http\n" + answer.rstrip("\n") + "\n```"), ""]
    return lines


def render_operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        lines += [cell(op["summary"]) + ".", ""]
    if op.get("description"):
        lines += [op["description"].strip(), ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | notes |", "| --- | --- | --- | --- | --- |"]
        for p in params:
            schema = p.get("schema", {})
            notes = " ".join(filter(None, [cell(p.get("description", "")), constraints(schema)]))
            lines.append(f"| `{p['name']}` | {p['in']} | {type_of(schema)} | {'yes' if p.get('required') else ''} | {notes} |")
        lines.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Request body ({media}{', required' if body.get('required') else ''}): "
                      f"{type_of(content.get('schema'))}", ""]
    lines += ["| status | meaning | body | headers |", "| --- | --- | --- | --- |"]
    for status, response in sorted(op.get("responses", {}).items()):
        schemas = [f"{type_of(c.get('schema'))} ({media})" if media != "application/json" else type_of(c.get("schema"))
                   for media, c in (response.get("content") or {}).items()]
        # x-request-id is on every answer (the page says so once); the others tell a client what to do.
        headers = ", ".join(f"`{name}`" for name in response.get("headers", {}) if name != "x-request-id")
        lines.append(f"| {status} | {cell(response.get('description', ''))} | {', '.join(schemas) or '-'} | {headers} |")
    lines.append("")
    return lines


def markdown(doc: dict[str, Any], examples: dict[str, Any] | None = None) -> str:
    """The reference: operations grouped by tag, each with its example where `examples` (the
    document `make api-examples` writes) has one, then every component schema."""
    recorded = {e["operation"]: e for e in (examples or {}).get("examples", [])}
    source = (f"`{examples.get('written_by')}`, {examples.get('date')}, model {examples.get('model')}"
              if examples else "")
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            tag = (op.get("tags") or ["Other"])[0]
            by_tag.setdefault(tag, []).append((path, method, op))
    tags = [t for t in TAG_ORDER if t in by_tag] + [t for t in by_tag if t not in TAG_ORDER]
    info = doc.get("info", {})
    schemes = doc.get("components", {}).get("securitySchemes", {})
    lines = [f"OpenAPI {doc.get('openapi', '')}, *{info.get('title', '')}* version {info.get('version', '')}: "
             f"{sum(len(v) for v in by_tag.values())} operations, "
             f"{len(doc.get('components', {}).get('schemas', {}))} schemas.", ""]
    for name, scheme in schemes.items():
        lines += [f"Security scheme `{name}`: {scheme.get('type', '')} {scheme.get('scheme', '')}"
                  f"{' (' + cell(scheme['description']) + ')' if scheme.get('description') else ''}; "
                  "every operation takes it but `GET /health`.", ""]
    for tag in tags:
        lines += [f"## {tag}", ""]
        for path, method, op in by_tag[tag]:
            lines += render_operation(path, method, op)
            if f"{method.upper()} {path}" in recorded:
                lines += render_example(recorded[f"{method.upper()} {path}"], source)
    lines += ["## Schemas", ""]
    for name, schema in sorted(doc.get("components", {}).get("schemas", {}).items()):
        lines += render_schema(name, schema)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the OpenAPI document there instead of the Markdown")
    args = parser.parse_args(argv)
    quiet()
    doc = document()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
