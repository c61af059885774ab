"""Optimistic concurrency on pool writes (CONTRACT section 10, `version`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.db.engine import Database
from tests.rest.pool_calls import row_counts
from tests.rest.scene import Scene
from tests.support import Api, Fleet


async def test_two_clients_that_read_the_same_version_exactly_one_wins(
    api: Api, fleet: Fleet
) -> None:
    """Two clients read version 3, both update with `version: 3`: exactly one wins; the other
    is CONFLICT with details.currentVersion and its change is not applied."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool(gpuModel="H100")
    await s.offer(pool["id"], "beta", {"gpu": 1})  # version 2: an offer changes what it shows
    await api.ok(s.token, "pools/update", s.body(pool["id"], gpuModel="A100"))
    read = await s.get(pool["id"])
    assert read["version"] == 3
    second = await fleet.caller("acme", "admin")

    answers = await asyncio.gather(
        api.post(s.token, "pools/update", s.body(pool["id"], gpuModel="L40S", version=3)),
        api.post(second, "pools/update", s.body(pool["id"], gpuModel="B200", version=3)),
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 409], [a.text for a in answers]
    won = next(a for a in answers if a.status_code == 200).json()["pool"]
    lost = next(a for a in answers if a.status_code == 409).json()["error"]
    assert lost["code"] == "CONFLICT"
    assert lost["details"] == {"field": "version", "currentVersion": 4}
    assert won["version"] == 4
    assert await s.get(pool["id"]) == won  # the loser changed nothing


@pytest.mark.parametrize("method", ["offer", "unoffer", "update", "archive"])
async def test_a_stale_version_changes_nothing(
    api: Api, fleet: Fleet, db: Database, method: str
) -> None:
    """Every pool write takes `version`: a stale one is CONFLICT and writes nothing (no row,
    no version bump, no event); the current one goes through."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool()
    await s.offer(pool["id"], "beta", {"gpu": 1})  # version 2
    fields: dict[str, Any] = {
        "offer": {"toTenantId": "beta", "quota": {"gpu": 5}},
        "unoffer": {"toTenantId": "beta"},
        "update": {"policy": {"kernelModules": ["nvidia"]}},
        "archive": {},
    }[method]
    before, counts = await s.get(pool["id"]), await row_counts(db)
    for stale in (1, 3):  # behind and ahead of the pool alike
        status, error = await api.fails(
            s.token, f"pools/{method}", s.body(pool["id"], version=stale, **fields)
        )
        assert (status, error["code"], error["details"]["currentVersion"]) == (409, "CONFLICT", 2)
    assert await s.get(pool["id"]) == before and await row_counts(db) == counts

    await api.ok(s.token, f"pools/{method}", s.body(pool["id"], version=2, **fields))
    assert (await s.get(pool["id"]))["version"] == 3


async def test_version_is_checked_after_visibility_and_input(api: Api, fleet: Fleet) -> None:
    """CONTRACT section 2's order: a pool the tenant cannot see is NOT_FOUND whatever the
    version; a bad version is INVALID_INPUT; unoffering the owner is INVALID_INPUT first."""
    s = await Scene.start(api, fleet)
    beta = await s.guest("beta")
    pool = await s.pool()
    body = {"tenantId": "beta", "poolId": pool["id"], "gpuModel": "A100", "version": 7}
    assert (await api.fails(beta, "pools/update", body))[1]["code"] == "NOT_FOUND"
    for bad in (0, "1", -1, 2**31):
        status, error = await api.fails(
            s.token, "pools/update", s.body(pool["id"], gpuModel="A100", version=bad)
        )
        assert (status, error["details"]["field"]) == (400, "version")
    owner = s.body(pool["id"], toTenantId="acme", version=9)
    assert (await api.fails(s.token, "pools/unoffer", owner))[1]["code"] == "INVALID_INPUT"


async def test_which_writes_move_the_version(api: Api, fleet: Fleet) -> None:
    """What increments `version`: offer, an unoffer that removes an offer, update, a first
    archive. Not: a no-op unoffer, a second archive, bookings and releases."""
    s = await Scene.start(api, fleet)
    await s.guest("beta")
    pool = await s.pool()
    pool_id = pool["id"]
    await fleet.node(pool_id, 4)

    async def version() -> int:
        return int((await s.get(pool_id))["version"])

    steps = [
        (lambda: s.offer(pool_id, "beta", {"gpu": 2}), 2),
        (lambda: s.offer(pool_id, "beta", {"gpu": 2}), 3),
        (lambda: s.reserve(pool_id, {"gpu": 1}), 3),
        (lambda: s.unoffer(pool_id, "beta"), 4),
        (lambda: s.unoffer(pool_id, "beta"), 4),
        (lambda: api.ok(s.token, "pools/update", s.body(pool_id, policy={})), 5),
        (lambda: s.archive(pool_id), 6),
        (lambda: s.archive(pool_id), 6),
    ]
    for step, expected in steps:
        await step()
        assert await version() == expected


GRAPHQL_UPDATE = """
mutation($input: UpdatePoolInput!) { updatePool(input: $input) { pool { version gpuModel } } }
"""


async def test_graphql_inputs_take_the_version(api: Api, fleet: Fleet) -> None:
    s = await Scene.start(api, fleet)
    pool = await s.pool()
    stale = {"tenantId": "acme", "poolId": pool["id"], "gpuModel": "A100", "version": 2}
    answer = await api.graphql(s.token, GRAPHQL_UPDATE, {"input": stale})
    assert answer["data"] is None
    extensions = answer["errors"][0]["extensions"]
    assert (extensions["code"], extensions["currentVersion"]) == ("CONFLICT", 1)
    current = {**stale, "version": 1}
    answer = await api.graphql(s.token, GRAPHQL_UPDATE, {"input": current})
    assert answer["data"]["updatePool"]["pool"] == {"version": 2, "gpuModel": "A100"}
    for mutation, extra in (("unofferPool", ', toTenantId: "acme"'), ("archivePool", "")):
        document = (
            f'mutation {{ {mutation}(input: {{tenantId: "acme", poolId: "{pool["id"]}"'
            f"{extra}, version: 1}}) {{ __typename }} }}"
        )
        answer = await api.graphql(s.token, document)
        code = answer["errors"][0]["extensions"]["code"]
        assert code == ("INVALID_INPUT" if mutation == "unofferPool" else "CONFLICT")
