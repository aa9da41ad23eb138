"""`generate --show-drafts`: the answer in a terminal, each accepted draft token marked by the
speculator that drafted it (the target's own tokens unmarked) -- the chat page's marking for a shell.

Colour (a background per speculator) where the output is a terminal that takes it (a tty, TERM not
"dumb", NO_COLOR unset); plain brackets elsewhere (a pipe, a file, a log), one pair per speculator
around each run of its accepted tokens: ``[...]``, then ``{...}``, ``<...>``, ``|...|``.  A legend
names them (`legend`).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional, TextIO

from .origins import TARGET, TokenOrigin

__all__ = ["DraftMarker", "use_colour", "token_bytes"]

_BRACKETS = (("[", "]"), ("{", "}"), ("<", ">"), ("|", "|"))
_COLOURS = ("42", "44", "43", "45", "46", "41")  # ANSI backgrounds: green, blue, yellow, magenta, cyan, red
_RESET = "\x1b[0m"


def use_colour(stream: Any) -> bool:
    """Whether `stream` is a terminal that shows ANSI colours (https://no-color.org: NO_COLOR disables)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM", "") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def token_bytes(vocab: Any, token: int) -> bytes:
    """The bytes of one token's text (special tokens render as nothing, as in the answer's text)."""
    from llama_cpp import llama_cpp as ll

    buf = ctypes.create_string_buffer(256)
    n = ll.llama_token_to_piece(vocab, int(token), buf, len(buf), 0, False)
    return buf.raw[:n] if n > 0 else b""


class DraftMarker:
    """Writes text pieces to `out`, marking accepted draft tokens by speculator."""

    def __init__(self, out: TextIO, colour: bool):
        self.out = out
        self.colour = colour
        self.names: list[str] = []  # speculators in order of first appearance
        self._open: Optional[str] = None  # the speculator whose bracket is open (plain mode)

    def _index(self, name: str) -> int:
        if name not in self.names:
            self.names.append(name)
        return self.names.index(name)

    def write(self, text: str, origin: TokenOrigin) -> None:
        name = origin.origin
        if self.colour:
            if name == TARGET or not text:
                self.out.write(text)
            else:
                code = _COLOURS[self._index(name) % len(_COLOURS)]
                # colour each line on its own: a newline inside a coloured run would paint the margin
                self.out.write("\n".join(f"\x1b[{code}m{part}{_RESET}" if part else "" for part in text.split("\n")))
            return
        starts_run = origin.is_draft and (self._open != name or origin.depth == 1)
        if self._open is not None and (not origin.is_draft or starts_run):
            self.out.write(_BRACKETS[self._index(self._open) % len(_BRACKETS)][1])
            self._open = None
        if starts_run:
            self.out.write(_BRACKETS[self._index(name) % len(_BRACKETS)][0])
            self._open = name
        self.out.write(text)

    def close(self) -> None:
        """Close a bracket still open at the end of the answer."""
        if self._open is not None and not self.colour:
            self.out.write(_BRACKETS[self._index(self._open) % len(_BRACKETS)][1])
            self._open = None

    def legend(self) -> str:
        """One line naming each mark (in colour when marking in colour)."""
        if not self.names:
            return "no draft token was accepted: every token is the target's own"
        parts = []
        for i, name in enumerate(self.names):
            if self.colour:
                parts.append(f"\x1b[{_COLOURS[i % len(_COLOURS)]}m{name}{_RESET}")
            else:
                left, right = _BRACKETS[i % len(_BRACKETS)]
                parts.append(f"{left}...{right} {name}")
        return "accepted draft tokens: " + ", ".join(parts) + "; unmarked: the target's own tokens"
