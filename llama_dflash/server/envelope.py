"""Reads the tool-call envelope a model writes under `tools.py`'s grammar, as it streams.

The envelope is one JSON object, either ``{"tool_calls": [{"name": N, "arguments": {...}}, ...]}``
or ``{"response": ...}``.  `EnvelopeReader` consumes the text piece by piece (each character once,
so a long answer costs linear time) and reports what became known: the decoded text of a string
`response` (or the raw JSON of a non-string one), each call's name once its string is closed,
and the raw JSON text of its arguments as it grows.  Text the grammar cannot have produced (a
truncated answer is fine) ends the reading quietly; `calls` and `content` keep what was read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

__all__ = ["EnvelopeReader", "Call", "Event"]

_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WS = " \t\n\r"


@dataclass
class Call:
    name: Optional[str] = None
    arguments: str = ""


#: ("content", text) | ("name", index, name) | ("arguments", index, text)
Event = Union[tuple[str, str], tuple[str, int, str]]


@dataclass
class _Frame:
    kind: str  # "obj" or "arr"
    state: str  # obj: "key", "colon", "value", "next"; arr: "value", "next"
    key: Optional[str] = None
    index: int = -1


@dataclass
class EnvelopeReader:
    calls: list[Call] = field(default_factory=list)
    content: Optional[str] = None
    done: bool = False  # the envelope's closing brace was read
    broken: bool = False  # text the envelope grammar cannot produce

    def __post_init__(self) -> None:
        self._stack: list[_Frame] = []
        self._started = False
        self._string: Optional[list[str]] = None  # the string being read (decoded)
        self._is_key = False
        self._escape: Optional[str] = None  # "" after a backslash, "uXXX" while reading \uXXXX
        self._high: Optional[int] = None  # a high surrogate waiting for its pair
        self._scalar = False
        self._capture: Optional[int] = None  # stack depth of the raw value being captured
        self._capture_to: Optional[tuple[str, int]] = None
        self._events: list[Event] = []

    # ---- public -----------------------------------------------------------------------------------
    def feed(self, text: str) -> list[Event]:
        """Read `text`; the events it completed, adjacent pieces of one kind merged."""
        self._events = []
        for ch in text:
            if self.done or self.broken:
                break
            if self._capture is not None:
                self._emit_raw(ch)
            self._char(ch)
        return _merge(self._events)

    # ---- where a value sits ------------------------------------------------------------------------
    def _path(self) -> tuple:
        out: list = []
        for f in self._stack:
            out.append(f.key if f.kind == "obj" else f.index)
        return tuple(out)

    def _value_target(self) -> Optional[str]:
        """What the value starting now is to the envelope: "response", "name", "arguments" or None."""
        path = self._path()
        if path == ("response",):
            return "response"
        if len(path) == 3 and path[0] == "tool_calls" and isinstance(path[1], int):
            return path[2] if path[2] in ("name", "arguments") else None
        return None

    def _call(self, index: int) -> Call:
        while len(self.calls) <= index:
            self.calls.append(Call())
        return self.calls[index]

    def _emit_raw(self, ch: str) -> None:
        kind, index = self._capture_to  # type: ignore[misc]
        if kind == "content":
            self.content = (self.content or "") + ch
            self._events.append(("content", ch))
        else:
            self._call(index).arguments += ch
            self._events.append(("arguments", index, ch))

    def _start_capture(self, kind: str, index: int) -> None:
        self._capture = len(self._stack)
        self._capture_to = (kind, index)

    # ---- the JSON scanner ---------------------------------------------------------------------------
    def _char(self, ch: str) -> None:
        if self._string is not None:
            self._string_char(ch)
        elif self._scalar:
            if ch in _WS or ch in ",}]":
                self._scalar = False
                if self._capture == len(self._stack):  # the delimiter is not part of the value
                    self._uncapture_last()
                self._value_done()
                self._char(ch)
        else:
            self._structural(ch)

    def _uncapture_last(self) -> None:
        """The character just captured ended a scalar: take it back."""
        kind, index = self._capture_to  # type: ignore[misc]
        if kind == "content":
            self.content = (self.content or "")[:-1]
        else:
            self._call(index).arguments = self._call(index).arguments[:-1]
        self._events.pop()

    def _begin_value(self, ch: str) -> None:
        target = self._value_target() if self._capture is None else None
        top = self._stack[-1] if self._stack else None
        if target == "arguments" and top is not None:
            self._start_capture("arguments", self._stack[-2].index)
            self._emit_raw(ch)
        elif target == "response" and ch != '"':
            self._start_capture("content", 0)
            self._emit_raw(ch)
        if ch == "{":
            self._stack.append(_Frame("obj", "key"))
        elif ch == "[":
            self._stack.append(_Frame("arr", "value"))
        elif ch == '"':
            self._string, self._is_key = [], False
        elif ch in "-0123456789tfn":
            self._scalar = True
        else:
            self.broken = True

    def _structural(self, ch: str) -> None:
        if ch in _WS:
            return
        if not self._started:
            self._started = True
            if ch != "{":
                self.broken = True
                return
            self._stack.append(_Frame("obj", "key"))
            return
        if not self._stack:
            self.broken = True
            return
        top = self._stack[-1]
        if top.kind == "obj":
            if top.state == "key" and ch == '"':
                self._string, self._is_key = [], True
            elif top.state in ("key", "next") and ch == "}":
                self._close()
            elif top.state == "next" and ch == ",":
                top.state = "key"
            elif top.state == "colon" and ch == ":":
                top.state = "value"
            elif top.state == "value":
                self._begin_value(ch)
            else:
                self.broken = True
        else:
            if top.state == "value" and ch == "]" and top.index < 0:
                self._close()
            elif top.state == "next" and ch == "]":
                self._close()
            elif top.state == "next" and ch == ",":
                top.state = "value"
            elif top.state == "value":
                top.index += 1
                self._begin_value(ch)
            else:
                self.broken = True

    def _close(self) -> None:
        self._stack.pop()
        if not self._stack:
            self.done = True
            return
        self._value_done()

    def _value_done(self) -> None:
        """A value inside the top frame ended (its last character already read)."""
        if self._capture is not None and self._capture == len(self._stack):
            self._capture = None
        top = self._stack[-1]
        top.state = "next"

    def _string_char(self, ch: str) -> None:
        buf = self._string
        assert buf is not None
        if self._escape is not None:
            if self._escape == "":
                if ch == "u":
                    self._escape = "u"
                    return
                out = _ESCAPES.get(ch)
                self._escape = None
                if out is None:
                    self.broken = True
                    return
                self._string_text(out)
                return
            self._escape += ch
            if len(self._escape) == 5:
                try:
                    code = int(self._escape[1:], 16)
                except ValueError:
                    self.broken = True
                    return
                self._escape = None
                if 0xD800 <= code < 0xDC00:
                    self._high = code
                    return
                if 0xDC00 <= code < 0xE000 and self._high is not None:
                    code = 0x10000 + ((self._high - 0xD800) << 10) + (code - 0xDC00)
                self._high = None
                self._string_text(chr(code) if not 0xD800 <= code < 0xE000 else "\ufffd")
            return
        if ch == "\\":
            self._escape = ""
            return
        if ch == '"':
            text = "".join(buf)
            self._string = None
            self._string_done(text)
            return
        self._string_text(ch)

    def _string_text(self, text: str) -> None:
        assert self._string is not None
        self._string.append(text)
        if not self._is_key and self._capture is None and self._value_target() == "response":
            self.content = (self.content or "") + text
            self._events.append(("content", text))

    def _string_done(self, text: str) -> None:
        top = self._stack[-1]
        if self._is_key:
            top.key = text
            top.state = "colon"
            return
        if self._capture is None:
            target = self._value_target()
            if target == "name":
                index = self._stack[-2].index
                self._call(index).name = text
                self._events.append(("name", index, text))
            elif target == "response" and self.content is None:
                self.content = ""  # an empty response string
        self._value_done()


def _merge(events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for ev in events:
        if out and ev[0] == out[-1][0] and ev[0] in ("content", "arguments") and ev[:-1] == out[-1][:-1]:
            out[-1] = (*out[-1][:-1], out[-1][-1] + ev[-1])  # type: ignore[assignment]
        else:
            out.append(ev)
    return out
