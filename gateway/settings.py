"""Gateway settings: read and validated once per container, passed down explicitly.

Models are configured as JSON, from `GATEWAY_MODELS` (the JSON itself),
`GATEWAY_MODELS_FILE` (a path to it, locally) or `GATEWAY_MODELS_SSM_PARAMETER` (the
name of an SSM parameter holding it, in AWS; read once per cold start):

    {"models": [
       {"name": "decision-default", "aliases": ["jev-latest"], "serves": ["decisions"],
        "description": "...", "release_date": "2026-11-01",
        "endpoints": [{"name": "dg-gpu", "read_timeout_s": 10}, {"name": "dg-cpu"}]},
       {"name": "chat-default", "serves": ["chat"], "endpoints": [{"name": "dg-cpu"}]}],
     "routing": {"deadline_s": 25, "extra_attempts": 1, "cooldown_s": 15}}

Each public name or alias maps to a pool of SageMaker endpoints, tried in order
(`tier`, default the position; endpoints sharing a tier are spread by `weight`). A
model may override the `routing` policy. The response always reports the real model,
as the endpoint names it.
"""

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from systemone.limits import API_GATEWAY_TIMEOUT_S, LAMBDA_INVOKE_PAYLOAD_BYTES, MAX_CARRIED_BODY_BYTES

Service = Literal["decisions", "chat"]
# What bounds work on the streaming routes (template.yaml: StreamingFunction): SageMaker gives
# a container 60 s to answer an invocation, and documents no longer bound for a streamed one
# (a stream that overruns ends in ModelStreamError ModelInvocationTimeExceeded), so a
# streamed request gets at most 58 s, 2 s under it. API Gateway would allow 15 minutes.
SAGEMAKER_INVOCATION_S = 60.0
MAX_STREAM_DEADLINE_S = SAGEMAKER_INVOCATION_S - 2.0
# Lambda refuses a synchronous invocation whose request is larger than 6,291,456 bytes,
# and API Gateway sends every body base64-encoded (binary media type */*: 4 bytes per
# 3) inside the proxy event, beside the headers (twice: single and multi-value; API
# Gateway allows 10 KiB of them), the request context and the authorizer's context.
# So the largest body that can reach the function is what is left, times 3/4; the
# gateway accepts no more, and says so with its own 413 (tests/unit/devkit/test_local.py).
EVENT_OVERHEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = (LAMBDA_INVOKE_PAYLOAD_BYTES - EVENT_OVERHEAD_BYTES) * 3 // 4
assert MAX_BODY_BYTES < MAX_CARRIED_BODY_BYTES  # the gateway's own 413 comes first (systemone.limits)


class SettingsError(Exception):
    """The configuration is invalid: the gateway refuses to start rather than guess."""


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class EndpointSettings(_Settings):
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
    region: str | None = None
    endpoint_url: str | None = None
    connect_timeout_s: float = Field(default=2.0, gt=0, le=10)
    read_timeout_s: float = Field(default=25.0, gt=0, lt=API_GATEWAY_TIMEOUT_S)
    tier: int | None = Field(default=None, ge=0)
    weight: float = Field(default=1.0, gt=0, le=1000)
    # SageMaker Serverless Inference: 4 MB a request, and a cold start no fallback can wait
    # for, unless it keeps instances warm (`provisioned`: provisioned concurrency).
    serverless: bool = False
    provisioned: bool = False
    # What a decision's time on it costs (gateway/decisions/cost.py): an instance's price by
    # the hour, or a Serverless endpoint's memory, priced per GB-second. Neither: unpriced.
    # Or the instance type and a Serverless endpoint's MiB, priced by the composition root from
    # gateway/decisions/prices.json (the one price file; settings know no domain types).
    usd_per_hour: float | None = Field(default=None, ge=0, le=1000)
    memory_gb: float | None = Field(default=None, gt=0, le=6)
    instance_type: str | None = Field(default=None, pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")
    memory_mib: int | None = Field(default=None, ge=1024, le=6144)  # a Serverless endpoint's, as SageMaker states it


class RoutingSettings(_Settings):
    deadline_s: float = Field(default=25.0, gt=0, lt=API_GATEWAY_TIMEOUT_S)
    # A request on the streaming routes: a chat stream, or a decision that needs more than
    # `deadline_s` (docs/concepts/bounded-work.md).
    stream_deadline_s: float = Field(default=MAX_STREAM_DEADLINE_S, gt=0, le=MAX_STREAM_DEADLINE_S)
    extra_attempts: int = Field(default=1, ge=0, le=5)
    backoff_base_s: float = Field(default=0.1, ge=0, le=5)
    backoff_max_s: float = Field(default=2.0, ge=0, le=10)
    failure_threshold: int = Field(default=3, ge=1, le=100)
    cooldown_s: float = Field(default=15.0, gt=0, le=600)

    @model_validator(mode="after")
    def _streams_may_wait_longer(self) -> Self:
        if self.stream_deadline_s < self.deadline_s:
            raise ValueError(f"stream_deadline_s ({self.stream_deadline_s:g}) is the longest a caller may ask for on the"
                             f" streaming routes: it cannot be shorter than deadline_s ({self.deadline_s:g})")
        return self


class ModelSettings(_Settings):
    name: str = Field(min_length=1, max_length=128)
    aliases: tuple[str, ...] = ()
    serves: tuple[Service, ...] = ("decisions", "chat")
    description: str = ""
    release_date: str = Field(default="1970-01-01", pattern=r"^\d{4}-\d{2}-\d{2}$")
    endpoints: tuple[EndpointSettings, ...] = Field(min_length=1)
    routing: RoutingSettings | None = None  # else the gateway's
    # Estimated tokens one decision may make the model evaluate (decisions/work_limits.py);
    # set it to the scorer's own budget (its /ping shows max_request_tokens).
    max_request_tokens: int = Field(default=32000, ge=256, le=10_000_000)
    # The scorer's line: the jobs one instance of the first tier admits at once (its
    # SCORER_MAX_JOBS), of which one tenant may hold half; and the least instances it runs.
    # A tenant without a `max_in_flight` of its own may have half the line on each of them
    # in flight on this model (gateway.services.throttle): what the scorers would let it hold.
    line: int = Field(default=8, ge=1, le=1024)
    min_instances: int = Field(default=1, ge=0, le=10_000)

    @model_validator(mode="after")
    def _no_cold_fallback(self) -> Self:
        """A Serverless endpoint without provisioned concurrency is a pool to route to, never a
        fallback: its cold start takes longer than what is left of a request that falls back."""
        tiers = self.tiers()
        first = [e for e, tier in zip(self.endpoints, tiers, strict=True) if tier == min(tiers)]
        for endpoint in self.endpoints:
            if endpoint.serverless and not endpoint.provisioned and first != [endpoint]:
                raise ValueError(f"endpoint {endpoint.name!r} is Serverless without provisioned concurrency: a cold"
                                 " start cannot answer within a fallback's deadline; give it the first tier alone,"
                                 " or provisioned concurrency (\"provisioned\": true)")
        return self

    def tiers(self) -> list[int]:
        """Each endpoint's tier: as set, else its place in the list."""
        return [i if e.tier is None else e.tier for i, e in enumerate(self.endpoints)]


class BatchSettings(_Settings):
    """The Batch API (gateway.batches): what a batch line is charged, and what bounds a batch."""

    # A batch line's endpoint time is charged at this share of the pool's price: bulk work runs
    # at the lowest priority, in time the pool is paid for whether it is used or not.
    price_factor: float = Field(default=0.5, gt=0, le=1)
    # What one instance of a model's first tier reads, in the estimate's tokens (a file's bytes
    # over 4) a second, for the estimate a batch is refused by at creation (its work cannot finish
    # within its window). make bench-batch measured 221 for the fast model on a 2-core CPU scorer
    # (1,000 two-question decisions, 420,954 bytes, in 475 s); set your pool's own.
    tokens_per_second: float = Field(default=220.0, gt=0, le=1e7)
    # What one tenant's files (inputs, outputs, uploads' parts) may take at once.
    max_tenant_bytes: int = Field(default=2 * 1024**3, ge=1024, le=1024**4)


class AuthSettings(_Settings):
    """Where tenants, credentials, catalogs and decision records live, and the token
    signing keys. Read by the gateway function and by the authorizer alike.

    GATEWAY_SQLITE_PATH                       the embedded store (local stack), or
    GATEWAY_TENANTS_TABLE, GATEWAY_KEYS_TABLE DynamoDB tables (AWS), with
    GATEWAY_CATALOGS_TABLE, GATEWAY_RECORDS_TABLE for catalogs and records,
    GATEWAY_BATCHES_TABLE, GATEWAY_BATCH_BUCKET for batches (their items, their files' bytes),
    GATEWAY_BATCH_QUEUE_URL                   and the SQS queue of their worker's turns;
    GATEWAY_ASYNC_ENDPOINT                    an Asynchronous Inference endpoint that runs the batch
                                              lines (its input and output in the batch bucket), and
    GATEWAY_ASYNC_INSTANCE_TYPE               its instance type (what a line's scorer time costs);
    GATEWAY_RECORD_RETENTION_DAYS             how long records are kept (default 90);
    GATEWAY_SIGNING_SECRET_ID                 a Secrets Manager secret with the signing keys, or
    GATEWAY_SIGNING_KEYS_FILE                 a file with the same document (local stack);
    GATEWAY_RECORD_KEY_SECRET_ID              a secret with the records' state-hash keys, or
    GATEWAY_RECORD_KEYS_FILE                  a file with it (local stack).
    """

    sqlite_path: str | None = None
    tenants_table: str | None = None
    keys_table: str | None = None
    catalogs_table: str | None = None
    records_table: str | None = None
    batches_table: str | None = None
    batch_bucket: str | None = None
    batch_queue_url: str | None = None
    async_endpoint: str | None = None
    async_instance_type: str | None = None
    record_retention_days: float = Field(default=90, gt=0, le=3650)
    signing_secret_id: str | None = None
    signing_keys_file: str | None = None
    record_key_secret_id: str | None = None
    record_keys_file: str | None = None
    # How long a "still valid" answer may be reused: the bound on how late a revocation takes effect.
    revocation_check_s: float = Field(default=10.0, ge=0, le=300)

    @model_validator(mode="after")
    def _one_store(self) -> Self:
        if self.sqlite_path and (self.tenants_table or self.keys_table):
            raise ValueError("configure the SQLite store or the DynamoDB tables, not both")
        if bool(self.tenants_table) != bool(self.keys_table):
            raise ValueError("the DynamoDB store needs both GATEWAY_TENANTS_TABLE and GATEWAY_KEYS_TABLE")
        if bool(self.batches_table) != bool(self.batch_bucket):
            raise ValueError("batches need both GATEWAY_BATCHES_TABLE and GATEWAY_BATCH_BUCKET")
        if self.batches_table and not self.batch_queue_url:  # else a batch is accepted that nothing ever runs
            raise ValueError("batches in DynamoDB need their worker's queue: GATEWAY_BATCH_QUEUE_URL")
        if self.async_endpoint and not self.batch_queue_url:  # its input and output live beside the batches'
            raise ValueError("an asynchronous pool serves batches in AWS: GATEWAY_ASYNC_ENDPOINT needs"
                             " GATEWAY_BATCHES_TABLE, GATEWAY_BATCH_BUCKET and GATEWAY_BATCH_QUEUE_URL")
        return self

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        env = os.environ if env is None else env
        names = {"sqlite_path": "GATEWAY_SQLITE_PATH", "tenants_table": "GATEWAY_TENANTS_TABLE",
                 "keys_table": "GATEWAY_KEYS_TABLE", "signing_secret_id": "GATEWAY_SIGNING_SECRET_ID",
                 "catalogs_table": "GATEWAY_CATALOGS_TABLE", "records_table": "GATEWAY_RECORDS_TABLE",
                 "batches_table": "GATEWAY_BATCHES_TABLE", "batch_bucket": "GATEWAY_BATCH_BUCKET",
                 "batch_queue_url": "GATEWAY_BATCH_QUEUE_URL", "async_endpoint": "GATEWAY_ASYNC_ENDPOINT",
                 "async_instance_type": "GATEWAY_ASYNC_INSTANCE_TYPE",
                 "record_retention_days": "GATEWAY_RECORD_RETENTION_DAYS",
                 "signing_keys_file": "GATEWAY_SIGNING_KEYS_FILE", "record_key_secret_id": "GATEWAY_RECORD_KEY_SECRET_ID",
                 "record_keys_file": "GATEWAY_RECORD_KEYS_FILE", "revocation_check_s": "GATEWAY_REVOCATION_CHECK_S"}
        values = {field: env[name] for field, name in names.items() if env.get(name)}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise _refused("auth settings", exc) from None


class GatewaySettings(_Settings):
    models: tuple[ModelSettings, ...] = Field(min_length=1)
    routing: RoutingSettings = RoutingSettings()
    auth: AuthSettings = AuthSettings()
    batches: BatchSettings = BatchSettings()
    region: str | None = None
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, gt=0, le=MAX_BODY_BYTES)
    service_name: str = "decision-gateway"
    # The OpenAPI document and Swagger UI at /v1/openapi (GATEWAY_OPENAPI=1): on in the local
    # runner, opt-in in AWS (it describes the API, and holds no data).
    openapi: bool = False

    @model_validator(mode="after")
    def _names_unique(self) -> Self:
        seen: set[str] = set()
        for model in self.models:
            for name in (model.name, *model.aliases):
                if name in seen:
                    raise ValueError(f"model name or alias {name!r} is declared twice")
                seen.add(name)
        return self

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, fetch_parameter: Callable[[str], str] | None = None
    ) -> Self:
        """`fetch_parameter` reads an SSM parameter (decrypted); the default uses boto3."""
        env = os.environ if env is None else env
        raw = env.get("GATEWAY_MODELS")
        if raw is None and env.get("GATEWAY_MODELS_SSM_PARAMETER"):
            raw = (fetch_parameter or _ssm_parameter)(env["GATEWAY_MODELS_SSM_PARAMETER"])
        if raw is None and env.get("GATEWAY_MODELS_FILE"):
            try:
                raw = Path(env["GATEWAY_MODELS_FILE"]).read_text()
            except OSError as exc:
                raise SettingsError(f"GATEWAY_MODELS_FILE cannot be read: {exc.strerror}") from None
        if raw is None:
            raise SettingsError("set GATEWAY_MODELS (JSON), GATEWAY_MODELS_FILE or GATEWAY_MODELS_SSM_PARAMETER")
        try:
            document = json.loads(raw)
        except ValueError:
            raise SettingsError("the model configuration is not valid JSON") from None
        if not isinstance(document, dict):
            raise SettingsError("the model configuration must be a JSON object with a 'models' list")
        values = dict(document)
        values.setdefault("region", env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"))
        values["auth"] = AuthSettings.from_env(env)
        if env.get("GATEWAY_OPENAPI"):
            values["openapi"] = env["GATEWAY_OPENAPI"]
        if env.get("GATEWAY_MAX_BODY_BYTES"):
            values["max_body_bytes"] = env["GATEWAY_MAX_BODY_BYTES"]
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise _refused("gateway settings", exc) from None


def _refused(what: str, exc: ValidationError) -> SettingsError:
    problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False))
    return SettingsError(f"invalid {what}: {problems}")


def _ssm_parameter(name: str) -> str:
    from botocore.exceptions import BotoCoreError, ClientError

    from gateway import aws

    try:
        reply = aws.client("ssm").get_parameter(Name=name, WithDecryption=True)
    except (ClientError, BotoCoreError) as exc:
        code = exc.response["Error"]["Code"] if isinstance(exc, ClientError) else type(exc).__name__
        raise SettingsError(f"the SSM parameter {name!r} cannot be read ({code})") from None
    return reply["Parameter"]["Value"]
