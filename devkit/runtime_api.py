"""A local stand-in for the Lambda Runtime API, as AWS documents it, for testing the
streaming function's runtime loop (`gateway.functions.runtime_loop`) without Lambda: `sam local`
runs functions buffered and cannot stream a response.

It serves one runtime process: `invoke(event)` queues an event for
`GET /2018-06-01/runtime/invocation/next` and returns what the runtime posted back, a
streamed response (each chunk as it arrived, with its time, and the trailers), or an
error. `cut_after` stops reading a response after that many chunks and closes the
connection, as Lambda does when the invocation's caller has gone or its time is up.
With `snap_start`, `GET /runtime/restore/next` answers once `restore()` is called.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API = "/2018-06-01/runtime"


@dataclass
class Posted:
    """What the runtime posted for one invocation."""

    kind: str = ""  # "response", "error", or "" while none came
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[tuple[float, bytes]] = field(default_factory=list)  # (monotonic time, bytes)
    trailers: dict[str, str] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    cut: bool = False  # the stand-in stopped reading, as Lambda does
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.chunks)


class RuntimeApiStandIn:
    def __init__(self, *, snap_start: bool = False) -> None:
        self._events: queue.Queue[tuple[str, dict[str, Any], float]] = queue.Queue()
        self.posted: dict[str, Posted] = {}
        self.init_error: dict[str, Any] | None = None
        self.restore_error: dict[str, Any] | None = None
        self.cut_after: int | None = None
        self.snap_start = snap_start
        self.snapshot_taken = threading.Event()
        self._restored = threading.Event()
        self.server = _Server(self)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    def invoke(self, event: dict[str, Any], timeout_s: float = 30.0, deadline_s: float = 60.0) -> Posted:
        request_id = str(uuid.uuid4())
        posted = self.posted[request_id] = Posted()
        self._events.put((request_id, event, deadline_s))
        if not posted.done.wait(timeout_s):
            raise TimeoutError("the runtime posted nothing for the invocation")
        return posted

    def restore(self) -> None:
        self._restored.set()

    def __enter__(self) -> RuntimeApiStandIn:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._restored.set()
        self.server.shutdown()
        self.server.server_close()


class _Server(ThreadingHTTPServer):
    def __init__(self, stand_in: RuntimeApiStandIn) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stand_in = stand_in


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == f"{API}/invocation/next":
            request_id, event, deadline_s = self.server.stand_in._events.get()
            body = json.dumps(event).encode()
            self.send_response(200)
            self.send_header("Lambda-Runtime-Aws-Request-Id", request_id)
            self.send_header("Lambda-Runtime-Deadline-Ms", str(int((time.time() + deadline_s) * 1000)))
            self.send_header("Lambda-Runtime-Invoked-Function-Arn",
                             "arn:aws:lambda:local:000000000000:function:streaming")
            self.send_header("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == f"{API}/restore/next" and self.server.stand_in.snap_start:
            self.server.stand_in.snapshot_taken.set()
            self.server.stand_in._restored.wait()
            self._reply(200)
        else:
            self._reply(404)

    def do_POST(self) -> None:
        if self.path == f"{API}/init/error":
            self.server.stand_in.init_error = self._json()
            return self._reply(202)
        if self.path == f"{API}/restore/error":
            self.server.stand_in.restore_error = self._json()
            return self._reply(202)
        parts = self.path.removeprefix(f"{API}/invocation/").split("/")
        if len(parts) != 2 or parts[0] not in self.server.stand_in.posted:
            return self._reply(404)
        posted = self.server.stand_in.posted[parts[0]]
        posted.headers = {k.lower(): v for k, v in self.headers.items()}
        if parts[1] == "error":
            posted.kind, posted.error = "error", self._json()
            self._reply(202)
        elif parts[1] == "response":
            posted.kind = "response"
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                if not self._read_chunked(posted):
                    posted.cut = True
                    self.close_connection = True
                    posted.done.set()
                    return
            else:
                posted.chunks.append((time.monotonic(), self.rfile.read(int(self.headers["Content-Length"]))))
            self._reply(202)
        else:
            self._reply(404)
        posted.done.set()

    def _read_chunked(self, posted: Posted) -> bool:
        """The chunks and trailers of a chunked body; False when it stopped reading (cut)."""
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            posted.chunks.append((time.monotonic(), self.rfile.read(size)))
            self.rfile.read(2)
            if self.server.stand_in.cut_after is not None and len(posted.chunks) >= self.server.stand_in.cut_after:
                return False
        while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode().partition(":")
            posted.trailers[name.strip()] = value.strip()
        return True

    def _json(self) -> dict[str, Any]:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

    def _reply(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass
