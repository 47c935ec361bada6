"""Errors as JSON ``{"error": {"code", "message"}}`` with a fitting status."""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from runlane.errors import RunlaneError
from runlane.lanes import Refusal
from runlane.redaction import redact_text

# Every code the API answers with, and its HTTP status. Stable: clients
# branch on the code, never on the message.
STATUS_BY_CODE: dict[str, int] = {
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "validation_error": 422,
    "unknown_agent": 422,
    "payload_too_large": 413,
    "run_finished": 409,
    "not_retryable": 409,
    "database_unavailable": 503,
    **{str(code): 409 for code in Refusal},
}


class ApiError(RunlaneError):
    """An error raised by the HTTP layer itself."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def error_response(
    code: str,
    message: str,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    status = status or STATUS_BY_CODE.get(code, 400)
    merged = dict(headers or {})
    if status == 401:
        merged.setdefault("WWW-Authenticate", "Bearer")
    return JSONResponse(
        {"error": {"code": code, "message": redact_text(message)}},
        status_code=status,
        headers=merged or None,
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RunlaneError)
    async def runlane_error(_: Request, exc: RunlaneError) -> JSONResponse:
        return error_response(exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for error in exc.errors()[:5]:
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
            parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
        return error_response("validation_error", "; ".join(parts) or "invalid request")

    @app.exception_handler(psycopg.DataError)
    async def data_error(_: Request, exc: psycopg.DataError) -> JSONResponse:
        # A value PostgreSQL cannot store or compare: a NUL character or an
        # unpaired surrogate in a string that no check before caught.
        return error_response(
            "validation_error",
            "a value cannot be stored: text cannot hold NUL characters or unpaired surrogates",
        )

    @app.exception_handler(UnicodeError)
    async def unicode_error(_: Request, exc: UnicodeError) -> JSONResponse:
        return error_response("validation_error", "text must be valid Unicode")

    @app.exception_handler(psycopg.OperationalError)
    async def database_error(_: Request, exc: psycopg.OperationalError) -> JSONResponse:
        return error_response("database_unavailable", "the database is unavailable; retry")

    @app.exception_handler(PoolTimeout)
    async def pool_timeout(_: Request, exc: PoolTimeout) -> JSONResponse:
        return error_response("database_unavailable", "no database connection free; retry")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # The framework could not parse the body (bad bytes, numbers or
            # nesting it refuses): an invalid request like any other.
            return error_response("validation_error", f"invalid request body: {exc.detail}")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}.get(
            exc.status_code, "http_error"
        )
        return error_response(code, str(exc.detail), exc.status_code, headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (one route per method)."""
    methods: set[str] = set()
    for path_regex, route_methods in getattr(request.app.state, "route_methods", ()):
        if path_regex.match(request.url.path):
            methods.update(route_methods)
    return sorted(methods)
