"""OpenAI-style chat completions on the same llama.cpp context the decisions use."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from scorer_container.deadline import Deadline, never
from scorer_container.errors import CallerGone, ContextOverflow, DeadlineExceeded, InvalidRequest
from scorer_container.llama import Batch, LlamaModel, ModelShare, Sampler, WholeModel, prefill_pieces
from scorer_container.prompts import PromptFormat
from scorer_container.schema import ChatRequest
from scorer_container.untrusted import without_control_tokens

DEFAULT_MAX_TOKENS = 256


@dataclass
class Piece:
    text: str
    finish_reason: str | None = None


@dataclass
class ChatUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


class ChatGenerator:
    def __init__(self, llama: LlamaModel, prompts: PromptFormat, model_name: str) -> None:
        self.llama = llama
        self.prompts = prompts
        self.model_name = model_name
        self.control_tokens = llama.control_tokens()

    def prepare(self, request: ChatRequest) -> tuple[list[int], int]:
        """Prompt tokens and the token budget; refuses prompts that do not fit."""
        try:
            # A message's text may hold someone else's words (a ticket pasted into a user turn):
            # spelled control tokens stay text, so only the template opens and closes turns.
            messages = [{"role": m.role, "content": without_control_tokens(m.text(), self.control_tokens)}
                        for m in request.messages]
        except ValueError as exc:
            raise InvalidRequest.at(["messages"], str(exc)) from None
        prompt = self.prompts.render_chat(messages)
        add_bos = self.llama.adds_bos and not self.prompts.starts_with_bos(prompt)
        tokens = self.llama.tokenize(prompt, add_bos=add_bos)
        room = self.llama.n_ctx - len(tokens)
        if room < 1:
            raise ContextOverflow(f"the prompt has {len(tokens)} tokens; this model's context is {self.llama.n_ctx}")
        asked = request.max_completion_tokens or request.max_tokens
        return tokens, min(asked or DEFAULT_MAX_TOKENS, room)

    def generate(
        self, request: ChatRequest, tokens: list[int], budget: int, usage: ChatUsage, stop_event: threading.Event,
        deadline: Deadline | None = None, share: ModelShare | None = None,
    ) -> Iterator[Piece]:
        """Yield text pieces; the last one carries the finish reason. Runs in the first of `share`'s
        sequences (the whole model when None), one turn at the model per prompt piece and per
        token (a decode and the draw from its logits), so other jobs' turns come in between.

        When `deadline` passes the text generated so far is returned, cut short (finish
        reason "length"); one that passes during the prompt raises DeadlineExceeded."""
        deadline = deadline or never()
        share = share or WholeModel(self.llama)
        temperature = 0.7 if request.temperature is None else request.temperature
        sampler = self.llama.sampler(temperature, request.top_p or 1.0, 40, request.seed or 0)
        usage.prompt_tokens = len(tokens)
        try:
            token: int | None = self._read_prompt(tokens, share, sampler, deadline)
            text = _Text(request.stop_strings())
            finish = "length"
            for produced in range(budget):
                if stop_event.is_set():
                    finish = "stop"
                    break
                if deadline.gone:
                    raise CallerGone("the caller closed the connection; the generation was abandoned")
                if token is None or deadline.expired():
                    break  # out of time: the text so far, cut short ("length")
                if self.llama.is_end_of_generation(token):
                    finish = "stop"
                    break
                usage.completion_tokens += 1
                out, stopped = text.add(self.llama.token_bytes(token))
                if out:
                    yield Piece(out)
                if stopped:
                    finish = "stop"
                    break
                if produced < budget - 1:  # no token after the budget's last is drawn
                    token = self._next_token(token, len(tokens) + produced, share, sampler)
            if text.held:
                yield Piece(text.held)
            yield Piece("", finish)
        finally:
            sampler.close()
            with self.llama.lock:
                self.llama.drop_sequences(share.seqs)

    def _read_prompt(self, tokens: list[int], share: ModelShare, sampler: Sampler, deadline: Deadline) -> int:
        """Decode the prompt, a turn a piece, and draw the first token from its last logits."""
        pieces = list(prefill_pieces(tokens, max(1, share.step_tokens), share.seqs[0]))
        token = -1
        for n, batch in enumerate(pieces):
            deadline.check()
            with share.step():
                self.llama.decode(batch)
                if n == len(pieces) - 1:
                    token = sampler.sample(len(batch) - 1)
        return token

    def _next_token(self, token: int, position: int, share: ModelShare, sampler: Sampler) -> int | None:
        """Decode `token` at `position` and draw the next, in one turn; None when the deadline
        passed while it waited for the turn (the text so far is the answer)."""
        try:
            with share.step():
                batch = Batch.empty()
                batch.add(token, position, share.seqs[0], True)
                self.llama.decode(batch)
                return sampler.sample(0)
        except CallerGone:
            raise
        except DeadlineExceeded:
            return None

    def completion(self, request: ChatRequest, deadline: Deadline | None = None, share: ModelShare | None = None,
                   prepared: tuple[list[int], int] | None = None) -> dict:
        tokens, budget = prepared or self.prepare(request)
        usage = ChatUsage()
        parts, finish = [], "stop"
        for piece in self.generate(request, tokens, budget, usage, threading.Event(), deadline, share):
            parts.append(piece.text)
            finish = piece.finish_reason or finish
        return {
            "id": new_completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(parts)},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": usage.as_dict(),
        }


def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def chunk(completion_id: str, model: str, created: int, delta: dict, finish: str | None) -> dict:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


class _Text:
    """Generated bytes as text: whole UTF-8 characters only, and held back while they may begin a
    stop string (a stop string is never sent, nor anything after it)."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.pending = b""  # bytes of an unfinished UTF-8 character
        self.held = ""  # text that might be the start of a stop string

    def add(self, data: bytes) -> tuple[str, bool]:
        """(The text that may be sent now, whether a stop string ended the generation.)"""
        text, self.pending = _complete_utf8(self.pending + data)
        self.held += text
        cut = _find_stop(self.held, self.stops)
        if cut is not None:
            out, self.held = self.held[:cut], ""
            return out, True
        safe = len(self.held) - _stop_prefix_overlap(self.held, self.stops)
        out, self.held = self.held[:safe], self.held[safe:]
        return out, False


def _complete_utf8(data: bytes) -> tuple[str, bytes]:
    """Decode the longest prefix of whole UTF-8 characters; keep the rest for later."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8"), data[cut:]
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace"), b""


def _find_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _stop_prefix_overlap(text: str, stops: list[str]) -> int:
    """How many trailing characters of `text` could begin a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                best = max(best, k)
                break
    return best
