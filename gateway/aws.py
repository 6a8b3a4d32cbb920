"""The botocore clients of the gateway's functions, made in one place from one session:
the stores' (DynamoDB, Secrets Manager, SSM, API Gateway) and SageMaker's runtime.

`GATEWAY_AWS_ENDPOINT_URL` points the stores' clients at one endpoint instead of AWS's:
under `sam local` the functions reach a local stand-in for those services (moto's server)
that way, since the SAM CLI passes a function only the variables its template declares.
Empty in AWS. SageMaker's runtime is not among them: each endpoint has its own
`endpoint_url` in the model settings, or botocore's own `AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME`
(a VPC endpoint, a local stand-in), or AWS's endpoint of its region (FIPS and dual-stack
as botocore's settings say).
"""

from __future__ import annotations

import os
import threading
from typing import Any

ENDPOINT_URL_VARIABLE = "GATEWAY_AWS_ENDPOINT_URL"
# The services the local stand-in plays (moto's server, under `sam local`).
STAND_IN_SERVICES = frozenset({"dynamodb", "secretsmanager", "ssm", "apigateway", "s3", "sqs"})


def hot_path_config() -> Any:
    """Short timeouts and one retry: the authorizer has 10 s and callers are waiting, so a
    slow store is a quick refusal (503, or the authorizer's `unverified`), never a hang
    that API Gateway turns into its own 500."""
    from botocore.config import Config

    # `total_max_attempts` counts the first call; botocore reads `max_attempts` as retries only.
    return Config(connect_timeout=1, read_timeout=2, retries={"total_max_attempts": 2, "mode": "standard"})


def client(service: str, *, hot_path: bool = False, **options: Any) -> Any:
    """A botocore client of the shared session (boto3 is never imported: its resources,
    and the S3 transfer manager it loads, are nothing the functions use)."""
    if service in STAND_IN_SERVICES and (endpoint_url := os.environ.get(ENDPOINT_URL_VARIABLE, "").strip()):
        options.setdefault("endpoint_url", endpoint_url)
    if hot_path:
        options["config"] = hot_path_config()
    return session().create_client(service, **options)


_SESSION: Any = None
_SESSION_LOCK = threading.Lock()


def session() -> Any:
    """One botocore session for every client: its loader reads each service model, the
    endpoint rules and the partitions once, not once a client (most of what building a
    client costs). Credentials are resolved per client, by botocore's provider chain."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            import botocore.session

            _SESSION = botocore.session.get_session()
        return _SESSION


def reset_session() -> None:
    """Forget the shared session, so the next client reads the environment again (tests that
    change it, as moto resets boto3's default session; a function's environment never changes)."""
    global _SESSION
    with _SESSION_LOCK:
        _SESSION = None
