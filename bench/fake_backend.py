"""An instant backend for overhead benchmarks: answers in microseconds, so what is timed
is whatever sits in front of it.

Serves SageMaker's runtime path (`/endpoints/{name}/invocations`, what boto3 calls
with `endpoint_url`) and OpenAI's `/v1/chat/completions` (what LiteLLM calls), with
the same canned answers.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.fakes import chat_completion, uniform_answer

MODEL = "instant-fake"


def answer(body: bytes, path: str) -> bytes:
    request = json.loads(body or b"{}")
    if "messages" in request or path.endswith("/chat/completions"):
        return json.dumps(chat_completion(MODEL, "hello")).encode()
    return json.dumps(uniform_answer(MODEL, request)).encode()


class FakeBackendServer:
    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once, no 40 ms delayed-ACK stall

            def do_POST(self) -> None:
                data = answer(self.rfile.read(int(self.headers.get("Content-Length") or 0)), self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeBackendServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
