"""Domain errors. Each carries its HTTP status; api/errors.py maps them to the
OpenAI error shape, so use cases never know about Flask."""

from __future__ import annotations

from typing import Any

import redis
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as StoreConnectionError
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import InterfaceError, OperationalError


class InferqError(Exception):
    """A failure the client is told of: its HTTP ``status`` and the OpenAI error's
    ``type`` and ``code``, which a subclass states as class keywords
    (``class NotFound(InferqError, status=404, code="not_found")``)."""

    status = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init_subclass__(cls, status: int | None = None, type: str | None = None,
                          code: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if type is not None:
            cls.type = type
        if code is not None:
            cls.code = code

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI error object (the value of a response's ``"error"``)."""
        return {"message": self.message, "type": self.type, "param": self.param,
                "code": self.code}


class InvalidRequest(InferqError, status=400):
    """A request this service cannot take as it is: the client changes it."""


class Unauthorized(InferqError, status=401, code="invalid_api_key"):
    """No API key, or one this service does not know."""


class PermissionDenied(InferqError, status=403, code="insufficient_permissions"):
    """A known key that may not do this (a project key on the Admin API)."""


class NotFound(InferqError, status=404, code="not_found"):
    """No such object for this tenant (another tenant's ids included: 404, never 403)."""


# The code of every reference to a model the registry does not hold (a 404 for a path
# naming it, a 400 for a request body's ``model``).
MODEL_NOT_FOUND = "model_not_found"


class ModelNotFound(NotFound, code=MODEL_NOT_FOUND):
    """A model the registry does not hold."""


class Conflict(InferqError, status=409, code="conflict"):
    """The object is not in a state that allows this; retrying the same will not help."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message, param, code, headers={"x-should-retry": "false"})


class PayloadTooLarge(InferqError, status=413, code="payload_too_large"):
    """A body or a single request larger than a limit of this service."""


class Unavailable(InferqError, status=503, type="server_error", code="unavailable"):
    """Nothing can serve the request right now; the client retries after ``retry-after``."""

    def __init__(self, message: str, retry_after: int = 5) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after)})


class RequestTimeout(InferqError, status=504, type="server_error", code="request_timeout"):
    """The answer did not come within the time this service allows."""


class ModelNotLoaded(Unavailable, code="model_not_loaded"):
    """A request for a registered model that no worker serves now (a worker answers
    only for the models it holds)."""

    def __init__(self, model: str, retry_after: int = 5) -> None:
        super().__init__(f"no worker serves model {model!r} right now; retry later, or ask "
                         "for a model that is served", retry_after)
        self.param = "model"


class ModelLoading(Unavailable, code="model_loading"):
    """A realtime request whose version was still being loaded when its wait for a
    worker ended: taken back, the client retries once the load is done."""

    def __init__(self, ref: str, waited_s: float, retry_after: int = 5) -> None:
        super().__init__(f"{ref} is being loaded on a worker (a cold start); it was not "
                         f"ready within {waited_s:.0f} s: retry in a few seconds",
                         retry_after)
        self.param = "model"


def shown(value: Any, limit: int = 80) -> str:
    """Client-sent data for a message: cut to ``limit`` characters and escaped as
    ``repr`` escapes (no NUL or control character reaches a log or the database); a
    string is quoted, anything else is shown as ``str`` would (``7``, ``['a']``)."""
    text = value if isinstance(value, str) else str(value)
    quoted = repr(text if len(text) <= limit else text[:limit] + "...")
    return quoted if isinstance(value, str) else quoted[1:-1]


# A backend that did not answer this time (PostgreSQL restarting, a broker reconnect,
# the object store unreachable): trying again may succeed. Celery retries tasks that
# raise one of these; ``transient`` also knows the object store's 5xx and 429 answers.
TRANSIENT: tuple[type[BaseException], ...] = (
    OperationalError, InterfaceError, redis.ConnectionError, redis.TimeoutError, BrokerError,
    ConnectionError, TimeoutError, StoreConnectionError, HTTPClientError)


def transient(e: BaseException) -> bool:
    """Whether trying again may succeed (a backend briefly unreachable), as opposed to
    a fault of the batch's data or of this code, which trying again would only repeat."""
    if isinstance(e, TRANSIENT):
        return True
    if isinstance(e, ClientError):
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return bool(status >= 500 or status == 429)
    return False
