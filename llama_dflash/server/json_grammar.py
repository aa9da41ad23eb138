"""JSON Schema -> GBNF for `response_format` and tool arguments, on llama-cpp-python's converter.

`llama_cpp.llama_grammar.SchemaConverter` is what llama-cpp-python's own chat handlers use for
`response_format` and named tool calls.  Three of its habits would break the server's contract,
so this subclass changes them (and nothing else):

* its string character rule admits raw control characters (a newline inside a string), which no
  JSON parser accepts: ours admits only what JSON allows, so every finished answer parses;
* it expands `minLength`/`maxLength`/`minItems`/`maxItems` into nested optional groups, one level
  per allowed item (a `maxLength` of 100 nests 100 deep, past llama.cpp's parser limits): ours
  writes GBNF's own `{m,n}` repetition;
* it names a `$ref` rule after the reference's last path segment, so two tool schemas that both
  define `$defs/Item` would share one rule: ours names it after the whole reference.

Schemas are checked before any of that runs: a valid JSON Schema (the `jsonschema` package), sizes
the grammar can hold (`MAX_REPEAT`), and with `strict` only keywords a grammar can enforce.  Every
failure is a `SchemaError` (a ValueError) with a message for the client.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Optional

from llama_cpp import llama_grammar as lg

from ..grammar_limits import MAX_REPEAT, check_gbnf

__all__ = ["SchemaError", "JsonGrammar", "check_schema", "schema_grammar", "UNENFORCED"]

#: JSON-legal characters inside a string (no raw control characters, no lone quote or backslash)
_CHAR = lg.BuiltinRule(r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})', [])

#: keywords the grammar does not enforce: refused with strict, best effort (ignored) without it
UNENFORCED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems",
              "minProperties", "maxProperties", "not", "if", "then", "else", "contains", "minContains",
              "maxContains", "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
              "unevaluatedProperties", "unevaluatedItems")
_SIZES = ("minItems", "maxItems", "minLength", "maxLength")
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


class SchemaError(ValueError):
    """A schema that cannot become a grammar (the message says why)."""


_MAPS = ("properties", "$defs", "definitions", "dependentSchemas", "patternProperties")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_ONES = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
         "unevaluatedItems", "unevaluatedProperties")


def _subschemas(schema: Any) -> Iterable[dict]:
    """`schema` and every schema inside it (iteratively: deep input must not hit the recursion limit)."""
    stack = [schema]
    while stack:
        item = stack.pop()
        if not isinstance(item, dict):
            continue
        yield item
        for key in _MAPS:
            if isinstance(item.get(key), dict):
                stack.extend(item[key].values())
        for key in _LISTS:
            if isinstance(item.get(key), list):
                stack.extend(item[key])
        for key in _ONES:
            stack.append(item.get(key))


def check_schema(schema: Any, where: str, *, strict: bool = False) -> None:
    """Raise SchemaError unless `schema` is a JSON Schema whose sizes a grammar can hold (and, with
    `strict`, whose every keyword the grammar enforces).  `where` names it in the message."""
    from jsonschema import exceptions, validators

    if not isinstance(schema, dict):
        raise SchemaError(f"{where} must be a JSON Schema object")
    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        path = "/".join(str(p) for p in exc.path)
        raise SchemaError(f"{where} is not a valid JSON Schema: {exc.message}"[:500]
                          + (f" (at {path})" if path else "")) from None
    except Exception as exc:  # noqa: BLE001 - e.g. an unknown $schema dialect
        raise SchemaError(f"{where} is not a valid JSON Schema: {exc}"[:500]) from None
    for sub in _subschemas(schema):
        for key in _SIZES:
            value = sub.get(key)
            if isinstance(value, int) and value > MAX_REPEAT:
                raise SchemaError(f"{where}: {key} {value} is above the limit of {MAX_REPEAT} a grammar can hold")
        pattern = sub.get("pattern")
        if isinstance(pattern, str):
            for m in _QUANTIFIER.finditer(pattern):
                if any(g and int(g) > MAX_REPEAT for g in m.groups()):
                    raise SchemaError(f"{where}: the pattern repeats more than the limit of {MAX_REPEAT}")
        if strict:
            bad = [k for k in UNENFORCED if k in sub]
            if bad:
                raise SchemaError(f"{where} uses {bad[0]!r}, which the grammar cannot enforce: drop it or send "
                                  "strict: false (then it is not enforced)")


class JsonGrammar(lg.SchemaConverter):
    """llama-cpp-python's converter with JSON-legal strings, `{m,n}` repetition and unique `$ref` rules."""

    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def _add_primitive(self, name: str, rule: lg.BuiltinRule) -> str:
        if name == "char":
            rule = _CHAR
        return super()._add_primitive(name, rule)

    def _resolve_ref(self, ref: str) -> str:
        name = lg.INVALID_RULE_CHARS_RE.sub("-", ref).strip("-")
        if name not in self._rules and ref not in self._refs_being_resolved:
            self._refs_being_resolved.add(ref)
            name = self.visit(self._refs[ref], name)
            self._refs_being_resolved.remove(ref)
        return name

    def visit(self, schema: Any, name: str) -> str:
        if not isinstance(schema, dict):
            raise SchemaError("a subschema that is not an object (true/false schemas are not supported)")
        rule_name = name + "-" if name in lg.RESERVED_NAMES else name or "root"
        plain = not any(k in schema for k in ("$ref", "anyOf", "oneOf", "const", "enum", "pattern", "format",
                                              "allOf", "prefixItems"))
        kind = schema.get("type")
        if plain and kind == "string" and ("minLength" in schema or "maxLength" in schema):
            char = self._add_primitive("char", _CHAR)
            return self._add_rule(rule_name, rf'"\"" {char}{_bounds(schema, "minLength", "maxLength")} "\"" space')
        if plain and kind == "array" and isinstance(schema.get("items"), dict) and (
                "minItems" in schema or "maxItems" in schema):
            item = self.visit(schema["items"], f"{name}{'-' if name else ''}item")
            lo, hi = int(schema.get("minItems", 0)), schema.get("maxItems")
            if hi is not None and int(hi) < lo:
                raise SchemaError(f"minItems {lo} is above maxItems {hi}")
            if hi is not None and int(hi) == 0:
                return self._add_rule(rule_name, '"[" space "]" space')
            rest_hi = "" if hi is None else str(int(hi) - 1)
            more = f'("," space {item}){{{max(lo - 1, 0)},{rest_hi}}}'
            body = f"{item} {more}" if lo >= 1 else f"({item} {more})?"
            return self._add_rule(rule_name, f'"[" space {body} "]" space')
        return super().visit(schema, name)

    def add(self, schema: dict, name: str, url: str) -> str:
        """The rule matching `schema` (its `#/...` references resolved inside it, under `url`)."""
        schema = self.resolve_refs(schema, url)
        return self.visit(schema, name)

    def rule(self, name: str, body: str) -> str:
        return self._add_rule(name, body)

    def grammar(self) -> str:
        text = self.format_grammar()
        check_gbnf(text)
        return text


def _bounds(schema: dict, lo_key: str, hi_key: str) -> str:
    lo, hi = int(schema.get(lo_key, 0)), schema.get(hi_key)
    if hi is not None and int(hi) < lo:
        raise SchemaError(f"{lo_key} {lo} is above {hi_key} {hi}")
    return f"{{{lo},{'' if hi is None else int(hi)}}}"


def convert(build) -> str:  # type: ignore[no-untyped-def]
    """`build(converter)` run with every converter failure as a SchemaError; the grammar text."""
    conv = JsonGrammar()
    try:
        build(conv)
        return conv.grammar()
    except SchemaError:
        raise
    except RecursionError:
        raise SchemaError("the schema nests too deeply to become a grammar") from None
    except ValueError as exc:  # check_gbnf's limits, unsupported $ref, bad quantifiers
        raise SchemaError(f"the schema cannot become a grammar: {exc}"[:500]) from None
    except (AssertionError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise SchemaError(f"the schema cannot become a grammar ({type(exc).__name__}: {exc})"[:500]) from None


def schema_grammar(schema: Optional[dict]) -> str:
    """GBNF for one JSON value matching `schema` (None: any JSON object, as `json_object` asks)."""
    target = {"type": "object"} if schema is None else schema

    def build(conv: JsonGrammar) -> None:
        value = conv.add(json.loads(json.dumps(target)), "answer", "schema")
        conv.rule("root", value)

    return convert(build)
