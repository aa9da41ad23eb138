"""Exceptions raised before anything reaches llama.cpp, so that bad input never aborts the process."""

from __future__ import annotations

from typing import Any, Optional


class DFlashError(Exception):
    """Base class of every error this library raises on purpose."""


class GGUFFileError(DFlashError, ValueError):
    """A file is missing, unreadable, not a GGUF file or malformed; `field` names the part of
    the file at fault (a key, a tensor, a count) when there is one."""

    def __init__(self, path: str, reason: str, *, field: Optional[str] = None):
        self.path = path
        self.reason = reason
        self.field = field
        super().__init__(f"{path}: {reason}")


class IncompatibleModelError(DFlashError, ValueError):
    """A target or draft file cannot be used: names the file, the field, what was found and expected."""

    def __init__(self, path: str, field: str, found: Any, expected: str):
        self.path = path
        self.field = field
        self.found = found
        self.expected = expected
        super().__init__(f"{path}: {field} is {found!r}, expected {expected}")


class UnsupportedTargetError(IncompatibleModelError):
    """The target's architecture cannot hand its layer inputs to a DFlash draft."""


class LlamaCallError(DFlashError, RuntimeError):
    """A llama.cpp call returned an error code."""
