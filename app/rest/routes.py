"""REST shims: `POST /api/compute/<group>/<method>`, one route per catalog row."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.capacity.inputs import (
    CreateReservationInput,
    MethodInput,
    ReleaseReservationInput,
    parse_input,
)
from app.capacity.json_reads import CompiledRead
from app.capacity.service import CallerChanged, Capacity
from app.capacity.shapes import Shape
from app.capacity.views import ImpactView, ReservationView
from app.catalog import (
    ARCHIVE_POOL,
    CREATE_POOL,
    CREATE_RESERVATION,
    LABEL_POOL,
    METHODS,
    OFFER_POOL,
    POOL_METHODS,
    RELEASE_RESERVATION,
    UNOFFER_POOL,
    UPDATE_POOL,
    Method,
)
from app.errors import InvalidInput, Unavailable
from app.http.admission import Admission, Admitted
from app.http.responses import JSONResponse
from app.iam.callers import authenticate
from app.iam.principal import Principal
from app.metrics import COMPILED_READS
from app.rest.errors import error_response
from app.rest.openapi import openapi_document
from app.rest.render import (
    ACCESS_SHAPE,
    CAPACITY_SHAPE,
    GET_SHAPE,
    LENDING_SHAPE,
    LIST_SHAPE,
    RESERVATIONS_SHAPE,
    render,
)

log = logging.getLogger(__name__)
# The reads one compiled statement may answer (app/capacity/json_reads.py), by path.
COMPILED_SHAPES: dict[str, Shape] = {
    "/api/compute/pools/get": GET_SHAPE,
    "/api/compute/pools/list": LIST_SHAPE,
    "/api/compute/pools/capacity": CAPACITY_SHAPE,
    "/api/compute/pools/lending": LENDING_SHAPE,
    # `explain`: the facts in one statement, decided by explain.explanation once parsed.
    "/api/compute/pools/explain": ACCESS_SHAPE,
    "/api/compute/reservations/list": RESERVATIONS_SHAPE,
}
POOL_WRITES = (CREATE_POOL, OFFER_POOL, UNOFFER_POOL, UPDATE_POOL, ARCHIVE_POOL, LABEL_POOL)


def _endpoint(method: Method) -> Any:
    # `get`, `list`, `capacity`, `lending`, `explain` and `reservations/list` may be
    # answered by one compiled statement that also checks the token, so a caller this
    # process has seen is not looked up first (app/http/admission.py).
    shape = COMPILED_SHAPES.get(method.path)
    compiled: dict[str, CompiledRead | None] = {}  # per dialect, built on first use
    # A booking or release may be one statement that checks the token too
    # (app/capacity/booking.py, booking_release.py).
    books = method is CREATE_RESERVATION or method is RELEASE_RESERVATION
    # A pool write from a caller this process remembers checks the token in its own
    # transaction (Capacity.token_checked), so it is not looked up first either.
    writes_pool = method in POOL_WRITES

    async def endpoint(request: Request) -> Response:
        capacity: Capacity = request.app.state.capacity
        admission: Admission = request.app.state.admission
        authorization = request.headers.get("authorization")
        try:
            read = None if shape is None else _compiled(capacity, shape, compiled)
            fast = request.app.state.settings.compiled_reads and (
                (read is not None and capacity.compiles_reads)
                or ((books or writes_pool) and capacity.compiles_writes)
            )
            admitted = await admission.admit(
                request,
                authorization,
                lambda: authenticate(capacity.db, authorization),
                compiled=fast,
            )
            if read is not None and admitted.token_hash is not None:
                await admission.read_body(request, admitted)  # BETTERCOMPUTE_COMPILED_READS
                if admitted.body_error is not None:
                    raise admitted.body_error
                assert admitted.body is not None
                answer = await _compiled_answer(
                    capacity, admitted.principal, admitted.token_hash, read, admitted.body
                )
                if answer is not None:
                    return JSONResponse(answer)
                if admitted.remembered:  # not answered: authenticate now, as usual
                    admission.forget(admitted)
                    await admitted.confirm()
            try:
                inp = await _input(request, method)
            except Exception:
                if admitted.remembered:  # a bad token is told before a bad body
                    admission.forget(admitted)
                    await admitted.confirm()
                raise
            if books and fast:
                assert isinstance(inp, CreateReservationInput | ReleaseReservationInput)
                booked = await _booked(capacity, admission, admitted, inp)
                if booked is not None:
                    return JSONResponse({method.result_key: render(booked)})
            if writes_pool and admitted.remembered and admitted.token_hash is not None:
                result = await _remembered_write(capacity, admission, admitted, method, inp)
            else:
                result = await method.call(capacity, admitted.principal, inp)
            # A dry run (unoffer, archive) answers its impact in place of the result.
            key = "impact" if isinstance(result, ImpactView) else method.result_key
            return JSONResponse({key: render(result)})
        except Exception as exc:
            return error_response(exc)

    endpoint.__name__ = f"{method.group}_{method.name}"
    return endpoint


def _compiled(
    capacity: Capacity, shape: Shape, built: dict[str, CompiledRead | None]
) -> CompiledRead | None:
    """The method's compiled read for the store's dialect, built once per dialect."""
    dialect = capacity.db.dialect
    if dialect not in built:
        built[dialect] = capacity.compile_read(shape)
    return built[dialect]


async def _compiled_answer(
    capacity: Capacity, principal: Principal, hashed: str, read: CompiledRead, raw: bytes
) -> Any:
    """The compiled read's answer, or None for the plain path (which reports any error)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    try:
        answer = await capacity.read_json(principal, hashed, read, body)
    except Unavailable:  # the database is out of reach: the plain path would wait again
        raise
    except Exception:  # the plain path meets the same fault and reports it
        log.debug("compiled read failed; answering on the plain path", exc_info=True)
        answer = None
    COMPILED_READS.labels("declined" if answer is None else "answered").inc()
    return answer


async def _input(request: Request, method: Method) -> MethodInput:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        raise InvalidInput("the request body must be a JSON object") from None
    return parse_input(method.input, body)


async def _remembered_write(
    capacity: Capacity, admission: Admission, admitted: Admitted, method: Method, inp: MethodInput
) -> Any:
    """A pool write of a remembered caller, its token checked first in the write's own
    transaction. When it no longer holds (CallerChanged: nothing was written), or the
    write fails, the caller is looked up (UNAUTHENTICATED first when its token is no longer
    good, as on the plain path); a changed caller's write then runs again as it is now."""
    assert admitted.token_hash is not None
    try:
        with capacity.token_checked(admitted.token_hash):
            return await method.call(capacity, admitted.principal, inp)
    except CallerChanged:
        admission.forget(admitted)
        await admitted.confirm()
        return await method.call(capacity, admitted.principal, inp)
    except Exception:
        admission.forget(admitted)
        await admitted.confirm()
        raise


async def _booked(
    capacity: Capacity,
    admission: Admission,
    admitted: Admitted,
    inp: CreateReservationInput | ReleaseReservationInput,
) -> ReservationView | None:
    """The one-statement booking's (or release's) answer, or None for the plain path,
    with a remembered caller then looked up (UNAUTHENTICATED when its token is no longer
    good). A refusal the statement is sure of (RESOURCE_EXHAUSTED, INVALID_STATE) is
    raised from here."""
    if isinstance(inp, ReleaseReservationInput):
        booked = await capacity.release(admitted.principal, inp, admitted.token_hash)
    else:
        booked = await capacity.book(admitted.principal, inp, admitted.token_hash)
    if booked is None and admitted.remembered:
        admission.forget(admitted)
        await admitted.confirm()
    return booked


async def catalog(_: Request) -> Response:
    return JSONResponse({"methods": [m.describe() for m in POOL_METHODS]})


async def openapi(_: Request) -> Response:
    return JSONResponse(openapi_document())


def routes() -> list[BaseRoute]:
    return [
        *(Route(m.path, _endpoint(m), methods=["POST"]) for m in METHODS),
        Route("/api/compute/catalog", catalog, methods=["GET"]),
        Route("/api/openapi.json", openapi, methods=["GET"]),
    ]
