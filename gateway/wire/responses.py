"""The public answers as models: what each route returns, declared on the route by class
(`gateway.api.docs`) for the OpenAPI document's response schemas, and held by the tests to every
body the routes render (tests/unit/gateway/wire/test_responses.py), so the document and the wire
cannot drift. A rename breaks the import, not only the documentation build.

The System One answers are the contract's (`systemone.models`) plus the gateway's own
`x_` fields; unknown fields are refused here, so a field the renderers add and these
models lack fails the tests.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.decisions.model import Action, VerdictReason
from gateway.decisions.records import DecisionRecord
from systemone import models as contract


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class Policy(Strict):
    catalog: str
    mode: str
    temperature: float


class CatalogFields(BaseModel):
    """On the answer of a question named from a catalog entry."""

    model_config = ConfigDict(defer_build=True)

    x_catalog: str | None = Field(default=None, description="The entry that declared the question (name@version).")
    x_action: Action | None = Field(default=None, description="What the entry's policy says to do: auto, review, abstain.")
    x_action_reason: VerdictReason | None = Field(
        default=None, description="Why x_action is stricter than the policy's rules gave: injection_suspected when the"
                                  " state looked like it carries instructions for the model, injection_signal_missing"
                                  " when the policy requires the scorer's check and the backend sent none,"
                                  " calibration_mismatch when the entry's calibration was fitted on another model,"
                                  " prompt or readout, so the answer is uncalibrated (absent otherwise).")
    x_policy: Policy | None = None
    x_adapter: str | None = Field(default=None, description="The catalog entry's adapter that produced the"
                                  " probabilities (learned from the entry's outcomes); absent when none did.")


class NoulAnswer(contract.NoulAnswer, CatalogFields):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class ChoiceAnswer(contract.ChoiceAnswer, CatalogFields):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class ScoreAnswer(contract.ScoreAnswer, CatalogFields):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class CostFields(BaseModel):
    model_config = ConfigDict(defer_build=True)

    x_endpoint_s: float | None = Field(default=None, description="Seconds the model endpoints spent on this request,"
                                                                  " every attempt included.")
    x_cost_usd: float | None = Field(default=None, description="What it cost: the endpoints' time at their pool's"
                                                               " configured price (0 where none is) and the gateway's"
                                                               " own share.")


class Usage(CostFields):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    input_tokens: int
    output_tokens: int
    x_cached_tokens: int = Field(default=0, description="Of the input tokens, those the scorer restored from the state"
                                                        " it kept for this tenant instead of reading them again.")


class InjectionSignal(contract.InjectionSignal):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class SystemOneResponse(BaseModel):
    """`POST /v1/systemone`: one answer per question, by the caller's question id."""

    model_config = ConfigDict(extra="allow", defer_build=True)  # the scorer's x_ extensions (readout, model sha, debiasing)
    model: str
    answers: dict[str, Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]]
    usage: Usage
    x_decision_id: str | None = Field(default=None, description="The record's id (POST /v1/decisions/{id}/outcome).")
    x_injection: InjectionSignal | None = Field(
        default=None, description="The scorer's check of the state for instructions planted for the model.")
    x_framing: str | None = Field(default=None, description="How the scorer showed the state to the model.")
    x_quarantine: bool | None = Field(default=None, description="Whether passages the pattern checks flagged were"
                                                                " kept from the model.")


class Health(Strict):
    status: Literal["ok"]


class Probability(Strict):
    value: str | bool | int
    label: str | None = None
    probability: float


class PredicateAnswer(CatalogFields):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    type: Literal["predicate"]
    name: str | None
    probability: float


class OpenAIChoiceAnswer(CatalogFields):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    type: Literal["choice"]
    name: str | None
    choice: str | bool
    confidence: float
    probabilities: list[Probability]


class OpenAIScoreAnswer(CatalogFields):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    type: Literal["score"]
    name: str | None
    score: float
    confidence: float
    probabilities: list[Probability]


class Refusal(Strict):
    type: Literal["refusal"]
    name: str | None


class OpenAIUsage(CostFields):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class DecisionsResponse(Strict):
    """`POST /v1/decisions`, in the order the questions were asked."""

    id: str = Field(description="decision_<record id>: accepted wherever a decision id is.")
    object: Literal["decision"]
    model: str
    answers: list[Annotated[PredicateAnswer | OpenAIChoiceAnswer | OpenAIScoreAnswer | Refusal,
                            Field(discriminator="type")]]
    usage: OpenAIUsage


class ModelEntry(Strict):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class SystemOneModel(Strict):
    name: str
    description: str
    release_date: str


class ModelList(Strict):
    """`GET /v1/models`: the OpenAI list and the System One list in one body."""

    object: Literal["list"]
    data: list[ModelEntry]
    models: list[SystemOneModel]


class CatalogEntry(BaseModel):
    """A catalog entry version: its content (as written) with its name, version, hash and time."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    name: str
    version: int
    hash: str
    created_at: float


class CatalogWritten(CatalogEntry):
    """`PUT /v1/catalogs/{name}`: the version the entry now has; `created` false when its content was already it."""

    created: bool


class CatalogList(Strict):
    catalogs: list[CatalogEntry]
    next_after: str | None = None  # more entries: pass it back as ?after=


class VersionList(Strict):
    versions: list[CatalogEntry]
    next_after: int | None = None  # more versions: pass it back as ?after=


class RecordList(Strict):
    records: list[DecisionRecord]
    drift: dict[str, dict[str, Any]]
    next_cursor: str | None = None  # more records: pass it back as ?cursor= (a page ends by count or by size)


class OutcomeReply(Strict):
    id: str
    outcome: dict[str, Any]


class RefitReply(Strict):
    """What a refit measured (out of fold, folds grouped by state) and did."""

    catalog: str  # name@version: the version written, else the one refitted
    applied: bool
    reason: str
    samples: int
    outcomes: dict[str, int]  # records read, used, and why others were left out
    adapter: str | None = None  # the fitted adapter's id (written or not)
    fitted_on: dict[str, Any] | None = None  # the model file, prompt, readout, listing and sketch it belongs to
    version: int | None = None  # the new version, when written
    folds: int | None = None
    l2: float | None = None
    adapter_out_of_fold: dict[str, float] | None = None
    zero_shot_out_of_fold: dict[str, float] | None = None


class UsageFigures(Strict):
    requests: int
    cost_usd: float
    endpoint_seconds: float
    stored_bytes: int  # decision records and catalog versions written
    input_tokens: int  # what the model read for the decisions
    cached_tokens: int  # of which restored from the state the scorer kept, not evaluated again


class UsageByDay(UsageFigures):
    day: str  # YYYY-MM-DD, UTC


class UsageByEntry(UsageFigures):
    entry: str  # a catalog entry's name, "(inline)" or "(chat)"


class UsageBudget(Strict):
    monthly_usd: float | None  # None: no monthly budget
    month: str  # YYYY-MM, UTC
    month_spent_usd: float  # spent this month, and reserved by work in flight
    endpoint_seconds_per_minute: float | None  # None: no rate of work


class UsageReport(Strict):
    """`GET /v1/usage`: what the tenant spent, by day and by entry, and its budgets."""

    object: Literal["usage"]
    from_: str = Field(alias="from")
    to: str
    currency: Literal["USD"]
    total: UsageFigures
    by_day: list[UsageByDay]
    by_entry: list[UsageByEntry]
    budget: UsageBudget


class Revoked(Strict):
    """`POST /v1/tokens/revoke`: a token by its id, or (all_tokens) every token minted before `not_before`."""

    revoked: Literal[True]
    token_id: str | None = None
    tenant_id: str | None = None
    not_before: float | None = None


class MintedToken(Strict):
    token: str
    token_id: str
    tenant_id: str
    scopes: list[str]
    models: list[str] | None
    expires_at: float
    expires_in: float


# OpenAI's Files, Uploads and Batch APIs, as `gateway.batches.model` renders them.

class FileObject(Strict):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: str
    status: Literal["processed"]
    status_details: None


class FileDeleted(Strict):
    id: str
    object: Literal["file"]
    deleted: Literal[True]


class FilePage(Strict):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class UploadObject(Strict):
    id: str
    object: Literal["upload"]
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"]
    file: FileObject | None


class UploadPartObject(Strict):
    id: str
    object: Literal["upload.part"]
    created_at: int
    upload_id: str


class BatchErrors(Strict):
    object: Literal["list"]
    data: list[dict[str, Any]]


class BatchCounts(Strict):
    total: int
    completed: int
    failed: int


class BatchUsage(Strict):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class BatchObject(Strict):
    id: str
    object: Literal["batch"]
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str  # validating, in_progress, finalizing, completed, failed, expired, cancelling, cancelled
    output_file_id: str | None
    error_file_id: str | None
    created_at: int | None
    expires_at: int | None
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: BatchCounts
    metadata: dict[str, str] | None
    usage: BatchUsage
    x_cost_usd: float  # what the batch has cost so far, at the bulk price


class BatchPage(Strict):
    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


# OpenAI Chat Completions: the scorer's completion relayed (its fields beyond these pass through).

class Relayed(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)


class ChatMessageOut(Relayed):
    role: Literal["assistant"]
    content: str | None


class ChatChoice(Relayed):
    index: int
    message: ChatMessageOut
    finish_reason: str | None


class ChatCompletion(Relayed):
    """A whole completion (`stream` false or absent)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: dict[str, Any] | None = None


class ChunkChoice(Relayed):
    index: int
    delta: dict[str, Any]  # role, then content, piece by piece; {} with the finish_reason
    finish_reason: str | None


class ChatCompletionChunk(Relayed):
    """One event of a stream (`stream: true`): `data: <chunk>`, the last `data: [DONE]`."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: dict[str, Any] | None = None


# The error bodies (`systemone.errors.error_parts` writes them), for the OpenAPI document's error
# responses (`gateway.api.reference`): System One's two shapes, OpenAI's, and both at once on the
# routes both SDKs call.

class ProblemItem(Strict):
    loc: list[str | int]  # where: "body", "path", "query" or "header", then the field's path
    msg: str
    type: str


class SystemOneProblems(Strict):
    """A System One 422: every problem found, each with its place."""

    detail: list[ProblemItem]


class SystemOneErrorDetail(Strict):
    error_type: str
    message: str


class SystemOneError(Strict):
    """A System One error other than a 422."""

    detail: SystemOneErrorDetail


class OpenAIErrorDetail(Strict):
    message: str
    type: str  # invalid_request_error, rate_limit_error, insufficient_quota, server_error...
    param: str | None  # a validation error's first field (dotted)
    code: str | None


class OpenAIError(Strict):
    """OpenAI's error object: what the OpenAI SDKs raise from."""

    error: OpenAIErrorDetail


class EitherError(Strict):
    """Both shapes at once (`/v1/models`, catalogs, records, tokens, usage): what either SDK reads."""

    error: OpenAIErrorDetail
    detail: SystemOneErrorDetail | list[ProblemItem]


def documented(model: type[BaseModel], description: str, status: int = 200) -> dict[int, Any]:
    """A route's `responses`: the model as the schema of its JSON answer."""
    return {status: {"description": description, "content": {"application/json": {"model": model}}}}
