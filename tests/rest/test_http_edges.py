"""HTTP-level edges every client meets: routes that do not exist, wrong methods, the
401 challenge, and the database errors that are and are not UNAVAILABLE."""

from __future__ import annotations

import sqlite3

from sqlalchemy.exc import OperationalError

from app.db.errors import to_domain_error
from tests.rest.pool_calls import MISSING_POOL, create_pool
from tests.support import Api, Fleet


async def test_unknown_route_is_not_found_in_the_error_shape(api: Api) -> None:
    response = await api.client.post("/api/compute/pools/explode", json={})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"


async def test_wrong_http_method_is_invalid_input_in_the_error_shape(api: Api) -> None:
    response = await api.client.get("/api/compute/pools/list")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "INVALID_INPUT"
    assert response.headers["allow"] == "POST"


async def test_unauthenticated_carries_the_bearer_challenge(api: Api) -> None:
    response = await api.post(None, "pools/list", {"tenantId": "acme"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


async def test_a_viewer_booking_in_a_pool_it_cannot_see_gets_not_found(
    api: Api, fleet: Fleet
) -> None:
    """CONTRACT 2: a pool the acting tenant cannot see is NOT_FOUND, whatever its role."""
    await fleet.tenant("acme")
    await fleet.tenant("globex")
    owner = await fleet.caller("acme", "admin")
    pool = await create_pool(api, owner, "acme", await fleet.site("acme"))
    viewer = await fleet.caller("globex", "viewer")
    for pool_id in (pool["id"], MISSING_POOL):
        body = {"tenantId": "globex", "poolId": pool_id, "resources": {"gpu": 1}}
        status, error = await api.fails(viewer, "reservations/create", body)
        assert (status, error["code"]) == (404, "NOT_FOUND")
    # The owner's own viewer sees the pool, so its missing permission is the answer.
    own_viewer = await fleet.caller("acme", "viewer")
    body = {"tenantId": "acme", "poolId": pool["id"], "resources": {"gpu": 1}}
    status, error = await api.fails(own_viewer, "reservations/create", body)
    assert (status, error["code"]) == (403, "PERMISSION_DENIED")


def test_sqlite_bugs_are_internal_and_a_locked_file_is_unavailable() -> None:
    def sqlite_error(message: str) -> OperationalError:
        return OperationalError("SELECT 1", {}, sqlite3.OperationalError(message))

    assert to_domain_error(sqlite_error("no such table: pools")).code == "INTERNAL"
    assert to_domain_error(sqlite_error("database is locked")).code == "UNAVAILABLE"
    assert to_domain_error(sqlite_error("unable to open database file")).code == "UNAVAILABLE"
