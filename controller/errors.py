"""RFC 9457 problem details: every API error is `application/problem+json` naming the offending field."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)
PROBLEM = "application/problem+json"
TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
          409: "Conflict", 413: "Content Too Large", 422: "Unprocessable Content", 429: "Too Many Requests",
          500: "Internal Server Error", 503: "Service Unavailable"}


class Problem(BaseModel):
    """RFC 9457 problem details, as every error is answered."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    field: str | None = None
    errors: list[dict[str, Any]] | None = None


def _declared(what: str) -> dict[str, Any]:
    return {"description": what, "model": Problem,
            "content": {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


# declared on every /v1 route, so that clients generated from the OpenAPI document know the error shape
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _declared("no token, or a wrong one"),
    403: _declared("the credential may not do this"),
    404: _declared("no such resource (or not the caller's)"),
    409: _declared("conflict with existing state, or a quota exceeded"),
    413: _declared("the request body is too large"),
    422: _declared("invalid input; `field` names it"),
    429: _declared("rate limited; see Retry-After"),
}


class ApiError(Exception):
    def __init__(self, status: int, detail: str, field: str | None = None, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field, self.extra = status, detail, field, extra
        self.headers = headers


def invalid(field: str, detail: str) -> ApiError:
    return ApiError(422, f"{field}: {detail}", field)


def conflict(field: str | None, detail: str) -> ApiError:
    return ApiError(409, detail, field)


def not_found(kind: str, ident: str, field: str | None = None) -> ApiError:
    return ApiError(404, f"{kind} {ident} not found", field)


def problem(status: int, detail: str, field: str | None = None, errors: list | None = None,
            headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {"type": "about:blank", "title": TITLES.get(status, "Error"), "status": status,
                            "detail": detail}
    if field:
        body["field"] = field
    if errors:
        body["errors"] = errors
    body.update(extra)
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def _loc(loc: tuple | list) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        errors = [{"field": exc.field, "message": exc.detail}] if exc.field else None
        return problem(exc.status, exc.detail, exc.field, errors, headers=exc.headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for e in exc.errors():
            field = _loc(e.get("loc", ()))
            msg = e.get("msg", "invalid")
            if e.get("type") == "extra_forbidden":
                msg = "unknown field"
            errors.append({"field": field, "message": msg})
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem(422, detail, errors[0]["field"] if errors else None, errors)

    @app.exception_handler(ValidationError)
    async def _inner_validation(_req: Request, exc: ValidationError) -> JSONResponse:
        # a model a handler builds from the caller's values (a port for a load balancer's VIP, say): still the
        # caller's input, so 422 naming the field
        return await _validation(_req, RequestValidationError(exc.errors()))

    from sqlalchemy.exc import DataError, IntegrityError, OperationalError

    @app.exception_handler(IntegrityError)
    async def _integrity(_req: Request, exc: IntegrityError) -> JSONResponse:
        # a constraint caught what the handler's own checks did not (a race): the transaction was rolled back.
        # The database's own words stay in the log: they name tables and columns, not the API's fields
        log.warning("constraint refused a write the handler let through: %s", str(exc.orig).splitlines()[0])
        return problem(409, "conflict with a concurrent change; nothing was changed: read the resources again "
                            "and retry")

    @app.exception_handler(DataError)
    async def _data(_req: Request, exc: DataError) -> JSONResponse:
        log.warning("the database refused a value the API let through: %s", str(exc.orig).splitlines()[0])
        return problem(422, "a value is out of the range the API accepts; nothing was changed")

    @app.exception_handler(OperationalError)
    async def _operational(_req: Request, exc: OperationalError) -> JSONResponse:
        log.warning("database unavailable or busy: %s", str(exc.orig).splitlines()[0])
        return problem(503, "the database is unavailable or busy; nothing was changed: retry shortly",
                       headers={"Retry-After": "1"})

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, str(exc.detail))
