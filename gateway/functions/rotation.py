"""Secrets Manager rotation for the token signing keys (`gateway.functions.rotation.lambda_handler`).

The four rotation steps, for a secret holding the key document of `gateway.auth.tokens`:
createSecret stages a document with a new current key beside the old ones (AWSPENDING);
setSecret has nothing to update elsewhere; testSecret checks the staged document parses
and can sign; finishSecret makes it AWSCURRENT. Old keys stay for twice the longest
token life, so tokens signed before a rotation keep verifying until they expire.
"""

from __future__ import annotations

import logging
from typing import Any

from gateway.auth.tokens import new_key_document, parse_key_document

log = logging.getLogger("gateway.functions.rotation")


def lambda_handler(event: dict[str, Any], context: Any, client: Any = None) -> None:
    from gateway.observability import configure_logging

    configure_logging()
    if client is None:
        from gateway import aws

        client = aws.client("secretsmanager")
    arn, token, step = event["SecretId"], event["ClientRequestToken"], event["Step"]
    stages = client.describe_secret(SecretId=arn).get("VersionIdsToStages", {})
    if token not in stages:
        raise ValueError("the rotation's version is not a version of this secret")
    if "AWSCURRENT" in stages[token]:
        log.info("rotation already finished", extra={"step": step})
        return
    if "AWSPENDING" not in stages[token]:
        raise ValueError("the rotation's version is not staged AWSPENDING")
    log.info("rotation step", extra={"step": step})
    if step == "createSecret":
        _create(client, arn, token)
    elif step == "setSecret":
        pass  # the keys live only in this secret: nothing else to update
    elif step == "testSecret":
        pending = client.get_secret_value(SecretId=arn, VersionId=token, VersionStage="AWSPENDING")["SecretString"]
        parse_key_document(pending)
    elif step == "finishSecret":
        current = next(version for version, names in stages.items() if "AWSCURRENT" in names)
        client.update_secret_version_stage(SecretId=arn, VersionStage="AWSCURRENT", MoveToVersionId=token,
                                           RemoveFromVersionId=current)
    else:
        raise ValueError(f"unknown rotation step {step!r}")


def _create(client: Any, arn: str, token: str) -> None:
    try:
        client.get_secret_value(SecretId=arn, VersionId=token, VersionStage="AWSPENDING")
        return  # a retried step: the pending document exists
    except client.exceptions.ResourceNotFoundException:
        pass
    current = client.get_secret_value(SecretId=arn, VersionStage="AWSCURRENT")["SecretString"]
    client.put_secret_value(SecretId=arn, ClientRequestToken=token, SecretString=new_key_document(current),
                            VersionStages=["AWSPENDING"])
