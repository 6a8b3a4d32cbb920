"""Write events/*.json: one API Gateway REST proxy event (v1) per route and credential case.

They are what API Gateway hands the function after the bearer authorizer ran (its
context in requestContext.authorizer) or after an AWS_IAM method authenticated a SigV4
caller (`*-iam`: requestContext.identity), built by the same code as the local runner, with
fixed ids and times so the files are stable. Run `python scripts/make_events.py` after
changing the event shape; `sam local invoke -e events/<name>.json` accepts them too.
The function checks on every request that the credential named in the context is
still live, so the store it reads must hold an API key record with id
0123456789abcdef for tenant acme (tests/integration/test_events.py stores one).
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from devkit.local import proxy_event

EVENTS = Path(__file__).resolve().parent.parent / "events"
BEARER = {"principalId": "acme", "tenant_id": "acme", "scopes": "chat decide", "models": "*", "credential_id": "0123456789abcdef",
          "kind": "api_key"}
REFUSED = {"principalId": "anonymous", "tenant_id": "", "reason": "invalid credentials"}
CHAT_ONLY = {**BEARER, "scopes": "chat"}
CATALOGS = {**BEARER, "scopes": "decide catalogs:read catalogs:write"}
AUTH = {"Authorization": "Bearer dgk_0123456789abcdef_" + "x" * 43}  # the shape of a key, not a key
# A SigV4 caller: an assumed-role session of the role the tests map to tenant "acme".
IAM = "arn:aws:sts::123456789012:assumed-role/DecisionClients/ci-session"

SYSTEM_ONE = {
    "model": "jev-latest",
    "state": "Customer wrote: I was charged twice for order 4411, refund one please.",
    "questions": {
        "is_refund": {"type": "noul", "instructions": "Is the customer asking for a refund?",
                      "criteria": {"true": "asks for money back", "false": "anything else"}},
        "queue": {"type": "choice", "instructions": "Which queue should handle this?",
                  "criteria": {"billing": "payments, duplicate charges, refunds, invoices",
                               "delivery": "shipping and tracking", "account": None}},
        "anger": {"type": "score", "instructions": "How frustrated is the customer?", "criteria": ["calm", "annoyed", "angry"]},
    },
}
DECISIONS = {
    "model": "decision-default",
    "input": [{"role": "user", "content": "I was charged twice for order 4411, refund one please."}],
    "questions": [
        {"type": "predicate", "name": "is_refund", "instructions": "The customer asks for a refund."},
        {"type": "choice", "name": "queue", "instructions": "Which queue?",
         "choices": [{"value": "billing", "description": "payments"}, {"value": "delivery"}]},
        {"type": "score", "name": "anger", "instructions": "How frustrated?",
         "levels": [{"label": "calm"}, {"label": "annoyed", "description": "irritated"}, {"label": "angry"}]},
    ],
}
ROUTING = {
    "type": "choice", "instructions": "Which queue should handle this ticket?",
    "options": [{"name": "billing", "description": "payments, refunds"}, {"name": "delivery"}, {"name": "account"}],
    "abstain": {"name": "human-triage"}, "policy": {"mode": "enforcing", "auto": {"min_top": 0.8}, "review": {"min_top": 0.5}},
}
BY_REFERENCE = {"model": "jev-latest", "state": SYSTEM_ONE["state"], "questions": {"queue": {"catalog": "support-routing"}}}
# A score's levels as a map instead of an ordered array: 422.
INVALID = {**SYSTEM_ONE, "questions": {"anger": {"type": "score", "criteria": {"0": "calm"}}}}
CHAT = {"model": "chat-default", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}

# name: (method, path, body bytes or None, extra headers, authorizer context, IAM principal ARN or None)
CASES = {
    "health": ("GET", "/health", None, {}, None),
    "models": ("GET", "/v1/models", None, AUTH, BEARER),
    "systemone": ("POST", "/v1/systemone", json.dumps(SYSTEM_ONE).encode(), AUTH, BEARER),
    "systemone-gzip": ("POST", "/v1/systemone", gzip.compress(json.dumps(SYSTEM_ONE).encode(), mtime=0),
                       {**AUTH, "Content-Encoding": "gzip"}, BEARER),
    "systemone-invalid": ("POST", "/v1/systemone", json.dumps(INVALID).encode(), AUTH, BEARER),
    "systemone-unauthenticated": ("POST", "/v1/systemone", json.dumps(SYSTEM_ONE).encode(), AUTH, REFUSED),
    "decisions": ("POST", "/v1/decisions", json.dumps(DECISIONS).encode(), AUTH, BEARER),
    "decisions-forbidden": ("POST", "/v1/decisions", json.dumps(DECISIONS).encode(), AUTH, CHAT_ONLY),
    "chat": ("POST", "/v1/chat/completions", json.dumps(CHAT).encode(), AUTH, BEARER),
    "chat-stream": ("POST", "/v1/chat/completions", json.dumps({**CHAT, "stream": True}).encode(), AUTH, BEARER),
    "systemone-iam": ("POST", "/v1/systemone", json.dumps(SYSTEM_ONE).encode(), {}, IAM),
    "tokens-iam": ("POST", "/v1/tokens", json.dumps({"scopes": ["decide"], "ttl_s": 900}).encode(), {}, IAM),
    "tokens-bearer-forbidden": ("POST", "/v1/tokens", b"{}", AUTH, BEARER),
    "catalogs-1-put": ("PUT", "/v1/catalogs/support-routing", json.dumps(ROUTING).encode(), AUTH, CATALOGS),
    "catalogs-2-get": ("GET", "/v1/catalogs/support-routing", None, AUTH, CATALOGS),
    "catalogs-3-systemone-ref": ("POST", "/v1/systemone", json.dumps(BY_REFERENCE).encode(), AUTH, BEARER),
    "catalogs-4-read-only-put": ("PUT", "/v1/catalogs/support-routing", json.dumps(ROUTING).encode(), AUTH,
                                 {**CATALOGS, "scopes": "catalogs:read"}),
    "records-list": ("GET", "/v1/records", None, AUTH, BEARER),
}


def build(name: str) -> dict:
    method, path, body, headers, principal = CASES[name]
    all_headers = {"Host": "abc123.execute-api.us-east-1.amazonaws.com", "User-Agent": "events/1.0",
                   **({"Content-Type": "application/json"} if body is not None else {}), **headers}
    event = proxy_event(method, path, list(all_headers.items()), body or b"", "203.0.113.7")
    context = event["requestContext"]
    context.update(requestId=f"00000000-0000-4000-8000-{zlib.crc32(name.encode()):012d}", extendedRequestId="events",
                   requestTime="30/Nov/2026:00:00:00 +0000", requestTimeEpoch=1795996800000, stage="prod",
                   path=f"/prod{path}", domainName=all_headers["Host"], apiId="abc123", accountId="123456789012")
    trace = "Root=1-00000000-000000000000000000000000"
    event["headers"]["X-Amzn-Trace-Id"] = event["multiValueHeaders"]["X-Amzn-Trace-Id"][0] = trace
    if isinstance(principal, str):
        context["identity"].update(userArn=principal, accountId="123456789012", caller="AROAEXAMPLE:ci-session",
                                   user="AROAEXAMPLE:ci-session", accessKey="ASIAEXAMPLE000000000")
    elif principal is not None:
        context["authorizer"] = dict(principal)
    return event


def main() -> None:
    EVENTS.mkdir(exist_ok=True)
    for name in CASES:
        (EVENTS / f"{name}.json").write_text(json.dumps(build(name), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {len(CASES)} events to {EVENTS}")


if __name__ == "__main__":
    main()
