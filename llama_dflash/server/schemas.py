"""Request bodies of /v1/completions and /v1/chat/completions as pydantic models.

Every field is typed strictly (no "10" for 10, no "false" for False) and bounded by OpenAI's
ranges, so nothing a client sends reaches llama-cpp-python or llama.cpp unchecked.  Bounds that
depend on the loaded model (token ids below the vocabulary size, the max_tokens cap) come in the
validation context (`Limits`).  The body is parsed by `parse_json`, which refuses NaN/Infinity,
non-finite numbers such as -1e999 and deep nesting, before pydantic sees it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .errors import APIError

__all__ = ["Limits", "CompletionRequest", "ChatRequest", "parse_json", "validate_request", "MAX_DEPTH"]

MAX_DEPTH = 16  # JSON nesting (a chat body with content parts needs 5)
MAX_STOP = 4
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 1024
MAX_MESSAGES = 1024
MAX_SEED = 2**32 - 1
MAX_TOP_K = 1 << 20
MAX_TEXT = 1 << 20  # characters in one string field (the body limit bounds it anyway)

#: OpenAI fields this server does not implement: named in the 400 rather than silently ignored
UNSUPPORTED = ("functions", "function_call", "audio", "modalities", "prediction", "reasoning_effort",
               "web_search_options")
_INSTEAD = {"functions": " (use 'tools')", "function_call": " (use 'tool_choice')"}
#: OpenAI's pattern for function and schema names
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


@dataclass(frozen=True)
class Limits:
    """What validation needs to know about the loaded model and the server's settings."""

    n_vocab: int
    max_tokens_cap: int
    n_ctx: int


class _Refused(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text[:40]} is out of range for a number")
    return value


def _depth(obj: Any) -> int:
    """Nesting depth of parsed JSON, iteratively (deep input must not hit the recursion limit)."""
    deepest = 0
    stack = [(obj, 1)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object; APIError(400) for anything else."""
    try:
        obj = json.loads(body, parse_constant=_no_constant, parse_float=_finite_float)
    except _Refused as exc:
        raise APIError(400, f"invalid JSON body: {exc}", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, f"the JSON body is nested deeper than {MAX_DEPTH} levels", code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}"[:300], code="invalid_json") from None
    if not isinstance(obj, dict):
        raise APIError(400, "the body must be a JSON object", code="invalid_json")
    if _depth(obj) > MAX_DEPTH:
        raise APIError(400, f"the JSON body is nested deeper than {MAX_DEPTH} levels", code="invalid_json")
    return obj


def _limits(info: ValidationInfo) -> Limits:
    limits = (info.context or {}).get("limits")
    if not isinstance(limits, Limits):
        raise RuntimeError("validate requests with context={'limits': Limits(...)}")
    return limits


def _within_cap(v: Optional[int], info: ValidationInfo) -> Optional[int]:
    cap = _limits(info).max_tokens_cap
    if v is not None and v > cap:
        raise ValueError(f"must be at most {cap} (the server's --max-tokens-cap)")
    return v


Unit = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
StopText = Annotated[str, Field(min_length=1, max_length=1024)]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False  # a last chunk with the usage and no choices
    include_obfuscation: Optional[bool] = None  # accepted, nothing to do: no obfuscation padding is sent


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: Optional[Name] = None  # OpenAI requires it; llama-server does not
    description: Optional[str] = Field(None, max_length=MAX_TEXT)
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(BaseModel):
    """OpenAI's text / json_object / json_schema (and llama-server's json_object with a `schema`)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None
    schema_: Optional[dict[str, Any]] = Field(None, alias="schema")

    @model_validator(mode="after")
    def _consistent(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(f"'json_schema' goes with type 'json_schema', not {self.type!r}")
        if self.type == "text" and self.schema_ is not None:
            raise ValueError("a 'schema' needs type 'json_object' or 'json_schema'")
        return self

    def schema_and_strict(self) -> tuple[Optional[dict[str, Any]], bool]:
        """The schema the answer must follow (None: any JSON object) and whether it is strict."""
        if self.json_schema is not None:
            return self.json_schema.schema_, bool(self.json_schema.strict)
        return self.schema_, False

    def as_dict(self) -> dict[str, Any]:
        schema, _ = self.schema_and_strict()
        return {"type": self.type, "schema": schema}


class _Common(BaseModel):
    """Fields both endpoints share (OpenAI's, plus llama.cpp's top_k, min_p, repeat_penalty, grammar)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: Optional[str] = Field(None, max_length=1024)  # accepted, ignored: one model is served
    user: Optional[str] = Field(None, max_length=1024)
    stream: bool = False
    max_tokens: Optional[int] = Field(None, ge=0)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: Optional[int] = Field(None, ge=0, le=MAX_TOP_K)
    min_p: Optional[Unit] = None
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    repeat_penalty: Optional[float] = Field(None, gt=0.0, le=10.0, allow_inf_nan=False)
    seed: Optional[int] = Field(None, ge=-1, le=MAX_SEED)
    stop: Union[None, StopText, Annotated[list[StopText], Field(max_length=MAX_STOP)]] = None
    logit_bias: Optional[dict[str, Annotated[float, Field(ge=-100.0, le=100.0, allow_inf_nan=False)]]] = None
    grammar: Optional[str] = Field(None, min_length=1)
    n: Optional[int] = None
    response_format: Optional[ResponseFormat] = None
    stream_options: Optional[StreamOptions] = None
    # extensions (ours; OpenAI clients never send them, so they see nothing new): `token_origins`
    # adds each token's origin (an accepted draft token and its speculator, or the target's own)
    # to the answer and to every stream chunk; `speculative: false` decodes this request without
    # drafting (the chat page's comparison run)
    token_origins: bool = False
    speculative: bool = True

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stream_options")
    @classmethod
    def _only_streams(cls, v: Optional[StreamOptions], info: ValidationInfo) -> Optional[StreamOptions]:
        if v is not None and not info.data.get("stream"):
            raise ValueError("only allowed with stream: true")
        return v

    @model_validator(mode="after")
    def _one_constraint(self) -> "_Common":
        if self.grammar is not None and self.response_format is not None and self.response_format.type != "text":
            raise ValueError("give 'grammar' or a JSON 'response_format', not both")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options is not None and self.stream_options.include_usage)

    def json_format(self) -> Optional[ResponseFormat]:
        """The JSON response_format (None for none or text)."""
        rf = self.response_format
        return rf if rf is not None and rf.type != "text" else None

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, v: Optional[dict[str, float]], info: ValidationInfo) -> Optional[dict[str, float]]:
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} entries")
        n_vocab = _limits(info).n_vocab
        for key in v:
            if not (key.isascii() and key.isdigit() and len(key) <= 12 and int(key) < n_vocab):
                raise ValueError(f"keys must be token ids in [0, {n_vocab}), got {key[:40]!r}")
        return v

    @field_validator("grammar")
    @classmethod
    def _bounded_grammar(cls, v: Optional[str]) -> Optional[str]:
        from ..grammar_limits import check_gbnf

        if v is not None:
            check_gbnf(v)
        return v

    @field_validator("max_tokens")
    @classmethod
    def _capped(cls, v: Optional[int], info: ValidationInfo) -> Optional[int]:
        return _within_cap(v, info)

    def sampling_kwargs(self) -> dict[str, Any]:
        """The fields as llama-cpp-python keyword arguments (unset ones left to its defaults)."""
        kw: dict[str, Any] = {}
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                     "repeat_penalty", "stop"):
            value = getattr(self, name)
            if value is not None:
                kw[name] = value
        if self.seed is not None and self.seed >= 0:  # -1: a random seed, as llama.cpp's server reads it
            kw["seed"] = self.seed
        if self.logit_bias:
            kw["logit_bias"] = {int(k): float(v) for k, v in self.logit_bias.items()}
        return kw


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int]]
    suffix: Optional[str] = Field(None, max_length=MAX_TEXT)
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: Optional[int] = None

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v != 1:
            raise ValueError("only best_of=1 is supported")
        return v

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Union[str, list[str], list[int]], info: ValidationInfo) -> Union[str, list[int]]:
        if isinstance(v, str):
            return v
        if not v:
            raise ValueError("must not be empty")
        if isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("one prompt per request")
            return v[0]
        limits = _limits(info)
        if len(v) >= limits.n_ctx:
            raise ValueError(f"{len(v)} tokens do not fit the context of {limits.n_ctx}")
        bad = next((t for t in v if not 0 <= t < limits.n_vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is not in [0, {limits.n_vocab})")
        return v

    def to_kwargs(self, default_max_tokens: int) -> dict[str, Any]:
        kw = self.sampling_kwargs()
        kw.update(prompt=self.prompt, stream=self.stream, echo=self.echo,
                  max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens)
        if self.suffix is not None:
            kw["suffix"] = self.suffix
        if self.logprobs is not None:
            kw["logprobs"] = self.logprobs
        return kw


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT)


Content = Union[Annotated[str, Field(max_length=MAX_TEXT)], Annotated[list[TextPart], Field(min_length=1)]]


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Annotated[str, Field(min_length=1, max_length=256)]
    arguments: str = Field(max_length=MAX_TEXT)


class ToolCall(BaseModel):
    """A call an assistant message made (as the answer gave it)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    tool_calls: Optional[Annotated[list[ToolCall], Field(max_length=MAX_MESSAGES)]] = None
    tool_call_id: Optional[str] = Field(None, max_length=256)
    content: Optional[Content] = Field(None, validate_default=True)
    name: Optional[str] = Field(None, max_length=256)
    # what clients echo back from an answer's message; carried nothing here
    refusal: Optional[str] = Field(None, max_length=MAX_TEXT)
    function_call: None = None
    audio: None = None
    annotations: Optional[Annotated[list[Any], Field(max_length=0)]] = None

    @model_validator(mode="after")
    def _fits_role(self) -> "Message":
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("only tool messages carry tool_call_id")
        return self

    @field_validator("tool_calls")
    @classmethod
    def _assistant_calls(cls, v: Optional[list[ToolCall]], info: ValidationInfo) -> Optional[list[ToolCall]]:
        if v is not None and info.data.get("role") != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return v

    @field_validator("content")
    @classmethod
    def _content_needed(cls, v: Optional[Any], info: ValidationInfo) -> Optional[Any]:
        if "role" not in info.data or "tool_calls" not in info.data:
            return v  # those failed validation: their error says more
        if v is None and not (info.data["role"] == "assistant" and info.data["tool_calls"]):
            raise ValueError("is required (it may be null only in an assistant message with tool_calls)")
        return v

    def as_dict(self) -> dict[str, Any]:
        """What llama-cpp-python's chat templates read: text parts joined into one string."""
        content = self.content if isinstance(self.content, str) or self.content is None else \
            "".join(p.text for p in self.content)
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Name
    description: Optional[str] = Field(None, max_length=MAX_TEXT)
    parameters: Optional[dict[str, Any]] = None  # a JSON Schema (checked when the request is planned)
    strict: Optional[bool] = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: FunctionDef


class ChosenFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Annotated[str, Field(min_length=1, max_length=256)]


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: ChosenFunction


class ChatRequest(_Common):
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Optional[int] = Field(None, ge=0)  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: Optional[Annotated[list[Tool], Field(max_length=MAX_MESSAGES)]] = None
    tool_choice: Union[None, Literal["none", "auto", "required"], NamedToolChoice] = None
    parallel_tool_calls: Optional[bool] = None

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_limit(cls, v: Optional[int], info: ValidationInfo) -> Optional[int]:
        if v is not None and info.data.get("max_tokens") is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return _within_cap(v, info)

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, v: Optional[int], info: ValidationInfo) -> Optional[int]:
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("needs logprobs=true")
        return v

    def to_kwargs(self, default_max_tokens: int) -> dict[str, Any]:
        kw = self.sampling_kwargs()
        limit = self.max_tokens if self.max_tokens is not None else self.max_completion_tokens
        kw.update(messages=[m.as_dict() for m in self.messages], stream=self.stream,
                  max_tokens=default_max_tokens if limit is None else limit)
        if self.logprobs:
            kw.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        return kw


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _param(loc: tuple[Any, ...]) -> Optional[str]:
    """`messages.0.content` from pydantic's location, without the union-member tags it inserts."""
    parts = []
    for item in loc:
        if isinstance(item, int):
            parts.append(str(item))
        elif isinstance(item, str) and not (parts and ("[" in item or "-" in item or item in _TYPE_TAGS)):
            parts.append(item)
    return ".".join(parts) or None


def validate_request(model: type[_Common], body: dict[str, Any], limits: Limits) -> Any:
    """`model` validated from the parsed body; APIError(400) naming the first offending field."""
    for name in UNSUPPORTED:
        if name in body:
            raise APIError(400, f"'{name}' is not supported by this server{_INSTEAD.get(name, '')}", param=name,
                           code="unsupported_parameter")
    try:
        return model.model_validate(body, context={"limits": limits})
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        # a union reports one error per member; the last member's (a list's) says most
        first = [e for e in errors if e["loc"][:1] == errors[0]["loc"][:1]][-1]
        param = _param(first["loc"])
        if first["type"] == "extra_forbidden":
            raise APIError(400, f"unknown field '{param}'", param=param, code="unknown_parameter") from None
        if first["type"] == "missing":
            raise APIError(400, f"'{param}' is required", param=param, code="missing_parameter") from None
        msg = first["msg"].removeprefix("Value error, ")
        raise APIError(400, f"invalid '{param}': {msg}", param=param, code="invalid_value") from None
