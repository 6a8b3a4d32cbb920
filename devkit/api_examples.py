"""One real request per operation of the API, and the run that records what a gateway answers.

`make api-examples` (with a fresh `make up` running, DG_URL and DG_API_KEY set as it prints
them; a URL off this machine is refused, as the run writes data and its answers are published)
sends these in order, each using the ids the ones before it returned (a decision's id
for its outcome and record, an uploaded file for a batch), and writes every request and answer
to docs/reference/examples.json, which the API reference shows under each operation. The tests
hold every example to the schemas of the document the gateway serves
(tests/unit/devkit/test_api_examples.py), so an example cannot drift from the contract.

    python -m devkit.api_examples --out docs/reference/examples.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = ("127.0.0.1", "localhost", "::1")
OUT = ROOT / "docs" / "reference" / "examples.json"
CATALOG = "support-routing"
STATE = "Customer wrote: I was charged twice for order 4411, refund one please."
BATCH_LINES = [
    {"custom_id": f"ticket-{n}", "method": "POST", "url": "/v1/systemone",
     "body": {"model": "jev-latest", "state": state,
              "questions": {"is_refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"}}}}
    for n, state in enumerate(("Refund my second charge, please.", "Where is my parcel?"), start=1)
]
# Ids the examples use until a run has made real ones (the tests' requests, which only need
# the routes' own checks to pass).
PLACEHOLDERS = {"decision_id": "decision_0123456789abcdef01234567", "file_id": "file-0123456789abcdef",
                "upload_id": "upload_0123456789abcdef", "part_id": "part_0123456789abcdef",
                "batch_id": "batch_0123456789abcdef", "version": "1"}


@dataclass(frozen=True)
class Example:
    """One operation's request: `path` and `body` may name the ids earlier answers gave, as
    `{decision_id}` and the like (`PLACEHOLDERS` has them all)."""

    method: str
    template: str  # the operation's path, as the OpenAPI document has it
    path: str  # the request's path, its ids as `{name}`
    body: Any = None  # JSON
    form: dict[str, Any] | None = None  # multipart: name -> text, or (filename, bytes)
    query: dict[str, str] = field(default_factory=dict)
    keep: dict[str, str] = field(default_factory=dict)  # id name -> the answer's field that holds it
    note: str = ""

    def request_path(self, ids: dict[str, str]) -> str:
        return self.path.format(**ids)

    def request_body(self, ids: dict[str, str]) -> Any:
        return None if self.body is None else json.loads(json.dumps(self.body).replace("{part_id}", ids["part_id"])
                                                         .replace("{file_id}", ids["file_id"]))


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


SYSTEM_ONE = {
    "model": "jev-latest", "state": STATE,
    "questions": {
        "is_refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"},
        "queue": {"type": "choice", "instructions": "Which queue?",
                  "criteria": {"billing": "payments, refunds", "delivery": "shipping", "account": None}},
        "anger": {"type": "score", "instructions": "How frustrated?", "criteria": ["calm", "annoyed", "angry"]},
    },
}
DECISIONS = {
    "model": "decision-default", "input": STATE,
    "questions": [{"type": "predicate", "name": "refund", "instructions": "Asks for a refund."},
                  {"type": "choice", "name": "queue", "instructions": "Which queue?",
                   "choices": [{"value": "billing", "description": "payments and refunds"}, {"value": "delivery"},
                               {"value": "account"}]}],
}  # docs/concepts/decisions.md shows this request (and its System One twin) above its recorded answer
CATALOG_ENTRY = {
    "type": "choice", "instructions": "Which support queue should handle this ticket?",
    "options": [{"name": "billing", "description": "payments, refunds, invoices"},
                {"name": "delivery", "description": "shipping, parcels, tracking"},
                {"name": "account", "description": "login, passwords, profile"}],
    "abstain": {"name": "human-triage", "description": "a person routes it"},
    "policy": {"mode": "advisory", "auto": {"min_top": 0.8}, "review": {"min_top": 0.5, "min_margin": 0.2}},
}

EXAMPLES: tuple[Example, ...] = (
    Example("GET", "/health", "/health"),
    Example("GET", "/v1/models", "/v1/models"),
    Example("POST", "/v1/systemone", "/v1/systemone", SYSTEM_ONE, keep={"decision_id": "x_decision_id"}),
    Example("POST", "/v1/decisions", "/v1/decisions", DECISIONS),
    Example("POST", "/v1/chat/completions", "/v1/chat/completions",
            {"model": "chat-default", "max_tokens": 24, "messages": [{"role": "user", "content": "Say hello in five words."}]}),
    Example("POST", "/v1/decisions/{decision_id}/outcome", "/v1/decisions/{decision_id}/outcome",
            {"answers": {"is_refund": True, "queue": "billing"}, "note": "checked by a person"}),
    Example("GET", "/v1/records", "/v1/records", query={"limit": "1"}),
    Example("GET", "/v1/records/{decision_id}", "/v1/records/{decision_id}"),
    Example("PUT", "/v1/catalogs/{name}", f"/v1/catalogs/{CATALOG}", CATALOG_ENTRY, keep={"version": "version"}),
    Example("GET", "/v1/catalogs", "/v1/catalogs"),
    Example("GET", "/v1/catalogs/{name}", f"/v1/catalogs/{CATALOG}"),
    Example("GET", "/v1/catalogs/{name}/versions", f"/v1/catalogs/{CATALOG}/versions"),
    Example("GET", "/v1/catalogs/{name}/versions/{version}", f"/v1/catalogs/{CATALOG}/versions/{{version}}"),
    Example("POST", "/v1/catalogs/{name}/refit", f"/v1/catalogs/{CATALOG}/refit", {"apply": False},
            note="A refit needs an entry that keeps its decisions' features (learning.keep_features) and outcomes "
                 "attached with a source; this one keeps none, and says so."),
    Example("POST", "/v1/tokens", "/v1/tokens", {"scopes": ["decide"], "ttl_s": 900},
            note="Minting needs a SigV4 (IAM) caller: a bearer key is refused, as here."),
    Example("POST", "/v1/tokens/revoke", "/v1/tokens/revoke", {"token_id": "0123456789abcdef0123456789abcdef"},
            note="Revoking needs a SigV4 caller or the admin scope: the dev key has neither, as here."),
    Example("GET", "/v1/usage", "/v1/usage"),
    Example("POST", "/v1/files", "/v1/files", form={"purpose": "batch", "file": ("tickets.jsonl", _jsonl(BATCH_LINES))},
            keep={"file_id": "id"}),
    Example("GET", "/v1/files", "/v1/files", query={"limit": "2"}),
    Example("GET", "/v1/files/{file_id}", "/v1/files/{file_id}"),
    Example("GET", "/v1/files/{file_id}/content", "/v1/files/{file_id}/content"),
    Example("POST", "/v1/uploads", "/v1/uploads",
            {"filename": "more.jsonl", "purpose": "batch", "bytes": len(_jsonl(BATCH_LINES[:1])),
             "mime_type": "application/jsonl"}, keep={"upload_id": "id"}),
    Example("POST", "/v1/uploads/{upload_id}/parts", "/v1/uploads/{upload_id}/parts",
            form={"data": ("part", _jsonl(BATCH_LINES[:1]))}, keep={"part_id": "id"}),
    Example("POST", "/v1/uploads/{upload_id}/complete", "/v1/uploads/{upload_id}/complete", {"part_ids": ["{part_id}"]}),
    Example("POST", "/v1/batches", "/v1/batches",
            {"input_file_id": "{file_id}", "endpoint": "/v1/systemone", "completion_window": "24h"},
            keep={"batch_id": "id"}),
    Example("GET", "/v1/batches", "/v1/batches", query={"limit": "1"}),
    Example("GET", "/v1/batches/{batch_id}", "/v1/batches/{batch_id}"),
    Example("POST", "/v1/batches/{batch_id}/cancel", "/v1/batches/{batch_id}/cancel"),
    Example("POST", "/v1/uploads/{upload_id}/cancel", "/v1/uploads/{upload_id}/cancel",
            note="An upload already completed cannot be cancelled, as the answer says."),
    Example("DELETE", "/v1/files/{file_id}", "/v1/files/{file_id}"),
)

MAX_WAIT_S = 10  # a longer Retry-After is an answer to show, not a rate to wait out
# The answers' headers worth showing (the rest are the transport's).
SHOWN_HEADERS = ("content-type", "x-request-id", "x-decision-id", "x-endpoint", "x-attempts", "retry-after",
                 "x-should-retry", "idempotent-replayed")


def multipart(form: dict[str, Any]) -> dict[str, Any]:
    """httpx's `files=` and `data=` for a form."""
    files = {k: v for k, v in form.items() if isinstance(v, tuple)}
    return {"files": files, "data": {k: v for k, v in form.items() if not isinstance(v, tuple)}}


def run(send: Callable[..., Any], say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every example, in order, through `send(method, path, json=, params=, files=, data=)` (an
    httpx client's `request`); returns what each asked and got."""
    ids = dict(PLACEHOLDERS)
    recorded = []
    for number, example in enumerate(EXAMPLES, start=1):
        path, body = example.request_path(ids), example.request_body(ids)
        started = time.perf_counter()
        kwargs: dict[str, Any] = {"params": example.query or None}
        if example.form is not None:
            kwargs.update(multipart(example.form))
        elif body is not None:
            kwargs["json"] = body
        reply = send_paced(send, example.method, path, kwargs, say)
        answer = answer_of(reply)
        say(f"[api-examples] {number}/{len(EXAMPLES)} {example.method} {path}: {reply.status_code} "
            f"in {time.perf_counter() - started:.2f} s")
        for name, source in example.keep.items():
            if isinstance(answer, dict) and answer.get(source) is not None:
                ids[name] = str(answer[source])
        recorded.append({
            "operation": f"{example.method} {example.template}", "note": example.note,
            "request": {"method": example.method, "path": path, "query": example.query or None,
                        "body": body if example.form is None else None,
                        "form": None if example.form is None else {k: (v[0] if isinstance(v, tuple) else v)
                                                                    for k, v in example.form.items()},
                        "form_file": None if example.form is None else next(
                            (v[1].decode() for v in example.form.values() if isinstance(v, tuple)), None)},
            "response": {"status": reply.status_code,
                         "headers": {k: reply.headers[k] for k in SHOWN_HEADERS if k in reply.headers},
                         "body": answer},
        })
    return recorded


def send_paced(send: Callable[..., Any], method: str, path: str, kwargs: dict[str, Any],
               say: Callable[[str], None], attempts: int = 4) -> Any:
    """One request as a patient client sends it: a 429 with a Retry-After of a few seconds (the dev
    tenant's request rate) is waited out and sent again."""
    for _ in range(attempts):
        reply = send(method, path, **kwargs)
        wait = reply.headers.get("retry-after")
        if reply.status_code != 429 or wait is None or not wait.isdigit() or int(wait) > MAX_WAIT_S:
            return reply
        say(f"[api-examples] {method} {path}: 429, waiting {wait} s as Retry-After says")
        time.sleep(int(wait))
    return reply


def redacted(text: str, key: str) -> str:
    """The recording without the key: its id (the part before the secret, which records name as
    their credential) becomes a placeholder, and the key itself must not appear at all."""
    parts = key.split("_")
    secret = parts[-1] if len(parts) == 3 else key
    if key in text or (len(secret) >= 16 and secret in text):
        raise RuntimeError("the API key appears in an answer: nothing written")
    if len(parts) == 3 and parts[1]:
        text = text.replace(parts[1], "0000000000000000")
    return text


def served_model(recorded: list[dict[str, Any]]) -> str | None:
    """The model that answered the decisions (a System One answer names it)."""
    for example in recorded:
        body = example["response"]["body"]
        if example["operation"] == "POST /v1/systemone" and isinstance(body, dict):
            return body.get("model")
    return None


def answer_of(reply: Any) -> Any:
    if reply.headers.get("content-type", "").startswith("application/json"):
        return reply.json()
    return reply.text


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> int:
    import httpx

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    environ = dict(os.environ if environ is None else environ)
    url, key = environ.get("DG_URL"), environ.get("DG_API_KEY")
    if not url or not key:
        print("api-examples: set DG_URL and DG_API_KEY (make up prints both)", file=sys.stderr)
        return 2
    if urlsplit(url).hostname not in LOOPBACK:
        # The run writes (a catalog entry, an outcome, files, a batch) and its answers are published
        # with the docs: only a local stack's throwaway data belongs there, never a deployment's.
        print(f"api-examples: DG_URL must be the local stack (127.0.0.1 or localhost), not {url}", file=sys.stderr)
        return 2
    with httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {key}"}, timeout=120) as client:
        recorded = run(client.request)
    document = {"written_by": "make api-examples", "date": time.strftime("%Y-%m-%d", time.gmtime()),
                "model": served_model(recorded), "examples": recorded}
    text = redacted(json.dumps(document, indent=2, ensure_ascii=False) + "\n", key)
    args.out.write_text(text)
    print(f"[api-examples] wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
