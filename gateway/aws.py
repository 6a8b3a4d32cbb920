"""The boto3 clients for the AWS services the gateway itself reads and writes (DynamoDB,
Secrets Manager, SSM, API Gateway), made in one place.

`GATEWAY_AWS_ENDPOINT_URL` points all of them at one endpoint instead of AWS's: under
`sam local` the function reaches a local stand-in for those services (moto's server) that
way, since the SAM CLI passes a function only the variables its template declares. Empty
in AWS. SageMaker endpoints are not among them: each carries its own `endpoint_url` in
the model settings.
"""

from __future__ import annotations

import os
from typing import Any

ENDPOINT_URL_VARIABLE = "GATEWAY_AWS_ENDPOINT_URL"


def hot_path_config() -> Any:
    """Short timeouts and one retry: the authorizer has 10 s and callers are waiting, so a
    slow store is a quick refusal (503, or the authorizer's `unverified`), never a hang
    that API Gateway turns into its own 500."""
    from botocore.config import Config

    # `total_max_attempts` counts the first call; botocore reads `max_attempts` as retries only.
    return Config(connect_timeout=1, read_timeout=2, retries={"total_max_attempts": 2, "mode": "standard"})


def client(service: str, *, hot_path: bool = False) -> Any:
    import boto3

    options: dict[str, Any] = {}
    if endpoint_url := os.environ.get(ENDPOINT_URL_VARIABLE, "").strip():
        options["endpoint_url"] = endpoint_url
    if hot_path:
        options["config"] = hot_path_config()
    return boto3.client(service, **options)
