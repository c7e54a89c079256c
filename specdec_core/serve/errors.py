"""Errors the API answers with, in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations


class ApiError(Exception):
    """A request the API refuses: an HTTP status and one line saying what to change."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error") -> None:
        # Messages quote what the client sent; a lone surrogate in it could not be encoded as UTF-8.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_field(param: str, message: str) -> ApiError:
    """400 for one field of the request; the message names the field and what it takes."""
    return ApiError(400, message, param=param, code="invalid_value")
