"""Domain errors. Each carries its HTTP status; api/errors.py maps them to the
OpenAI error shape, so use cases never know about Flask."""

from __future__ import annotations


class InferqError(Exception):
    status = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}


class InvalidRequest(InferqError):
    status = 400


class Unauthorized(InferqError):
    status = 401
    code = "invalid_api_key"


class NotFound(InferqError):
    status = 404
    code = "not_found"


class Conflict(InferqError):
    status = 409
    code = "conflict"

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message, param, code, headers={"x-should-retry": "false"})


class PayloadTooLarge(InferqError):
    status = 413
    code = "payload_too_large"


class Unavailable(InferqError):
    status = 503
    type = "server_error"
    code = "unavailable"

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after)})


class RequestTimeout(InferqError):
    status = 504
    type = "server_error"
    code = "request_timeout"
