"""Round trips per pool write: each REST pool write (create, offer, unoffer, update, archive)
sends a constant number of statements, the same on a pool with one offer and one resource as
on one with 20 offers of 5 resources each (issue 20), and no more than it does now
(`STATEMENTS`: lower it with the change that saves one). Counted as the reads are
(tests/graphql/test_statements.py): `bettercompute_db_statements_total` for `rest` (BEGIN
and COMMIT are not statements there; tests/db/test_dead_connections.py shows no ping is
sent either)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_asyncio
from prometheus_client import REGISTRY
from starlette.applications import Starlette

from app.config import Settings
from app.server import create_app
from tests.support import Api, Fleet

Json = dict[str, Any]
RESOURCES = ("gpu", "cpu", "memory", "disk", "net")
# The statements of each write by dialect, a remembered caller's (its check included). On
# PostgreSQL (before issue 20's second step: 12, 17, 16, 12, 12, 11, 14): the locking read
# carries the caller's check and needs no lineage, an owned pool's answer is built from
# the locked row with its offers and the owner's quota rows in one read (an update reads
# them first, for its rules and event too), what an offer checks before it writes is one
# read (offers._OFFER_FACTS), an event and its audience are one statement. A create reads
# what it checks in one statement (the record, tenant, site, account, caller: 9 before)
# and, on PostgreSQL, writes its rows in one that returns the quota rows for its answer; a
# resize that keeps the offer's flags leaves the offer and authz rows unwritten; withdrawn
# quota rows are locked and dropped in one statement (unoffer, archive); an offer to a
# guest answers from the guest's own authz row, as written, with its quota rows read.
# Since then (9, 7, 6, 6, 7, 8 for offer new/resize, update, unoffer, archive): the
# pool's row, a gpuModel's authz rows and a new offer's authz row are blind writes that
# ride in the event's INSERT (app/db/carried_writes.py), the answer read before them; an
# update without a policy leaves the rollup unread (it follows sharing, policy, nodes).
# Since then (7, 6 for offer new/resize, 6 for unoffer, 7 for archive): an unoffer's offer,
# authz and quota writes ride in its event too (nothing reads after them); an archive's
# guests' offers, authz and quota rows go in one statement; an offer reads its facts with
# the target's quota rows locked, in one.
# Since then (3 for offer resize): a resize that adds no row answers from the rows it
# locked, so its offer and quota writes ride in its event too; an update reads the offers,
# an unoffer the offer, with the lock (access.lock_owned_pool_with; again after it when
# the pool moved while the lock was awaited: tests/rest/test_update_races.py).
# Since then (5 for archive): an archive's withdrawal locks and answers the owner's offer
# and quota rows too (offers._WITHDRAW_GUESTS), so its answer reads nothing more.
# Since then (6, 3 for offer new/resize): an offer reads its facts and locks the target's
# quota rows in its locking read, after the pool's lock (access.locking_first;
# again after it when the pool's row moved meanwhile: tests/rest/test_offer_races.py).
# Since then (4 for archive on PostgreSQL, 12 on SQLite): an archive no longer locks the
# capacity rows; every booking locks the pool's row first (docs/decisions/0004, addendum 2).
# SQLite writes the audience and a create's rows apart and runs no driver path.
STATEMENTS = {
    "postgresql": {
        "create": 3,
        "offer (new)": 5,
        "offer (resize)": 2,
        "update (policy)": 4,
        "update (gpuModel)": 2,
        "unoffer": 2,
        "archive": 3,
    },
    "sqlite": {
        "create": 11,
        "offer (new)": 12,
        "offer (resize)": 9,
        "update (policy)": 9,
        "update (gpuModel)": 8,
        "unoffer": 10,
        "archive": 11,
    },
}


@pytest_asyncio.fixture(loop_scope="session")
async def app(database_url: str) -> AsyncIterator[Starlette]:
    """The app with its outbox and revocation pollers quiet (a poll is not the request's)."""
    quiet = Settings(
        database_url=database_url, event_poll_interval_s=3600, revocation_poll_interval_s=3600
    )
    application = create_app(quiet)
    async with application.router.lifespan_context(application):
        yield application


def _rest_statements() -> float:
    found = REGISTRY.get_sample_value("bettercompute_db_statements_total", {"transport": "rest"})
    return found or 0.0


async def _counted(call: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    before = _rest_statements()
    result = await call()
    return int(_rest_statements() - before), result


async def _scenario(
    api: Api, fleet: Fleet, name: str, offers: int, resources: int
) -> dict[str, int]:
    """The statements of each write on a pool of `name`'s with `offers` offers (the owner's
    included) of `resources` quota rows each, and a node under it; one more offer is made,
    resized and withdrawn on it in the test."""
    quota = {r: 8 for r in RESOURCES[:resources]}
    await fleet.tenant(name)
    site = await fleet.site(name)
    token = await fleet.caller(name, "admin")
    guests = [f"{name}-g{i}" for i in range(offers)]  # the last one is offered in the test
    for guest in guests:
        await fleet.tenant(guest)

    def body(pool_id: str, **fields: Any) -> Json:
        return {"tenantId": name, "poolId": pool_id, **fields}

    async def ok(path: str, payload: Json) -> Json:
        answer: Json = await api.ok(token, path, payload)
        return answer

    create = {"tenantId": name, "siteId": site, "class": "metal-host", "ownerQuota": quota}
    await ok("pools/create", create)  # warms the caller's token and the statement caches
    counts: dict[str, int] = {}
    counts["create"], made = await _counted(lambda: ok("pools/create", create))
    pool_id = made["pool"]["id"]
    await fleet.node(pool_id, 2)
    for guest in guests[:-1]:
        await ok("pools/offer", body(pool_id, toTenantId=guest, quota=quota))
    counts["offer (new)"], offered = await _counted(
        lambda: ok("pools/offer", body(pool_id, toTenantId=guests[-1], quota=quota))
    )
    assert len(offered["pool"]["quotas"]) == resources
    counts["offer (resize)"], _ = await _counted(
        lambda: ok("pools/offer", body(pool_id, toTenantId=guests[-1], quota={RESOURCES[0]: 3}))
    )
    counts["update (policy)"], updated = await _counted(
        lambda: ok("pools/update", body(pool_id, policy={"kernelModules": ["vfio_pci"]}))
    )
    assert len(updated["pool"]["offers"]) == offers + 1
    counts["update (gpuModel)"], _ = await _counted(
        lambda: ok("pools/update", body(pool_id, gpuModel="L40S"))
    )
    counts["unoffer"], removed = await _counted(
        lambda: ok("pools/unoffer", body(pool_id, toTenantId=guests[-1]))
    )
    assert removed == {"removed": True}
    counts["archive"], archived = await _counted(lambda: ok("pools/archive", body(pool_id)))
    assert archived["pool"]["archived"] is True
    return counts


async def test_pool_writes_take_constant_round_trips(
    app: Starlette, api: Api, fleet: Fleet, dialect: str
) -> None:
    small = await _scenario(api, fleet, "small", offers=1, resources=1)
    large = await _scenario(api, fleet, "large", offers=20, resources=5)
    print(f"{dialect}: statements per pool write, 1 offer (the owner's) of 1 resource: {small}")
    print(f"{dialect}: statements per pool write, 20 offers of 5 resources: {large}")
    assert small == large
    # Behind PgBouncer each transaction begins by setting statement_timeout and jit
    # (app/db/engine.py): one statement more per write.
    extra = int(app.state.db.pooled_by_transaction)
    assert small == {write: n + extra for write, n in STATEMENTS[dialect].items()}
