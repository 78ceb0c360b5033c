"""One error registry: every failure leaves as {"error": {message, type, param, code}}."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from jobs.core.errors import InferqError

log = logging.getLogger("inferq.api")

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
               413: "payload_too_large"}
def error_body(e: InferqError) -> dict[str, Any]:
    return {"error": e.to_dict()}


def error_response(status: int, message: str, etype: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    resp = jsonify({"error": {"message": message, "type": etype, "param": param, "code": code}})
    resp.status_code = status
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def _unavailable(e: Exception) -> Response:
    log.warning("backend unavailable: %s", e)
    return error_response(503, "a backend is temporarily unavailable; retry shortly",
                          "server_error", code="unavailable", headers={"retry-after": "5"})


def register(app: Flask) -> None:
    import redis
    from sqlalchemy.exc import DBAPIError

    @app.errorhandler(InferqError)
    def _domain(e: InferqError) -> Response:
        (log.warning if e.status < 500 else log.error)("%s %s", e.status, e.message)
        return error_response(e.status, e.message, e.type, e.param, e.code, e.headers)

    @app.errorhandler(HTTPException)
    def _http(e: HTTPException) -> Response:
        status = e.code or 500
        return error_response(status, e.description or e.name, code=_HTTP_CODES.get(status))

    @app.errorhandler(DBAPIError)
    def _db(e: DBAPIError) -> Response:
        if e.connection_invalidated or "connect" in str(e.orig).lower():
            return _unavailable(e)
        log.exception("database error")
        return error_response(500, "internal error", "server_error")

    @app.errorhandler(redis.ConnectionError)
    def _redis(e: Exception) -> Response:
        return _unavailable(e)

    @app.errorhandler(Exception)
    def _any(e: Exception) -> Any:
        log.exception("unhandled error")
        return error_response(500, "internal error", "server_error")
