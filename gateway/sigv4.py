"""AWS Signature Version 4 for the gateway's own SageMaker runtime client, and the
credentials it signs with.

Why not botocore: importing it and building a client is most of a cold start (its
service model, endpoint rules and partitions are read and parsed for one operation), and
a decision's endpoint call is one signed POST. botocore stays for everything else (the
DynamoDB, Secrets Manager and SSM clients) and for credentials outside Lambda.
tests/unit/gateway/test_sigv4.py signs the same requests with botocore's SigV4Auth and
compares, so this cannot drift from AWS's algorithm unnoticed.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import os
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"
# Never signed: a proxy may change them, and botocore leaves them out too.
_UNSIGNED = frozenset({"user-agent", "expect", "content-length", "transfer-encoding", "x-amzn-trace-id"})


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:  # never a secret in a log line or a traceback
        return f"Credentials(access_key={self.access_key[:4]}…)"


def sign(method: str, host: str, path: str, headers: dict[str, str], body: bytes, *, region: str, service: str,
         credentials: Credentials, now: datetime.datetime | None = None) -> dict[str, str]:
    """The headers to send: the given ones, `Host`, `X-Amz-Date`, the session token and
    `Authorization`. `path` is the request's path as sent (already percent-encoded); the
    query string is empty (SageMaker's runtime takes none)."""
    now = now or datetime.datetime.now(datetime.UTC)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    signed = {"host": host, **{k.lower(): v for k, v in headers.items()}, "x-amz-date": stamp}
    if credentials.token:
        signed["x-amz-security-token"] = credentials.token
    names = sorted(name for name in signed if name not in _UNSIGNED)
    canonical = "\n".join([
        method,
        quote(path, safe="/~"),  # every service but S3 encodes the (encoded) path once more
        "",
        "".join(f"{name}:{' '.join(str(signed[name]).split())}\n" for name in names),
        ";".join(names),
        hashlib.sha256(body).hexdigest(),
    ])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + credentials.secret_key).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {**headers, "Host": host, "X-Amz-Date": stamp}
    if credentials.token:
        out["X-Amz-Security-Token"] = credentials.token
    out["Authorization"] = (f"{ALGORITHM} Credential={credentials.access_key}/{scope}, "
                            f"SignedHeaders={';'.join(names)}, Signature={signature}")
    return out


# -- credentials -----------------------------------------------------------------------------


def current_credentials() -> Credentials:
    """The function's credentials now. In Lambda they are in the environment (read on every
    call, so a value the runtime replaces is never held past its time); anywhere else
    (SnapStart's container credentials, a profile, an instance role) botocore's provider
    chain finds and refreshes them, built on the first call that needs it."""
    access_key = os.environ.get("AWS_ACCESS_KEY_ID", "")
    secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    if access_key and secret_key:
        return Credentials(access_key, secret_key, os.environ.get("AWS_SESSION_TOKEN") or None)
    return _botocore_credentials()


class MissingCredentials(RuntimeError):
    """No credentials anywhere botocore looks: a deployment's fault, never a caller's."""


_RESOLVER: Any = None  # botocore's provider chain: found, not yet asked
_CHAIN: Any = None  # what it found (refreshable where the source expires: container, SSO, role)
_CHAIN_LOCK = threading.Lock()


def prepare_credentials() -> None:
    """In the init phase, when the environment holds no credentials (a SnapStart function
    gets the container's credential endpoint instead): load botocore's provider chain now,
    so a snapshot carries its import, but fetch nothing: the SageMaker calls' credentials
    are fetched after any restore. (botocore's own clients for the stores resolve theirs
    when they are built, in the init phase: a snapshot carries those, refreshable, and
    botocore refreshes them by their expiry.)"""
    if not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")):
        with contextlib.suppress(Exception):  # a missing profile, a broken config file: said by the first call that signs
            _resolver()


def _resolver() -> Any:
    global _RESOLVER
    with _CHAIN_LOCK:
        if _RESOLVER is None:
            from gateway import aws

            _RESOLVER = aws.session().get_component("credential_provider")
        return _RESOLVER


# A chain that found nothing, or whose source failed (the container's endpoint down), is
# asked again after this: not by every call, each waiting out botocore's retries in turn.
_FAILED_FOR_S = 5.0
_FAILED: tuple[float, Exception] | None = None


def _botocore_credentials() -> Credentials:
    global _CHAIN, _FAILED
    resolver = _resolver()
    with _CHAIN_LOCK:  # one fetch at a time: the others wait for its answer, then read it
        failure = None
        if _CHAIN is None:
            if _FAILED is not None and time.monotonic() - _FAILED[0] <= _FAILED_FOR_S:
                failure = _FAILED[1]
            else:
                try:
                    _CHAIN = resolver.load_credentials()  # the first call that signs: after any restore
                    if _CHAIN is None:
                        raise MissingCredentials("none found (environment, container, profile or instance role)")
                    _FAILED = None
                except Exception as exc:  # remembered, and raised below
                    _FAILED, failure = (time.monotonic(), exc), exc
        chain = _CHAIN
    if chain is None:
        raise MissingCredentials(f"no AWS credentials ({type(failure).__name__}: {failure})") from failure
    frozen = chain.get_frozen_credentials()
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token or None)


def forget_credentials() -> None:
    """Find credentials again on the next call (tests that change the environment; with
    `gateway.aws.reset_session`)."""
    global _CHAIN, _RESOLVER, _FAILED
    with _CHAIN_LOCK:
        _CHAIN = _RESOLVER = _FAILED = None
