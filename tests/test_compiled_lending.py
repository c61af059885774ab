"""The owner's `lending`, ranked and cut by the database (read_rules.capacity_lent and
lending_order) on both paths, REST and GraphQL, on both dialects: ties in pool id then
resource, lent capacity on a row with nothing allocatable first of all (an unlent one
last), the first `first`; quotients past a double's 53 bits ranked exactly (as Python's
int / int divides), and sums past a Long left by the compiled read to the plain one,
which answers them exactly (REST) or refuses the field (GraphQL's Long), as it always has."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import BigInteger, literal, select

from app.capacity.inputs import MAX_AMOUNT
from app.capacity.json_sql import ExactQuotient
from app.db.engine import Database
from tests.compiled_world import Pair, pair
from tests.support import Fleet

__all__ = ["pair"]  # fixture
# The compiled path against the plain one: nothing to compare on the plain path.
pytestmark = pytest.mark.fast_path

LENDING = (
    "query($t: String!, $first: Int) { lending(tenantId: $t, first: $first) { poolId "
    "resource total allocatable booked available offered guestUsed overcommit } }"
)
REST = "/api/compute/pools/lending"


def _count(outcome: str) -> float:
    found = REGISTRY.get_sample_value("bettercompute_compiled_reads_total", {"outcome": outcome})
    return found or 0.0


@dataclass
class Owner:
    """acme, its site and admin; guests made on demand."""

    pair: Pair
    fleet: Fleet
    site: str
    token: str
    guests: set[str]

    @classmethod
    async def start(cls, pair: Pair, fleet: Fleet) -> Owner:
        await fleet.tenant("acme")
        site = await fleet.site("acme")
        return cls(pair, fleet, site, await fleet.caller("acme", "admin"), set())

    async def call(self, path: str, body: Any) -> Any:
        headers = {"authorization": f"Bearer {self.token}"}
        response = await self.pair.plain.post(path, json=body, headers=headers)
        assert response.status_code == 200, response.text
        return response.json()

    async def pool(
        self, gpus: int, sharing: str = "exclusive", policy: Any = None, **lent: dict[str, int]
    ) -> str:
        """A pool with one node of `gpus` (none: 0), offered to each guest its quota."""
        body: dict[str, Any] = {"tenantId": "acme", "siteId": self.site, "class": "metal-host"}
        body |= {"sharing": sharing} | ({} if policy is None else {"policy": policy})
        pool_id: str = (await self.call("/api/compute/pools/create", body))["pool"]["id"]
        if gpus:
            await self.fleet.node(pool_id, gpus)
        for guest, quota in lent.items():
            if guest not in self.guests:
                await self.fleet.tenant(guest)
                self.guests.add(guest)
            offer = {"tenantId": "acme", "poolId": pool_id, "toTenantId": guest, "quota": quota}
            await self.call("/api/compute/pools/offer", offer)
        return pool_id

    async def alike(self, first: int | None) -> tuple[bytes, bytes]:
        """REST's and GraphQL's `lending` (the first `first`): the plain path's bytes,
        which the compiled path gives too (the status and bytes of each, twice: the first
        GraphQL request teaches the query text)."""
        given = {} if first is None else {"first": first}
        variables = {"t": "acme", **given}
        found = []
        for path, body in [
            (REST, {"tenantId": "acme", **given}),
            ("/graphql", {"query": LENDING, "variables": variables}),
        ]:
            headers = {"authorization": f"Bearer {self.token}"}
            plain = await self.pair.plain.post(path, json=body, headers=headers)
            for attempt in (1, 2):
                fast = await self.pair.fast.post(path, json=body, headers=headers)
                assert (fast.status_code, fast.content) == (plain.status_code, plain.content), (
                    attempt,
                    path,
                    body,
                )
            found.append(plain.content)
        return found[0], found[1]

    async def ranked(self) -> list[dict[str, Any]]:
        """Every row of the ranking (at most 100), by REST's plain path."""
        found = await self.call(REST, {"tenantId": "acme", "first": 100})
        rows: list[dict[str, Any]] = found["lending"]
        return rows


async def test_the_database_ranks_and_cuts_alike(pair: Pair, fleet: Fleet) -> None:
    """Every rule of the order on both paths, the compiled read answering each."""
    o = await Owner.start(pair, fleet)
    mig = {"migLayout": ["1g.10gb"]}  # gpu.mig: one instance per GPU
    # Created in this order, so their ids are in it: ties follow it.
    tie_a = await o.pool(4, globex={"gpu": 8})  # 2.0
    tie_b = await o.pool(2, globex={"gpu": 4})  # 2.0
    # Nothing allocatable of gpu.mig (no layout): lent anyway, first of all.
    lent_on_nothing = await o.pool(1, "mig", {}, globex={"gpu.mig": 3, "gpu": 1})
    unlent = await o.pool(1, "mig", {})  # gpu 0.0, gpu.mig unlent on nothing: last
    resources = await o.pool(2, "mig", mig, globex={"gpu": 3, "gpu.mig": 3})  # 1.5 twice
    # Exactly 3002399751580330.5, then (2^53 + 1) / 3 = 3002399751580331 exactly: the
    # later pool first. A double of 2^53 + 1 is 2^53, and 2^53 / 3 rounds to the first
    # one's quotient: divided so, the two would tie and the earlier pool lead.
    below = await o.pool(2, globex={"gpu": 6004799503160661})
    above = await o.pool(3, globex={"gpu": 2**53 + 1})
    archived = await o.pool(2, globex={"gpu": 9})  # lends nothing once archived
    await o.call("/api/compute/pools/archive", {"tenantId": "acme", "poolId": archived})

    ranked = await o.ranked()
    assert [(r["poolId"], r["resource"], r["overcommit"]) for r in ranked] == [
        (lent_on_nothing, "gpu.mig", None),
        (above, "gpu", 3002399751580331.0),
        (below, "gpu", 3002399751580330.5),
        (tie_a, "gpu", 2.0),
        (tie_b, "gpu", 2.0),
        (resources, "gpu", 1.5),
        (resources, "gpu.mig", 1.5),
        (lent_on_nothing, "gpu", 1.0),
        (unlent, "gpu", 0.0),
        (unlent, "gpu.mig", None),
    ]
    assert ranked[1] | {"poolId": "p"} == {
        "poolId": "p",
        "resource": "gpu",
        "total": 3,
        "allocatable": 3,
        "booked": 0,
        "available": 3,
        "offered": 2**53 + 1,
        "guestUsed": 0,
        "overcommit": 3002399751580331.0,
    }
    await o.alike(2)  # the fast service remembers the caller and learns the query text
    for first in (None, 0, 1, 4, 9, 100):
        answered = _count("answered")
        rest, graphql = await o.alike(first)
        assert _count("answered") - answered == 4, first  # REST's and GraphQL's, twice
        shown = orjson.loads(rest)
        assert orjson.loads(graphql)["data"] == shown, first
        assert shown["lending"] == ranked[: 50 if first is None else first]


async def test_a_sum_past_a_long_is_left_to_the_plain_read(pair: Pair, fleet: Fleet) -> None:
    """2^63 (two guests' 2^62), 2^64 - 2 (two guests' 2^63 - 1) and 3 * (2^63 - 1) (three
    guests', past 64 bits: orjson's limit, app/http/responses.py), past SQLite's integers:
    ranked by their exact quotients, shown exactly by REST, refused by GraphQL's Long; the
    compiled read answers while no such row is among the first `first`, and declines once
    one is."""
    o = await Owner.start(pair, fleet)
    lent_on_nothing = await o.pool(1, "mig", {}, globex={"gpu.mig": 1})
    past_long = await o.pool(4, globex={"gpu": 2**62}, initech={"gpu": 2**62})
    two_longs = await o.pool(7, globex={"gpu": MAX_AMOUNT}, initech={"gpu": MAX_AMOUNT})
    most = {"gpu": MAX_AMOUNT}
    past_64_bits = await o.pool(9, globex=most, initech=most, hooli=most)
    rest = await o.pair.plain.post(
        REST, json={"tenantId": "acme"}, headers={"authorization": f"Bearer {o.token}"}
    )
    assert rest.status_code == 200, rest.text
    rows = json.loads(rest.content)["lending"]  # orjson reads an integer past 64 bits as a float
    assert [(r["poolId"], r["resource"], r["offered"], r["overcommit"]) for r in rows] == [
        (lent_on_nothing, "gpu.mig", 1, None),
        (past_64_bits, "gpu", 3 * MAX_AMOUNT, 3 * MAX_AMOUNT / 9),
        (two_longs, "gpu", 2 * MAX_AMOUNT, 2 * MAX_AMOUNT / 7),
        (past_long, "gpu", 2**63, 2.0**61),
        (lent_on_nothing, "gpu", 0, 0.0),
    ]
    await o.alike(1)  # the fast service remembers the caller and learns the query text
    answered, declined = _count("answered"), _count("declined")
    await o.alike(1)  # sums past a Long, but not shown
    assert (_count("answered") - answered, _count("declined") - declined) == (4, 0)
    for first in (2, 3, None):
        declined = _count("declined")
        _, graphql = await o.alike(first)
        assert _count("declined") - declined == 4, first  # REST's and GraphQL's, twice
        assert b'"path":["lending",1,"offered"]' in graphql, graphql


async def test_a_quotient_past_53_bits_is_pythons(db: Database, dialect: str) -> None:
    """json_sql.ExactQuotient, read_rules' overcommit past a double's exact integers, is
    Python's n / d of ints on each dialect: halfway cases to even, quotients of integers
    a double rounds first (the double of 2^53 + 1 is 2^53), past 64 bits, and tiny."""
    rng = random.Random(21)
    big = 3 * MAX_AMOUNT  # three guests' maxima
    cases = [(2**53 + 1, 3), (2 * (2**53 + 1), 2), (2**54 + 6, 4), (1, MAX_AMOUNT), (big, 7)]
    cases += [(2**53 + 2 * k + 1, 1) for k in range(3)]  # odd: between two doubles
    cases += [(rng.randrange(big), rng.randrange(1, MAX_AMOUNT)) for _ in range(150)]
    cases += [(rng.randrange(2**53, 2**64), rng.randrange(1, 2**12)) for _ in range(150)]
    async with db.reader.connect() as conn:
        for n, d in cases:
            halves = (literal(n >> 32, BigInteger), literal(n & (2**32 - 1), BigInteger))
            quotient = select(ExactQuotient(*halves, literal(d, BigInteger)))
            assert (await conn.execute(quotient)).scalar_one() == n / d, (dialect, n, d)
