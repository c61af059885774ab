"""The one-statement booking and release (PostgreSQL) answer what the plain path answers:
the same bytes for every refusal, the same reservation for every success (its id and
times aside). Two apps on one database, one with the fast paths off."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from starlette.applications import Starlette

from app.config import Settings
from app.server import create_app
from tests.rest.scene import Scene
from tests.support import Api, Fleet

pytestmark = [pytest.mark.parametrize("dialect", ["postgresql"]), pytest.mark.fast_path]


@pytest_asyncio.fixture(loop_scope="session")
async def plain_api(database_url: str) -> AsyncIterator[Api]:
    application: Starlette = create_app(Settings(database_url=database_url, fast_path=False))
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            yield Api(c)


def _without_times(answer: dict[str, Any]) -> dict[str, Any]:
    rsv = dict(answer["reservation"])
    for key in ("id", "createdAt", "endedAt"):
        rsv[key] = rsv[key] is None
    return rsv


async def test_refusals_and_bookings_match_the_plain_path(
    api: Api, plain_api: Api, fleet: Fleet
) -> None:
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta", role="operator")
    viewer = await s.guest("gamma", role="viewer")
    narrowed = await s.fleet.caller("beta", "operator", region="nowhere")
    pool = str((await s.pool())["id"])
    archived = str((await s.pool())["id"])
    hidden = str((await s.pool())["id"])
    await fleet.node(pool, 4)
    await fleet.node(archived, 4)
    await s.offer(pool, "beta", {"gpu": 2, "nvme": 1})
    await s.offer(pool, "gamma", {"gpu": 2})
    await s.offer(archived, "beta", {"gpu": 2})
    await s.archive(archived)

    def body(tenant: str, pool_id: str, **resources: int) -> dict[str, Any]:
        return {"tenantId": tenant, "poolId": pool_id, "resources": resources}

    refusals = [
        (beta, body("beta", pool, gpu=3)),  # quota
        (beta, body("beta", pool, nvme=1)),  # capacity: no nvme in the rollup
        (beta, body("beta", pool, gpu=1, nvme=1)),  # the first of two
        (s.token, body(s.owner, pool, gpu=5)),  # capacity
        (beta, body("beta", hidden, gpu=1)),  # not offered: NOT_FOUND
        (beta, body("beta", archived, gpu=1)),  # archived, guest: NOT_FOUND
        (s.token, body(s.owner, archived, gpu=1)),  # archived, owner: INVALID_STATE
        (beta, body("gamma", pool, gpu=1)),  # another tenant: PERMISSION_DENIED
        (viewer, body("gamma", pool, gpu=1)),  # a role without the permission
        (narrowed, body("beta", pool, gpu=1)),  # a narrowed binding outside it
        (beta, body("nobody", pool, gpu=1)),
        ("not-a-token", body("beta", pool, gpu=1)),
        (beta, {"tenantId": "beta", "poolId": pool}),  # invalid input
    ]
    for token, request in refusals:
        for _ in range(2):  # the second time, a remembered caller
            fast = await api.post(token, "reservations/create", request)
            plain = await plain_api.post(token, "reservations/create", request)
            assert fast.status_code != 200, fast.text
            assert (fast.status_code, fast.content) == (plain.status_code, plain.content)

    booked = await api.ok(beta, "reservations/create", body("beta", pool, gpu=1))
    again = await plain_api.ok(beta, "reservations/create", body("beta", pool, gpu=1))
    assert _without_times(booked) == _without_times(again)
    for answer in (booked, again):
        rsv = answer["reservation"]
        release = {"tenantId": "beta", "reservationId": rsv["id"]}
        ended = await api.ok(beta, "reservations/release", release)
        assert ended == await plain_api.ok(beta, "reservations/release", release)
        assert ended["reservation"]["createdAt"] == rsv["createdAt"]
        assert ended["reservation"]["state"] == "ended"
    missing = {"tenantId": "beta", "reservationId": "rsv_" + "0" * 26}
    fast = await api.post(beta, "reservations/release", missing)
    plain = await plain_api.post(beta, "reservations/release", missing)
    assert (fast.status_code, fast.content) == (plain.status_code, plain.content)
    assert fast.status_code == 404, fast.text
    assert (await s.capacity(pool))["gpu"]["booked"] == 0
