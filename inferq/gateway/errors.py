"""The gateway's error handlers: every failure becomes the OpenAI-shaped body of
``inferq.openai.errors`` (which says what status each failure gets), as a JSON response."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferq.errors import InferqError
from inferq.openai.errors import INVALID, ApiError, from_inferq, unavailable, validation_error


def error_response(error: ApiError) -> JSONResponse:
    """``error`` as the JSON response a client gets."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def install(app: FastAPI, retry_after_s: int) -> None:
    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def on_inferq_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, InferqError)
        return error_response(from_inferq(exc, retry_after_s=retry_after_s))

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(exc.errors()))

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400:
            # FastAPI's answer to a body that is not JSON (or not UTF-8): name the body.
            return error_response(ApiError(400, INVALID, "invalid_json", f"body: {exc.detail}: "
                                     "send a JSON object", param="body"))
        kind = {401: "authentication_error", 404: "not_found_error"}.get(exc.status_code, INVALID)
        code = {401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error")
        return error_response(ApiError(exc.status_code, kind, code, str(exc.detail),
                                 headers=exc.headers))

    async def on_redis_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(unavailable(exc))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(InferqError, on_inferq_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RedisError, on_redis_error)
