"""OpenAI Decisions (`POST /v1/decisions`): request model, conversion, and the answer.

Mapping to the internal model (and so to System One): predicate <-> noul, choices <->
options (values keep their JSON type: `true` and `"true"` are two options), levels <->
score levels ("label: description" is what the model reads), and the input, a string
or a list of items, becomes the state: item texts joined by blank lines.

Images are refused with a 422: the models behind this gateway read text.
"""

import uuid
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator

from gateway.decisions.model import (
    MAX_CHOICES,
    MAX_LEVELS,
    MAX_QUESTIONS,
    CatalogReference,
    Decision,
    DecisionResult,
    Option,
    Question,
    confidence_of,
    cost_fields,
    render_json,
    score_level,
    score_of,
    shown_choice,
)
from gateway.errors import InvalidRequest
from gateway.wire.common import X_CACHE, CatalogQuestion, Wire, cache_option, policy_fields, question_id, question_kind
from systemone.limits import MAX_QUESTION_NAME_CHARS

QuestionName = Annotated[str, Field(max_length=MAX_QUESTION_NAME_CHARS)]  # the answer carries it back


class CacheBreakpoint(Wire):
    mode: Literal["explicit"]


class InputText(Wire):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class InputJson(Wire):
    type: Literal["input_json"]
    data: dict[str, Any] | list[dict[str, Any]]


class InputImage(Wire):
    type: Literal["input_image"]
    image_url: str
    detail: Literal["low", "high", "auto", "original"] | None = None


class OutputText(Wire):
    type: Literal["output_text"]
    text: str


class Refusal(Wire):
    type: Literal["refusal"]
    refusal: str


Part = Annotated[InputText | InputJson | InputImage | OutputText | Refusal, Field(discriminator="type")]
QuestionPart = Annotated[InputText | InputJson | InputImage, Field(discriminator="type")]


class Message(Wire):
    type: Literal["message"] = "message"
    role: Literal["user", "developer", "system", "assistant"]
    content: str | list[Part]
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCall(Wire):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutput(Wire):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[QuestionPart]


class CustomToolCall(Wire):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str


class CustomToolCallOutput(Wire):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[QuestionPart]


def _item_type(value: Any) -> str | None:
    # Messages may omit `type`; everything else names itself.
    if isinstance(value, dict):
        return value.get("type", "message")
    return getattr(value, "type", None)


InputItem = Annotated[
    Annotated[Message, Tag("message")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[CustomToolCall, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutput, Tag("custom_tool_call_output")],
    Discriminator(_item_type),
]

Instructions = str | list[QuestionPart]


class Predicate(Wire):
    type: Literal["predicate"]
    name: QuestionName | None = None
    instructions: Instructions


class ChoiceOption(Wire):
    value: Annotated[str, Field(pattern=r"\S")] | bool
    description: str | None = None


class Choice(Wire):
    type: Literal["choice"]
    name: QuestionName | None = None
    instructions: Instructions
    choices: list[ChoiceOption] = Field(min_length=2, max_length=MAX_CHOICES)

    @field_validator("choices")
    @classmethod
    def _unique(cls, choices: list[ChoiceOption]) -> list[ChoiceOption]:
        seen = {(type(c.value), c.value) for c in choices}
        if len(seen) != len(choices):
            raise ValueError("each choice value must be unique")
        if any(isinstance(c.value, str) and not c.value.strip() for c in choices):
            raise ValueError("choice values must not be blank")
        return choices


class Level(Wire):
    label: str = Field(min_length=1)
    description: str | None = None


class Score(Wire):
    type: Literal["score"]
    name: QuestionName | None = None
    instructions: Instructions
    levels: list[Level] = Field(min_length=2, max_length=MAX_LEVELS)


class NamedCatalogQuestion(CatalogQuestion):
    """An extension of the format: a catalog entry, with the name its answer carries."""

    name: QuestionName | None = None


DecisionQuestion = Annotated[
    Annotated[Predicate, Tag("predicate")] | Annotated[Choice, Tag("choice")] | Annotated[Score, Tag("score")]
    | Annotated[NamedCatalogQuestion, Tag("catalog")],
    Discriminator(question_kind),
]


class DecisionsRequest(Wire):
    model: str = Field(min_length=1)
    input: str | Annotated[list[InputItem], Field(min_length=1)] = Field(
        description="Text, or an ordered list of messages and tool items."
    )
    questions: list[DecisionQuestion] = Field(min_length=1, max_length=MAX_QUESTIONS)
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    x_cache: bool | None = Field(default=None, description=X_CACHE)

    def to_decision(self) -> Decision:
        state = self.input if isinstance(self.input, str) else _state_text(self.input)
        questions = tuple(_question(i, q) for i, q in enumerate(self.questions))
        return Decision(model=self.model, state=state, questions=questions, engine_options=cache_option(self.x_cache))


def _state_text(items: list[Any]) -> str:
    if not items:
        raise InvalidRequest.at(["input"], "input must not be an empty list", "too_short")
    texts = []
    for i, item in enumerate(items):
        if isinstance(item, Message):
            texts.append(item.content if isinstance(item.content, str) else _parts_text(item.content, ["input", i, "content"]))
        elif isinstance(item, FunctionCall):
            texts.append(f"{item.name}({item.arguments})")
        elif isinstance(item, CustomToolCall):
            texts.append(f"{item.name}({item.input})")
        else:
            output = item.output
            texts.append(output if isinstance(output, str) else _parts_text(output, ["input", i, "output"]))
    return "\n\n".join(texts)


def _parts_text(parts: list[Any], loc: list[str | int]) -> str:
    texts = []
    for j, part in enumerate(parts):
        if isinstance(part, InputImage):
            raise InvalidRequest.at([*loc, j], "input_image is not supported: the models behind this gateway read text",
                                    "unsupported_content")
        if isinstance(part, InputJson):
            texts.append(render_json(part.data))
        elif isinstance(part, Refusal):
            texts.append(part.refusal)
        else:
            texts.append(part.text)
    return "\n".join(texts)


def _question(position: int, q: Predicate | Choice | Score | NamedCatalogQuestion) -> Question | CatalogReference:
    if isinstance(q, NamedCatalogQuestion):
        return CatalogReference(question_id(position), q.name, q.catalog, q.version, loc=position)
    loc: list[str | int] = ["questions", position, "instructions"]
    instructions = q.instructions if isinstance(q.instructions, str) else _parts_text(q.instructions, loc)
    if isinstance(q, Predicate):
        return Question(question_id(position), "noul", instructions, (), name=q.name)
    if isinstance(q, Choice):
        return Question(question_id(position), "choice", instructions, _choice_options(q.choices), name=q.name)
    levels = tuple(score_level(i, level.label, level.description) for i, level in enumerate(q.levels))
    return Question(question_id(position), "score", instructions, levels, name=q.name)


def _choice_options(choices: list[ChoiceOption]) -> tuple[Option, ...]:
    """Keys are what the model reads; `true` and `"true"` both read "true", so the second gets a suffix."""
    keys: set[str] = set()
    options = []
    for choice in choices:
        base = choice.value if isinstance(choice.value, str) else ("true" if choice.value else "false")
        key, n = base, 2
        while key in keys:
            key, n = f"{base} ({n})", n + 1
        keys.add(key)
        options.append(Option(key, choice.value, choice.description))
    return tuple(options)


def render(result: DecisionResult, decision_id: str | None = None) -> dict[str, Any]:
    answers = []
    for answer in result.answers:
        question, p = answer.question, answer.probabilities
        if answer.refused:
            answers.append({"type": "refusal", "name": question.name})
            continue
        if question.kind == "noul":
            body: dict[str, Any] = {"type": "predicate", "name": question.name, "probability": p[0]}
        elif question.kind == "choice":
            body = {
                "type": "choice",
                "name": question.name,
                "choice": shown_choice(answer).value,
                "confidence": confidence_of(answer),
                "probabilities": [{"value": o.value, "probability": v} for o, v in zip(question.options, p, strict=True)],
            }
        else:
            body = {
                "type": "score",
                "name": question.name,
                "score": score_of(answer),
                "confidence": confidence_of(answer),
                "probabilities": [
                    {"value": i, "label": o.label, "probability": v}
                    for i, (o, v) in enumerate(zip(question.options, p, strict=True))
                ],
            }
        answers.append({**body, **policy_fields(answer)})
    usage = result.usage
    return {
        "id": f"decision_{decision_id or uuid.uuid4().hex}",
        "object": "decision",
        "model": result.model,
        "answers": answers,
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input_tokens + usage.output_tokens,
            **cost_fields(result.cost),
        },
    }
