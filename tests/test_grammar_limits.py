"""`check_gbnf`: grammar text bounded before llama.cpp's recursive parser sees it."""

from __future__ import annotations

import pytest

from llama_dflash.grammar_limits import (
    MAX_GRAMMAR_CHARS, MAX_NESTING, MAX_REPEAT, MAX_RULES, MAX_TOTAL_REPEAT, check_gbnf,
)

JSON_LIKE = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ws   # comment with ((( and {99999}
ws ::= | " " | "\n" [ \t]{0,20}
'''


@pytest.mark.parametrize("text", [
    JSON_LIKE,
    'root ::= ("a" | "b")*',
    'root ::= "(((((" [(((]{3} "{99999}"',  # brackets and braces inside literals and classes
    "root ::= " + "(" * MAX_NESTING + '"x"' + ")" * MAX_NESTING,
    f'root ::= "a"{{{MAX_REPEAT}}}',
    f'root ::= "a"{{1,{MAX_REPEAT}}} "b"{{2,}}',
    "root ::= x\n" + "".join(f"x ::= \"{i}\"\n" for i in range(1)),
])
def test_accepts_ordinary_grammars(text):
    assert check_gbnf(text) is None


@pytest.mark.parametrize("text, words", [
    ("root ::= " + "(" * 60_000 + '"x"' + ")" * 60_000, "characters"),  # the segfault of issue 13
    ("root ::= " + "(" * 30_000 + '"x"' + ")" * 30_000, "nests groups"),
    ("root ::= " + "(" * (MAX_NESTING + 1) + '"x"' + ")" * (MAX_NESTING + 1), "nests groups"),
    ('root ::= "a"{' + str(MAX_REPEAT + 1) + "}", "repetition count"),
    ('root ::= "a"{2,' + "9" * 5000 + "}", "repetition count"),
    ('root ::= "a"{' + "9" * 30 + ",}", "repetition count"),
    ("root ::= " + " ".join(f'("x"{{{MAX_REPEAT}}})' for _ in range(MAX_TOTAL_REPEAT // MAX_REPEAT + 1)), "expand"),
    ('root ::= "' + "y" * 200 + '"{' + str(MAX_REPEAT) + "}", "expand"),  # a long literal copied 1000 times
    ("root ::= a0\n" + "".join(f"a{i} ::= a{i + 1}\n" for i in range(MAX_RULES)), "rules"),
    ("x" * (MAX_GRAMMAR_CHARS + 1), "characters"),
    ('root ::= "abc', "unterminated string"),
    ("root ::= [abc", "unterminated character class"),
    ('root ::= "a"{3', "unterminated repetition"),
    ('root ::= "a"{x,2}', "malformed repetition"),
])
def test_refuses_with_the_limit_named(text, words):
    with pytest.raises(ValueError, match=words):
        check_gbnf(text)


def test_refuses_non_strings():
    with pytest.raises(ValueError, match="string"):
        check_gbnf(5)  # type: ignore[arg-type]
