"""Dry runs of unoffer and archive (CONTRACT section 10, `dryRun`): nothing written, no
event, and the impact equals what the real call then does."""

from __future__ import annotations

from typing import Any

import pytest

from app.capacity.bounds import MAX_IMPACT_ITEMS
from app.db.engine import Database
from tests.rest.pool_calls import row_counts
from tests.rest.scene import Scene, events, quota_rows
from tests.support import Api, Fleet

TENANTS = ("beta", "beta-dev", "beta-dev-x", "beta-ops", "gamma")


async def _shared(s: Scene) -> tuple[str, dict[str, str]]:
    """acme's pool offered to beta (with descendants: beta-dev, beta-dev-x, and beta-ops,
    which also holds an offer of its own) and to gamma; bookings by beta, beta-dev, acme."""
    tokens = {
        "beta": await s.guest("beta"),
        "beta-dev": await s.guest("beta-dev", parent="beta"),
        "beta-dev-x": await s.guest("beta-dev-x", parent="beta-dev"),
        "beta-ops": await s.guest("beta-ops", parent="beta"),
        "gamma": await s.guest("gamma"),
    }
    pool_id = (await s.pool())["id"]
    await s.fleet.node(pool_id, 16)
    await s.offer(pool_id, "beta", {"gpu": 4, "gpu.slot": 2}, includeDescendants=True)
    await s.offer(pool_id, "beta-ops", {"gpu": 1})
    await s.offer(pool_id, "gamma", {"gpu": 2})
    await s.reserve(pool_id, {"gpu": 2}, tokens["beta"], "beta")
    await s.reserve(pool_id, {"gpu": 1}, tokens["beta-dev"], "beta-dev")
    await s.reserve(pool_id, {"gpu": 1}, tokens["gamma"], "gamma")
    await s.reserve(pool_id, {"gpu": 3})
    return pool_id, tokens


async def _who_sees(s: Scene, pool_id: str, tokens: dict[str, str]) -> set[str]:
    seen = set()
    for tenant, token in tokens.items():
        body = {"tenantId": tenant, "poolId": pool_id}
        if (await s.api.post(token, "pools/get", body)).status_code == 200:
            seen.add(tenant)
    return seen


async def _active(s: Scene, pool_id: str, tokens: dict[str, str]) -> list[dict[str, Any]]:
    found = []
    for tenant, token in {**tokens, "acme": s.token}.items():
        body = {"tenantId": tenant}  # every pool: one it no longer sees included
        listed = (await s.api.ok(token, "reservations/list", body))["reservations"]
        found += [r for r in listed if r["state"] == "active" and r["poolId"] == pool_id]
    return sorted(found, key=lambda r: str(r["id"]))


async def test_unoffer_dry_run_is_what_the_unoffer_does(
    api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    pool_id, tokens = await _shared(s)
    before, counts = await s.get(pool_id), await row_counts(db)
    body = s.body(pool_id, toTenantId="beta", dryRun=True)
    impact = (await api.ok(s.token, "pools/unoffer", body))["impact"]
    assert await s.get(pool_id) == before and await row_counts(db) == counts  # no event either

    assert impact["tenantsLosingAccess"] == ["beta", "beta-dev", "beta-dev-x"]  # not beta-ops
    assert impact["offersEnded"] == ["beta"]
    assert impact["quotaKept"] == {"beta": {"gpu": 3, "gpu.slot": 0}}  # beta-dev books on it
    assert {r["tenantId"] for r in impact["reservations"]} == {"beta", "beta-dev"}

    seen_before = await _who_sees(s, pool_id, tokens)
    active = await _active(s, pool_id, tokens)
    assert await s.unoffer(pool_id, "beta")
    lost = seen_before - await _who_sees(s, pool_id, tokens)
    assert sorted(lost) == impact["tenantsLosingAccess"]
    kept = await quota_rows(db, pool_id, "beta")
    assert kept == {r: (used, used) for r, used in impact["quotaKept"]["beta"].items()}
    # Their reservations stay live, as the impact listed them.
    assert (
        [r for r in await _active(s, pool_id, tokens) if r["tenantId"] in lost]
        == [r for r in active if r["tenantId"] in lost]
        == impact["reservations"]
    )

    # Now there is nothing to remove: an empty impact.
    again = (await api.ok(s.token, "pools/unoffer", body))["impact"]
    assert again == {
        "tenantsLosingAccess": [],
        "quotaKept": {},
        "reservations": [],
        "offersEnded": [],
        "truncated": False,
    }


async def test_archive_dry_run_is_what_the_archive_does(
    api: Api, fleet: Fleet, db: Database
) -> None:
    s = await Scene.start(api, fleet)
    pool_id, tokens = await _shared(s)
    before, counts = await s.get(pool_id), await row_counts(db)
    impact = (await api.ok(s.token, "pools/archive", s.body(pool_id, dryRun=True)))["impact"]
    assert await s.get(pool_id) == before and await row_counts(db) == counts

    assert impact["tenantsLosingAccess"] == sorted(TENANTS)
    assert impact["offersEnded"] == ["beta", "beta-ops", "gamma"]
    assert impact["quotaKept"] == {
        "beta": {"gpu": 3, "gpu.slot": 0},
        "beta-ops": {"gpu": 0},
        "gamma": {"gpu": 1},
    }
    active = await _active(s, pool_id, tokens)
    assert impact["reservations"] == active and len(active) == 4  # the owner's too

    await s.archive(pool_id)
    assert await _who_sees(s, pool_id, tokens) == set()
    (archived,) = [e for e in await events(db) if e.type == "pool.archived"]
    assert archived.data["removedTenantIds"] == impact["offersEnded"]
    for tenant, floor in impact["quotaKept"].items():
        assert await quota_rows(db, pool_id, tenant) == {r: (u, u) for r, u in floor.items()}
    assert await _active(s, pool_id, tokens) == active


async def test_a_dry_run_is_checked_as_the_real_call(api: Api, fleet: Fleet) -> None:
    """Same refusals: a guest gets NOT_FOUND, an operator cannot unoffer (share), a stale
    version is CONFLICT, unoffering the owner is INVALID_INPUT."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool_id = (await s.pool())["id"]
    await s.offer(pool_id, "beta", {"gpu": 1})
    guest = {"tenantId": "beta", "poolId": pool_id, "dryRun": True}
    assert (await api.fails(beta, "pools/archive", guest))[1]["code"] == "NOT_FOUND"
    operator = await fleet.caller("acme", "operator")
    unoffer = s.body(pool_id, toTenantId="beta", dryRun=True)
    assert (await api.fails(operator, "pools/unoffer", unoffer))[1]["code"] == "PERMISSION_DENIED"
    stale = s.body(pool_id, dryRun=True, version=1)
    assert (await api.fails(s.token, "pools/archive", stale))[1]["code"] == "CONFLICT"
    owner = s.body(pool_id, toTenantId="acme", dryRun=True)
    assert (await api.fails(s.token, "pools/unoffer", owner))[1]["code"] == "INVALID_INPUT"
    # An operator may archive (manage) but does not read offers: no guest's data.
    impact = (await api.ok(operator, "pools/archive", s.body(pool_id, dryRun=True)))["impact"]
    assert impact == {
        "tenantsLosingAccess": [],
        "quotaKept": {},
        "reservations": [],
        "offersEnded": [],
        "truncated": False,
    }


DRY_RUNS = """
mutation($u: UnofferPoolInput!, $a: ArchivePoolInput!) {
  unofferPool(input: $u) { removed impact { tenantsLosingAccess quotaKept offersEnded
                                            reservations { id tenantId } } }
  archivePool(input: $a) { pool { archived version }
                           impact { tenantsLosingAccess offersEnded reservations { id } } }
}
"""


async def test_graphql_payloads_carry_the_impact(api: Api, fleet: Fleet, db: Database) -> None:
    s = await Scene.start(api, fleet)
    pool_id, _ = await _shared(s)
    rest_unoffer = (
        await api.ok(s.token, "pools/unoffer", s.body(pool_id, toTenantId="beta", dryRun=True))
    )["impact"]
    counts = await row_counts(db)
    variables = {
        "u": {"tenantId": "acme", "poolId": pool_id, "toTenantId": "beta", "dryRun": True},
        "a": {"tenantId": "acme", "poolId": pool_id, "dryRun": True},
    }
    answer = await api.graphql(s.token, DRY_RUNS, variables)
    assert "errors" not in answer, answer
    unoffer, archive = answer["data"]["unofferPool"], answer["data"]["archivePool"]
    assert unoffer["removed"] is False
    assert unoffer["impact"]["tenantsLosingAccess"] == rest_unoffer["tenantsLosingAccess"]
    assert unoffer["impact"]["quotaKept"] == rest_unoffer["quotaKept"]
    assert archive["pool"] == {"archived": False, "version": 4}
    assert archive["impact"]["offersEnded"] == ["beta", "beta-ops", "gamma"]
    assert len(archive["impact"]["reservations"]) == 4
    assert await row_counts(db) == counts


async def test_an_impact_lists_at_most_its_bound_and_says_it_was_cut(
    api: Api, fleet: Fleet, db: Database
) -> None:
    """Every size has a bound (app/capacity/bounds.py): a dry run lists at most
    MAX_IMPACT_ITEMS reservations (and tenants), and `truncated` says there were more."""
    s = await Scene.start(api, fleet)
    pool_id = (await s.pool())["id"]
    await s.fleet.node(pool_id, MAX_IMPACT_ITEMS + 1)
    for _ in range(MAX_IMPACT_ITEMS + 1):
        await s.reserve(pool_id, {"gpu": 1})
    body = {"tenantId": s.owner, "poolId": pool_id, "dryRun": True}
    impact = (await api.ok(s.token, "pools/archive", body))["impact"]
    assert len(impact["reservations"]) == MAX_IMPACT_ITEMS and impact["truncated"] is True
    listed = [r["id"] for r in impact["reservations"]]
    assert listed == sorted(listed)  # the first ones, in id order

    await api.ok(s.token, "reservations/release", {"tenantId": s.owner, "reservationId": listed[0]})
    impact = (await api.ok(s.token, "pools/archive", body))["impact"]
    assert len(impact["reservations"]) == MAX_IMPACT_ITEMS and impact["truncated"] is False


# Three lineages, four generations in the guests' (g > g.1 > g.1.1 > g.1.1.1), and the
# owner's subtree (acme > acme.1 > acme.1.1), which sees the pool through the owner's own
# offer with includeDescendants until the archive.
LINEAGES = {
    "acme.1": "acme",
    "acme.1.1": "acme.1",
    "g": None,
    "g.1": "g",
    "g.1.1": "g.1",
    "g.1.1.1": "g.1.1",
    "g.2": "g",
    "h": None,
    "h.1": "h",
}


@pytest.mark.parametrize("descendants", [True, False], ids=["descendants", "alone"])
async def test_a_dry_run_predicts_who_loses_sight_over_deep_lineages(
    api: Api, fleet: Fleet, descendants: bool
) -> None:
    """For each call in turn (unoffer the middle of a lineage, unoffer a root whose offer
    includes descendants, then archive), the dry run's tenantsLosingAccess is exactly who
    saw the pool before the real call and does not after, asked of every tenant by its own
    `pools/get`; and its offersEnded the offers that went."""
    s = await Scene.start(api, fleet)
    tokens = {"acme": s.token}
    for tenant, parent in LINEAGES.items():
        tokens[tenant] = await s.guest(tenant, parent=parent)
    pool_id = (await s.pool())["id"]
    await s.offer(pool_id, "acme", {"gpu": 8}, includeDescendants=True)
    await s.offer(pool_id, "g", {"gpu": 1}, includeDescendants=not descendants)
    await s.offer(pool_id, "g.1", {"gpu": 2}, includeDescendants=descendants)
    await s.offer(pool_id, "g.1.1.1", {"gpu": 1})
    await s.offer(pool_id, "h", {"gpu": 1}, includeDescendants=True)

    calls: list[tuple[str, dict[str, Any]]] = [
        ("pools/unoffer", {"toTenantId": "g.1"}),
        ("pools/unoffer", {"toTenantId": "h"}),
        ("pools/unoffer", {"toTenantId": "h"}),  # nothing left to end
        ("pools/archive", {}),
    ]
    for method, fields in calls:
        body = s.body(pool_id, **fields)
        impact = (await api.ok(s.token, method, {**body, "dryRun": True}))["impact"]
        offered = {o["tenantId"] for o in (await s.get(pool_id))["offers"]}
        before = await _who_sees(s, pool_id, tokens)
        await api.ok(s.token, method, body)
        after = await _who_sees(s, pool_id, tokens)
        assert impact["tenantsLosingAccess"] == sorted(before - after), (method, fields)
        assert set(after) <= set(before)
        gone = offered - {o["tenantId"] for o in (await s.get(pool_id))["offers"]}
        assert impact["offersEnded"] == sorted(gone), (method, fields)
    # The cases the lineages were built for, seen through the calls above.
    assert after == {"acme"}
