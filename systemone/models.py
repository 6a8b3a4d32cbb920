"""System One as models: the decision request (questions and their options) and the
typed answers. Unknown fields are ignored, types are strict (no "1" for 1), extensions
are `x_`-prefixed. The gateway's public request extends `DecisionRequest` (catalog
references, `x_calibrate`); the scorer validates exactly this one.
"""

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from systemone.limits import MAX_CHOICES, MAX_LEVELS, MAX_QUESTION_NAME_CHARS, MAX_QUESTIONS, STATE_FEATURE_DIMS

# A description, instruction or state: any JSON value but a number or a boolean.
Text = str | dict[str, Any] | list[Any]
Readout = Literal["letters", "likelihood"]
# How the state is shown to the model (see scorer_container/prompts.py): as it is, or
# fenced as data the model must not take instructions from, optionally with its words
# joined by a mark.
Framing = Literal["plain", "spotlight", "datamark"]
Probability = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class Wire(BaseModel):
    """Strict types, unknown fields ignored, as the format specifies."""

    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)


class NoulCriteria(Wire):
    true: Text | None = Field(default=None, description="What counts as yes / true.")
    false: Text | None = Field(default=None, description="What counts as no / false.")


class NoulQuestion(Wire):
    """A yes/no question; the answer is P(true)."""

    type: Literal["noul"]
    instructions: Text | None = None
    criteria: NoulCriteria | None = None

    @model_validator(mode="after")
    def _needs_something_to_ask(self) -> Self:
        criteria = self.criteria
        if self.instructions is None and (criteria is None or (criteria.true is None and criteria.false is None)):
            raise ValueError("a noul question needs instructions or criteria")
        return self


class ChoiceQuestion(Wire):
    """One of 2 to 255 named options; a description may be null (the name explains it)."""

    type: Literal["choice"]
    instructions: Text | None = None
    criteria: dict[str, Text | None] = Field(min_length=2, max_length=MAX_CHOICES)

    @field_validator("criteria")
    @classmethod
    def _names_not_blank(cls, criteria: dict[str, Any]) -> dict[str, Any]:
        if any(not name.strip() for name in criteria):
            raise ValueError("option names must not be blank")
        return criteria


class ScoreQuestion(Wire):
    """Ordered levels, lowest first (an array: a map such as {"0": ...} is refused)."""

    type: Literal["score"]
    instructions: Text | None = None
    criteria: list[Text] = Field(min_length=2, max_length=MAX_LEVELS)


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]
QuestionId = Annotated[str, Field(min_length=1, max_length=MAX_QUESTION_NAME_CHARS)]


class DecisionRequest(Wire):
    model: str = Field(min_length=1, description="A model name or alias (GET /v1/models).")
    state: Text = Field(description="The text, or a JSON object or array, the questions are about.")
    questions: dict[QuestionId, Question] = Field(min_length=1, max_length=MAX_QUESTIONS)
    # Extensions: override the model's readout and the debiasing per request.
    x_readout: Readout | None = None
    x_order_average: bool | None = None
    x_prior: bool | None = None
    # Override how the state is framed, whether flagged passages are kept from the model,
    # and whether the injection probe runs.
    x_framing: Framing | None = None
    x_quarantine: bool | None = None
    x_injection_probe: bool | None = None
    # false: answer with the readout and debiasing the request resolves to, or refuse (413);
    # never cut debiasing to fit the budget (an enforcing catalog entry's thresholds were
    # set for its own readout: the gateway sets it for those).
    x_reduce: bool | None = None
    # true: each answer carries `x_features`, what its probabilities were read from (the
    # per-listing distributions, the prior, a sketch of the answer position): what a
    # catalog entry's adapter learns from and is applied to.
    x_features: bool | None = None
    # false: the state is evaluated afresh and nothing of it is kept between requests, and
    # what the scorer kept of it for this tenant is forgotten (a later request about the same
    # state then reads it afresh). Absent or true: the scorer may keep the state it read, for
    # this tenant only, in memory and for minutes, and start from it the next time.
    x_cache: bool | None = None


# -- answers ---------------------------------------------------------------------------

class NoulAnswer(Wire):
    type: Literal["noul"]
    noul: Probability = Field(description="P(true).")


class ChoiceAnswer(Wire):
    type: Literal["choice"]
    choice: str = Field(description="The most likely option.")
    probabilities: dict[str, Probability] = Field(description="Every declared option, in the declared order.")
    confidence: Probability | None = Field(default=None, description="0: uniform, 1: certain (systemone.answers).")


class ScoreAnswer(Wire):
    type: Literal["score"]
    score: float = Field(allow_inf_nan=False, description="The expected level (0 = lowest).")
    legend: dict[str, Text] = Field(default_factory=dict, description="Level index -> the level as declared.")
    probabilities: dict[str, Probability] = Field(description="Level index -> P(level).")
    confidence: Probability | None = Field(default=None, description="0: uniform, 1: certain (systemone.answers).")

    @model_validator(mode="after")
    def _score_is_a_level(self) -> Self:
        # A hair of rounding either way: the expected level of a distribution summing to 1 +- ulps.
        if not -1e-9 <= self.score <= max(0, len(self.probabilities) - 1) + 1e-9:
            raise ValueError("score must lie between 0 and the highest level")
        return self


Answer = Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]


class AnswerFeatures(Wire):
    """What one answer was read from (`x_features: true`), at no extra decode.

    `orders`: the distribution over the declared options in each option listing (log
    probabilities, the prior removed where it applies, before any temperature; their mean
    is the answer). `prior`: the content-free log-scores per declared option (null without
    a prior, or when the options were listed in groups). `state`: STATE_FEATURE_DIMS numbers,
    little-endian float16 in base64: a fixed projection (`sketch`) of the model's final
    hidden state at the answer position, read from a logits row the decode computed anyway.
    Features are the model's, prompt's and readout's own: learn and apply them under the
    same x_model_sha256, x_prompt_version and readout."""

    orders: list[Annotated[list[float], Field(min_length=2, max_length=MAX_CHOICES)]] = Field(
        min_length=1, max_length=MAX_CHOICES)
    prior: list[float] | None = Field(default=None, max_length=MAX_CHOICES)
    state: str = Field(min_length=1, max_length=4 * STATE_FEATURE_DIMS)
    sketch: str = Field(min_length=1, max_length=64)


class Usage(Wire):
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    x_cached_tokens: int | None = Field(default=None, ge=0)
    # The milliseconds the scorer worked on this request (planning and the forward passes),
    # time waiting in its line excluded: a decision's share of an instance it shares.
    x_busy_ms: int | None = Field(default=None, ge=0)


class InjectionSignal(Wire):
    """How much the state looks like it addresses the model that reads it (planted instructions).

    `suspicion` is what policies compare with their threshold: the larger of the probe's
    probability (a yes/no question asked of the state; null when it did not run) and the
    pattern checks' score. `patterns` names the checks that matched, `neutralised` what
    the scorer changed in the text the model read (the caller's state is never changed)."""

    suspicion: Probability
    probe: Probability | None = None
    patterns: list[str] = Field(default_factory=list)
    neutralised: list[str] = Field(default_factory=list)


class Extensions(Wire):
    """The `x_` fields a scorer's answer carries, which decision records keep (others pass through)."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    x_model_sha256: str | None = None
    x_image_digest: str | None = None
    x_prompt_version: str | None = None
    x_readout: str | None = None
    x_debias: dict[str, Any] | None = None  # how the options were listed and averaged, the temperature
    x_framing: str | None = None  # how the state was shown to the model
    x_quarantine: bool | None = None  # whether passages the pattern checks flagged were kept from it
    x_injection: InjectionSignal | None = None


class DecisionResponse(Extensions):
    """What a scorer answers; `answers` holds one entry per question id of the request."""

    model: str
    answers: dict[str, Any] = Field(description="Question id -> an Answer (each read on its own: one bad answer "
                                                "refuses that question, not the decision).")
    usage: Usage = Usage()
