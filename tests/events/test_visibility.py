"""The relay decides grants from one load per batch (app/events/visibility.py); it must
pick exactly what the domain's `load_grants` picks for every tenant of a tree."""

from __future__ import annotations

from app.capacity.reads import Actor, load_grants, load_lineage
from app.db.engine import Database
from app.events.visibility import load_world
from app.iam.principal import Principal
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
