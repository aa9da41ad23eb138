"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["APIError", "error_body"]


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
               type: Optional[str] = None) -> dict[str, Any]:
    """The JSON body of an error reply; `type` defaults from the status as OpenAI's API does."""
    if type is None:
        type = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class APIError(Exception):
    """A request that cannot be served; the handlers turn it into `status` and an OpenAI error body
    (or an SSE `error` event once a stream has started)."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 type: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code, self.type)
