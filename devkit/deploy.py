"""From an AWS account to a verified stack and back: `python -m devkit.deploy deploy | teardown`.

`make deploy` runs, in order: who the credentials are (STS); the scorer image built for the
endpoint's platform on a base pinned by digest and pushed to ECR (skipped when the
repository holds this revision already); the model packed with its manifest and hashes
and uploaded to S3 under its manifest's hash (skipped when there); `sam build` and
`sam deploy` with every parameter it decides stated and saved in samconfig.toml (the config
environment DEPLOY_ENV); the first tenant and an API key, written only to the terminal or
a 0600 file; then `make smoke` against the stack's ApiUrl. The first run asks for what it
cannot know (region, instance type, the optional ARNs), showing the default; later runs
read samconfig.toml.

`make teardown` lists what the stack holds, deletes the stack once the operator types its
name, then lists what the deletion left behind (tables, secrets, the image, the model
object, the endpoints' log groups) and deletes each only when the operator types its
name; a secret is scheduled for deletion with its 30-day recovery window, never at once.

With `--dry-run` (DRY_RUN=1) nothing reaches AWS and no command runs: every AWS call is
printed (`aws service.Operation {parameters}`, after botocore validated the parameters
against the service's model), answered by moto's in-memory AWS, or for CloudFormation by
what the stack would answer, and every command is printed (`$ ...`). No credentials are
needed, and no secret is printed: an API key, the registry password and any credential
are never in what either command prints.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from botocore.exceptions import BotoCoreError, ClientError

ROOT = Path(__file__).resolve().parents[1]
SAM = ROOT / ".cache" / "tools" / "bin" / "sam"
SAMCONFIG = ROOT / "samconfig.toml"
REPOSITORY = "decision-gateway-scorer"
BASE_IMAGE = "python:3.11-slim-bookworm"  # the scorer Dockerfile's CPU base (BASE=cpu)
DRY_ACCOUNT = "123456789012"
SINGLE_PUT_LIMIT = 5 * 1024**3  # S3's largest single PutObject
SECRET_RECOVERY_DAYS = 30
STACK_WAIT_S = 3600
STACK_POLL_S = 15
# What a printed call never shows: values of these parameters, and anything shaped like a key.
HIDDEN_PARAMETERS = re.compile(r"password|secret(string|binary)|token|credential|key_hash", re.I)
CREDENTIAL = re.compile(r"dgk_[A-Za-z0-9_\-]+|dgt_[A-Za-z0-9_.\-]+")


# -- the settings of one deployment -------------------------------------------------------

@dataclass
class Deployment:
    """What one stack is made of; saved in samconfig.toml's DEPLOY_ENV sections by sam."""

    config_env: str
    stack: str
    region: str
    model: Path
    instance_type: str = "ml.c7i.xlarge"
    min_instances: int = 1
    max_instances: int = 2
    architecture: str = "arm64"  # the functions'; the endpoint's platform follows its instance type
    stage: str = "dev"
    tenant: str = "first"
    operator_role_arn: str = ""
    alarm_topic_arn: str = ""
    log_retention_days: int = 30
    record_retention_days: int = 90
    key_file: Path | None = None
    saved: dict[str, str] = field(default_factory=dict)  # parameter_overrides already in samconfig.toml

    @property
    def platform(self) -> str:
        """The scorer image's platform: Graviton instance families (c7g, m6gd...) run arm64."""
        family = self.instance_type.split(".")[1] if self.instance_type.count(".") == 2 else ""
        return "linux/arm64" if re.fullmatch(r"[a-z]+\d+g[a-z]*", family) else "linux/amd64"

    @property
    def bucket(self) -> str:
        """The model bucket of the last deploy (from its ModelDataUrl), else none chosen yet."""
        url = self.saved.get("ModelDataUrl", "")
        return url[len("s3://"):].split("/", 1)[0] if url.startswith("s3://") else ""


def saved_parameters(config_env: str, path: Path = SAMCONFIG) -> dict[str, str]:
    """samconfig.toml's settings for `config_env`: the stack name, the region and the overrides."""
    document = tomllib.loads(path.read_text()) if path.exists() else {}
    section = document.get(config_env, {})
    found: dict[str, str] = {}
    for command in ("global", "deploy"):
        parameters = section.get(command, {}).get("parameters", {})
        found.update({k: str(v) for k, v in parameters.items() if k in ("stack_name", "region")})
        overrides = parameters.get("parameter_overrides", "")
        if isinstance(overrides, list):
            overrides = " ".join(overrides)
        for word in shlex.split(overrides):
            name, _, value = word.partition("=")
            found[name] = value.strip('"')
    return found


# -- AWS calls, printed and (in a dry run) answered without being sent ---------------------

class AwsApi:
    """botocore clients whose every call is printed once botocore has validated it against
    the service's model. In a dry run nothing is sent: moto's in-memory AWS answers, and
    CloudFormation (whose stack `sam deploy` would have made) answers from `stack_reply`."""

    def __init__(self, region: str, out: TextIO, dry_run: bool, stack_reply: Callable[[str, dict], dict] | None = None):
        import botocore.session

        from gateway import aws as gateway_aws

        self.region, self.out, self.dry_run, self.stack_reply = region, out, dry_run, stack_reply
        self.session = botocore.session.get_session()
        # The gateway's own session too: the admin CLI's store makes its clients from it.
        for session in (self.session, gateway_aws.session()):
            session.register("before-parameter-build", self._keep_parameters)
            session.register("before-call", self._print_call)
        self._sessions = (self.session, gateway_aws.session())

    def close(self) -> None:
        for session in self._sessions:
            session.unregister("before-parameter-build", self._keep_parameters)
            session.unregister("before-call", self._print_call)

    def client(self, service: str) -> Any:
        return self.session.create_client(service, region_name=self.region)

    def _keep_parameters(self, params: dict, model: Any, context: dict, **_: Any) -> None:
        context["printed_parameters"] = dict(params)

    def _print_call(self, model: Any, context: dict, **_: Any) -> Any:
        service = model.service_model.service_name
        params = context.get("printed_parameters", {})
        print(f"aws {service}.{model.name} {json.dumps(printable(params), sort_keys=True, default=str)}",
              file=self.out, flush=True)
        if self.stack_reply is not None and service == "cloudformation":
            from botocore.awsrequest import AWSResponse

            return AWSResponse("https://dry-run.invalid/", 200, {}, None), self.stack_reply(model.name, params)
        return None


def printable(value: Any, name: str = "", hidden: bool = False) -> Any:
    """Parameters as printed: a secret's value (by its parameter's name) is `<hidden>`, its
    shape kept (so that what is printed still validates), and anything shaped like a key is too."""
    hidden = hidden or bool(HIDDEN_PARAMETERS.search(name))
    if isinstance(value, dict):
        return {k: printable(v, k, hidden) for k, v in value.items()}
    if isinstance(value, list):
        return [printable(v, name, hidden) for v in value]
    if name == "Body":
        return "<the file's bytes>"
    if isinstance(value, str):
        return "<hidden>" if hidden else CREDENTIAL.sub("<a credential>", value)
    return value


def error_code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def unless_gone(call: Callable[[], dict], *gone: str) -> dict | None:
    """The call's answer, or None when AWS answers that the resource is not there (`gone`)."""
    try:
        return call()
    except ClientError as exc:
        if error_code(exc) in gone:
            return None
        raise


# -- commands, printed and (unless a dry run) run ------------------------------------------

@dataclass
class Shell:
    out: TextIO
    dry_run: bool

    def run(self, command: list[str], *, placeholder: str = "", stdin: str | None = None,
            env: dict[str, str] | None = None, capture: bool = False) -> str:
        """Print `command`, then run it (its output to the terminal, or returned when captured)."""
        print(f"$ {shown(command, env)}", file=self.out, flush=True)
        if self.dry_run:
            return placeholder
        done = subprocess.run([str(c) for c in command], input=stdin, text=True, cwd=ROOT,
                              env={**os.environ, **(env or {})}, stdout=subprocess.PIPE if capture else None)
        if done.returncode != 0:
            raise DeployError(f"`{shlex.join(str(c) for c in command[:3])} ...` exited with status {done.returncode}")
        return (done.stdout or "").strip()


def shown(command: list[Any], env: dict[str, str] | None = None) -> str:
    """A command as the deploy page writes it: with the virtual environment active and
    .cache/tools/bin on PATH, `python` and `sam` are this interpreter and the SAM CLI."""
    names = {sys.executable: "python", str(SAM): "sam"}
    words = [names.get(str(c), str(c)) for c in command]
    return shlex.join([*(f"{k}={v}" for k, v in (env or {}).items()), *words])


class DeployError(Exception):
    """A step could not be done; the message says which and why."""


def say(out: TextIO, text: str) -> None:
    print(f"\n== {text}", file=out, flush=True)


def ask(question: str, default: str, interactive: bool) -> str:
    if not interactive:
        return default
    answer = input(f"{question} [{default}]: ").strip()
    return answer or default


def count(what: str, answer: str) -> int:
    if not answer.strip().isdigit() or not 0 < int(answer) <= 100:
        raise DeployError(f"{what}: {answer!r} is not a whole number from 1 to 100")
    return int(answer)


def confirm_by_name(what: str, name: str, interactive: bool, out: TextIO, dry_run: bool) -> bool:
    """Whether the operator typed `name` to confirm deleting `what`; a dry run says it would ask."""
    if dry_run:
        print(f"   (would ask to type {name!r} to delete {what}; shown as if typed)", file=out)
        return True
    if not interactive:
        print(f"   kept {what} {name}: no terminal to confirm on", file=out)
        return False
    answer = input(f"   Type {name} to delete {what} (Enter keeps it): ").strip()
    return answer == name


# -- make deploy ---------------------------------------------------------------------------

def deploy(plan: Deployment, api: AwsApi, shell: Shell, out: TextIO, interactive: bool) -> int:
    account = api.client("sts").get_caller_identity()["Account"]
    print(f"account {account}, region {plan.region}, stack {plan.stack} (config env {plan.config_env})", file=out)
    image = scorer_image(plan, api, shell, out, account)
    model_url, pins = model_artifact(plan, api, shell, out, account)
    parameters = {
        "Stage": plan.stage, "Architecture": plan.architecture, "DeployCpuEndpoint": "true",
        "DeployGpuEndpoint": "false", "CpuImageUri": image, "CpuInstanceType": plan.instance_type,
        "CpuMinInstances": str(plan.min_instances), "CpuMaxInstances": str(plan.max_instances),
        "ModelDataUrl": model_url, **pins, "OperatorRoleArn": plan.operator_role_arn,
        "AlarmTopicArn": plan.alarm_topic_arn, "LogRetentionDays": str(plan.log_retention_days),
        "RecordRetentionDays": str(plan.record_retention_days),
    }
    say(out, "the functions and the stack (sam build, sam deploy)")
    shell.run([SAM, "build", "--config-env", plan.config_env], env={"LAMBDA_ARCH": plan.architecture})
    shell.run([SAM, "deploy", "--config-env", plan.config_env, "--stack-name", plan.stack, "--region", plan.region,
               "--parameter-overrides", *(f"{k}={v}" for k, v in parameters.items() if v), "--save-params"])
    outputs = stack_outputs(api, plan.stack)
    say(out, f"the first tenant ({plan.tenant}) and its API key")
    key = first_key(plan, outputs, shell, out, interactive)
    say(out, "smoke (make smoke against the stack's ApiUrl)")
    url = outputs["ApiUrl"]
    if key is None:
        print(f"run `DG_URL={url} DG_API_KEY=<the tenant's key> make smoke`", file=out)
        return 0
    print(f"$ DG_URL={url} DG_API_KEY=<the key> make smoke", file=out, flush=True)
    if shell.dry_run:
        return 0
    from devkit import smoke

    return smoke.main([], environ={**os.environ, "DG_URL": url, "DG_API_KEY": key}, out=out)


def scorer_image(plan: Deployment, api: AwsApi, shell: Shell, out: TextIO, account: str) -> str:
    """The scorer image's URI pinned by digest: built for the endpoint's platform and pushed,
    unless the repository holds this revision's tag already."""
    say(out, f"the scorer image ({plan.platform}, for {plan.instance_type})")
    ecr = api.client("ecr")
    registry = f"{account}.dkr.ecr.{plan.region}.amazonaws.com"
    revision = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip() or "unversioned"
    tag = f"cpu-{revision}-{plan.platform.split('/')[1]}"
    try:
        found = ecr.describe_images(repositoryName=REPOSITORY, imageIds=[{"imageTag": tag}])["imageDetails"]
        print(f"{REPOSITORY}:{tag} is pushed already", file=out)
        return f"{registry}/{REPOSITORY}@{found[0]['imageDigest']}"
    except ClientError as exc:
        if error_code(exc) == "RepositoryNotFoundException":
            ecr.create_repository(repositoryName=REPOSITORY, imageTagMutability="IMMUTABLE",
                                  imageScanningConfiguration={"scanOnPush": True})
        elif error_code(exc) != "ImageNotFoundException":
            raise
    # The base pinned by digest: pulled for the platform, its digest read from the registry's answer.
    shell.run(["docker", "pull", "--platform", plan.platform, BASE_IMAGE])
    base = shell.run(["docker", "image", "inspect", "--format", "{{index .RepoDigests 0}}", BASE_IMAGE],
                     placeholder=f"{BASE_IMAGE.split(':')[0]}@sha256:{'0' * 64}", capture=True)
    if "@sha256:" not in base:
        raise DeployError(f"{BASE_IMAGE} here has no registry digest (built locally by scripts/base_images.sh?):"
                          " pull the real image to release")
    image = f"{registry}/{REPOSITORY}:{tag}"
    shell.run(["docker", "build", "--platform", plan.platform, "-f", "scorer_container/Dockerfile",
               "--build-arg", "BASE=cpu", "--build-arg", f"CPU_IMAGE={base}", "-t", image, "."],
              env={"DOCKER_BUILDKIT": "1"})
    token = ecr.get_authorization_token()["authorizationData"][0]["authorizationToken"]
    password = base64.b64decode(token).decode().partition(":")[2]
    shell.run(["docker", "login", "--username", "AWS", "--password-stdin", registry], stdin=password)
    shell.run(["docker", "push", image])
    # The digest the registry gave the pushed image: what the endpoints pin.
    return shell.run(["docker", "image", "inspect", "--format", "{{index .RepoDigests 0}}", image],
                     placeholder=f"{registry}/{REPOSITORY}@{DRY_DIGEST}", capture=True)


def model_artifact(plan: Deployment, api: AwsApi, shell: Shell, out: TextIO, account: str) -> tuple[str, dict[str, str]]:
    """The model's S3 URL and its two pins: packed and uploaded under its manifest's hash."""
    from scorer_container.model_files import MANIFEST_NAME, manifest_sha256

    say(out, f"the model ({plan.model.name}: packed with its manifest, uploaded to S3)")
    gguf = next(iter(sorted(plan.model.glob("*.gguf"))), None)
    if gguf is None or not (plan.model / MANIFEST_NAME).exists():
        raise DeployError(f"{plan.model} holds no GGUF file and {MANIFEST_NAME} (MODEL: a folder as models/ has them)")
    document = json.loads((plan.model / MANIFEST_NAME).read_text())
    pins = {"ModelSha256": document["sha256"], "ModelManifestSha256": manifest_sha256(document)}
    bucket = plan.bucket or f"decision-gateway-models-{account}-{plan.region}"
    key = f"models/{plan.model.name}/{pins['ModelManifestSha256'][:16]}/model.tar.gz"
    url = f"s3://{bucket}/{key}"
    s3 = api.client("s3")
    try:
        s3.head_object(Bucket=bucket, Key=key)
        print(f"{url} is uploaded already", file=out)
        return url, pins
    except ClientError as exc:
        if error_code(exc) not in ("404", "NoSuchKey", "NoSuchBucket", "403"):
            raise
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if error_code(exc) not in ("404", "NoSuchBucket"):
            raise
        location = {} if plan.region == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": plan.region}}
        s3.create_bucket(Bucket=bucket, **location)
        s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
            "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True})
    artifact = ROOT / "build" / "model.tar.gz"
    shell.run([sys.executable, "-m", "scorer_container", "pack", gguf.relative_to(ROOT) if gguf.is_relative_to(ROOT)
               else gguf, "--output", artifact.relative_to(ROOT)])
    size = 0 if api.dry_run else artifact.stat().st_size
    if size > SINGLE_PUT_LIMIT:
        raise DeployError(f"{artifact} is {size} bytes, over S3's single upload ({SINGLE_PUT_LIMIT}): upload it with"
                          f" `aws s3 cp {artifact} {url}` and set ModelDataUrl")
    with (contextlib.nullcontext(b"") if api.dry_run else artifact.open("rb")) as body:
        # S3 checks the bytes it stored against this SHA-256 and refuses a corrupted upload.
        s3.put_object(Bucket=bucket, Key=key, Body=body, ChecksumAlgorithm="SHA256")
    return url, pins


def stack_outputs(api: AwsApi, stack: str) -> dict[str, str]:
    described = api.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in described.get("Outputs", [])}


def first_key(plan: Deployment, outputs: dict[str, str], shell: Shell, out: TextIO, interactive: bool) -> str | None:
    """The tenant (created if missing) and, unless an earlier deploy issued one, an API key;
    the key goes to the terminal or a 0600 file, never to what is printed otherwise."""
    tables = ["--dynamodb", outputs["TenantsTableName"], outputs["KeysTableName"]]
    admin_cli(shell, out, [*tables, "create-tenant", plan.tenant, "--name", "created by make deploy"])
    listed = admin_cli(shell, out, [*tables, "list-keys", "--tenant", plan.tenant])
    if any(json.loads(line).get("name") == KEY_NAME and not json.loads(line).get("revoked_at")
           for line in listed.splitlines() if line.strip()):
        print(f"   tenant {plan.tenant} holds a key from an earlier deploy: none issued", file=out)
        return None
    issued = admin_cli(shell, out, [*tables, "issue-key", "--tenant", plan.tenant, "--scopes", "chat,decide",
                                    "--name", KEY_NAME])
    key = json.loads(issued)["api_key"]
    where = plan.key_file or ROOT / "build" / "deploy" / f"{plan.stack}.key"
    if shell.dry_run:
        print(f"   (dry run: the key would be shown on the terminal, or written to {where} with mode 0600)", file=out)
        return key
    if interactive and plan.key_file is None:
        # The terminal itself, not stdout: a redirected or logged stdout never gets it.
        with open("/dev/tty", "w") as tty:
            tty.write(f"\nAPI key for tenant {plan.tenant} (shown once, only its hash is stored):\n\n    {key}\n\n")
    else:
        where.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(key + "\n")
        os.chmod(where, 0o600)
        print(f"   the key for tenant {plan.tenant} is in {where} (mode 0600)", file=out)
    return key


KEY_NAME = "make deploy"


def admin_cli(shell: Shell, out: TextIO, argv: list[str]) -> str:
    """`python -m devkit.admin ARGV`, in this process (a dry run's in-memory AWS reaches it);
    what it prints is returned, never shown: an issued key is in it."""
    from devkit import admin

    print(f"$ {shown([sys.executable, '-m', 'devkit.admin', *argv])}", file=out, flush=True)
    captured, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(errors):
        code = admin.main(argv)
    if code != 0:
        raise DeployError(f"devkit.admin {argv[3]}: {CREDENTIAL.sub('<a credential>', errors.getvalue().strip())}")
    return captured.getvalue()


# -- make teardown -------------------------------------------------------------------------

# What a deleted stack leaves: resources retained by DeletionPolicy, and what was made
# beside it (the image and the model by make deploy, the endpoints' logs by SageMaker).
@dataclass
class Leftover:
    kind: str
    name: str
    exists: Callable[[], str | None]  # a description when it still exists, else None
    delete: Callable[[], str]


def teardown(plan: Deployment, api: AwsApi, out: TextIO, interactive: bool, dry_run: bool) -> int:
    cloudformation = api.client("cloudformation")
    try:
        described = cloudformation.describe_stacks(StackName=plan.stack)["Stacks"][0]
    except ClientError as exc:
        if error_code(exc) == "ValidationError":
            print(f"no stack {plan.stack} in {plan.region}: nothing to delete", file=out)
            return 0
        raise
    parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in described.get("Parameters", [])}
    resources = []
    for page in cloudformation.get_paginator("list_stack_resources").paginate(StackName=plan.stack):
        resources.extend(page["StackResourceSummaries"])
    leftovers = retained(resources, parameters, api)
    say(out, f"the stack {plan.stack} ({described['StackStatus']}, {len(resources)} resources)")
    if not confirm_by_name("the stack", plan.stack, interactive, out, dry_run):
        print("teardown: nothing deleted", file=out)
        return 1
    cloudformation.delete_stack(StackName=plan.stack)
    wait_deleted(cloudformation, plan.stack)
    say(out, "what the deletion left behind")
    kept = []
    for leftover in leftovers:
        described_now = leftover.exists()
        if described_now is None:
            continue
        print(f" - {leftover.kind} {leftover.name}: {described_now}", file=out)
        if confirm_by_name(leftover.kind, leftover.name, interactive, out, dry_run):
            print(f"   {leftover.delete()}", file=out)
        else:
            kept.append(leftover)
    print(f"teardown: done; {len(kept)} kept" + (": " + ", ".join(k.name for k in kept) if kept else ""), file=out)
    return 0


def wait_deleted(cloudformation: Any, stack: str) -> None:
    """botocore's waiter: DescribeStacks every STACK_POLL_S (each call printed, so the wait
    shows) until the stack is gone, for at most STACK_WAIT_S."""
    from botocore.exceptions import WaiterError

    try:
        cloudformation.get_waiter("stack_delete_complete").wait(
            StackName=stack, WaiterConfig={"Delay": STACK_POLL_S, "MaxAttempts": STACK_WAIT_S // STACK_POLL_S})
    except WaiterError as exc:
        raise DeployError(f"the stack's deletion did not complete ({exc}): see"
                          f" `aws cloudformation describe-stack-events --stack-name {stack}`") from None


def retained(resources: list[dict], parameters: dict[str, str], api: AwsApi) -> list[Leftover]:
    found: list[Leftover] = []
    for resource in resources:
        kind, name = resource["ResourceType"], resource.get("PhysicalResourceId", "")
        if kind == "AWS::DynamoDB::Table":
            found.append(table(api, name))
        elif kind == "AWS::SecretsManager::Secret":
            found.append(secret(api, name))
        elif kind == "AWS::SageMaker::Endpoint":
            found.append(log_group(api, f"/aws/sagemaker/Endpoints/{endpoint_name(name)}"))
        elif kind == "AWS::S3::Bucket":
            found.append(bucket(api, name))
    if (model := parameters.get("ModelDataUrl", "")).startswith("s3://"):
        found.append(model_object(api, model))
    for parameter in ("CpuImageUri", "GpuImageUri"):
        if "@sha256:" in (uri := parameters.get(parameter, "")):
            found.append(image(api, uri))
    return found


def endpoint_name(physical_id: str) -> str:
    return physical_id.rsplit("/", 1)[-1]  # the endpoint's ARN, or its name


def table(api: AwsApi, name: str) -> Leftover:
    dynamodb = api.client("dynamodb")

    def exists() -> str | None:
        described = unless_gone(lambda: dynamodb.describe_table(TableName=name)["Table"], "ResourceNotFoundException")
        if described is None:
            return None
        return f"{described.get('ItemCount', 0)} items, {described.get('TableSizeBytes', 0)} bytes (retained on delete)"

    def delete() -> str:
        dynamodb.delete_table(TableName=name)
        return f"deleted table {name} (DynamoDB keeps a system backup of it for 35 days: point-in-time recovery was on)"

    return Leftover("table", name, exists, delete)


def bucket(api: AwsApi, name: str) -> Leftover:
    """The batch files' bucket (retained on delete): emptied, then deleted."""
    s3 = api.client("s3")

    def objects() -> Iterator[dict[str, Any]]:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            yield from page.get("Contents", [])

    def exists() -> str | None:
        if unless_gone(lambda: s3.head_bucket(Bucket=name), "404", "NoSuchBucket") is None:
            return None
        held = list(objects())
        return f"{len(held)} objects, {sum(o['Size'] for o in held)} bytes (batch files; retained on delete)"

    def delete() -> str:
        keys = [{"Key": o["Key"]} for o in objects()]
        for start in range(0, len(keys), 1000):
            s3.delete_objects(Bucket=name, Delete={"Objects": keys[start:start + 1000], "Quiet": True})
        s3.delete_bucket(Bucket=name)
        return f"deleted bucket {name} and its {len(keys)} objects"

    return Leftover("bucket", name, exists, delete)


def secret(api: AwsApi, arn: str) -> Leftover:
    secrets = api.client("secretsmanager")

    def exists() -> str | None:
        described = unless_gone(lambda: secrets.describe_secret(SecretId=arn), "ResourceNotFoundException")
        if described is None or described.get("DeletedDate"):
            return None  # scheduled for deletion already, with its recovery window
        return "still held"

    def delete() -> str:
        secrets.delete_secret(SecretId=arn, RecoveryWindowInDays=SECRET_RECOVERY_DAYS)
        return (f"secret scheduled for deletion in {SECRET_RECOVERY_DAYS} days (`aws secretsmanager restore-secret"
                f" --secret-id {arn}` until then)")

    return Leftover("secret", arn, exists, delete)


def log_group(api: AwsApi, name: str) -> Leftover:
    logs = api.client("logs")

    def exists() -> str | None:
        groups = logs.describe_log_groups(logGroupNamePrefix=name)["logGroups"]
        group = next((g for g in groups if g["logGroupName"] == name), None)
        return None if group is None else f"{group.get('storedBytes', 0)} bytes (made by SageMaker, not the stack)"

    def delete() -> str:
        logs.delete_log_group(logGroupName=name)
        return f"deleted log group {name}"

    return Leftover("log group", name, exists, delete)


def model_object(api: AwsApi, url: str) -> Leftover:
    s3 = api.client("s3")
    bucket, _, key = url[len("s3://"):].partition("/")

    def exists() -> str | None:
        head = unless_gone(lambda: s3.head_object(Bucket=bucket, Key=key), "404", "NoSuchKey", "NoSuchBucket")
        return None if head is None else f"{head.get('ContentLength', 0)} bytes (uploaded by make deploy)"

    def delete() -> str:
        s3.delete_object(Bucket=bucket, Key=key)
        return f"deleted {url} (the bucket stays: it may hold other models)"

    return Leftover("model object", url, exists, delete)


def image(api: AwsApi, uri: str) -> Leftover:
    ecr = api.client("ecr")
    repository_path, _, digest = uri.partition("@")
    repository = repository_path.split("/", 1)[1]

    def exists() -> str | None:
        found = unless_gone(lambda: ecr.describe_images(repositoryName=repository, imageIds=[{"imageDigest": digest}])
                            ["imageDetails"], "RepositoryNotFoundException", "ImageNotFoundException")
        return f"{found[0].get('imageSizeInBytes', 0)} bytes (pushed by make deploy)" if found else None

    def delete() -> str:
        ecr.batch_delete_image(repositoryName=repository, imageIds=[{"imageDigest": digest}])
        return f"deleted the image {digest} (the repository stays: it may hold other revisions)"

    return Leftover("image", uri, exists, delete)


# -- a dry run's AWS: moto, and the stack as CloudFormation would describe it --------------

@contextlib.contextmanager
def dry_run_aws(plan: Deployment, teardown_run: bool) -> Iterator[Callable[[str, dict], dict]]:
    """moto's in-memory AWS for every service but CloudFormation (whose stack would come from
    `sam deploy`), seeded for a teardown with what the stack would have left behind."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        os.environ.pop(name, None)
    import moto

    state = {"deleted": False}
    with moto.mock_aws():
        os.environ["AWS_DEFAULT_REGION"] = plan.region
        stack = seed(plan, teardown_run)

        def stack_reply(operation: str, params: dict) -> dict:
            if operation == "DeleteStack":
                state["deleted"] = True
                return {}
            if operation == "DescribeStacks":
                status = "DELETE_COMPLETE" if state["deleted"] else "UPDATE_COMPLETE"
                return {"Stacks": [{
                    "StackName": plan.stack, "CreationTime": "2026-01-01T00:00:00Z", "StackStatus": status,
                    "Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in stack.outputs.items()],
                    "Parameters": [{"ParameterKey": k, "ParameterValue": v} for k, v in stack.parameters.items()]}]}
            if operation == "ListStackResources":
                return {"StackResourceSummaries": [
                    {"LogicalResourceId": logical, "PhysicalResourceId": physical, "ResourceType": kind,
                     "ResourceStatus": "UPDATE_COMPLETE", "LastUpdatedTimestamp": "2026-01-01T00:00:00Z"}
                    for logical, kind, physical in stack.resources]}
            return {}

        yield stack_reply


@dataclass
class DryRunStack:
    """The stack as CloudFormation would describe it after `sam deploy`."""

    outputs: dict[str, str]
    parameters: dict[str, str] = field(default_factory=dict)
    resources: list[tuple[str, str, str]] = field(default_factory=list)  # logical id, type, physical id


def seed(plan: Deployment, teardown_run: bool) -> DryRunStack:
    """What AWS would hold: the stack's tables (the admin CLI writes to them); for a teardown,
    every leftover, so that the run shows each deletion it would ask for. Made with a
    session of its own: none of these calls is printed."""
    import botocore.session

    from gateway.stores.dynamodb import DynamoDBTables, create_tables

    session = botocore.session.Session()

    def client(service: str) -> Any:
        return session.create_client(service, region_name=plan.region)

    tables = {n: f"{plan.stack}-{n}Table-DRYRUN" for n in ("Tenants", "Keys", "Catalogs", "Records", "Batches")}
    stack = DryRunStack({"ApiUrl": f"https://abcdef1234.execute-api.{plan.region}.amazonaws.com/{plan.stage}",
                         **{f"{n}TableName": t for n, t in tables.items()}})
    create_tables(client("dynamodb"), DynamoDBTables(tables["Tenants"], tables["Keys"], tables["Catalogs"], tables["Records"],
                                                     tables["Batches"]))
    if not teardown_run:
        return stack
    stack.resources += [(f"{n}Table", "AWS::DynamoDB::Table", t) for n, t in tables.items()]
    files = f"{plan.stack}-batchfilesbucket-dryrun"
    location = {} if plan.region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": plan.region}}
    client("s3").create_bucket(Bucket=files, **location)
    client("s3").put_object(Bucket=files, Key="files/0123/file-dryrun", Body=b"{}\n")
    stack.resources.append(("BatchFilesBucket", "AWS::S3::Bucket", files))
    for name in ("SigningSecret", "RecordHashSecret"):
        arn = client("secretsmanager").create_secret(Name=f"{name}-DRYRUN", SecretString="dry run")["ARN"]
        stack.resources.append((name, "AWS::SecretsManager::Secret", arn))
    endpoint = "cpuendpoint-dryrun"
    stack.resources.append(("CpuEndpoint", "AWS::SageMaker::Endpoint",
                            f"arn:aws:sagemaker:{plan.region}:{DRY_ACCOUNT}:endpoint/{endpoint}"))
    client("logs").create_log_group(logGroupName=f"/aws/sagemaker/Endpoints/{endpoint}")
    bucket = f"decision-gateway-models-{DRY_ACCOUNT}-{plan.region}"
    key = f"models/{plan.model.name}/0123456789abcdef/model.tar.gz"
    client("s3").create_bucket(Bucket=bucket, **location)
    client("s3").put_object(Bucket=bucket, Key=key, Body=b"model")
    client("ecr").create_repository(repositoryName=REPOSITORY)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                           "config": {"digest": DRY_DIGEST, "size": 1, "mediaType": "application/octet-stream"},
                           "layers": []})
    pushed = client("ecr").put_image(repositoryName=REPOSITORY, imageManifest=manifest, imageTag="cpu-dryrun")
    stack.parameters = {
        "ModelDataUrl": f"s3://{bucket}/{key}",
        "CpuImageUri": f"{DRY_ACCOUNT}.dkr.ecr.{plan.region}.amazonaws.com/{REPOSITORY}@"
                       f"{pushed['image']['imageId']['imageDigest']}"}
    return stack


DRY_DIGEST = "sha256:" + "ab" * 32


# -- the command line ---------------------------------------------------------------------

def plan_from(args: argparse.Namespace, interactive: bool, environ: dict[str, str]) -> Deployment:
    saved = saved_parameters(args.config_env)
    guided = interactive and args.command == "deploy" and "CpuImageUri" not in saved  # teardown asks nothing
    region = (args.region or saved.get("region") or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
              or ("us-east-1" if args.dry_run else ""))
    if guided:
        print("First deployment of this config env: each answer is saved in samconfig.toml by sam deploy.")
    region = ask("AWS region", region or "us-east-1", guided) if guided else region
    stack = args.stack or saved.get("stack_name") or "decision-gateway"
    plan = Deployment(config_env=args.config_env, stack=ask("Stack name", stack, guided), region=region,
                      model=Path(args.model).resolve(), saved=saved, tenant=args.tenant,
                      key_file=Path(args.key_file) if args.key_file else None)
    plan.instance_type = ask("CPU endpoint instance type", saved.get("CpuInstanceType", plan.instance_type), guided)
    plan.min_instances = count("Instances at least", ask("Instances at least", saved.get(
        "CpuMinInstances", str(plan.min_instances)), guided))
    plan.max_instances = count("Instances at most", ask("Instances at most", saved.get(
        "CpuMaxInstances", str(plan.max_instances)), guided))
    if plan.max_instances < plan.min_instances:
        raise DeployError(f"at most {plan.max_instances} instances is fewer than at least {plan.min_instances}")
    plan.stage = saved.get("Stage", plan.stage)
    plan.architecture = saved.get("Architecture", plan.architecture)
    plan.operator_role_arn = ask("Operator role ARN (reads the secrets; empty: none)",
                                 saved.get("OperatorRoleArn", ""), guided)
    plan.alarm_topic_arn = ask("SNS topic ARN for the alarms (empty: none)", saved.get("AlarmTopicArn", ""), guided)
    plan.log_retention_days = int(saved.get("LogRetentionDays", plan.log_retention_days))
    plan.record_retention_days = int(saved.get("RecordRetentionDays", plan.record_retention_days))
    if not plan.region:
        raise DeployError("no region: set AWS_REGION, or run in a terminal to be asked")
    return plan


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.deploy", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["deploy", "teardown"])
    parser.add_argument("--dry-run", action="store_true", help="print every AWS call and command; send and run none")
    parser.add_argument("--config-env", default=os.environ.get("DEPLOY_ENV") or "default",
                        help="samconfig.toml's environment (DEPLOY_ENV)")
    parser.add_argument("--stack", help="the stack's name (else samconfig.toml's, else decision-gateway)")
    parser.add_argument("--region")
    parser.add_argument("--model", default="models/qwen2.5-coder-1.5b-instruct-q4_k_m",
                        help="the model folder (GGUF + model-manifest.json) the endpoints serve")
    parser.add_argument("--tenant", default="first", help="the first tenant's id")
    parser.add_argument("--key-file", help="write the first API key here (mode 0600) instead of to the terminal")
    args = parser.parse_args(argv)
    interactive = not args.dry_run and sys.stdin.isatty() and sys.stdout.isatty()
    try:
        plan = plan_from(args, interactive, dict(os.environ))
        with contextlib.ExitStack() as stack:
            stack_reply = stack.enter_context(dry_run_aws(plan, args.command == "teardown")) if args.dry_run else None
            if args.dry_run:
                print(f"DRY RUN: nothing is sent to AWS and no command runs; {args.command} would make these calls"
                      " (each validated against botocore's model of its service) and run these commands:", file=out)
            api = AwsApi(plan.region, out, args.dry_run, stack_reply)
            stack.callback(api.close)
            shell = Shell(out, args.dry_run)
            if args.command == "deploy":
                return deploy(plan, api, shell, out, interactive)
            return teardown(plan, api, out, interactive, args.dry_run)
    except DeployError as exc:
        print(f"{args.command}: {exc}", file=sys.stderr)
        return 1
    except (ClientError, BotoCoreError) as exc:  # refused or unreachable: botocore's message names the call
        print(f"{args.command}: AWS: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
