"""A local stand-in for what SageMaker's InvokeEndpoint makes of a container's answer.

The scorer serves `/endpoints/{name}/invocations` so that boto3's sagemaker-runtime
client, pointed here with `endpoint_url`, works unchanged in development and tests;
this module gives its errors the shape they have in AWS.
"""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from systemone.sidechannel import ORIGINAL_MESSAGE, ORIGINAL_STATUS


def as_sagemaker_runtime(response: Response, endpoint: str) -> Response:
    """What SageMaker's InvokeEndpoint makes of a container's error: HTTP 424 `ModelError`
    carrying the container's status and body, so boto3 pointed here raises exactly what
    it raises against AWS (a container 503 is ModelError with OriginalStatusCode 503)."""
    if response.status_code < 400:
        return response
    original = bytes(response.body).decode("utf-8", "replace")
    kind = "client" if response.status_code < 500 else "server"
    body = {
        "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
        "message": f"Received {kind} error ({response.status_code}) from primary with message \"{original}\".",
        ORIGINAL_STATUS: response.status_code,
        ORIGINAL_MESSAGE: original,
        "LogStreamArn": f"arn:aws:logs:local:000000000000:log-group:/aws/sagemaker/Endpoints/{endpoint}",
    }
    headers = {"x-amzn-ErrorType": "ModelError:http://internal.amazon.com/coral/com.amazonaws.sagemaker/"}
    headers.update({k: v for k, v in response.headers.items() if k.lower() in ("x-request-id", "retry-after")})
    return JSONResponse(body, status_code=424, headers=headers)


