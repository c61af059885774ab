"""GraphQL bookings answered by the one statement (schema/compiled_writes.py) answer
what the plain path answers: the same bytes for every refusal (a bad token first, bad
variables, a duplicate resource, quota, a pool not visible, another tenant), the same
bytes for a booking (its id and time aside) and for a release, with aliases, fragments,
@include and __typename; and a remembered caller's booking or release is one statement.
Two apps on one database, one with the fast paths off (as test_reservation_parity)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY
from starlette.applications import Starlette

from app.config import Settings
from app.db.engine import Database
from app.iam.callers import revoke_token
from app.server import create_app
from tests.events.support import settle
from tests.rest.scene import Scene
from tests.support import Api, Fleet

pytestmark = [pytest.mark.parametrize("dialect", ["postgresql"]), pytest.mark.fast_path]

BOOK = """mutation Book($input: CreateReservationInput!) {
  createReservation(input: $input) {
    reservation { id poolId tenantId resources { resource amount } state createdAt endedAt } } }"""
BOOK_SHAPES = """mutation Book($input: CreateReservationInput!, $more: Boolean!) {
  __typename
  made: createReservation(input: $input) { __typename ...R }
  again: __typename }
fragment R on ReservationPayload {
  r: reservation { state createdAt key: id ... on Reservation { poolId }
    resources @include(if: $more) { amount __typename resource } __typename } }"""
BOOK_LITERAL = """mutation($t: String!) {
  createReservation(input: {tenantId: $t, poolId: "POOL", resources: [{resource: "gpu",
    amount: 1}]}) { reservation { id state tenantId createdAt } } }"""
RELEASE = """mutation Release($input: ReleaseReservationInput!) {
  releaseReservation(input: $input) {
    reservation { id poolId tenantId resources { resource amount } state createdAt endedAt }
    __typename } }"""


@pytest_asyncio.fixture(loop_scope="session")
async def app(database_url: str) -> AsyncIterator[Starlette]:
    """The fast app with its pollers quiet: a poll during a request would be counted."""
    quiet = Settings(
        database_url=database_url, event_poll_interval_s=3600, revocation_poll_interval_s=3600
    )
    application = create_app(quiet)
    async with application.router.lifespan_context(application):
        yield application


@pytest_asyncio.fixture(loop_scope="session")
async def api(app: Starlette) -> AsyncIterator[Api]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield Api(client)


@pytest_asyncio.fixture(loop_scope="session")
async def plain_api(database_url: str) -> AsyncIterator[Api]:
    application: Starlette = create_app(Settings(database_url=database_url, fast_path=False))
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield Api(c)


def _statements() -> float:
    found = REGISTRY.get_sample_value("bettercompute_db_statements_total", {"transport": "graphql"})
    return found or 0.0


async def _post(
    api: Api, token: str, query: str, variables: dict[str, Any], media: str | None = None
) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"}
    if media is not None:
        headers["accept"] = media
    body = {"query": query, "variables": variables}
    return await api.client.post("/graphql", json=body, headers=headers)


def _answer(response: httpx.Response) -> tuple[int, str, bytes]:
    return response.status_code, response.headers["content-type"], response.content


def _masked(response: httpx.Response, *values: str) -> tuple[int, str, bytes]:
    status, media, content = _answer(response)
    for i, value in enumerate(values):
        content = content.replace(value.encode(), f"<{i}>".encode())
    return status, media, content


def _reservation(response: httpx.Response) -> dict[str, Any]:
    data = response.json()["data"]
    payload = next(v for v in data.values() if isinstance(v, dict))
    return next(v for v in payload.values() if isinstance(v, dict))


async def test_bookings_match_the_plain_path_byte_for_byte(
    app: Starlette, api: Api, plain_api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta", role="operator")
    pool = str((await s.pool())["id"])
    hidden = str((await s.pool())["id"])
    await fleet.node(pool, 8)
    await s.offer(pool, "beta", {"gpu": 6, "nvme": 1})
    await settle(app)
    one = 1 if app.state.capacity.db.direct is not None else 2

    def booking(**resources: int) -> dict[str, Any]:
        rows = [{"resource": r, "amount": a} for r, a in resources.items()]
        return {"input": {"tenantId": "beta", "poolId": pool, "resources": rows}}

    cases: list[tuple[str, dict[str, Any]]] = [
        (BOOK, booking(gpu=1)),
        (BOOK_SHAPES, {**booking(gpu=1), "more": True}),
        (BOOK_SHAPES, {**booking(gpu=1), "more": False}),
        (BOOK_LITERAL.replace("POOL", pool), {"t": "beta"}),
    ]
    for media in (None, "application/graphql-response+json"):
        for query, variables in cases:
            learned = await _post(api, beta, query, variables, media)  # the plain path learns
            assert learned.status_code == 200 and "errors" not in learned.json(), learned.text
            first = _reservation(learned)
            release = {
                "input": {"tenantId": "beta", "reservationId": first.get("id") or first["key"]}
            }
            assert (await _post(api, beta, RELEASE, release)).status_code == 200
            before = _statements()
            fast = await _post(api, beta, query, variables, media)
            assert _statements() - before == one, (query, fast.text)
            plain = await _post(plain_api, beta, query, variables, media)
            assert plain.status_code == 200 and "errors" not in plain.json(), plain.text
            mine, theirs = _reservation(fast), _reservation(plain)
            fast_id = mine.get("id") or mine.get("key")
            plain_id = theirs.get("id") or theirs.get("key")
            assert _masked(fast, fast_id, mine["createdAt"]) == _masked(
                plain, plain_id, theirs["createdAt"]
            )
            for rsv in (fast_id, plain_id):  # each released on one path, again on the other
                release = {"input": {"tenantId": "beta", "reservationId": rsv}}
                before = _statements()
                ended = await _post(api, beta, RELEASE, release, media)
                if rsv == plain_id:  # the text is learned by now
                    assert _statements() - before == one, ended.text
                again = await _post(plain_api, beta, RELEASE, release, media)
                assert _reservation(ended)["state"] == "ENDED", ended.text
                assert _answer(ended) == _answer(again)
                twice = await _post(api, beta, RELEASE, release, media)
                assert _answer(twice) == _answer(again)
    assert (await s.capacity(pool))["gpu"]["booked"] == 0

    # Refusals: the plain path answers each, with its bytes; twice (a remembered caller).
    revoked = [await s.fleet.caller("beta", "operator") for _ in range(3)]
    refusals: list[tuple[str, dict[str, Any]]] = [
        (beta, booking(gpu=7)),  # quota
        (beta, booking(nvme=1)),  # capacity: no nvme in the rollup
        (beta, booking(gpu=1, nvme=1)),
        (beta, {"input": {**booking(gpu=1)["input"], "poolId": hidden}}),  # NOT_FOUND
        (beta, {"input": {**booking(gpu=1)["input"], "tenantId": s.owner}}),  # another tenant
        (beta, {"input": {**booking(gpu=1)["input"], "tenantId": "nobody"}}),
        (beta, {"input": {**booking(gpu=1)["input"], "resources": []}}),  # invalid input
        (beta, {"input": {"tenantId": "beta", "poolId": pool, "resources": "gpu"}}),
        (
            beta,
            {
                "input": {
                    **booking(gpu=1)["input"],
                    "resources": [
                        {"resource": "gpu", "amount": 1},
                        {"resource": "gpu", "amount": 2},
                    ],
                }
            },
        ),
        (beta, {}),  # a variable missing
        ("not-a-token", booking(gpu=1)),
        # Revoked once remembered: UNAUTHENTICATED is told before any other fault.
        (revoked[0], booking(gpu=7)),
        (revoked[1], {}),
        (revoked[2], {"input": {"tenantId": "beta", "poolId": pool, "resources": "gpu"}}),
    ]
    for token in revoked:
        assert (await _post(api, token, BOOK, booking(gpu=1))).status_code == 200
        assert await revoke_token(db, token) is True
    for media in (None, "application/graphql-response+json"):
        for token, variables in refusals:
            for _ in range(2):
                fast = await _post(api, token, BOOK, variables, media)
                plain = await _post(plain_api, token, BOOK, variables, media)
                assert "errors" in fast.json(), fast.text
                assert _answer(fast) == _answer(plain), variables
    missing = {"input": {"tenantId": "beta", "reservationId": "rsv_" + "0" * 26}}
    fast = await _post(api, beta, RELEASE, missing)
    assert _answer(fast) == _answer(await _post(plain_api, beta, RELEASE, missing))
    assert (await s.capacity(pool))["gpu"]["booked"] == 3  # the revoked callers' first
