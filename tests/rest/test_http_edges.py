"""HTTP-level edges every client meets: routes that do not exist, wrong methods, the
401 challenge, the body limit, and the database errors that are and are not UNAVAILABLE."""

from __future__ import annotations

import sqlite3

import httpx
from sqlalchemy.exc import OperationalError

from app.config import Settings
from app.db.errors import to_domain_error
from app.server import create_app
from tests.body_stream import CHUNK, ChunkedBody
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
    assert to_domain_error(sqlite_error("locking protocol")).code == "UNAVAILABLE"


LIMIT = 1_048_576  # the default BETTERCOMPUTE_MAX_BODY_BYTES


async def test_a_body_over_the_limit_is_refused_with_413_and_read_no_further(
    api: Api, fleet: Fleet
) -> None:
    """50 MB sent chunked (no Content-Length): refused once the bytes received pass the
    limit, with no more than a chunk past it pulled from the client. Before, the whole
    body was read and parsed."""
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    body = ChunkedBody(50 << 20, prefix=b'{"tenantId": "acme", "pad": "')
    response = await api.client.post(
        "/api/compute/pools/list",
        content=body,
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    assert response.status_code == 413
    assert response.json()["error"] == {
        "code": "RESOURCE_EXHAUSTED",
        "message": f"the request body is over the limit of {LIMIT} bytes",
        "details": {"limit": "body", "maxBytes": LIMIT},
    }
    assert body.pulled <= LIMIT + CHUNK


async def test_a_declared_length_over_the_limit_is_refused_before_a_byte_is_read(
    api: Api, fleet: Fleet
) -> None:
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    body = ChunkedBody(LIMIT + 1)
    response = await api.client.post(
        "/api/compute/pools/list",
        content=body,
        headers={"authorization": f"Bearer {token}", "content-length": str(LIMIT + 1)},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "RESOURCE_EXHAUSTED"
    assert body.pulled == 0


async def test_a_caller_without_a_token_is_refused_before_its_body_is_read(api: Api) -> None:
    body = ChunkedBody(50 << 20)
    response = await api.client.post("/api/compute/pools/list", content=body)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"
    assert body.pulled == 0


async def test_the_body_limit_is_configurable_and_a_body_at_it_is_read(
    database_url: str, fleet: Fleet
) -> None:
    await fleet.tenant("acme")
    token = await fleet.caller("acme", "admin")
    app = create_app(Settings(database_url=database_url, max_body_bytes=100))
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    at_limit = b'{"tenantId": "acme"}'.ljust(100)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        read = await client.post("/api/compute/pools/list", content=at_limit, headers=headers)
        assert read.status_code == 200, read.text
        over = await client.post(
            "/api/compute/pools/list", content=at_limit + b" ", headers=headers
        )
        assert over.status_code == 413
        assert over.json()["error"]["details"] == {"limit": "body", "maxBytes": 100}
