"""The work one decision may ask of the model, counted before any backend call.

The scorer counts exactly, with the model's tokenizer, and refuses past its own allowance
(413), cutting debiasing the request did not ask for first. The gateway has no
tokenizer: it estimates the least the scorer could do, from the text the model will
read (the state once; each question's instructions and options once, twice when the
request asks for order averaging, twice again when it asks for the content-free
prior) at 4 bytes a token, the usual rate for English with these models' tokenizers,
and refuses past the model's `max_request_tokens` with 413 before anything is sent.
So a request the gateway refuses, the scorer would refuse too (with its allowance in
that setting); the gateway's is the cheaper, coarser check, there so that a 400 x 255
request never reaches an endpoint at all.

Each tenant has its own limits besides (`TenantLimits`): options across all questions,
text the model reads, the token estimate (never above the model's) and, for chat, the
most tokens a completion may generate. Each is a 413 naming the figure and the limit.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gateway.auth.store import DEFAULT_LIMITS, TenantLimits
from gateway.decisions.model import Decision, Question, Text, render_json
from gateway.errors import PayloadTooLarge
from systemone.limits import STATE_FEATURE_DIMS

BYTES_PER_TOKEN = 4
# Chat template, "Task:", "Options:", the reply hint and the answer cue of one probe.
PROBE_FRAME_TOKENS = 40
PROBE_OPTIONS = 26  # options one probe lists (the scorer's groups); more add a final round
# A decision record must fit one DynamoDB item (400 KB) with its outcome attached later.
MAX_RECORD_BYTES = 300_000
RECORD_FIXED_BYTES = 2_000  # ids, model, endpoint, hashes, usage, latency
QUESTION_FIXED_BYTES = 200  # the keys of one question's entry, its action and figures


def estimated_tokens(decision: Decision) -> int:
    """The fewest tokens the scorer could evaluate for `decision` (catalog references resolved)."""
    # Debiasing only when asked for: the scorer drops what was not asked for to fit.
    orders = 2 if decision.engine_options.get("x_order_average") is True else 1
    priors = 2 if decision.engine_options.get("x_prior") is True else 1
    total = _tokens(decision.state)
    for question in decision.questions:
        if isinstance(question, Question):
            total += orders * priors * _question_tokens(question)
    return total


def check_decision_work(decision: Decision, max_tokens: int, limits: TenantLimits = DEFAULT_LIMITS) -> int:
    """The estimate, or PayloadTooLarge (413) when the decision is over the model's
    `max_tokens` or over one of the tenant's limits."""
    questions = [q for q in decision.questions if isinstance(q, Question)]
    options = sum(len(q.options) for q in questions)
    if options > limits.max_options:
        raise PayloadTooLarge(f"this request asks {options} options across its questions; this tenant may ask at most"
                              f" {limits.max_options} per request: split its questions into more requests")
    text = _bytes(decision.state) + sum(_bytes(q.instructions) + sum(_bytes(o.key) + _bytes(o.description)
                                                                     for o in q.options) for q in questions)
    if text > limits.max_text_bytes:
        raise PayloadTooLarge(f"this request holds {text} bytes of text for the model; this tenant may send at most"
                              f" {limits.max_text_bytes} per request: shorten the state or split the questions")
    record = record_bytes(questions)
    if record > MAX_RECORD_BYTES:
        raise PayloadTooLarge(f"this decision's audit record would take about {record} bytes (its question names,"
                              f" option keys and any features kept for refits); a record holds at most"
                              f" {MAX_RECORD_BYTES}: use shorter names, fewer options or fewer questions")
    if limits.max_request_tokens is not None:
        max_tokens = min(max_tokens, limits.max_request_tokens)
    tokens = estimated_tokens(decision)
    if tokens > max_tokens:
        parts = math.ceil(tokens / max_tokens)
        raise PayloadTooLarge(
            f"this request needs about {tokens} tokens of evaluation; this model takes at most {max_tokens} per"
            f" request: split its questions into {parts} or more requests, or use fewer options or shorter descriptions")
    return tokens


def record_bytes(questions: list[Question]) -> int:
    """An upper bound on the stored size of the decision's record (`decisions/records.py`):
    each question's name and kind, and per option its key (escaped as the stores write
    JSON) with a probability, written at most three times (probabilities, answer, model
    answer), plus the fixed fields. The state is never in a record, only its hash."""
    total = RECORD_FIXED_BYTES
    for question in questions:
        keys = [len(json.dumps(str(o.value))) for o in question.options]
        total += QUESTION_FIXED_BYTES + len(json.dumps(question.name or question.id)) + sum(keys) + 26 * len(keys)
        total += 2 * max(keys, default=0)
        if question.binding is not None:
            total += len(json.dumps(question.binding.ref)) + 600  # catalog ref, hash, temperature, policy
            if question.binding.keep_features:
                total += features_bytes(len(keys))
    return total


# A kept answer's features (decisions/records.py): the state's sketch (STATE_FEATURE_DIMS
# float16 numbers in base64) and its name, then one distribution per listing, each float
# written in at most 26 characters. Listings are at most the options' count (rotations) or 2.
FEATURES_FIXED_BYTES = 4 * math.ceil(2 * STATE_FEATURE_DIMS / 3) + 120


def features_bytes(options: int) -> int:
    return FEATURES_FIXED_BYTES + 26 * options * max(2, options)


def _question_tokens(question: Question) -> int:
    options = sum(_tokens(o.key) + _tokens(o.description) + 2 for o in question.options)
    groups = max(1, math.ceil(len(question.options) / PROBE_OPTIONS))
    instructions = _tokens(question.instructions)
    total = groups * (PROBE_FRAME_TOKENS + instructions) + options
    if groups > 1:  # the final round lists one winner per group
        total += PROBE_FRAME_TOKENS + instructions + math.ceil(options * groups / len(question.options))
    return total


def check_chat_work(request: dict[str, Any], limits: TenantLimits = DEFAULT_LIMITS) -> dict[str, int]:
    """The completion's token limit the backend gets (the tenant's when the request names
    none), or PayloadTooLarge when the request asks for more, or sends more text, than
    the tenant may."""
    text = len(json.dumps(request.get("messages"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if text > limits.max_text_bytes:
        raise PayloadTooLarge(f"these messages hold {text} bytes; this tenant may send at most {limits.max_text_bytes}"
                              " per request")
    asked = request.get("max_completion_tokens") or request.get("max_tokens")
    if asked is not None and asked > limits.max_chat_tokens:
        raise PayloadTooLarge(f"max_tokens is {asked}; this tenant may generate at most {limits.max_chat_tokens} tokens"
                              " per completion")
    return {"max_tokens": asked or limits.max_chat_tokens}


def _tokens(text: Text | None) -> int:
    return math.ceil(_bytes(text) / BYTES_PER_TOKEN)


def _bytes(text: Text | None) -> int:
    if text is None:
        return 0
    rendered = text if isinstance(text, str) else render_json(text)
    return len(rendered.encode("utf-8", "surrogatepass"))
