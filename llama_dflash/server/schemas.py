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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

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
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "stream_options",
               "audio", "modalities", "prediction", "reasoning_effort", "web_search_options")


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
    response_format: Optional[dict[str, Any]] = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        if v is not None and v != {"type": "text"}:
            raise ValueError("only {'type': 'text'} is supported (use 'grammar' to constrain the output)")
        return v

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


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant"]
    content: Union[Annotated[str, Field(max_length=MAX_TEXT)], Annotated[list[TextPart], Field(min_length=1)]]
    name: Optional[str] = Field(None, max_length=256)

    def as_dict(self) -> dict[str, Any]:
        """What llama-cpp-python's chat templates read: text parts joined into one string."""
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatRequest(_Common):
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Optional[int] = Field(None, ge=0)  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)

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
            raise APIError(400, f"'{name}' is not supported by this server", param=name,
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
