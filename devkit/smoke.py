"""Does a gateway answer? `python -m devkit.smoke` (`make smoke`), against any gateway.

Reads DG_URL and DG_API_KEY as the README's examples do, and walks what a caller meets:
liveness, the model list, one decision in each format, a streamed chat, an outcome
attached to the decision (without a source, so it trains nothing), and a refusal with
its status and shape. Each step prints one line; a step the key has no scope or model
for is skipped with the reason, a step that needs an earlier one's answer is skipped when
that one failed. The exit status is 0 when no step failed, 1 when one did (the last line
names every failed step), 2 for a usage error.

Every wait is bounded (`--timeout`, per step, the stream's whole length included), and
the key is never printed: whatever is shown of an answer passes through `redact` first.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from systemone.errors import read_error_body

DECISION_MODEL = "decision-default"
CHAT_MODEL = "chat-default"
TIMEOUT_S = 120.0  # a decision on a cold CPU endpoint, a 58 s long request's worth and more
MAX_BODY = 8 * 1024 * 1024  # far more than any answer of the API; a hostile server's flood stops here
SHOWN = 300  # characters of an unexpected answer shown in a failure
# An API key's shape (gateway/auth/credentials.py) and a minted token's: hidden wherever seen.
CREDENTIAL = re.compile(r"dgk_[A-Za-z0-9_\-]+|dgt_[A-Za-z0-9_.\-]+|eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_.\-]+")
STATE = "Customer wrote: I was charged twice for order 4411, please refund one of the charges."


class Failed(Exception):
    """The step's answer is not what a caller is promised."""


class Skipped(Exception):
    """The step cannot run for this key or this run (the reason is the message)."""


@dataclass
class Outcome:
    step: str
    status: str  # ok, skipped, FAILED
    detail: str
    seconds: float


@dataclass
class Smoke:
    url: str
    key: str
    timeout_s: float = TIMEOUT_S
    decision_model: str = DECISION_MODEL
    chat_model: str = CHAT_MODEL
    # What earlier steps found, for later ones: the decision to attach an outcome to.
    decision_id: str | None = None
    decision_answers: dict[str, Any] = field(default_factory=dict)
    visible_models: set[str] | None = None
    key_refused: bool = False

    def redact(self, text: str) -> str:
        text = text.replace(self.key, "<the key>") if self.key else text
        return CREDENTIAL.sub("<a credential>", text)

    # -- HTTP, bounded ------------------------------------------------------------------

    @functools.cached_property
    def http(self) -> httpx.Client:
        """One client for the run: its connection (and TLS session) serves every step.
        The read timeout bounds each wait between bytes; `events` bounds a stream whole."""
        return httpx.Client(base_url=self.url, timeout=httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
                            headers={"User-Agent": "decision-gateway-smoke"}, follow_redirects=False)

    def request(self, method: str, path: str, *, body: Any = None, key: str | None = None) -> httpx.Response:
        """The whole answer, read within the step's bound however slowly it trickles, and at
        most MAX_BODY bytes of it: a gateway that never stops sending fails the step."""
        headers = {"Authorization": f"Bearer {self.key if key is None else key}"} if key != "" else {}
        deadline = time.monotonic() + self.timeout_s
        try:
            with self.http.stream(method, path, json=body, headers=headers) as reply:
                content = bytearray()
                for chunk in reply.iter_bytes():
                    content += chunk
                    if len(content) > MAX_BODY:
                        raise Failed(f"{method} {path} answered more than {MAX_BODY} bytes")
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("the answer was still coming")
            return httpx.Response(reply.status_code, headers=reply.headers, content=bytes(content),
                                  request=reply.request)
        except httpx.TimeoutException:
            raise Failed(f"no answer from {method} {path} within {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise Failed(f"{method} {path}: {type(exc).__name__}: {exc}") from None

    def expect(self, reply: httpx.Response, status: int) -> Any:
        """The JSON body of a reply with `status`; a scope or model this key lacks skips the step."""
        if reply.status_code == status:
            try:
                return reply.json()
            except ValueError:
                raise Failed(f"{reply.status_code} but not JSON: {self.shown(reply.text)}") from None
        message = error_message(reply)
        if reply.status_code == 403 and "scope" in message:
            raise Skipped(f"the key has no scope for it ({message})")
        if reply.status_code == 404 and "model" in message:
            raise Skipped(f"the key may not use this model ({message})")
        retry = reply.headers.get("retry-after")
        raise Failed(f"{reply.status_code} from {reply.request.method} {reply.request.url.path}"
                     + (f" (Retry-After: {retry})" if retry else "") + f": {self.shown(reply.text)}")

    def shown(self, text: str) -> str:
        text = self.redact(" ".join(text.split()))
        return text if len(text) <= SHOWN else text[:SHOWN] + "..."

    # -- the steps ----------------------------------------------------------------------

    def health(self) -> str:
        body = self.expect(self.request("GET", "/health", key=""), 200)
        check(body == {"status": "ok"}, f"/health answered {body!r}")
        return "the function answers"

    def models(self) -> str:
        reply = self.request("GET", "/v1/models")
        if reply.status_code == 401:
            self.key_refused = True
            raise Failed(f"the key was refused (401): {self.shown(reply.text)}")
        body = self.expect(reply, 200)
        openai_ids = {m.get("id") for m in body.get("data", []) if isinstance(m, dict)}
        system_one = {m.get("name") for m in body.get("models", []) if isinstance(m, dict)}
        check(body.get("object") == "list" and openai_ids and openai_ids == system_one,
              f"not the list both SDKs parse: {self.shown(json.dumps(body))}")
        self.visible_models = openai_ids
        return f"{len(openai_ids)} visible: {', '.join(sorted(openai_ids))}"

    def _model(self, name: str) -> str:
        if self.visible_models is not None and name not in self.visible_models:
            raise Skipped(f"{name} is not among the models this key sees (--decision-model / --chat-model)")
        return name

    def decision_openai(self) -> str:
        model = self._model(self.decision_model)
        questions = [{"type": "predicate", "name": "refund", "instructions": "Does the customer ask for a refund?"},
                     {"type": "choice", "name": "queue", "instructions": "Which queue should handle it?",
                      "choices": [{"value": "billing", "description": "payments and refunds"},
                                  {"value": "delivery"}, {"value": "account"}]}]
        started = time.monotonic()
        reply = self.request("POST", "/v1/decisions", body={"model": model, "input": STATE, "questions": questions})
        body = self.expect(reply, 200)
        answers = body.get("answers")
        check(isinstance(answers, list) and [a.get("name") for a in answers] == ["refund", "queue"],
              f"answers not in question order: {self.shown(json.dumps(body))}")
        refund, queue = answers[0].get("probability"), answers[1].get("probabilities") or []
        check(is_probability(refund), f"refund's probability is {refund!r}")
        total = sum(p.get("probability", 0) for p in queue if isinstance(p, dict))
        check([p.get("value") for p in queue] == ["billing", "delivery", "account"] and abs(total - 1) < 1e-3,
              f"the choice's probabilities are {queue!r}")
        self.remember(body.get("id"), {"refund": True})
        return (f"refund {refund:.2f}, queue {answers[1].get('choice')!r}"
                f" in {time.monotonic() - started:.1f} s, via {reply.headers.get('x-endpoint', '?')}")

    def decision_system_one(self) -> str:
        model = self._model(self.decision_model)
        questions = {
            "is_refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"},
            "queue": {"type": "choice", "instructions": "Which queue?",
                      "criteria": {"billing": "payments, refunds", "delivery": "shipping", "account": None}},
            "anger": {"type": "score", "instructions": "How frustrated?", "criteria": ["calm", "annoyed", "angry"]},
        }
        started = time.monotonic()
        reply = self.request("POST", "/v1/systemone", body={"model": model, "state": STATE, "questions": questions})
        body = self.expect(reply, 200)
        answers = body.get("answers")
        check(isinstance(answers, dict) and set(answers) == set(questions),
              f"not one answer per question: {self.shown(json.dumps(body))}")
        queue = answers["queue"].get("probabilities") or {}
        check(set(queue) == {"billing", "delivery", "account"} and abs(sum(queue.values()) - 1) < 1e-3,
              f"the choice's probabilities are {queue!r}")
        self.remember(reply.headers.get("x-decision-id"), {"is_refund": True})
        best = max(queue, key=queue.get)
        return f"queue {best} {queue[best]:.2f} in {time.monotonic() - started:.1f} s"

    def remember(self, decision_id: Any, answers: dict[str, Any]) -> None:
        if self.decision_id is None and isinstance(decision_id, str) and decision_id:
            self.decision_id, self.decision_answers = decision_id, answers

    def chat_streamed(self) -> str:
        model = self._model(self.chat_model)
        body = {"model": model, "max_tokens": 16, "stream": True,
                "messages": [{"role": "user", "content": "Say hello in five words."}]}
        started = time.monotonic()
        deadline = started + self.timeout_s
        chunks, first, done, text = 0, None, False, []
        try:
            with self.http.stream("POST", "/v1/chat/completions", json=body,
                                  headers={"Authorization": f"Bearer {self.key}"}) as reply:
                if reply.status_code != 200:
                    reply.read()
                    self.expect(reply, 200)
                kind = reply.headers.get("content-type", "")
                check(kind.startswith("text/event-stream"), f"streamed as {kind!r}, not text/event-stream")
                for data in events(reply.iter_lines(), deadline, self.timeout_s):
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise Failed(f"the stream carried an error: {self.shown(data)}")
                    check(chunk.get("object") == "chat.completion.chunk", f"not a chunk: {self.shown(data)}")
                    chunks += 1
                    first = first or time.monotonic() - started
                    for choice in chunk.get("choices", []):
                        text.append((choice.get("delta") or {}).get("content") or "")
        except httpx.TimeoutException:
            raise Failed(f"the stream stalled for {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise Failed(f"POST /v1/chat/completions: {type(exc).__name__}: {exc}") from None
        except json.JSONDecodeError:
            raise Failed("a chunk that is not JSON") from None
        check(done, "the stream ended without data: [DONE]")
        check(chunks > 0, "no chunk before [DONE]")
        return (f"{chunks} chunks, the first after {first:.2f} s, all in {time.monotonic() - started:.1f} s:"
                f" {self.shown(''.join(text))!r}")

    def outcome(self) -> str:
        if self.decision_id is None:
            raise Skipped("no decision answered to attach it to")
        # No source: it counts for drift only, never trains an adapter (and needs only `decide`).
        reply = self.request("POST", f"/v1/decisions/{self.decision_id}/outcome",
                             body={"answers": self.decision_answers, "note": "make smoke"})
        body = self.expect(reply, 200)
        stored = body.get("outcome") or {}
        check(body.get("id") == self.decision_id and stored.get("answers") == self.decision_answers,
              f"the outcome was not stored as sent: {self.shown(json.dumps(body))}")
        check(stored.get("trains") is False, f"an outcome without a source trains: {self.shown(json.dumps(body))}")
        return f"attached to {self.decision_id} (trains nothing)"

    def refusal(self) -> str:
        # A caller's mistake is a 4xx in its API's shape, never a 5xx; a bad key is a 401.
        reply = self.request("POST", "/v1/systemone", body={
            "model": self.decision_model, "state": STATE,
            "questions": {"q": {"type": "no-such-type", "instructions": "?"}}})
        check(reply.status_code == 422, f"an unknown question type got {reply.status_code}, not 422:"
                                         f" {self.shown(reply.text)}")
        detail = read_error_body(reply.content).details
        check(detail, f"not System One's validation shape: {self.shown(reply.text)}")
        stranger = self.request("GET", "/v1/models", key="dgk_0123456789abcdef_" + "A" * 43)
        check(stranger.status_code == 401, f"an unknown key got {stranger.status_code}, not 401")
        return "422 for an unknown question type (at " + ".".join(map(str, detail[0]["loc"])) + "), 401 for a bad key"

    def steps(self) -> list[tuple[str, Callable[[], str]]]:
        return [("health", self.health), ("models", self.models),
                ("decision (OpenAI format)", self.decision_openai),
                ("decision (System One format)", self.decision_system_one),
                ("chat (streamed)", self.chat_streamed), ("outcome", self.outcome), ("refusal", self.refusal)]

    def run_step(self, name: str, step: Callable[[], str], out: TextIO) -> Outcome:
        started = time.monotonic()
        try:
            if self.key_refused and name != "health":
                raise Skipped("the key was refused at the model list")
            status, detail = "ok", step()
        except Skipped as skip:
            status, detail = "skipped", str(skip)
        except Failed as failure:
            status, detail = "FAILED", str(failure)
        outcome = Outcome(name, status, self.redact(detail), time.monotonic() - started)
        print(f"  {status:<7} {name:<29} {outcome.seconds:6.2f} s  {outcome.detail}", file=out, flush=True)
        return outcome

    def run(self, out: TextIO) -> list[Outcome]:
        outcomes: list[Outcome] = []
        print(f"smoke: {self.url} (each step bounded by {self.timeout_s:g} s)", file=out, flush=True)
        with self.http:
            for name, step in self.steps():
                outcomes.append(self.run_step(name, step, out))
        failed = [o.step for o in outcomes if o.status == "FAILED"]
        skipped = sum(o.status == "skipped" for o in outcomes)
        if failed:
            print(f"smoke: FAILED at {', '.join(failed)} ({len(failed)} of {len(outcomes)} steps)", file=out)
        else:
            print(f"smoke: passed ({len(outcomes) - skipped} steps" + (f", {skipped} skipped" if skipped else "")
                  + ")", file=out)
        return outcomes


def events(lines: Iterator[str], deadline: float, timeout_s: float) -> Iterator[str]:
    """The `data:` payloads of a server-sent event stream, until `deadline`."""
    for line in lines:
        if time.monotonic() > deadline:
            raise Failed(f"the stream was still running after {timeout_s:g} s")
        if line.startswith("data:"):
            yield line[5:].strip()


def error_message(reply: httpx.Response) -> str:
    """The message of an error body in either API's shape (systemone/ reads both), else ''."""
    return read_error_body(reply.content).message or ""


def is_probability(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value <= 1


def check(condition: Any, message: str) -> None:
    if not condition:
        raise Failed(message)


def base_url(url: str) -> str:
    """DG_URL as the README sets it: the gateway's base, without /v1 (tolerated, and dropped)."""
    url = url.strip().rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def main(argv: list[str] | None = None, environ: dict[str, str] | None = None, out: TextIO = sys.stdout) -> int:
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="python -m devkit.smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=environ.get("DG_URL", ""), help="the gateway's base URL (DG_URL)")
    # DG_ like the URL and the key: the variables a caller's shell holds for this gateway.
    parser.add_argument("--timeout", type=float, default=environ.get("DG_SMOKE_TIMEOUT_S") or TIMEOUT_S,
                        help=f"seconds a step may take (DG_SMOKE_TIMEOUT_S; default {TIMEOUT_S:g})")
    parser.add_argument("--decision-model", default=DECISION_MODEL)
    parser.add_argument("--chat-model", default=CHAT_MODEL)
    args = parser.parse_args(argv)
    key = environ.get("DG_API_KEY", "").strip()  # never an argument: it would show in `ps` and shell history
    url = base_url(args.url)
    if not url.startswith(("http://", "https://")) or not key:
        print("smoke: set DG_URL (the gateway's base URL, http:// or https://) and DG_API_KEY (an API key or"
              " a minted token), as the README's examples do", file=sys.stderr)
        return 2
    if not (0 < args.timeout <= 3600):
        print("smoke: --timeout is seconds, between 0 and 3600", file=sys.stderr)
        return 2
    host = httpx.URL(url).host
    if url.startswith("http://") and host not in ("127.0.0.1", "localhost", "::1"):
        print(f"smoke: warning: {url} is plain HTTP: the key crosses the network unencrypted", file=sys.stderr)
    smoke = Smoke(url, key, args.timeout, args.decision_model, args.chat_model)
    outcomes = smoke.run(out)
    return 1 if any(o.status == "FAILED" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
