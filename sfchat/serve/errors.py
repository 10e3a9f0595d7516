"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the matching HTTP status."""
from __future__ import annotations

TYPES = {401: "authentication_error", 404: "not_found_error", 503: "service_unavailable"}  # other 4xx: invalid_request


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def type(self) -> str:
        return TYPES.get(self.status, "invalid_request_error" if 400 <= self.status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type(), "param": self.param, "code": self.code}}
