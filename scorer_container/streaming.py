"""A chat completion streamed as OpenAI's server-sent events.

Generation runs in a worker thread and hands each piece to the event loop; it stops
when the caller hangs up (the response is closed) or the deadline passes. A failure
after the 200 has started is said in the stream, as an OpenAI-shaped error event, and
the stream still ends with `data: [DONE]`.

A caller that hangs up is noticed by Starlette, which cancels the response (under ASGI
2.3; under 2.4 its next send fails instead), so generation stops within a decode step of
it. `ClosingStreamingResponse` closes the events' generator however the response ends:
Starlette leaves a body iterator whose send failed suspended, and its generation running,
until the garbage collector finds it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

from starlette.responses import StreamingResponse

from scorer_container.chat import ChatUsage, chunk, new_completion_id
from scorer_container.deadline import Deadline
from scorer_container.errors import DeadlineExceeded
from scorer_container.scheduler import Job
from scorer_container.schema import ChatRequest
from scorer_container.service import Loaded

log = logging.getLogger("scorer")


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that closes its body iterator however the response ends, and then
    calls `on_close` (a job's release): a generator closed before it started runs no `finally`
    of its own, and a background task does not run when the response was cancelled, so a place
    in line released only there could leak and shrink the line for good."""

    def __init__(self, *args, on_close=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                close = getattr(self.body_iterator, "aclose", None)
                if close is not None:
                    await close()
            finally:
                if self.on_close is not None:
                    self.on_close()


async def stream_chat(
    loaded: Loaded, request: ChatRequest, tokens: list[int], budget: int, job: Job, cells: int, include_usage: bool,
    deadline: Deadline,
):
    """Server-sent events; generation runs in one of the resident jobs' threads, in turns with
    other jobs, and stops when the client goes. The job has its place in line already; its
    memory is waited for here, after the 200 (a wait past the deadline is said in the stream)."""
    completion_id, created, model = new_completion_id(), int(time.time()), loaded.model_name
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()
    usage = ChatUsage()
    done = object()

    def work() -> None:
        try:
            for piece in loaded.chat.generate(request, tokens, budget, usage, stop, deadline, job):
                loop.call_soon_threadsafe(queue.put_nowait, piece)
        except Exception as exc:
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, done)
            # How far generation got (logged here: the events' generator may be cancelled, and
            # await nothing more, once its caller has gone); a caller that went stops it within
            # a decode step.
            log.info("chat stream %s after %d generated tokens", "stopped, its caller gone" if stop.is_set() else "ended",
                     usage.completion_tokens)

    try:
        await job.resident(cells, 1)
        worker = job.run(work)
        try:
            yield _sse(chunk(completion_id, model, created, {"role": "assistant", "content": ""}, None))
            while (item := await queue.get()) is not done:
                if isinstance(item, Exception):
                    log.error("chat stream failed: %s", type(item).__name__)
                    yield _sse({"error": {"message": "generation failed", "type": "server_error"}})
                    break
                if item.text:
                    yield _sse(chunk(completion_id, model, created, {"content": item.text}, None))
                if item.finish_reason:
                    yield _sse(chunk(completion_id, model, created, {}, item.finish_reason))
            if include_usage:
                final = chunk(completion_id, model, created, {}, None)
                final["choices"], final["usage"] = [], usage.as_dict()
                yield _sse(final)
            yield "data: [DONE]\n\n"
        finally:
            stop.set()
            await asyncio.shield(worker)
    except DeadlineExceeded:
        # Out of time in line, after the 200 went out: say so in the stream, and end it properly.
        yield _sse({"error": {"message": "the request's deadline passed while it waited for the model",
                              "type": "server_error", "code": "timeout"}})
        yield "data: [DONE]\n\n"
    finally:
        job.release()


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


