"""`PoolEvent.pool` held to the plain path over data generated per run, as
tests/test_read_differential.py holds the queries: two real servers over one database,
`fast` (the compiled statement spliced into the event) and `plain`
(BETTERCOMPUTE_FAST_PATH=false, the reference), the same subscriptions on both (every
reader of the generated world that may subscribe, each with a generated selection of
`pool` over a protocol of its own), and every frame each receives compared as the bytes
that came over the wire.

The events: an update of every pool with every tenant in its audience (each reader is
shown each pool as it sees it, or null: archived pools, pools of other lineages, offers
with and without descendants), then an unoffer, an archive and an update made as a
client makes them. After each step a marker event (every tenant in its audience) ends
the step: both servers read every pool before anything changes it again. Readers with a
narrowed binding are left out (the marker's per-pool decision may hide it from them);
tests/events/test_compiled_event_pool.py subscribes one (the plain read answers it).

The seed is printed with every failure; BETTERCOMPUTE_TEST_READ_SEED=<seed> replays it.
`test_a_one_sided_change_is_reported` shows the comparison bites: a change made only in
the compiled builder (the archived filter dropped, a grant's priority dropped) or only
in the plain read (quota rows reordered) makes it report differences.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from app.iam.roles import FLEET_TENANT, POOLS_READ, ROLE_PERMISSIONS
from tests.events.event_pool_pair import (
    MARKER,
    Side,
    Subscriber,
    comparable,
    emit,
    frames_until,
    marked,
    subscribed,
    two_servers,
)
from tests.generated_world import BITE, DEFAULT, World, build_world
from tests.support import Fleet
from tests.test_read_differential import (
    BITES,
    CAPACITY_FIELDS,
    RESERVATION_FIELDS,
    _pool_selection,
    replay,
    run_seed,
)

PROTOCOLS = ("graphql-transport-ws", "graphql-ws")
DOCUMENT = """subscription Events($tenantId: String!, $types: [String!]) {
  poolEvents(tenantId: $tenantId, types: $types) { cursor type data pool { %s } }
}"""
# Outbox events only: `pool.usage` is each relay's own, per coalescing window.
TYPES = ["pool.created", "pool.offered", "pool.unoffered", "pool.updated", "pool.archived"]
# What the one-sided changes need to show: archived, every grant value, the rows' order.
FULL = (
    "id archived version quotas { resource max used poolId grant { via tenantId priority "
    f"includeDescendants offeredAt }} }} capacity {{ {' '.join(CAPACITY_FIELDS)} }}"
)


def generated_selection(rng: random.Random) -> str:
    """A Pool selection as the read differential generates them, a page of reservations
    now and then."""
    selection = _pool_selection(rng, offers=rng.random() < 0.3)
    if rng.random() < 0.3:
        nodes = " ".join(rng.sample(RESERVATION_FIELDS, k=rng.randint(1, 4)))
        selection += f" reservations(first: {rng.randint(1, 2)}) {{ nodes {{ {nodes} }} "
        selection += "pageInfo { hasNextPage endCursor } }"
    return selection


@dataclass
class Report:
    seed: int
    world: World
    subscribers: int = 0
    frames: int = 0
    nulls: int = 0  # frames whose `pool` is null: the reader does not see it
    compiled: int = 0  # `fast`'s reads its compiled statement answered
    differences: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{replay(self.seed)}; world: {self.world.describe()}; {self.subscribers} "
            f"subscribers, {self.frames} frames compared ({self.nulls} with pool null), "
            f"{self.compiled} compiled answers"
        )

    def failure(self, most: int = 6) -> str:
        shown = "\n".join(self.differences[:most])
        return f"{len(self.differences)} differences; {self.summary()}\n{shown}"


async def run_event_differential(
    database_url: str,
    fleet: Fleet,
    size: Any,
    selection: Callable[[random.Random], str] = generated_selection,
) -> Report:
    async with two_servers(database_url) as (fast, plain):
        seed = run_seed()
        rng = random.Random(seed)
        async with httpx.AsyncClient(base_url=f"http://{plain.address}", timeout=60) as client:
            try:
                world = await build_world(rng, seed, client, fleet, size)
            except BaseException as exc:
                exc.add_note(f"building the world: {replay(seed)}")
                raise
            report = Report(seed, world)
            try:
                await _compare(fast, plain, client, fleet, world, rng, selection, report)
            except BaseException as exc:
                exc.add_note(report.summary())
                raise
    return report


async def _compare(
    fast: Side,
    plain: Side,
    client: httpx.AsyncClient,
    fleet: Fleet,
    world: World,
    rng: random.Random,
    selection: Callable[[random.Random], str],
    report: Report,
) -> None:
    readers = [
        r
        for r in world.readers
        if r.role is not None
        and not r.revoked
        and not r.conditions
        and POOLS_READ in ROLE_PERMISSIONS[r.role]
    ]
    subscribers = [
        Subscriber(
            f"{n}:{r.name}",  # unique: a world may name two readers alike
            r.token,
            rng.choice(PROTOCOLS),
            DOCUMENT % selection(rng),
            {"tenantId": r.tenant, "types": TYPES},
        )
        for n, r in enumerate(readers)
    ]
    report.subscribers = len(subscribers)
    everyone = frozenset([*world.tenants, FLEET_TENANT])
    marker_pool = world.pools[0]
    admins = {owner: await fleet.caller(owner, "admin") for owner in world.owners}

    async def call(owner: str, method: str, body: dict[str, Any]) -> None:
        # Refusals (an archive with reservations held: INVALID_STATE) change nothing.
        await client.post(
            f"/api/compute/{method}",
            json=body,
            headers={"authorization": f"Bearer {admins[owner]}"},
        )

    async def every_pool() -> None:
        for n, pool in enumerate(world.pools):
            await emit(fast.capacity, pool.id, pool.owner, everyone, {"n": n})

    offered = [(p, t) for p in world.pools for t in p.offered_to if not p.archived]
    live = [p for p in world.pools if not p.archived]
    steps: list[Callable[[], Any]] = [every_pool]
    if offered:
        pool, guest = rng.choice(offered)
        body = {"tenantId": pool.owner, "poolId": pool.id, "toTenantId": guest}
        steps.append(lambda: call(pool.owner, "pools/unoffer", body))
    if live:
        archived = rng.choice(live)
        body_a = {"tenantId": archived.owner, "poolId": archived.id}
        steps.append(lambda: call(archived.owner, "pools/archive", body_a))
        updated = rng.choice(live)
        body_u = {"tenantId": updated.owner, "poolId": updated.id, "policy": {"singleTenant": True}}
        steps.append(lambda: call(updated.owner, "pools/update", body_u))
    steps.append(every_pool)  # every pool again, after the changes
    compiled = fast.capacity.event_reads.compiled
    async with subscribed((fast, plain), subscribers) as sockets:
        received: dict[tuple[str, str], list[str]] = {key: [] for key in sockets}
        for n, step in enumerate(steps):
            await step()
            await emit(fast.capacity, marker_pool.id, marker_pool.owner, everyone, {MARKER: n})
            for (side, name), ws in sockets.items():
                protocol = next(s.protocol for s in subscribers if s.name == name)
                received[(side, name)] += await frames_until(ws, protocol, marked(n))
    report.compiled = fast.capacity.event_reads.compiled - compiled
    assert plain.capacity.event_reads.compiled == 0
    for sub in subscribers:
        ours, reference = received[("fast", sub.name)], received[("plain", sub.name)]
        if len(ours) != len(reference):
            report.differences.append(f"- {sub.name}: {len(ours)} frames, plain {len(reference)}")
        for got, want in zip(ours, reference, strict=False):
            report.frames += 1
            report.nulls += '"pool":null' in want
            if comparable(got) != comparable(want):
                report.differences.append(
                    f"- {sub.name} ({sub.protocol}) {sub.document}\n    plain: {want}\n"
                    f"    fast:  {got}"
                )


async def test_event_pools_answer_alike_over_generated_data(
    database_url: str, fleet: Fleet
) -> None:
    report = await run_event_differential(database_url, fleet, DEFAULT)
    print(report.summary())
    assert not report.differences, report.failure()
    # The comparison could fail: pools shown and not, and compiled answers among them.
    assert report.compiled > 0, report.summary()
    assert 0 < report.nulls < report.frames, report.summary()


# The one-sided changes of the read differential that reach `PoolEvent.pool`.
EVENT_BITES = [
    "compiled-drops-archived-filter",
    "plain-reorders-quotas",
    "compiled-drops-grant-priority",
]


@pytest.mark.parametrize("bite", EVENT_BITES)
async def test_a_one_sided_change_is_reported(
    database_url: str, fleet: Fleet, bite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same comparison with one side changed (patched into the real module before
    the servers are built): it reports differences."""
    patch, _ = BITES[bite]
    patch(monkeypatch)
    report = await run_event_differential(database_url, fleet, BITE, lambda _: FULL)
    print(report.summary())
    assert report.differences, f"{bite} went unnoticed; {report.summary()}"
    print(f"{bite}:\n{report.differences[0]}")
