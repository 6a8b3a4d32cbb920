"""What only tests need around the in-process gateway (devkit.gateway_stack builds it): the
function's reply parsed, credentials and tenants in a store."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from devkit.gateway_stack import call_installed
from gateway.functions.handler import GatewayFunction


def call(ev: dict[str, Any], function: GatewayFunction | None = None) -> tuple[int, dict[str, str], Any]:
    """Invoke `function` (by default the one devkit.gateway_stack's `install` built last);
    returns (status, lower-cased headers, parsed JSON body or text)."""
    result = function(ev, None) if function is not None else call_installed(ev, None)
    headers = {k.lower(): v for k, v in (result.get("headers") or {}).items()}
    for name, values in (result.get("multiValueHeaders") or {}).items():
        headers[name.lower()] = values[-1]
    body = result.get("body") or ""
    if result.get("isBase64Encoded"):
        body = base64.b64decode(body).decode()
    try:
        return result["statusCode"], headers, json.loads(body)
    except ValueError:
        return result["statusCode"], headers, body


def multipart(fields: dict[str, bytes], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    """A multipart/form-data body as the OpenAI SDK sends one (its fields, then its files), and its Content-Type."""
    boundary = "----boundary7MA4YWxkTrZu0gW"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value + b"\r\n"
             for name, value in fields.items()]
    parts += [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
              f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n"
              for name, (filename, data) in files.items()]
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def register_credentials(store: Any, *contexts: dict[str, str]) -> None:
    """Store an API key record for each authorizer context's credential, so that the
    function's revocation check (which looks the key up on every request) finds it live."""
    from gateway.auth.store import ApiKeyRecord

    for context in contexts:
        if store.tenants.get_api_key(context["credential_id"]) is None:
            store.tenants.put_api_key(ApiKeyRecord(context["credential_id"], context["tenant_id"], "unused", tuple(context["scopes"].split()),
                                           None, 0.0))


def tenant_store(path: Any, *tenants: str) -> Any:
    """A real SQLite store at `path` holding the named tenants (default limits)."""
    from gateway.auth.tenants import create_tenant
    from gateway.stores.sqlite import open_sqlite

    store = open_sqlite(path)
    for tenant in tenants:
        create_tenant(store.tenants, tenant)
    return store


def unthrottled(store: Any, *tenants: str) -> None:
    """Limits no test traffic reaches, for stacks whose subject is not the per-tenant throttle
    (a module's tests in a row send more than a tenant's default 20 requests in 2 s)."""
    from gateway.auth.tenants import set_limits

    for tenant in tenants:
        set_limits(store.tenants, tenant, rate_per_s=10_000, burst=100_000, max_in_flight=10_000)


@contextlib.contextmanager
def dynamodb_tenant_store(monkeypatch: Any, *tenants: str) -> Iterator[Any]:
    """Every store of a deployment on DynamoDB (moto, in process), its tables made as the
    template makes them, holding the named tenants: `tenant_store`'s counterpart."""
    import boto3
    from moto import mock_aws

    from gateway.auth.tenants import create_tenant
    from gateway.stores.dynamodb import DynamoDBTables, create_tables, dynamodb_stores

    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)  # moto takes any credential: placeholders
    with mock_aws():
        tables = DynamoDBTables("dg-tenants", "dg-keys", "dg-catalogs", "dg-records", "dg-batches", "dg-batch-files")
        create_tables(boto3.client("dynamodb"), tables)
        boto3.client("s3").create_bucket(Bucket=tables.batch_bucket)
        store = dynamodb_stores(boto3.client("dynamodb"), tables, s3=boto3.client("s3"))
        for tenant in tenants:
            create_tenant(store.tenants, tenant)
        yield store


@contextlib.contextmanager
def aws_batch_store(monkeypatch: Any) -> Iterator[Any]:
    """The batch store of a deployment in AWS: DynamoDB and S3 (moto, in process)."""
    with dynamodb_tenant_store(monkeypatch) as stores:
        yield stores.batches


@contextlib.contextmanager
def served(principal: dict[str, str]) -> Iterator[str]:
    """The installed function behind the local runner, its authorizer accepting every caller as
    `principal`: the base URL an SDK client takes (+ /v1)."""
    import threading

    from devkit.local import InProcessFunction, LocalApiGateway, make_server

    context = {k: v for k, v in principal.items() if k != "principalId"}
    accept = lambda ev, ctx: {"principalId": principal["principalId"], "context": context}  # noqa: E731
    server = make_server("127.0.0.1", 0, LocalApiGateway(InProcessFunction(call_installed), authorizer=accept))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def asynchronous_inference(pool: Any, answer: Any) -> list[dict[str, Any]]:
    """SageMaker's side of the asynchronous pool's InvokeEndpointAsync, for `pool`'s client: the
    call answered once botocore has validated and serialized it against the service model (where
    the Stubber answers), its input read from S3 and given to `answer` (the invocation's JSONL
    body: the scorer's answer, bytes, or None for an invocation that fails), the answer or the
    failure written where the reply says, and the SNS notice SageMaker publishes kept in the list
    returned (the caller hands each to the notice function)."""
    import uuid

    import boto3
    from botocore.awsrequest import AWSResponse

    notices: list[dict[str, Any]] = []
    s3 = boto3.client("s3")  # SageMaker's own, not the gateway's: its calls are none of the gateway's grants

    def invoke(params: dict[str, Any], model: Any, **_: Any) -> tuple[Any, dict[str, Any]] | None:
        if model.name != "InvokeEndpointAsync":
            return None
        headers = params["headers"]
        location, inference_id = headers["X-Amzn-SageMaker-InputLocation"], headers["X-Amzn-SageMaker-Inference-Id"]
        bucket, key = location.removeprefix("s3://").split("/", 1)
        out, failed = f"async/out/{uuid.uuid4()}.out", f"async/failed/{uuid.uuid4()}.out"
        written = answer(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        notice = {"awsRegion": "us-east-1", "eventName": "InferenceResult", "eventSource": "aws:sagemaker",
                  "eventVersion": "1.0", "inferenceId": inference_id,
                  "requestParameters": {"contentType": headers["X-Amzn-SageMaker-Content-Type"], "endpointName": pool.endpoint_name,
                                        "inputLocation": location}}
        if written is None:
            s3.put_object(Bucket=bucket, Key=failed, Body=b"ClientError: Received server error (500) from model")
            notice |= {"invocationStatus": "Failed", "failureReason": "ClientError: Received server error (500)"}
        else:
            s3.put_object(Bucket=bucket, Key=out, Body=written)
            notice |= {"invocationStatus": "Completed",
                       "responseParameters": {"contentType": "application/jsonlines", "outputLocation": f"s3://{bucket}/{out}"}}
        notices.append(notice)
        return AWSResponse(location, 202, {}, None), {"InferenceId": inference_id, "OutputLocation": f"s3://{bucket}/{out}",
                                                      "FailureLocation": f"s3://{bucket}/{failed}"}

    # On the event's root, where a test's own handlers (registered first) still see the call
    pool.sagemaker.meta.events.register("before-call", invoke)
    return notices
