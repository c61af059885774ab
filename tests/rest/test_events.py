"""The outbox rows each change writes (CONTRACT section 7), read from `events` and
`event_audience`; calls that roll back or change nothing write none."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import pytest

from app.db.engine import Database
from tests.rest.scene import Scene, StoredEvent, events
from tests.support import Api, Fleet


def _envelope(event: StoredEvent, type_: str, pool_id: str) -> None:
    assert (event.type, event.pool_id, event.tenant_id) == (type_, pool_id, "acme")
    assert isinstance(event.occurred_at, datetime)
    assert event.occurred_at.utcoffset() == timedelta(0)


async def test_each_change_writes_one_event_with_its_audience(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """Types: pool.created, pool.offered, pool.unoffered, pool.updated, pool.archived. Visible
    to: the owner, plus for offered/unoffered the tenant concerned, for updated every offered
    tenant, for archived the tenants in data.removedTenantIds."""
    s = await Scene.start(api, fleet)
    for tenant in ("beta", "gamma", "delta"):
        await s.guest(tenant)
    await s.guest("beta-dev", parent="beta")
    pool = await s.pool(gpuModel="H100")
    pool_id = pool["id"]
    await s.offer(pool_id, "beta", {"gpu": 2}, includeDescendants=True, priority=5)
    await s.offer(pool_id, "gamma", {"gpu": 1})
    await s.offer(pool_id, "delta", {"gpu": 1})
    assert await s.unoffer(pool_id, "delta")
    await api.ok(s.token, "pools/update", s.body(pool_id, gpuModel="A100"))
    await s.archive(pool_id)

    written = await events(db)
    assert [e.seq for e in written] == sorted({e.seq for e in written})  # increasing, unique
    for event in written:
        _envelope(event, event.type, pool_id)
    assert [(e.type, e.audience) for e in written] == [
        ("pool.created", {"acme"}),
        ("pool.offered", {"acme", "beta"}),  # not beta-dev: the offer is beta's
        ("pool.offered", {"acme", "gamma"}),
        ("pool.offered", {"acme", "delta"}),
        ("pool.unoffered", {"acme", "delta"}),
        ("pool.updated", {"acme", "beta", "gamma"}),
        ("pool.archived", {"acme", "beta", "gamma"}),
    ]
    created, offered = written[0], written[1]
    assert created.data["siteId"] == s.site and created.data["version"] == 1
    assert offered.data == {
        "toTenantId": "beta",
        "quota": {"gpu": 2},
        "includeDescendants": True,
        "priority": 5,
        # CONTRACT section 10: the pool's version and what changed (tests/rest/
        # test_event_changes.py follows a client patching from them).
        "version": 2,
        "changes": [
            {
                "path": "/offers/beta",
                "before": None,
                "after": {"includeDescendants": True, "priority": 5, "quota": {"gpu": 2}},
            }
        ],
    }
    assert written[4].data["toTenantId"] == "delta"
    assert written[5].data["version"] == 6  # each offer and unoffer moved it too
    assert written[6].data["removedTenantIds"] == ["beta", "gamma"]


async def test_an_offer_to_the_owner_is_seen_by_the_owner_only(
    api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    await s.offer(pool["id"], "acme", {"gpu": 4})
    offered = (await events(db))[-1]
    _envelope(offered, "pool.offered", pool["id"])
    assert offered.audience == {"acme"}


# -- calls that write nothing ----------------------------------------------------------------

Call = Callable[[Scene, str], Awaitable[None]]


async def _offer_shared_gpu_pool(s: Scene, _: str) -> None:
    pool = await s.pool(sharing="timeslice")
    before = len(await events(s.fleet.db))
    body = s.body(pool["id"], toTenantId="beta", quota={"gpu.slot": 1})
    assert (await s.api.fails(s.token, "pools/offer", body))[1]["code"] == "INVALID_STATE"
    assert len(await events(s.fleet.db)) == before


async def _offer_to_an_unknown_tenant(s: Scene, pool_id: str) -> None:
    # Refused for a fleet admin only: anyone else is answered as for a real tenant
    # (test_offer_tenant_oracle.py).
    fleet_admin = await s.fleet.caller("fleet", "fleet-admin")
    body = s.body(pool_id, toTenantId="nobody", quota={"gpu": 1})
    assert (await s.api.fails(fleet_admin, "pools/offer", body))[1]["code"] == "NOT_FOUND"


async def _offer_without_share(s: Scene, pool_id: str) -> None:
    operator = await s.fleet.caller("acme", "operator")
    body = s.body(pool_id, toTenantId="beta", quota={"gpu": 1})
    assert (await s.api.fails(operator, "pools/offer", body))[1]["code"] == "PERMISSION_DENIED"


async def _update_with_a_bad_policy(s: Scene, pool_id: str) -> None:
    body = s.body(pool_id, policy={"hugepages": {"3Mi": 1}})
    assert (await s.api.fails(s.token, "pools/update", body))[1]["code"] == "INVALID_INPUT"


async def _single_tenant_while_shared(s: Scene, pool_id: str) -> None:
    await s.guest("gamma")
    await s.offer(pool_id, "gamma", {"gpu": 1})
    before = len(await events(s.fleet.db))
    body = s.body(pool_id, policy={"singleTenant": True})
    assert (await s.api.fails(s.token, "pools/update", body))[1]["code"] == "INVALID_STATE"
    assert len(await events(s.fleet.db)) == before


async def _unoffer_the_owner(s: Scene, pool_id: str) -> None:
    body = s.body(pool_id, toTenantId="acme")
    assert (await s.api.fails(s.token, "pools/unoffer", body))[1]["code"] == "INVALID_INPUT"


async def _unoffer_twice(s: Scene, pool_id: str) -> None:
    assert await s.unoffer(pool_id, "beta")
    before = len(await events(s.fleet.db))
    assert not await s.unoffer(pool_id, "beta")
    assert len(await events(s.fleet.db)) == before


async def _archive_twice(s: Scene, pool_id: str) -> None:
    await s.archive(pool_id)
    before = len(await events(s.fleet.db))
    await s.archive(pool_id)
    assert len(await events(s.fleet.db)) == before


async def _retry_an_idempotent_create(s: Scene, _: str) -> None:
    first = await s.pool(idempotencyKey="pool-a")
    before = len(await events(s.fleet.db))
    assert (await s.pool(idempotencyKey="pool-a"))["id"] == first["id"]
    body = {"tenantId": "acme", "siteId": s.site, "class": "vps-host", "idempotencyKey": "pool-a"}
    assert (await s.api.fails(s.token, "pools/create", body))[1]["code"] == "CONFLICT"
    assert len(await events(s.fleet.db)) == before


async def _book_and_release(s: Scene, pool_id: str) -> None:
    await s.fleet.node(pool_id, 2)
    booking = await s.reserve(pool_id, {"gpu": 1})
    await s.release(booking["id"])


SILENT: list[Call] = [
    _offer_shared_gpu_pool,
    _offer_to_an_unknown_tenant,
    _offer_without_share,
    _update_with_a_bad_policy,
    _single_tenant_while_shared,
    _unoffer_the_owner,
    _unoffer_twice,
    _archive_twice,
    _retry_an_idempotent_create,
    _book_and_release,  # reservations are not pool events
]


@pytest.mark.parametrize("call", SILENT, ids=[c.__name__.strip("_") for c in SILENT])
async def test_a_rolled_back_or_no_op_call_writes_no_event(
    api: Api, fleet: Fleet, db: Database, call: Call
) -> None:
    """Written in the same transaction as the change (nothing emitted for a rolled-back or
    no-op call)."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool()
    await s.offer(pool["id"], "beta", {"gpu": 1})
    await call(s, pool["id"])
    # Whatever the call set up itself was counted inside it; here nothing else may appear.
    written = await events(db)
    kinds = [e.type for e in written]
    assert kinds.count("pool.offered") == 1 + (call is _single_tenant_while_shared)
    assert kinds.count("pool.created") == 1 + (
        call in (_offer_shared_gpu_pool, _retry_an_idempotent_create)
    )
    assert kinds.count("pool.unoffered") == (call is _unoffer_twice)
    assert kinds.count("pool.archived") == (call is _archive_twice)
    assert "pool.updated" not in kinds
