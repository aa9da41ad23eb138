"""Tool calling through constrained JSON, on the model's own chat template.

Chat templates differ in whether and how they describe tools and in the syntax they expect a
model to answer with; a server that parses each family's syntax needs a parser per family.  This
one takes the route llama-cpp-python's `chatml-function-calling` handler and llama-server's generic
format take: the tools are described in a system message, the reply is constrained by a grammar to
one JSON object -- ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` or, where the model may
answer in words (`tool_choice` "auto"), ``{"response": "..."}`` -- and the server turns that object
into OpenAI's `tool_calls` (streamed as deltas by `envelope.EnvelopeReader`).  Every call's
arguments follow its function's JSON Schema (`json_grammar`).  The template itself only lays out
roles, so any model works, with or without tool support in its template.

The history is rendered the same way (`history`): an assistant's earlier `tool_calls` become the
JSON object it would have written, and `tool` results become a user message that carries them.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from .envelope import EnvelopeReader
from .errors import APIError
from .json_grammar import JsonGrammar, SchemaError, check_schema, convert

__all__ = ["ToolPlan", "history", "MAX_TOOLS"]

MAX_TOOLS = 128  # OpenAI's limit


def _call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _arguments_value(text: str) -> Any:
    """An earlier call's arguments as JSON (kept as a string when they are not JSON)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with tool calls and tool results written as text any chat template can lay out.

    Consecutive tool results are merged into one user message (templates that insist on
    alternating roles refuse two user messages in a row)."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for m in messages:
        role = m["role"]
        if role == "developer":
            m = {**m, "role": "system"}
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                names[c["id"]] = c["function"]["name"]
                calls.append({"name": c["function"]["name"], "arguments": _arguments_value(c["function"]["arguments"])})
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
        elif role == "tool":
            result = {"tool_call_id": m.get("tool_call_id"), "name": names.get(m.get("tool_call_id", ""), m.get("name")),
                      "content": m.get("content") or ""}
            if out and out[-1].get("_tool_results") is not None:
                out[-1]["_tool_results"].append(result)
            else:
                out.append({"role": "user", "_tool_results": [result]})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content", "name")}
                       | {"content": m.get("content") or ""})
    for m in out:
        results = m.pop("_tool_results", None)
        if results is not None:
            m["content"] = "Tool results:\n" + "\n".join(json.dumps(r, ensure_ascii=False) for r in results)
    return out


@dataclass
class ToolPlan:
    """How one request with `tools` is prompted, constrained and answered."""

    tools: list[dict[str, Any]]
    choice: str  # "auto", "required" or the name of a function
    parallel: bool = True
    response_schema: Optional[dict[str, Any]] = None  # response_format's schema for a worded answer
    response_json: bool = False  # response_format asked for JSON (with or without a schema)
    grammar: str = field(init=False, default="")

    @classmethod
    def build(cls, tools: list[dict[str, Any]], tool_choice: Any, parallel: Optional[bool],
              response_format: Optional[dict[str, Any]] = None) -> Optional["ToolPlan"]:
        """The plan for a request (None when no tool may be called); APIError(400) for bad input."""
        if len(tools) > MAX_TOOLS:
            raise APIError(400, f"at most {MAX_TOOLS} tools", param="tools", code="invalid_value")
        seen: set[str] = set()
        for i, tool in enumerate(tools):
            fn = tool["function"]
            if fn["name"] in seen:
                raise APIError(400, f"two tools are named {fn['name']!r}", param=f"tools.{i}.function.name",
                               code="invalid_value")
            seen.add(fn["name"])
            if fn.get("parameters") is not None:
                try:
                    check_schema(fn["parameters"], f"the parameters of tool {fn['name']!r}",
                                 strict=bool(fn.get("strict")))
                except SchemaError as exc:
                    raise APIError(400, str(exc), param=f"tools.{i}.function.parameters",
                                   code="invalid_schema") from None
        if tool_choice is None:
            tool_choice = "auto" if tools else "none"
        if isinstance(tool_choice, dict):
            choice = tool_choice["function"]["name"]
            if choice not in seen:
                raise APIError(400, f"tool_choice names the function {choice!r}, which is not among the tools",
                               param="tool_choice", code="invalid_value")
        else:
            choice = tool_choice
        if choice == "none":
            return None
        if not tools:
            raise APIError(400, f"tool_choice {choice!r} needs tools", param="tool_choice", code="invalid_value")
        fmt = response_format or {}
        plan = cls(tools=tools, choice=choice, parallel=True if parallel is None else bool(parallel),
                   response_schema=fmt.get("schema"), response_json=fmt.get("type") in ("json_object", "json_schema"))
        try:
            plan.grammar = plan._grammar()
        except SchemaError as exc:
            raise APIError(400, str(exc), param="tools", code="invalid_schema") from None
        return plan

    # ---- the prompt ---------------------------------------------------------------------------------
    def _callable(self) -> list[dict[str, Any]]:
        if self.choice in ("auto", "required"):
            return self.tools
        return [t for t in self.tools if t["function"]["name"] == self.choice]

    def instructions(self) -> str:
        """The system text that describes the tools and the reply."""
        lines = ["You can call the following tools. Each one's arguments follow the JSON Schema given."]
        for t in self.tools:
            fn = t["function"]
            desc = f": {fn['description']}" if fn.get("description") else ""
            params = json.dumps(fn.get("parameters") or {"type": "object"}, ensure_ascii=False)
            lines.append(f"- {fn['name']}{desc}\n  arguments: {params}")
        many = "one or more calls" if self.parallel else "exactly one call"
        call = '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'
        if self.choice == "auto":
            answer = "a JSON object" if self.response_json else "your answer as a JSON string"
            lines.append(f"Reply with a single JSON object: {call} to call tools ({many}), "
                         f'or {{"response": ...}} with {answer} to reply to the user directly.')
        elif self.choice == "required":
            lines.append(f"Reply with a single JSON object that calls tools ({many}): {call}")
        else:
            lines.append(f'Reply with a single JSON object that calls the tool "{self.choice}": {call}')
        lines.append("Tool results come back in a user message that starts with 'Tool results:'.")
        return "\n".join(lines)

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rendered history with the instructions in the (first) system message."""
        out = history(messages)
        text = self.instructions()
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}" if out[0]["content"] else text}
        else:
            out.insert(0, {"role": "system", "content": text})
        return out

    # ---- the grammar --------------------------------------------------------------------------------
    def _grammar(self) -> str:
        def build(conv: JsonGrammar) -> None:
            calls = []
            for i, tool in enumerate(self._callable()):
                fn = tool["function"]
                params = json.loads(json.dumps(fn.get("parameters") or {"type": "object"}))
                args = conv.add(params, f"tool{i}-arguments", f"tool{i}")
                name = json.dumps(json.dumps(fn["name"]))  # a GBNF literal of the JSON string
                calls.append(conv.rule(f"tool{i}-call", r'"{" space "\"name\"" space ":" space '
                                       f'{name} space "," space '
                                       r'"\"arguments\"" space ":" space ' f'{args} "}}" space'))
            call = conv.rule("call", " | ".join(calls))
            named = self.choice not in ("auto", "required")
            more = "" if named or not self.parallel else f' ("," space {call})*'
            branches = [conv.rule("tool-calls", r'"{" space "\"tool_calls\"" space ":" space "[" space '
                                  f'{call}{more} "]" space "}}" space')]
            if self.choice == "auto":
                if self.response_json:
                    schema = self.response_schema if self.response_schema is not None else {"type": "object"}
                    value = conv.add(json.loads(json.dumps(schema)), "response-value", "response")
                else:
                    value = conv.add({"type": "string"}, "response-value", "response")
                branches.append(conv.rule("response", r'"{" space "\"response\"" space ":" space '
                                          f'{value} "}}" space'))
            conv.rule("root", " | ".join(branches))

        return convert(build)

    # ---- the answer ---------------------------------------------------------------------------------
    def finish(self, result: dict[str, Any]) -> dict[str, Any]:
        """A chat completion whose content is the envelope, as OpenAI's answer."""
        choice = result["choices"][0]
        reader = EnvelopeReader()
        reader.feed(choice["message"].get("content") or "")
        message: dict[str, Any] = {"role": "assistant", "content": reader.content}
        if reader.calls:
            message["content"] = None
            message["tool_calls"] = [{"id": _call_id(), "type": "function",
                                      "function": {"name": c.name or "", "arguments": c.arguments}}
                                     for c in reader.calls]
            if choice["finish_reason"] == "stop":
                choice["finish_reason"] = "tool_calls"
        elif reader.content is None:
            message["content"] = ""
        choice["message"] = message
        return result

    def stream(self, chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Chat chunks whose content is the envelope, as OpenAI's deltas."""
        reader = EnvelopeReader()
        ids: dict[int, str] = {}
        try:
            for chunk in chunks:
                choice = chunk["choices"][0]
                delta = choice.get("delta") or {}
                if choice.get("finish_reason") is not None:
                    if reader.calls and choice["finish_reason"] == "stop":
                        choice["finish_reason"] = "tool_calls"
                    yield chunk
                    continue
                if "content" not in delta:  # the opening chunk (the role)
                    yield chunk
                    continue
                for ev in reader.feed(delta.get("content") or ""):
                    if ev[0] == "content":
                        out: dict[str, Any] = {"content": ev[1]}
                    elif ev[0] == "name":
                        index = int(ev[1])
                        ids[index] = _call_id()
                        out = {"tool_calls": [{"index": index, "id": ids[index], "type": "function",
                                               "function": {"name": ev[2], "arguments": ""}}]}
                    else:
                        index = int(ev[1])
                        if index not in ids:  # arguments before the name: cannot happen under the grammar
                            continue
                        out = {"tool_calls": [{"index": index, "function": {"arguments": ev[2]}}]}
                    yield {**chunk, "choices": [{**choice, "delta": out}]}
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
