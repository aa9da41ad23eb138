"""Bounds on GBNF grammar text, checked before llama.cpp parses it.

llama.cpp's GBNF parser recurses once per nested group, so a few tens of thousands of `(` overflow
the C stack (a segfault, not an error), and it expands `x{m,n}` into copies of `x`, so huge
repetition counts allocate without bound.  `check_gbnf` scans the text once -- skipping string
literals, character classes and comments, where brackets and braces mean nothing -- and raises a
ValueError naming the limit a grammar exceeds.  It checks sizes only; syntax errors are left to
llama.cpp's parser, which reports them without crashing.
"""

from __future__ import annotations

__all__ = ["check_gbnf", "MAX_GRAMMAR_CHARS", "MAX_NESTING", "MAX_REPEAT", "MAX_TOTAL_REPEAT", "MAX_RULES"]

#: grammar text length in characters (llama.cpp's own grammars are a few KiB)
MAX_GRAMMAR_CHARS = 65_536
#: nesting depth of groups `( ... )`
MAX_NESTING = 64
#: the largest bound in one repetition `{m}`, `{m,}`, `{m,n}`
MAX_REPEAT = 1_000
#: the sum over all repetitions of (largest bound x size of the repeated symbol): the elements the
#: parser's expansion copies (a group or rule reference counts 1, a literal or class its length)
MAX_TOTAL_REPEAT = 100_000
#: rule definitions (`name ::= ...`); rule references recurse in the grammar's stack walks
MAX_RULES = 1_000


def _skip_quoted(text: str, i: int, close: str, what: str) -> int:
    """Index just past the `close` character ending the literal/class that starts at text[i]."""
    n = len(text)
    j = i + 1
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == close:
            return j + 1
        j += 1
    raise ValueError(f"grammar: unterminated {what} at character {i}")


def _repetition_bound(text: str, i: int) -> tuple[int, int]:
    """(largest bound, index past `}`) of the `{m}`, `{m,}` or `{m,n}` starting at text[i]."""
    end = text.find("}", i + 1)
    if end < 0:
        raise ValueError(f"grammar: unterminated repetition at character {i}")
    parts = [p.strip() for p in text[i + 1 : end].split(",")]
    if not 1 <= len(parts) <= 2 or not parts[0].isdigit() or (len(parts) == 2 and parts[1] and not parts[1].isdigit()):
        raise ValueError(f"grammar: malformed repetition {text[i:end + 1][:40]!r} at character {i}")
    # digits only: compare lengths first so a 10,000-digit count costs nothing to reject
    for p in parts:
        if len(p) > len(str(MAX_REPEAT)) or (p and int(p) > MAX_REPEAT):
            raise ValueError(f"grammar: repetition count {p[:20]} exceeds the limit of {MAX_REPEAT}")
    low = int(parts[0])
    high = int(parts[1]) if len(parts) == 2 and parts[1] else low + 1  # {m,}: m copies and a loop
    return max(low, high), end + 1


def check_gbnf(text: str) -> None:
    """Raise ValueError naming the limit if `text` is too long, nests groups too deeply, repeats too
    much or has too many rules for llama.cpp's parser to handle safely; return None otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"grammar must be a string, not {type(text).__name__}")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"grammar is {len(text)} characters long; the limit is {MAX_GRAMMAR_CHARS}")
    depth = 0
    total = 0
    rules = 0
    last_size = 1  # size of the symbol a repetition would copy
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"[":
            end = _skip_quoted(text, i, '"' if c == '"' else "]", "string literal" if c == '"' else "character class")
            last_size, i = end - i, end
            continue
        if c == "#":
            nl = text.find("\n", i)
            i = n if nl < 0 else nl + 1
            continue
        if c == "(":
            depth += 1
            if depth > MAX_NESTING:
                raise ValueError(f"grammar nests groups deeper than the limit of {MAX_NESTING}")
        elif c == ")":
            depth = max(0, depth - 1)  # an unbalanced ')' is the parser's error to report
            last_size = 1
        elif c == "{":
            bound, i = _repetition_bound(text, i)
            total += bound * last_size
            if total > MAX_TOTAL_REPEAT:
                raise ValueError(f"grammar repetitions expand to more than the limit of {MAX_TOTAL_REPEAT} elements")
            continue
        elif c == ":" and text.startswith("::=", i):
            rules += 1
            if rules > MAX_RULES:
                raise ValueError(f"grammar has more than the limit of {MAX_RULES} rules")
            i += 3
            continue
        elif not c.isspace():
            last_size = 1
        i += 1
