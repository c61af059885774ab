"""A pool write from a caller the process remembers (app/http/admission.py) is not looked
up first: its token and binding are checked first in the write's own transaction
(Capacity.token_checked). Once they no longer hold, the write is answered as the plain
path answers it now, and nothing is written under the old binding."""

from __future__ import annotations

from typing import Any

from app.db.uow import UnitOfWork
from app.iam.callers import authenticate, rebind_caller, revoke_token
from tests.support import Api, Fleet


async def _scene(api: Api, fleet: Fleet) -> tuple[str, str]:
    await fleet.tenant("acme")
    site = await fleet.site("acme")
    token = await fleet.caller("acme", "admin")
    made = await api.ok(
        token, "pools/create", {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    )
    return token, made["pool"]["id"]


def _update(pool_id: str, model: str) -> dict[str, Any]:
    return {"tenantId": "acme", "poolId": pool_id, "gpuModel": model}


async def _version(api: Api, token: str, pool_id: str) -> int:
    got = await api.ok(token, "pools/get", {"tenantId": "acme", "poolId": pool_id})
    version: int = got["pool"]["version"]
    return version


async def test_a_revoked_token_writes_nothing(api: Api, fleet: Fleet) -> None:
    token, pool_id = await _scene(api, fleet)
    await api.ok(token, "pools/update", _update(pool_id, "H100"))  # remembered from here
    reader = await fleet.caller("acme", "viewer")
    before = await _version(api, reader, pool_id)
    await revoke_token(fleet.db, token)
    status, body = await api.fails(token, "pools/update", _update(pool_id, "H200"))
    assert (status, body["code"]) == (401, "UNAUTHENTICATED"), body
    assert await _version(api, reader, pool_id) == before


async def test_a_rebound_caller_is_decided_as_it_is_now(api: Api, fleet: Fleet) -> None:
    token, pool_id = await _scene(api, fleet)
    await api.ok(token, "pools/update", _update(pool_id, "H100"))
    principal = await authenticate(fleet.db, f"Bearer {token}")
    async with UnitOfWork(fleet.db) as uow:
        await rebind_caller(uow, principal.caller_id, "viewer")
    status, body = await api.fails(token, "pools/update", _update(pool_id, "H200"))
    assert (status, body["code"]) == (403, "PERMISSION_DENIED"), body
    async with UnitOfWork(fleet.db) as uow:
        await rebind_caller(uow, principal.caller_id, "admin", {"gpuModel": "H100"})
    status, body = await api.fails(token, "pools/update", _update(pool_id, "H200"))
    assert (status, body["code"]) == (403, "PERMISSION_DENIED"), body
    async with UnitOfWork(fleet.db) as uow:
        await rebind_caller(uow, principal.caller_id, "admin")
    assert (await api.ok(token, "pools/update", _update(pool_id, "H200")))["pool"]["version"]


async def test_a_refusal_of_the_old_binding_is_not_the_answer(api: Api, fleet: Fleet) -> None:
    """The check runs before the write commits, and before a refusal is answered: a caller
    remembered as a viewer and rebound as an admin since is not refused as the viewer it
    was (create decides on the tenant before any statement), but checked, looked up and
    let write. An update is refused alike until the rebinding (its locking read carries
    the check, looked at before the pool's decision)."""
    token, pool_id = await _scene(api, fleet)
    site = await fleet.site("acme")
    create = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    principal = await authenticate(fleet.db, f"Bearer {token}")
    async with UnitOfWork(fleet.db) as uow:
        await rebind_caller(uow, principal.caller_id, "viewer")
    for path, body in (("pools/create", create), ("pools/update", _update(pool_id, "H200"))):
        await _version(api, token, pool_id)  # a read: remembered as a viewer from here
        status, refused = await api.fails(token, path, body)
        assert (status, refused["code"]) == (403, "PERMISSION_DENIED"), refused
    async with UnitOfWork(fleet.db) as uow:
        await rebind_caller(uow, principal.caller_id, "viewer")
    await _version(api, token, pool_id)
    async with UnitOfWork(fleet.db) as uow:
        await rebind_caller(uow, principal.caller_id, "admin")
    made = await api.ok(token, "pools/create", create)
    assert made["pool"]["siteId"] == site
    await _version(api, token, pool_id)  # remembered as the admin it is
    async with UnitOfWork(fleet.db) as uow:
        await rebind_caller(uow, principal.caller_id, "viewer")
    await _version(api, token, pool_id)  # forgotten (rebound), remembered as a viewer
    async with UnitOfWork(fleet.db) as uow:
        await rebind_caller(uow, principal.caller_id, "admin")
    updated = await api.ok(token, "pools/update", _update(pool_id, "H200"))
    assert updated["pool"]["gpuModel"] == "H200"
