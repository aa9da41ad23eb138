"""From a validated request to the completion call: its grammar, its messages and how its answer
is rewritten (`grammar`, `response_format`, `tools`).

Everything that can fail on the client's input fails here, as APIError(400), before the request
queues for the model: a schema that is not JSON Schema or cannot become a grammar, a tool_choice
naming no tool, a grammar llama.cpp's parser refuses (checked by building its sampler once, after
`grammar_limits.check_gbnf` bounded it).  The generation then runs llama-cpp-python's own
completion code with that grammar, speculation included: the target samples every verified row
through the grammar, so a drafted token the grammar forbids is never accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from llama_cpp import LlamaGrammar

from .errors import APIError
from .json_grammar import SchemaError, check_schema, schema_grammar
from .tools import ToolPlan, history

__all__ = ["Prepared", "prepare"]


@dataclass
class Prepared:
    """The completion's keyword arguments and the rewrites of its answer (None: as it comes)."""

    kwargs: dict[str, Any]
    finish: Optional[Callable[[dict[str, Any]], dict[str, Any]]] = None
    stream: Optional[Callable[[Iterator[dict[str, Any]]], Iterator[dict[str, Any]]]] = None

    def post(self, result: Any) -> Any:
        """Apply the rewrite that fits `result` (an answer, or a stream of chunks)."""
        if isinstance(result, dict):
            return self.finish(result) if self.finish is not None else result
        return self.stream(result) if self.stream is not None else result


def _needs_history(messages: list[dict[str, Any]]) -> bool:
    return any(m["role"] in ("tool", "developer") or m.get("tool_calls") for m in messages)


def _parsed(text: str, vocab: Any, param: str) -> LlamaGrammar:
    """`text` as a grammar llama.cpp accepts (APIError 400 otherwise)."""
    from ..highlevel import _check_grammar

    grammar = LlamaGrammar.from_string(text, verbose=False)
    try:
        _check_grammar(grammar, vocab)
    except ValueError as exc:
        raise APIError(400, f"invalid '{param}': {exc}"[:1000], param=param, code="invalid_grammar") from None
    return grammar


def prepare(req: Any, kwargs: dict[str, Any], vocab: Any) -> Prepared:
    """The completion arguments for `req` (`kwargs` from its `to_kwargs`); `vocab`: the model's."""
    out = Prepared(kwargs)
    text, param = (req.grammar, "grammar") if req.grammar is not None else (None, "")
    fmt = req.json_format()
    if fmt is not None:
        schema, strict = fmt.schema_and_strict()
        try:
            if schema is not None:
                check_schema(schema, "the response_format schema", strict=strict)
            text, param = schema_grammar(schema), "response_format"
        except SchemaError as exc:
            raise APIError(400, str(exc), param="response_format", code="invalid_schema") from None
    if "messages" in kwargs:
        tools = [t.model_dump() for t in req.tools or ()]
        choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else req.tool_choice
        plan = ToolPlan.build(tools, choice, req.parallel_tool_calls, fmt.as_dict() if fmt is not None else None)
        if plan is not None:
            if req.grammar is not None:
                raise APIError(400, "give 'grammar' or 'tools', not both", param="grammar", code="invalid_value")
            if req.logprobs:
                raise APIError(400, "logprobs are not served with tool calls", param="logprobs",
                               code="invalid_value")
            kwargs["messages"] = plan.messages(kwargs["messages"])
            text, param = plan.grammar, "tools"
            out.finish, out.stream = plan.finish, plan.stream
        elif _needs_history(kwargs["messages"]):
            kwargs["messages"] = history(kwargs["messages"])
    if text is not None:
        kwargs["grammar"] = _parsed(text, vocab, param)
    return out
