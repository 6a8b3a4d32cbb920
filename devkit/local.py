"""Run the gateway locally: `python -m devkit.local --port 3000`.

An HTTP server that does what API Gateway (REST API, Lambda proxy integration) does
in front of the function, with no AWS and no Docker: it turns each request into the
v1 proxy event API Gateway would send (headers and multi-value headers, query strings,
`requestContext.identity`, every body base64-encoded as with binary media type `*/*`),
runs the REQUEST authorizer first on credentialed routes and puts its context in
`requestContext.authorizer`, throttles each tenant at its own rate and burst as the
usage plans do in AWS (`LocalUsagePlans`), then calls the same `lambda_handler`, with
API Gateway's and Lambda's limits: 10 MB requests, events of at most 6 MB (Lambda's
invocation payload), a 29 s integration timeout, and error bodies for each.

`X-Local-Iam-Principal: <ARN>` makes a request a SigV4 call API Gateway authenticated
as that IAM principal, so the IAM routes run end to end with no AWS. Anyone who can
send it is anyone they name, so it is honoured only from a loopback client with a
loopback `Host`, and the runner refuses to listen on another address with it enabled
unless told to (`--no-iam-emulation`, or `--expose-iam-emulation` on a private network).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import json
import logging
import math
import os
import select
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gateway.api.paths import OPENAPI_PATH, PUBLIC_PATHS, streams
from gateway.auth.store import DEFAULT_LIMITS
from gateway.functions import authorizer as authorizers
from gateway.functions import handler
from gateway.streaming.integration import BadPrelude, header_list, read_prelude
from systemone.errors import openai_body, system_one_body
from systemone.limits import API_GATEWAY_MAX_REQUEST_BYTES, LAMBDA_INVOKE_PAYLOAD_BYTES

# A child of the `gateway` logger, so its JSON handler and credential redaction apply here too.
log = logging.getLogger("gateway.local")
HttpReply = tuple[int, list[tuple[str, str]], "bytes | Iterator[bytes]"]  # status, headers, body (whole or streamed)

MAX_REQUEST_BYTES = API_GATEWAY_MAX_REQUEST_BYTES
# API Gateway's answer to a request over its 10 MB, and to one whose event Lambda refuses
# (over 6 MB): its default REQUEST_TOO_LARGE response, which a REST API cannot customise
# ("Customizing the default gateway response for 413 REQUEST_TOO_LARGE isn't currently
# supported", API Gateway important notes), so template.yaml's body for it never reaches
# a caller. Status, header and body as a deployed REST API sent them for an event Lambda
# refused (github.com/koki-develop/lgtm-generator/issues/10).
REQUEST_TOO_LONG = (413, "Request Too Long", "BadRequestException")
# What the deployed API answers when a tenant (or the refused callers' shared key) is
# over its usage plan: its THROTTLED gateway response (template.yaml).
THROTTLED_BODY = {**openai_body("too many requests; retry later", "rate_limit_error", "rate_limit_exceeded"),
                  **system_one_body("rate_limit_error", "too many requests; retry later")}
# The usage plan of refused callers (bad or missing credentials), template.yaml's RefusedCallersPlan.
REFUSED_RATE_PER_S, REFUSED_BURST = 10.0, 20
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
INTEGRATION_TIMEOUT_S = 29.0
# The streaming routes' integration timeout (template.yaml: StreamingFunction's events), which
# bounds a streamed response as a whole; the function's own bound comes first.
STREAM_TIMEOUT_S = 65.0
STAGE = "local"
ACCOUNT = "000000000000"
API_ID = "localapi00"
# What the deployed API answers when no credential is sent (its UNAUTHORIZED gateway
# response): a body both SDKs understand, like every other error of this API.
_MISSING_CREDENTIALS = "missing credentials: send Authorization: Bearer <API key>"
UNAUTHORIZED_BODY = {**openai_body(_MISSING_CREDENTIALS, "authentication_error", "invalid_api_key"),
                     **system_one_body("authentication_error", _MISSING_CREDENTIALS)}
# Local only: a request carrying this header is treated as a SigV4 call that API Gateway
# authenticated as the named IAM principal (its ARN), so the IAM path runs end to end.
LOCAL_IAM_HEADER = "x-local-iam-principal"
# Hop-by-hop headers API Gateway does not pass to the integration.
_DROPPED_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection", "expect"}


class InProcessFunction:
    """The function as one warm instance in this process: like a Lambda instance, it serves
    one request at a time (Powertools keeps the current event on the resolver class, so
    two requests must never run through one process at once). For tests and tools that
    build their own services; without one, the function Lambda would build from the environment."""

    def __init__(self, function: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None,
                 streaming_function: Callable[[dict[str, Any], Any], Iterator[bytes]] | None = None) -> None:
        self.function = function or handler.lambda_handler
        self.streaming_function = streaming_function or getattr(function, "stream", None) or handler.streaming_handler
        self._lock = threading.Lock()
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="function")

    def invoke(self, event: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            with self._lock:
                return self.function(event, _LambdaContext())

        return self._threads.submit(run).result(timeout=timeout_s)

    def invoke_stream(self, event: dict[str, Any], timeout_s: float) -> Iterator[bytes]:
        """The streaming handler's bytes, the instance held until they end (or are closed)."""
        if not self._lock.acquire(timeout=timeout_s):
            raise concurrent.futures.TimeoutError
        try:
            stream = self.streaming_function(event, _LambdaContext(timeout_s))
            with contextlib.closing(stream):
                yield from stream
        finally:
            self._lock.release()

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


class ProcessFunctions:
    """The function as Lambda runs it under load: up to `max_instances` instances, each its
    own process that imports the handler once, keeps its warm state and serves one request
    at a time. A new instance starts (cold) only when every instance is busy; an instance
    that overruns the integration timeout is killed, as Lambda kills it."""

    def __init__(self, max_instances: int = 8, env: dict[str, str] | None = None) -> None:
        import multiprocessing

        self._context = multiprocessing.get_context("spawn")
        self._env = dict(env or {})
        self._max = max_instances
        self._idle: list[Any] = []
        self._count = 0
        self._available = threading.Condition()

    def invoke(self, event: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        instance = self._acquire(timeout_s)
        connection = instance[1]
        try:
            connection.send(("invoke", event))
            if not connection.poll(timeout_s):
                raise concurrent.futures.TimeoutError
            kind, payload = connection.recv()
        except (concurrent.futures.TimeoutError, EOFError, OSError):
            self._discard(instance)
            raise
        self._release(instance)
        if kind != "ok":
            raise RuntimeError(f"the function raised {payload}")
        return payload

    def invoke_stream(self, event: dict[str, Any], timeout_s: float) -> Iterator[bytes]:
        """The streaming handler's bytes from an instance, as it sends them. Closed early (the
        caller gone), the instance is told to stop, which closes the handler's generator there."""
        instance = self._acquire(timeout_s)
        connection = instance[1]
        deadline = time.monotonic() + timeout_s
        ended = False
        try:
            connection.send(("stream", event))
            while True:
                if not connection.poll(max(0.0, deadline - time.monotonic())):
                    raise concurrent.futures.TimeoutError
                kind, payload = connection.recv()
                if kind == "chunk":
                    yield payload
                    continue
                ended = True
                if kind == "error":
                    raise RuntimeError(f"the function raised {payload}")
                return
        except GeneratorExit:
            ended = self._stopped(connection)
            raise
        finally:
            if ended:
                self._release(instance)
            else:
                self._discard(instance)

    @staticmethod
    def _stopped(connection: Any) -> bool:
        """Tell an instance whose caller went to stop; True once it has (within a bound)."""
        try:
            connection.send(("cancel", None))
            deadline = time.monotonic() + 5.0
            while connection.poll(max(0.0, deadline - time.monotonic())):
                if connection.recv()[0] != "chunk":
                    return True
        except (EOFError, OSError):
            pass
        return False

    def prewarm(self, instances: int) -> None:
        """Start `instances` instances and run one request through each (provisioned
        concurrency, in Lambda's terms), so measurements are not cold starts."""
        held = [self._acquire(INTEGRATION_TIMEOUT_S) for _ in range(min(instances, self._max))]
        health = proxy_event("GET", "/health", [], b"", "127.0.0.1")
        for _, connection in held:
            connection.send(("invoke", health))
        for instance in held:
            instance[1].recv()
            self._release(instance)

    def _acquire(self, timeout_s: float) -> tuple[Any, Any]:
        deadline = time.monotonic() + timeout_s
        with self._available:
            while not self._idle and self._count >= self._max:
                if not self._available.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise concurrent.futures.TimeoutError
            if self._idle:
                return self._idle.pop()
            self._count += 1
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_instance_main, args=(child, self._env), daemon=True)
        process.start()
        return process, parent

    def _release(self, instance: tuple[Any, Any]) -> None:
        with self._available:
            self._idle.append(instance)
            self._available.notify()

    def _discard(self, instance: tuple[Any, Any]) -> None:
        process, connection = instance
        process.kill()
        connection.close()
        with self._available:
            self._count -= 1
            self._available.notify()

    def close(self) -> None:
        with self._available:
            idle, self._idle = self._idle, []
        for process, connection in idle:
            connection.close()
            process.kill()


def _instance_main(connection: Any, env: dict[str, str]) -> None:
    """One function instance: import once, then serve events until the pipe closes."""
    os.environ.update(env)
    from gateway.functions import handler as instance_handler

    while True:
        try:
            kind, event = connection.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if kind == "stream":
            _stream_to(connection, instance_handler.streaming_handler(event, _LambdaContext(STREAM_TIMEOUT_S)))
            continue
        try:
            connection.send(("ok", instance_handler.lambda_handler(event, _LambdaContext())))
        except Exception as exc:  # the function crashed: API Gateway answers 502
            connection.send(("error", type(exc).__name__))


def _stream_to(connection: Any, stream: Iterator[bytes]) -> None:
    """Send each chunk as it comes; a "cancel" from the parent (its caller went) closes the
    stream, as a Lambda whose response is cut closes it (`gateway.functions.runtime_loop`)."""
    with contextlib.closing(stream):
        try:
            for chunk in stream:
                connection.send(("chunk", chunk))
                if connection.poll() and connection.recv()[0] == "cancel":
                    break
        except Exception as exc:
            connection.send(("error", type(exc).__name__))
            return
    connection.send(("end", None))


class TokenBucket:
    """API Gateway's throttle: `burst` requests at once, refilled at `rate_per_s`."""

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate_per_s, self.burst, self.tokens, self.at = rate_per_s, burst, float(burst), now

    def take(self, now: float) -> float:
        """0 when admitted, else the seconds until a request would be."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate_per_s)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate_per_s


class LocalUsagePlans:
    """Usage plans, locally, as API Gateway keys them: a tenant with a usage key of its own
    (`admin set-limits --usage-plan`) has its own bucket at its own rate and burst (read
    through `limits`, cached as the authorizer caches them); tenants without one share
    one bucket at the default numbers, as they share the stack's key in AWS; refused
    callers share another."""

    def __init__(self, limits: Callable[[str], Any], clock: Callable[[], float] = time.monotonic) -> None:
        self._limits, self._clock = limits, clock
        self._buckets: dict[str, TokenBucket] = {}
        self._lock = threading.Lock()

    def admit(self, tenant_id: str) -> float:
        """0 when admitted, else seconds to wait (the Retry-After)."""
        if not tenant_id:
            key, rate, burst = "refused", REFUSED_RATE_PER_S, REFUSED_BURST
        else:
            limits = self._limits(tenant_id)
            if limits.usage_key:
                key, rate, burst = f"own:{limits.usage_key}", limits.rate_per_s, limits.burst
            else:
                key, rate, burst = "shared", DEFAULT_LIMITS.rate_per_s, DEFAULT_LIMITS.burst
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None or (bucket.rate_per_s, bucket.burst) != (rate, burst):
                bucket = self._buckets[key] = TokenBucket(rate, burst, now)
            return bucket.take(now)


class LocalApiGateway:
    """The event translation, the authorizer step and the limits, independent of the HTTP server."""

    def __init__(self, function: InProcessFunction | ProcessFunctions | None = None, *,
                 authorizer: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None,
                 usage_plans: LocalUsagePlans | None = None, iam_emulation: bool = True) -> None:
        self.function = function or InProcessFunction()
        self.authorizer = authorizer or authorizers.lambda_handler
        self.usage_plans = usage_plans  # None: no per-tenant throttling (tests of what lies behind it)
        self.iam_emulation = iam_emulation
        # The authorizer is stateless and thread-safe: it runs in this process, in threads.
        self._authorizer_threads = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="authorizer")

    def handle(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes, source_ip: str) -> HttpReply:
        if len(body) > MAX_REQUEST_BYTES:
            return _api_gateway_error(*REQUEST_TOO_LONG)
        iam_principal = next((v for k, v in headers if k.lower() == LOCAL_IAM_HEADER), None)
        event = proxy_event(method, target, [(k, v) for k, v in headers if k.lower() != LOCAL_IAM_HEADER], body, source_ip)
        if iam_principal:
            host = (_header(event, "host") or "").rsplit(":", 1)[0].strip("[]")
            if not self.iam_emulation or source_ip not in _LOOPBACK or host not in _LOOPBACK:
                return _shaped(403, "permission_error", "permission_denied", "insufficient_permissions",
                               "X-Local-Iam-Principal is honoured only from this machine (a loopback client and Host)")
            _as_sigv4_caller(event, iam_principal)
        elif event["path"] not in PUBLIC_PATHS and event["path"] != OPENAPI_PATH:
            if not _header(event, "authorization"):
                return 401, [("Content-Type", "application/json")], json.dumps(UNAUTHORIZED_BODY).encode()
            try:
                policy = self._authorizer_threads.submit(self.authorizer, _authorizer_event(event), None).result(
                    INTEGRATION_TIMEOUT_S
                )
            except Exception:
                log.exception("authorizer failed")
                return _api_gateway_error(500, None, "AuthorizerConfigurationException")
            context = policy.get("context", {})
            event["requestContext"]["authorizer"] = {"principalId": policy["principalId"], **context}
            wait = self.usage_plans.admit(context.get("tenant_id", "")) if self.usage_plans else 0.0
            if wait:
                return 429, [("Content-Type", "application/json"), ("Retry-After", str(max(1, math.ceil(wait))))], \
                    json.dumps(THROTTLED_BODY).encode()
        if len(json.dumps(event)) > LAMBDA_INVOKE_PAYLOAD_BYTES:
            # Lambda refuses the invocation (RequestEntityTooLargeException) and API Gateway
            # answers for it. Measured with json.dumps' spaced separators, a little more than
            # the event's compact JSON: what passes here passes in AWS.
            return _api_gateway_error(*REQUEST_TOO_LONG)
        if streams(method, event["path"]):
            return self._streamed(event)
        try:
            result = self.function.invoke(event, INTEGRATION_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            return _api_gateway_error(504, "Endpoint request timed out")
        except Exception:
            log.exception("function failed")
            return _api_gateway_error(502, "Internal server error")
        return _http_response(result)


    def _streamed(self, event: dict[str, Any]) -> HttpReply:
        """The streaming integration: the function's byte stream, its prelude read for the
        status and headers (API Gateway starts the response once it has them), then the body
        passed on chunk by chunk. Closing the body (the caller gone) closes the function's stream."""
        stream = self.function.invoke_stream(event, STREAM_TIMEOUT_S)
        head = b""
        try:
            for chunk in stream:
                head += chunk
                if (parsed := read_prelude(head)) is not None:
                    meta, rest = parsed
                    return meta["statusCode"], header_list(meta), _passed_on(rest, stream)
        except concurrent.futures.TimeoutError:
            stream.close()
            return _api_gateway_error(504, "Endpoint request timed out")
        except BadPrelude:
            log.exception("the function's response stream has no valid prelude")
        except Exception:
            log.exception("function failed")
        stream.close()
        return _api_gateway_error(502, "Internal server error")


def read_whole(reply: HttpReply) -> tuple[int, list[tuple[str, str]], bytes]:
    """A reply with its body read to the end (a streamed one joined), for callers that want it whole."""
    status, headers, body = reply
    if isinstance(body, bytes):
        return status, headers, body
    with contextlib.closing(body):
        return status, headers, b"".join(body)


def _hung_up(sock: socket.socket) -> bool:
    """The caller closed its end: its socket reads as ended (a client sends nothing while it reads a response)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _passed_on(first: bytes, stream: Iterator[bytes]) -> Iterator[bytes]:
    with contextlib.closing(stream):
        if first:
            yield first
        yield from stream


def proxy_event(method: str, target: str, headers: list[tuple[str, str]], body: bytes, source_ip: str) -> dict[str, Any]:
    """The REST API proxy event (payload v1) for one HTTP request, as API Gateway builds it."""
    url = urlsplit(target)
    single: dict[str, str] = {}
    multi: dict[str, list[str]] = {}
    for name, value in headers:
        if name.lower() in _DROPPED_HEADERS:
            continue
        single[name] = value
        multi.setdefault(name, []).append(value)
    trace = f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]}"
    for name, value in (("X-Forwarded-For", source_ip), ("X-Forwarded-Proto", "http"), ("X-Amzn-Trace-Id", trace)):
        single[name] = value
        multi[name] = [value]
    query = parse_qs(url.query, keep_blank_values=True)
    now = time.time()
    user_agent = next((v for k, v in headers if k.lower() == "user-agent"), None)
    return {
        "resource": "/{proxy+}",
        "path": url.path,
        "httpMethod": method,
        "headers": single or None,
        "multiValueHeaders": multi or None,
        "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": {"proxy": url.path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "resourceId": "local",
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "extendedRequestId": uuid.uuid4().hex[:16],
            "requestTime": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "path": f"/{STAGE}{url.path}",
            "accountId": ACCOUNT,
            "protocol": "HTTP/1.1",
            "stage": STAGE,
            "domainPrefix": "localhost",
            "requestTimeEpoch": int(now * 1000),
            "requestId": str(uuid.uuid4()),
            "identity": {
                "cognitoIdentityPoolId": None, "accountId": None, "cognitoIdentityId": None, "caller": None,
                "sourceIp": source_ip, "principalOrgId": None, "accessKey": None, "cognitoAuthenticationType": None,
                "cognitoAuthenticationProvider": None, "userArn": None, "userAgent": user_agent, "user": None,
            },
            "domainName": "localhost",
            "apiId": API_ID,
        },
        "body": base64.b64encode(body).decode() if body else None,
        "isBase64Encoded": bool(body),
    }


def _as_sigv4_caller(event: dict[str, Any], user_arn: str) -> None:
    """What API Gateway puts in requestContext.identity after an AWS_IAM method authenticated the caller."""
    parts = user_arn.split(":")
    account = parts[4] if len(parts) > 5 else ACCOUNT
    session = user_arn.rsplit("/", 1)[-1]
    event["requestContext"]["identity"].update(
        userArn=user_arn, accountId=account, caller=f"AROALOCAL:{session}", user=f"AROALOCAL:{session}",
        accessKey="ASIALOCALEMULATED0000",
    )


def _header(event: dict[str, Any], name: str) -> str | None:
    for key, value in (event.get("headers") or {}).items():
        if key.lower() == name:
            return value
    return None


def _authorizer_event(event: dict[str, Any]) -> dict[str, Any]:
    method_arn = f"arn:aws:execute-api:local:{ACCOUNT}:{API_ID}/{STAGE}/{event['httpMethod']}{event['path']}"
    return {
        "type": "REQUEST",
        "methodArn": method_arn,
        **{k: event[k] for k in ("resource", "path", "httpMethod", "headers", "multiValueHeaders",
                                 "queryStringParameters", "multiValueQueryStringParameters", "pathParameters",
                                 "stageVariables", "requestContext")},
    }


def _http_response(result: dict[str, Any]) -> HttpReply:
    if not isinstance(result, dict) or not isinstance(result.get("statusCode"), int):
        return _api_gateway_error(502, "Internal server error")
    headers = [(k, str(v)) for k, v in (result.get("headers") or {}).items()]
    for name, values in (result.get("multiValueHeaders") or {}).items():
        headers.extend((name, str(v)) for v in values)
    body = result.get("body") or ""
    data = base64.b64decode(body) if result.get("isBase64Encoded") else body.encode()
    return result["statusCode"], headers, data


def _shaped(status: int, openai_type: str, systemone_type: str, code: str, message: str) -> HttpReply:
    """An answer of the API in front of the function, in the body both SDKs parse."""
    body = {**openai_body(message, openai_type, code), **system_one_body(systemone_type, message)}
    return status, [("Content-Type", "application/json")], json.dumps(body).encode()


def _api_gateway_error(status: int, message: str | None, error_type: str | None = None) -> HttpReply:
    headers = [("Content-Type", "application/json")]
    if error_type:
        headers.append(("x-amzn-ErrorType", error_type))
    return status, headers, json.dumps({"message": message}).encode()


class _LambdaContext:
    function_name = "decision-gateway-local"
    function_version = "$LATEST"
    invoked_function_arn = f"arn:aws:lambda:local:{ACCOUNT}:function:decision-gateway-local"
    memory_limit_in_mb = 256
    log_group_name = "/aws/lambda/decision-gateway-local"
    log_stream_name = "local"

    def __init__(self, timeout_s: float = INTEGRATION_TIMEOUT_S) -> None:
        self.aws_request_id = str(uuid.uuid4())
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def make_server(host: str, port: int, gateway: LocalApiGateway | None = None) -> ThreadingHTTPServer:
    gateway = gateway or LocalApiGateway()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "decision-gateway-local"
        # Headers and body are separate writes: without TCP_NODELAY, keep-alive clients
        # wait out a 40 ms delayed ACK on every response.
        disable_nagle_algorithm = True

        def _serve(self) -> None:
            length = self.headers.get("Content-Length")
            if length is not None and (not length.isdigit() or int(length) > MAX_REQUEST_BYTES):
                status, headers, data = _api_gateway_error(*REQUEST_TOO_LONG)
                self.close_connection = True
            else:
                body = self.rfile.read(int(length)) if length else b""
                status, headers, data = gateway.handle(self.command, self.path, list(self.headers.items()), body,
                                                       self.client_address[0])
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                    self.send_header(name, value)
            if isinstance(data, bytes):
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._write_chunks(data)

        def _write_chunks(self, chunks: Iterator[bytes]) -> None:
            """A streamed body, each chunk sent as it comes; a caller that hangs up closes the stream."""
            with contextlib.closing(chunks):
                try:
                    for chunk in chunks:
                        if _hung_up(self.connection):
                            raise BrokenPipeError  # a write would still succeed once after the caller's FIN
                        if chunk:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:  # BrokenPipeError, ConnectionResetError: the caller went
                    self.close_connection = True
                except Exception:
                    log.exception("the response stream failed")
                    self.close_connection = True  # an unterminated chunked body: the caller sees it cut

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

        def log_message(self, format: str, *args: Any) -> None:  # the function logs each request itself
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.local", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3000)
    parser.add_argument("--instances", type=int, default=8, help="most function instances at once (Lambda concurrency)")
    iam = parser.add_mutually_exclusive_group()
    iam.add_argument("--no-iam-emulation", action="store_true", help="refuse X-Local-Iam-Principal altogether")
    iam.add_argument("--expose-iam-emulation", action="store_true",
                     help="listen on a non-loopback address with X-Local-Iam-Principal still honoured (from loopback only)")
    parser.add_argument("--no-throttling", action="store_true", help="do not enforce the tenants' rate and burst")
    args = parser.parse_args(argv)
    if args.host not in _LOOPBACK and not (args.no_iam_emulation or args.expose_iam_emulation):
        print(f"gateway: refusing to listen on {args.host} with X-Local-Iam-Principal enabled (anyone who can send it"
              " acts as any IAM principal): pass --no-iam-emulation, or --expose-iam-emulation", file=sys.stderr)
        return 2
    from gateway.observability import configure_logging
    from gateway.settings import GatewaySettings, SettingsError

    configure_logging()
    try:
        GatewaySettings.from_env()  # refuse to start on a bad configuration, before the first request
    except SettingsError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "DecisionGateway")
    os.environ.setdefault("GATEWAY_OPENAPI", "1")  # the API reference at /v1/openapi, on this machine
    functions = ProcessFunctions(max_instances=args.instances)
    authorizer = authorizers.Authorizer(authorizers.authenticator_from_env())
    usage_plans = None if args.no_throttling else LocalUsagePlans(authorizer.limits)
    server = make_server(args.host, args.port, LocalApiGateway(functions, authorizer=authorizer, usage_plans=usage_plans,
                                                               iam_emulation=not args.no_iam_emulation))
    print(f"gateway listening on http://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        functions.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
