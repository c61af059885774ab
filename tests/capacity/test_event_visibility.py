"""The relay decides grants from one load per batch (app/capacity/event_visibility.py); it must
pick exactly what the domain's `load_grants` picks for every tenant of a tree."""

from __future__ import annotations

from app.capacity.event_visibility import PoolEventFilter, load_world, readable_event
from app.capacity.reads import Actor, load_grants, load_lineage
from app.db.engine import Database
from app.events.reader import read_events
from app.iam.principal import Principal
from tests.events.support import visible_outbox
from tests.rest.scene import Scene
from tests.support import Api, Fleet


async def test_batch_grants_match_the_domain_for_a_tenant_tree(
    api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    await s.guest("beta-dev", parent="beta")
    await s.guest("beta-dev-ci", parent="beta-dev")
    await s.guest("gamma")
    await s.guest("gamma-dev", parent="gamma")
    await s.guest("delta")
    shared = (await s.pool(gpuModel="H100"))["id"]
    await s.offer(shared, "beta", {"gpu": 2}, includeDescendants=True)
    await s.offer(shared, "beta-dev", {"gpu": 1})  # its own row beats its parent's
    await s.offer(shared, "gamma", {"gpu": 1})  # not to gamma's descendants
    private = (await s.pool())["id"]
    archived = (await s.pool())["id"]
    await s.offer(archived, "beta", {"gpu": 1}, includeDescendants=True)
    await s.archive(archived)
    pools = [shared, private, archived]

    tenants = ["acme", "beta", "beta-dev", "beta-dev-ci", "gamma", "gamma-dev", "delta"]
    picked = {}
    async with db.reader.connect() as conn:
        world = await load_world(conn, pools)
        for tenant in tenants:
            principal = Principal("caller_x", tenant, "viewer")
            actor = Actor(principal, tenant, await load_lineage(conn, tenant))
            expected = await load_grants(conn, actor, pools)
            picked[tenant] = {p: world.grant(actor, p) for p in pools}
            assert picked[tenant] == {p: expected.get(p) for p in pools}, tenant

    def granted_by(tenant: str, pool_id: str) -> str | None:
        grant = picked[tenant][pool_id]
        return None if grant is None else grant.tenant_id

    # Not vacuous: own rows, an ancestor's row, and none.
    assert granted_by("beta-dev", shared) == "beta-dev"
    assert granted_by("beta-dev-ci", shared) == "beta"
    assert granted_by("gamma-dev", shared) is None
    assert granted_by("beta-dev", archived) is None


async def test_offer_details_follow_the_callers_share_permission(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """`readable_event` on the outbox rows: a fleet admin acting for the owner, like the
    owner's admin, reads every offer whole; the owner's operator (no compute:pools:share)
    and an admin narrowed to other GPU models read none of a guest's."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool_id = (await s.pool(gpuModel="H100"))["id"]
    await s.offer(pool_id, "beta", {"gpu": 2}, priority=3)
    await s.archive(pool_id)
    callers = {
        "fleet admin": Principal("caller_f", "fleet", "fleet-admin"),
        "owner admin": Principal("caller_a", "acme", "admin"),
        "owner operator": Principal("caller_o", "acme", "operator"),
        "owner admin of A100 pools": Principal("caller_n", "acme", "admin", {"gpuModel": "A100"}),
    }
    # Readers read below the transaction-id horizon (ADR 0012).
    async with visible_outbox(db) as conn:
        written = await read_events(conn, 0, limit=10)
        world = await load_world(conn, [pool_id])
        lineage = await load_lineage(conn, "acme")
    read = {}
    for who, principal in callers.items():
        subscription = PoolEventFilter(Actor(principal, "acme", lineage))
        shown = [readable_event(e, subscription, world) for e in written]
        read[who] = [
            (e.type, e.data.get("toTenantId"), e.data.get("removedTenantIds")) for e in shown if e
        ]
    whole = [
        ("pool.created", None, None),
        ("pool.offered", "beta", None),
        ("pool.archived", None, ["beta"]),
    ]
    assert read == {
        "fleet admin": whole,
        "owner admin": whole,
        "owner operator": [("pool.created", None, None), ("pool.archived", None, [])],
        "owner admin of A100 pools": [],
    }
